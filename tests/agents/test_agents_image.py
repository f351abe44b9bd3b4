"""The agents' image carries the agents' own dependencies and no others: images/agents/requirements.txt
names exactly the distributions that superkube.agents imports (found by reading the source, lazy
imports included, following the package's own modules), torch excepted (the GPU tests' image)."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

from tests.conftest import ROOT

SRC = ROOT / "src"
GPU_TESTS_ONLY = {"torch"}


def _source(module: str) -> Path | None:
    path = SRC / module.replace(".", "/")
    return next((p for p in (path / "__init__.py", path.with_suffix(".py")) if p.is_file()), None)


def third_party_imports() -> dict[str, set[str]]:
    """Top-level names the agents import from outside the standard library, with who imports them."""
    todo = [
        "superkube.agents",
        *(f"superkube.agents.{p.stem}" for p in (SRC / "superkube/agents").glob("*.py")),
    ]
    seen: set[str] = set()
    found: dict[str, set[str]] = {}
    while todo:
        module = todo.pop()
        if module in seen or (source := _source(module)) is None:
            continue
        seen.add(module)
        for node in ast.walk(ast.parse(source.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            for name in names:
                top = name.split(".")[0]
                if top == "superkube":
                    todo.append(name)
                elif (ROOT / "src" / "superkube" / "agents" / f"{top}.py").is_file():
                    todo.append(f"superkube.agents.{name}")  # a host program's sibling: our own file
                elif top not in sys.stdlib_module_names:
                    found.setdefault(top, set()).add(module)
    return found


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_requirements_are_what_the_agents_import() -> None:
    lines = (ROOT / "images/agents/requirements.txt").read_text().splitlines()
    listed = {_norm(line.strip()) for line in lines if line.strip() and not line.startswith("#")}
    by_module = packages_distributions()
    imported = third_party_imports()
    assert {"kubernetes", "prometheus_client", "yaml", "pynvml", "torch"} <= set(imported)  # it reads them
    needed: dict[str, set[str]] = {}
    for top, where in imported.items():
        if top in GPU_TESTS_ONLY:
            continue
        (dist,) = {_norm(d) for d in by_module.get(top, [])} or {f"<no distribution for {top}>"}
        needed.setdefault(dist, set()).update(where)
    assert listed == set(needed), (
        f"images/agents/requirements.txt lists {sorted(listed)}; the agents import {sorted(needed)} "
        f"({ {d: sorted(w) for d, w in needed.items() if d not in listed} })"
    )
    assert not {"pulumi", "pulumi-azure-native", "ansible-core", "ansible-runner"} & listed
