"""What the node-health objects share: their names, the agents' RBAC rules, the host paths the health
agent watches, the component's arguments."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from modules.common import require
from superkube.agents import AGENTS_IMAGE, GPU_TESTS_IMAGE, scale_governor
from superkube.agents.host_checks import MIN_PEERS
from superkube.cluster import health
from superkube.cluster.kube import NODE_HEALTH_COMPONENT
from superkube.model.spec import NodePool as PoolSpec
from superkube.model.vmsizes import VmSize

COMPONENT = NODE_HEALTH_COMPONENT
HEALTH = health.HEALTH_AGENT
PREFLIGHT = health.PREFLIGHT_AGENT
THRESHOLDS_NAME = "superkube-gpu-health"
THRESHOLDS_DIR = "/etc/superkube"
GPU_TEST = health.GPU_TEST
FENCE = "superkube-preflight-own-node"
GPU_TEST_FENCE = "superkube-gpu-test-own-node"
HEALTH_FENCE = "superkube-node-health-own-node"
HEALTH_CONTROLLER = health.HEALTH_CONTROLLER
CONTROLLER_FENCE = "superkube-node-health-controller-nodes"
HEALTH_EVICTION_FENCE = "superkube-node-health-evictions"
REMEDIATION_FENCE_NAME = "superkube-remediation-nodes"
LEDGER_NAMESPACE = scale_governor.NAMESPACE  # remediation's ledger, beside the autoscaler's lease it leads by
GPU_RESET = "superkube-gpu-reset"
GPU_RESET_FENCE = "superkube-gpu-reset-own-node"
# where health may never evict: the control plane's add-ons and superkube's own pods
PROTECTED_NAMESPACES = health.PROTECTED_NAMESPACES
Agent = Literal["health", "preflight"]
Fenced = Literal["preflight", "gpu-test", "health", "health-controller", "remediation", "gpu-reset"]
SCALE_UP_DELAY = "cluster-autoscaler.kubernetes.io/pod-scale-up-delay"
# a writable /tmp for the GPU tests under a read-only root (CUDA and PyTorch keep caches there)
SCRATCH = {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}
SCRATCH_MOUNT = {"name": "scratch", "mountPath": "/tmp"}
# what the active check needs (PyTorch and CUDA on every GPU, pinned host buffers): preflight and the
# periodic test run the same burn, so they get the same memory; the health agent only reads NVML
BURN_MEMORY = "16Gi"
BURN_CPU = "2"
AGENT_RESOURCES = health.AGENT_RESOURCES
# the host as the health agent sees it (read-only): an empty directory on each filesystem it watches,
# and the kernel log's directory
HEALTH_FS_DIR = health.HEALTH_FS_DIR
KUBELET_DIR = "/var/lib/kubelet"  # the kubelet role's kubelet_state_dir
CONTAINERD_DIR = "/var/lib/containerd"  # containerd's root (the role's config keeps the default)
DATA_DIR = "/var/lib/data"  # the data_disk role's default mount: a pool's data disk, where it has one
WATCHED = "superkube-health"  # the empty directory the agent watches on each of those
FILESYSTEMS = (
    ("root", HEALTH_FS_DIR),
    ("kubelet", f"{KUBELET_DIR}/{WATCHED}"),
    ("containerd", f"{CONTAINERD_DIR}/{WATCHED}"),
    ("data", f"{DATA_DIR}/{WATCHED}"),
)
"""(name, host directory) of each filesystem the health agent watches, root first: one on the same
filesystem as a name before it (no disk of its own there) is watched once, under that name."""
HOST_FS_DIR = "/host/fs"
HOST_FS = f"{HOST_FS_DIR}/root"
HOST_LOG = "/host/log"
ADM_GID = 4  # the group that reads the system's logs on Ubuntu and Debian (the kernel log's group)
BURN_RESOURCES = {"requests": {"cpu": BURN_CPU, "memory": BURN_MEMORY}, "limits": {"memory": BURN_MEMORY}}


@dataclass(frozen=True, kw_only=True)
class NodeHealthArgs:
    pools: Sequence[tuple[PoolSpec, VmSize]]
    """Every node pool with the facts of its VM size (the GPU count the probe expects; preflight and
    the periodic test only on the GPU pools)."""
    api_address: str = ""
    """HOST:PORT of the API servers' load balancer, which the health agent checks it can reach."""
    scheduled_events: bool = True
    """The health agent reads its VM's scheduled events and approves them once drained."""
    peers: int = 3
    """Nodes of its own pool each health agent reaches each round on their kubelet port (default 3;
    0: none): fatal only when none of them answers for the confirming rounds."""
    remediation: bool = True
    """Remediation's user may read nodes and delete those health cordoned (its host service runs
    where the stack turns it on)."""
    max_cordoned_share: float = 0.05
    """Share of a pool's nodes past preflight health may cordon before the breaker opens."""
    dry_run: bool = False
    """The health controller logs actions instead of taking them (for a first rollout)."""
    interval_seconds: int = 60
    """Seconds between probe rounds (both agents)."""
    image: str = AGENTS_IMAGE
    """The agents' image (default: the one built from this checkout's Dockerfile, pinned)."""
    thresholds: Path = health.THRESHOLDS
    """The thresholds file the ConfigMap is made from."""
    dcgm_url: str = ""
    """The node's dcgm-exporter /metrics, read beside NVML (default: none); `$(NODE_IP)` is the node's address."""
    gpu_tests_image: str = GPU_TESTS_IMAGE
    """The image of preflight and the periodic test, which run the active check on CUDA (default: the
    one built from Dockerfile.gputests, pinned)."""
    burn_seconds: int = 60
    """Seconds of the active check in preflight and each periodic test (default 60; 0: probe only)."""
    test_schedule: str = "17 */6 * * *"
    """Cron schedule of the periodic GPU tests (default every 6 hours; empty: none)."""
    test_nodes: int = 8
    """Idle nodes a periodic run tests per pool, at most (default 8)."""
    test_deadline_seconds: int = 3600
    """How long a periodic run waits for idle nodes before it gives up (default 1 hour)."""

    def __post_init__(self) -> None:
        require(0 < self.max_cordoned_share <= 1, "max_cordoned_share", "must be in (0, 1]")
        require(self.burn_seconds >= 0, "burn_seconds", "must be 0 or more")
        require(self.peers == 0 or self.peers >= MIN_PEERS, "peers", f"must be 0 or at least {MIN_PEERS}")
        require(self.test_nodes >= 1, "test_nodes", "must be at least 1")
        require(
            self.test_deadline_seconds > self.burn_seconds + 60,
            "test_deadline_seconds",
            "must leave the burn and a minute of start-up inside the deadline",
        )
        for pool, vm in self.pools:
            require(
                pool.role != "gpu" or vm.gpus > 0,
                "pools",
                f"{pool.name} is a GPU pool of a size without GPUs",
            )

    @property
    def gpu_pools(self) -> list[tuple[PoolSpec, VmSize]]:
        return [(pool, vm) for pool, vm in self.pools if pool.role == "gpu"]


RULES: dict[Agent, list[dict[str, object]]] = {
    # its own node (a watch by name; the patch fenced in by the admission policy below), and a
    # page of its pool's nodes about hourly, for its peers (list: reads are not fenced)
    "health": [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ],
    # patch, fenced in by the admission policy below: its own node, the preflight taint and label only
    "preflight": [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ],
}
# the controller: follows the GPU nodes, cordons (fenced: only nodes reported fatal) and evicts
CONTROLLER_RULES: list[dict[str, object]] = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]
# its Lease, in its own namespace
CONTROLLER_LEASE_RULES: list[dict[str, object]] = [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
]
# the periodic test records its result on its own node, fenced in like preflight; so does the reset
GPU_TEST_RULES: list[dict[str, object]] = RULES["preflight"]
GPU_RESET_RULES: list[dict[str, object]] = RULES["preflight"]
# the reset's container: root with the node's GPU devices and the driver's nvidia-smi (the NVIDIA
# runtime's utility capability), as a reset needs; the policy allow-list names it with this reason
RESET_SECURITY = {"privileged": True, "runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False,
                  "readOnlyRootFilesystem": True}  # fmt: skip
