"""A rolling node upgrade on the lab's real control plane (superkube.cluster.roll, superkube lab roll):

- a new version of the GPU pool's image is baked with one kubelet setting changed, as an operator
  changes it: in the GPU nodes' group variables;
- the pool (at least five instances) rolls onto it in batches of two: each batch cordoned, drained
  by evictions (a Deployment's PodDisruptionBudget is never broken), replaced in place from the new
  image and its custom data, and the next batch starts only once the replaced nodes are Ready and
  past preflight;
- an instance of the second batch comes up with a GPU off the bus: its preflight fails, and the roll
  stops there. The first batch runs the new kubelet setting, the failed node stays behind its taint,
  and the nodes after it keep their old image, never drained;
- rolled again, it replaces only what is not yet on the new version and in service, and ends with the
  whole pool on it.

Shares the control-plane lab (same shape) and runs after test_scaling_out (tests/lab/conftest.py
orders the modules of a shape): the earlier modules' GPU instances (converged, and from the first
image) are the pool it rolls.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from superkube.cli import app
from superkube.cluster import roll
from superkube.cluster.kube import LAB_ONLY_KUBELET_CONFIG
from superkube.lab import machines, nodes, scaleout
from superkube.lab.state import Lab
from superkube.model.spec import POOL_LABEL, PREFLIGHT_RESULT_ANNOTATION, PREFLIGHT_TAINT_KEY
from superkube.model.teams import TEAM_KEY
from tests.lab.conftest import Labs, get, kubectl, ok
from tests.lab.test_scaling_out import from_the_api_servers

JOINED = ("gpu-1", "cpu-1")
POOL_SIZE = 5  # at least: three batches of two, one after the failed one (the earlier modules leave five)
BATCH = 2
CHANGED = {"containerLogMaxSize": "20Mi"}  # the kubelet setting the new image changes (default 10Mi)
PROBE = "roll-probe"


def gpu_pool(fleet: Lab) -> str:
    return next(h.pool for h in fleet.hosts if h.group == "gpu_nodes")


def load() -> Lab:
    fleet = Lab.load()
    assert fleet is not None
    return fleet


def kubelet_config(fleet: Lab, name: str) -> dict[str, Any]:
    """The kubelet configuration the instance booted with (read from its root on this machine, not
    over SSH)."""
    root = machines.host_dir(fleet, fleet.host(name)) / "root"
    return dict(yaml.safe_load((root / "var/lib/kubelet/config.yaml").read_text()))


def created(fleet: Lab) -> dict[str, str]:
    """Each Node's creation time: a replaced instance registers a new Node of the same name."""
    return {n["metadata"]["name"]: n["metadata"]["creationTimestamp"] for n in get(fleet, "nodes")["items"]}


class Availability:
    """Polls a Deployment's available replicas while the roll runs: the least seen, and every pod."""

    def __init__(self, fleet: Lab) -> None:
        self.fleet = fleet
        self.least: int | None = None
        self.pods: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            proc = kubectl(self.fleet, "-n", "kube-system", "get", "deployment,pods", "-l", f"app={PROBE}",
                           "-o", "json")  # fmt: skip
            if proc.returncode == 0:
                items = json.loads(proc.stdout)["items"]
                for item in items:
                    if item["kind"] == "Deployment":
                        available = int(item["status"].get("availableReplicas") or 0)
                        self.least = available if self.least is None else min(self.least, available)
                    else:
                        self.pods.add(item["metadata"]["name"])
            time.sleep(0.5)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def probe_objects(fleet: Lab, pool: str) -> str:
    """Two replicas on the pool's nodes, one per node, with a budget of one disruption at a time."""
    labels = {"app": PROBE}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": PROBE, "namespace": "kube-system", "labels": labels},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {POOL_LABEL: pool},
                    "tolerations": [{"key": TEAM_KEY, "operator": "Exists"}],
                    "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                        {"labelSelector": {"matchLabels": labels}, "topologyKey": "kubernetes.io/hostname"}
                    ]}},
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "pause", "image": fleet.images["pause"]["ref"]}],
                },
            },
        },
    }  # fmt: skip
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": PROBE, "namespace": "kube-system"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}},
    }
    return yaml.safe_dump_all([deployment, budget])


def probe_pods_and_nodes(fleet: Lab, pool: str) -> dict[str, Any]:
    """Where the probe's pods are and why not (their conditions), and the pool's nodes' state."""
    pods = get(fleet, "-n", "kube-system", "pods", "-l", f"app={PROBE}")["items"]
    nodes_ = get(fleet, "nodes", "-l", f"{POOL_LABEL}={pool}")["items"]
    return {
        "pods": [(p["metadata"]["name"], p["spec"].get("nodeName"), p["status"].get("conditions")) for p in pods],
        "nodes": [
            (n["metadata"]["name"], n["spec"].get("unschedulable", False), n["spec"].get("taints"),
             [c["type"] for c in n["status"].get("conditions", []) if c["status"] == "True"])
            for n in nodes_
        ],
    }  # fmt: skip


@pytest.fixture(scope="module")
def upgrade(labs: Labs, control_plane: Lab) -> dict[str, Any]:
    labs.apply(control_plane)
    fleet = load()  # the lab as the earlier modules left it (their scale-outs are not in the fixture's copy)
    waiting = [n for n in JOINED if n not in nodes.ready_nodes(fleet)]
    if waiting:  # this module alone: no SSH to a node that joined long ago
        nodes.join(fleet, waiting)
    pool = gpu_pool(fleet)
    if scaleout.image_dir(fleet, pool) is None:  # this module alone: the pool's first image
        scaleout.bake(fleet, pool)
    from_the_api_servers(fleet, pool)  # the model the API servers' publisher keeps
    members = [h for h in fleet.hosts if h.group == "gpu_nodes"]
    if len(members) < POOL_SIZE:
        scaleout.scale_out(fleet, pool, POOL_SIZE - len(members))
        fleet = load()
    # the change, where an operator makes it: the GPU nodes' group variables beside the inventory
    group_vars = Path(fleet.inventory).parent / "group_vars" / "gpu_nodes.yml"
    group_vars.parent.mkdir(exist_ok=True)
    group_vars.write_text(yaml.safe_dump({"kubelet_extra_config": {**LAB_ONLY_KUBELET_CONFIG, **CHANGED}}))
    try:
        image = scaleout.bake(fleet, pool)
    finally:
        group_vars.unlink()
    fleet = load()
    ok(fleet, "apply", "-f", "-", stdin=probe_objects(fleet, pool))
    rolled = kubectl(fleet, "-n", "kube-system", "rollout", "status", f"deployment/{PROBE}", "--timeout=120s")
    assert rolled.returncode == 0, (rolled.stdout, rolled.stderr, probe_pods_and_nodes(fleet, pool))
    before = {
        "versions": {m.name: m.version for m in scaleout.LabPool(fleet, pool).members()},
        "created": created(fleet),
    }
    plan = roll.batches(
        scaleout.LabPool(fleet, pool).members(), image.name, scaleout.list_nodes(fleet), BATCH
    )
    assert len(plan) >= 3 and all(len(b) == BATCH for b in plan[:-1]), plan
    bad = plan[1][0]
    watch = Availability(fleet)
    try:
        first = CliRunner().invoke(app, ["lab", "roll", pool, "--batch", str(BATCH), "--timeout", "300",
                                         "--fault", f"{bad}=gpu-missing", "--output", "json"])  # fmt: skip
        after_first = {"fleet": load()}
        after_first["nodes"] = {n["metadata"]["name"]: n for n in get(after_first["fleet"], "nodes")["items"]}
        after_first["created"] = {
            n: v["metadata"]["creationTimestamp"] for n, v in after_first["nodes"].items()
        }
        # each GPU instance's kubelet configuration as the first roll left it (the second replaces some)
        after_first["configs"] = {
            h.name: kubelet_config(after_first["fleet"], h.name)
            for h in after_first["fleet"].hosts
            if h.pool == pool and h.group == "gpu_nodes"
        }
        second = CliRunner().invoke(
            app, ["lab", "roll", pool, "--batch", str(BATCH), "--timeout", "300", "--output", "json"]
        )
    finally:
        watch.stop()
        kubectl(load(), "-n", "kube-system", "delete", "deployment,pdb", PROBE, "--ignore-not-found")
    return {"pool": pool, "image": image, "plan": plan, "bad": bad, "before": before, "first": first,
            "after_first": after_first, "second": second, "watch": watch}  # fmt: skip


def test_the_roll_stops_at_the_batch_whose_node_fails_preflight(upgrade: dict[str, Any]) -> None:
    first = upgrade["first"]
    assert first.exit_code == 1, first.output
    report = json.loads(first.stdout)
    plan, bad = upgrade["plan"], upgrade["bad"]
    assert report["version"] == upgrade["image"].name and not report["ok"]
    assert report["stopped_at"] == 2, report["batches"]
    assert [b["nodes"] for b in report["batches"]] == plan
    assert [b["state"] for b in report["batches"]] == ["passed", "failed"] + ["waiting"] * (len(plan) - 2)
    assert list(report["batches"][1]["why"]) == [bad]
    assert report["batches"][1]["why"][bad].startswith("preflight failed")
    assert "stopped at batch 2" in first.stderr and bad in first.stderr

    fleet = upgrade["after_first"]["fleet"]
    new_nodes = upgrade["after_first"]["created"]
    # the first batch: new instances of the same names, on the new image, running its kubelet setting
    for name in plan[0]:
        assert scaleout.image_version(fleet.host(name)) == upgrade["image"].name
        # (a member whose node never registered had none: gpu-2 when this module runs alone)
        assert new_nodes[name] > upgrade["before"]["created"].get(name, ""), (
            f"{name}: its Node was not made anew"
        )
        assert (
            upgrade["after_first"]["configs"][name]["containerLogMaxSize"] == CHANGED["containerLogMaxSize"]
        )
    # the failed node: on the new image, held behind its preflight taint with preflight's reason
    node = upgrade["after_first"]["nodes"][bad]  # as the first roll left it (the second replaced it)
    assert PREFLIGHT_TAINT_KEY in {t["key"] for t in node["spec"].get("taints") or []}
    assert node["metadata"]["annotations"][PREFLIGHT_RESULT_ANNOTATION].startswith("failed")
    assert "GPU" in node["metadata"]["annotations"][PREFLIGHT_RESULT_ANNOTATION]
    # every node after the failed batch: its old image and its old Node, never cordoned
    for batch in plan[2:]:
        for name in batch:
            assert scaleout.image_version(fleet.host(name)) == upgrade["before"]["versions"][name]
            assert new_nodes[name] == upgrade["before"]["created"][name]
            assert not roll.cordoned(upgrade["after_first"]["nodes"][name]), f"{name} was cordoned"
            config = upgrade["after_first"]["configs"][name]
            assert config.get("containerLogMaxSize") != CHANGED["containerLogMaxSize"], name


def test_rolled_again_it_replaces_only_what_is_not_yet_in_service_and_ends_on_the_new_version(
    upgrade: dict[str, Any],
) -> None:
    second = upgrade["second"]
    assert second.exit_code == 0, second.output[-4000:]
    report = json.loads(second.stdout)
    assert report["ok"] and report["stopped_at"] is None
    plan, bad = upgrade["plan"], upgrade["bad"]
    rolled = [n for b in report["batches"] for n in b["nodes"]]
    settled = [n for n in plan[1] if n != bad]  # the failed batch's other nodes came up in service
    # (in the pool's order now: a replaced instance is the pool's newest)
    assert sorted(rolled) == sorted([bad, *(n for b in plan[2:] for n in b)]), report
    fleet = load()
    now = created(fleet)
    for name in [*plan[0], *settled]:  # in service on the new version: left alone
        assert now[name] == upgrade["after_first"]["created"][name]
    pool_members = scaleout.LabPool(fleet, upgrade["pool"]).members()
    assert {m.version for m in pool_members} == {upgrade["image"].name}
    assert len(pool_members) >= POOL_SIZE
    every = {n["metadata"]["name"]: n for n in get(fleet, "nodes")["items"]}
    for member in pool_members:
        assert roll.verdict(every[member.name]) == (roll.PASSED, "schedulable"), member.name
        assert kubelet_config(fleet, member.name)["containerLogMaxSize"] == CHANGED["containerLogMaxSize"]


def test_every_drain_kept_the_disruption_budget(upgrade: dict[str, Any]) -> None:
    watch = upgrade["watch"]
    assert watch.least is not None and watch.least >= 1, "the probe's Deployment fell below its budget"
    assert len(watch.pods) > 2, "no probe pod was ever evicted: the drains were not tested"
