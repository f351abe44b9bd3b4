"""Rolling a node pool onto a new node image, in health-gated batches.

The pools' scale sets take a new image version with a Manual upgrade policy: the model changes,
no running instance does. A roll then replaces the pool's instances a batch at a time:

1. the batch's nodes are cordoned, then each is drained (evictions, so PodDisruptionBudgets hold: a
   drain that cannot finish stops the roll, and the batch's nodes are uncordoned, nothing replaced);
2. its instance is replaced from the new version (deleted and made again from the model);
3. the next batch starts only when every replaced node is Ready and past preflight (schedulable);
   a node whose preflight fails, or that is not schedulable in time, stops the roll there. The
   failed nodes stay behind their taint, and every later batch keeps its old version: a bad image
   or a bad batch of hardware costs one batch, never the pool.

A second roll picks up where one stopped: it replaces what is not yet on the version, and what a
stopped roll left failed.
What a platform does (drain, replace, read Nodes) is a `Pool`; this module decides only what to
replace when, and when to stop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from superkube.model.spec import PREFLIGHT_RESULT_ANNOTATION, PREFLIGHT_TAINT_KEY
from superkube.model.words import plural

NOT_READY_TAINTS = ("node.kubernetes.io/",)  # the kubelet's and node lifecycle's own condition taints
PASSED, FAILED, WAITING = "passed", "failed", "waiting"


class RollError(Exception):
    """A step the pool could not take (a drain that did not end, an instance not made); one line."""


@dataclass(frozen=True)
class Member:
    """An instance of the pool and the image version it booted from."""

    name: str
    version: str


class Pool(Protocol):
    """What a platform does for a roll: the lab's hosts, or a scale set's instances."""

    name: str

    def members(self) -> list[Member]: ...

    def nodes(self) -> Mapping[str, Mapping[str, Any]]:
        """The Nodes by name, as the API server has them now; RollError when it cannot be read (an
        empty answer would look like a pool of instances whose nodes never registered)."""
        ...

    def cordon(self, name: str) -> None: ...

    def drain(self, name: str) -> None:
        """Evict the node's pods (PodDisruptionBudgets respected); RollError when it cannot."""
        ...

    def uncordon(self, name: str) -> None: ...

    def replace(self, names: Sequence[str], version: str) -> None:
        """Delete the instances and their Nodes, and make them again from `version`."""
        ...


def is_ready(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def schedulable(node: Mapping[str, Any]) -> bool:
    """Ready, not cordoned, and no taint that keeps every pod off: past preflight, no condition taint."""
    taints = (node.get("spec") or {}).get("taints") or []
    held = [t for t in taints if t["key"] == PREFLIGHT_TAINT_KEY or t["key"].startswith(NOT_READY_TAINTS)]
    return is_ready(node) and not (node.get("spec") or {}).get("unschedulable") and not held


def verdict(node: Mapping[str, Any] | None) -> tuple[str, str]:
    """A replaced node's state for the gate: PASSED (schedulable), FAILED (preflight said so, with
    its words) or WAITING (not registered, not Ready, or preflight still running)."""
    if node is None:
        return WAITING, "not registered"
    result = str(((node.get("metadata") or {}).get("annotations") or {}).get(PREFLIGHT_RESULT_ANNOTATION, ""))
    if result.startswith(FAILED):
        return FAILED, f"preflight {result}"
    if schedulable(node):
        return PASSED, "schedulable"
    return WAITING, "Ready, behind preflight" if is_ready(node) else "not Ready"


def batches(
    members: Sequence[Member], version: str, nodes: Mapping[str, Mapping[str, Any]], size: int
) -> list[list[str]]:
    """The roll's batches, in the pool's order, `size` at a time: every member not on `version`, and
    every member on it whose preflight failed (a node a stopped roll left behind its taint) or whose
    node never registered. A node on the version that is still in preflight, or that someone
    cordoned, is left to them."""
    if size < 1:
        raise ValueError(f"batch size {size}: give 1 or more")
    todo = [
        m.name
        for m in members
        if m.version != version or m.name not in nodes or verdict(nodes[m.name])[0] == FAILED
    ]
    return [todo[i : i + size] for i in range(0, len(todo), size)]


def cordoned(node: Mapping[str, Any] | None) -> bool:
    return bool(((node or {}).get("spec") or {}).get("unschedulable"))


@dataclass
class Batch:
    nodes: list[str]
    state: str = WAITING  # PASSED, FAILED, or WAITING for one never started
    seconds: float = 0.0
    why: dict[str, str] = field(default_factory=dict)  # a failed batch: node -> what failed


@dataclass
class RollReport:
    pool: str
    version: str
    batches: list[Batch]

    @property
    def ok(self) -> bool:
        return all(b.state == PASSED for b in self.batches)

    @property
    def stopped_at(self) -> int | None:
        """The 1-based number of the batch that stopped the roll (None: it did not stop)."""
        return next((i + 1 for i, b in enumerate(self.batches) if b.state == FAILED), None)

    def summary(self) -> str:
        if self.ok:
            replaced = sum(len(b.nodes) for b in self.batches)
            return (
                f"pool {self.pool}: {plural(replaced, 'node')} on version {self.version}, "
                f"in {plural(len(self.batches), 'batch', 'batches')}"
            )
        at = self.stopped_at or 0
        failed = self.batches[at - 1]
        why = "; ".join(f"{n}: {w}" for n, w in failed.why.items())
        left = [n for b in self.batches[at:] for n in b.nodes]
        return (
            f"pool {self.pool}: roll to version {self.version} stopped at batch {at} of {len(self.batches)} "
            f"({why}); not rolled: {', '.join(left) or 'none'}. Fix the cause and roll again: it "
            "replaces what is not yet on the version, and the nodes that failed"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "version": self.version,
            "ok": self.ok,
            "stopped_at": self.stopped_at,
            "batches": [
                {"nodes": b.nodes, "state": b.state, "seconds": round(b.seconds, 1), "why": b.why}
                for b in self.batches
            ],
        }


def roll(
    pool: Pool,
    version: str,
    size: int,
    timeout_s: float = 600,
    progress: Callable[[str], None] = lambda what: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> RollReport:
    """Roll `pool` onto `version`, `size` nodes at a time; stops at the first batch that fails."""
    members = pool.members()
    nodes = pool.nodes()
    if members and not nodes:
        raise RollError(f"pool {pool.name}: the API server lists no Node at all; not rolling blind")
    plan = batches(members, version, nodes, size)
    report = RollReport(pool.name, version, [Batch(list(b)) for b in plan])
    for i, batch in enumerate(report.batches, 1):
        started = clock()
        progress(f"batch {i} of {len(plan)}: {', '.join(batch.nodes)}")
        mine: list[str] = []
        step, acting = "read the Nodes", batch.nodes[0]
        try:
            # nodes someone else cordoned (the health controller, an operator) stay cordoned whatever happens
            now = pool.nodes()
            theirs = {n for n in batch.nodes if cordoned(now.get(n))}
            step = "cordon"
            for acting in batch.nodes:  # all first: an evicted pod must not land on the batch's next node
                if acting not in theirs:
                    pool.cordon(acting)
                    mine.append(acting)
            step = "drain"
            for acting in batch.nodes:
                pool.drain(acting)
                progress(f"{acting}: drained")
        except RollError as exc:
            batch.state, batch.why = FAILED, {acting: f"{step}: {exc}"}
            for back in mine:  # back in service, as they were: nothing of the batch is replaced
                try:
                    pool.uncordon(back)
                except RollError as again:
                    batch.why[back] = f"still cordoned: {again}"
            break
        try:
            pool.replace(batch.nodes, version)
        except RollError as exc:
            batch.state, batch.why = FAILED, {", ".join(batch.nodes): f"replace: {exc}"}
            break
        progress(f"batch {i}: replaced from version {version}; waiting for Ready and preflight")
        batch.state, batch.why = _gate(pool, batch.nodes, started + timeout_s, clock, sleep, progress)
        batch.seconds = clock() - started
        if batch.state != PASSED:
            break
        progress(f"batch {i}: in service after {batch.seconds:.0f} s")
    return report


def _gate(
    pool: Pool,
    names: Sequence[str],
    deadline: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    progress: Callable[[str], None],
) -> tuple[str, dict[str, str]]:
    """Wait until every node is in service (PASSED), or failed or time ran out for one (FAILED, with
    why). Once one fails the batch has failed, but the rest of it is still waited for (to the batch's
    time-out), so that the report says where each of its nodes ended."""
    seen: dict[str, str] = {}
    while True:
        try:
            nodes = pool.nodes()
        except RollError as exc:  # a moment the API server does not answer: not a verdict on the batch
            if clock() > deadline:
                return FAILED, {
                    n: f"no answer from the API server at the batch's time-out: {exc}" for n in names
                }
            sleep(1.0)
            continue
        states = {n: verdict(nodes.get(n)) for n in names}
        for name, (_, why) in states.items():
            if seen.get(name) != why:
                seen[name] = why
                progress(f"{name}: {why}")
        failed = {n: why for n, (state, why) in states.items() if state == FAILED}
        if all(state == PASSED for state, _ in states.values()):
            return PASSED, {}
        if failed and all(state != WAITING for state, _ in states.values()):
            return FAILED, failed
        if clock() > deadline:
            late = {
                n: f"{why} at the batch's time-out" for n, (state, why) in states.items() if state == WAITING
            }
            return FAILED, {**failed, **late}
        sleep(1.0)
