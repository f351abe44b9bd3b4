"""The team taint reconciler: node taints follow the configuration (add, change, remove), no other
taint is touched, a second round writes nothing, dry-run writes nothing; and as a process against
a real API server (etcd and kube-apiserver at the pinned versions), as its Deployment runs it."""

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
from superkube.harness import apiserver
from superkube.harness.apiserver import ADMIN_USER as ADMIN
from superkube.harness.apiserver import LocalApi, free_port
from superkube.model import teams
from tests.agents.conftest import admin, make_node

TEAMS = [
    {"selector": {"superkube.io/pool": "gpu"}, "team": "any", "priority": 0},
    {"selector": {"superkube.io/pool": "gpu", "rack": "a"}, "team": "research", "priority": 10},
]
OTHER = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
CORDON = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


def node(name: str, labels: dict[str, str], taints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    meta = {"name": name, "uid": f"uid-{name}", "labels": {"superkube.io/pool": "gpu", **labels}}
    # no taints: no taints field, as the server leaves an empty list out
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": meta,
        "spec": {"taints": taints} if taints else {},
    }


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

    def __init__(self, items: list[dict[str, Any]], namespaces: dict[str, str] | None = None) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in items}
        self.namespaces = namespaces or {}
        self.patches: list[tuple[str, list[dict[str, Any]]]] = []
        self.events: list[dict[str, Any]] = []

    def all_nodes(self) -> list[dict[str, Any]]:
        return copy.deepcopy(list(self.nodes.values()))

    def patch_node(self, name: str, ops: list[dict[str, Any]]) -> None:
        self.patches.append((name, ops))
        self.nodes[name] = jsonpatch.apply_patch(self.nodes[name], ops)

    def create_event(self, body: dict[str, Any]) -> None:
        self.events.append(body)

    def namespace_teams(self) -> dict[str, str]:
        return dict(self.namespaces)


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


# --- as a process, against a real API server ------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalApi]:
    """A real API server of this module's own: the reconciler owns every node it can see (it removes
    a team taint no tuple gives), so the session's shared server, whose nodes other tests made, is
    not one it may be let loose on."""
    with apiserver.running(tmp_path_factory.mktemp("teams-apiserver")) as running:
        yield running


@pytest.fixture
def fleet(server: LocalApi) -> dict[str, dict[str, Any]]:
    """The nodes of `nodes()` made on the server as kubelets register them (no others)."""
    core = admin(server)
    for n in core.list_node().items:
        core.delete_node(n.metadata.name)
    return {n["metadata"]["name"]: make_node(server, n["metadata"]["name"], n["metadata"]["labels"],
                                             n["spec"]["taints"]) for n in nodes()}  # fmt: skip


def run(config: Path, kubeconfig: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "superkube.agents.team_taints", "--config", str(config),
               "--kubeconfig", str(kubeconfig), "--metrics-port", str(free_port()), "--metrics-address",
               "127.0.0.1", "--interval", "0.1", "--rounds", "1", *extra]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def on_server(server: LocalApi) -> dict[str, dict[str, Any]]:
    core = admin(server)
    return {
        n["metadata"]["name"]: n for n in core.api_client.sanitize_for_serialization(core.list_node().items)
    }


def team_events(server: LocalApi) -> list[Any]:
    items = admin(server).list_namespaced_event("default").items
    return [e for e in items if e.reason == "TeamTaint"]


def test_the_agent_patches_through_the_api(server: LocalApi, fleet: dict[str, Any], config: Path) -> None:
    """The process, as its Deployment runs it, changes exactly the three nodes it should on a real
    server, with JSON patches the server applies, and says so in an Event each."""
    before = len(server.requests(ADMIN))
    events = len(team_events(server))
    proc = run(config, server.kubeconfig)
    assert proc.returncode == 0, proc.stderr
    now = on_server(server)
    assert now["a-1"]["spec"]["taints"] == [OTHER, teams.taint("research")]
    assert now["b-1"]["spec"]["taints"] == [teams.taint("any"), CORDON]  # in place; the cordon stays
    assert now["a-2"]["metadata"]["resourceVersion"] == fleet["a-2"]["metadata"]["resourceVersion"]
    assert now["cpu-1"]["spec"]["taints"] == [OTHER]
    writes = [r for r in server.requests(ADMIN)[before:] if r["verb"] == "patch"]
    assert sorted(r["uri"].rsplit("/", 1)[1] for r in writes) == ["a-1", "b-1", "cpu-1"]
    assert {r["code"] for r in writes} == {200}
    assert len(team_events(server)) - events == 3


def test_dry_run_sends_no_write_and_a_bad_file_is_one_line(
    server: LocalApi, fleet: dict[str, Any], config: Path, tmp_path: Path
) -> None:
    before = len(server.requests(ADMIN))
    proc = run(config, server.kubeconfig, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("dry-run: would") == 3
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {selector: {rack: a}, team: research}\n- {selector: {rack: a}, team: other}\n")
    proc = run(bad, server.kubeconfig)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "same priority" in proc.stderr
    verbs = {r["verb"] for r in server.requests(ADMIN)[before:]}
    assert verbs <= {"get", "list", "watch"}, verbs
    now = on_server(server)
    assert all(
        now[n]["metadata"]["resourceVersion"] == fleet[n]["metadata"]["resourceVersion"] for n in fleet
    )


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
