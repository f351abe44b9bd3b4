"""Passive node health on every node: probe the node's GPUs and host, and report the verdict on it.

Runs on every node of every pool (a DaemonSet of the in-cluster layer, on the host network). Each
round it reads the node's GPUs through the probe (`gpu_probe`: NVML, the thresholds in
src/superkube/data/gpu_health.yaml; a CPU pool's node has none), its host (`host_checks`:
filesystems full or read-only, I/O errors in the kernel log, the kubelet and the container runtime
answering, the API servers and the default route reachable) and the maintenance Azure scheduled for
its VM (`scheduled_events`), folds in a failed periodic GPU test (the annotation
`superkube.io/gpu-test-result` that superkube.agents.gpu_test writes), and writes the verdict to
its own Node, in the annotation `superkube.io/health-verdict` ("fatal: <reasons>", "warning:
<reasons>", "healthy", or "preflight" while the node is behind the preflight taint, which preflight
judges), only when it changed. A warning is also an Event on the node, once per
distinct set of reasons.

It writes nothing but its own Node: its node comes from a watch on that one object (field
selector `metadata.name`), so a steady fleet costs one idle watch per node; with `--peers` it also
lists a few of its pool's nodes, at start and hourly, to probe them (host_checks.Peers). Cordoning and
eviction are fleet-wide decisions (the breaker counts a pool's cordoned nodes) and belong to one
leader-elected controller, superkube.agents.health_controller, which follows every GPU node with a
watch; the agent's admission policy lets it set its own annotations on its own node and nothing
else. The decision logic both share is here (`decide`). Once the controller has drained a node it
cordoned (the annotation `superkube.io/health-drained-at`), the agent approves the Reboot, Redeploy
or Terminate that Azure scheduled for its VM, so Azure proceeds at once rather than at NotBefore.

`--dry-run` logs the report instead of writing it. When the API server cannot be reached the agent
backs off (doubling to `--max-backoff`) and keeps serving its metrics, with
`superkube_health_api_up 0`.

Run: python -m superkube.agents.node_health --node NODE --pool POOL --vm-size SIZE --expected-gpus N
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from superkube.agents import gpu_probe, gpu_test, host_checks, scheduled_events
from superkube.agents.informer import Informer
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
from superkube.cluster import autoscaling, health
from superkube.cluster.kube import NODE_AGENTS_METRICS_PORT, SYSTEM_NAMESPACE
from superkube.model.spec import PREFLIGHT_TAINT_KEY

COMPONENT = "superkube-node-health"
ANNOTATION = health.CORDONED  # the reason; marks the nodes health cordoned
ANNOTATION_AT = health.CORDONED_AT
VERDICT_ANNOTATION = health.VERDICT  # the node's agent's last verdict, with its reasons
VERDICT_AT = health.VERDICT_AT
DRAINED_AT = health.DRAINED_AT  # the controller: every pod a drain moves is gone
CORDON_KIND = health.CORDON_KIND  # a failure's cordon, or maintenance's
MAINTENANCE_AT = health.MAINTENANCE_AT  # beside a maintenance verdict: when the event starts
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
PROTECTED_NAMESPACES = health.PROTECTED_NAMESPACES  # never drained by health

log = logging.getLogger(COMPONENT)


# --- what the agent decides --------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What to do this round. `events` are (type, reason, message)."""

    cordon: str = ""  # the reason, when the node is to be cordoned
    kind: str = health.FAILURE  # the cordon's kind (CORDON_KIND), or what a cordon of maintenance becomes
    evict: tuple[PodRef, ...] = ()
    events: tuple[tuple[str, str, str], ...] = ()
    breaker_open: bool = False
    cordoned_share: float = 0.0  # this pool's share cordoned by the agent, once this decision is done


def _taints(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((node.get("spec") or {}).get("taints") or [])


def in_preflight(node: Mapping[str, Any]) -> bool:
    return any(t.get("key") == PREFLIGHT_TAINT_KEY for t in _taints(node))


def cordon_kind(node: Mapping[str, Any]) -> str:
    """The kind of health's cordon on the node (a failure's when none was written)."""
    notes = (node.get("metadata") or {}).get("annotations") or {}
    return health.MAINTENANCE if notes.get(CORDON_KIND) == health.MAINTENANCE else health.FAILURE


def for_failure(node: Mapping[str, Any]) -> bool:
    """Cordoned by health for a failure: what the breaker counts and remediation may replace."""
    return cordoned_by_us(node) and cordon_kind(node) == health.FAILURE


def cordoned_by_us(node: Mapping[str, Any]) -> bool:
    """Cordoned now, and by this agent: its annotation alone is history (the recovery uncordons and
    may leave it), so a repaired node neither holds the breaker open nor escapes a second cordon."""
    annotated = ANNOTATION in ((node.get("metadata") or {}).get("annotations") or {})
    return annotated and bool((node.get("spec") or {}).get("unschedulable"))


def balloon(pod: Mapping[str, Any]) -> bool:
    """One of the layer's balloons: a placeholder, moved by a drain like a workload's pod."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    return (
        meta.get("namespace") == SYSTEM_NAMESPACE
        and labels.get("app.kubernetes.io/component") == autoscaling.BALLOONS
        and str(meta.get("name", "")).startswith(autoscaling.BALLOON_PREFIX)
    )


def evictable(
    pods: Iterable[Mapping[str, Any]], protected: Iterable[str] = PROTECTED_NAMESPACES
) -> tuple[PodRef, ...]:
    """The pods a drain moves: not DaemonSet pods (they come back), not mirror pods (the kubelet's
    own), not pods that have finished, none in the `protected` namespaces (health's drain leaves the
    system alone; a roll, whose node goes away, protects none) but the balloons, which would
    otherwise keep the node: the autoscaler removes no node a balloon fills."""
    kept = frozenset(protected)
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("namespace", "default") in kept and not balloon(pod):
            continue
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
    the warning already sent as an Event (sent once per distinct set of reasons).

    Maintenance (Azure's scheduled event) is cordoned as such and drained whatever the breaker says:
    the VM goes down at NotBefore anyway, and pods moved ahead of it are pods not killed. The breaker
    counts failures only (`health.may_cordon`: always one node of a pool, then the share)."""
    eligible = [n for n in pool_nodes if not in_preflight(n)]
    cordoned = sum(1 for n in eligible if for_failure(n))
    share = cordoned / len(eligible) if eligible else 0.0
    if verdict.level == "warning":
        summary = _summary(verdict, "warning")
        events = (("Warning", "GPUHealthWarning", summary),) if summary != warned else ()
        return Decision(events=events, cordoned_share=share)
    if verdict.level not in ("fatal", "maintenance") or in_preflight(node):
        return Decision(cordoned_share=share)
    kind = health.FAILURE if verdict.level == "fatal" else health.MAINTENANCE
    reason = _summary(verdict, verdict.level)
    if cordoned_by_us(node):
        # cordoned in an earlier round: move what is left (pods a PodDisruptionBudget held back); a
        # maintenance cordon whose node has since failed becomes a failure's (remediation's then)
        if kind == health.FAILURE and cordon_kind(node) == health.MAINTENANCE:
            if not health.may_cordon(cordoned, len(eligible), max_cordoned_share):
                message = (
                    f"not making its maintenance cordon a failure's: {cordoned + 1} of {len(eligible)} nodes "
                    f"past preflight in this pool would be cordoned by health for failures; {reason}"
                )[:MAX_MESSAGE]
                return Decision(events=(("Warning", "HealthBreakerOpen", message),), breaker_open=True,
                                cordoned_share=share)  # fmt: skip
            events = (
                (
                    "Warning",
                    cordon_reason(reason),
                    f"failed while cordoned for maintenance: {reason}"[:MAX_MESSAGE],
                ),
            )
            return Decision(
                cordon=reason, kind=kind, evict=evictable(pods), events=events, cordoned_share=share
            )
        return Decision(evict=evictable(pods), kind=cordon_kind(node), cordoned_share=share)
    after = share
    if kind == health.FAILURE:
        if not health.may_cordon(cordoned, len(eligible), max_cordoned_share):
            after = (cordoned + 1) / len(eligible) if eligible else 1.0
            message = (
                f"not cordoning: {cordoned + 1} of {len(eligible)} nodes past preflight in this pool would be "
                f"cordoned by health for failures ({after:.1%} > {max_cordoned_share:.1%}); {reason}"
            )[:MAX_MESSAGE]
            return Decision(
                events=(("Warning", "HealthBreakerOpen", message),), breaker_open=True, cordoned_share=share
            )
        after = (cordoned + 1) / len(eligible) if eligible else 1.0
    pods_out = evictable(pods)
    cordon_events: list[tuple[str, str, str]] = [
        (
            "Warning" if kind == health.FAILURE else "Normal",
            cordon_reason(reason),
            f"cordoned: {reason}"[:MAX_MESSAGE],
        )
    ]
    cordon_events += [("Normal", "GPUHealthEvict", f"evicting {p.namespace}/{p.name}") for p in pods_out]
    return Decision(
        cordon=reason, kind=kind, evict=pods_out, events=tuple(cordon_events), cordoned_share=after
    )


def cordon_reason(summary: str) -> str:
    """The Event reason of a cordon, by what its fatal findings were about."""
    if summary.startswith(health.MAINTENANCE):
        return "MaintenanceCordon"
    if "GPU" in summary:
        return "GPUHealthCordon"
    return "NodeHealthCordon"


def combined(verdict: gpu_probe.Verdict, more: list[gpu_probe.Finding]) -> gpu_probe.Verdict:
    """The GPU verdict with the host's and the cloud's findings: its level the worst of all."""
    if not more:
        return verdict
    findings = [*verdict.findings, *more]
    level = max((f.level for f in findings), key=gpu_probe.ORDER.__getitem__, default=verdict.level)
    return gpu_probe.Verdict(
        verdict.node, max(level, verdict.level, key=gpu_probe.ORDER.__getitem__), findings
    )


def drained(node: Mapping[str, Any]) -> bool:
    """Cordoned by health and drained since (the controller's mark is later than the cordon)."""
    notes = (node.get("metadata") or {}).get("annotations") or {}
    at, cordoned = notes.get(DRAINED_AT, ""), notes.get(ANNOTATION_AT, "")
    return cordoned_by_us(node) and bool(at) and at >= cordoned


def with_periodic_test(verdict: gpu_probe.Verdict, failed_test: str | None) -> gpu_probe.Verdict:
    """The probe's verdict with a failed periodic GPU test (the node's annotation) as one more fatal
    finding: the test records, this agent takes the node out, behind the same breaker."""
    if failed_test is None:
        return verdict
    finding = gpu_probe.Finding("fatal", None, f"periodic GPU test {failed_test}")
    return gpu_probe.Verdict(verdict.node, "fatal", [*verdict.findings, finding])


IN_PREFLIGHT = "preflight"  # the verdict written while preflight judges the node (not fatal, not warning)


def note(verdict: gpu_probe.Verdict, node: Mapping[str, Any] | None = None) -> str:
    """The verdict as the agent writes it on its node: its level, and the reasons of that level.

    While the node is behind the preflight taint it is IN_PREFLIGHT, whatever the GPUs read:
    preflight judges the node then, and a fatal verdict written during a failed preflight would
    outlive the pass that lifts the taint, so the controller would cordon a node that had just
    passed (seen in the lab) until the agent's next round."""
    if node is not None and in_preflight(node):
        return IN_PREFLIGHT
    if verdict.level == "fatal" and gpu_probe.reset_may_clear(verdict):
        # the hint is kept whole however long the reasons: the controller and remediation read it
        return _summary(verdict, "fatal")[: MAX_MESSAGE - len(health.RESET_HINT)] + health.RESET_HINT
    if verdict.level in ("fatal", "maintenance", "warning"):
        return _summary(verdict, verdict.level) or verdict.level
    return "healthy"


def reported(node: Mapping[str, Any]) -> gpu_probe.Verdict | None:
    """The verdict the node's agent wrote (None: none yet), as the controller reads it."""
    value = ((node.get("metadata") or {}).get("annotations") or {}).get(VERDICT_ANNOTATION)
    if not value:
        return None
    level = value.split(":", 1)[0]
    if level not in ("fatal", "maintenance", "warning"):
        return gpu_probe.Verdict(node["metadata"]["name"], "healthy", [])
    return gpu_probe.Verdict(node["metadata"]["name"], level, [_Reported(level, None, value)])


class _Reported(gpu_probe.Finding):
    """A reported summary (already "fatal: GPU 3: ..."), said as it was written."""

    def __str__(self) -> str:
        return self.reason


# --- what goes to the API server (each body is checked against the official schema in tests) ----


def cordon_patch(reason: str, at: datetime, kind: str = health.FAILURE) -> dict[str, Any]:
    """A merge patch of the node: unschedulable, with the reason, the kind and the time."""
    notes = {ANNOTATION: reason[:MAX_MESSAGE], ANNOTATION_AT: stamp(at), CORDON_KIND: kind}
    return {"metadata": {"annotations": notes}, "spec": {"unschedulable": True}}


def report_patch(value: str, at: datetime, starts_at: str = "") -> dict[str, Any]:
    """A merge patch of the agent's own node: its verdict and when; beside a maintenance verdict, when
    the maintenance starts (taken away with any other verdict)."""
    notes = {VERDICT_ANNOTATION: value[:MAX_MESSAGE], VERDICT_AT: stamp(at)}
    return {"metadata": {"annotations": {**notes, MAINTENANCE_AT: starts_at or None}}}


# --- the agent ----------------------------------------------------------------------------------


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.checks = Counter("superkube_health_checks", "Probe rounds by verdict.", ["result"], registry=r)
        self.reports = Counter(
            "superkube_health_reports",
            "Verdicts written to the node (or logged, in dry-run), by level.",
            ["level", "dry_run"],
            registry=r,
        )
        self.api_up = Gauge(
            "superkube_health_api_up", "1 when the last round reached the API server.", registry=r
        )
        self.findings = Gauge(
            "superkube_health_findings",
            "This round's findings on the node, by check (gpu, filesystem, kernel-io, kubelet, runtime, "
            "api-servers, default-route, peers, scheduled-event) and level.",
            ["check", "level"],
            registry=r,
        )
        self.scheduled = Gauge(
            "superkube_health_scheduled_event",
            "1 while Azure has a Reboot, Redeploy or Terminate scheduled for this node's VM, by type.",
            ["type"],
            registry=r,
        )
        self.acknowledged = Counter(
            "superkube_health_events_acknowledged",
            "Scheduled events approved after the node was drained since its cordon, by type.",
            ["type"],
            registry=r,
        )
        self.ignored = Counter(
            "superkube_health_events_ignored",
            "Scheduled events read but not acted on, by reason (scheduled_events.IGNORED), once per document.",
            ["reason"],
            registry=r,
        )
        for reason in scheduled_events.IGNORED:  # every series from the start, so the first one counts
            self.ignored.labels(reason)
        self.events_up = Gauge(
            "superkube_health_events_up",
            "1 when the last round read the VM's scheduled events from its instance metadata.",
            registry=r,
        )
        self.gpu_test_failed = Gauge(
            "superkube_health_gpu_test_failed",
            "1 while this agent's node carries a failed periodic GPU test (sum by pool: the pool's count).",
            ["pool"],
            registry=r,
        )


@dataclass
class Events:
    """This VM's scheduled events: read each round, approved once the node is drained."""

    client: scheduled_events.Client
    lead_s: float = scheduled_events.LEAD_S
    vm: str = ""
    incarnation: int = -1
    acked: set[str] = field(default_factory=set)
    pending: list[scheduled_events.Event] = field(default_factory=list)

    starts_at: str = ""  # the earliest NotBefore of the due events ("started", "" for none)
    last: list[gpu_probe.Finding] = field(default_factory=list)  # the last document's findings
    last_at: float = 0.0  # when it was read (monotonic)

    def read(self, metrics: Metrics) -> list[gpu_probe.Finding]:
        """This round's findings; a document that cannot be had or read is a log line (and
        `superkube_health_events_up 0`), never a finding; an event that cannot be acted on safely
        is a log line and a count (`superkube_health_events_ignored_total{reason}`), never a finding."""
        try:
            self.vm = self.vm or self.client.vm_name()
            incarnation, events, bad = scheduled_events.parse(self.client.document())
        except scheduled_events.EventsError as e:
            metrics.events_up.set(0)
            # a document that could not be read is not a maintenance over: the last one's findings
            # hold for the lead (a node drained for a Reboot is not returned on one failed read)
            kept = self.last if time.monotonic() - self.last_at < self.lead_s else []
            log.error("scheduled events: %s%s", e, "; keeping the last document's findings" if kept else "")
            return kept
        metrics.events_up.set(1)
        judged = scheduled_events.judge(events, self.vm, now(), self.lead_s, malformed=len(bad))
        self.pending, self.starts_at = judged.due, judged.starts_at
        if incarnation != self.incarnation:  # said and counted once per document, not every round
            for line in [*bad, *judged.lines]:
                log.warning("scheduled events: %s", line)
            for reason in judged.ignored:
                metrics.ignored.labels(reason).inc()
            self.incarnation = incarnation
        for kind in scheduled_events.DRAINED_FIRST:
            metrics.scheduled.labels(kind).set(
                sum(1 for e in events if e.type == kind and self.vm in e.resources)
            )
        self.last, self.last_at = judged.findings, time.monotonic()
        return judged.findings

    def approve(self, metrics: Metrics) -> list[str]:
        """Approve the due events this agent may approve (`scheduled_events.approvable`) and has not
        yet; their ids."""
        ids = [e for e in self.pending if e.id not in self.acked and scheduled_events.approvable(e, self.vm)]
        if not ids:
            return []
        try:
            self.client.acknowledge(e.id for e in ids)
        except scheduled_events.EventsError as exc:
            log.error("scheduled events: approving failed, next round again: %s", exc)
            return []
        for e in ids:
            self.acked.add(e.id)
            metrics.acknowledged.labels(e.type).inc()
            log.warning("approved %s: the node is drained", e)
        return [e.id for e in ids]


@dataclass
class Agent:
    node: str
    pool: str
    probe: Callable[[], gpu_probe.Verdict]
    kube: Any  # Kube, or anything with its methods
    own: Callable[[], Mapping[str, Any]]
    """this node as last seen (the watch on it; in tests anything that returns the node)"""
    dry_run: bool = False
    metrics: Metrics = field(default_factory=Metrics)
    warned: str = ""
    host: host_checks.HostChecks | None = None
    events: Events | None = None

    forgiven: dict[int, int] = field(default_factory=dict)
    """{GPU index: Xid} a GPU reset cleared (its node's GPU_RESET annotation), as last seen"""

    def _forgiven(self) -> dict[int, int]:
        """The Xids the node's last GPU reset cleared; the last known while the node cannot be read."""
        try:
            notes = (self.own().get("metadata") or {}).get("annotations") or {}
        except Exception:  # the API server is away: the round still probes, and says so later
            return self.forgiven
        outcome, _, pairs = health.reset_outcome(notes.get(health.GPU_RESET, ""))
        self.forgiven = pairs if outcome == "cleared" else {}
        return self.forgiven

    def _findings(self, verdict: gpu_probe.Verdict) -> gpu_probe.Verdict:
        """The probe's verdict with the host's and the cloud's findings, each check's counted."""
        verdict = gpu_probe.forgive(verdict, self._forgiven())
        by_check: dict[str, list[gpu_probe.Finding]] = {"gpu": list(verdict.findings)}
        if self.host is not None:
            by_check.update(self.host.read())
        if self.events is not None:
            by_check["scheduled-event"] = self.events.read(self.metrics)
        for check, found in by_check.items():
            for level in ("fatal", "maintenance", "warning"):
                self.metrics.findings.labels(check, level).set(sum(1 for f in found if f.level == level))
        more = [f for check, found in by_check.items() if check != "gpu" for f in found]
        return combined(verdict, more)

    def round(self) -> str:
        """Probe, and write the verdict on the node when it changed; returns what was reported."""
        verdict = self._findings(self.probe())  # probed (and counted) even while the API server is away
        self.metrics.checks.labels(verdict.level).inc()
        node = self.own()
        test = gpu_test.failed(node)
        self.metrics.gpu_test_failed.labels(self.pool).set(1 if test else 0)
        verdict = with_periodic_test(verdict, test)
        value = note(verdict, node)
        notes = (node.get("metadata") or {}).get("annotations") or {}
        current = notes.get(VERDICT_ANNOTATION)
        at = now()
        # said again when a cordon is newer than the verdict (the controller returns a node only on a
        # verdict made since its cordon: one that landed just after the cordon would never count)
        older = cordoned_by_us(node) and notes.get(VERDICT_AT, "") < notes.get(ANNOTATION_AT, "")
        if value != current or older:
            self.metrics.reports.labels(verdict.level, str(self.dry_run).lower()).inc()
            if self.dry_run:
                log.warning("dry-run: would report %s", value)
            else:
                (log.warning if verdict.level == "fatal" else log.info)("report: %s", value)
                starts = (
                    self.events.starts_at
                    if self.events is not None and verdict.level == "maintenance"
                    else ""
                )
                self.kube.patch_node(self.node, report_patch(value, at, starts))
        warning = verdict.level == "warning" and value != IN_PREFLIGHT  # preflight judges it for now
        if warning and value != self.warned and not self.dry_run:
            self.kube.create_event(event(node, COMPONENT, "Warning", "NodeHealthWarning"
                                         if "GPU" not in value else "GPUHealthWarning", value, at))  # fmt: skip
        self.warned = value if warning else ""
        if self.events is not None and not self.dry_run and drained(node):
            for id_ in self.events.approve(self.metrics):
                self.kube.create_event(
                    event(
                        node,
                        COMPONENT,
                        "Normal",
                        "ScheduledEventApproved",
                        f"approved event {id_}: drained",
                        at,
                    )
                )
        self.metrics.api_up.set(1)
        return value


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = agent_parser("node_health", __doc__.splitlines()[0], NODE_AGENTS_METRICS_PORT)
    p.add_argument("--pool", default=os.environ.get("NODE_POOL", ""), help="this node's pool (env NODE_POOL)")
    h = p.add_argument_group("host checks (each left out when not given)")
    h.add_argument("--filesystem", action="append", default=[], metavar="NAME=PATH",
                   help="a directory on a filesystem to watch (full, read-only); repeat for each")  # fmt: skip
    h.add_argument("--full-warning", type=float, default=host_checks.FULL_WARNING)
    h.add_argument("--full-fatal", type=float, default=host_checks.FULL_FATAL)
    h.add_argument("--kernel-log", type=Path, help="the host's kernel log (I/O errors), e.g. kern.log")
    h.add_argument("--kubelet-healthz", default="", help="the kubelet's health URL on the node's loopback")
    h.add_argument("--runtime-metrics", default="", help="the container runtime's metrics URL (loopback)")
    h.add_argument(
        "--api-address", default="", help="HOST:PORT of the API servers, as the kubelet reaches them"
    )
    h.add_argument("--route-table", type=Path, default=Path("/proc/net/route"),
                   help="the node's routes (the agent runs on the host network)")  # fmt: skip
    h.add_argument("--confirm-rounds", type=int, default=host_checks.CONFIRM_ROUNDS,
                   help="failed rounds in a row before a reachability check is fatal")  # fmt: skip
    h.add_argument("--peers", type=int, default=0,
                   help="nodes of this node's pool to reach each round (their kubelet port); 0: none")  # fmt: skip
    h.add_argument("--peer-port", type=int, default=host_checks.KUBELET_PORT)
    h.add_argument("--peer-list-limit", type=int, default=host_checks.PEER_LIST_LIMIT,
                   help="nodes of the pool one list of the API server returns at most")  # fmt: skip
    h.add_argument("--peer-refresh", type=float, default=host_checks.PEER_REFRESH_S,
                   help="seconds between lists of the pool (jittered); never one a round")  # fmt: skip
    e = p.add_argument_group("scheduled events")
    e.add_argument("--scheduled-events", default="",
                   help="the instance metadata service's base URL, e.g. http://169.254.169.254; empty: not read")  # fmt: skip
    e.add_argument("--event-lead", type=float, default=scheduled_events.LEAD_S,
                   help="seconds before an event's NotBefore from which it is fatal (cordon and drain)")  # fmt: skip
    args = p.parse_args(argv)
    check_agent_args(p, args, gpus_required=False)
    if not args.pool:
        p.error("--pool is required (or NODE_POOL)")
    if not 0 < args.full_warning <= args.full_fatal <= 1:
        p.error("--full-warning and --full-fatal must be 0 < warning <= fatal <= 1")
    if args.confirm_rounds < 1:
        p.error("--confirm-rounds must be at least 1")
    if args.peers and not (host_checks.MIN_PEERS <= args.peers <= args.peer_list_limit):
        p.error(f"--peers must be 0 or from {host_checks.MIN_PEERS} to --peer-list-limit")
    if args.peers and (args.peer_refresh < 60 or not 0 < args.peer_port < 65536):
        p.error("--peer-refresh must be at least 60 seconds and --peer-port a TCP port")
    try:
        args.host = host_checks.build(
            args.filesystem, args.kernel_log, args.kubelet_healthz, args.runtime_metrics, args.api_address,
            args.route_table, args.confirm_rounds, args.full_warning, args.full_fatal,
        )  # fmt: skip
    except ValueError as exc:
        p.error(str(exc))
    return args


def own_node(watch: Informer, name: str, stop: threading.Event) -> Callable[[], Mapping[str, Any]]:
    """This node, from a watch on that one object (listed once, then followed)."""

    def current() -> Mapping[str, Any]:
        watch.ensure(stop)
        node = watch.get(name)
        if node is None:
            raise LookupError(f"node {name} is not registered with the API server")
        return node

    return current


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    metrics = Metrics()
    stop = threading.Event()
    watches: list[Informer] = []

    def make_round(probe: Callable[[], gpu_probe.Verdict], kube: Kube) -> Callable[[], bool]:
        watches.append(Informer(kube.core.list_node, field_selector=f"metadata.name={args.node}"))
        own = own_node(watches[-1], args.node, stop)
        events = None
        if args.scheduled_events:
            events = Events(scheduled_events.Client(args.scheduled_events.rstrip("/")), args.event_lead)
        if args.peers:

            def pool_nodes(labels: str, fields: str, limit: int) -> list[dict[str, Any]]:
                found = kube.core.list_node(
                    label_selector=labels, field_selector=fields, limit=limit, _request_timeout=10
                )
                return [kube.api.sanitize_for_serialization(n) for n in found.items]

            args.host.peers = host_checks.Peers(
                args.node, args.pool, pool_nodes, args.peers, args.peer_port, args.peer_list_limit,
                args.peer_refresh, confirm=args.confirm_rounds,
            )  # fmt: skip
        agent = Agent(
            args.node, args.pool, probe, kube, own, args.dry_run, metrics, host=args.host, events=events
        )

        def one_round() -> bool:
            agent.round()
            return False  # the health agent watches for as long as its node runs

        return one_round

    try:
        return run_agent(COMPONENT, log, args, metrics, make_round)
    finally:
        for watch in watches:
            watch.close()


if __name__ == "__main__":
    sys.exit(main())
