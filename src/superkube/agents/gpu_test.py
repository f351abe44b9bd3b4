"""Periodic GPU test: one run on one idle node, started by the in-cluster layer's CronJob.

The CronJob's pods each request every GPU of a node, so the scheduler places them only on nodes
with no GPU in use, at a priority below the autoscaler's expendable cutoff that never preempts, so
they neither displace work nor make the autoscaler add nodes; any real pod preempts them. Here, on
that node, the test probes the GPUs (`gpu_probe`, as preflight does) and runs the active check
(`gpu_burn`: matrix-multiply burn with a bitwise check, memory and PCIe bandwidth) against what the
VM size's GPU model should reach (src/superkube/data/gpu_health.yaml).

It records the result on its own node, and nothing else: the annotation
`superkube.io/gpu-test-result` ("passed <time>" or "failed <time>: <reasons>") and an Event
(GpuTestPassed / GpuTestFailed). Taking a failed node out of service is the health agent's job: it
reads this annotation in its next round and cordons and evicts behind its breaker, so one agent
decides every cordon. The ValidatingAdmissionPolicy `superkube-gpu-test-own-node` rejects any other
change the test's service account tries. With --dry-run it logs what it would record.

Exit codes: 0 passed, 1 failed (the Job shows it), 2 bad input, 3 the API server was not reachable.

Run: python -m superkube.agents.gpu_test --node NODE --vm-size SIZE --expected-gpus N --burn-seconds 60
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping
from typing import Any

from superkube.agents import gpu_probe
from superkube.agents.kubeapi import (
    MAX_MESSAGE,
    Kube,
    add_burn_option,
    agent_parser,
    annotate,
    check_agent_args,
    event,
    log_to_stderr,
    node_probe,
    now,
    stamp,
    unreachable,
)
from superkube.cluster import health

COMPONENT = "superkube-gpu-test"
RESULT_ANNOTATION = health.GPU_TEST_RESULT
log = logging.getLogger(COMPONENT)


def result_patch(node: Mapping[str, Any], message: str) -> list[dict[str, Any]]:
    """The JSON patch that records a result on the node: the annotation only."""
    return annotate(node, RESULT_ANNOTATION, message)


def failed(node: Mapping[str, Any]) -> str | None:
    """The reasons of the node's last periodic test when it failed (None: passed, or never tested)."""
    note = ((node.get("metadata") or {}).get("annotations") or {}).get(RESULT_ANNOTATION, "")
    return note if note.startswith("failed") else None


def result(verdict: gpu_probe.Verdict, at: Any) -> tuple[bool, str]:
    """(passed, the message recorded on the node): failed when any finding is fatal."""
    fatal = [f for f in verdict.findings if f.level == "fatal"]
    warnings = [f for f in verdict.findings if f.level == "warning"]
    if fatal:
        return False, (f"failed {stamp(at)}: " + "; ".join(str(f) for f in fatal))[:MAX_MESSAGE]
    tail = f" with warnings: {'; '.join(str(f) for f in warnings)}" if warnings else ""
    return True, f"passed {stamp(at)}{tail}"[:MAX_MESSAGE]


def record(node_name: str, passed: bool, message: str, at: Any, kube: Any) -> None:
    """The annotation and the Event, on the test's own node."""
    node = kube.node(node_name)
    log.warning("%s: %s", node_name, message)
    kube.patch_node(node_name, result_patch(node, message))
    type_, reason = ("Normal", "GpuTestPassed") if passed else ("Warning", "GpuTestFailed")
    kube.create_event(event(node, COMPONENT, type_, reason, message, at))


def main(argv: list[str] | None = None) -> int:
    # a one-shot: the metrics port of the shared options is never opened (0); results are the
    # annotation, the Event and the Job's status, which the health agent and kube-state-metrics export
    p = agent_parser("gpu_test", (__doc__ or "").splitlines()[0], metrics_port=0)
    add_burn_option(p)
    args = p.parse_args(argv)
    check_agent_args(p, args)
    log_to_stderr(COMPONENT)
    try:
        probe = node_probe(args, log)
        kube = Kube(args.kubeconfig)
    except gpu_probe.ReadingError as e:
        print(f"{COMPONENT}: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a config the client cannot load
        print(f"{COMPONENT}: cannot load the Kubernetes client's config: {e}", file=sys.stderr)
        return 2
    try:
        verdict = probe()  # once: a retry below never burns the GPUs again
    except gpu_probe.ReadingError as e:
        print(f"{COMPONENT}: {e}", file=sys.stderr)
        return 2
    at = now()
    passed, message = result(verdict, at)
    if args.dry_run:
        log.warning("dry-run: would record on %s: %s", args.node, message)
        return 0 if passed else 1
    delay, attempts = 1.0, 5
    for attempt in range(1, attempts + 1):
        try:
            record(args.node, passed, message, at, kube)
            return 0 if passed else 1
        except Exception as e:
            if not unreachable(e):
                raise
            log.warning("API server not reachable (attempt %d of %d): %s", attempt, attempts, e)
            if attempt < attempts:
                time.sleep(delay)
                delay = min(delay * 2, args.max_backoff)
    print(
        f"{COMPONENT}: the API server was not reachable in {attempts} attempts; the result ({message}) "
        "was not recorded",
        file=sys.stderr,
    )
    return 3


if __name__ == "__main__":
    sys.exit(main())
