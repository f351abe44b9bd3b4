"""The health controller: cordons and drains the nodes their own agents report fatal, behind a
breaker per pool. One leader (a Lease) acts; the other replica waits to take over.

Why a controller: the breaker is a fleet-wide fact (the share of a pool's nodes past preflight that
health has cordoned), and a DaemonSet that read its pool to know it would, in a burst of failures,
have hundreds of agents list thousands of nodes at once. The controller follows its pools' nodes with
one watch (`informer`: list once, then changes; relist only on 410 Gone), keeping a few fields of
each, so its requests grow with changes and failures, not with nodes x failures. The agents
(superkube.agents.node_health) only write their verdict on their own Node.

Each round (`--interval`, and at once after the watch brings a change) the leader, pool by pool:
- a node reported fatal (the annotation `superkube.io/health-verdict`), past preflight and not yet
  cordoned by health: cordon it (`spec.unschedulable`, the reason in `superkube.io/health-cordoned`)
  and evict its pods through the Eviction API (PodDisruptionBudgets hold: a 429 leaves the pod for
  a later round; DaemonSet and mirror pods stay; nothing is deleted), an Event for each action;
  unless that would take the pool's share cordoned by health past `--max-cordoned-share`: then the
  breaker holds it (a Warning Event on the node, once; `superkube_health_breaker_open{pool} 1`,
  alert HealthAgentBreakerOpen) until a person looks or the share falls;
- a node cordoned by health with pods a budget held back: evict again;
- a node cordoned by health whose pods a drain moves are all gone: mark it drained
  (`superkube.io/health-drained-at`), once; its agent then approves the maintenance Azure scheduled
  for its VM, so Azure need not wait for the event's NotBefore.
- a node cordoned by health and drained whose verdict ends with `health.RESET_HINT` (every fatal
  finding one a GPU reset may clear): label it for the reset (superkube.agents.gpu_reset), once per
  cordon; once the reset cleared it and its agent reports it no longer fatal, uncordon it; after a
  failed reset, take the label off (remediation then replaces the VM).
A node counts as cordoned by health while it is unschedulable and carries that annotation: a node
repaired and uncordoned by hand is history. Pods are listed only for the node being drained
(field selector `spec.nodeName`).

Maintenance (a node its agent reports `maintenance:`, Azure's scheduled event) is cordoned as its
own kind past the breaker, drained, and uncordoned once its agent reports neither maintenance nor a
failure since the cordon; the pods still on it as its NotBefore comes are named (PODS_LEFT_S).
docs/05-node-health.md says why.

What it may do is enforced in the cluster: the ValidatingAdmissionPolicies
`superkube-node-health-controller-nodes` (only nodes their agent reported fatal or maintenance,
cordoned for maintenance, or whose reset ended since the cordon; cordon, and uncordon only after a
reset cleared the node or its maintenance is over; its annotations; the reset label) and
`superkube-node-health-evictions` (workload namespaces only).

Metrics on port 9465: `superkube_health_cordoned_nodes{pool}` (for failures),
`superkube_health_breaker_open{pool}`, `superkube_health_maintenance_pods_left{pool}`,
`superkube_health_actions_total{action, dry_run}`, `superkube_health_leader`,
`superkube_health_controller_api_up`. The non-leader exports no pool figures.

Run: python -m superkube.agents.health_controller --pools gpu-a,gpu-b [--max-cordoned-share 0.05]
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from superkube.agents.informer import Informer
from superkube.agents.kubeapi import base_parser, connect, event, log_to_stderr, now, refused, serve, stamp
from superkube.agents.node_health import (
    ANNOTATION,
    ANNOTATION_AT,
    CORDON_KIND,
    DRAINED_AT,
    MAINTENANCE_AT,
    VERDICT_ANNOTATION,
    VERDICT_AT,
    Decision,
    cordon_kind,
    cordon_patch,
    cordoned_by_us,
    decide,
    drained,
    evictable,
    for_failure,
    in_preflight,
    reported,
)
from superkube.cluster import health
from superkube.cluster.cloudinit import POOL_LABEL
from superkube.cluster.kube import NODE_AGENTS_METRICS_PORT
from superkube.model.spec import PREFLIGHT_TAINT_KEY

COMPONENT = "superkube-node-health-controller"
LEASE = COMPONENT
log = logging.getLogger(COMPONENT)
_KEPT = (ANNOTATION, ANNOTATION_AT, VERDICT_ANNOTATION, VERDICT_AT, DRAINED_AT, health.GPU_RESET, CORDON_KIND,
         MAINTENANCE_AT)  # fmt: skip
PODS_LEFT_S = 300.0
"""From this long before a maintenance's NotBefore, the pods still on its node are named (an Event
once per cordon, and superkube_health_maintenance_pods_left{pool}): the event is not approved while
they are there, and Azure starts it at NotBefore with them on the node."""


def slim(node: Mapping[str, Any]) -> dict[str, Any]:
    """What the controller keeps of a Node: a few hundred bytes, not its ~13 KB."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    notes = meta.get("annotations") or {}
    return {
        "metadata": {
            "name": meta.get("name", ""),
            "uid": meta.get("uid", ""),
            "labels": {
                k: v
                for k, v in (meta.get("labels") or {}).items()
                if k in (POOL_LABEL, health.GPU_RESET_LABEL)
            },
            "annotations": {k: notes[k] for k in _KEPT if k in notes},
        },
        "spec": {
            "unschedulable": bool(spec.get("unschedulable")),
            "taints": [t for t in spec.get("taints") or [] if t.get("key") == PREFLIGHT_TAINT_KEY],
        },
    }


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.cordoned = Gauge(
            "superkube_health_cordoned_nodes",
            "Nodes of the pool cordoned by health for failures (what the breaker counts).",
            ["pool"],
            registry=r,
        )
        self.breaker = Gauge(
            "superkube_health_breaker_open",
            "1 while the breaker keeps health from cordoning in the pool.",
            ["pool"],
            registry=r,
        )
        self.actions = Counter(
            "superkube_health_actions",
            "Actions taken (or logged, in dry-run).",
            ["action", "dry_run"],
            registry=r,
        )
        self.pods_left = Gauge(
            "superkube_health_maintenance_pods_left",
            "Pods still on the pool's nodes whose scheduled maintenance starts within PODS_LEFT_S (or has "
            "started): the drain did not finish in time.",
            ["pool"],
            registry=r,
        )
        self.leader = Gauge("superkube_health_leader", "1 while this replica leads.", registry=r)
        self.api_up = Gauge(
            "superkube_health_controller_api_up", "1 when the last round reached the API server.", registry=r
        )


@dataclass
class Controller:
    kube: Any  # Kube, or anything with its methods
    nodes: Callable[[], dict[str, dict[str, Any]]]
    """its pools' nodes as last seen, slim (the watch; in tests anything that returns them)"""
    pools: frozenset[str]
    max_cordoned_share: float
    lead: Callable[[], bool] = lambda: True
    dry_run: bool = False
    metrics: Metrics = field(default_factory=Metrics)
    held: set[str] = field(default_factory=set)  # nodes the breaker holds, warned about once
    late: set[tuple[str, str]] = field(
        default_factory=set
    )  # (node, cordoned at) named before its maintenance
    clock: Callable[[], float] = lambda: now().timestamp()
    draining: set[str] | None = None  # cordoned nodes with pods left; None: not known yet (a new leader)

    def round(self) -> dict[str, Decision]:
        """One pass as the leader; what was decided, by node (nothing when not leading)."""
        if not self.lead():
            self.metrics.leader.set(0)
            self.metrics.cordoned.clear()
            self.metrics.breaker.clear()
            self.metrics.pods_left.clear()
            self.draining = None
            return {}
        self.metrics.leader.set(1)
        nodes = self.nodes()
        self.metrics.api_up.set(1)
        self._forget_gone(nodes)
        pools: dict[str, list[dict[str, Any]]] = {pool: [] for pool in self.pools}
        for node in nodes.values():
            pool = node["metadata"]["labels"].get(POOL_LABEL, "")
            if pool in pools:
                pools[pool].append(node)
        if self.draining is None:  # a new leader: any node health cordoned may still hold pods
            self.draining = {n["metadata"]["name"] for ns in pools.values() for n in ns if cordoned_by_us(n)}
        done: dict[str, Decision] = {}
        for pool, members in sorted(pools.items()):
            done.update(self._pool(pool, sorted(members, key=lambda n: n["metadata"]["name"])))
        return done

    def _forget_gone(self, nodes: Mapping[str, Mapping[str, Any]]) -> None:
        """What the controller remembers of a node, only while the node is there as remembered: a
        node deleted (its VM terminated or replaced) or cordoned again is forgotten, so a long-lived
        leader holds nothing for nodes long gone, and a new cordon is warned about anew."""
        self.held &= set(nodes)
        self.late = {
            (name, at)
            for name, at in self.late
            if name in nodes
            and (nodes[name]["metadata"].get("annotations") or {}).get(ANNOTATION_AT, "") == at
        }

    def _pool(self, pool: str, members: list[dict[str, Any]]) -> dict[str, Decision]:
        assert self.draining is not None
        done: dict[str, Decision] = {}
        open_ = False
        pods_left = 0
        for i, node in enumerate(members):
            name = node["metadata"]["name"]
            verdict = reported(node)
            ours = cordoned_by_us(node)
            maintenance = ours and cordon_kind(node) == health.MAINTENANCE
            if ours and not maintenance and self._reset(node):  # a reset is a failure's, never maintenance's
                continue
            if maintenance and self._maintenance_over(node, verdict):
                continue
            if maintenance and not drained(node):
                pods_left += self._maintenance_due(node)
            if verdict is None or verdict.level not in ("fatal", "maintenance") or in_preflight(node):
                self.held.discard(name)
                continue
            converting = maintenance and verdict.level == "fatal"  # failed while cordoned for maintenance
            if ours and name not in self.draining and not converting:
                if not drained(node):  # evicted in an earlier round: mark it once its pods are gone
                    self._mark_drained(node)
                continue
            decision = decide(verdict, node, members, [], self.max_cordoned_share)
            if decision.cordon or ours:  # only now are its pods worth a list
                decision = decide(verdict, node, members, self.kube.pods_on(name), self.max_cordoned_share)
            if decision.breaker_open:
                open_ = True
                if name in self.held:
                    continue  # warned already
                self.held.add(name)
            else:
                self.held.discard(name)
            if not self.lead():  # a long round must not outlive the lease: another may lead by now
                log.warning("lost the lease mid-round; stopping")
                self.draining = None
                return done
            try:
                self._act(node, decision)
            except Exception as exc:  # a refusal is this node's (a person's cordon, a fence): the rest go on
                answer = refused(exc)
                if not answer:
                    raise  # the API server is away: the round backs off
                self.metrics.actions.labels("refused", "false").inc()
                log.error("the API server refused a change to %s: %s", name, answer)
                continue
            if decision.cordon:  # the breaker's count for the next node includes this one
                members[i] = {**node, "spec": {**node["spec"], "unschedulable": True},
                              "metadata": {**node["metadata"], "annotations": {
                                  **node["metadata"]["annotations"], ANNOTATION: decision.cordon,
                                  CORDON_KIND: decision.kind}}}  # fmt: skip
            done[name] = decision
        eligible = [n for n in members if not in_preflight(n)]
        self.metrics.cordoned.labels(pool).set(sum(1 for n in eligible if for_failure(n)))
        self.metrics.breaker.labels(pool).set(1 if open_ else 0)
        self.metrics.pods_left.labels(pool).set(pods_left)
        return done

    def _maintenance_over(self, node: Mapping[str, Any], verdict: Any) -> bool:
        """Uncordon a node cordoned for maintenance once its agent, since the cordon, no longer
        reports maintenance (the event left the document: the VM is back) nor a failure. True: done
        with the node this round."""
        notes = node["metadata"].get("annotations") or {}
        if verdict is None or verdict.level in ("fatal", "maintenance"):
            return False
        if notes.get(VERDICT_AT, "") < notes.get(ANNOTATION_AT, ""):
            return False  # not reported on since the cordon
        name, value = node["metadata"]["name"], notes.get(VERDICT_ANNOTATION, "")
        body: dict[str, Any] = {
            "spec": {"unschedulable": False},
            "metadata": {
                "annotations": {ANNOTATION: None, ANNOTATION_AT: None, DRAINED_AT: None, CORDON_KIND: None}
            },
        }
        self._do("uncordon", f"uncordon {name}: its maintenance is over ({value})",
                 lambda: self.kube.patch_node(name, body))  # fmt: skip
        if self.draining is not None:
            self.draining.discard(name)
        self.late = {k for k in self.late if k[0] != name}
        self._event(node, "Normal", "MaintenanceOver",
                    f"uncordoned: the scheduled maintenance is over and its agent reports {value}")  # fmt: skip
        return True

    def _maintenance_due(self, node: Mapping[str, Any]) -> int:
        """The pods still on a node cordoned for maintenance, once the maintenance starts within
        PODS_LEFT_S (or has started); named in a Warning Event once per cordon. The event is then left
        to start at its NotBefore: approving it would only take the pods' last minutes."""
        notes = node["metadata"].get("annotations") or {}
        starts = notes.get(MAINTENANCE_AT, "")
        if starts != "started":
            at = _seconds(starts)
            if at is None or self.clock() < at - PODS_LEFT_S:
                return 0
        name = node["metadata"]["name"]
        pods = evictable(self.kube.pods_on(name))
        key = (name, notes.get(ANNOTATION_AT, ""))
        if pods and key not in self.late:
            self.late.add(key)
            listed = ", ".join(f"{p.namespace}/{p.name}" for p in pods)
            when = "has started" if starts == "started" else f"starts at {starts}"
            self._event(node, "Warning", "MaintenanceStartsWithPods",
                        f"not approved: its maintenance {when} with {len(pods)} pods the drain has not moved "
                        f"(a disruption budget, or slow to stop): {listed}")  # fmt: skip
        return len(pods)

    def _reset(self, node: Mapping[str, Any]) -> bool:
        """The GPU reset of a node health cordoned: ask for it once the node is drained, when every
        fatal finding is one a reset may clear; uncordon the node once the reset cleared it and its
        agent reports it no longer fatal; take the label off after a failed reset (remediation then
        replaces the VM). True: nothing else is to be done with the node this round."""
        name = node["metadata"]["name"]
        notes = node["metadata"].get("annotations") or {}
        labelled = (node["metadata"].get("labels") or {}).get(
            health.GPU_RESET_LABEL
        ) == health.RESET_REQUESTED
        outcome, at, _ = health.reset_outcome(notes.get(health.GPU_RESET, ""))
        value = notes.get(VERDICT_ANNOTATION, "")
        if outcome and at >= notes.get(ANNOTATION_AT, ""):  # this cordon's reset has ended
            if outcome == "failed":
                if labelled:
                    unlabel: dict[str, Any] = {"metadata": {"labels": {health.GPU_RESET_LABEL: None}}}
                    self._do("reset_unlabel", f"unlabel {name}: its GPU reset failed",
                             lambda: self.kube.patch_node(name, unlabel))  # fmt: skip
                return False  # drained, and given up: remediation's
            if not labelled:
                return False  # not the reset this controller asked for: nothing to uncordon for
            if value.startswith(("fatal", health.MAINTENANCE)) or notes.get(VERDICT_AT, "") < at:
                return True  # cleared: waiting for its agent's verdict on the reset GPUs (or its maintenance)
            # back in service: the cordon's marks go with the cordon, so that a later cordon by a
            # person is not taken for health's (admission lets them go only with this uncordon)
            body: dict[str, Any] = {
                "spec": {"unschedulable": False},
                "metadata": {
                    "labels": {health.GPU_RESET_LABEL: None},
                    "annotations": {
                        ANNOTATION: None,
                        ANNOTATION_AT: None,
                        DRAINED_AT: None,
                        CORDON_KIND: None,
                    },
                },
            }
            self._do("uncordon", f"uncordon {name}: a GPU reset cleared it ({value})",
                     lambda: self.kube.patch_node(name, body))  # fmt: skip
            if self.draining is not None:
                self.draining.discard(name)
            self._event(node, "Normal", "GPUResetUncordon",
                        f"uncordoned: a GPU reset cleared what it was cordoned for; its agent reports {value}")  # fmt: skip
            return True
        if value.startswith("fatal") and value.endswith(health.RESET_HINT) and drained(node) and not labelled:
            body = {"metadata": {"labels": {health.GPU_RESET_LABEL: health.RESET_REQUESTED}}}
            self._do("reset_request", f"label {name} for a GPU reset: {value}",
                     lambda: self.kube.patch_node(name, body))  # fmt: skip
            self._event(node, "Normal", "GPUResetRequested",
                        "drained; resetting its GPUs once before it is given up: every fatal finding is one a reset may clear")  # fmt: skip
            return True
        return labelled  # asked for: the reset agent is at it

    def _event(self, node: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        body = event(node, COMPONENT, type_, reason, message, now())
        self._do(
            "event", f"event {reason} on {node['metadata']['name']}", lambda: self.kube.create_event(body)
        )

    def _mark_drained(self, node: Mapping[str, Any]) -> None:
        name = node["metadata"]["name"]
        if evictable(self.kube.pods_on(name)):
            return  # still terminating: the next round looks again
        body = {"metadata": {"annotations": {DRAINED_AT: stamp(now())}}}
        self._do("drained", f"mark {name} drained", lambda: self.kube.patch_node(name, body))

    def _do(self, action: str, what: str, call: Callable[[], Any]) -> Any:
        self.metrics.actions.labels(action, str(self.dry_run).lower()).inc()
        if self.dry_run:
            log.warning("dry-run: would %s", what)
            return True
        log.warning("%s", what)
        return call()

    def _act(self, node: Mapping[str, Any], decision: Decision) -> None:
        assert self.draining is not None
        name, at = node["metadata"]["name"], now()
        if decision.breaker_open:
            log.error("breaker open: %s", decision.events[0][2])
        if decision.cordon and cordoned_by_us(node):  # a maintenance cordon whose node has since failed
            change = {"metadata": {"annotations": {ANNOTATION: decision.cordon, CORDON_KIND: decision.kind}}}
            self._do("recordon", f"cordon {name} for a failure: {decision.cordon}",
                     lambda: self.kube.patch_node(name, change))  # fmt: skip
        elif decision.cordon:
            body = cordon_patch(decision.cordon, at, decision.kind)
            self._do("cordon", f"cordon {name}: {decision.cordon}", lambda: self.kube.patch_node(name, body))
        if decision.cordon or decision.evict:
            self.draining.add(name)  # until every pod is out: a later round tries what is left
        held = False
        for pod in decision.evict:
            try:
                moving = self._do("evict", f"evict {pod.namespace}/{pod.name} from {name}",
                                  functools.partial(self.kube.evict, pod))  # fmt: skip
            except Exception as exc:  # a refusal is this pod's: the others go on
                answer = refused(exc)
                if not answer:
                    raise  # the API server is away: the round backs off, the node stays draining
                self.metrics.actions.labels("evict_refused", "false").inc()
                log.error("the API server refused the eviction of %s/%s: %s", pod.namespace, pod.name, answer)
                held = True
                continue
            if not moving:
                held = True
                self.metrics.actions.labels("evict_blocked", "false").inc()
                log.warning(
                    "a PodDisruptionBudget holds %s/%s; trying again next round", pod.namespace, pod.name
                )
        if not held:
            self.draining.discard(name)
        for type_, reason, message in decision.events:
            body = event(node, COMPONENT, type_, reason, message, at)
            self._do("event", f"event {reason} on {name}", functools.partial(self.kube.create_event, body))


def _seconds(value: str) -> float | None:
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def _args(argv: list[str] | None) -> Any:
    p = base_parser("health_controller", (__doc__ or "").splitlines()[0], NODE_AGENTS_METRICS_PORT, 10.0)
    p.add_argument("--pools", required=True, help="the pools it looks after, comma-separated")
    p.add_argument("--max-cordoned-share", type=float, default=0.05)
    p.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", "superkube-system"),
                   help="where its Lease lives (env POD_NAMESPACE)")  # fmt: skip
    p.add_argument("--identity", default=os.environ.get("POD_NAME", socket.gethostname()),
                   help="this replica's name in the Lease (env POD_NAME)")  # fmt: skip
    args = p.parse_args(argv)
    if not 0 < args.max_cordoned_share <= 1:
        p.error(f"--max-cordoned-share must be in (0, 1]; got {args.max_cordoned_share}")
    args.pool_set = frozenset(x.strip() for x in args.pools.split(",") if x.strip())
    if not args.pool_set:
        p.error("--pools names no pool")
    return args


def main(argv: list[str] | None = None) -> int:
    from superkube.agents.leader import Lease

    args = _args(argv)
    log_to_stderr(COMPONENT)
    metrics = Metrics()
    kube = connect(COMPONENT, args, metrics.registry)
    if kube is None:
        return 2
    stop, changed = threading.Event(), threading.Event()
    selector = f"{POOL_LABEL} in ({','.join(sorted(args.pool_set))})"
    watch = Informer(kube.core.list_node, slim=slim, label_selector=selector,
                     on_change=lambda name, obj: changed.set())  # fmt: skip
    lease = Lease(kube.coordination, args.namespace, LEASE, args.identity)

    def nodes() -> dict[str, dict[str, Any]]:
        watch.ensure(stop)
        return watch.items()

    controller = Controller(kube, nodes, args.pool_set, args.max_cordoned_share, lease.try_lead,
                            args.dry_run, metrics)  # fmt: skip

    def one_round() -> bool:
        controller.round()
        changed.wait(args.interval)  # a change brings the next round forward
        changed.clear()
        return False

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a pod's stop: release the lease on the way out
    try:
        serve(one_round, metrics.api_up, log, 1.0, args.max_backoff, args.rounds)
    finally:
        watch.close()
        lease.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
