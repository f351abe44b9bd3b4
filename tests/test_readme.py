"""The README and the guides under docs/ describe the tree as it is: every role, every benchmark, the
two set-up commands, every command and policy rule, links that lead somewhere, and the figures, which
must be what bench/results/ and the code say."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from modules.platform.flowcontrol import NodeJoinFlowArgs
from policies.rules import ALL_RULES
from superkube.agents import scale_governor
from superkube.cluster import autoscaling
from superkube.harness import autoscaler as ca_lab
from superkube.harness import build
from superkube.plan import engine as planning
from superkube.plan import layer
from tests.conftest import ROOT

DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
"""every page a reader may open: the README and the guides"""


def guide(name: str) -> str:
    return (DOCS / name).read_text()


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _figures() -> Any:
    return _load(ROOT / "bench" / "figures.py", "bench_figures")


def _references() -> Any:
    return _load(ROOT / "scripts" / "reference_docs.py", "reference_docs")


def test_the_layout_names_every_role() -> None:
    text = guide("08-architecture.md")
    layout = text[text.index("## Layout") :]
    roles = sorted(p.name for p in (ROOT / "playbooks" / "roles").iterdir() if p.is_dir())
    assert [r for r in roles if not re.search(rf"\b{r}\b", layout)] == []


def test_every_benchmark_is_described() -> None:
    text = guide("09-figures.md")
    section = text[text.index("## Benchmarks") :]
    scripts = sorted(p.name for p in (ROOT / "bench").glob("*.py") if not p.name.startswith("_"))
    assert [s for s in scripts if f"bench/{s}" not in section] == []


def test_exactly_two_set_up_commands() -> None:
    section = README[README.index("## Set up on a fresh machine") :]
    block = section[section.index("```sh") : section.index("```", section.index("```sh") + 5)]
    commands = [line.split("#")[0].strip() for line in block.splitlines()[1:] if line.strip()]
    assert commands == ["make plan", "make test"]


@pytest.mark.parametrize("name", sorted(_figures().BLOCKS))
def test_the_figures_are_what_the_results_and_the_code_say(name: str) -> None:
    figures = _figures()
    page = figures.home(name)  # exactly one page holds each block
    assert figures.written_block(page.read_text(), name) == figures.block(name), (
        "run: .venv/bin/python bench/figures.py --write"
    )


def test_the_figures_are_in_the_figures_guide() -> None:
    figures = _figures()
    assert {name: figures.home(name) for name in figures.BLOCKS} == {
        name: DOCS / "09-figures.md" for name in figures.BLOCKS
    }
    assert {"summary", "monitoring"} <= set(figures.BLOCKS)


def test_the_sizing_sentence_says_what_the_results_say() -> None:
    text = guide("07-monitoring.md")
    section = " ".join(text[text.index("**Sizing the flagship**") :].split())
    assert [p for p in _figures().sizing_phrases() if p not in section] == []


def test_the_results_were_measured_on_todays_tree(flagship_plan: planning.Plan) -> None:
    """A results file taken on another rule set, layer or plan is stale: re-run its benchmark."""
    results = {
        name: json.loads((ROOT / "bench" / "results" / f"{name}.json").read_text())
        for name in ("check", "render", "build")
    }
    stale = []
    if results["check"]["rules"] != len(ALL_RULES):
        stale.append(
            f"check.json: {results['check']['rules']} rules, today {len(ALL_RULES)} (bench/check.py)"
        )
    if results["check"]["resources"] != len(flagship_plan.resources):
        stale.append(
            f"check.json: {results['check']['resources']} resources, today {len(flagship_plan.resources)}"
        )
    objects = sum(len(docs) for docs in layer.objects(flagship_plan).values())
    if results["render"]["objects"] != objects:
        stale.append(
            f"render.json: {results['render']['objects']} objects, today {objects} (bench/render.py)"
        )
    pins = {c.name: c.version for c in build.components()}
    if results["build"]["versions"] != pins:
        stale.append(
            f"build.json: built {results['build']['versions']}, today's pins {pins} (bench/build.py)"
        )
    scaled = json.loads((ROOT / "bench" / "results" / "autoscaler.json").read_text())
    flags = autoscaling.flags(flagship_plan.spec, flagship_plan.cluster)
    tuned = {a.removeprefix("--").partition("=")[0]: a.partition("=")[2] for a in flags}
    tuned = {k: v for k, v in tuned.items() if k in ca_lab.TUNED}
    ran = next(r for r in scaled["runs"] if r["setting"] == "flagship")
    governed = next(r for r in scaled["runs"] if r["setting"] == "governed")
    room = scale_governor.budget(flagship_plan.spec.safe_join_rate_per_minute)
    if governed["flags"] != tuned or governed["governor_room_per_refresh"] != room:
        stale.append(f"autoscaler.json: the governed run had room {governed['governor_room_per_refresh']}, "
                     f"today {room} (bench/autoscaler.py)")  # fmt: skip
    if scaled["version"] != autoscaling.VERSION or ran["flags"] != tuned:
        stale.append(
            f"autoscaler.json: {scaled['version']} with {ran['flags']}, today {autoscaling.VERSION} "
            f"with {tuned} (bench/autoscaler.py)"
        )
    flow = json.loads((ROOT / "bench" / "results" / "join_flow.json").read_text())
    level = dataclasses.asdict(NodeJoinFlowArgs(shares=flagship_plan.spec.apf_node_join_shares))
    if flow["level"] != level:
        stale.append(
            f"join_flow.json: the join level was {flow['level']}, today {level} (bench/join_flow.py)"
        )
    stale += _pod_accounting_stale(flagship_plan)
    assert stale == []


def _pod_accounting_stale(plan: planning.Plan) -> list[str]:
    """pod_accounting.json measured each pool's pods with the flagship's internal ranges of today."""
    from superkube.plan import checks

    got = json.loads((ROOT / "bench" / "results" / "pod_accounting.json").read_text())
    engine = checks.plan_wiring(plan)
    host = next(h for h in engine.hosts if h.group == "gpu_nodes")
    ranges = engine.render("iptables_accounting", host, ["iptables_accounting_internal_cidrs"])
    per_pod = 2 * (len(ranges["iptables_accounting_internal_cidrs"]) + 1) + 2  # tagged both ways, dispatch
    pods = {p.role: p.pod_ips_per_node for p in plan.spec.node_pools}
    measured = {
        role: (got["densities"][role]["pods"], got["densities"][role]["per_pod_rules"]) for role in pods
    }
    today = {role: (n, n * per_pod) for role, n in pods.items()}
    if measured != today:
        return [
            f"pod_accounting.json: (pods, per-pod rules) {measured}, today {today} (bench/pod_accounting.py)"
        ]
    return []


def test_the_rule_count_in_the_text_is_todays() -> None:
    """Every page that says how many rules `superkube check` evaluates says today's count."""
    counts = {int(n) for page in PAGES for n in re.findall(r"evaluates (\d+) rules", page.read_text())}
    assert counts == {len(ALL_RULES)}


@pytest.mark.parametrize("page", ["commands.md", "rules.md"])
def test_the_references_are_what_the_code_says(page: str) -> None:
    made = _references().PAGES[page]()
    assert guide(page) == made, "run: .venv/bin/python scripts/reference_docs.py --write"


def test_the_command_reference_names_every_command() -> None:
    import typer.main

    from superkube.cli import app

    def paths(group: Any, path: str) -> list[str]:
        found = []
        for name, command in group.commands.items():
            if not command.hidden:
                found.append(f"{path} {name}")
                found += paths(command, f"{path} {name}") if getattr(command, "commands", None) else []
        return found

    text = guide("commands.md")
    assert [p for p in paths(typer.main.get_command(app), "superkube") if f"| `{p}" not in text] == []


def test_the_rule_reference_names_every_rule_with_its_severity() -> None:
    text = guide("rules.md")
    assert [r.name for r in ALL_RULES if f"| `{r.name}` | {r.severity}" not in text] == []


def _outside_code(text: str) -> str:
    """The page without its fenced blocks and code spans: a link in code is no link."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`]*`", "", text)


def _anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to hyphens,
    a repeated one numbered."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(
        r"^#{1,6} +(.+?) *#* *$", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S), re.M
    ):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_every_relative_link_leads_to_a_file_and_its_anchor() -> None:
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", _outside_code(page.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            name = f"{page.relative_to(ROOT)}: {target}"
            if not linked.exists():
                broken.append(f"{name} (no such file)")
            elif anchor and (linked.suffix != ".md" or anchor not in _anchors(linked.read_text())):
                broken.append(f"{name} (no such heading)")
    assert broken == []


def test_every_guide_is_in_the_reading_order() -> None:
    """docs/README.md and the README's map both list every guide."""
    guides = sorted(p.name for p in DOCS.glob("*.md") if p.name != "README.md")
    order = guide("README.md")
    assert [g for g in guides if f"]({g})" not in order] == []
    assert [g for g in guides if f"](docs/{g})" not in README] == []
