"""The team taint reconciler: node taints follow the configuration (add, change, remove), no other
taint is touched, a second round writes nothing, dry-run writes nothing; and as a process against
a loopback API endpoint, through the official client's HTTP path."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from superkube.agents import team_taints
from superkube.agents.team_taints import Reconciler
from superkube.model import teams
from tests.agents.loopback import Api
from tests.agents.test_node_health import free_port

TEAMS = [
    {"selector": {"superkube.io/pool": "gpu"}, "team": "any", "priority": 0},
    {"selector": {"superkube.io/pool": "gpu", "rack": "a"}, "team": "research", "priority": 10},
]
OTHER = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
CORDON = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


def node(name: str, labels: dict[str, str], taints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    meta = {"name": name, "uid": f"uid-{name}", "labels": {"superkube.io/pool": "gpu", **labels}}
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": {"taints": taints or []}}


def nodes() -> list[dict[str, Any]]:
    return [
        node("a-1", {"rack": "a"}, [OTHER]),  # research's, no team taint yet: add
        node("b-1", {"rack": "b"}, [teams.taint("research"), CORDON]),  # anyone's now: change to any
        node("a-2", {"rack": "a"}, [teams.taint("research")]),  # right already: nothing
        {
            **node("cpu-1", {}, [teams.taint("research"), OTHER]),
            "metadata": {"name": "cpu-1", "labels": {"superkube.io/pool": "cpu"}},
        },
    ]


class FakeKube:
    """Applies each JSON patch (test included) to its nodes, as the API server would."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in items}
        self.patches: list[tuple[str, list[dict[str, Any]]]] = []
        self.events: list[dict[str, Any]] = []

    def all_nodes(self) -> list[dict[str, Any]]:
        return copy.deepcopy(list(self.nodes.values()))

    def patch_node(self, name: str, ops: list[dict[str, Any]]) -> None:
        self.patches.append((name, ops))
        self.nodes[name] = jsonpatch.apply_patch(self.nodes[name], ops)

    def create_event(self, body: dict[str, Any]) -> None:
        self.events.append(body)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "teams.yaml"
    path.write_text(yaml.safe_dump(TEAMS))
    return path


def taints(kube: FakeKube, name: str) -> list[dict[str, Any]]:
    return list(kube.nodes[name]["spec"]["taints"])


def test_taints_follow_the_configuration_and_nothing_else_moves(config: Path) -> None:
    kube = FakeKube(nodes())
    assert Reconciler(config, kube).round() == {"add": 1, "change": 1, "remove": 1}
    assert taints(kube, "a-1") == [OTHER, teams.taint("research")]
    assert taints(kube, "b-1") == [teams.taint("any"), CORDON]  # in place; the cordon stays
    assert taints(kube, "a-2") == [teams.taint("research")]
    assert taints(kube, "cpu-1") == [OTHER]
    assert {name for name, _ in kube.patches} == {"a-1", "b-1", "cpu-1"}
    assert all(ops[0]["op"] == "test" for _, ops in kube.patches)  # a node changed meanwhile is not clobbered
    assert [e["reason"] for e in kube.events] == ["TeamTaint"] * 3


def test_a_second_round_writes_nothing(config: Path) -> None:
    kube = FakeKube(nodes())
    reconciler = Reconciler(config, kube)
    reconciler.round()
    before = len(kube.patches)
    assert reconciler.round() == {} and len(kube.patches) == before


def test_a_configuration_change_moves_the_nodes_it_names(config: Path) -> None:
    kube = FakeKube(nodes())
    reconciler = Reconciler(config, kube)
    reconciler.round()
    config.write_text(yaml.safe_dump([TEAMS[0]]))  # research gives its rack back
    assert reconciler.round() == {"change": 2}
    assert taints(kube, "a-1") == [OTHER, teams.taint("any")] and taints(kube, "a-2") == [teams.taint("any")]


def test_dry_run_and_a_broken_configuration_write_nothing(config: Path) -> None:
    kube = FakeKube(nodes())
    assert Reconciler(config, kube, dry_run=True).round() == {"add": 1, "change": 1, "remove": 1}
    assert kube.patches == [] and kube.events == []
    config.write_text("- {selector: {rack: a}, team: Research}\n")
    reconciler = Reconciler(config, kube)
    assert reconciler.round() == {} and kube.patches == []
    assert reconciler.metrics.config_ok._value.get() == 0


def test_the_patch_is_valid_json_patch_that_keeps_other_taints() -> None:
    before = nodes()[0]
    after = team_taints.desired_taints(before, teams.owner(teams.parse(TEAMS), before["metadata"]["labels"]))
    result = jsonpatch.apply_patch(before, team_taints.patch(before, after))
    assert result["spec"]["taints"] == [OTHER, teams.taint("research")]
    with pytest.raises(jsonpatch.JsonPatchTestFailed):  # the taints changed since they were read
        jsonpatch.apply_patch({**before, "spec": {"taints": []}}, team_taints.patch(before, after))


# --- as a process -------------------------------------------------------------------------------


@pytest.fixture
def api() -> Iterator[Api]:
    a = Api(nodes(), [], refuse=set())
    yield a
    a.server.shutdown()
    a.server.server_close()


def run(config: Path, kubeconfig: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], int]:
    port = free_port()
    command = [sys.executable, "-m", "superkube.agents.team_taints", "--config", str(config),
               "--kubeconfig", str(kubeconfig), "--metrics-port", str(port), "--metrics-address", "127.0.0.1",
               "--interval", "0.1", "--rounds", "1", *extra]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False), port


def test_the_agent_patches_through_the_api(api: Api, config: Path, tmp_path: Path) -> None:
    proc, _ = run(config, api.kubeconfig(tmp_path / "kubeconfig"))
    assert proc.returncode == 0, proc.stderr
    patches = {w[1].rsplit("/", 1)[1]: w for w in api.writes if w[0] == "PATCH"}
    assert set(patches) == {"a-1", "b-1", "cpu-1"}
    _, _, content_type, body = patches["a-1"]
    assert content_type == "application/json-patch+json"
    assert body[1]["value"] == [OTHER, teams.taint("research")]
    assert sum(1 for w in api.writes if w[1].endswith("/events")) == 3


def test_dry_run_sends_no_write_and_a_bad_file_is_one_line(api: Api, config: Path, tmp_path: Path) -> None:
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
    proc, _ = run(config, kubeconfig, "--dry-run")
    assert proc.returncode == 0 and api.writes == [], proc.stderr
    assert proc.stderr.count("dry-run: would") == 3
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {selector: {rack: a}, team: research}\n- {selector: {rack: a}, team: other}\n")
    proc, _ = run(bad, kubeconfig)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "same priority" in proc.stderr and api.writes == []


def test_metrics_count_the_changes(config: Path) -> None:
    kube = FakeKube(nodes())
    reconciler = Reconciler(config, kube)
    reconciler.round()
    from prometheus_client import generate_latest

    text = generate_latest(reconciler.metrics.registry).decode()
    assert 'superkube_team_taint_changes_total{action="add"} 1.0' in text
    assert (
        'superkube_team_nodes{team="research"} 2.0' in text
        and 'superkube_team_nodes{team="none"} 1.0' in text
    )
