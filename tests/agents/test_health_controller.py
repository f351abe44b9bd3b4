"""The health controller's round on canned nodes (what the real server cannot be made to do on cue:
refuse one eviction, lose the lease mid-round); everything else of it runs against the real API
server in test_real_api.py."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from superkube.agents import health_controller as hc
from superkube.agents import kubeapi
from superkube.agents import node_health as nh
from tests.agents.test_node_health import node, pod, verdict_of


def reported(name: str, reading: str = "xid-79-off-the-bus") -> dict[str, Any]:
    n = node(name)
    n["metadata"]["annotations"][nh.VERDICT_ANNOTATION] = nh.note(verdict_of(reading, name))
    return hc.slim(n)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, as the server applies a merge patch (null removes a key)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def forbidden(message: str) -> ApiException:
    """A 403 as the API server answers it: a Status body saying why."""
    e = ApiException(status=403, reason="Forbidden")
    e.body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                         "reason": "Forbidden", "code": 403})  # fmt: skip
    return e


class Kube:
    """The controller's calls on canned nodes: patches applied as the server applies them, evictions
    named in `refuse` answered with the server's 403 (an admission policy's refusal)."""

    def __init__(self, pods: dict[str, list[dict[str, Any]]], refuse: frozenset[str] = frozenset()) -> None:
        self.pods, self.refuse = pods, refuse
        self.nodes: dict[str, dict[str, Any]] = {}
        self.patched: list[str] = []
        self.evicted: list[str] = []

    def patch_node(self, name: str, body: Any) -> None:
        assert isinstance(body, dict), "the controller sends merge patches"
        self.nodes[name] = merge_patch(self.nodes.get(name, node(name)), body)
        self.patched.append(name)

    def pods_on(self, name: str) -> list[dict[str, Any]]:
        return self.pods.get(name, [])

    def evict(self, ref: kubeapi.PodRef) -> bool:
        if ref.name in self.refuse:
            raise forbidden(f'pods "{ref.name}" is forbidden: ValidatingAdmissionPolicy denied request')
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
    assert all(kube.nodes[n]["spec"]["unschedulable"] is True for n in kube.patched)
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


def test_a_drained_node_is_marked_once_its_pods_are_gone_and_only_then() -> None:
    """The mark its agent waits for before it approves the VM's maintenance: every pod a drain
    moves gone, not merely evicted (a pod still terminating keeps the VM)."""
    kube = Kube({"gpu-01": [pod("trainer-0")]})
    nodes = fleet("gpu-01")
    kube.nodes = copy.deepcopy(nodes)  # patched from what the agent reported
    ctl = hc.Controller(kube, lambda: nodes, frozenset({"gpu"}), 0.05)
    ctl.round()  # cordoned, evicted
    assert (
        kube.evicted == ["trainer-0"] and nh.DRAINED_AT not in kube.nodes["gpu-01"]["metadata"]["annotations"]
    )
    nodes["gpu-01"] = hc.slim(kube.nodes["gpu-01"])
    ctl.round()  # the pod is still terminating
    assert kube.patched == ["gpu-01"] and nh.DRAINED_AT not in kube.nodes["gpu-01"]["metadata"]["annotations"]
    kube.pods["gpu-01"] = [pod("node-health-x", "superkube-system", owner="DaemonSet")]  # what stays
    ctl.round()
    marked = kube.nodes["gpu-01"]
    assert nh.drained(marked), marked["metadata"]["annotations"]
    nodes["gpu-01"] = hc.slim(marked)
    before = len(kube.patched)
    ctl.round()
    assert len(kube.patched) == before, "marked once"


def until_quiet(ctl: hc.Controller, kube: Kube, nodes: dict[str, dict[str, Any]], most: int = 6) -> None:
    """Rounds, each on the nodes as the last one left them, until a round patches nothing."""
    for _ in range(most):
        before = len(kube.patched)
        ctl.round()
        for name in kube.nodes:
            nodes[name] = hc.slim(kube.nodes[name])
        if len(kube.patched) == before:
            return
    raise AssertionError("the controller never settled")


@pytest.mark.parametrize(("reading", "reset"), [("xid-48-dbe", True), ("xid-79-off-the-bus", False)])
def test_a_drained_node_is_labelled_for_a_reset_only_when_a_reset_may_clear_it(
    reading: str, reset: bool
) -> None:
    from superkube.cluster import health

    kube = Kube({})
    nodes = fleet()
    nodes["gpu-01"] = reported("gpu-01", reading)
    kube.nodes = copy.deepcopy(nodes)
    ctl = hc.Controller(kube, lambda: nodes, frozenset({"gpu"}), 0.05)
    until_quiet(ctl, kube, nodes)
    meta = kube.nodes["gpu-01"]["metadata"]
    assert nh.drained(kube.nodes["gpu-01"])
    assert (meta["labels"].get(health.GPU_RESET_LABEL) == health.RESET_REQUESTED) is reset
    if reset:  # the reset failed: the label goes, and the node stays cordoned for remediation
        kube.nodes["gpu-01"]["metadata"]["annotations"][health.GPU_RESET] = (
            f"failed {kubeapi.stamp(kubeapi.now())}: x"
        )
        nodes["gpu-01"] = hc.slim(kube.nodes["gpu-01"])
        until_quiet(ctl, kube, nodes)
        after = kube.nodes["gpu-01"]
        assert health.GPU_RESET_LABEL not in after["metadata"]["labels"] and after["spec"]["unschedulable"]


def test_what_the_controller_remembers_of_a_node_goes_with_the_node() -> None:
    """The nodes the breaker holds and the cordons already warned about are kept only while the node
    is there, under the same cordon: a deleted node (its VM terminated) is forgotten."""
    kube = Kube({})
    nodes = fleet("gpu-01", "gpu-02", "gpu-03")
    ctl = hc.Controller(kube, lambda: nodes, frozenset({"gpu"}), 0.05)
    ctl.round()
    assert ctl.held == {"gpu-03"}  # 2 of 40 may be cordoned at 5 %: the third waits
    stamp = kube.nodes["gpu-01"]["metadata"]["annotations"][hc.ANNOTATION_AT]
    ctl.late = {("gpu-01", stamp), ("gpu-01", "an older cordon")}
    nodes.update({n: hc.slim(kube.nodes[n]) for n in ("gpu-01", "gpu-02")})  # as the round left them
    del nodes["gpu-03"]
    ctl.round()
    assert ctl.held == set() and ctl.late == {("gpu-01", stamp)}
    del nodes["gpu-01"]
    ctl.round()
    assert ctl.late == set()
