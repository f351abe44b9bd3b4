"""Kubernetes wiring facts, named once.

Where the API is, which names its serving certificate carries, where etcd listens, and how many pods
a node of each pool may run: the Pulumi program, the Ansible inventory (and so every role) and the
cross-layer policy rules read them from here, never from a second copy.
"""

from __future__ import annotations

import re
import urllib.parse
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from superkube.cluster.cloudinit import BOOTSTRAP_KUBECONFIG, REGISTRATION_FILE
from superkube.model.ipam import AddressPlan
from superkube.model.spec import ClusterSpec, NodePool

APISERVER_PORT = 6443
# The API servers' internal load balancer: an HTTPS probe of /readyz every 5 s; one failed probe
# takes a server out and one good probe puts it back (Azure's probeThreshold, whose default is 1; the
# older numberOfProbes is no longer honoured), so a stopped API server breaks the flows balanced to
# it for at most one probe interval; idle flows kept 30 minutes (long watches), then reset.
APISERVER_PROBE_PATH = "/readyz"
APISERVER_PROBE_INTERVAL_S = 5
APISERVER_PROBE_THRESHOLD = 1
APISERVER_LB_IDLE_TIMEOUT_MIN = 30
# When every API server fails the probe, keep sending them new flows (Azure's noHealthyBackendsBehavior
# AllProbedUp) rather than none: a cause all of them share makes each one unready at once, and the one
# that happens is an outage of the events etcd (since 1.33 /readyz checks every --etcd-servers-overrides
# backend), through which the API servers still serve everything but Events.
APISERVER_LB_ALL_DOWN_SENDS_TO_ALL = True
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
ETCD_METRICS_PORT = 2381  # the etcd members' plain-HTTP /metrics listener
NODE_EXPORTER_PORT = 9100
IMDS = "http://169.254.169.254"  # Azure's instance metadata, from every VM (the lab serves the same)
CONTAINERD_METRICS_PORT = (
    1338  # containerd's metrics server, on each node's loopback (the health agent asks it)
)
KUBELET_HEALTHZ_PORT = 10248  # the kubelet's default healthz, on each node's loopback
KERNEL_LOG_DIR = "/var/log/superkube-kernel"  # the nodes' kernel messages alone, for the health agent
KERNEL_LOG = "kernel.log"
IPTABLES_EXPORTER_PORT = 9455
# superkube's node agents (health, preflight) serve /metrics here on the host network
NODE_HEALTH_COMPONENT = "node-health"
"""The layer's component label of the node agents (health, preflight, the GPU reset, the controller):
Prometheus's node-agents job finds their pods by it."""
SERVING_CERTS_COMPONENT = "serving-certs"
TEAM_CAPACITY_COMPONENT = "team-capacity"
"""The components of the approver and of the team webhook and reconciler: the platform-agents job's."""
NODE_AGENTS_METRICS_PORT = 9465
# the cluster CA and a metrics token on each Prometheus host (discovery and the https jobs)
PROMETHEUS_PKI_DIR = "/etc/prometheus/pki"
PREFLIGHT_METRICS_PORT = 9466  # the preflight agent, beside the health agent on the same host network
TEAM_TAINTS_METRICS_PORT = 9467  # the team-taints reconciler (a Deployment, on the pod network)
# the kubelet serving-certificate approver (a Deployment, on the pod network): its port, its module
SERVING_CERTS_METRICS_PORT = 9468
SERVING_CERTS_MODULE = "superkube.agents.serving_certs"
GPU_DEVICES_COMPONENT = "gpu-devices"  # NVIDIA's device plugin, one DaemonSet per GPU pool
GPU_DEVICES_NAME = "nvidia-device-plugin"  # its DaemonSets: <this>-<pool>
SERVING_CERTS_NAME = "superkube-serving-certs"  # its account, role and Deployment; its Events' component
KUBELET_SERVING_SIGNER = "kubernetes.io/kubelet-serving"  # the signer of kubelets' serving certificates
TEAM_WEBHOOK_PORT = 8443  # the team admission webhook's HTTPS port in its pod (Service port 443)
TEAM_WEBHOOK_METRICS_PORT = 9471  # the team webhook's plain-HTTP /metrics, beside its HTTPS port
# superkube's host services on the API-server hosts serve /metrics here (their units pass the port:
# the programs ship alone, without this module)
SCALE_GOVERNOR_METRICS_PORT = 9469
JOIN_TOKENS_METRICS_PORT = 9470
REMEDIATION_METRICS_PORT = 9472
CLUSTER_DOMAIN = "cluster.local"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # every namespace's own name, set by the API server
SYSTEM_NAMESPACE = "superkube-system"  # superkube's own workloads in the cluster (agents, balloons)
# The host-network pods a serving node runs, by pool role: they count against its pod limit but take
# no pod IP. Every node runs the health agent (modules/platform/node_health); a GPU node also NVIDIA's
# device plugin (modules/platform/gpu_devices). Preflight, the other host-network agent, runs only while the
# node is behind the preflight taint, when no pod that needs an IP lands; counting it would let the
# scheduler place one pod more than the NIC has IPs for.
HOST_NETWORK_PODS = {"gpu": 2, "cpu": 1}
# Kubelet values only the lab sets, each for what a node VM does not share; the wiring-lab-only rule
# keeps them out of every stack (LAB_ONLY_KUBELET_WHY says why each is the lab's).
LAB_ONLY_KUBELET_CONFIG: dict[str, object] = {
    "failCgroupV1": False,
    "imageGCHighThresholdPercent": 100,
    "evictionHard": {
        "memory.available": "100Mi",
        "nodefs.available": "1%",
        "nodefs.inodesFree": "5%",
        "imagefs.available": "1%",
        "imagefs.inodesFree": "5%",
    },
}
LAB_ONLY_KUBELET_WHY = {
    "failCgroupV1": "the lab's hosts share a kernel that mounts cgroup v1 controllers, which Kubernetes "
    "1.35 refuses by default; nodes run cgroup v2",
    # a machine whose disk is 82 % used (CI's was) is near the defaults: image GC at 85 % used, the
    # disk-pressure taint below 15 % free; past them the kubelets deleted the images converge imports
    # and tainted new nodes unschedulable
    "imageGCHighThresholdPercent": "the lab's nodes are containers on one machine's disk, whose use is "
    "the machine's, not a node's; a node's image GC frees its own disk",
    "evictionHard": "the lab's nodes are containers on one machine's disk, whose free space is the "
    "machine's, not a node's; a node evicts on its own disk's pressure at the kubelet's defaults",
}
# node_software values only the lab sets: its hosts are containers, which may neither lower an OOM
# score nor make kernel keyrings (the same rule keeps them off in every stack).
LAB_ONLY_NODE_SOFTWARE = {"node_software_restrict_oom_score_adj": True, "node_software_no_new_keyring": True}
# kube-proxy values only the lab sets: its hosts are network namespaces on one kernel, where the global
# conntrack table size is this machine's to set, not a host's (kube-proxy would fail writing it).
LAB_ONLY_KUBE_PROXY_CONFIG = {"conntrack": {"maxPerCore": 0}}
# The in-cluster `kubernetes` service takes the service range's first address, cluster DNS the tenth.
KUBERNETES_SERVICE_INDEX = 1
DNS_SERVICE_INDEX = 10


def service_ip(service_cidr: str, index: int = KUBERNETES_SERVICE_INDEX) -> str:
    return str(IPv4Network(service_cidr).network_address + index)


def apiserver_url(address: IPv4Address | str) -> str:
    return f"https://{address}:{APISERVER_PORT}"


def etcd_urls(ips: tuple[IPv4Address, ...] | list[str]) -> list[str]:
    return [f"https://{ip}:{ETCD_CLIENT_PORT}" for ip in ips]


def apiserver_dns_names() -> list[str]:
    """The in-cluster names of the API (SANs of its serving certificate)."""
    return [
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        f"kubernetes.default.svc.{CLUSTER_DOMAIN}",
    ]


def apiserver_ip_sans(addresses: AddressPlan) -> list[str]:
    """Every address a client may reach the API on: the load balancer, each server, the service IP."""
    return [
        str(addresses.apiserver_lb_ip),
        *(str(ip) for ip in addresses.apiserver_ips),
        service_ip(str(addresses.service_cidr)),
    ]


def max_pods(pool: NodePool) -> int:
    """The kubelet's pod limit, which the scheduler counts: one pod per VNet IP of the NIC, plus the
    host-network pods its role runs. A limit above that lets the scheduler bind a pod the CNI has no IP
    for, which then loops in ContainerCreating; at it, such a pod waits Pending ("Too many pods")."""
    return pool.pod_ips_per_node + HOST_NETWORK_PODS[pool.role]


def metrics_store_write_urls(spec: ClusterSpec, addresses: AddressPlan) -> list[str]:
    """The remote-write URL of each Prometheus shard, in shard order: a store the spec names, or this
    cluster's own store hosts' vminsert, shard i on store host i mod their count."""
    if spec.metrics_store_url:
        return [spec.metrics_store_url] * spec.prometheus_shards
    ips = addresses.metrics_store_ips
    return [
        f"http://{ips[shard % len(ips)]}:{VMINSERT_PORT}/insert/0/prometheus/api/v1/write"
        for shard in range(spec.prometheus_shards)
    ]


def metrics_store_query_url(spec: ClusterSpec, addresses: AddressPlan) -> str:
    """Where the cluster's metrics are read: the base of the store's Prometheus query API (queries go
    to `<url>/api/v1/query`). This cluster's own store: vmselect on its first store host (every host's
    vmselect reads every vmstorage). A store the spec names: where its remote-write URL says it
    answers queries; "" when the URL does not say."""
    if not spec.metrics_store_url:
        return f"http://{addresses.metrics_store_ips[0]}:{VMSELECT_PORT}/select/0/prometheus"
    return query_url_of_write_url(spec.metrics_store_url)


def query_url_of_write_url(url: str) -> str:
    """The query API beside a remote-write URL: VictoriaMetrics' cluster version reads a tenant's
    series at vmselect's `/select/<tenant>/prometheus` (port 8481 where vminsert's is its default
    8480; another port is a proxy in front of both); Prometheus' receiver and single-node
    VictoriaMetrics answer queries where `/api/v1/write` is taken; "" for any other URL."""
    parts = urllib.parse.urlsplit(url)
    if cluster := re.fullmatch(r"(.*)/insert/(\d+)/prometheus/api/v1/write/?", parts.path):
        netloc = parts.netloc
        if parts.port == VMINSERT_PORT:
            netloc = netloc.removesuffix(f":{VMINSERT_PORT}") + f":{VMSELECT_PORT}"
        return urllib.parse.urlunsplit(
            (parts.scheme, netloc, f"{cluster[1]}/select/{cluster[2]}/prometheus", "", "")
        )
    if single := re.fullmatch(r"(.*)/api/v1/write/?", parts.path):
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, single[1], "", ""))
    return ""


def facts(spec: ClusterSpec, addresses: AddressPlan) -> dict[str, Any]:
    """The wiring facts the roles read (inventory vars, without the superkube_ prefix)."""
    return {
        "apiserver_port": APISERVER_PORT,
        "etcd_client_port": ETCD_CLIENT_PORT,
        "etcd_peer_port": ETCD_PEER_PORT,
        "etcd_metrics_port": ETCD_METRICS_PORT,
        "node_exporter_port": NODE_EXPORTER_PORT,
        "containerd_metrics_port": CONTAINERD_METRICS_PORT,
        "kernel_log_dir": KERNEL_LOG_DIR,
        "kernel_log": KERNEL_LOG,
        "iptables_exporter_port": IPTABLES_EXPORTER_PORT,
        "node_agents_metrics_port": NODE_AGENTS_METRICS_PORT,
        "scale_governor_metrics_port": SCALE_GOVERNOR_METRICS_PORT,
        "join_tokens_metrics_port": JOIN_TOKENS_METRICS_PORT,
        "remediation_metrics_port": REMEDIATION_METRICS_PORT,
        "prometheus_pki_dir": PROMETHEUS_PKI_DIR,
        # monitoring: shard i runs on prometheus_ips[i] and writes to metrics_store_write_urls[i]
        "prometheus_ips": [str(ip) for ip in addresses.prometheus_ips],
        "metrics_store_ips": [str(ip) for ip in addresses.metrics_store_ips],
        "metrics_store_write_urls": metrics_store_write_urls(spec, addresses),
        # where Grafana's datasource reads them ("" when a store the spec names does not say)
        "metrics_store_query_url": metrics_store_query_url(spec, addresses),
        "vminsert_port": VMINSERT_PORT,
        "vmselect_port": VMSELECT_PORT,
        "vmstorage_insert_port": VMSTORAGE_INSERT_PORT,
        "vmstorage_select_port": VMSTORAGE_SELECT_PORT,
        "vmstorage_http_port": VMSTORAGE_HTTP_PORT,
        "apiserver_url": apiserver_url(addresses.apiserver_lb_ip),
        "apiserver_ips": [str(ip) for ip in addresses.apiserver_ips],
        "apiserver_sans": apiserver_ip_sans(addresses),
        "apiserver_dns_names": apiserver_dns_names(),
        "service_ip": service_ip(spec.service_cidr),
        "dns_ip": service_ip(spec.service_cidr, DNS_SERVICE_INDEX),
        "cluster_domain": CLUSTER_DOMAIN,
        "team_webhook_dns_names": team_webhook_dns_names(),
        # where cloud-init's registration lies and which file's arrival starts its join unit
        "kubelet_registration_file": REGISTRATION_FILE,
        "kubelet_bootstrap_kubeconfig": BOOTSTRAP_KUBECONFIG,
        "pools": {
            p.name: {"role": p.role, "pod_ips_per_node": p.pod_ips_per_node, "max_pods": max_pods(p)}
            for p in spec.node_pools
        },
    }


TEAM_WEBHOOK_SERVICE = "superkube-team-webhook"


def team_webhook_dns_names() -> list[str]:
    """The names the API server reaches the team webhook's Service by (its certificate's SANs)."""
    base = f"{TEAM_WEBHOOK_SERVICE}.{SYSTEM_NAMESPACE}.svc"
    return [base, f"{base}.{CLUSTER_DOMAIN}"]


# API Priority and Fairness: the nominalConcurrencyShares of the priority levels every API server
# creates itself (k8s.io/apiserver's flowcontrol bootstrap: the mandatory catch-all and the suggested
# levels). A level of ours gets shares / (sum of all shares) of the server's concurrency limit,
# which is --max-requests-inflight plus --max-mutating-requests-inflight.
APF_BUILTIN_SHARES = {
    "catch-all": 5,
    "system": 30,
    "node-high": 40,
    "leader-election": 10,
    "workload-high": 40,
    "workload-low": 100,
    "global-default": 20,
}
APF_NODE_HIGH_PRECEDENCE = 400
"""matchingPrecedence of the built-in `system-node-high` FlowSchema (node status and leases)."""
APF_NODE_JOIN_LEVEL = "superkube-node-join"
"""The priority level joining nodes' bootstrap and registration queue on (the layer's flowcontrol);
its dashboard panels select it by this name."""


def apf_seats(shares: int, total_concurrency: int) -> int:
    """Concurrency seats a priority level with `shares` gets on one API server (rounded up, as upstream)."""
    total_shares = shares + sum(APF_BUILTIN_SHARES.values())
    return -(-total_concurrency * shares // total_shares)


# Inventory groups: the values of the superkube-role tag the Pulumi program writes on every VM and
# scale set, which the Azure dynamic inventory (and the lab's) groups hosts by.
GPU_NODES = "gpu_nodes"
CPU_NODES = "cpu_nodes"
NAT_HOST = "nat_host"
ETCD_MAIN = "etcd_main"
ETCD_EVENTS = "etcd_events"
APISERVERS = "apiservers"
GROUPS = (GPU_NODES, CPU_NODES, NAT_HOST, ETCD_MAIN, ETCD_EVENTS, APISERVERS)
# Hosts beside the cluster (groups of their own, outside `cluster`): one Prometheus shard each, and
# the metrics store (VictoriaMetrics' cluster version) the shards remote-write to
MONITORING = "monitoring"
METRICS_STORE = "metrics_store"
# every machine's role tag is one of these: the cluster's groups and the hosts beside it
MACHINE_GROUPS = (*GROUPS, MONITORING, METRICS_STORE)
VMINSERT_PORT = 8480  # the store's remote-write entry on every store host
VMSELECT_PORT = 8481  # its query entry (Prometheus API under /select/0/prometheus)
VMSTORAGE_HTTP_PORT = 8482  # vmstorage's own HTTP listener: its /metrics
PROMETHEUS_PORT = 9090  # each Prometheus shard's web and /metrics listener (the lab's next shard: +1)
AUTOSCALER_METRICS_PORT = 8085  # cluster-autoscaler's /metrics (its --address) on each API-server host
VMSTORAGE_INSERT_PORT = 8400  # vmstorage, for every host's vminsert
VMSTORAGE_SELECT_PORT = 8401  # vmstorage, for every host's vmselect


def pool_group(role: str) -> str:
    """The group of a node pool's hosts: gpu pools in gpu_nodes, cpu pools in cpu_nodes."""
    return f"{role}_nodes"


def etcd_group(role: str) -> str:
    """The group of an etcd cluster's members: etcd_main or etcd_events."""
    return f"etcd_{role}"
