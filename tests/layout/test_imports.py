"""The package's wings and the project's top-level trees import one way, and nothing imports itself
back through others.

Read from the source (ast), every import counted: module level, inside functions, under
`TYPE_CHECKING`, and a module loaded by name (`importlib.import_module("...")`), so that a lazy or
dynamic import cannot hide a wrong direction or a cycle. Three trees are read: the package
(`src/superkube`, one place per wing), the Pulumi components (`modules/`) and the policy pack
(`policies/`), each a place of its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "superkube"
TREES = {"superkube": PACKAGE, "modules": ROOT / "modules", "policies": ROOT / "policies"}
"""top-level name -> its folder"""

# What each place may import, besides itself. From the bottom: model (the spec, its address plan and
# the contract a policy rule is written against) knows nothing else; cluster (the facts) and agents
# stand on model; the Pulumi components (modules) and the rules (policies) stand on those; plan reads
# the facts and loads the rules by name (it runs modules/ through the project's __main__.py, by
# path); fleet acts on a fleet; the harness runs real components beside a loopback API server; the
# lab boots real hosts, built by the harness, and applies the plan's objects to them (never importing
# modules/, which an installed command cannot see); the command line sits on top.
MAY_IMPORT: dict[str, set[str]] = {
    "model": set(),
    "cluster": {"model"},
    "agents": {"model", "cluster"},
    "modules": {"model", "cluster", "agents"},
    "policies": {"model", "cluster", "agents"},
    "plan": {"model", "cluster", "policies"},
    "fleet": {"model", "cluster", "plan", "agents"},
    "harness": {"model", "cluster", "agents"},
    "lab": {"model", "cluster", "plan", "agents", "fleet", "harness"},
    "cli": {"model", "cluster", "plan", "agents", "fleet", "harness", "lab"},
}
LAB_COMMANDS = {"superkube.cli.lab", "superkube.cli.lab_nodes"}
"""the only commands that may import the lab or the harness: `superkube lab ...`"""


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p, tree): p for tree in TREES.values() for p in sorted(tree.rglob("*.py"))}


def _loaded_by_name(node: ast.AST) -> str | None:
    """`importlib.import_module("x")` or `import_module("x")` with a literal name: "x"."""
    if not isinstance(node, ast.Call) or not node.args or not isinstance(node.args[0], ast.Constant):
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return (
        str(node.args[0].value) if name == "import_module" and isinstance(node.args[0].value, str) else None
    )


def imports(path: Path, known: set[str], root: Path = PACKAGE) -> set[str]:
    """The project's modules `path` imports, by their full names."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    ours = tuple(TREES)
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
        elif (loaded := _loaded_by_name(node)) is not None:
            targets = [loaded]
        else:
            continue
        out |= {t for t in targets if t in ours or t.startswith(tuple(f"{o}." for o in ours))}
    return out - {name}


def wing(module: str) -> str:
    """The place a module sits: its wing of the package, or its top-level tree."""
    parts = module.split(".")
    if parts[0] != "superkube":
        return parts[0]
    return parts[1] if len(parts) > 1 else ""


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    roots = {name: TREES[name.split(".")[0]] for name in found}
    return {name: imports(path, known, roots[name]) for name, path in found.items()}


def test_every_module_sits_in_a_wing() -> None:
    loose = sorted(m for m in modules() if wing(m) not in MAY_IMPORT)
    assert not loose, f"modules outside the wings {sorted(MAY_IMPORT)}: {loose}"


def test_every_tree_is_read() -> None:
    found = {wing(m) for m in modules()}
    assert {"modules", "policies", "model", "harness", "lab", "cli"} <= found


def test_the_evaluator_loads_the_rules_and_the_rules_know_only_the_contract() -> None:
    edges = graph()
    assert "policies.rules" in edges["superkube.plan.checks"]
    rule_modules = [m for m in edges if m.startswith("policies.rules.")]
    assert rule_modules
    for module in rule_modules:
        assert not {t for t in edges[module] if wing(t) == "plan"}, module
    assert "superkube.model.policy" in set().union(*(edges[m] for m in rule_modules))


def test_no_command_outside_superkube_lab_imports_the_lab_or_the_harness() -> None:
    wrong = [
        f"{module} imports {target}"
        for module, targets in graph().items()
        if wing(module) == "cli" and module not in LAB_COMMANDS
        for target in sorted(targets)
        if wing(target) in ("lab", "harness")
    ]
    assert not wrong, "\n".join(wrong)


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
        "    importlib.import_module('policies.rules')\n"
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
        "policies.rules",
    }
