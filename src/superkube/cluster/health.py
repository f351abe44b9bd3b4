"""What health writes on a node, named once: the node agents (superkube.agents.node_health), the
controller that cordons, remediation on the API-server hosts (whose settings carry these) and the
layer's admission fences all read them from here."""

from __future__ import annotations

from pathlib import Path

from superkube.cluster.kube import SYSTEM_NAMESPACE

CORDONED = "superkube.io/health-cordoned"
"""The reason health cordoned the node; marks the nodes health cordoned."""
CORDONED_AT = "superkube.io/health-cordoned-at"
VERDICT = "superkube.io/health-verdict"
"""The node's agent's last verdict, with its reasons."""
VERDICT_AT = "superkube.io/health-verdict-at"
DRAINED_AT = "superkube.io/health-drained-at"
"""The controller: every pod a drain moves is gone from the node it cordoned."""
CORDON_KIND = "superkube.io/health-cordon-kind"
"""Why health cordoned the node: FAILURE (remediation's to replace once drained) or MAINTENANCE
(Azure's scheduled event: never replaced, uncordoned once the event is over). A cordon without it
is a failure's (cordons made before the kind was written)."""
FAILURE = "failure"
MAINTENANCE = "maintenance"
MAINTENANCE_AT = "superkube.io/health-maintenance-at"
"""The agent, beside a maintenance verdict: the earliest NotBefore of the events it is for (a stamp),
or "started". The controller names the pods still on the node as that time comes."""
REMEDIATION_REQUESTED_AT = "superkube.io/remediation-requested-at"
"""Remediation asked Azure to delete the node's VM."""
GPU_TEST_RESULT = "superkube.io/gpu-test-result"
"""The periodic GPU test's last result on its node (the only annotation the test may set)."""
PROTECTED_NAMESPACES = ("kube-system", SYSTEM_NAMESPACE)
"""Never drained by health, and its eviction policy refuses them: the cluster's add-ons and
superkube's own pods (agents, balloons), which a node's drain does not need moved."""
THRESHOLDS = Path(__file__).resolve().parents[1] / "data" / "gpu_health.yaml"
"""The GPU probe's thresholds: the agents read them, the layer ships them as a ConfigMap."""
HEALTH_FS_DIR = "/var/lib/superkube/health"
"""An empty directory on a node's root filesystem: the health agent watches its filesystem (fullness,
read-only flag) through a read-only mount, and the lab's disk-full fault fills it."""
GPU_RESET = "superkube.io/gpu-reset"
"""The GPU reset's outcome on its node, written by the reset agent (superkube.agents.gpu_reset) and
nothing else: "cleared <time> xids=<gpu>:<xid>,..." (the Xids dcgm-exporter still reports from before
the reset, which the health agent then forgives) or "failed <time>: <why>". Both are history once
the node is cordoned again: an outcome counts only when it is not older than the cordon."""
GPU_RESET_LABEL = "superkube.io/gpu-reset"
"""The label the health controller puts on a drained node to have its GPUs reset once (the value is
RESET_REQUESTED); the pool's reset DaemonSet selects it. The controller removes it when it is done."""
RESET_REQUESTED = "requested"
RESET_HINT = " [a GPU reset may clear this]"
"""Ends a fatal verdict whose every fatal finding a GPU reset may clear: the controller tries one
reset before the node is given up, and remediation waits for it."""
RESET_WAIT_S = 3600.0
"""How long remediation waits for a reset that was asked for (from the drain) or that cleared the
GPUs (from then: the controller uncordons once the agent reports the node healthy) before it deletes
the VM all the same."""


def reset_outcome(value: str) -> tuple[str, str, dict[int, int]]:
    """(outcome "cleared" or "failed", its time, {GPU index: Xid forgiven}) of a GPU_RESET annotation;
    ("", "", {}) when it is none of those."""
    word, _, rest = (value or "").partition(" ")
    if word not in ("cleared", "failed") or len(rest) < 20:
        return "", "", {}
    at, forgiven = rest[:20], {}
    if word == "cleared":
        for part in rest[20:].split():
            if part.startswith("xids="):
                for pair in part[5:].split(","):
                    gpu, _, xid = pair.partition(":")
                    if gpu.isdigit() and xid.isdigit():
                        forgiven[int(gpu)] = int(xid)
    return word, at, forgiven


def may_cordon(cordoned: int, eligible: int, share: float) -> bool:
    """The breaker: may one more of a pool's `eligible` nodes (past preflight) be cordoned for a failure,
    with `cordoned` already? Always the first (a pool of 1 to 19 nodes at 5 % would otherwise never
    lose a broken node), then while the share stays within `share`."""
    return cordoned == 0 or (cordoned + 1) <= share * eligible + 1e-9


def breaker_open(cordoned: int, eligible: int, share: float) -> bool:
    """Past the breaker: more of the pool cordoned for failures than `may_cordon` would have let in."""
    return cordoned > max(1, int(share * eligible + 1e-9))


# The in-cluster layer's health objects by name (modules.platform.node_health makes them; the lab
# changes some of them for what it lacks, superkube.lab.agent_pods)
HEALTH_AGENT = "superkube-node-health"
"""The health agent's DaemonSets: one per pool, `<this>-<pool>`."""
PREFLIGHT_AGENT = "superkube-preflight"
"""Preflight's DaemonSets: one per GPU pool, `<this>-<pool>`."""
GPU_TEST = "superkube-gpu-test"
"""The periodic GPU test's CronJobs: one per GPU pool, `<this>-<pool>`."""
HEALTH_CONTROLLER = "superkube-node-health-controller"
"""The health controller's Deployment."""
AGENT_RESOURCES = {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}}
"""What the health agent asks for on every node (preflight's burn asks for more)."""
