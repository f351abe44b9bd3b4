#!/usr/bin/env python3
"""Write the two reference guides made from the code: docs/commands.md (every `superkube` command
and subcommand, from the command line's typer app) and docs/rules.md (every policy rule, from
`policies.rules.ALL_RULES`).

Run: .venv/bin/python scripts/reference_docs.py           (says which page differs; exit 1 if one does)
     .venv/bin/python scripts/reference_docs.py --write   (writes both pages)
tests/test_readme.py fails while either page is not what this makes.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

DOCS = ROOT / "docs"
REGENERATE = "`scripts/reference_docs.py --write`"


def _cell(text: str) -> str:
    """One table cell, on one line: a `|` does not end it, and outside code spans a `*` or a `<` is
    text, not emphasis or a tag (GitHub drops `<digest>` as an unknown tag)."""
    spans = " ".join(text.split()).split("`")
    for i, span in enumerate(spans):
        spans[i] = span.replace("|", "\\|") if i % 2 else re.sub(r"([\\*<|])", r"\\\1", span)
    return "`".join(spans)


def _summary(help_text: str | None) -> str:
    """A command's help, first paragraph, as one line."""
    return " ".join((help_text or "").strip().split("\n\n")[0].split())


def _synopsis(path: list[str], command: Any) -> str:
    """The command with the arguments and options it requires; a group with its COMMAND."""
    words = list(path)
    if getattr(command, "commands", None):
        return " ".join([*words, "COMMAND"])
    for param in command.params:
        if getattr(param, "hidden", False):
            continue
        name = (param.name or "").upper()
        if param.param_type_name == "argument":
            shown = name + ("..." if param.nargs != 1 else "")
            words.append(shown if param.required else f"[{shown}]")
        elif param.required:
            flag = next((o for o in param.opts if o.startswith("--")), param.opts[0])
            words.append(flag if getattr(param, "is_flag", False) else f"{flag} {name}")
    return " ".join(words)


def _from_environment(command: Any) -> str:
    """The options a command may take from the environment instead, said once."""
    pairs = [
        (next(o for o in p.opts if o.startswith("--")), p.envvar)
        for p in getattr(command, "params", [])
        if getattr(p, "envvar", None) and not getattr(p, "hidden", False)
    ]
    return "".join(f" `{flag}` may come from `{env}`." for flag, env in pairs)


def _commands(group: Any, path: list[str]) -> Iterator[tuple[str, str]]:
    for name, command in group.commands.items():
        if command.hidden:
            continue
        words = [*path, name]
        yield _synopsis(words, command), _summary(command.help) + _from_environment(command)
        if getattr(command, "commands", None):
            yield from _commands(command, words)


def commands_markdown() -> str:
    """docs/commands.md: every command of `superkube`, in the order `superkube --help` lists them."""
    import typer.main

    from superkube.cli import app

    rows = list(_commands(typer.main.get_command(app), ["superkube"]))
    lines = [
        "# Commands",
        "",
        "Every `superkube` command and subcommand, in the order `superkube --help` lists them, with the",
        "arguments and options it requires; `--help` on any of them lists the rest. Made from the command",
        f"line by {REGENERATE}; a test fails when this page is not what it makes.",
        "",
        "| command | what it does |",
        "|---|---|",
        *(f"| `{_cell(usage)}` | {_cell(what)} |" for usage, what in rows),
    ]
    return "\n".join(lines) + "\n"


def rules_markdown() -> str:
    """docs/rules.md: every policy rule, grouped by area in report order."""
    from policies.rules import ALL_RULES

    areas: dict[str, list[Any]] = {}
    for rule in ALL_RULES:
        areas.setdefault(rule.area, []).append(rule)
    lines = [
        "# Policy rules",
        "",
        f"The {len(ALL_RULES)} rules `superkube check` evaluates (`superkube check --list`), by area, in the",
        "order a report lists them: what each holds and how to fix a stack that breaks it. A rule is",
        "mandatory unless its severity says otherwise; a stack may relax one only with a reason",
        "([Policy checks in review](03-policies.md)). Made from `policies.rules.ALL_RULES` by",
        f"{REGENERATE}; a test fails when this page is not what it makes.",
    ]
    for area, rules in areas.items():
        lines += ["", f"## {area}", "", "| rule | severity | what it holds | fix |", "|---|---|---|---|"]
        for rule in rules:
            severity = rule.severity + ("" if rule.enforcement == "mandatory" else f" ({rule.enforcement})")
            lines.append(
                f"| `{rule.name}` | {severity} | {_cell(rule.description)} | {_cell(rule.remediation)} |"
            )
    return "\n".join(lines) + "\n"


PAGES: dict[str, Callable[[], str]] = {"commands.md": commands_markdown, "rules.md": rules_markdown}
"""page under docs/ -> what makes it"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the pages under docs/")
    args = parser.parse_args()
    stale = []
    for name, make in PAGES.items():
        path, text = DOCS / name, make()
        if args.write:
            path.write_text(text)
        elif not path.is_file() or path.read_text() != text:
            stale.append(name)
    if stale:
        print(f"docs/{', docs/'.join(stale)}: not what the code says; run scripts/reference_docs.py --write")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
