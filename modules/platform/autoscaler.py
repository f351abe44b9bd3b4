"""cluster-autoscaler for the cluster's scale sets: discovery by tags, scale from zero, bounded bursts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi

from modules.common import require
from modules.platform import objects
from modules.platform.foundation import CLUSTER_CRITICAL
from modules.platform.objects import Manifest
from superkube.cluster import autoscaling
from superkube.cluster.cloudinit import ROLE_LABEL

NAME = "cluster-autoscaler"
NAMESPACE = "kube-system"
COMPONENT = "autoscaler"
METRICS_PORT = 8085  # the release's --address default


@dataclass(frozen=True, kw_only=True)
class AutoscalerArgs:
    cluster: str
    """Cluster name: the value of the scale sets' cluster-autoscaler-name tag."""
    subscription_id: pulumi.Input[str]
    """Azure subscription of the scale sets."""
    resource_group_name: pulumi.Input[str]
    """Resource group that holds the node pools' scale sets."""
    identity_client_id: pulumi.Input[str]
    """Client ID of the user-assigned identity the autoscaler acts as (on the nodes it runs on)."""
    max_nodes_total: int
    """Ceiling on the cluster's node count (the flag --max-nodes-total)."""
    max_nodes_per_scaleup: int = 50
    """Most nodes one scan adds (default: 50; with scan_interval_seconds it paces a burst)."""
    scan_interval_seconds: int = 10
    """Seconds between scans (default: 10)."""
    max_total_unready_percentage: int = 10
    """Halt once more than this share of nodes is unready (default: 10)."""
    ok_total_unready_count: int = 50
    """Unready nodes tolerated regardless of the share (default: 50)."""
    new_pod_scale_up_delay_seconds: int = 30
    """Pods younger than this do not trigger a scale-up (default: 30)."""
    max_node_provision_minutes: int = 30
    """How long a new node may take to become ready (default: 30)."""
    expendable_priority_cutoff: int = autoscaling.EXPENDABLE_CUTOFF
    """Pods below this priority never cause a scale-up (default: -10)."""
    image: str = autoscaling.IMAGE
    """Container image, pinned to the release whose flags are checked (default: the pinned one)."""
    node_selector: dict[str, str] = field(default_factory=lambda: {ROLE_LABEL: "cpu"})
    """Where the autoscaler runs (default: cpu nodes, whose identity may scale the sets)."""

    def __post_init__(self) -> None:
        require(bool(self.cluster), "cluster", "must name the cluster")
        require(self.max_nodes_total >= 1, "max_nodes_total", "must be at least 1")
        require(":" in self.image.rsplit("/", 1)[-1] or "@" in self.image, "image", "pin a tag or digest")
        bad = autoscaling.unknown_flags(flags(self))
        require(not bad, "flags", f"not flags of cluster-autoscaler {autoscaling.VERSION}: {bad}")


def flags(args: AutoscalerArgs) -> list[str]:
    """The command line; every flag is checked against the pinned release's reference."""
    return [
        "--cloud-provider=azure",
        f"--node-group-auto-discovery={autoscaling.auto_discovery_flag(args.cluster)}",
        "--balance-similar-node-groups=true",  # a pool is several scale sets over zones: grow them evenly
        "--expander=least-waste",
        f"--max-nodes-total={args.max_nodes_total}",
        f"--max-nodes-per-scaleup={args.max_nodes_per_scaleup}",
        f"--scan-interval={args.scan_interval_seconds}s",
        f"--max-total-unready-percentage={args.max_total_unready_percentage}",
        f"--ok-total-unready-count={args.ok_total_unready_count}",
        f"--new-pod-scale-up-delay={args.new_pod_scale_up_delay_seconds}s",
        f"--max-node-provision-time={args.max_node_provision_minutes}m",
        f"--expendable-pods-priority-cutoff={args.expendable_priority_cutoff}",
        "--skip-nodes-with-local-storage=false",  # training pods use emptyDir scratch; they must not pin nodes
        "--leader-elect=true",
        f"--leader-elect-resource-namespace={NAMESPACE}",
    ]


def _rules() -> list[dict[str, list[str]]]:
    read = ["get", "list", "watch"]
    return [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["update"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": [*read, "update"]},
        {
            "apiGroups": [""],
            "resources": [
                "namespaces",
                "pods",
                "services",
                "replicationcontrollers",
                "persistentvolumeclaims",
                "persistentvolumes",
            ],
            "verbs": read,
        },
        {"apiGroups": ["apps"], "resources": ["statefulsets", "replicasets", "daemonsets"], "verbs": read},
        {"apiGroups": ["batch"], "resources": ["jobs", "cronjobs"], "verbs": read},
        {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": read},
        {
            "apiGroups": ["storage.k8s.io"],
            "resources": [
                "storageclasses",
                "csinodes",
                "csidrivers",
                "csistoragecapacities",
                "volumeattachments",
            ],
            "verbs": read,
        },
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [NAME],
            "verbs": ["get", "update"],
        },
    ]


def manifests(args: AutoscalerArgs) -> list[Manifest]:
    """Service account, RBAC and Deployment (the Azure identifiers may be Pulumi outputs)."""

    def meta(namespace: str | None = None) -> dict[str, Any]:
        return objects.meta(NAME, COMPONENT, namespace)

    subject = [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]
    labels = objects.labels(COMPONENT, NAME)
    env: dict[str, pulumi.Input[str]] = {
        "ARM_VM_TYPE": "vmss",
        "ARM_SUBSCRIPTION_ID": args.subscription_id,
        "ARM_RESOURCE_GROUP": args.resource_group_name,
        "ARM_USE_MANAGED_IDENTITY_EXTENSION": "true",
        "ARM_USER_ASSIGNED_IDENTITY_ID": args.identity_client_id,
    }
    container = {
        "name": NAME,
        "image": args.image,
        "command": ["./cluster-autoscaler", *flags(args)],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT}],
        "resources": {
            "requests": {"cpu": "1", "memory": "2Gi"},
            "limits": {"memory": "4Gi"},  # holds every node and pod of the cluster in its caches
        },
        "livenessProbe": {"httpGet": {"path": "/health-check", "port": METRICS_PORT}, "periodSeconds": 30},
        "securityContext": objects.restricted(),
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(NAMESPACE)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": meta(),
            "rules": _rules(),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": meta(),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
            "subjects": subject,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta(NAMESPACE),
            "rules": [
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "list", "watch"]},
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "resourceNames": ["cluster-autoscaler-status"],
                    "verbs": ["delete", "get", "update", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta(NAMESPACE),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": NAME},
            "subjects": subject,
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta(NAMESPACE),
            "spec": {
                "replicas": 1,
                "strategy": {"type": "Recreate"},  # never two leaders' worth of scale-ups in flight
                "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
                "template": {
                    "metadata": {
                        "labels": labels,
                        "annotations": {
                            # the node it runs on is never scaled down under it
                            "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
                        },
                    },
                    "spec": {
                        "serviceAccountName": NAME,
                        "priorityClassName": CLUSTER_CRITICAL,
                        "nodeSelector": dict(args.node_selector),
                        "containers": [container],
                    },
                },
            },
        },
    ]


class Autoscaler(pulumi.ComponentResource):
    """cluster-autoscaler in kube-system, scaling exactly the scale sets tagged for this cluster."""

    def __init__(self, name: str, args: AutoscalerArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("superkube:platform:Autoscaler", name, None, opts)
        self.resources = objects.create(self, name, manifests(args))
        self.register_outputs({"flags": flags(args)})
