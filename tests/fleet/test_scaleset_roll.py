"""The roll on Azure (superkube.fleet.scalesets with superkube.cluster.roll): a pool's scale-set
instances through the loopback Resource Manager (tests/fleet/resource_manager.py), their Nodes,
pods, evictions and PodDisruptionBudgets through the real API server (etcd and kube-apiserver at
the pinned versions, on loopback).

No kubelet or VM runs here. Two stand-ins do what the instances would, and no more: the old kubelet
finishes an evicted pod (deletes it once it is terminating, as a kubelet does when its containers
have stopped), and an instance that starts from the new image registers its Node as the plan's
custom data says (behind the preflight taint), whose preflight then passes or, for a faulted
instance, fails. The lab rolls real kubelets (tests/lab/test_upgrading_nodes.py)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from superkube.agents.kubeapi import Kube
from superkube.cli import app
from superkube.cluster import roll
from superkube.fleet import arm, scalesets
from superkube.harness.apiserver import LocalApi
from superkube.model.spec import POOL_LABEL, PREFLIGHT_RESULT_ANNOTATION, PREFLIGHT_TAINT_KEY
from superkube.plan import engine as planning
from tests.agents.conftest import admin, make_node, make_pod, namespace, unique
from tests.fleet.resource_manager import TOKEN, ResourceManager

ROOT = Path(__file__).resolve().parents[2]
SUBSCRIPTION = "00000000-1111-2222-3333-444444444444"
GROUP = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/rg-dev"
GALLERY = f"{GROUP}/providers/Microsoft.Compute/galleries/gal_dev/images/superkube-gpu-node"


def image(version: str) -> dict[str, str]:
    return {"id": f"{GALLERY}/versions/{version}"}


class Fleet:
    """The pool as Azure and the API server hold it, and what its machines do."""

    def __init__(self, api: LocalApi, rm: ResourceManager, pool: str = "", size: int = 4) -> None:
        self.api, self.rm, self.core = api, rm, admin(api)
        self.pool = pool or unique("gpu")  # a pool label of its own: the API server is shared
        self.scale_set = f"{GROUP}/providers/Microsoft.Compute/virtualMachineScaleSets/vmss-dev-{self.pool}-0"
        profile = {"storageProfile": {"imageReference": image("1.1.0")}}
        rm.add(self.scale_set, {"properties": {"virtualMachineProfile": profile}})
        self.names = [f"vmss-dev-{self.pool}-{i:06d}" for i in range(size)]
        for i, name in enumerate(self.names):
            rm.add_instance(self.scale_set, str(i), name.upper(), image("1.0.0"))
            self.register(name, passed=True)
        self.faulted: set[str] = set()
        self.timers: list[threading.Timer] = []
        self.uids = {n: self.core.read_node(n).metadata.uid for n in self.names}
        rm.on_start = self.started
        rm.on_power_off = self.powered_off

    def register(self, name: str, passed: bool) -> None:
        """A kubelet registers its Node: the pool's labels, behind preflight until it passes."""
        taints = [] if passed else [{"key": PREFLIGHT_TAINT_KEY, "value": "pending", "effect": "NoSchedule"}]
        make_node(self.api, name, {POOL_LABEL: self.pool}, taints)
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is ready"}
        self.core.patch_node_status(name, {"status": {"conditions": [ready]}})
        if passed:
            self.core.patch_node(name, {"metadata": {"annotations": {PREFLIGHT_RESULT_ANNOTATION: "passed"}}})

    def started(self, names: list[str]) -> None:
        for upper in names:
            name = upper.lower()
            self.register(name, passed=False)
            timer = threading.Timer(0.5, self.preflight, (name,))
            timer.start()
            self.timers.append(timer)

    def preflight(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self._preflight(name)
        except ApiException as exc:  # the Node was deleted meanwhile (a test that ended): nothing to pass
            if exc.status != 404:
                raise

    def _preflight(self, name: str) -> None:
        if name in self.faulted:
            result = "failed 2026-11-27T00:00:00Z: 7 of 8 GPUs a Standard_ND96isr_H100_v5 has are visible"
            self.core.patch_node(name, {"metadata": {"annotations": {PREFLIGHT_RESULT_ANNOTATION: result}}})
            return
        self.core.patch_node(
            name,
            {"metadata": {"annotations": {PREFLIGHT_RESULT_ANNOTATION: "passed"}}, "spec": {"taints": None}},
        )

    def powered_off(self, names: list[str]) -> None:
        self.off = [n.lower() for n in names]

    def finish_evicted(self, stop: threading.Event) -> None:
        """The old kubelets: a pod that is terminating on a pool node is gone once it stopped."""
        while not stop.wait(0.2):
            for pod in self.core.list_pod_for_all_namespaces().items:
                if pod.spec.node_name in self.names and pod.metadata.deletion_timestamp:
                    self.core.delete_namespaced_pod(
                        pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0
                    )

    def versions(self) -> dict[str, str]:
        got = self.rm.instances(self.scale_set)
        ids = {i["properties"]["osProfile"]["computerName"].lower(): i for i in got}
        return {
            n: scalesets.version_of(ids[n]["properties"]["storageProfile"]["imageReference"]) for n in ids
        }


@pytest.fixture
def fleets(api: LocalApi) -> Iterator[Any]:
    """Make a Fleet (pool, size) with its machines running; stops them after the test."""
    made: list[tuple[Fleet, threading.Event, threading.Thread]] = []
    with ResourceManager() as rm:

        def make(pool: str = "", size: int = 4) -> Fleet:
            f = Fleet(api, rm, pool, size)
            stop = threading.Event()
            kubelets = threading.Thread(target=f.finish_evicted, args=(stop,), daemon=True)
            kubelets.start()
            made.append((f, stop, kubelets))
            return f

        yield make
        for f, stop, kubelets in made:
            stop.set()
            kubelets.join()
            for t in f.timers:
                t.join()
            for name in f.names:  # the session's API server is shared: leave no Node of this pool
                f.core.delete_node(name)


@pytest.fixture
def fleet(fleets: Any) -> Fleet:
    f: Fleet = fleets()
    return f


def pool_of(f: Fleet, api: LocalApi, drain_timeout_s: float = 30.0) -> scalesets.ScaleSetPool:
    client = arm.Arm(token=lambda: TOKEN, base=f.rm.url, poll_s=0.0, sleep=lambda s: None)
    name = f.scale_set.rsplit("/", 1)[1]
    return scalesets.ScaleSetPool(client, Kube(str(api.kubeconfig)), GROUP, f.pool, [name], drain_timeout_s)


def test_a_roll_drains_powers_off_deletes_the_nodes_and_upgrades_in_batches(
    fleet: Fleet, api: LocalApi
) -> None:
    f = fleet
    work = namespace(api, unique("team"))
    make_pod(api, work, "trainer", f.names[0])
    make_pod(api, "kube-system", unique("coredns"), f.names[1])  # the node goes away: the system moves too
    daemon = unique("exporter")
    make_pod(api, work, daemon, f.names[0])
    owner = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "name": "exporter",
        "uid": "0" * 36,
        "controller": True,
    }
    f.core.patch_namespaced_pod(daemon, work, {"metadata": {"ownerReferences": [owner]}})
    pool = pool_of(f, api)
    assert pool.model_version() == "1.1.0"
    assert [m.name for m in pool.members()] == f.names  # over two pages of the list
    report = roll.roll(pool, "1.1.0", 2, timeout_s=60)
    assert report.ok, report.summary()
    assert [b.nodes for b in report.batches] == [f.names[:2], f.names[2:]]
    # each batch: power off, manual upgrade, start, on its own instances, in that order
    actions = [(m, p.rsplit("/", 1)[1]) for m, p in f.rm.writes()]
    assert actions == [("POST", "poweroff"), ("POST", "manualupgrade"), ("POST", "start")] * 2
    assert f.versions() == dict.fromkeys(f.names, "1.1.0")
    for name in f.names:  # every Node registered anew, and in service
        node = f.core.read_node(name)
        assert node.metadata.uid != f.uids[name] and not node.spec.unschedulable and not node.spec.taints
    # the workloads were evicted and finished; the DaemonSet's pod was left to its node
    assert [p.metadata.name for p in f.core.list_namespaced_pod(work).items] == [daemon]


def test_a_pod_disruption_budget_stops_the_roll_before_anything_is_replaced(
    fleet: Fleet, api: LocalApi
) -> None:
    f = fleet
    work = namespace(api, unique("team"))
    make_pod(api, work, "trainer", f.names[1])
    f.core.patch_namespaced_pod("trainer", work, {"metadata": {"labels": {"app": "trainer"}}})
    # running and ready, as its kubelet would report it (a Pending pod is evicted whatever its budget)
    ready = {"type": "Ready", "status": "True"}
    f.core.patch_namespaced_pod_status(
        "trainer", work, {"status": {"phase": "Running", "conditions": [ready]}}
    )
    from kubernetes import client

    policy = client.PolicyV1Api(f.core.api_client)
    pdb = {
        "metadata": {"name": "trainer"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "trainer"}}},
    }
    policy.create_namespaced_pod_disruption_budget(work, pdb)
    # what the disruption controller would write: this budget allows no disruption
    status = {
        "status": {
            "disruptionsAllowed": 0,
            "currentHealthy": 1,
            "desiredHealthy": 1,
            "expectedPods": 1,
            "observedGeneration": 1,
        }
    }
    policy.patch_namespaced_pod_disruption_budget_status("trainer", work, status)
    report = roll.roll(pool_of(f, api, drain_timeout_s=3), "1.1.0", 2, timeout_s=60)
    assert report.stopped_at == 1
    (why,) = report.batches[0].why.values()
    assert why.startswith("drain: 1 pods left after 3 s (1 held by a PodDisruptionBudget: ")
    assert f.rm.writes() == [] and f.versions() == dict.fromkeys(f.names, "1.0.0")
    assert not any(f.core.read_node(n).spec.unschedulable for n in f.names)  # uncordoned, as they were
    assert f.core.read_namespaced_pod("trainer", work).metadata.deletion_timestamp is None


def test_a_failed_preflight_stops_the_roll_and_later_batches_keep_their_version(
    fleet: Fleet, api: LocalApi
) -> None:
    f = fleet
    f.faulted.add(f.names[1])
    report = roll.roll(pool_of(f, api), "1.1.0", 2, timeout_s=60)
    assert report.stopped_at == 1 and "preflight failed" in report.batches[0].why[f.names[1]]
    assert f.versions() == {**dict.fromkeys(f.names[:2], "1.1.0"), **dict.fromkeys(f.names[2:], "1.0.0")}
    assert all(p.endswith(("poweroff", "manualupgrade", "start")) for _, p in f.rm.writes())
    assert len(f.rm.writes()) == 3  # batch 2 never touched
    # rolled again (the instance repaired): only the failed node and the rest
    f.faulted.clear()
    f.rm.requests.clear()
    again = roll.roll(pool_of(f, api), "1.1.0", 2, timeout_s=60)
    assert again.ok and [b.nodes for b in again.batches] == [[f.names[1], f.names[2]], [f.names[3]]]
    assert f.versions() == dict.fromkeys(f.names, "1.1.0")


def test_a_model_that_is_not_the_version_replaces_nothing(fleet: Fleet, api: LocalApi) -> None:
    f = fleet
    pool = pool_of(f, api)
    pool.members()
    with pytest.raises(
        roll.RollError, match=r"nothing replaced: the pool's model is 1\.1\.0, not 1\.2\.0: run pulumi up"
    ):
        pool.replace(f.names[:1], "1.2.0")
    assert f.rm.writes() == []


def test_the_command_rolls_the_stacks_pool(fleets: Any, api: LocalApi) -> None:
    """`superkube image roll gpu -s dev`: the dev stack's GPU pool and its one scale set, as Azure and
    the API server hold them."""
    _, _, addresses = planning.load(ROOT, "dev")
    (name,) = [s.name for s in addresses.scale_sets if s.pool == "gpu"]
    f: Fleet = fleets("gpu", 1)
    assert f.scale_set.endswith(f"/{name}")
    env = {"AZURE_SUBSCRIPTION_ID": SUBSCRIPTION, "AZURE_ACCESS_TOKEN": TOKEN, "SUPERKUBE_ARM_URL": f.rm.url}
    args = [
        "image",
        "roll",
        "gpu",
        "-s",
        "dev",
        "--kubeconfig",
        str(api.kubeconfig),
        "--batch",
        "1",
        "-o",
        "json",
    ]
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["ok"] is True
    assert f.versions() == {f.names[0]: "1.1.0"}
    assert "pool gpu: 1 node on version 1.1.0, in 1 batch" in result.stderr
