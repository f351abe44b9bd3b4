"""The health controller's round on canned nodes (what the real server cannot be made to do on cue:
refuse one eviction, lose the lease mid-round); everything else of it runs against the real API
server in test_real_api.py."""

from __future__ import annotations

from typing import Any

from kubernetes.client.exceptions import ApiException

from superkube.agents import health_controller as hc
from superkube.agents import kubeapi
from superkube.agents import node_health as nh
from tests.agents.test_node_health import node, pod, verdict_of


def reported(name: str, reading: str = "xid-79-off-the-bus") -> dict[str, Any]:
    n = node(name)
    n["metadata"]["annotations"][nh.VERDICT_ANNOTATION] = nh.note(verdict_of(reading, name))
    return hc.slim(n)


class Kube:
    def __init__(self, pods: dict[str, list[dict[str, Any]]], refuse: frozenset[str] = frozenset()) -> None:
        self.pods, self.refuse = pods, refuse
        self.patched: list[str] = []
        self.evicted: list[str] = []

    def patch_node(self, name: str, body: Any) -> None:
        self.patched.append(name)

    def pods_on(self, name: str) -> list[dict[str, Any]]:
        return self.pods.get(name, [])

    def evict(self, ref: kubeapi.PodRef) -> bool:
        if ref.name in self.refuse:
            raise ApiException(status=403, reason="Forbidden")
        self.evicted.append(ref.name)
        return True

    def create_event(self, body: Any) -> None:
        pass


def fleet(*bad: str) -> dict[str, dict[str, Any]]:
    nodes = {f"gpu-{i:02d}": hc.slim(node(f"gpu-{i:02d}")) for i in range(40)}
    nodes.update({name: reported(name) for name in bad})
    return nodes


def test_a_refused_eviction_leaves_the_node_draining_and_the_round_goes_on() -> None:
    kube = Kube(
        {"gpu-01": [pod("stuck"), pod("trainer-0")], "gpu-02": [pod("trainer-1")]},
        refuse=frozenset({"stuck"}),
    )
    nodes = fleet("gpu-01", "gpu-02")
    ctl = hc.Controller(kube, lambda: nodes, frozenset({"gpu"}), 0.05)
    decisions = ctl.round()
    assert kube.patched == ["gpu-01", "gpu-02"]  # the refusal on gpu-01 did not stop gpu-02
    assert kube.evicted == ["trainer-0", "trainer-1"]
    assert ctl.draining == {"gpu-01"} and decisions["gpu-01"].cordon


def test_pods_of_the_protected_namespaces_are_never_evicted() -> None:
    system = [pod("coredns", "kube-system"), pod("balloon", "superkube-system"), pod("trainer-0")]
    assert [p.name for p in nh.evictable(system)] == ["trainer-0"]


def test_a_controller_that_loses_its_lease_mid_round_stops_acting() -> None:
    kube = Kube({})
    nodes = fleet("gpu-01", "gpu-02")
    answers = iter([True, True, False])  # leads at the round's start and for the first node only
    ctl = hc.Controller(kube, lambda: nodes, frozenset({"gpu"}), 0.05, lead=lambda: next(answers))
    ctl.round()
    assert kube.patched == ["gpu-01"] and ctl.draining is None  # a new leader starts from the cluster
