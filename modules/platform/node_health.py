"""GPU node lifecycle in the cluster: the preflight agent on nodes still behind the preflight taint,
the health agent on every GPU node, their RBAC, the policy that fences the preflight agent in, and
the thresholds both read.

Both agents run one DaemonSet per GPU pool (the pool's VM facts tell the probe how many GPUs to
expect), on the host network so Prometheus's `node-agents` job finds them at the node's address, and
see the GPUs through the NVIDIA runtime without requesting any (NVIDIA_VISIBLE_DEVICES=all). Their
thresholds are a ConfigMap made from src/superkube/data/gpu_health.yaml, so a threshold change is a reviewed
`pulumi up` like any other.

- preflight (superkube.agents.preflight): only on nodes labelled superkube.io/preflight=pending;
  removes that taint and label from its own node once the GPUs pass. The ValidatingAdmissionPolicy
  `superkube-preflight-own-node` rejects anything else its service account tries on a node.
- health (superkube.agents.node_health), on every node of every pool (a CPU pool's without NVML):
  writes its node's verdict on its own Node (a watch on that one object;
  `superkube-node-health-own-node` lets it set its own annotations there and nothing else). Beside
  the GPUs it checks the host, with read-only access to exactly what those checks read: an empty
  directory on each filesystem the node keeps state on (FILESYSTEMS: root, the kubelet's,
  containerd's and a data disk's; its fullness and read-only flag, followed into the agent as the
  host mounts change; one that is no filesystem of its own is judged once, as the one it is on),
  and the directory of the node's kernel log (KERNEL_LOG_DIR, kernel messages only, for I/O
  errors). On the host network it also asks the kubelet's and containerd's loopback endpoints
  whether they answer, opens a TCP connection to the API servers' load balancer and to the kubelet
  port of a few peers of its pool (`peers`; learnt from one label-selected list with a limit, about
  hourly), reads the routing table and its VM's scheduled events from the instance metadata.
- the health controller (superkube.agents.health_controller, a Deployment of two, one leading by a
  Lease): follows the GPU nodes with one watch, cordons the nodes reported fatal (behind the breaker
  per pool) or under Azure's maintenance (past it) and evicts their pods through the Eviction API;
  fenced by `superkube-node-health-controller-nodes` (only nodes reported fatal or under
  maintenance; cordon, and uncordon only after a GPU reset or a maintenance is over) and
  `superkube-node-health-evictions` (workload namespaces only). Fleet-wide facts live there, not in
  a DaemonSet: no node agent reads the fleet (the health agent lists at most a page of its own
  pool, about hourly, for its peers).
- the GPU reset (superkube.agents.gpu_reset, a DaemonSet per GPU pool whose pods run only on nodes
  the controller labelled `superkube.io/gpu-reset=requested`): resets a drained node's GPUs once when
  every fatal finding is one a reset may clear, and records the outcome on its own node; the one
  privileged container of the layer, fenced by `superkube-gpu-reset-own-node`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pulumi

from modules.common import require
from modules.platform import objects
from modules.platform.balloons import tolerations as pool_tolerations
from modules.platform.foundation import GPU_TEST_PRIORITY, NAMESPACE, NODE_AGENT_PRIORITY
from modules.platform.objects import Manifest
from superkube.agents import AGENTS_IMAGE, GPU_TESTS_IMAGE, scale_governor
from superkube.agents.host_checks import MIN_PEERS
from superkube.cluster import autoscaling, health, remediation
from superkube.cluster.cloudinit import POOL_LABEL, PREFLIGHT_PENDING
from superkube.cluster.kube import (
    CONTAINERD_METRICS_PORT,
    IMDS,
    KERNEL_LOG,
    KERNEL_LOG_DIR,
    KUBELET_HEALTHZ_PORT,
    NODE_AGENTS_METRICS_PORT,
    NODE_HEALTH_COMPONENT,
    PREFLIGHT_METRICS_PORT,
)
from superkube.model.spec import PREFLIGHT_RESULT_ANNOTATION, PREFLIGHT_TAINT_KEY
from superkube.model.spec import NodePool as PoolSpec
from superkube.model.vmsizes import GPU_RESOURCE, VmSize

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


def _or_empty(path: str, empty: str) -> str:
    return f"(has({path}) ? {path} : {empty})"


@dataclass(frozen=True)
class Fence:
    policy: str
    account: str
    who: str
    removable: str | None
    """the taint and label it may remove (preflight's own), if any"""
    annotations: tuple[str, ...]
    """the annotations it may set"""
    may_cordon: bool = False
    """it may cordon (never uncordon) its node"""
    own_node: bool = True
    """only the node its pod runs on (by its token's node name)"""
    only_if: tuple[str, str] = ("", "")
    """a further condition on the node before the change (CEL over oldObject), and its message"""
    label: str | None = None
    """a label it may add (with the value RESET_REQUESTED) or remove, and no other"""
    uncordon_if: str = ""
    """CEL over oldObject under which it may uncordon (a cordoner only); its own annotations may then
    go in the same request"""
    extra: tuple[tuple[str, str], ...] = ()
    """further rules: (CEL over oldObject and object, what it may not do)"""
    drops_own: bool = False
    """it may take its own annotations away (the health agent: the maintenance's start, once over)"""


def _note(key: str) -> str:
    """CEL: the old node's annotation `key` ('' when it has none)."""
    notes = "oldObject.metadata.annotations"
    return f"((has({notes}) && '{key}' in {notes}) ? {notes}['{key}'] : '')"


def _reset_since_cordon(outcome: str) -> str:
    """CEL: the node's GPU reset ended in `outcome` (cleared, failed) no earlier than its cordon: an
    outcome from before the cordon is history (the time follows "<outcome> ", 20 characters)."""
    value, start = _note(health.GPU_RESET), len(outcome) + 1
    return (
        f"({value}.startsWith('{outcome} ') && {value}.size() >= {start + 20} && "
        f"{value}.substring({start}, {start + 20}) >= {_note(health.CORDONED_AT)})"
    )


RESET_CLEARED = _reset_since_cordon("cleared")
RESET_FAILED = _reset_since_cordon("failed")
CORDONED = "(has(object.spec.unschedulable) && object.spec.unschedulable)"
WAS_CORDONED = "(has(oldObject.spec.unschedulable) && oldObject.spec.unschedulable)"
REPORTED_FATAL = f"{_note(health.VERDICT)}.startsWith('fatal')"
REPORTED_MAINTENANCE = f"{_note(health.VERDICT)}.startsWith('{health.MAINTENANCE}')"
FOR_MAINTENANCE = f"({_note(health.CORDON_KIND)} == '{health.MAINTENANCE}' && {WAS_CORDONED})"
"""CEL: the node's cordon by health is maintenance's (Azure's scheduled event), not a failure's"""
MAINTENANCE_OVER = (
    f"({FOR_MAINTENANCE} && !{REPORTED_FATAL} && !{REPORTED_MAINTENANCE} && "
    f"{_note(health.VERDICT_AT)} >= {_note(health.CORDONED_AT)})"
)
"""CEL: a node cordoned for maintenance whose agent, since the cordon, reports neither maintenance
nor a failure: the event is over, and the controller may uncordon it"""


def _labelled(obj: str) -> str:
    """CEL: `obj` (object, oldObject) carries the reset label with the value that asks for a reset."""
    labels = f"{obj}.metadata.labels"
    key = health.GPU_RESET_LABEL
    return f"(has({labels}) && '{key}' in {labels} && {labels}['{key}'] == '{health.RESET_REQUESTED}')"


def _new_note(key: str) -> str:
    notes = "object.metadata.annotations"
    return f"((has({notes}) && '{key}' in {notes}) ? {notes}['{key}'] : '')"


DRAINED_SINCE_CORDON = (
    f"({_note(health.DRAINED_AT)} != '' && {_note(health.DRAINED_AT)} >= {_note(health.CORDONED_AT)})"
)
CONTROLLER_RULES_EXTRA = (
    (
        # the cordon's time is what a reset's outcome is measured against: set only by the cordon
        f"{_new_note(health.CORDONED_AT)} == {_note(health.CORDONED_AT)} || "
        f"(!{WAS_CORDONED} && {CORDONED}) || ({WAS_CORDONED} && !{CORDONED})",
        "may set the cordon's time only in the request that cordons",
    ),
    (
        # a failure's cordon is never made maintenance's (whose node it may uncordon) but by a cordon
        f"{_new_note(health.CORDON_KIND)} == {_note(health.CORDON_KIND)} || "
        f"{_new_note(health.CORDON_KIND)} == '{health.FAILURE}' || "
        f"(!{WAS_CORDONED} && {CORDONED}) || ({WAS_CORDONED} && !{CORDONED})",
        "may make a cordon maintenance's only in the request that cordons",
    ),
    (
        # a reset is asked for once per cordon: of a node it cordoned and drained, reported fatal,
        # whose reset has not ended since the cordon
        f"!(!{_labelled('oldObject')} && {_labelled('object')}) || ({WAS_CORDONED} && {CORDONED} && "
        f"{REPORTED_FATAL} && {DRAINED_SINCE_CORDON} && !{RESET_CLEARED} && !{RESET_FAILED})",
        "may label for a reset only a cordoned, drained node reported fatal whose reset has not ended since",
    ),
)


FENCES: dict[Fenced, Fence] = {
    "preflight": Fence(
        FENCE, PREFLIGHT, "the preflight agent", PREFLIGHT_TAINT_KEY, (PREFLIGHT_RESULT_ANNOTATION,)
    ),
    "gpu-test": Fence(GPU_TEST_FENCE, GPU_TEST, "the periodic GPU test", None, (health.GPU_TEST_RESULT,)),
    "health": Fence(
        HEALTH_FENCE,
        HEALTH,
        "the health agent",
        None,
        (health.VERDICT, health.VERDICT_AT, health.MAINTENANCE_AT),
        drops_own=True,
    ),
    "remediation": Fence(
        REMEDIATION_FENCE_NAME,
        remediation.USER,
        "remediation",
        None,
        (health.REMEDIATION_REQUESTED_AT,),
        own_node=False,
        only_if=(
            f"has(oldObject.metadata.annotations) && '{health.CORDONED}' in oldObject.metadata.annotations "
            f"&& !{FOR_MAINTENANCE}",
            "may change only a node health cordoned for a failure",
        ),
    ),
    "health-controller": Fence(
        CONTROLLER_FENCE,
        HEALTH_CONTROLLER,
        "the health controller",
        None,
        (health.CORDONED, health.CORDONED_AT, health.DRAINED_AT, health.CORDON_KIND),
        may_cordon=True,
        own_node=False,
        only_if=(
            f"{REPORTED_FATAL} || {REPORTED_MAINTENANCE} || {FOR_MAINTENANCE} || {RESET_CLEARED} || "
            f"{RESET_FAILED}",
            "may change only a node its health agent reported fatal or under maintenance, one cordoned "
            "for maintenance, or one whose GPU reset since its cordon has ended",
        ),
        label=health.GPU_RESET_LABEL,
        # the reset it asked for (the label is still there) cleared the GPUs since the cordon, and the
        # agent no longer reports the node fatal; or the maintenance it was cordoned for is over
        uncordon_if=f"({_labelled('oldObject')} && {RESET_CLEARED} && !{REPORTED_FATAL} && !{REPORTED_MAINTENANCE}) "
        f"|| {MAINTENANCE_OVER}",
        extra=CONTROLLER_RULES_EXTRA,
    ),
    "gpu-reset": Fence(
        GPU_RESET_FENCE,
        GPU_RESET,
        "the GPU reset",
        None,
        (health.GPU_RESET,),
        only_if=(
            f"has(oldObject.metadata.labels) && '{health.GPU_RESET_LABEL}' in oldObject.metadata.labels && "
            f"oldObject.metadata.labels['{health.GPU_RESET_LABEL}'] == '{health.RESET_REQUESTED}'",
            "may change only a node the health controller labelled for a reset",
        ),
    ),
}


def fence_validations(agent: Fenced = "preflight") -> list[dict[str, str]]:
    """CEL over the node before (oldObject) and after (object) the agent's change: its own node, no
    taint or label change but removing the one it may remove, no annotation but its own, no uncordon
    (and no cordon but by the health agent)."""
    f = FENCES[agent]
    removable, who = f.removable, f.who
    taints, old_taints = _or_empty("object.spec.taints", "[]"), _or_empty("oldObject.spec.taints", "[]")
    labels, old_labels = (
        _or_empty("object.metadata.labels", "{}"),
        _or_empty("oldObject.metadata.labels", "{}"),
    )
    notes, old_notes = (
        _or_empty("object.metadata.annotations", "{}"),
        _or_empty("oldObject.metadata.annotations", "{}"),
    )
    may_drop_taint = f"t.key == '{removable}' || " if removable else ""
    may_drop_label = f"k == '{removable}' || " if removable else ""
    taint_rule = f"may only remove the {removable} taint" if removable else "may not change taints"
    label_rule = f"may only remove the {removable} label" if removable else "may not change labels"
    may_set_label = ""
    if f.label:
        may_drop_label += f"k == '{f.label}' || "
        may_set_label = f"(k == '{f.label}' && {labels}[k] == '{health.RESET_REQUESTED}') || "
        label_rule = f"may only set the {f.label} label to {health.RESET_REQUESTED} or remove it"
    own = " || ".join(f"k == '{a}'" for a in f.annotations)
    cordoned, was_cordoned = CORDONED, WAS_CORDONED
    # its own annotations may go only with the uncordon it may make
    may_drop_note = f"(({own}) && {was_cordoned} && !{cordoned}) || " if f.uncordon_if else ""
    if f.drops_own:
        may_drop_note = f"({own}) || "
    own_node = {
        "expression": "'authentication.kubernetes.io/node-name' in request.userInfo.extra && "
        "request.userInfo.extra['authentication.kubernetes.io/node-name'] == [object.metadata.name]",
        "message": f"{who} may change only the node its pod runs on",
    }
    condition, why = f.only_if
    rules = [
        *([own_node] if f.own_node else []),
        *([{"expression": condition, "message": f"{who} {why}"}] if condition else []),
        {
            "expression": f"{taints}.all(t, t in {old_taints}) && "
            f"{old_taints}.all(t, {may_drop_taint}t in {taints})",
            "message": f"{who} {taint_rule}",
        },
        {
            "expression": f"{labels}.all(k, {may_set_label}(k in {old_labels} && {old_labels}[k] == {labels}[k])) && "
            f"{old_labels}.all(k, {may_drop_label}k in {labels})",
            "message": f"{who} {label_rule}",
        },
        {
            "expression": f"{notes}.all(k, {own} || (k in {old_notes} && {old_notes}[k] == {notes}[k])) "
            f"&& {old_notes}.all(k, {may_drop_note}k in {notes})",
            "message": f"{who} may only set the {' and '.join(f.annotations)} annotation"
            + ("s" if len(f.annotations) > 1 else ""),
        },
        {
            "expression": " && ".join(
                f"{_or_empty(f'object.metadata.{k}', '[]')} == {_or_empty(f'oldObject.metadata.{k}', '[]')}"
                for k in ("ownerReferences", "finalizers")
            ),
            "message": f"{who} may not change the node's owners or finalizers",
        },
        {
            "expression": (
                f"!{was_cordoned} || {cordoned}" + (f" || ({f.uncordon_if})" if f.uncordon_if else "")
            )
            if f.may_cordon
            else f"{cordoned} == {was_cordoned}",
            "message": (
                f"{who} may cordon, and uncordon only a node whose GPU reset cleared it since its cordon "
                "or whose maintenance is over"
                if f.uncordon_if
                else f"{who} may cordon but never uncordon"
            )
            if f.may_cordon
            else f"{who} may not cordon or uncordon",
        },
        *({"expression": expression, "message": f"{who} {why}"} for expression, why in f.extra),
    ]
    # a denial is 403 Forbidden, as RBAC's would be (a validation's default reason, Invalid, answers 422)
    return [{**rule, "reason": "Forbidden"} for rule in rules]


def _policy(
    name: str, account: str, rule: Manifest, validations: list[dict[str, str]], user: str = ""
) -> list[Manifest]:
    """A ValidatingAdmissionPolicy for one service account's requests (or `user`'s), and its binding."""
    who = user or f"system:serviceaccount:{NAMESPACE}:{account}"
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": objects.meta(name, COMPONENT),
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], **rule}]},
                "matchConditions": [
                    {
                        "name": "its-service-account",
                        "expression": f"request.userInfo.username == '{who}'",
                    }
                ],
                "validations": validations,
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": objects.meta(name, COMPONENT),
            "spec": {"policyName": name, "validationActions": ["Deny"]},
        },
    ]


def eviction_validations() -> list[dict[str, str]]:
    """What an Eviction the health controller creates may be. An Eviction names a pod, not its node,
    so admission cannot hold it to the pods of nodes it cordoned (it lists only those, by field
    selector); it holds it to workload namespaces and to the pod's own grace period."""
    protected = ", ".join(f"'{n}'" for n in PROTECTED_NAMESPACES)
    rules = [
        {
            # the balloons are the exception: placeholders, which a cordoned node would otherwise keep
            "expression": f"!(request.namespace in [{protected}]) || (request.namespace == '{NAMESPACE}' "
            f"&& request.name.startsWith('{autoscaling.BALLOON_PREFIX}'))",
            "message": f"the health controller may not evict pods of {' or '.join(PROTECTED_NAMESPACES)} "
            "but the balloons",
        },
        {
            "expression": "!has(object.deleteOptions) || !has(object.deleteOptions.gracePeriodSeconds) || "
            "object.deleteOptions.gracePeriodSeconds > 0",
            "message": "the health controller may not shorten a pod's grace period to 0",
        },
    ]
    return [{**rule, "reason": "Forbidden"} for rule in rules]


def remediation_access() -> list[Manifest]:
    """Remediation's user (a host service on the API servers, superkube.agents.remediation): read
    nodes, mark one it asked Azure to delete, delete that Node once its VM is gone; fenced to nodes
    health cordoned, and to its one annotation."""
    name = user = remediation.USER
    cordoned = (
        f"has(oldObject.metadata.annotations) && '{health.CORDONED}' in oldObject.metadata.annotations "
        "&& has(oldObject.spec.unschedulable) && oldObject.spec.unschedulable"
    )
    marked = f"'{health.REMEDIATION_REQUESTED_AT}' in oldObject.metadata.annotations"
    updates = fence_validations("remediation")
    deletes = [
        {"expression": f"{cordoned} && {marked}", "reason": "Forbidden",
         "message": "remediation may delete only a node health cordoned whose VM it asked Azure to delete"},
    ]  # fmt: skip
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": objects.meta(name, COMPONENT),
            "rules": remediation.NODE_RULES,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": objects.meta(name, COMPONENT),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
        *_policy(
            REMEDIATION_FENCE_NAME, "", {"operations": ["UPDATE"], "resources": ["nodes"]}, updates, user
        ),
        *_policy(
            f"{REMEDIATION_FENCE_NAME}-delete",
            "",
            {"operations": ["DELETE"], "resources": ["nodes"]},
            deletes,
            user,
        ),
        # its hourly budget, counted in the cluster: one ConfigMap in kube-system, which it may create
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {**objects.meta(name, COMPONENT), "namespace": LEDGER_NAMESPACE},
            "rules": remediation.LEDGER_RULES,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {**objects.meta(name, COMPONENT), "namespace": LEDGER_NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
        *_policy(
            f"{REMEDIATION_FENCE_NAME}-ledger",
            "",
            {"operations": ["CREATE"], "resources": ["configmaps"]},
            [
                {
                    "expression": f"request.namespace == '{LEDGER_NAMESPACE}' && object.metadata.name == "
                    f"'{remediation.LEDGER}'",
                    "reason": "Forbidden",
                    "message": f"remediation may create only its ledger, {LEDGER_NAMESPACE}/{remediation.LEDGER}",
                }
            ],
            user,
        ),
    ]


def fence(agent: Fenced = "preflight") -> list[Manifest]:
    """The admission policies and bindings that hold `agent` to fence_validations (its node updates),
    and the health controller also to eviction_validations."""
    f = FENCES[agent]
    nodes = {"operations": ["UPDATE"], "resources": ["nodes"]}
    out = _policy(f.policy, f.account, nodes, fence_validations(agent))
    if agent == "health-controller":
        evictions = {"operations": ["CREATE"], "resources": ["pods/eviction"]}
        out += _policy(HEALTH_EVICTION_FENCE, f.account, evictions, eviction_validations())
    return out


def daemonset(pool: PoolSpec, vm: VmSize, args: NodeHealthArgs, agent: Agent) -> Manifest:
    base = HEALTH if agent == "health" else PREFLIGHT
    name = f"{base}-{pool.name}"
    port = NODE_AGENTS_METRICS_PORT if agent == "health" else PREFLIGHT_METRICS_PORT
    flags = [
        f"--interval={args.interval_seconds}",
        f"--metrics-port={port}",
        f"--thresholds={THRESHOLDS_DIR}/{args.thresholds.name}",
    ]
    if args.dcgm_url and vm.gpus:
        flags.append(f"--dcgm-url={args.dcgm_url}")
    if agent == "health":
        flags += [
            *(f"--filesystem={name}={HOST_FS_DIR}/{name}" for name, _ in FILESYSTEMS),
            f"--kernel-log={HOST_LOG}/{KERNEL_LOG}",
            f"--kubelet-healthz=http://127.0.0.1:{KUBELET_HEALTHZ_PORT}/healthz",
            f"--runtime-metrics=http://127.0.0.1:{CONTAINERD_METRICS_PORT}/v1/metrics",
            *([f"--api-address={args.api_address}"] if args.api_address else []),
            *([f"--scheduled-events={IMDS}"] if args.scheduled_events else []),
            *([f"--peers={args.peers}"] if args.peers else []),
        ]
    selector = {POOL_LABEL: pool.name}
    if agent == "preflight":
        selector[PREFLIGHT_TAINT_KEY] = PREFLIGHT_PENDING  # the pod goes once the node has passed
        # the active check too: nothing else runs behind the preflight taint, so it has the GPUs
        flags.append(f"--burn-seconds={args.burn_seconds}")
    env = [
        *_node_env(pool, vm),
        {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        {"name": "NODE_POOL", "value": pool.name},
    ]
    if vm.gpus:
        env += [
            # every GPU visible through the NVIDIA runtime, none requested: the health agent only
            # reads them (NVML); preflight also computes on them, behind the taint that keeps jobs away
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {
                "name": "NVIDIA_DRIVER_CAPABILITIES",
                "value": "utility" if agent == "health" else "compute,utility",
            },
        ]
    host_mounts = [
        # HostToContainer: a filesystem mounted (or remounted read-only) there later is seen too
        *(
            {
                "name": f"host-fs-{name}",
                "mountPath": f"{HOST_FS_DIR}/{name}",
                "readOnly": True,
                "mountPropagation": "HostToContainer",
            }
            for name, _ in FILESYSTEMS
        ),
        {"name": "host-kernel-log", "mountPath": HOST_LOG, "readOnly": True},
    ]
    host_volumes = [
        *(
            {"name": f"host-fs-{name}", "hostPath": {"path": path, "type": "DirectoryOrCreate"}}
            for name, path in FILESYSTEMS
        ),
        {"name": "host-kernel-log", "hostPath": {"path": KERNEL_LOG_DIR, "type": "DirectoryOrCreate"}},
    ]
    container = {
        "name": "agent",
        "image": args.image if agent == "health" else args.gpu_tests_image,
        "command": [
            "python",
            "-m",
            f"superkube.agents.{'node_health' if agent == 'health' else 'preflight'}",
            *flags,
        ],
        "env": env,
        "ports": [{"name": "metrics", "containerPort": port, "hostPort": port}],
        "resources": AGENT_RESOURCES if agent == "health" else BURN_RESOURCES,
        "livenessProbe": {
            "httpGet": {"path": "/metrics", "port": port},
            "periodSeconds": 30,
            "failureThreshold": 4,
        },
        "volumeMounts": [
            {"name": "thresholds", "mountPath": THRESHOLDS_DIR, "readOnly": True},
            *([SCRATCH_MOUNT] if agent == "preflight" else host_mounts),
        ],
        "securityContext": objects.restricted(),
    }
    pod = {
        "serviceAccountName": base,
        "priorityClassName": NODE_AGENT_PRIORITY,
        **({"securityContext": {"supplementalGroups": [ADM_GID]}} if agent == "health" else {}),
        "hostNetwork": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
        "nodeSelector": selector,
        # on every node it selects: behind the preflight taint, cordoned, or tainted by its pool
        "tolerations": [{"operator": "Exists"}],
        "containers": [container],
        "volumes": [
            {"name": "thresholds", "configMap": {"name": THRESHOLDS_NAME}},
            *([SCRATCH] if agent == "preflight" else host_volumes),
        ],
    }
    return objects.daemonset(name, COMPONENT, NAMESPACE, pod)


def reset_daemonset(pool: PoolSpec, vm: VmSize, args: NodeHealthArgs) -> Manifest:
    """The pool's GPU reset (superkube.agents.gpu_reset): a pod only on the nodes the health controller
    labelled for a reset (drained, every fatal finding one a reset may clear), gone once it removes the
    label. Not on the host network: it reaches only the API server, and serves its outcomes' counter on
    its pod's `metrics` port, where the node-agents scrape job finds it by pod discovery."""
    flags = [
        f"--interval={min(args.interval_seconds, 30)}",
        f"--thresholds={THRESHOLDS_DIR}/{args.thresholds.name}",
        *([f"--dcgm-url={args.dcgm_url}"] if args.dcgm_url else []),
    ]
    container = {
        "name": "reset",
        "image": args.image,
        "command": ["python", "-m", "superkube.agents.gpu_reset", *flags],
        "env": [
            *_node_env(pool, vm),
            {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
        ],
        "ports": [{"name": "metrics", "containerPort": NODE_AGENTS_METRICS_PORT}],
        "resources": AGENT_RESOURCES,
        "volumeMounts": [{"name": "thresholds", "mountPath": THRESHOLDS_DIR, "readOnly": True}],
        "securityContext": RESET_SECURITY,
    }
    pod = {
        "serviceAccountName": GPU_RESET,
        "priorityClassName": NODE_AGENT_PRIORITY,
        "nodeSelector": {POOL_LABEL: pool.name, health.GPU_RESET_LABEL: health.RESET_REQUESTED},
        "tolerations": [{"operator": "Exists"}],  # the node is cordoned, and may carry its pool's taints
        "containers": [container],
        "volumes": [{"name": "thresholds", "configMap": {"name": THRESHOLDS_NAME}}],
    }
    return objects.daemonset(f"{GPU_RESET}-{pool.name}", COMPONENT, NAMESPACE, pod)


def _node_env(pool: PoolSpec, vm: VmSize) -> list[Manifest]:
    return [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "VM_SIZE", "value": vm.name},
        {"name": "EXPECTED_GPUS", "value": str(vm.gpus)},
        {"name": "HOME", "value": "/tmp"},
    ]


def periodic_test(pool: PoolSpec, vm: VmSize, args: NodeHealthArgs) -> Manifest:
    """The pool's periodic GPU test: a CronJob whose pods each take every GPU of one node.

    - Only idle nodes: a pod requesting all of a node's GPUs fits only where none is in use.
    - Never in the way: its class is below the autoscaler's expendable cutoff (a pending test never
      adds a node; the pod-scale-up-delay beyond the deadline says the same to the autoscaler) and
      never preempts, so it waits for idle nodes and any real pod preempts it.
    - One node per pod (anti-affinity), at most `test_nodes` per run, each index on its own: a node
      that fails is not retried and does not stop the others (backoffLimitPerIndex 0).
    - Its pool's taints and any team's are tolerated, the preflight taint never: a node in preflight
      is preflight's, and a cordoned node takes no pod at all.
    """
    name = f"{GPU_TEST}-{pool.name}"
    labels = objects.labels(COMPONENT, name)
    container = {
        "name": "test",
        "image": args.gpu_tests_image,
        "command": [
            "python",
            "-m",
            "superkube.agents.gpu_test",
            f"--thresholds={THRESHOLDS_DIR}/{args.thresholds.name}",
            f"--burn-seconds={args.burn_seconds}",
            *([f"--dcgm-url={args.dcgm_url}"] if args.dcgm_url else []),
        ],
        "env": [
            *_node_env(pool, vm),
            {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        ],
        "resources": {
            "requests": {"cpu": BURN_CPU, "memory": BURN_MEMORY, GPU_RESOURCE: str(vm.gpus)},
            "limits": {"memory": BURN_MEMORY, GPU_RESOURCE: str(vm.gpus)},
        },
        "volumeMounts": [
            {"name": "thresholds", "mountPath": THRESHOLDS_DIR, "readOnly": True},
            SCRATCH_MOUNT,
        ],
        "securityContext": objects.restricted(),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": objects.meta(name, COMPONENT, NAMESPACE),
        "spec": {
            "schedule": args.test_schedule,
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": 600,
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {
                "spec": {
                    "completionMode": "Indexed",
                    "completions": args.test_nodes,
                    "parallelism": args.test_nodes,
                    "backoffLimitPerIndex": 0,
                    "maxFailedIndexes": args.test_nodes,
                    "activeDeadlineSeconds": args.test_deadline_seconds,
                    "ttlSecondsAfterFinished": 86400,
                    "template": {
                        "metadata": {
                            "labels": labels,
                            "annotations": {SCALE_UP_DELAY: f"{2 * args.test_deadline_seconds}s"},
                        },
                        "spec": {
                            "restartPolicy": "Never",
                            "serviceAccountName": GPU_TEST,
                            "priorityClassName": GPU_TEST_PRIORITY,
                            "nodeSelector": {POOL_LABEL: pool.name},
                            "tolerations": pool_tolerations(pool),
                            "affinity": {
                                "podAntiAffinity": {
                                    "requiredDuringSchedulingIgnoredDuringExecution": [
                                        {
                                            "topologyKey": "kubernetes.io/hostname",
                                            "labelSelector": {"matchLabels": labels},
                                        }
                                    ]
                                }
                            },
                            "containers": [container],
                            "volumes": [
                                {"name": "thresholds", "configMap": {"name": THRESHOLDS_NAME}},
                                SCRATCH,
                            ],
                        },
                    },
                }
            },
        },
    }


def controller(args: NodeHealthArgs) -> list[Manifest]:
    """The health controller: two replicas, one leading (its Lease), the breaker's figures on the
    node agents' metrics port so the same scrape job finds them."""
    name = HEALTH_CONTROLLER
    pools = ",".join(pool.name for pool, _ in args.pools)
    flags = [f"--pools={pools}", f"--max-cordoned-share={args.max_cordoned_share}",
             f"--metrics-port={NODE_AGENTS_METRICS_PORT}", *(["--dry-run"] if args.dry_run else [])]  # fmt: skip
    env = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    container = {
        "name": "controller",
        "image": args.image,
        "command": ["python", "-m", "superkube.agents.health_controller", *flags],
        "env": env,
        "ports": [{"name": "metrics", "containerPort": NODE_AGENTS_METRICS_PORT}],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
        "livenessProbe": {
            "httpGet": {"path": "/metrics", "port": NODE_AGENTS_METRICS_PORT},
            "periodSeconds": 30,
        },
        "securityContext": objects.restricted(),
    }
    labels = objects.labels(COMPONENT, name)
    return [
        *objects.service_account_access(name, COMPONENT, NAMESPACE, CONTROLLER_RULES),
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": objects.meta(f"{name}-lease", COMPONENT, NAMESPACE),
            "rules": CONTROLLER_LEASE_RULES,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": objects.meta(f"{name}-lease", COMPONENT, NAMESPACE),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{name}-lease"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}],
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": objects.meta(name, COMPONENT, NAMESPACE),
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": name,
                        "priorityClassName": NODE_AGENT_PRIORITY,
                        "affinity": {
                            "podAntiAffinity": {
                                "preferredDuringSchedulingIgnoredDuringExecution": [
                                    {
                                        "weight": 100,
                                        "podAffinityTerm": {
                                            "topologyKey": "kubernetes.io/hostname",
                                            "labelSelector": {
                                                "matchLabels": {"app.kubernetes.io/name": name}
                                            },
                                        },
                                    }
                                ]
                            }
                        },
                        "containers": [container],
                    },
                },
            },
        },
    ]


def _access(agent: Agent) -> list[Manifest]:
    return objects.service_account_access(
        HEALTH if agent == "health" else PREFLIGHT, COMPONENT, NAMESPACE, RULES[agent]
    )


def manifests(args: NodeHealthArgs) -> list[Manifest]:
    agents: tuple[Agent, ...] = ("preflight", "health")
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": objects.meta(THRESHOLDS_NAME, COMPONENT, NAMESPACE),
            "data": {args.thresholds.name: args.thresholds.read_text()},
        },
        *fence(),
        *fence("health"),
        *fence("health-controller"),
        *(remediation_access() if args.remediation else []),
        *(m for agent in agents for m in _access(agent)),
        *controller(args),
        *(daemonset(pool, vm, args, "preflight") for pool, vm in args.gpu_pools),
        *(daemonset(pool, vm, args, "health") for pool, vm in args.pools),
        *(
            [
                *fence("gpu-reset"),
                *objects.service_account_access(GPU_RESET, COMPONENT, NAMESPACE, GPU_RESET_RULES),
                *(reset_daemonset(pool, vm, args) for pool, vm in args.gpu_pools),
            ]
            if args.gpu_pools
            else []
        ),
        *(
            [
                *fence("gpu-test"),
                *objects.service_account_access(GPU_TEST, COMPONENT, NAMESPACE, GPU_TEST_RULES),
                *(periodic_test(pool, vm, args) for pool, vm in args.gpu_pools),
            ]
            if args.test_schedule and args.gpu_pools
            else []
        ),
    ]


class NodeHealth(pulumi.ComponentResource):
    """Preflight and health agents (a DaemonSet each per GPU pool), their RBAC, fence and thresholds."""

    def __init__(self, name: str, args: NodeHealthArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("superkube:platform:NodeHealth", name, None, opts)
        self.resources = objects.create(self, name, manifests(args))
        self.register_outputs(
            {
                "daemonsets": [f"{PREFLIGHT}-{pool.name}" for pool, _ in args.gpu_pools]
                + [f"{HEALTH}-{pool.name}" for pool, _ in args.pools]
                + [f"{GPU_RESET}-{pool.name}" for pool, _ in args.gpu_pools],
                "periodic_tests": [f"{GPU_TEST}-{pool.name}" for pool, _ in args.gpu_pools]
                if args.test_schedule
                else [],
            }
        )
