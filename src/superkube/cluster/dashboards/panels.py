"""The facts the boards stand on (the pinned upstream versions and what each exports, which job
scrapes superkube's own series, which panels the lab cannot fill and why) and the building blocks of
a board: Board, Row, Panel, Query and their short constructors."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from superkube.cluster.autoscaling import VERSION as AUTOSCALER_VERSION
from superkube.model.spec import ClusterSpec

DATASOURCE_UID = "superkube-metrics"
"""The datasource every panel and variable reads: the cluster's metrics store (provisioned below)."""
FOLDER = "superkube"
TAG = "superkube"
GRAFANA_DIR = "/etc/superkube-grafana"
"""Where the files go on a monitoring host: dashboards/ (the provider reads it) and provisioning/
(Grafana's `paths.provisioning`)."""
DASHBOARDS_DIR = f"{GRAFANA_DIR}/dashboards"

KUBERNETES_VERSION = str(ClusterSpec.model_fields["kubernetes_version"].default)
ETCD_VERSION = "3.6.6"  # kube_component's release-1.35.yml (what Kubernetes 1.35.0 is built with)
CADVISOR_VERSION = "0.53.0"  # built into the kubelet: Kubernetes 1.35.0's go.mod
PROMETHEUS_VERSION = "2.53.2"  # upstream's release, which the monitoring role installs
VICTORIA_METRICS_VERSION = "1.104.0"  # the metrics_store role's cluster version

# Grafana's variables, and the values a check puts in their place (promtool, a query to the store)
VARIABLES = {"$__rate_interval": "5m", "$cluster": ".+", "$namespace": ".+"}


@dataclass(frozen=True)
class Source:
    """Where an upstream metric comes from: the program, the pinned version that exports it under this
    name, and the scrape jobs that read it (none yet: empty)."""

    program: str
    version: str
    jobs: tuple[str, ...]


EVERY_JOB = "*"
"""In place of a job: a series Prometheus itself writes for every target it scrapes (`up`, `scrape_*`)."""

_APISERVER = Source("kube-apiserver", KUBERNETES_VERSION, ("apiserver",))
_ETCD = Source("etcd", ETCD_VERSION, ("etcd-main", "etcd-events"))
_CADVISOR = Source(f"cAdvisor {CADVISOR_VERSION} in the kubelet", KUBERNETES_VERSION, ("cadvisor",))
_AUTOSCALER = Source("cluster-autoscaler", AUTOSCALER_VERSION, ("cluster-autoscaler",))
_PROMETHEUS_SCRAPE = Source("prometheus (for every target)", PROMETHEUS_VERSION, (EVERY_JOB,))
_PROMETHEUS = Source("prometheus (its own /metrics)", PROMETHEUS_VERSION, ("prometheus",))
_VMSTORAGE = Source("vmstorage", VICTORIA_METRICS_VERSION, ("metrics-store",))
_VMINSERT = Source("vminsert", VICTORIA_METRICS_VERSION, ("metrics-store",))
_VMSELECT = Source("vmselect", VICTORIA_METRICS_VERSION, ("metrics-store",))

UPSTREAM: dict[str, Source] = {
    # k8s.io/apiserver v0.35.0: pkg/endpoints/metrics, pkg/util/flowcontrol/metrics, pkg/storage/etcd3/metrics
    "apiserver_request_total": _APISERVER,
    "apiserver_request_duration_seconds_bucket": _APISERVER,
    "apiserver_resource_objects": _APISERVER,
    "apiserver_flowcontrol_current_inqueue_requests": _APISERVER,
    "apiserver_flowcontrol_current_executing_seats": _APISERVER,
    "apiserver_flowcontrol_nominal_limit_seats": _APISERVER,
    "apiserver_flowcontrol_request_wait_duration_seconds_bucket": _APISERVER,
    "apiserver_flowcontrol_rejected_requests_total": _APISERVER,
    "apiserver_flowcontrol_dispatched_requests_total": _APISERVER,
    # go.etcd.io/etcd/server/v3 v3.6.6 (etcdserver, storage, rafthttp; gRPC from go-grpc-middleware)
    "etcd_server_has_leader": _ETCD,
    "etcd_server_leader_changes_seen_total": _ETCD,
    "etcd_disk_backend_commit_duration_seconds_bucket": _ETCD,
    "etcd_mvcc_db_total_size_in_bytes": _ETCD,
    "etcd_mvcc_db_total_size_in_use_in_bytes": _ETCD,
    "etcd_server_quota_backend_bytes": _ETCD,
    "etcd_server_proposals_committed_total": _ETCD,
    "etcd_server_proposals_failed_total": _ETCD,
    "etcd_server_proposals_pending": _ETCD,
    "etcd_network_peer_round_trip_time_seconds_bucket": _ETCD,
    "grpc_server_handled_total": _ETCD,
    # github.com/google/cadvisor v0.53.0 metrics/prometheus.go, served by the kubelet's /metrics/cadvisor
    "container_cpu_usage_seconds_total": _CADVISOR,
    "container_memory_working_set_bytes": _CADVISOR,
    # kubernetes/autoscaler tag cluster-autoscaler-1.35.2, cluster-autoscaler/metrics/metrics.go
    "cluster_autoscaler_nodes_count": _AUTOSCALER,
    "cluster_autoscaler_unschedulable_pods_count": _AUTOSCALER,
    "cluster_autoscaler_scaled_up_nodes_total": _AUTOSCALER,
    "cluster_autoscaler_scaled_down_nodes_total": _AUTOSCALER,
    "cluster_autoscaler_failed_scale_ups_total": _AUTOSCALER,
    "cluster_autoscaler_cluster_safe_to_autoscale": _AUTOSCALER,
    "cluster_autoscaler_errors_total": _AUTOSCALER,
    "cluster_autoscaler_last_activity": _AUTOSCALER,
    # what Prometheus writes for each target it scrapes, and its own /metrics (2.53.2, run on the lab)
    "up": _PROMETHEUS_SCRAPE,
    "scrape_duration_seconds": _PROMETHEUS_SCRAPE,
    "scrape_samples_scraped": _PROMETHEUS_SCRAPE,
    "scrape_samples_post_metric_relabeling": _PROMETHEUS_SCRAPE,
    "scrape_series_added": _PROMETHEUS_SCRAPE,
    "prometheus_remote_storage_samples_total": _PROMETHEUS,
    "prometheus_remote_storage_samples_failed_total": _PROMETHEUS,
    "prometheus_remote_storage_samples_pending": _PROMETHEUS,
    "prometheus_tsdb_head_series": _PROMETHEUS,
    # VictoriaMetrics tag v1.104.0-cluster: app/vmstorage, app/vminsert, app/vmselect
    "vm_rows_inserted_total": _VMINSERT,
    "vm_rpc_rows_pending": _VMINSERT,
    "vm_rpc_vmstorage_is_reachable": _VMINSERT,
    "vm_cache_entries": _VMSTORAGE,
    "vm_new_timeseries_created_total": _VMSTORAGE,
    "vm_data_size_bytes": _VMSTORAGE,
    "vm_free_disk_space_bytes": _VMSTORAGE,
    "vm_http_request_errors_total": _VMSELECT,
}

SCRAPED_BY: dict[str, str] = {
    # superkube's own programs, by metric prefix -> the scrape job of superkube.cluster.monitoring
    "superkube_health_": "node-agents",  # the health agent and the health controller
    "superkube_preflight_": "node-agents",
    "superkube_gpu_reset": "node-agents",  # the GPU reset's pods (the node-health component)
    "superkube_scale_governor_": "scale-governor",
    "superkube_remediation_": "remediation",
    "superkube_join_tokens_": "join-tokens",
    "superkube_serving_certs": "platform-agents",
    "superkube_team_": "platform-agents",  # the team-taints reconciler and the team webhook
    "superkube_namespace_team": "platform-agents",  # the team-taints reconciler
    "iptables_": "iptables-exporter",
}

NOT_SCRAPED: dict[str, str] = {}
"""Metrics some panel reads that the generated Prometheus configuration does not scrape, and why."""

AUTOSCALER_ONLY = (
    "only cluster-autoscaler makes these, and it runs against Azure's scale sets; the lab runs none"
)
REMEDIATION_OFF = (
    "remediation deletes Azure VMs from the API-server hosts as its own identity; the lab has no Azure "
    "and does not start it (remediation_start is off there)"
)
GOVERNOR_ONLY = (
    "the scale governor runs only beside cluster-autoscaler on the API-server hosts, and acts by "
    "writing Azure scale sets' max tags; the lab runs neither (scale_governor_start is off there)"
)
CLUSTER_STORE_ONLY = (
    "only the store's cluster version has vminsert's RPC to vmstorage; the lab's store is "
    "VictoriaMetrics' single-node version (the monitoring role's lab store)"
)
GPU_RESET_ONLY = (
    "only a GPU fault that a reset may clear asks for a reset, and only a real GPU is reset: no lab "
    "fault is one (a GPU gone, Xid 79), and the lab's reset pods never run"
)
LAB_EMPTY: dict[str, str] = {
    "superkube-autoscaling/Nodes by state (the autoscaler's view)": AUTOSCALER_ONLY,
    "superkube-autoscaling/Unschedulable pods (the autoscaler's view)": AUTOSCALER_ONLY,
    "superkube-autoscaling/Nodes added and removed in the last hour": AUTOSCALER_ONLY,
    "superkube-autoscaling/Failed scale-ups in the last hour, by reason": AUTOSCALER_ONLY,
    "superkube-autoscaling/Safe to autoscale, and loop errors in the last hour": AUTOSCALER_ONLY,
    "superkube-autoscaling/Time since the autoscaler's last main loop": AUTOSCALER_ONLY,
    "superkube-autoscaling/Room granted, by scale set": GOVERNOR_ONLY,
    "superkube-autoscaling/Governors acting, held, and the budget a round may open": GOVERNOR_ONLY,
    "superkube-autoscaling/Max-size writes and rounds in the last hour": GOVERNOR_ONLY,
    "superkube-health/GPU reset requests and their end, in the last hour": GPU_RESET_ONLY,
    "superkube-health/VMs deleted in the last hour, and the hour's deletions left": REMEDIATION_OFF,
    "superkube-health/Cordoned nodes remediation holds, by reason": REMEDIATION_OFF,
    "superkube-health/GPU resets in the last hour, by outcome": GPU_RESET_ONLY,
    "superkube-monitoring/vminsert to vmstorage: rows waiting, storage hosts reachable": CLUSTER_STORE_ONLY,
}
"""Panels (`<dashboard uid>/<panel title>`) whose every query is empty on the lab, and why."""


# --- the dashboards ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Board:
    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]
    variables: tuple[str, ...] = ("cluster",)

    def panels(self) -> Iterator[Panel]:
        for row in self.rows:
            yield from row.panels


def q(expr: str, legend: str = "") -> Query:
    return Query(" ".join(expr.split()), legend)


def panel(title: str, description: str, *queries: Query, unit: str = "short") -> Panel:
    return Panel(title, description, queries, unit)


C = 'cluster=~"$cluster"'  # in every selector: one cluster of the store's
