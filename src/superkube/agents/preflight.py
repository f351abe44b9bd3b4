"""Preflight: a GPU node joins tainted and labelled `superkube.io/preflight=pending`; this agent checks
its GPUs, and only when they pass removes that taint and label from its own node.

Runs as a DaemonSet of the in-cluster layer on nodes that still carry the label (tolerating the
taint), so its pod goes away by itself once the node has passed. Each round it probes the node
(`gpu_probe`: the GPU count for the VM size, Xid, ECC, retired pages, remapped rows, NVLink); a node
with no fatal finding passes: one JSON patch removes the taint and the label and records the result
in the annotation `superkube.io/preflight-result`, guarded by a `test` of the taints it read (a
concurrent change makes the patch fail rather than be overwritten). A node that fails keeps the
taint, gets the reasons in that annotation and a Warning Event, and is checked again next round
(a driver still loading at boot is the common first failure).

What the agent may do is enforced in the cluster, not trusted to the agent: the ValidatingAdmissionPolicy
`superkube-preflight-own-node` (modules/platform/preflight.py) rejects any change its service account
makes to a node other than its own, or to anything but that taint, that label and the result
annotation.

Metrics on the node's port 9466: `superkube_preflight_checks_total{result, reason}` (alert
PreflightFailures), `superkube_preflight_api_up`.

Run: python -m superkube.agents.preflight --node NODE --vm-size SIZE --expected-gpus N
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from superkube.agents import gpu_probe
from superkube.agents.kubeapi import (
    MAX_MESSAGE,
    Kube,
    add_burn_option,
    agent_parser,
    annotate,
    check_agent_args,
    event,
    now,
    pointer,
    run_agent,
    stamp,
)
from superkube.cluster.kube import PREFLIGHT_METRICS_PORT
from superkube.model.spec import PREFLIGHT_RESULT_ANNOTATION, PREFLIGHT_TAINT_KEY

COMPONENT = "superkube-preflight"
RESULT_ANNOTATION = PREFLIGHT_RESULT_ANNOTATION

log = logging.getLogger(COMPONENT)

# a finding's reason -> the bounded `reason` label of the failure counter
_REASONS = (
    (re.compile(r"silent data corruption"), "wrong-results"),
    (re.compile(r"active GPU check could not run"), "burn-failed"),
    (re.compile(r"matrix multiply|memory copy|host-to-device"), "performance"),
    (re.compile(r"^Xid (\d+)"), "xid-{0}"),
    (re.compile(r"GPUs a .* has are visible"), "gpu-count"),
    (re.compile(r"ECC"), "ecc"),
    (re.compile(r"retire"), "retired-pages"),
    (re.compile(r"remap"), "remapped-rows"),
    (re.compile(r"NVLink"), "nvlink"),
    (re.compile(r"PCIe"), "pcie"),
)


def reason_code(finding: gpu_probe.Finding) -> str:
    for pattern, code in _REASONS:
        m = pattern.search(finding.reason)
        if m:
            return code.format(*m.groups())
    return "other"


def pass_patch(node: Mapping[str, Any], message: str) -> list[dict[str, Any]]:
    """The JSON patch that lets a passed node into service: the preflight taint and label go, the
    result is recorded; `test` first, so a node changed since it was read is not overwritten."""
    taints = list((node.get("spec") or {}).get("taints") or [])
    kept = [t for t in taints if t.get("key") != PREFLIGHT_TAINT_KEY]
    labels = (node.get("metadata") or {}).get("labels") or {}
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/spec/taints", "value": taints},
        {"op": "replace", "path": "/spec/taints", "value": kept},
    ]
    if PREFLIGHT_TAINT_KEY in labels:
        ops.append({"op": "remove", "path": f"/metadata/labels/{pointer(PREFLIGHT_TAINT_KEY)}"})
    ops += annotate(node, RESULT_ANNOTATION, message)
    return ops


def fail_patch(node: Mapping[str, Any], message: str) -> list[dict[str, Any]]:
    """The JSON patch that records why a node stays out of service."""
    return annotate(node, RESULT_ANNOTATION, message)


def pending(node: Mapping[str, Any]) -> bool:
    taints = (node.get("spec") or {}).get("taints") or []
    return any(t.get("key") == PREFLIGHT_TAINT_KEY for t in taints)


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.checks = Counter(
            "superkube_preflight_checks",
            "Preflight rounds by result, and failures by reason.",
            ["result", "reason"],
            registry=self.registry,
        )
        self.api_up = Gauge(
            "superkube_preflight_api_up",
            "1 when the last round reached the API server.",
            registry=self.registry,
        )


@dataclass
class Agent:
    node: str
    probe: Callable[[], gpu_probe.Verdict]
    kube: Any  # Kube, or anything with its methods
    dry_run: bool = False
    metrics: Metrics = field(default_factory=Metrics)

    def round(self) -> str:
        """One check: "passed", "failed", or "done" when the node is no longer pending."""
        node = self.kube.node(self.node)
        self.metrics.api_up.set(1)
        if not pending(node):
            log.info("%s is past preflight", self.node)
            return "done"
        verdict = self.probe()
        at = now()
        fatal = [f for f in verdict.findings if f.level == "fatal"]
        if not fatal:
            self.metrics.checks.labels("pass", "").inc()
            message = f"passed {stamp(at)}"
            self._patch(
                pass_patch(node, message),
                f"preflight passed: removing {PREFLIGHT_TAINT_KEY} from {self.node}",
            )
            self._event(node, "Normal", "PreflightPassed", message, at)
            return "passed"
        for code in sorted({reason_code(f) for f in fatal}):
            self.metrics.checks.labels("fail", code).inc()
        message = f"failed {stamp(at)}: " + "; ".join(str(f) for f in fatal)
        self._patch(fail_patch(node, message[:MAX_MESSAGE]), f"preflight failed on {self.node}: {message}")
        self._event(node, "Warning", "PreflightFailed", message, at)
        return "failed"

    def _patch(self, ops: list[dict[str, Any]], what: str) -> None:
        if self.dry_run:
            log.warning("dry-run: would patch: %s", what)
            return
        log.warning("%s", what)
        self.kube.patch_node(self.node, ops)

    def _event(self, node: Mapping[str, Any], type_: str, reason: str, message: str, at: Any) -> None:
        if not self.dry_run:
            self.kube.create_event(event(node, COMPONENT, type_, reason, message, at))


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = agent_parser("preflight", __doc__.splitlines()[0], PREFLIGHT_METRICS_PORT)
    add_burn_option(p)
    args = p.parse_args(argv)
    check_agent_args(p, args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    metrics = Metrics()

    def make_round(probe: Callable[[], gpu_probe.Verdict], kube: Kube) -> Callable[[], bool]:
        agent = Agent(args.node, probe, kube, args.dry_run, metrics)
        return lambda: agent.round() == "done"

    return run_agent(COMPONENT, log, args, metrics, make_round)


if __name__ == "__main__":
    sys.exit(main())
