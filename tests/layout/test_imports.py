"""The package's wings import one way, and no module imports itself back through others.

Read from the source (ast), every import counted: module level, inside functions, and under
`TYPE_CHECKING`, so that a lazy import cannot hide a wrong direction or a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "superkube"

# What each wing may import, besides itself. From the bottom: model knows nothing else; cluster
# (the facts) and agents stand on model; plan reads the facts; fleet and lab act on all of it;
# the command line sits on top.
MAY_IMPORT: dict[str, set[str]] = {
    "model": set(),
    "cluster": {"model"},
    "agents": {"model", "cluster"},
    "plan": {"model", "cluster"},
    "fleet": {"model", "cluster", "plan", "agents"},
    "lab": {"model", "cluster", "plan", "agents", "fleet"},
    "cli": {"model", "cluster", "plan", "agents", "fleet", "lab"},
}


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: set[str], root: Path = PACKAGE) -> set[str]:
    """The superkube modules `path` imports, by their full names."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            # `from superkube.plan import report` names a module; `from superkube.x import Name` a name
            targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in known else source for a in node.names]
        else:
            continue
        out |= {t for t in targets if t == "superkube" or t.startswith("superkube.")}
    return out - {name}


def wing(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports(path, known) for name, path in found.items()}


def test_every_module_sits_in_a_wing() -> None:
    loose = sorted(m for m in modules() if wing(m) not in MAY_IMPORT)
    assert not loose, f"modules outside the wings {sorted(MAY_IMPORT)}: {loose}"


def test_wings_import_only_downward() -> None:
    wrong = [
        f"{module} imports {target} ({wing(module)} may import {sorted(MAY_IMPORT[wing(module)]) or 'no other wing'})"
        for module, targets in graph().items()
        for target in sorted(targets)
        if wing(target) != wing(module) and wing(target) not in MAY_IMPORT.get(wing(module), set())
    ]
    assert not wrong, "\n".join(wrong)


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_no_module_imports_itself_back() -> None:
    cycle = find_cycle(graph())
    assert cycle is None, " -> ".join(cycle or [])


@pytest.mark.parametrize(
    ("edges", "cycle"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
        ({"a": {"b", "c"}, "b": set(), "c": {"c2"}, "c2": {"c"}}, ["c", "c2", "c"]),
    ],
)
def test_the_cycle_finder_finds_cycles(edges: dict[str, set[str]], cycle: list[str] | None) -> None:
    assert find_cycle(edges) == cycle


def test_the_import_reader_sees_lazy_relative_and_typing_imports(tmp_path: Path) -> None:
    root = tmp_path / "superkube"
    (root / "plan").mkdir(parents=True)
    source = root / "plan" / "view.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from superkube.model.spec import ClusterSpec\n"
        "from . import diagram\n"
        "if TYPE_CHECKING:\n"
        "    from superkube.plan.engine import Plan\n"
        "def later():\n"
        "    import superkube.lab.hosts\n"
        "    from superkube.cluster import kube\n"
    )
    known = {
        "superkube.model.spec",
        "superkube.plan.diagram",
        "superkube.plan.engine",
        "superkube.cluster.kube",
    }
    assert imports(source, known, root) == {
        "superkube.model.spec",
        "superkube.plan.diagram",
        "superkube.plan.engine",
        "superkube.lab.hosts",
        "superkube.cluster.kube",
    }
