"""kwok, built from its Go module at the pinned version, plays the kubelets of simulated GPU nodes on
the real API server: they turn Ready and renew their Leases, run the pods bound to them, and a
cordon and eviction by the health controller end there as on a real node (the pod is gone)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from superkube.agents import kubeapi
from superkube.agents import node_health as nh
from superkube.harness import kwok as kwok_lab
from superkube.harness.apiserver import LocalApi
from tests.agents.conftest import admin, make_pod, namespace, unique
from tests.agents.test_real_api import controller

GPU_CAPACITY = {"cpu": "96", "memory": "1900Gi", "nvidia.com/gpu": "8", "pods": "110"}


@pytest.fixture(scope="module")
def kwok(api: LocalApi, tmp_path_factory: pytest.TempPathFactory) -> Iterator[kwok_lab.Kwok]:
    with kwok_lab.running(api.kubeconfig, tmp_path_factory.mktemp("kwok")) as running:
        yield running


def until(check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def fake_nodes(api: LocalApi, pool: str, count: int) -> list[str]:
    core = admin(api)
    names = [f"{pool}-{i:02d}" for i in range(count)]
    for i, name in enumerate(names):
        labels = {"superkube.io/pool": pool, "nvidia.com/gpu.count": "8"}  # in service: past preflight
        body, status = kwok_lab.node(name, labels, GPU_CAPACITY, address=f"10.9.0.{i + 4}")
        core.create_node(body)
        core.patch_node_status(name, status)
    return names


def ready(api: LocalApi, name: str) -> bool:
    conditions = admin(api).read_node(name).status.conditions or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def test_kwok_nodes_turn_ready_keep_their_capacity_and_renew_their_leases(
    api: LocalApi, kwok: kwok_lab.Kwok
) -> None:
    names = fake_nodes(api, unique("kwok"), 10)
    until(lambda: all(ready(api, n) for n in names))
    node = admin(api).read_node(names[3])
    assert node.status.capacity["nvidia.com/gpu"] == "8" and node.status.allocatable["pods"] == "110"
    assert node.status.addresses[0].address == "10.9.0.7"
    from kubernetes import client

    leases = client.CoordinationV1Api(admin(api).api_client)
    lease = until(lambda: _lease(leases, names[3]))
    assert lease.spec.holder_identity  # kwok's own identity (a kubelet's would be its node's name)
    assert lease.spec.lease_duration_seconds == kwok_lab.LEASE_DURATION_S
    first = lease.spec.renew_time
    renewed = until(lambda: _renewed(leases, names[3], first), timeout=kwok_lab.LEASE_DURATION_S)
    assert renewed > first  # renewed as a kubelet renews: a quarter of the lease's duration later
    assert kwok.alive()


def _lease(leases: Any, name: str) -> Any:
    from kubernetes.client.exceptions import ApiException

    try:
        return leases.read_namespaced_lease(name, "kube-node-lease")
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def _renewed(leases: Any, name: str, before: Any) -> Any:
    now = leases.read_namespaced_lease(name, "kube-node-lease").spec.renew_time
    return now if now > before else None


def test_a_pod_on_a_kwok_node_runs_and_the_health_controllers_eviction_removes_it(
    api: LocalApi, kwok: kwok_lab.Kwok
) -> None:
    pool = unique("kwokpool")
    names = fake_nodes(api, pool, 20)
    until(lambda: all(ready(api, n) for n in names))
    ns = namespace(api, unique("trainers"))
    make_pod(api, ns, "trainer-0", names[0])
    make_pod(api, ns, "trainer-1", names[1])
    core = admin(api)
    running = until(lambda: (p := core.read_namespaced_pod("trainer-0", ns)).status.phase == "Running" and p)
    assert running.status.pod_ip and running.status.host_ip == "10.9.0.4"
    # the node's agent reports a fatal reading; the controller cordons and evicts; kwok, as the
    # kubelet, stops the pod and it is gone
    core.patch_node(
        names[0], nh.report_patch("fatal: GPU 3: Xid 79: GPU has fallen off the bus", kubeapi.now())
    )
    decision = controller(api, pool).round()[names[0]]
    assert decision.cordon and [p.name for p in decision.evict] == ["trainer-0"]
    assert core.read_node(names[0]).spec.unschedulable is True
    until(lambda: [p.metadata.name for p in core.list_namespaced_pod(ns).items] == ["trainer-1"], timeout=30)
    assert core.read_namespaced_pod("trainer-1", ns).status.phase == "Running"  # the healthy node's stays
