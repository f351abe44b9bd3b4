"""A stack read the way the Pulumi CLI reads it: the project found, the stack file's config as
the strings Pulumi hands the program, each refused in one line where the CLI would refuse it or
where the program could not use it; and the spec and address plan made from it."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import yaml

from superkube.model import files, strictyaml, vmsizes
from superkube.model.ipam import AddressPlan, plan_addresses
from superkube.model.spec import (
    ARRAY_KEYS,
    KUBECONFIG_KEY,
    NAMESPACE,
    YAML_KEYS,
    ClusterSpec,
    SpecError,
    from_config,
)
from superkube.model.teams import WEBHOOK_TLS_KEY

PROJECT = "superkube"


def find_project(start: Path | None = None) -> Path:
    """The directory of the superkube Pulumi.yaml at or above `start`, else the source checkout's."""
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        project_file = candidate / "Pulumi.yaml"
        if project_file.is_file() and _project_name(project_file) == PROJECT:
            return candidate
    checkout = Path(__file__).resolve().parents[3]
    if (checkout / "Pulumi.yaml").is_file():
        return checkout
    raise SpecError(
        "Pulumi.yaml",
        "no superkube project found here or above",
        "run from the superkube checkout or pass --project",
    )


def _project_name(path: Path) -> str | None:
    try:
        data = strictyaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return data.get("name") if isinstance(data, dict) else None


def stack_path(project: Path, stack: str) -> Path:
    if stack.endswith((".yaml", ".yml")) or "/" in stack:
        return Path(stack)
    return project / "stacks" / f"Pulumi.{stack}.yaml"


def stack_name(stack: str) -> str:
    """`dev` for `dev` and for `stacks/Pulumi.dev.yaml`."""
    if stack.endswith((".yaml", ".yml")) or "/" in stack:
        name = Path(stack).name
        for suffix in (".yaml", ".yml"):
            name = name.removesuffix(suffix)
        return name.removeprefix("Pulumi.")
    return stack


def _project_config(project: Path) -> dict[str, dict[str, Any]]:
    """Pulumi.yaml's config declarations: key -> {type, default, description}."""
    try:
        data = files.load(
            project / "Pulumi.yaml",
            fix="give the superkube project's directory (--project), or restore its Pulumi.yaml",
            what="a mapping with name: superkube",
        )
    except files.FileError as exc:
        raise SpecError(exc.where, exc.problem, exc.fix) from None
    config = data.get("config") or {}
    if not isinstance(config, dict):
        raise SpecError(
            f"{project / 'Pulumi.yaml'}",
            "config: must be a mapping",
            "regenerate it: superkube config-schema --write",
        )
    return {str(k): v if isinstance(v, dict) else {} for k, v in config.items()}


def _as_config_string(value: Any) -> str:
    """Pulumi hands every config value to the program as a string; structures as JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value)


DUPLICATE_FIX = "keep one of them (YAML keeps only the last value, and the Pulumi CLI refuses such a file)"


def _check_embedded_yaml(key: str, value: str, text: str, path: Path) -> None:
    """A YAML document held in a string value that names a key twice, or is not YAML: say so at the
    stack file's lines (a block's first line plus the line within it)."""
    try:
        strictyaml.load(value)
    except strictyaml.DuplicateKeyError as exc:
        raise SpecError(
            key, exc.message(_value_first_line(text, key) - 1, str(path)), DUPLICATE_FIX
        ) from None
    except yaml.YAMLError as exc:
        first, block = _value_start(text, key)
        mark = getattr(exc, "problem_mark", None)
        if not block or mark is None:
            return  # the spec says what is wrong with it, naming the key and the line of the value
        line = first + mark.line
        lines = text.splitlines()
        body = lines[first - 1] if 0 < first <= len(lines) else ""
        indent = len(body) - len(body.lstrip(" "))
        problem = getattr(exc, "problem", None) or getattr(exc, "context", None)
        raise SpecError(
            key,
            f"is not valid YAML at line {line}, column {mark.column + 1 + indent} of {path}"
            + (f" ({problem})" if problem else ""),
            "fix the YAML syntax of the block",
        ) from None


def _value_start(text: str, key: str) -> tuple[int, bool]:
    """(the stack file's line (1-based) holding the first line of config value `key`, whether the
    value is a block scalar (`key: |`), whose lines are the file's lines)."""
    root = strictyaml.compose(text)
    for section_key, section in getattr(root, "value", []):
        if section_key.value != "config":
            continue
        for key_node, value_node in section.value:
            if key in (key_node.value, f"{NAMESPACE}:{key_node.value}"):
                block = getattr(value_node, "style", None) in ("|", ">")
                return value_node.start_mark.line + (2 if block else 1), block
    return 1, False


def _value_first_line(text: str, key: str) -> int:
    """The stack file's line (1-based) holding the first line of config value `key`."""
    return _value_start(text, key)[0]


CONFIG_NAMESPACES = (
    NAMESPACE,
    KUBECONFIG_KEY.partition(":")[0],
    WEBHOOK_TLS_KEY.partition(":")[0],
    "azure-native",
    "pulumi",
)
"""The namespaces a stack's config keys may be in: superkube's own, its secrets', and those of the
providers the program uses (azure-native; kubernetes, whose kubeconfig it reads) and Pulumi's."""


def _check_namespace(key: str) -> None:
    """A key in a namespace nothing reads (a typo such as superkub:region) is refused, not ignored."""
    namespace, _, short = key.partition(":")
    if namespace in CONFIG_NAMESPACES:
        return
    close = difflib.get_close_matches(namespace, CONFIG_NAMESPACES, n=1, cutoff=0.6)
    guess = f"{close[0]}:{short}" if close else f"{NAMESPACE}:{short}"
    raise SpecError(
        key,
        f"namespace {namespace!r} is neither superkube's nor a provider's "
        f"({', '.join(CONFIG_NAMESPACES)}), so nothing would read it",
        f"did you mean {guess}?",
    )


def read_stack_config(project: Path, stack: str) -> dict[str, str]:
    """Namespaced config of a stack, stack values over Pulumi.yaml defaults, all strings."""
    path = stack_path(project, stack)
    where = f"{path}"
    if not path.exists():
        known = sorted(
            p.name.removeprefix("Pulumi.").removesuffix(".yaml")
            for p in (project / "stacks").glob("Pulumi.*.yaml")
        )
        raise SpecError(
            where, "no such stack file", f"use one of: {', '.join(known) or 'none'} (or create it)"
        )
    try:
        text = files.read_text(path)
    except files.FileError as exc:
        raise SpecError(exc.where, exc.problem, exc.fix) from None
    try:
        data = strictyaml.load(text)
    except strictyaml.DuplicateKeyError as exc:
        raise SpecError(where, str(exc), DUPLICATE_FIX) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or getattr(exc, "context", None)
        raise SpecError(
            where, f"is not valid YAML{at}" + (f" ({problem})" if problem else ""), "fix the YAML syntax"
        ) from None
    if data is None or (isinstance(data, dict) and not data.get("config") and "config" in data):
        raise SpecError(
            where,
            "is empty" if data is None else "has an empty config:",
            "add a config: mapping with at least superkube:ssh_public_key (stacks/Pulumi.dev.yaml shows the shape)",
        )
    if not isinstance(data, dict) or not isinstance(data.get("config", {}), dict):
        raise SpecError(
            where, "must be a mapping with a config: mapping", "see stacks/Pulumi.dev.yaml for the shape"
        )
    unexpected = set(data) - {"config", "secretsprovider", "encryptionsalt", "encryptedkey", "environment"}
    if unexpected:
        raise SpecError(
            where, f"unknown top-level key {sorted(unexpected)[0]!r}", "put settings under config:"
        )
    if "config" not in data:
        raise SpecError(
            where,
            "has no config: mapping",
            "add one with at least superkube:ssh_public_key (stacks/Pulumi.dev.yaml shows the shape)",
        )
    declared = _project_config(project)
    values: dict[str, str] = {}
    for key, value in (data.get("config") or {}).items():
        full = str(key) if ":" in str(key) else f"{NAMESPACE}:{key}"
        _check_namespace(full)
        namespace, _, short = full.partition(":")
        if namespace == NAMESPACE and short in declared:
            want = declared[short].get("type", "string")
            if value is None and short not in YAML_KEYS | ARRAY_KEYS:
                default = declared[short].get("default")
                raise SpecError(
                    full,
                    "has no value (YAML null)",
                    "write one, or remove the line"
                    + (
                        f" for the default ({_as_config_string(default)})"
                        if default not in (None, "")
                        else ""
                    ),
                )
            # as the Pulumi CLI does: any scalar is a string's text (a share written 0.1 is "0.1"),
            # a mapping or a list is not
            if want == "string" and isinstance(value, dict | list):
                raise SpecError(
                    f"{full}",
                    f"must be a string, got a YAML {'mapping' if isinstance(value, dict) else 'list'}",
                    f"write it as a block string: '{short}: |' with the YAML indented below it",
                )
            if want == "array" and not isinstance(value, list):
                raise SpecError(full, f"must be a list, got {value!r}", f'write {short}: ["1", "2", "3"]')
        if full in (KUBECONFIG_KEY, WEBHOOK_TLS_KEY):
            continue  # secrets the plan never reads: the mock engine talks to no cluster
        if short in YAML_KEYS and isinstance(value, str):
            _check_embedded_yaml(full, value, text, path)
        if isinstance(value, dict) and "secure" in value:
            raise SpecError(
                full,
                "is encrypted, and the mock engine has no secrets provider",
                "keep plan inputs in plaintext",
            )
        values[full] = _as_config_string(value)
    for short, decl in declared.items():
        full = f"{NAMESPACE}:{short}"
        if full not in values and "default" in decl:
            values[full] = _as_config_string(decl["default"])
    return values


def spec_from_config(config: dict[str, str], stack: str) -> tuple[ClusterSpec, AddressPlan]:
    ours = {k.partition(":")[2]: v for k, v in config.items() if k.startswith(f"{NAMESPACE}:")}
    spec = from_config(ours)
    return spec, plan_addresses(spec, stack)


def load(project: Path, stack: str) -> tuple[dict[str, str], ClusterSpec, AddressPlan]:
    """Read and validate a stack; raises SpecError (one line) before anything runs or is written."""
    config = read_stack_config(project, stack)
    try:
        spec, addresses = spec_from_config(config, stack_name(stack))
        vmsizes.check(spec)
    except SpecError as exc:
        if "pulumi config set " not in exc.fix:
            raise
        # a `pulumi config set` hint must name the stack it is about
        fix = exc.fix.replace("pulumi config set ", f"pulumi config set -s {stack_name(stack)} ")
        raise SpecError(exc.key, exc.problem, fix) from None
    return config, spec, addresses
