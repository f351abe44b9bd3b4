"""The kubelet serving-certificate approver (superkube.agents.serving_certs): two replicas, an identity
that may approve requests for the `kubernetes.io/kubelet-serving` signer and nothing else.

Kubelets ask for their serving certificates (`serverTLSBootstrap: true` in their configuration) so
the API servers, which verify kubelets against the cluster CA, can reach them for logs, exec,
port-forward and node proxy; the controller-manager signs a request once this approves it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from modules.common import require
from modules.platform import objects
from modules.platform.foundation import CLUSTER_CRITICAL, NAMESPACE
from modules.platform.objects import Manifest
from superkube.agents import AGENTS_IMAGE
from superkube.cluster.kube import KUBELET_SERVING_SIGNER as SIGNER
from superkube.cluster.kube import (
    SERVING_CERTS_COMPONENT,
    SERVING_CERTS_METRICS_PORT,
    SERVING_CERTS_MODULE,
    SERVING_CERTS_NAME,
)

COMPONENT = SERVING_CERTS_COMPONENT
NAME = SERVING_CERTS_NAME


@dataclass(frozen=True, kw_only=True)
class ServingCertsArgs:
    replicas: int = 2
    """Replicas (default 2: a decision the other made first is a conflict, skipped)."""
    interval_seconds: int = 10
    """Seconds between rounds (a kubelet waits at most this long for its certificate)."""
    image: str = AGENTS_IMAGE
    """The image it runs from (default: the pinned agents image)."""

    def __post_init__(self) -> None:
        require(self.replicas >= 1, "replicas", "must be at least 1")
        require(1 <= self.interval_seconds <= 300, "interval_seconds", "must be 1-300")


def rules() -> list[dict[str, object]]:
    """Read the requests, approve those of the kubelet-serving signer only, read Nodes (their
    addresses), say what it decided in Events."""
    return [
        {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests/approval"],
         "verbs": ["update"]},
        {"apiGroups": ["certificates.k8s.io"], "resources": ["signers"], "resourceNames": [SIGNER],
         "verbs": ["approve"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]  # fmt: skip


def manifests(args: ServingCertsArgs) -> list[Manifest]:
    container = {
        "name": "approver",
        "image": args.image,
        "command": [
            "python",
            "-m",
            SERVING_CERTS_MODULE,
            f"--interval={args.interval_seconds}",
            f"--metrics-port={SERVING_CERTS_METRICS_PORT}",
        ],
        "ports": [{"name": "metrics", "containerPort": SERVING_CERTS_METRICS_PORT}],
        "resources": {"requests": {"cpu": "50m", "memory": "96Mi"}, "limits": {"memory": "192Mi"}},
        "securityContext": objects.restricted(),
        "livenessProbe": {
            "httpGet": {"path": "/metrics", "port": SERVING_CERTS_METRICS_PORT},
            "periodSeconds": 30,
        },
    }
    return [
        *objects.service_account_access(NAME, COMPONENT, NAMESPACE, rules()),
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": objects.meta(NAME, COMPONENT, NAMESPACE),
            "spec": {
                "replicas": args.replicas,
                "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
                "template": {
                    "metadata": {"labels": objects.labels(COMPONENT, NAME)},
                    "spec": {
                        "serviceAccountName": NAME,
                        "priorityClassName": CLUSTER_CRITICAL,
                        "containers": [container],
                    },
                },
            },
        },
    ]


class ServingCerts(pulumi.ComponentResource):
    """The approver's identity and Deployment."""

    def __init__(self, name: str, args: ServingCertsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("superkube:platform:ServingCerts", name, None, opts)
        self.resources = objects.create(self, name, manifests(args))
        self.register_outputs({"deployment": NAME})
