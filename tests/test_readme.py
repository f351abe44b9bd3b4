"""The README describes the tree as it is: every role, every benchmark, and the two set-up commands."""

from __future__ import annotations

import re

from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()


def test_the_layout_names_every_role() -> None:
    layout = README[README.index("## Layout") :]
    roles = sorted(p.name for p in (ROOT / "playbooks" / "roles").iterdir() if p.is_dir())
    assert [r for r in roles if not re.search(rf"\b{r}\b", layout)] == []


def test_every_benchmark_is_described() -> None:
    section = README[README.index("## Benchmarks") :]
    scripts = sorted(p.name for p in (ROOT / "bench").glob("*.py") if not p.name.startswith("_"))
    assert [s for s in scripts if f"bench/{s}" not in section] == []


def test_exactly_two_set_up_commands() -> None:
    section = README[README.index("## Set up on a fresh machine") :]
    block = section[section.index("```sh") : section.index("```", section.index("```sh") + 5)]
    commands = [line.split("#")[0].strip() for line in block.splitlines()[1:] if line.strip()]
    assert commands == ["make plan", "make test"]
