"""Cluster DNS: CoreDNS behind the `kube-dns` Service at the address every kubelet gives its pods.

What it serves, at which version and with which Corefile is superkube.cluster.dns's; this component
makes the objects: the Corefile's ConfigMap, a ServiceAccount with read access to exactly what the
`kubernetes` plugin watches (services, endpointslices, namespaces), the Deployment (replicas apart
on different nodes, system-cluster-critical, probes on the health and ready plugins), a disruption
budget that lets a drain take one replica at a time, and the Service at `service_ip` on 53/UDP and
53/TCP.

CoreDNS runs as a non-root user on port 53. The release image's binary carries the file capability
to bind it (kept in the container's bounding set by adding NET_BIND_SERVICE, as kubeadm does); the
pod's own network namespace also lets any user bind from 53 up (the safe sysctl
net.ipv4.ip_unprivileged_port_start), so a build without file capabilities, like the lab's, binds
it too.

It tolerates every node of every pool: the team taints, each pool's own taints and the GPU
preflight taint (DNS needs no GPU, and a cluster whose only pool is GPU must resolve names while its
nodes are still being checked), so a one-pool GPU stack resolves names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi

from modules.common import require
from modules.platform import objects
from modules.platform.foundation import CLUSTER_CRITICAL
from modules.platform.objects import Manifest
from superkube.cluster import dns
from superkube.model.spec import PREFLIGHT_TAINT_KEY, NodePool
from superkube.model.teams import TAINT_EFFECT, TEAM_KEY

COMPONENT = "cluster-dns"
RULES: list[dict[str, object]] = [
    {"apiGroups": [""], "resources": ["services", "namespaces"], "verbs": ["list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
]


@dataclass(frozen=True, kw_only=True)
class ClusterDnsArgs:
    service_ip: str
    """The kubelets' clusterDNS address (superkube.cluster.kube's dns_ip)."""
    domain: str
    """The cluster domain the kubelets give their pods."""
    pools: Sequence[NodePool] = ()
    """The stack's node pools: their own taints are tolerated."""
    replicas: int = 2
    """CoreDNS replicas, each on a node of its own (2, or 1 on a one-node stack)."""
    image: str = dns.COREDNS_IMAGE
    memory_request_mi: int = 70
    memory_limit_mi: int = 170
    """kubeadm's figures; the flagship's objects fit in them (docs/04-in-cluster-layer.md)."""

    def __post_init__(self) -> None:
        require(self.replicas >= 1, "replicas", "must be at least 1")
        require(
            0 < self.memory_request_mi <= self.memory_limit_mi,
            "memory_request_mi",
            "must be above 0 and at most memory_limit_mi",
        )


def tolerations(pools: Sequence[NodePool]) -> list[dict[str, str]]:
    out = [
        {"key": "CriticalAddonsOnly", "operator": "Exists"},
        {"key": TEAM_KEY, "operator": "Exists", "effect": TAINT_EFFECT},
        {"key": PREFLIGHT_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
    ]
    for pool in pools:
        for taint in pool.taints:
            key_value, _, effect = taint.partition(":")
            key = key_value.partition("=")[0]
            wanted = {"key": key, "operator": "Exists", "effect": effect}
            if wanted not in out:
                out.append(wanted)
    return out


def manifests(args: ClusterDnsArgs) -> list[Manifest]:
    ns = dns.NAMESPACE

    def meta(name: str) -> dict[str, object]:
        out = objects.meta(name, COMPONENT, ns)
        out["labels"] = {**out["labels"], **dns.APP_LABEL}
        return out

    security = objects.restricted()
    security["capabilities"] = {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]}
    container = {
        "name": "coredns",
        "image": args.image,
        "args": ["-conf", "/etc/coredns/Corefile"],
        "ports": [
            {"name": "dns", "containerPort": dns.PORT, "protocol": "UDP"},
            {"name": "dns-tcp", "containerPort": dns.PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": dns.METRICS_PORT, "protocol": "TCP"},
            {"name": "liveness-probe", "containerPort": dns.HEALTH_PORT, "protocol": "TCP"},
            {"name": "readiness-probe", "containerPort": dns.READY_PORT, "protocol": "TCP"},
        ],
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": "liveness-probe"},
            "initialDelaySeconds": 60,
            "timeoutSeconds": 5,
            "failureThreshold": 5,
        },
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "readiness-probe"}, "periodSeconds": 5},
        "resources": {
            "requests": {"cpu": "100m", "memory": f"{args.memory_request_mi}Mi"},
            "limits": {"memory": f"{args.memory_limit_mi}Mi"},
        },
        "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
        "securityContext": security,
    }
    pod_labels = {**objects.labels(COMPONENT, dns.NAME), **dns.APP_LABEL}
    return [
        *objects.service_account_access(dns.NAME, COMPONENT, ns, RULES),
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta(dns.NAME),
            "data": {"Corefile": dns.corefile(args.domain)},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta(dns.NAME),
            "spec": {
                "replicas": args.replicas,
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
                "selector": {"matchLabels": dict(dns.APP_LABEL)},
                "template": {
                    "metadata": {"labels": pod_labels},
                    "spec": {
                        "serviceAccountName": dns.NAME,
                        "priorityClassName": CLUSTER_CRITICAL,
                        # the node's resolver, not the cluster's own: what CoreDNS forwards to
                        "dnsPolicy": "Default",
                        "securityContext": {
                            "sysctls": [
                                {"name": "net.ipv4.ip_unprivileged_port_start", "value": str(dns.PORT)}
                            ]
                        },
                        "affinity": {
                            "podAntiAffinity": {
                                "requiredDuringSchedulingIgnoredDuringExecution": [
                                    {
                                        "topologyKey": "kubernetes.io/hostname",
                                        "labelSelector": {"matchLabels": dict(dns.APP_LABEL)},
                                    }
                                ]
                            }
                        },
                        "nodeSelector": {"kubernetes.io/os": "linux"},
                        "tolerations": tolerations(args.pools),
                        "containers": [container],
                        "volumes": [{"name": "config", "configMap": {"name": dns.NAME}}],
                    },
                },
            },
        },
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": meta(dns.NAME),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": dict(dns.APP_LABEL)}},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta(dns.SERVICE),
            "spec": {
                "clusterIP": args.service_ip,
                "selector": dict(dns.APP_LABEL),
                "ports": [
                    {"name": "dns", "port": dns.PORT, "targetPort": dns.PORT, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": dns.PORT, "targetPort": dns.PORT, "protocol": "TCP"},
                    {
                        "name": "metrics",
                        "port": dns.METRICS_PORT,
                        "targetPort": dns.METRICS_PORT,
                        "protocol": "TCP",
                    },
                ],
            },
        },
    ]


class ClusterDns(pulumi.ComponentResource):
    """CoreDNS serving the cluster domain at the kubelets' clusterDNS address."""

    def __init__(self, name: str, args: ClusterDnsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("superkube:platform:ClusterDns", name, None, opts)
        self.resources = objects.create(self, name, manifests(args))
        self.register_outputs({"service_ip": args.service_ip, "image": args.image})
