"""Cluster DNS: the names, the version and the Corefile both the in-cluster layer and the lab rest on.

Every kubelet points its pods' resolver at `dns_ip` (the service range's tenth address, the kubelet
role's `clusterDNS`); the in-cluster layer serves it with CoreDNS behind the `kube-dns` Service at
exactly that address. The version is the one kubeadm 1.35 installs (`CoreDNSVersion` in
cmd/kubeadm/app/constants), the Corefile kubeadm's own, with the cluster domain's answers left out of
the cache as kubeadm leaves them (the `kubernetes` plugin answers them from its informers), and the
rest forwarded to the node's resolver: on Azure that is Azure's DNS, which answers each VM a limited
number of queries a second (docs/04-in-cluster-layer.md, "Cluster DNS", counts what reaches it).
"""

from __future__ import annotations

COREDNS_VERSION = "v1.13.1"
COREDNS_MODULE = "github.com/coredns/coredns"
COREDNS_IMAGE = f"registry.k8s.io/coredns/coredns:{COREDNS_VERSION}"
"""kubeadm's image of that release (the lab imports its own build under the same name)."""
NAME = "coredns"  # its Deployment, account and ConfigMap
SERVICE = "kube-dns"  # the Service name every tool looks for, in kube-system
NAMESPACE = "kube-system"
APP_LABEL = {"k8s-app": "kube-dns"}
PORT = 53
METRICS_PORT = 9153
HEALTH_PORT = 8080  # /health (liveness), the health plugin's default
READY_PORT = 8181  # /ready (readiness), the ready plugin's default
CACHE_S = 30
TTL_S = 30


def corefile(domain: str) -> str:
    """kubeadm 1.35's Corefile for the cluster domain `domain`."""
    return f"""\
.:{PORT} {{
    errors
    health {{
       lameduck 5s
    }}
    ready
    kubernetes {domain} in-addr.arpa ip6.arpa {{
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl {TTL_S}
    }}
    prometheus :{METRICS_PORT}
    forward . /etc/resolv.conf {{
       max_concurrent 1000
    }}
    cache {CACHE_S} {{
       disable success {domain}
       disable denial {domain}
    }}
    loop
    reload
    loadbalance
}}
"""
