"""What the Prometheus shards beside the cluster need from inside it: an identity that may discover
nodes and the agents' pods and read metrics, and a token for it.

The shards run on hosts of their own (modules/compute/monitoring.py) and reach the API server at the
plan's load-balancer address; the monitoring role reads the cluster CA and this token from
/etc/prometheus/pki on each of them:

    kubectl -n superkube-system get secret superkube-prometheus-token -o jsonpath='{.data.token}' | base64 -d
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from modules.platform import objects
from modules.platform.foundation import NAMESPACE
from modules.platform.objects import Manifest

COMPONENT = "monitoring-access"
NAME = "superkube-prometheus"


@dataclass(frozen=True, kw_only=True)
class MonitoringAccessArgs:
    namespace: str = NAMESPACE
    """Where the service account and its token live (default: superkube-system)."""


def rules() -> list[dict[str, object]]:
    """Read-only: discovery of nodes and pods, the kubelets' and API servers' metrics."""
    return [
        {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]},
        {"nonResourceURLs": ["/metrics", "/metrics/cadvisor"], "verbs": ["get"]},
    ]


def manifests(args: MonitoringAccessArgs) -> list[Manifest]:
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": objects.meta(NAME, COMPONENT, args.namespace),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": objects.meta(NAME, COMPONENT),
            "rules": rules(),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": objects.meta(NAME, COMPONENT),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": args.namespace}],
        },
        {
            # a long-lived token for hosts outside the cluster, which cannot mount projected ones
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/service-account-token",
            "metadata": objects.meta(
                f"{NAME}-token",
                COMPONENT,
                args.namespace,
                annotations={"kubernetes.io/service-account.name": NAME},
            ),
        },
    ]


class MonitoringAccess(pulumi.ComponentResource):
    """The Prometheus shards' service account, read-only role and token."""

    def __init__(
        self, name: str, args: MonitoringAccessArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("superkube:platform:MonitoringAccess", name, None, opts)
        self.resources = objects.create(self, name, manifests(args))
        self.register_outputs({"token_secret": f"{NAME}-token"})
