"""The health agent on every GPU node: one DaemonSet per GPU pool, its RBAC and its thresholds.

The agent (superkube.agents.node_health) reads the node's GPUs through NVML, and on a fatal verdict
cordons the node and evicts its pods through the Eviction API, behind a circuit breaker. It runs on
the host network so Prometheus's `node-agents` job finds it at the node's address, sees the GPUs
through the NVIDIA runtime without requesting any (NVIDIA_VISIBLE_DEVICES=all), and reads its
thresholds from a ConfigMap made from data/gpu_health.yaml, so a threshold change is a reviewed
`pulumi up` like any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pulumi

from modules.common import require
from modules.platform import objects
from modules.platform.foundation import NAMESPACE, NODE_AGENT_PRIORITY
from modules.platform.objects import Manifest
from superkube.agents import AGENTS_IMAGE
from superkube.agents.gpu_probe import THRESHOLDS
from superkube.kube import NODE_AGENTS_METRICS_PORT
from superkube.spec import NodePool as PoolSpec
from superkube.vmsizes import VmSize

COMPONENT = "node-health"
NAME = "superkube-node-health"
THRESHOLDS_DIR = "/etc/superkube"


@dataclass(frozen=True, kw_only=True)
class NodeHealthArgs:
    pools: Sequence[tuple[PoolSpec, VmSize]]
    """The GPU pools with the facts of their VM size (the GPU count the probe expects)."""
    max_cordoned_share: float = 0.05
    """Share of a pool's nodes past preflight the agent may cordon before its breaker opens."""
    dry_run: bool = False
    """Log actions instead of taking them (for a first rollout)."""
    interval_seconds: int = 60
    """Seconds between probe rounds."""
    image: str = AGENTS_IMAGE
    """The agents' image (default: the one built from this checkout's Dockerfile, pinned)."""
    thresholds: Path = THRESHOLDS
    """The thresholds file the ConfigMap is made from."""

    def __post_init__(self) -> None:
        require(0 < self.max_cordoned_share <= 1, "max_cordoned_share", "must be in (0, 1]")
        for pool, vm in self.pools:
            require(pool.role == "gpu" and vm.gpus > 0, "pools", f"{pool.name} is not a GPU pool")


def _rules() -> list[dict[str, object]]:
    return [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]


def daemonset(pool: PoolSpec, vm: VmSize, args: NodeHealthArgs) -> Manifest:
    name = f"{NAME}-{pool.name}"
    labels = objects.labels(COMPONENT, name)
    flags = [
        f"--max-cordoned-share={args.max_cordoned_share}",
        f"--interval={args.interval_seconds}",
        f"--metrics-port={NODE_AGENTS_METRICS_PORT}",
        f"--thresholds={THRESHOLDS_DIR}/{args.thresholds.name}",
        *(["--dry-run"] if args.dry_run else []),
    ]
    env = [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
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
        "command": ["python", "-m", "superkube.agents.node_health", *flags],
        "env": env,
        "ports": [
            {
                "name": "metrics",
                "containerPort": NODE_AGENTS_METRICS_PORT,
                "hostPort": NODE_AGENTS_METRICS_PORT,
            }
        ],
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        "livenessProbe": {
            "httpGet": {"path": "/metrics", "port": NODE_AGENTS_METRICS_PORT},
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
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": NAME,
                    "priorityClassName": NODE_AGENT_PRIORITY,
                    "hostNetwork": True,
                    "dnsPolicy": "ClusterFirstWithHostNet",
                    "nodeSelector": {"superkube.io/pool": pool.name},
                    # on every node of the pool, the preflight and cordoned ones included
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [container],
                    "volumes": [{"name": "thresholds", "configMap": {"name": NAME}}],
                },
            },
        },
    }


def manifests(args: NodeHealthArgs) -> list[Manifest]:
    subject = [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": objects.meta(NAME, COMPONENT, NAMESPACE)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": objects.meta(NAME, COMPONENT),
            "rules": _rules(),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": objects.meta(NAME, COMPONENT),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
            "subjects": subject,
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": objects.meta(NAME, COMPONENT, NAMESPACE),
            "data": {args.thresholds.name: args.thresholds.read_text()},
        },
        *(daemonset(pool, vm, args) for pool, vm in args.pools),
    ]


class NodeHealth(pulumi.ComponentResource):
    """The health agent's DaemonSets (one per GPU pool), RBAC and thresholds."""

    def __init__(self, name: str, args: NodeHealthArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("superkube:platform:NodeHealth", name, None, opts)
        self.resources = objects.create(self, name, manifests(args))
        self.register_outputs({"daemonsets": [f"{NAME}-{pool.name}" for pool, _ in args.pools]})
