"""The GPU reset: once per cordon, on a node health drained for faults a reset may clear.

Some fatal GPU faults are cleared by resetting the GPU rather than by replacing the VM: an
uncorrectable ECC error (Xid 48, 94, 95; the driver's volatile counts start again), a page waiting
for retirement or a row waiting for remapping (Xid 63; both take effect at the reset). The health
agent ends such a verdict with `health.RESET_HINT`; once the controller has drained the node it
labels it `superkube.io/gpu-reset=requested`, and this agent, the pool's reset DaemonSet that selects
that label, does the reset once:

1. it refuses while any process still computes on a GPU (NVML's running compute processes): a drain
   that left one is not a node to reset;
2. it notes the Xid each GPU last reported through dcgm-exporter, which the exporter keeps reporting
   after the reset (the health agent forgives exactly those, until another Xid takes their place);
3. it resets every GPU of the node (`nvidia-smi --gpu-reset`: NVML has no call for it, and on
   NVSwitch systems the GPUs reset together);
4. it reads the GPUs again through NVML alone (not dcgm-exporter, whose figures lag the reset) and
   judges them with the shipped thresholds.

The outcome goes on its own node, in the annotation `superkube.io/gpu-reset` ("cleared <time>
xids=..." or "failed <time>: <why>"), with an Event. Then it waits: the controller uncordons a
cleared node once its health agent reports it healthy, and leaves a failed one to remediation, which
replaces the VM; either way it removes the label, and the DaemonSet's pod goes with it. An outcome
not older than the node's cordon is never redone, so a pod restarted mid-way does not reset twice.

Its admission policy (`superkube-gpu-reset-own-node`) lets it set that one annotation on its own node
and nothing else. It runs as root with the node's GPU devices (a reset needs both), only on nodes the
controller labelled, which have no workload left.

Run: python -m superkube.agents.gpu_reset --node NODE --vm-size SIZE --expected-gpus N [--dcgm-url URL]
"""

from __future__ import annotations

import argparse
import logging
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from superkube.agents import gpu_probe
from superkube.agents.kubeapi import (
    MAX_MESSAGE,
    agent_parser,
    check_agent_args,
    connect,
    event,
    log_to_stderr,
    now,
    serve,
    stamp,
)
from superkube.cluster import health
from superkube.cluster.kube import NODE_AGENTS_METRICS_PORT

COMPONENT = "superkube-gpu-reset"
log = logging.getLogger(COMPONENT)
RESET_TIMEOUT_S = 300.0


class ResetFailed(Exception):
    """The reset could not be done or did not clear the GPUs; the message says why."""


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.resets = Counter(
            "superkube_gpu_reset", "GPU resets done on this node, by outcome.", ["outcome"], registry=r
        )
        self.api_up = Gauge(
            "superkube_gpu_reset_api_up", "1 when the last round reached the API server.", registry=r
        )


def busy(nvml: Any) -> list[str]:
    """'GPU <i>: pid <p>' for every process computing on a GPU of the node."""
    nvml.nvmlInit()
    try:
        out = []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            out += [f"GPU {i}: pid {p.pid}" for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        return out
    finally:
        nvml.nvmlShutdown()


def last_xids(dcgm_url: str, clears: frozenset[int]) -> dict[int, int]:
    """{GPU index: the last Xid dcgm-exporter reports} for the GPUs that reported one; {} without an
    exporter or when it cannot be read (nothing is then forgiven). An Xid a reset does not clear (one
    that came after the node was labelled, say) fails the reset rather than be forgiven."""
    if not dcgm_url:
        return {}
    try:
        samples = gpu_probe.dcgm_samples(gpu_probe.read_dcgm(dcgm_url), dcgm_url)
    except (OSError, gpu_probe.ReadingError) as exc:
        log.warning("dcgm-exporter not read (%s): no Xid will be forgiven", exc)
        return {}
    last = {i: int(got[gpu_probe.DCGM_XID]) for i, got in samples.items() if got.get(gpu_probe.DCGM_XID)}
    kept = [f"Xid {xid} on GPU {i}" for i, xid in sorted(last.items()) if xid not in clears]
    if kept:
        raise ResetFailed(f"{', '.join(kept)}: not a fault a reset clears (gpu_health.yaml reset_clears)")
    return last


def due(node: Mapping[str, Any]) -> bool:
    """The controller asked for a reset of this node and none was done since its cordon."""
    meta = node.get("metadata") or {}
    notes = meta.get("annotations") or {}
    if (meta.get("labels") or {}).get(health.GPU_RESET_LABEL) != health.RESET_REQUESTED:
        return False
    if not ((node.get("spec") or {}).get("unschedulable") and health.CORDONED in notes):
        return False  # only a node health cordoned (and so drained) is reset
    outcome, at, _ = health.reset_outcome(notes.get(health.GPU_RESET, ""))
    return not outcome or at < notes.get(health.CORDONED_AT, "")


@dataclass
class Reset:
    node: str
    kube: Any  # Kube, or anything with node, patch_node and create_event
    reprobe: Callable[[], gpu_probe.Verdict]
    """the GPUs read again after the reset: NVML alone, judged by the thresholds"""
    nvml: Any  # the pynvml module (a stand-in in tests)
    dcgm_url: str = ""
    nvidia_smi: str = "nvidia-smi"
    metrics: Metrics = field(default_factory=Metrics)
    clears: frozenset[int] = field(default_factory=lambda: frozenset(gpu_probe.thresholds().reset_clears.xid))
    """the Xids a reset clears (the thresholds' reset_clears)"""

    def reset(self) -> str:
        """Reset the node's GPUs once; the outcome annotation's value. Raises ResetFailed."""
        try:
            in_use = busy(self.nvml)
        except self.nvml.NVMLError as exc:
            raise ResetFailed(f"NVML could not list the GPUs' processes: {exc}") from None
        if in_use:
            raise ResetFailed(f"GPUs still in use, not reset: {', '.join(in_use)}"[:200])
        forgiven = last_xids(self.dcgm_url, self.clears)
        try:
            done = subprocess.run(
                [self.nvidia_smi, "--gpu-reset"], capture_output=True, text=True, timeout=RESET_TIMEOUT_S
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ResetFailed(f"{self.nvidia_smi} --gpu-reset: {exc}") from None
        if done.returncode != 0:
            said = (done.stdout + done.stderr).strip().splitlines()
            raise ResetFailed(
                f"{self.nvidia_smi} --gpu-reset exited {done.returncode}: {said[-1] if said else 'no output'}"
            )
        try:
            after = self.reprobe()
        except (self.nvml.NVMLError, gpu_probe.ReadingError) as exc:
            raise ResetFailed(f"the GPUs could not be read after the reset: {exc}") from None
        if after.level == "fatal":
            reasons = "; ".join(str(f) for f in after.findings if f.level == "fatal")
            raise ResetFailed(f"still fatal after the reset: {reasons}")
        pairs = ",".join(f"{gpu}:{xid}" for gpu, xid in sorted(forgiven.items()))
        return f"cleared {stamp(now())}" + (f" xids={pairs}" if pairs else "")

    def round(self) -> bool:
        """Reset if due, and record the outcome; never returns True (the pod stays until the
        controller removes the node's label)."""
        node = self.kube.node(self.node)
        self.metrics.api_up.set(1)
        if not due(node):
            return False
        log.warning("resetting the GPUs of %s: %s", self.node,
                    ((node["metadata"].get("annotations") or {}).get(health.VERDICT, "")))  # fmt: skip
        try:
            value = self.reset()
            outcome, type_, reason = "cleared", "Normal", "GPUResetCleared"
        except ResetFailed as exc:
            value = f"failed {stamp(now())}: {exc}"[:MAX_MESSAGE]
            outcome, type_, reason = "failed", "Warning", "GPUResetFailed"
        (log.warning if outcome == "cleared" else log.error)("%s: %s", self.node, value)
        self.kube.patch_node(self.node, {"metadata": {"annotations": {health.GPU_RESET: value}}})
        self.metrics.resets.labels(outcome).inc()
        self.kube.create_event(event(node, COMPONENT, type_, reason, value, now()))
        return False


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = agent_parser("gpu_reset", (__doc__ or "").splitlines()[0], NODE_AGENTS_METRICS_PORT)
    p.add_argument("--nvidia-smi", default="nvidia-smi", help="the nvidia-smi that resets the GPUs")
    args = p.parse_args(argv)
    check_agent_args(p, args)
    if args.reading is not None:
        p.error("--reading: a reset is judged on the GPUs as NVML reads them after it, never on a file")
    if shutil.which(args.nvidia_smi) is None:
        p.error(
            f"--nvidia-smi {args.nvidia_smi}: not found; the NVIDIA runtime mounts it with the utility capability"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    import pynvml

    args = _args(argv)
    log_to_stderr(COMPONENT)
    try:
        limits = gpu_probe.thresholds(args.thresholds or gpu_probe.THRESHOLDS)
    except gpu_probe.ReadingError as exc:
        print(f"{COMPONENT}: {exc}", file=sys.stderr)
        return 2
    metrics = Metrics()
    kube = connect(COMPONENT, args, metrics.registry)
    if kube is None:
        return 2

    def reprobe() -> gpu_probe.Verdict:
        return gpu_probe.verdict(gpu_probe.read_nvml(args.node, args.vm_size, args.expected_gpus), limits)

    clears = frozenset(limits.reset_clears.xid)
    reset = Reset(args.node, kube, reprobe, pynvml, args.dcgm_url, args.nvidia_smi, metrics, clears)
    serve(reset.round, metrics.api_up, log, args.interval, args.max_backoff, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
