"""Passive GPU health: on a fatal verdict, cordon the node and evict its pods, saying why.

Runs on every GPU node (a DaemonSet of the in-cluster layer, on the host network). Each round it
reads the node's GPUs through the probe (`gpu_probe`: NVML, the thresholds in src/superkube/data/gpu_health.yaml)
and acts on the verdict:
- fatal: cordon the node (`spec.unschedulable`) with the reason in the annotation
  `superkube.io/health-cordoned`, then evict its pods through the Eviction API, so
  PodDisruptionBudgets hold (a 429 leaves the pod for the next round); pods are never deleted, and
  DaemonSet and mirror pods stay. Each action is also an Event on the node.
- warning: an Event on the node, once per distinct set of reasons.
- healthy: nothing; a cordoned node comes back only by hand.
A failed periodic GPU test (the annotation `superkube.io/gpu-test-result` that superkube.agents.gpu_test
writes) is one more fatal finding: the tests record, this agent acts.
A node still behind the preflight taint is the preflight agent's: this one leaves it alone.

The circuit breaker: before cordoning, the agent counts the nodes of its pool this agent has
cordoned, among those past preflight (new nodes of an autoscaler burst look unhealthy before their
driver is ready, and must not trip it). If cordoning this node would take the share past
`--max-cordoned-share`, it does not act: it logs, sends a Warning Event and exports
`superkube_health_breaker_open{pool} 1` (alert HealthAgentBreakerOpen) until a person looks.

`--dry-run` logs each action instead of sending it. When the API server cannot be reached the agent
backs off (doubling to `--max-backoff`) and keeps serving its metrics, with
`superkube_health_api_up 0`.

Run: python -m superkube.agents.node_health --node NODE --pool POOL --vm-size SIZE --expected-gpus N
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from superkube.agents import gpu_probe, gpu_test
from superkube.agents.kubeapi import (
    MAX_MESSAGE,
    Kube,
    PodRef,
    agent_parser,
    check_agent_args,
    event,
    now,
    run_agent,
    stamp,
)
from superkube.cluster.kube import NODE_AGENTS_METRICS_PORT
from superkube.model.spec import PREFLIGHT_TAINT_KEY

COMPONENT = "superkube-node-health"
ANNOTATION = "superkube.io/health-cordoned"  # the reason; marks the nodes this agent cordoned
ANNOTATION_AT = "superkube.io/health-cordoned-at"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"

log = logging.getLogger(COMPONENT)


# --- what the agent decides --------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What to do this round. `events` are (type, reason, message)."""

    cordon: str = ""  # the reason, when the node is to be cordoned
    evict: tuple[PodRef, ...] = ()
    events: tuple[tuple[str, str, str], ...] = ()
    breaker_open: bool = False
    cordoned_share: float = 0.0  # this pool's share cordoned by the agent, once this decision is done


def _taints(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((node.get("spec") or {}).get("taints") or [])


def in_preflight(node: Mapping[str, Any]) -> bool:
    return any(t.get("key") == PREFLIGHT_TAINT_KEY for t in _taints(node))


def cordoned_by_us(node: Mapping[str, Any]) -> bool:
    """Cordoned now, and by this agent: its annotation alone is history (the recovery uncordons and
    may leave it), so a repaired node neither holds the breaker open nor escapes a second cordon."""
    annotated = ANNOTATION in ((node.get("metadata") or {}).get("annotations") or {})
    return annotated and bool((node.get("spec") or {}).get("unschedulable"))


def evictable(pods: Iterable[Mapping[str, Any]]) -> tuple[PodRef, ...]:
    """The pods a drain moves: not DaemonSet pods (they come back), not mirror pods (the kubelet's
    own), not pods that have finished."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        owners = meta.get("ownerReferences") or []
        if any(o.get("kind") == "DaemonSet" for o in owners):
            continue
        if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        out.append(PodRef(meta.get("namespace", "default"), meta["name"]))
    return tuple(sorted(out, key=lambda p: (p.namespace, p.name)))


def _summary(verdict: gpu_probe.Verdict, level: str) -> str:
    reasons = [str(f) for f in verdict.findings if f.level == level]
    return "; ".join(reasons)[:MAX_MESSAGE]


def decide(
    verdict: gpu_probe.Verdict,
    node: Mapping[str, Any],
    pool_nodes: list[Mapping[str, Any]],
    pods: list[Mapping[str, Any]],
    max_cordoned_share: float,
    warned: str = "",
) -> Decision:
    """This round's actions for `node`, from its verdict, its pool's nodes and its pods. `warned` is
    the warning already sent as an Event (sent once per distinct set of reasons)."""
    eligible = [n for n in pool_nodes if not in_preflight(n)]
    cordoned = sum(1 for n in eligible if cordoned_by_us(n))
    share = cordoned / len(eligible) if eligible else 0.0
    if verdict.level == "warning":
        summary = _summary(verdict, "warning")
        events = (("Warning", "GPUHealthWarning", summary),) if summary != warned else ()
        return Decision(events=events, cordoned_share=share)
    if verdict.level != "fatal" or in_preflight(node):
        return Decision(cordoned_share=share)
    if cordoned_by_us(node):
        # cordoned in an earlier round: move what is left (pods a PodDisruptionBudget held back)
        return Decision(evict=evictable(pods), cordoned_share=share)
    after = (cordoned + 1) / len(eligible) if eligible else 1.0
    if after > max_cordoned_share:
        message = (
            f"not cordoning: {cordoned + 1} of {len(eligible)} nodes past preflight in this pool would be "
            f"cordoned by the health agent ({after:.0%} > {max_cordoned_share:.0%}); fatal: "
            f"{_summary(verdict, 'fatal')}"
        )[:MAX_MESSAGE]
        return Decision(
            events=(("Warning", "HealthBreakerOpen", message),), breaker_open=True, cordoned_share=share
        )
    reason = _summary(verdict, "fatal")
    pods_out = evictable(pods)
    cordon_events: list[tuple[str, str, str]] = [
        ("Warning", "GPUHealthCordon", f"cordoned: {reason}"[:MAX_MESSAGE])
    ]
    cordon_events += [("Normal", "GPUHealthEvict", f"evicting {p.namespace}/{p.name}") for p in pods_out]
    return Decision(cordon=reason, evict=pods_out, events=tuple(cordon_events), cordoned_share=after)


def with_periodic_test(verdict: gpu_probe.Verdict, failed_test: str | None) -> gpu_probe.Verdict:
    """The probe's verdict with a failed periodic GPU test (the node's annotation) as one more fatal
    finding: the test records, this agent takes the node out, behind the same breaker."""
    if failed_test is None:
        return verdict
    finding = gpu_probe.Finding("fatal", None, f"periodic GPU test {failed_test}")
    return gpu_probe.Verdict(verdict.node, "fatal", [*verdict.findings, finding])


# --- what goes to the API server (each body is checked against the official schema in tests) ----


def cordon_patch(reason: str, at: datetime) -> dict[str, Any]:
    """A merge patch of the node: unschedulable, with the reason and the time."""
    return {
        "metadata": {"annotations": {ANNOTATION: reason[:MAX_MESSAGE], ANNOTATION_AT: stamp(at)}},
        "spec": {"unschedulable": True},
    }


# --- the agent ----------------------------------------------------------------------------------


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.checks = Counter("superkube_health_checks", "Probe rounds by verdict.", ["result"], registry=r)
        self.actions = Counter(
            "superkube_health_actions",
            "Actions taken (or logged, in dry-run).",
            ["action", "dry_run"],
            registry=r,
        )
        self.breaker = Gauge(
            "superkube_health_breaker_open",
            "1 while the breaker keeps the agent from cordoning.",
            ["pool"],
            registry=r,
        )
        self.cordoned = Gauge(
            "superkube_health_cordoned_nodes",
            "1 while this agent's node is cordoned by the health agent (sum by pool: the pool's count).",
            ["pool"],
            registry=r,
        )
        self.api_up = Gauge(
            "superkube_health_api_up", "1 when the last round reached the API server.", registry=r
        )
        self.gpu_test_failed = Gauge(
            "superkube_health_gpu_test_failed",
            "1 while this agent's node carries a failed periodic GPU test (sum by pool: the pool's count).",
            ["pool"],
            registry=r,
        )


@dataclass
class Agent:
    node: str
    pool: str
    probe: Callable[[], gpu_probe.Verdict]
    kube: Any  # Kube, or anything with its methods
    max_cordoned_share: float
    dry_run: bool = False
    metrics: Metrics = field(default_factory=Metrics)
    warned: str = ""

    def round(self) -> Decision:
        verdict = self.probe()  # probed (and counted) even while the API server is away
        self.metrics.checks.labels(verdict.level).inc()
        node = self.kube.node(self.node)
        test = gpu_test.failed(node)
        self.metrics.gpu_test_failed.labels(self.pool).set(1 if test else 0)
        verdict = with_periodic_test(verdict, test)
        # The pool is read only when this round may cordon (a fatal verdict on a node past preflight
        # that is not cordoned yet): every agent listing its whole pool every round would be
        # thousands of whole-pool lists a minute for the API servers at 7,500 nodes.
        may_cordon = verdict.level == "fatal" and not in_preflight(node) and not cordoned_by_us(node)
        pool = self.kube.pool_nodes(self.pool) if may_cordon else []
        pods = self.kube.pods_on(self.node) if verdict.level == "fatal" else []
        decision = decide(verdict, node, pool, pods, self.max_cordoned_share, self.warned)
        self.metrics.api_up.set(1)
        self.metrics.breaker.labels(self.pool).set(1 if decision.breaker_open else 0)
        self.act(node, decision)
        # this node only: summed by pool, the agents' gauges count the pool's cordoned nodes once each
        mine = cordoned_by_us(node) or bool(decision.cordon and not self.dry_run)
        self.metrics.cordoned.labels(self.pool).set(1 if mine else 0)
        if verdict.level == "warning":
            self.warned = _summary(verdict, "warning")
        return decision

    def _do(self, action: str, what: str, call: Callable[[], Any]) -> Any:
        self.metrics.actions.labels(action, str(self.dry_run).lower()).inc()
        if self.dry_run:
            log.warning("dry-run: would %s", what)
            return True
        log.warning("%s", what)
        return call()

    def act(self, node: Mapping[str, Any], decision: Decision) -> None:
        at = now()
        if decision.breaker_open:
            log.error("breaker open on pool %s: %s", self.pool, decision.events[0][2])
        if decision.cordon:
            body = cordon_patch(decision.cordon, at)
            self._do(
                "cordon",
                f"cordon {self.node}: {decision.cordon}",
                lambda: self.kube.patch_node(self.node, body),
            )
        for pod in decision.evict:
            moving = self._do(
                "evict", f"evict {pod.namespace}/{pod.name}", functools.partial(self.kube.evict, pod)
            )
            if not moving:
                self.metrics.actions.labels("evict_blocked", "false").inc()
                log.warning(
                    "a PodDisruptionBudget holds %s/%s; trying again next round", pod.namespace, pod.name
                )
        for type_, reason, message in decision.events:
            body = event(node, COMPONENT, type_, reason, message, at)
            self._do(
                "event", f"event {reason} on {self.node}", functools.partial(self.kube.create_event, body)
            )


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = agent_parser("node_health", __doc__.splitlines()[0], NODE_AGENTS_METRICS_PORT)
    p.add_argument("--pool", default=os.environ.get("NODE_POOL", ""), help="this node's pool (env NODE_POOL)")
    p.add_argument("--max-cordoned-share", type=float, default=0.05)
    args = p.parse_args(argv)
    check_agent_args(p, args)
    if not args.pool:
        p.error("--pool is required (or NODE_POOL)")
    if not 0 < args.max_cordoned_share <= 1:
        p.error(f"--max-cordoned-share must be in (0, 1]; got {args.max_cordoned_share}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    metrics = Metrics()

    def make_round(probe: Callable[[], gpu_probe.Verdict], kube: Kube) -> Callable[[], bool]:
        agent = Agent(args.node, args.pool, probe, kube, args.max_cordoned_share, args.dry_run, metrics)

        def one_round() -> bool:
            agent.round()
            return False  # the health agent watches for as long as its node runs

        return one_round

    return run_agent(COMPONENT, log, args, metrics, make_round)


if __name__ == "__main__":
    sys.exit(main())
