"""cluster-autoscaler's permissions in the cluster: what the host service on the API servers may do.

The autoscaler runs as a host service on the API-server VMs (role cluster_autoscaler; why there:
superkube.cluster.autoscaling), as the user `autoscaling.USER` with a client certificate from the
cluster's PKI. Its command line is `autoscaling.flags`, which the inventory hands the role; here are
the RBAC objects that bind its user to what it reads and writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi

from modules.common import require
from modules.platform import objects
from modules.platform.objects import Manifest
from superkube.agents import scale_governor
from superkube.cluster import autoscaling

NAME = "cluster-autoscaler"
NAMESPACE = autoscaling.NAMESPACE
COMPONENT = "autoscaler"


@dataclass(frozen=True, kw_only=True)
class AutoscalerArgs:
    user: str = autoscaling.USER
    """The Kubernetes user the autoscaler acts as: its client certificate's CN (default: cluster-autoscaler)."""
    governor_user: str | None = autoscaling.GOVERNOR_USER
    """The user the scale-up governor beside it acts as (default: superkube-scale-governor); None: no governor."""

    def __post_init__(self) -> None:
        for name in ("user", "governor_user"):
            value = getattr(self, name)
            if name == "user" or value is not None:
                require(bool(value) and not value.startswith("system:"), name, "name a user outside system:")


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
        # its snapshot of the cluster waits for these informers before the first loop, dynamic
        # resource allocation on or off: without them it starts, takes its lease, and never scales
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceslices", "deviceclasses", "resourceclaims"],
            "verbs": read,
        },
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
            "resourceNames": [scale_governor.LEASE],
            "verbs": ["get", "update"],
        },
    ]


def governor_manifests(user: str) -> list[Manifest]:
    """The governor may read the autoscaler's status and see which host's autoscaler leads: two
    named objects, read-only, and nothing else."""
    name = f"{NAME}-governor"
    meta = objects.meta(name, COMPONENT, NAMESPACE)
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "resourceNames": [scale_governor.STATUS_CONFIGMAP],
                    "verbs": ["get"],
                },
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "resourceNames": [scale_governor.LEASE],
                    "verbs": ["get"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    ]


def manifests(args: AutoscalerArgs) -> list[Manifest]:
    """The ClusterRole and Role of the autoscaler, bound to its user, and the governor's Role."""

    def meta(namespace: str | None = None) -> dict[str, Any]:
        return objects.meta(NAME, COMPONENT, namespace)

    subject = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": args.user}]
    return [
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
                    "resourceNames": [scale_governor.STATUS_CONFIGMAP],
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
        *(governor_manifests(args.governor_user) if args.governor_user else []),
    ]


class Autoscaler(pulumi.ComponentResource):
    """cluster-autoscaler's RBAC: its user may read the cluster, resize it and hold its lease."""

    def __init__(self, name: str, args: AutoscalerArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("superkube:platform:Autoscaler", name, None, opts)
        self.resources = objects.create(self, name, manifests(args))
        self.register_outputs({"user": args.user})
