"""The README describes the tree as it is: every role, every benchmark, the two set-up commands and
the figures, which must be what bench/results/ and the code say."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
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


def _figures() -> Any:
    spec = importlib.util.spec_from_file_location("bench_figures", ROOT / "bench" / "figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["summary", "monitoring"])
def test_the_figures_are_what_the_results_and_the_code_say(name: str) -> None:
    figures = _figures()
    assert figures.readme_block(README, name) == figures.block(name), (
        "run: .venv/bin/python bench/figures.py --write"
    )


def test_the_sizing_sentence_says_what_the_results_say() -> None:
    section = " ".join(README[README.index("**Sizing the flagship**") :].split())
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
    assert stale == []


def test_the_rule_count_in_the_text_is_todays() -> None:
    counts = {int(n) for n in re.findall(r"evaluates (\d+) rules", README)}
    assert counts == {len(ALL_RULES)}
