"""GPU node lifecycle in the cluster: the preflight agent on nodes still behind the preflight taint,
the health agent on every GPU node, their RBAC, the policy that fences the preflight agent in, and
the thresholds both read.

Both agents run one DaemonSet per GPU pool (the pool's VM facts tell the probe how many GPUs to
expect), on the host network so Prometheus's `node-agents` job finds them at the node's address, and
see the GPUs through the NVIDIA runtime without requesting any (NVIDIA_VISIBLE_DEVICES=all). Their
thresholds are a ConfigMap made from data/gpu_health.yaml, so a threshold change is a reviewed
`pulumi up` like any other.

- preflight (superkube.agents.preflight): only on nodes labelled superkube.io/preflight=pending;
  removes that taint and label from its own node once the GPUs pass. The ValidatingAdmissionPolicy
  `superkube-preflight-own-node` rejects anything else its service account tries on a node.
- health (superkube.agents.node_health): cordons and evicts through the Eviction API on a fatal
  verdict, behind its breaker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pulumi

from modules.common import require
from modules.platform import objects
from modules.platform.foundation import NAMESPACE, NODE_AGENT_PRIORITY
from modules.platform.objects import Manifest
from superkube.agents import AGENTS_IMAGE
from superkube.agents.gpu_probe import THRESHOLDS
from superkube.agents.preflight import RESULT_ANNOTATION
from superkube.cloudinit import POOL_LABEL, PREFLIGHT_PENDING
from superkube.kube import NODE_AGENTS_METRICS_PORT, PREFLIGHT_METRICS_PORT
from superkube.spec import PREFLIGHT_TAINT_KEY
from superkube.spec import NodePool as PoolSpec
from superkube.vmsizes import VmSize

COMPONENT = "node-health"
HEALTH = "superkube-node-health"
PREFLIGHT = "superkube-preflight"
THRESHOLDS_NAME = "superkube-gpu-health"
THRESHOLDS_DIR = "/etc/superkube"
FENCE = "superkube-preflight-own-node"
Agent = Literal["health", "preflight"]


@dataclass(frozen=True, kw_only=True)
class NodeHealthArgs:
    pools: Sequence[tuple[PoolSpec, VmSize]]
    """The GPU pools with the facts of their VM size (the GPU count the probe expects)."""
    max_cordoned_share: float = 0.05
    """Share of a pool's nodes past preflight the health agent may cordon before its breaker opens."""
    dry_run: bool = False
    """The health agent logs actions instead of taking them (for a first rollout)."""
    interval_seconds: int = 60
    """Seconds between probe rounds (both agents)."""
    image: str = AGENTS_IMAGE
    """The agents' image (default: the one built from this checkout's Dockerfile, pinned)."""
    thresholds: Path = THRESHOLDS
    """The thresholds file the ConfigMap is made from."""
    dcgm_url: str = ""
    """The node's dcgm-exporter /metrics, read beside NVML (default: none); `$(NODE_IP)` is the node's address."""

    def __post_init__(self) -> None:
        require(0 < self.max_cordoned_share <= 1, "max_cordoned_share", "must be in (0, 1]")
        for pool, vm in self.pools:
            require(pool.role == "gpu" and vm.gpus > 0, "pools", f"{pool.name} is not a GPU pool")


RULES: dict[Agent, list[dict[str, object]]] = {
    "health": [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ],
    # patch, fenced in by the admission policy below: its own node, the preflight taint and label only
    "preflight": [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ],
}


def _or_empty(path: str, empty: str) -> str:
    return f"(has({path}) ? {path} : {empty})"


def fence_validations() -> list[dict[str, str]]:
    """CEL over the node before (oldObject) and after (object) the preflight agent's change."""
    taints, old_taints = _or_empty("object.spec.taints", "[]"), _or_empty("oldObject.spec.taints", "[]")
    labels, old_labels = (
        _or_empty("object.metadata.labels", "{}"),
        _or_empty("oldObject.metadata.labels", "{}"),
    )
    notes, old_notes = (
        _or_empty("object.metadata.annotations", "{}"),
        _or_empty("oldObject.metadata.annotations", "{}"),
    )
    key, result = PREFLIGHT_TAINT_KEY, RESULT_ANNOTATION
    return [
        {
            "expression": "'authentication.kubernetes.io/node-name' in request.userInfo.extra && "
            "request.userInfo.extra['authentication.kubernetes.io/node-name'] == [object.metadata.name]",
            "message": "the preflight agent may change only the node its pod runs on",
        },
        {
            "expression": f"{taints}.all(t, t in {old_taints}) && "
            f"{old_taints}.all(t, t.key == '{key}' || t in {taints})",
            "message": f"the preflight agent may only remove the {key} taint",
        },
        {
            "expression": f"{labels}.all(k, k in {old_labels} && {old_labels}[k] == {labels}[k]) && "
            f"{old_labels}.all(k, k == '{key}' || k in {labels})",
            "message": f"the preflight agent may only remove the {key} label",
        },
        {
            "expression": f"{notes}.all(k, k == '{result}' || (k in {old_notes} && {old_notes}[k] == {notes}[k])) "
            f"&& {old_notes}.all(k, k in {notes})",
            "message": f"the preflight agent may only set the {result} annotation",
        },
        {
            "expression": "(has(object.spec.unschedulable) && object.spec.unschedulable) == "
            "(has(oldObject.spec.unschedulable) && oldObject.spec.unschedulable)",
            "message": "the preflight agent may not cordon or uncordon",
        },
    ]


def fence() -> list[Manifest]:
    """The ValidatingAdmissionPolicy and its binding: the preflight agent's node updates are denied
    unless they keep to its own node, the preflight taint and label, and the result annotation."""
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": objects.meta(FENCE, COMPONENT),
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["UPDATE"],
                            "resources": ["nodes"],
                        }
                    ]
                },
                "matchConditions": [
                    {
                        "name": "the-preflight-agent",
                        "expression": f"request.userInfo.username == 'system:serviceaccount:{NAMESPACE}:{PREFLIGHT}'",
                    }
                ],
                "validations": fence_validations(),
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": objects.meta(FENCE, COMPONENT),
            "spec": {"policyName": FENCE, "validationActions": ["Deny"]},
        },
    ]


def daemonset(pool: PoolSpec, vm: VmSize, args: NodeHealthArgs, agent: Agent) -> Manifest:
    base = HEALTH if agent == "health" else PREFLIGHT
    name = f"{base}-{pool.name}"
    port = NODE_AGENTS_METRICS_PORT if agent == "health" else PREFLIGHT_METRICS_PORT
    flags = [
        f"--interval={args.interval_seconds}",
        f"--metrics-port={port}",
        f"--thresholds={THRESHOLDS_DIR}/{args.thresholds.name}",
    ]
    if agent == "health":
        flags += [f"--max-cordoned-share={args.max_cordoned_share}", *(["--dry-run"] if args.dry_run else [])]
    if args.dcgm_url:
        flags.append(f"--dcgm-url={args.dcgm_url}")
    selector = {POOL_LABEL: pool.name}
    if agent == "preflight":
        selector[PREFLIGHT_TAINT_KEY] = PREFLIGHT_PENDING  # the pod goes once the node has passed
    env = [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        {"name": "NODE_POOL", "value": pool.name},
        {"name": "VM_SIZE", "value": vm.name},
        {"name": "EXPECTED_GPUS", "value": str(vm.gpus)},
        # every GPU visible through the NVIDIA runtime, none requested: the probe only reads them
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
    ]
    container = {
        "name": "agent",
        "image": args.image,
        "command": [
            "python",
            "-m",
            f"superkube.agents.{'node_health' if agent == 'health' else 'preflight'}",
            *flags,
        ],
        "env": env,
        "ports": [{"name": "metrics", "containerPort": port, "hostPort": port}],
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        "livenessProbe": {
            "httpGet": {"path": "/metrics", "port": port},
            "periodSeconds": 30,
            "failureThreshold": 4,
        },
        "volumeMounts": [{"name": "thresholds", "mountPath": THRESHOLDS_DIR, "readOnly": True}],
        "securityContext": objects.restricted(),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": objects.meta(name, COMPONENT, NAMESPACE),
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
            "template": {
                "metadata": {"labels": objects.labels(COMPONENT, name)},
                "spec": {
                    "serviceAccountName": base,
                    "priorityClassName": NODE_AGENT_PRIORITY,
                    "hostNetwork": True,
                    "dnsPolicy": "ClusterFirstWithHostNet",
                    "nodeSelector": selector,
                    # on every node it selects: behind the preflight taint, cordoned, or tainted by its pool
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [container],
                    "volumes": [{"name": "thresholds", "configMap": {"name": THRESHOLDS_NAME}}],
                },
            },
        },
    }


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
        *(m for agent in agents for m in _access(agent)),
        *(daemonset(pool, vm, args, agent) for agent in agents for pool, vm in args.pools),
    ]


class NodeHealth(pulumi.ComponentResource):
    """Preflight and health agents (a DaemonSet each per GPU pool), their RBAC, fence and thresholds."""

    def __init__(self, name: str, args: NodeHealthArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("superkube:platform:NodeHealth", name, None, opts)
        self.resources = objects.create(self, name, manifests(args))
        self.register_outputs(
            {"daemonsets": [f"{a}-{pool.name}" for a in (PREFLIGHT, HEALTH) for pool, _ in args.pools]}
        )
