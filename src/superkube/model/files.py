"""Reading a file a person hands to superkube: its text, or one line saying what is wrong with it.

Every file a command or an agent reads (a stack, a saved plan, a job description, a probe reading,
an inventory, a kubeconfig, a teams file) goes through here, so that a directory, a file it may not
read, bytes that are not UTF-8 text, an empty file, broken YAML or JSON and a document of the wrong
shape are each one line naming the file, never a traceback.
"""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Any

import yaml

UTF8 = "save it as UTF-8"


class FileError(ValueError):
    """A file that cannot be used: where (the file, with the option that named it), what is wrong
    with it, and how to fix that, as one line."""

    def __init__(self, where: str, problem: str, fix: str) -> None:
        self.where = where
        self.problem = problem
        self.fix = fix
        super().__init__(f"{where}: {problem}; {fix}")


def where(path: Path | str, option: str = "") -> str:
    """How a message names a file: `--plan plan.json`, or the path alone."""
    return f"{option} {path}" if option else str(path)


def _line_of(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def _utf16_without_bom(head: bytes) -> bool:
    """Text in UTF-16 without a byte-order mark: ASCII, with a NUL as every other byte."""
    halves = (head[0::2], head[1::2])
    ascii_ = all(b < 0x80 for b in head.replace(b"\x00", b""))
    return len(head) >= 4 and ascii_ and any(h.count(0) > len(h) // 2 for h in halves)


def decode(data: bytes, at: str) -> str:
    """Bytes as UTF-8 text (a UTF-8 byte-order mark is dropped); a FileError for anything else."""
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE, codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)):
        encoding = "UTF-32" if data.startswith((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)) else "UTF-16"
        raise FileError(at, f"is {encoding} text", UTF8)
    if b"\x00" in data:
        if _utf16_without_bom(data[:200]):
            raise FileError(at, "is UTF-16 text", UTF8)
        raise FileError(
            at,
            f"is binary, not text (a NUL byte on line {_line_of(data, data.index(0))})",
            "give a text file",
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        byte = data[exc.start]
        raise FileError(
            at, f"is not UTF-8 text (byte 0x{byte:02x} on line {_line_of(data, exc.start)})", UTF8
        ) from None


def read_text(path: Path, option: str = "", missing: str = "give the path of an existing file") -> str:
    """The file's text; a FileError for a missing file (`missing` says how to get one), a directory, a
    file it may not read, and bytes that are not UTF-8 text."""
    at = where(path, option)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise FileError(at, "no such file", missing) from None
    except IsADirectoryError:
        raise FileError(at, "is a directory", "give a file") from None
    except PermissionError:
        raise FileError(
            at, "cannot be read (permission denied)", "make it readable (chmod u+r) or give another file"
        ) from None
    except OSError as exc:
        raise FileError(at, f"cannot be read ({exc.strerror or exc})", "give a readable file") from None
    return decode(data, at)


def _mark(exc: Exception, offset: int = 0) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None)
    at = f" at line {mark.line + 1 + offset}, column {mark.column + 1}" if mark else ""
    return f"{at} ({problem})" if problem else at


def parse_yaml(text: str, at: str, fix: str) -> Any:
    """One YAML document, strictly (a key written twice is an error); a FileError naming the line."""
    from superkube.model import strictyaml

    try:
        return strictyaml.load(text)
    except strictyaml.DuplicateKeyError as exc:
        raise FileError(at, str(exc), "keep one of them (YAML keeps only the last value)") from None
    except yaml.YAMLError as exc:
        raise FileError(at, f"is not valid YAML{_mark(exc)}", fix) from None


def parse_json(text: str, at: str, fix: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise FileError(
            at, f"is not valid JSON at line {exc.lineno}, column {exc.colno} ({exc.msg})", fix
        ) from None
    except RecursionError:
        raise FileError(at, "is not valid JSON (nested too deeply)", fix) from None


def _shape(data: Any, want: type | None, at: str, what: str, fix: str) -> Any:
    if want is None or isinstance(data, want):
        return data
    kind = "mapping" if want is dict else "list" if want is list else want.__name__
    got = "nothing" if data is None else f"a {_kind(data)}"
    raise FileError(at, f"must be {what or f'a {kind}'}, got {got}", fix)


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "mapping"
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def load(
    path: Path,
    option: str = "",
    *,
    fix: str,
    kind: str = "yaml",
    want: type | None = dict,
    what: str = "",
    missing: str = "",
) -> Any:
    """A YAML or JSON file's one document, of type `want` (described as `what`); a FileError (one
    line ending in `fix`, or `missing` for a missing file) for anything wrong with it, an empty file
    included."""
    at = where(path, option)
    text = read_text(path, option, missing or fix)
    if not text.strip():
        raise FileError(at, "is empty", fix)
    data = parse_json(text, at, fix) if kind == "json" else parse_yaml(text, at, fix)
    return _shape(data, want, at, what, fix)
