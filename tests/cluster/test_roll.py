"""The roll's decisions (superkube.cluster.roll): what a batch is, when a replaced node is in service,
when the roll stops and what it leaves alone. The lab rolls a real pool (tests/lab/test_upgrading_nodes);
here the pool is a ledger of what the roll asked for, so that every stop can be seen and counted."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from superkube.cluster import roll
from superkube.model.spec import PREFLIGHT_RESULT_ANNOTATION, PREFLIGHT_TAINT_KEY


def node(
    name: str,
    ready: bool = True,
    taints: Sequence[str] = (),
    result: str | None = None,
    cordoned: bool = False,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "annotations": {PREFLIGHT_RESULT_ANNOTATION: result} if result else {},
        },
        "spec": {
            "taints": [{"key": k, "effect": "NoSchedule"} for k in taints],
            **({"unschedulable": True} if cordoned else {}),
        },
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


class Ledger:
    """A pool whose replaced nodes come up as `after` says (name -> the Node each reading returns, in
    turn; the last one stays); it records every drain, uncordon and replace."""

    name = "gpu"

    def __init__(self, versions: Mapping[str, str], after: Mapping[str, list[dict[str, Any] | None]],
                 refuse_drain: str | None = None) -> None:  # fmt: skip
        self.versions = dict(versions)
        self.after = {k: list(v) for k, v in after.items()}
        self.current: dict[str, dict[str, Any] | None] = {n: node(n) for n in versions}
        self.refuse_drain = refuse_drain
        self.refuse_cordon: str | None = None
        self.unreadable = 0  # the next readings of the Nodes that fail
        self.log: list[tuple[str, str]] = []

    def members(self) -> list[roll.Member]:
        return [roll.Member(n, v) for n, v in self.versions.items()]

    def nodes(self) -> Mapping[str, Mapping[str, Any]]:
        if self.unreadable:
            self.unreadable -= 1
            raise roll.RollError("cannot list the Nodes: connection refused")
        for name, queue in self.after.items():
            if name in self.replaced and len(queue) > 1:
                self.current[name] = queue.pop(0)
            elif name in self.replaced:
                self.current[name] = queue[0]
        return {n: v for n, v in self.current.items() if v is not None}

    @property
    def replaced(self) -> set[str]:
        return {n for op, n in self.log if op == "replace"}

    def cordon(self, name: str) -> None:
        if name == self.refuse_cordon:
            raise roll.RollError("Unauthorized")
        self.log.append(("cordon", name))
        self.current[name]["spec"]["unschedulable"] = True  # type: ignore[index]

    def drain(self, name: str) -> None:
        if name == self.refuse_drain:
            raise roll.RollError("Cannot evict pod as it would violate the pod's disruption budget")
        self.log.append(("drain", name))

    def uncordon(self, name: str) -> None:
        self.log.append(("uncordon", name))
        self.current[name]["spec"].pop("unschedulable", None)  # type: ignore[index]

    def replace(self, names: Sequence[str], version: str) -> None:
        for n in names:
            self.log.append(("replace", n))
            self.versions[n] = version
            self.current[n] = None  # its Node is deleted; the new kubelet registers it again


def run(pool: Ledger, size: int = 2, timeout_s: float = 60) -> roll.RollReport:
    ticks = iter(range(10_000))
    return roll.roll(pool, "2", size, timeout_s, clock=lambda: float(next(ticks)), sleep=lambda s: None)


def test_a_node_is_in_service_only_when_ready_uncordoned_and_past_preflight() -> None:
    assert roll.verdict(None) == (roll.WAITING, "not registered")
    assert roll.verdict(node("a", ready=False))[0] == roll.WAITING
    assert roll.verdict(node("a", taints=[PREFLIGHT_TAINT_KEY])) == (roll.WAITING, "Ready, behind preflight")
    assert roll.verdict(node("a", taints=["node.kubernetes.io/not-ready"]))[0] == roll.WAITING
    assert roll.verdict(node("a", cordoned=True))[0] == roll.WAITING
    assert roll.verdict(node("a", taints=["superkube.io/team"])) == (roll.PASSED, "schedulable")
    failed = node("a", taints=[PREFLIGHT_TAINT_KEY], result="failed 2026-11-27T12:00:00Z: 7 of 8 GPUs")
    assert roll.verdict(failed) == (roll.FAILED, "preflight failed 2026-11-27T12:00:00Z: 7 of 8 GPUs")


def test_batches_take_what_is_old_failed_or_never_registered_in_the_pools_order() -> None:
    members = [roll.Member(n, v) for n, v in (("a", "1"), ("b", "2"), ("c", "base"), ("d", "2"), ("e", "1"),
                                              ("f", "2"), ("g", "2"), ("h", "2"))]  # fmt: skip
    nodes = {"a": node("a"), "b": node("b"), "c": node("c"), "e": node("e"),
             "d": node("d", taints=[PREFLIGHT_TAINT_KEY], result="failed x: GPU"),
             "f": node("f", taints=[PREFLIGHT_TAINT_KEY]),  # on the version, still in preflight: its own
             "g": node("g", cordoned=True)}  # fmt: skip  # on the version, cordoned by someone: theirs
    # h is on the version and never registered: replaced
    assert roll.batches(members, "2", nodes, 2) == [["a", "c"], ["d", "e"], ["h"]]
    assert roll.batches(members, "2", nodes, 3) == [["a", "c", "d"], ["e", "h"]]
    assert roll.batches([roll.Member("b", "2")], "2", nodes, 2) == []
    with pytest.raises(ValueError, match="batch size 0"):
        roll.batches(members, "2", nodes, 0)


def test_each_batch_is_drained_replaced_and_in_service_before_the_next_starts() -> None:
    pool = Ledger(
        {n: "1" for n in "abcde"},
        {n: [None, node(n, taints=[PREFLIGHT_TAINT_KEY]), node(n)] for n in "abcde"},
    )
    report = run(pool)
    assert report.ok and report.stopped_at is None
    assert [b.nodes for b in report.batches] == [["a", "b"], ["c", "d"], ["e"]]
    assert pool.log == [
        ("cordon", "a"), ("cordon", "b"), ("drain", "a"), ("drain", "b"), ("replace", "a"), ("replace", "b"),
        ("cordon", "c"), ("cordon", "d"), ("drain", "c"), ("drain", "d"), ("replace", "c"), ("replace", "d"),
        ("cordon", "e"), ("drain", "e"), ("replace", "e"),
    ]  # fmt: skip
    assert report.summary() == "pool gpu: 5 nodes on version 2, in 3 batches"


def test_a_node_failing_preflight_stops_the_roll_and_later_batches_keep_their_version() -> None:
    bad = node("c", taints=[PREFLIGHT_TAINT_KEY], result="failed t: GPUs a Standard_ND96isr_H100_v5 has")
    pool = Ledger({n: "1" for n in "abcde"}, {**{n: [node(n)] for n in "abde"}, "c": [None, bad]})
    report = run(pool)
    assert not report.ok and report.stopped_at == 2
    assert [b.state for b in report.batches] == [roll.PASSED, roll.FAILED, roll.WAITING]
    assert report.batches[1].why == {"c": "preflight failed t: GPUs a Standard_ND96isr_H100_v5 has"}
    assert pool.versions == {"a": "2", "b": "2", "c": "2", "d": "2", "e": "1"}
    assert ("drain", "e") not in pool.log
    assert "stopped at batch 2 of 3" in report.summary() and "not rolled: e" in report.summary()
    # rolled again once the cause is fixed: the failed node and the rest, nothing else
    pool.after["c"] = [node("c")]
    pool.log.clear()
    again = run(pool)
    assert again.ok and [b.nodes for b in again.batches] == [["c", "e"]]


def test_a_batch_not_in_service_in_time_stops_the_roll() -> None:
    pool = Ledger({n: "1" for n in "abcd"}, {n: [node(n, taints=[PREFLIGHT_TAINT_KEY])] for n in "abcd"})
    report = run(pool, timeout_s=30)
    assert report.stopped_at == 1
    assert report.batches[0].why == {
        "a": "Ready, behind preflight at the batch's time-out",
        "b": "Ready, behind preflight at the batch's time-out",
    }
    assert pool.replaced == {"a", "b"}


def test_a_drain_a_disruption_budget_refuses_stops_before_anything_is_replaced() -> None:
    pool = Ledger({n: "1" for n in "abcd"}, {n: [node(n)] for n in "abcd"}, refuse_drain="d")
    report = run(pool)
    assert report.stopped_at == 2
    assert report.batches[1].why == {
        "d": "drain: Cannot evict pod as it would violate the pod's disruption budget"
    }
    # c was drained before d refused: both are put back in service, and neither is replaced
    assert pool.log[-5:] == [
        ("cordon", "c"),
        ("cordon", "d"),
        ("drain", "c"),
        ("uncordon", "c"),
        ("uncordon", "d"),
    ]
    assert pool.replaced == {"a", "b"}


def test_a_node_someone_else_cordoned_stays_cordoned_when_a_drain_stops_the_roll() -> None:
    pool = Ledger({n: "1" for n in "abcd"}, {n: [node(n)] for n in "abcd"}, refuse_drain="d")
    pool.current["c"] = node("c", cordoned=True)  # the health controller cordoned it: a bad GPU
    report = run(pool)
    assert report.stopped_at == 2
    assert ("cordon", "c") not in pool.log and ("uncordon", "c") not in pool.log
    assert pool.log[-3:] == [("cordon", "d"), ("drain", "c"), ("uncordon", "d")]
    assert roll.cordoned(pool.nodes()["c"]) and not roll.cordoned(pool.nodes()["d"])


def test_a_refused_cordon_is_reported_against_its_own_node() -> None:
    pool = Ledger({n: "1" for n in "ab"}, {n: [node(n)] for n in "ab"})
    pool.refuse_cordon = "b"
    report = run(pool)
    assert report.batches[0].why == {"b": "cordon: Unauthorized"}
    assert pool.log == [("cordon", "a"), ("uncordon", "a")]


def test_no_roll_without_the_nodes_and_a_moment_without_them_is_waited_out() -> None:
    pool = Ledger({n: "1" for n in "ab"}, {n: [node(n)] for n in "ab"})
    pool.unreadable = 1
    with pytest.raises(roll.RollError, match="cannot list the Nodes"):
        run(pool)  # planned blind, every instance would look never registered
    assert pool.log == []
    pool.current = {}
    with pytest.raises(roll.RollError, match="lists no Node at all"):
        run(pool)
    again = Ledger({n: "1" for n in "ab"}, {n: [None, node(n)] for n in "ab"})
    ticks = iter(range(10_000))
    readings = iter([False, False, True, True] + [False] * 100)  # the gate's 1st and 2nd reads fail

    def flaky() -> Mapping[str, Mapping[str, Any]]:
        if next(readings):
            raise roll.RollError("cannot list the Nodes: timeout")
        return Ledger.nodes(again)

    again.nodes = flaky  # type: ignore[method-assign]
    report = roll.roll(again, "2", 2, 60, clock=lambda: float(next(ticks)), sleep=lambda s: None)
    assert report.ok
