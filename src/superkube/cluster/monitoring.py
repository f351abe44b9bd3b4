"""Prometheus for one cluster, generated from its spec: sharded scrape configs, drop rules, alerts.

One place builds it all, so what is scraped, what is dropped and what is alerted on is reviewed
with the cluster's spec:
- `prometheus_shards` Prometheus servers share the targets by `hashmod` of the target address; every
  shard scrapes every job, keeps only its own share, and remote-writes to the long-term store, so
  queries see all shards' series in one place;
- each job's `metric_relabel_configs` drop the series explosions known at this scale, each with the
  reason (`DROP` below); `tests/cluster/test_prometheus.py` shows each rule removes its series and keeps siblings;
- query limits and GOMAXPROCS are flags and environment of the server: the `monitoring` role's
  unit sets them;
- alert and recording rules live in `data/monitoring/rules.yml`, each alert unit-tested with
  `promtool test rules` (`data/monitoring/tests/`).

Targets: the control plane and the NAT host at the plan's fixed addresses (superkube's host
services on the API-server hosts among them: the scale governor, the join-token publisher and
cluster-autoscaler); the monitoring pipeline itself (every shard's own /metrics, and the store's
vminsert, vmselect and vmstorage); Kubernetes nodes from node discovery (their InternalIP), so
scale-ups need no new config; the agents' pods in the cluster from pod discovery (their `metrics`
container ports); every host statically on the lab.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from superkube.cluster.kube import (
    APISERVER_PORT,
    APISERVERS,
    AUTOSCALER_METRICS_PORT,
    CPU_NODES,
    ETCD_EVENTS,
    ETCD_MAIN,
    ETCD_METRICS_PORT,
    GPU_NODES,
    IPTABLES_EXPORTER_PORT,
    JOIN_TOKENS_METRICS_PORT,
    METRICS_STORE,
    MONITORING,
    NAT_HOST,
    NODE_AGENTS_METRICS_PORT,
    NODE_EXPORTER_PORT,
    NODE_HEALTH_COMPONENT,
    PROMETHEUS_PKI_DIR,
    PROMETHEUS_PORT,
    REMEDIATION_METRICS_PORT,
    SCALE_GOVERNOR_METRICS_PORT,
    SERVING_CERTS_COMPONENT,
    SYSTEM_NAMESPACE,
    TEAM_CAPACITY_COMPONENT,
    VMINSERT_PORT,
    VMSELECT_PORT,
    VMSTORAGE_HTTP_PORT,
    apiserver_url,
    metrics_store_write_urls,
)

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "data" / "monitoring" / "rules.yml"
RULE_TESTS = ROOT / "data" / "monitoring" / "tests"

SCRAPE_INTERVAL = "30s"


@dataclass(frozen=True)
class Drop:
    """One metric_relabel rule that drops series, with the reason a reviewer reads."""

    why: str
    regex: str
    source_labels: tuple[str, ...] = ("__name__",)

    def config(self) -> dict[str, Any]:
        return {"source_labels": list(self.source_labels), "regex": self.regex, "action": "drop"}


# Histogram buckets the API server exports per verb x resource x scope x component: at 7,500 nodes
# the largest single source of series. Keep le 0.05 0.1 0.4 1 5 10 60 +Inf (enough for the SLO and
# the latency alerts), drop the other 16 boundaries.
_APISERVER_LE = "0.005|0.025|0.2|0.6|0.8|1.25|1.5|2|3|4|6|8|15|20|30|45"

DROP: dict[str, tuple[Drop, ...]] = {
    "apiserver": (
        Drop(
            "request latency buckets: 16 of 24 boundaries x every verb/resource/scope; the 8 kept serve the SLO",
            rf"apiserver_request_(duration|sli_duration|slo_duration)_seconds_bucket;({_APISERVER_LE})(\.0)?",
            ("__name__", "le"),
        ),
        Drop(
            "the API server's etcd client latency per resource type: a bucket set per kind, unused by any alert",
            "etcd_request_duration_seconds_bucket",
        ),
        Drop(
            "response and watch-event size histograms: per resource, never queried in operations",
            "apiserver_(response_sizes|watch_events_sizes)_bucket",
        ),
        Drop(
            "admission webhook and step latency buckets per plugin; counts and sums stay",
            "apiserver_admission_(step|controller|webhook)_admission_duration_seconds_bucket",
        ),
    ),
    "etcd": (
        Drop(
            "gRPC handling latency per method: buckets x every method; the etcd disk and leader alerts use others",
            "grpc_server_handling_seconds_bucket",
        ),
        Drop("debugging series the etcd docs call unstable", "etcd_debugging_.*"),
    ),
    "kubelet": (
        Drop(
            "client and runtime-operation latency buckets per verb/operation on every node",
            "(rest_client_request_duration_seconds|kubelet_runtime_operations_duration_seconds|storage_operation_duration_seconds)_bucket",
        ),
    ),
    "cadvisor": (
        Drop(
            "per-container series no dashboard or alert reads (TCP/UDP usage, task states, load, "
            "memory failures, block I/O per device)",
            "container_(network_tcp_usage_total|network_udp_usage_total|tasks_state|cpu_load_average_10s|"
            "memory_failures_total|blkio_device_usage_total)",
        ),
        Drop(
            "cgroup series of system slices and pause containers (no container label): node-exporter covers the node",
            "container_.*;",
            ("__name__", "container"),
        ),
    ),
    "node-exporter": (
        Drop(
            "per-CPU guest time and softnet stats: x 96-192 CPUs per GPU node, used by nothing",
            "node_(cpu_guest_seconds_total|softnet_.*)",
        ),
        Drop("the exporter's own per-collector timings", "node_scrape_collector_.*"),
    ),
    "iptables-exporter": (
        Drop("packet counts beside bytes: the accounting alerts use bytes", "iptables_rule_packets_total"),
    ),
}


@dataclass(frozen=True)
class Job:
    name: str
    port: int = 0  # where its hosts serve (a pod job reads each pod's `metrics` port instead)
    groups: tuple[str, ...] = ()  # inventory groups whose hosts are targets
    scheme: str = "http"
    drops: str = ""  # key of DROP
    path: str = "/metrics"
    reviewed: str = ""  # for a job with nothing to drop: why its series need no drop rule
    pods_of: str = ""  # scrape the pods of these in-cluster components (a regex of the label), not hosts
    more_ports: tuple[int, ...] = ()  # further ports each of its hosts serves this job's /metrics on

    def __post_init__(self) -> None:
        if bool(self.drops) == bool(self.reviewed):
            raise ValueError(f"scrape job {self.name}: give drop rules or say why it needs none, not both")
        if not self.pods_of and not (self.port and self.groups):
            raise ValueError(
                f"scrape job {self.name}: give its hosts' groups and port, or the pods it scrapes"
            )


def jobs() -> tuple[Job, ...]:
    nodes = (GPU_NODES, CPU_NODES)
    return (
        Job("apiserver", APISERVER_PORT, (APISERVERS,), "https", "apiserver"),
        Job("etcd-main", ETCD_METRICS_PORT, (ETCD_MAIN,), drops="etcd"),
        Job("etcd-events", ETCD_METRICS_PORT, (ETCD_EVENTS,), drops="etcd"),
        Job("kubelet", 10250, nodes, "https", "kubelet"),
        Job("cadvisor", 10250, nodes, "https", "cadvisor", "/metrics/cadvisor"),
        Job(
            "node-exporter",
            NODE_EXPORTER_PORT,
            (*nodes, NAT_HOST, ETCD_MAIN, ETCD_EVENTS, APISERVERS),
            drops="node-exporter",
        ),
        Job("iptables-exporter", IPTABLES_EXPORTER_PORT, (*nodes, NAT_HOST), drops="iptables-exporter"),
        Job(
            "node-agents",
            NODE_AGENTS_METRICS_PORT,
            nodes,
            pods_of=NODE_HEALTH_COMPONENT,
            reviewed="superkube's preflight and health agents export a few series per node, each bounded "
            "by its result, reason and action labels; nothing to drop",
        ),
        Job(
            "scale-governor",
            SCALE_GOVERNOR_METRICS_PORT,
            (APISERVERS,),
            reviewed="one governor per API-server host: a few series, labelled by scale set and result; "
            "nothing to drop",
        ),
        Job(
            "remediation",
            REMEDIATION_METRICS_PORT,
            (APISERVERS,),
            reviewed="one remediation per API-server host (one acts): a few series, labelled by result and "
            "held reason; nothing to drop",
        ),
        Job(
            "join-tokens",
            JOIN_TOKENS_METRICS_PORT,
            (APISERVERS,),
            reviewed="one publisher per API-server host: a few series, labelled by result; nothing to drop",
        ),
        Job(
            "platform-agents",
            pods_of=f"{SERVING_CERTS_COMPONENT}|{TEAM_CAPACITY_COMPONENT}",  # app.kubernetes.io/component
            reviewed="the serving-certificate approver, the team-taints reconciler and the team webhook: a "
            "few replicas, their series bounded by decision, reason and code labels; nothing to drop",
        ),
        Job(
            AUTOSCALER_JOB,
            AUTOSCALER_METRICS_PORT,
            (APISERVERS,),
            reviewed="one cluster-autoscaler per API-server host (one leads): its series are per node group "
            "and reason, a few hundred at most; nothing to drop",
        ),
        Job(
            "prometheus",
            PROMETHEUS_PORT,
            (MONITORING,),
            reviewed="each shard's own /metrics: a few hundred series per shard (its TSDB, rules, remote "
            "write queues); nothing to drop",
        ),
        Job(
            "metrics-store",
            VMINSERT_PORT,
            (METRICS_STORE,),
            more_ports=(VMSELECT_PORT, VMSTORAGE_HTTP_PORT),
            reviewed="vminsert, vmselect and vmstorage on each store host: a few hundred series each, "
            "bounded by path, type and peer; nothing to drop",
        ),
    )


AUTOSCALER_JOB = "cluster-autoscaler"
"""Scraped only where the stack runs cluster-autoscaler (superkube:autoscaler_enabled)."""


def _shard_relabel(shards: int, shard: int) -> list[dict[str, Any]]:
    return [
        {
            "source_labels": ["__address__"],
            "modulus": shards,
            "target_label": "__tmp_shard",
            "action": "hashmod",
        },
        {"source_labels": ["__tmp_shard"], "regex": str(shard), "action": "keep"},
    ]


PKI = PROMETHEUS_PKI_DIR


def _auth() -> dict[str, Any]:
    return {"tls_config": {"ca_file": f"{PKI}/ca.crt"}, "authorization": {"credentials_file": f"{PKI}/token"}}


def _sd(role: str, api_server: str, **extra: Any) -> list[dict[str, Any]]:
    """Kubernetes discovery from the hosts beside the cluster: its API server, as a client of it."""
    return [{"role": role, **({"api_server": api_server, **_auth()} if api_server else {}), **extra}]


def _discovery(
    job: Job,
    targets: Mapping[str, Sequence[str]],
    nodes_from_kubernetes: bool,
    api_server: str = "",
    ports: Sequence[int] = (),
) -> dict[str, Any]:
    """Static targets for the job's groups; Kubernetes nodes come from node discovery in a cluster
    (their InternalIP, the NIC's primary IP) so joining and leaving nodes need no new config; an
    in-cluster component's pods come from pod discovery (only where they run: the preflight agent
    leaves a node once it has passed), through their `metrics` ports."""
    if job.pods_of:
        if not nodes_from_kubernetes:
            return {}
        return {
            "kubernetes_sd_configs": _sd("pod", api_server, namespaces={"names": [SYSTEM_NAMESPACE]}),
            "relabel_configs": [
                {
                    "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_component"],
                    "regex": job.pods_of,
                    "action": "keep",
                },
                {
                    "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                    "regex": "metrics",
                    "action": "keep",
                },
                {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
                {
                    "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
                    "target_label": "agent",
                },
            ],
        }
    node_groups = {GPU_NODES, CPU_NODES}
    out: dict[str, Any] = {}
    hosts = sorted(
        {
            h
            for g in job.groups
            if not (nodes_from_kubernetes and g in node_groups)
            for h in targets.get(g, ())
        }
    )
    if hosts:
        on = ports or (job.port, *job.more_ports)
        out["static_configs"] = [{"targets": [f"{h}:{port}" for h in hosts for port in on]}]
    if nodes_from_kubernetes and node_groups & set(job.groups):
        out["kubernetes_sd_configs"] = _sd("node", api_server)
        out["relabel_configs"] = [
            {
                # static targets (control plane, NAT host) pass; discovered nodes get the job's port
                "source_labels": ["__meta_kubernetes_node_address_InternalIP"],
                "regex": "(.+)",
                "replacement": f"${{1}}:{job.port}",
                "target_label": "__address__",
            },
            {"source_labels": ["__meta_kubernetes_node_label_superkube_io_pool"], "target_label": "pool"},
        ]
    return out


def prometheus_config(
    cluster: str,
    shards: int,
    shard: int,
    store_url: str,
    targets: Mapping[str, Sequence[str]],
    *,
    nodes_from_kubernetes: bool = True,
    api_server: str = "",
    rule_files: Sequence[str] = ("rules/*.yml",),
    scrape_interval: str = SCRAPE_INTERVAL,
    only_jobs: Sequence[str] | None = None,
    ports: Mapping[str, Sequence[int]] | None = None,
    autoscaler: bool = True,
) -> dict[str, Any]:
    """One shard's prometheus.yml: `targets` maps inventory groups to host addresses (the plan's
    control plane, NAT host, Prometheus and store hosts in a cluster; every host on the lab, with
    nodes_from_kubernetes off where the lab has no API server). `ports` gives a job's ports where
    they differ from the cluster's (the lab's shards share one host; its store is one process);
    `autoscaler` is whether the stack runs cluster-autoscaler."""
    if not 0 <= shard < shards:
        raise ValueError(f"shard {shard} is not in 0..{shards - 1}")
    scrape = []
    for job in jobs():
        if only_jobs is not None and job.name not in only_jobs:
            continue
        if job.name == AUTOSCALER_JOB and not autoscaler:
            continue
        found = _discovery(job, targets, nodes_from_kubernetes, api_server, (ports or {}).get(job.name, ()))
        if not found:
            continue
        config: dict[str, Any] = {
            "job_name": job.name,
            "scheme": job.scheme,
            "metrics_path": job.path,
            **found,
        }
        config["relabel_configs"] = [*config.get("relabel_configs", []), *_shard_relabel(shards, shard)]
        if job.scheme == "https":
            config.update(_auth())
        if job.drops:
            config["metric_relabel_configs"] = [d.config() for d in DROP[job.drops]]
        scrape.append(config)
    return {
        "global": {
            "scrape_interval": scrape_interval,
            "evaluation_interval": scrape_interval,
            "external_labels": {"cluster": cluster, "prometheus_shard": str(shard)},
        },
        "rule_files": list(rule_files),
        "scrape_configs": scrape,
        "remote_write": [
            {
                "url": store_url,
                "queue_config": {"max_samples_per_send": 10000, "capacity": 20000, "max_shards": 30},
            }
        ],
    }


def cluster_targets(addresses: Any, own_store: bool = True) -> dict[str, list[str]]:
    """The plan's fixed hosts by group: API servers, etcd members, the NAT host, the Prometheus
    hosts and (unless the stack writes to a store elsewhere) the store's hosts."""
    return {
        APISERVERS: [str(ip) for ip in addresses.apiserver_ips],
        ETCD_MAIN: [str(ip) for ip in addresses.etcd_main_ips],
        ETCD_EVENTS: [str(ip) for ip in addresses.etcd_events_ips],
        NAT_HOST: [str(addresses.nat_host_ip)],
        MONITORING: [str(ip) for ip in addresses.prometheus_ips],
        METRICS_STORE: [str(ip) for ip in addresses.metrics_store_ips] if own_store else [],
    }


DROPS_COMMENT = "# drops: "
REVIEWED_COMMENT = "# reviewed: "


def render(config: dict[str, Any]) -> str:
    """prometheus.yml text with each drop rule's reason as a comment above it, and above a job
    that drops nothing, why it needs no drop rule: what a reviewer reads, and what `superkube check`
    insists on (policies/rules/monitoring.py)."""
    text = yaml.safe_dump(config, sort_keys=False, width=400)
    reasons = {d.regex: d.why for drops in DROP.values() for d in drops}
    reviewed = {j.name: j.reviewed for j in jobs() if j.reviewed}
    lines = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("- job_name: "):
            why = reviewed.get(yaml.safe_load(stripped.removeprefix("- job_name: ")))
            if why:
                lines.append(f"{line[: len(line) - len(stripped)]}{REVIEWED_COMMENT}{why}")
        if stripped.startswith("regex: "):
            reason = reasons.get(yaml.safe_load(stripped.removeprefix("regex: ")))
            if reason:
                lines.append(f"{line[: len(line) - len(stripped)]}{DROPS_COMMENT}{reason}")
        lines.append(line)
    return "\n".join(lines) + "\n"


def shard_configs(spec: Any, addresses: Any, cluster: str) -> list[str]:
    """The rendered prometheus.yml of each of the cluster's shards."""
    urls = metrics_store_write_urls(spec, addresses)
    return [
        render(
            prometheus_config(
                cluster,
                spec.prometheus_shards,
                shard,
                urls[shard],
                cluster_targets(addresses, own_store=not spec.metrics_store_url),
                api_server=apiserver_url(addresses.apiserver_lb_ip),
                autoscaler=spec.autoscaler_enabled,
            )
        )
        for shard in range(spec.prometheus_shards)
    ]


def bundle(spec: Any, addresses: Any, cluster: str) -> dict[str, Any]:
    """What `superkube check` reviews: every shard's rendered config, the rules, the rule tests."""
    return {
        "prometheus": shard_configs(spec, addresses, cluster),
        "rules": RULES.read_text(),
        "rule_tests": {p.name: p.read_text() for p in sorted(RULE_TESTS.glob("*.yml"))},
        "external_store": spec.metrics_store_url,  # a store the spec names instead of its own hosts
    }


def write(spec: Any, addresses: Any, out: Path, cluster: str) -> list[Path]:
    """Every shard's config and the rules, as the cluster's Prometheus servers read them."""
    written = []
    (out / "rules").mkdir(parents=True, exist_ok=True)
    rules = out / "rules" / "superkube.yml"
    rules.write_text(RULES.read_text())
    written.append(rules)
    for shard, text in enumerate(shard_configs(spec, addresses, cluster)):
        path = out / f"prometheus-{shard}.yml"
        path.write_text(text)
        written.append(path)
    return written
