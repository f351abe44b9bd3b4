"""Grafana dashboards for one cluster, as code: built with Grafana's own `grafana-foundation-sdk`
(pinned in pyproject.toml; its builders target Grafana 11.6, the version the `monitoring` role pins)
and written as Grafana's JSON by `superkube monitoring render`, beside the Prometheus configuration,
with Grafana's provisioning files: a dashboards provider and a datasource for the cluster's metrics
store (every Prometheus shard remote-writes there, so one query sees every shard's series).

Every panel's query is written once, below, as PromQL. What a query may name is checked
(tests/cluster/test_dashboards.py): a metric one of superkube's agents exports, a recording rule's
(data/monitoring/rules.yml), or an upstream metric in UPSTREAM with the pinned version that exports
it. Two lists say which panels cannot show data, and why; each such panel's description says so:
- LAB_EMPTY: panels whose every query is empty on the lab, because only Azure, the autoscaler, a
  GPU or the store's cluster version produces their series (the lab's tests ask every other
  panel's queries of the lab's real shards and store: tests/lab/test_seeing_the_cluster.py);
- NOT_SCRAPED: metrics the generated Prometheus configuration does not scrape (none now).

Every selector carries `cluster=~"$cluster"` (the store may hold several clusters: each shard's
external labels name its cluster), and `$__rate_interval` is Grafana's (at least four scrape
intervals; the datasource tells Grafana the scrape interval).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from superkube.cluster.autoscaling import VERSION as AUTOSCALER_VERSION
from superkube.cluster.kube import APF_NODE_JOIN_LEVEL
from superkube.cluster.monitoring import SCRAPE_INTERVAL
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

_AUTOSCALER_ONLY = (
    "only cluster-autoscaler makes these, and it runs against Azure's scale sets; the lab runs none"
)
_REMEDIATION_OFF = (
    "remediation deletes Azure VMs from the API-server hosts as its own identity; the lab has no Azure "
    "and does not start it (remediation_start is off there)"
)
_GOVERNOR_ONLY = (
    "the scale governor runs only beside cluster-autoscaler on the API-server hosts, and acts by "
    "writing Azure scale sets' max tags; the lab runs neither (scale_governor_start is off there)"
)
_CLUSTER_STORE_ONLY = (
    "only the store's cluster version has vminsert's RPC to vmstorage; the lab's store is "
    "VictoriaMetrics' single-node version (the monitoring role's lab store)"
)
_GPU_RESET_ONLY = (
    "only a GPU fault that a reset may clear asks for a reset, and only a real GPU is reset: no lab "
    "fault is one (a GPU gone, Xid 79), and the lab's reset pods never run"
)
LAB_EMPTY: dict[str, str] = {
    "superkube-autoscaling/Nodes by state (the autoscaler's view)": _AUTOSCALER_ONLY,
    "superkube-autoscaling/Unschedulable pods (the autoscaler's view)": _AUTOSCALER_ONLY,
    "superkube-autoscaling/Nodes added and removed in the last hour": _AUTOSCALER_ONLY,
    "superkube-autoscaling/Failed scale-ups in the last hour, by reason": _AUTOSCALER_ONLY,
    "superkube-autoscaling/Safe to autoscale, and loop errors in the last hour": _AUTOSCALER_ONLY,
    "superkube-autoscaling/Time since the autoscaler's last main loop": _AUTOSCALER_ONLY,
    "superkube-autoscaling/Room granted, by scale set": _GOVERNOR_ONLY,
    "superkube-autoscaling/Governors acting, held, and the budget a round may open": _GOVERNOR_ONLY,
    "superkube-autoscaling/Max-size writes and rounds in the last hour": _GOVERNOR_ONLY,
    "superkube-health/GPU reset requests and their end, in the last hour": _GPU_RESET_ONLY,
    "superkube-health/VMs deleted in the last hour, and the hour's deletions left": _REMEDIATION_OFF,
    "superkube-health/Cordoned nodes remediation holds, by reason": _REMEDIATION_OFF,
    "superkube-health/GPU resets in the last hour, by outcome": _GPU_RESET_ONLY,
    "superkube-monitoring/vminsert to vmstorage: rows waiting, storage hosts reachable": _CLUSTER_STORE_ONLY,
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


def _apiserver() -> Board:
    sel = f'{C}, job="apiserver"'
    reads_writes = f'{sel}, verb!~"WATCH|CONNECT"'
    return Board(
        "superkube-apiserver",
        "API servers",
        "Requests, their 429s and 5xx, latency and API Priority and Fairness, over every API server.",
        (
            Row(
                "Requests",
                (
                    panel(
                        "Requests by verb",
                        "Requests a second, every API server together.",
                        q(
                            f"sum by (verb) (rate(apiserver_request_total{{{sel}}}[$__rate_interval]))",
                            "{{verb}}",
                        ),
                        unit="reqps",
                    ),
                    panel(
                        "Requests by API server",
                        "Requests a second per server: the load balancer should spread them evenly.",
                        q(
                            f"sum by (instance) (rate(apiserver_request_total{{{sel}}}[$__rate_interval]))",
                            "{{instance}}",
                        ),
                        unit="reqps",
                    ),
                    panel(
                        "Share of requests answered 429 and 5xx",
                        "What the APIServerThrottling and APIServerErrors alerts compare with 1 %. A 429 is "
                        "API Priority and Fairness refusing a request its level's queues cannot hold; 0 when "
                        "there are none.",
                        q(
                            f'(sum(rate(apiserver_request_total{{{sel}, code="429"}}[$__rate_interval])) or vector(0))'
                            f" / sum(rate(apiserver_request_total{{{sel}}}[$__rate_interval]))",
                            "429",
                        ),
                        q(
                            f'(sum(rate(apiserver_request_total{{{sel}, code=~"5.."}}[$__rate_interval])) or vector(0))'
                            f" / sum(rate(apiserver_request_total{{{sel}}}[$__rate_interval]))",
                            "5xx",
                        ),
                        unit="percentunit",
                    ),
                    panel(
                        "Responses by code (the 5-minute recording rule)",
                        "job:apiserver_request:rate5m, which each shard records for its own API servers.",
                        q(
                            f'sum by (code) (job:apiserver_request:rate5m{{{C}, job="apiserver"}})',
                            "{{code}}",
                        ),
                        unit="reqps",
                    ),
                ),
            ),
            Row(
                "Errors and latency",
                (
                    panel(
                        "5xx by verb and resource",
                        "Which requests fail; empty while none does.",
                        q(
                            f'sum by (verb, resource, code) (rate(apiserver_request_total{{{sel}, code=~"5.."}}'
                            "[$__rate_interval]))",
                            "{{verb}} {{resource}} {{code}}",
                        ),
                        unit="reqps",
                    ),
                    panel(
                        "Request latency p99 by verb",
                        "Watches and proxied connections left out (they last as long as the client wants). "
                        "The scrape keeps the 0.05, 0.1, 0.4, 1, 5, 10 and 60 s boundaries only.",
                        q(
                            "histogram_quantile(0.99, sum by (le, verb) (rate("
                            f"apiserver_request_duration_seconds_bucket{{{reads_writes}}}[$__rate_interval])))",
                            "{{verb}}",
                        ),
                        unit="s",
                    ),
                    panel(
                        "Request latency p50 and p99",
                        "Every request but watches and proxied connections.",
                        q(
                            "histogram_quantile(0.5, sum by (le) (rate("
                            f"apiserver_request_duration_seconds_bucket{{{reads_writes}}}[$__rate_interval])))",
                            "p50",
                        ),
                        q(
                            "histogram_quantile(0.99, sum by (le) (rate("
                            f"apiserver_request_duration_seconds_bucket{{{reads_writes}}}[$__rate_interval])))",
                            "p99",
                        ),
                        unit="s",
                    ),
                ),
            ),
            Row(
                "API Priority and Fairness",
                (
                    panel(
                        "Requests waiting in queues, by priority level",
                        "Requests a level holds in its queues because its seats are taken; when its queues "
                        "are full the next one is answered 429.",
                        q(
                            "sum by (priority_level) (apiserver_flowcontrol_current_inqueue_requests"
                            f"{{{sel}}})",
                            "{{priority_level}}",
                        ),
                    ),
                    panel(
                        "Seats in use and nominal limit, by priority level",
                        "Over every API server: a level whose seats in use reach its limit queues.",
                        q(
                            "sum by (priority_level) (apiserver_flowcontrol_current_executing_seats"
                            f"{{{sel}}})",
                            "{{priority_level}} in use",
                        ),
                        q(
                            f"sum by (priority_level) (apiserver_flowcontrol_nominal_limit_seats{{{sel}}})",
                            "{{priority_level}} limit",
                        ),
                    ),
                    panel(
                        "Queue wait p99, by priority level",
                        "How long requests wait for a seat.",
                        q(
                            "histogram_quantile(0.99, sum by (le, priority_level) (rate("
                            "apiserver_flowcontrol_request_wait_duration_seconds_bucket"
                            f"{{{sel}}}[$__rate_interval])))",
                            "{{priority_level}}",
                        ),
                        unit="s",
                    ),
                    panel(
                        "Rejected (429) by priority level and flow schema",
                        "Requests refused because a level's queues were full (or waited too long); empty "
                        "while none is. A node-join storm shows as the superkube-node-join level.",
                        q(
                            "sum by (priority_level, flow_schema, reason) (rate("
                            f"apiserver_flowcontrol_rejected_requests_total{{{sel}}}[$__rate_interval]))",
                            "{{priority_level}} {{flow_schema}} {{reason}}",
                        ),
                        unit="reqps",
                    ),
                    panel(
                        "Dispatched by priority level",
                        "Requests a second that got a seat.",
                        q(
                            "sum by (priority_level) (rate("
                            f"apiserver_flowcontrol_dispatched_requests_total{{{sel}}}[$__rate_interval]))",
                            "{{priority_level}}",
                        ),
                        unit="reqps",
                    ),
                ),
            ),
        ),
    )


def _etcd() -> Board:
    sel = f'{C}, job=~"etcd-main|etcd-events"'
    return Board(
        "superkube-etcd",
        "etcd: main and events",
        "Both etcd clusters side by side: main (everything but Events) is job etcd-main, the Events "
        "cluster etcd-events. Each is its own quorum and fails on its own.",
        (
            Row(
                "Leaders",
                (
                    panel(
                        "Members with a leader, and members",
                        "A member without a leader serves no writes (the EtcdNoLeader alert).",
                        q(f"sum by (job) (etcd_server_has_leader{{{sel}}})", "{{job}} with a leader"),
                        q(f"count by (job) (etcd_server_has_leader{{{sel}}})", "{{job}} members"),
                    ),
                    panel(
                        "Leader changes in the last hour",
                        "More than 3 an hour is the EtcdFrequentLeaderChanges alert: slow disks or CPU "
                        "starvation, usually.",
                        q(
                            f"sum by (job) (increase(etcd_server_leader_changes_seen_total{{{sel}}}[1h]))",
                            "{{job}}",
                        ),
                    ),
                ),
            ),
            Row(
                "Disk",
                (
                    panel(
                        "WAL fsync p99 (the recording rule)",
                        "job:etcd_disk_wal_fsync_duration_seconds:p99, each shard's for its members; etcd "
                        "wants it under 10 ms, the EtcdSlowFsync alert fires over 100 ms.",
                        q(
                            f"max by (job) (job:etcd_disk_wal_fsync_duration_seconds:p99{{{sel}}})",
                            "{{job}}",
                        ),
                        unit="s",
                    ),
                    panel(
                        "Backend commit p99",
                        "bbolt commits; slow ones stall applies.",
                        q(
                            "histogram_quantile(0.99, sum by (job, le) (rate("
                            f"etcd_disk_backend_commit_duration_seconds_bucket{{{sel}}}[$__rate_interval])))",
                            "{{job}}",
                        ),
                        unit="s",
                    ),
                    panel(
                        "Database size and quota",
                        "Each member's file; at the quota etcd raises NOSPACE and refuses writes.",
                        q(
                            f"max by (job, instance) (etcd_mvcc_db_total_size_in_bytes{{{sel}}})",
                            "{{job}} {{instance}}",
                        ),
                        q(f"max by (job) (etcd_server_quota_backend_bytes{{{sel}}})", "{{job}} quota"),
                        unit="bytes",
                    ),
                    panel(
                        "Database in use",
                        "Logically used; the gap to the file's size is what a defragmentation returns.",
                        q(
                            f"max by (job, instance) (etcd_mvcc_db_total_size_in_use_in_bytes{{{sel}}})",
                            "{{job}} {{instance}}",
                        ),
                        unit="bytes",
                    ),
                ),
            ),
            Row(
                "Raft and clients",
                (
                    panel(
                        "Proposals committed and failed",
                        "Failed proposals mean lost leadership or quorum.",
                        q(
                            f"sum by (job) (rate(etcd_server_proposals_committed_total{{{sel}}}[$__rate_interval]))",
                            "{{job}} committed",
                        ),
                        q(
                            f"sum by (job) (rate(etcd_server_proposals_failed_total{{{sel}}}[$__rate_interval]))",
                            "{{job}} failed",
                        ),
                        unit="ops",
                    ),
                    panel(
                        "Proposals pending",
                        "Proposals waiting to commit.",
                        q(f"sum by (job) (etcd_server_proposals_pending{{{sel}}})", "{{job}}"),
                    ),
                    panel(
                        "Peer round trip p99",
                        "Between the members of each cluster (a one-member cluster has none).",
                        q(
                            "histogram_quantile(0.99, sum by (job, le) (rate("
                            f"etcd_network_peer_round_trip_time_seconds_bucket{{{sel}}}[$__rate_interval])))",
                            "{{job}}",
                        ),
                        unit="s",
                    ),
                    panel(
                        "gRPC requests by code",
                        "What the API servers ask of each cluster.",
                        q(
                            "sum by (job, grpc_code) (rate("
                            f"grpc_server_handled_total{{{sel}}}[$__rate_interval]))",
                            "{{job}} {{grpc_code}}",
                        ),
                        unit="reqps",
                    ),
                ),
            ),
        ),
    )


def _node_joins() -> Board:
    api = f'{C}, job="apiserver"'
    join = f'{api}, priority_level="{APF_NODE_JOIN_LEVEL}"'
    return Board(
        "superkube-node-joins",
        "Node joins and preflight",
        "New nodes: their certificate requests and registrations, the join's own priority level, the "
        "serving certificates, the join token the scale sets carry, and preflight.",
        (
            Row(
                "Joins",
                (
                    panel(
                        "Nodes",
                        "Node objects the API servers hold.",
                        q(f'max(apiserver_resource_objects{{{api}, resource="nodes"}})', "nodes"),
                    ),
                    panel(
                        "Certificate requests and Node registrations",
                        "Creates a second: a joining kubelet asks for its client certificate, then "
                        "registers its Node.",
                        q(
                            "sum by (resource) (rate(apiserver_request_total"
                            f'{{{api}, verb="POST", resource=~"certificatesigningrequests|nodes"}}[$__rate_interval]))',
                            "{{resource}}",
                        ),
                        unit="reqps",
                    ),
                    panel(
                        f"The join's priority level ({APF_NODE_JOIN_LEVEL})",
                        "Joins dispatched by flow schema, and waiting in the level's queues.",
                        q(
                            "sum by (flow_schema) (rate(apiserver_flowcontrol_dispatched_requests_total"
                            f"{{{join}}}[$__rate_interval]))",
                            "{{flow_schema}} dispatched",
                        ),
                        q(f"sum(apiserver_flowcontrol_current_inqueue_requests{{{join}}})", "waiting"),
                    ),
                    panel(
                        "Serving certificates decided in the last hour",
                        "The approver's decisions on kubelet serving-certificate requests, and requests "
                        "whose Node is not registered yet.",
                        q(
                            f"sum by (decision) (increase(superkube_serving_certs_total{{{C}}}[1h]))",
                            "{{decision}}",
                        ),
                        q(f"sum(superkube_serving_certs_waiting{{{C}}})", "waiting for their Node"),
                    ),
                    panel(
                        "Serving-certificate denials in the last hour, by reason",
                        "The ServingCertificatesDenied alert; each reason names the check a request failed.",
                        q(
                            f"sum by (reason) (increase(superkube_serving_certs_denials_total{{{C}}}[1h]))",
                            "{{reason}}",
                        ),
                    ),
                ),
            ),
            Row(
                "Join token",
                (
                    panel(
                        "Join token: since the last good round, and left before it expires",
                        "JoinTokenPublisherStale fires past 15 minutes since a good round, JoinTokenExpiring "
                        "under 15 minutes left.",
                        q(
                            f"time() - max(superkube_join_tokens_last_success_timestamp_seconds{{{C}}})",
                            "since the last good round",
                        ),
                        q(
                            f"max(superkube_join_tokens_token_expiry_timestamp_seconds{{{C}}} > 0) - time()",
                            "left before it expires",
                        ),
                        unit="s",
                    ),
                    panel(
                        "Publisher rounds and model writes in the last hour",
                        "Rounds by result, and writes of the token into the scale sets' models.",
                        q(
                            f"sum by (result) (increase(superkube_join_tokens_rounds_total{{{C}}}[1h]))",
                            "rounds {{result}}",
                        ),
                        q(
                            f"sum by (result) (increase(superkube_join_tokens_publications_total{{{C}}}[1h]))",
                            "writes {{result}}",
                        ),
                    ),
                    panel(
                        "Publishers leading",
                        "One API-server host publishes at a time.",
                        q(f"sum(superkube_join_tokens_leader{{{C}}})", "leading"),
                    ),
                ),
            ),
            Row(
                "Preflight",
                (
                    panel(
                        "Preflight rounds in the last hour, by result",
                        "A preflight agent runs on a GPU node until it passes, then leaves it.",
                        q(
                            f"sum by (result) (increase(superkube_preflight_checks_total{{{C}}}[1h]))",
                            "{{result}}",
                        ),
                    ),
                    panel(
                        "Preflight failures in the last hour, by reason",
                        "The PreflightFailures alert; a failed node keeps the preflight taint with the "
                        "reason in its annotation.",
                        q(
                            "sum by (reason) (increase(superkube_preflight_checks_total"
                            f'{{{C}, result="fail"}}[1h]))',
                            "{{reason}}",
                        ),
                    ),
                    panel(
                        "Preflight agents reaching the API server",
                        "Agents whose last round reached the API server, of those running.",
                        q(f"sum(superkube_preflight_api_up{{{C}}})", "reaching it"),
                        q(f"count(superkube_preflight_api_up{{{C}}})", "running"),
                    ),
                ),
            ),
        ),
    )


def _health() -> Board:
    return Board(
        "superkube-health",
        "Node health and remediation",
        "The health agents' verdicts, the controller's cordons and breaker, its actions, GPU resets and "
        "Azure's scheduled events.",
        (
            Row(
                "Verdicts",
                (
                    panel(
                        "Health rounds by verdict",
                        "Every node's agent probes each round; its verdict's level.",
                        q(
                            f"sum by (result) (rate(superkube_health_checks_total{{{C}}}[$__rate_interval]))",
                            "{{result}}",
                        ),
                        unit="ops",
                    ),
                    panel(
                        "Findings by check and level",
                        "This round's findings over every node (gpu, filesystem, kernel-io, kubelet, "
                        "runtime, api-servers, default-route, peers, scheduled-event).",
                        q(f"sum by (check, level) (superkube_health_findings{{{C}}})", "{{check}} {{level}}"),
                    ),
                    panel(
                        "Verdicts written in the last hour, by level",
                        "A verdict is written on the node when it changes.",
                        q(
                            "sum by (level) (increase(superkube_health_reports_total"
                            f'{{{C}, dry_run="false"}}[1h]))',
                            "{{level}}",
                        ),
                    ),
                    panel(
                        "Nodes failing the periodic GPU test, by pool",
                        "Nodes whose latest periodic GPU test failed.",
                        q(f"sum by (pool) (superkube_health_gpu_test_failed{{{C}}})", "{{pool}}"),
                    ),
                ),
            ),
            Row(
                "Cordons and the breaker",
                (
                    panel(
                        "Nodes cordoned by health, by pool",
                        "The NodesCordonedByHealthAgent alert.",
                        q(f"sum by (pool) (superkube_health_cordoned_nodes{{{C}}})", "{{pool}}"),
                    ),
                    panel(
                        "Breaker open, by pool",
                        "1 while too large a share of the pool is cordoned: health cordons no more there "
                        "(the HealthAgentBreakerOpen alert).",
                        q(f"max by (pool) (superkube_health_breaker_open{{{C}}})", "{{pool}}"),
                    ),
                    panel(
                        "Health controller: replicas leading, reaching the API server",
                        "One replica leads (the HealthControllerNoLeader alert when none does).",
                        q(f"sum(superkube_health_leader{{{C}}})", "leading"),
                        q(f"min(superkube_health_controller_api_up{{{C}}})", "reaching the API server"),
                    ),
                    panel(
                        "Actions in the last hour",
                        "The controller's actions: cordon, evict, drained, reset_request, uncordon, "
                        "reset_unlabel (and evict_refused, evict_blocked, event).",
                        q(
                            "sum by (action) (increase(superkube_health_actions_total"
                            f'{{{C}, dry_run="false"}}[1h]))',
                            "{{action}}",
                        ),
                    ),
                ),
            ),
            Row(
                "Remediation",
                (
                    panel(
                        "GPU reset requests and their end, in the last hour",
                        "The controller labels a drained node for a GPU reset when every fatal finding is "
                        "one a reset may clear, and removes the label when the reset has ended.",
                        q(
                            "sum by (action) (increase(superkube_health_actions_total"
                            f'{{{C}, dry_run="false", action=~"reset_request|reset_unlabel"}}[1h]))',
                            "{{action}}",
                        ),
                    ),
                    panel(
                        "GPU resets in the last hour, by outcome",
                        "The reset agent's own count: cleared, or failed (the node is then replaced).",
                        q(
                            f"sum by (outcome) (increase(superkube_gpu_reset_total{{{C}}}[1h]))",
                            "{{outcome}}",
                        ),
                    ),
                    panel(
                        "Azure scheduled events, and approved in the last hour",
                        "Nodes with a Reboot, Redeploy or Terminate scheduled (health drains them first), "
                        "and the events approved once drained.",
                        q(f"sum by (type) (superkube_health_scheduled_event{{{C}}})", "{{type}} scheduled"),
                        q(
                            f"sum by (type) (increase(superkube_health_events_acknowledged_total{{{C}}}[1h]))",
                            "{{type}} approved",
                        ),
                    ),
                    panel(
                        "VMs deleted in the last hour, and the hour's deletions left",
                        "Remediation's deletions by result (refused: the instance was not the node) and "
                        "its budget, counted in the cluster (RemediationBudgetSpent, RemediationFailing).",
                        q(
                            f"sum by (result) (increase(superkube_remediation_deletions_total{{{C}}}[1h]))",
                            "{{result}}",
                        ),
                        q(
                            f"sum(superkube_remediation_budget_left{{{C}}} and on (instance) "
                            f"superkube_remediation_leader{{{C}}} == 1)",
                            "left this hour",
                        ),
                    ),
                    panel(
                        "Cordoned nodes remediation holds, by reason",
                        "Maintenance cordons are never deleted; breaker, budget and unknown-scale-set need "
                        "a person after an hour (RemediationHeldLong).",
                        q(
                            f"sum by (reason) (superkube_remediation_held_nodes{{{C}}} and on (instance) "
                            f"superkube_remediation_leader{{{C}}} == 1)",
                            "{{reason}}",
                        ),
                    ),
                    panel(
                        "Agents reading their scheduled events, and reaching the API server",
                        "Of the health agents running: ScheduledEventsUnread fires for one that cannot read.",
                        q(f"sum(superkube_health_events_up{{{C}}})", "reading scheduled events"),
                        q(f"sum(superkube_health_api_up{{{C}}})", "reaching the API server"),
                        q(f"count(superkube_health_api_up{{{C}}})", "running"),
                    ),
                ),
            ),
        ),
    )


def _autoscaling() -> Board:
    return Board(
        "superkube-autoscaling",
        "Autoscaler and scale governor",
        "cluster-autoscaler's view of the nodes and its scale-ups, and the governor that paces them by "
        "the room it grants each scale set.",
        (
            Row(
                "cluster-autoscaler",
                (
                    panel(
                        "Nodes by state (the autoscaler's view)",
                        "ready, unready, notStarted, unregistered, longUnregistered.",
                        q(f"max by (state) (cluster_autoscaler_nodes_count{{{C}}})", "{{state}}"),
                    ),
                    panel(
                        "Unschedulable pods (the autoscaler's view)",
                        "Pods no node can take, which a scale-up may serve.",
                        q(f"max by (type) (cluster_autoscaler_unschedulable_pods_count{{{C}}})", "{{type}}"),
                    ),
                    panel(
                        "Nodes added and removed in the last hour",
                        "Scale-ups in nodes, and scale-downs by reason.",
                        q(f"sum(increase(cluster_autoscaler_scaled_up_nodes_total{{{C}}}[1h]))", "added"),
                        q(
                            f"sum by (reason) (increase(cluster_autoscaler_scaled_down_nodes_total{{{C}}}[1h]))",
                            "removed ({{reason}})",
                        ),
                    ),
                    panel(
                        "Failed scale-ups in the last hour, by reason",
                        "cloudProviderError, apiCallError, timeout.",
                        q(
                            f"sum by (reason) (increase(cluster_autoscaler_failed_scale_ups_total{{{C}}}[1h]))",
                            "{{reason}}",
                        ),
                    ),
                    panel(
                        "Safe to autoscale, and loop errors in the last hour",
                        "The autoscaler stops scaling up when too many nodes are unready.",
                        q(f"min(cluster_autoscaler_cluster_safe_to_autoscale{{{C}}})", "safe"),
                        q(
                            f"sum by (type) (increase(cluster_autoscaler_errors_total{{{C}}}[1h]))",
                            "errors ({{type}})",
                        ),
                    ),
                    panel(
                        "Time since the autoscaler's last main loop",
                        "It loops every scan interval; a long gap is a stuck or leaderless autoscaler.",
                        q(
                            f'time() - max(cluster_autoscaler_last_activity{{{C}, activity="main"}})',
                            "since the last loop",
                        ),
                        unit="s",
                    ),
                ),
            ),
            Row(
                "Scale governor",
                (
                    panel(
                        "Governors acting, held, and the budget a round may open",
                        "The governor beside the leading autoscaler acts (ScaleGovernorNoLeader when none "
                        "does); held is 1 while too many nodes are not joining.",
                        q(f"sum(superkube_scale_governor_leader{{{C}}})", "acting"),
                        q(f"max(superkube_scale_governor_held{{{C}}})", "held"),
                        q(f"max(superkube_scale_governor_budget_nodes{{{C}}})", "budget (nodes a round)"),
                    ),
                    panel(
                        "Room granted, by scale set",
                        "New nodes the latest round's max tag leaves room for above the target.",
                        q(
                            f"max by (scale_set) (superkube_scale_governor_room_nodes{{{C}}})",
                            "{{scale_set}}",
                        ),
                    ),
                    panel(
                        "Max-size writes and rounds in the last hour",
                        "Writes by result (ScaleGovernorWritesRefused when refusals land nothing), rounds "
                        "by result.",
                        q(
                            f"sum by (result) (increase(superkube_scale_governor_writes_total{{{C}}}[1h]))",
                            "writes {{result}}",
                        ),
                        q(
                            f"sum by (result) (increase(superkube_scale_governor_rounds_total{{{C}}}[1h]))",
                            "rounds {{result}}",
                        ),
                    ),
                ),
            ),
        ),
    )


def _teams() -> Board:
    cadvisor = f'{C}, job="cadvisor", container!=""'
    return Board(
        "superkube-teams",
        "Team capacity",
        "Nodes per team, the taints that keep them, the webhook that gives pods their team's "
        "toleration, and what each namespace uses.",
        (
            Row(
                "Teams' nodes",
                (
                    panel(
                        "Nodes per team",
                        "After the reconciler's last round.",
                        q(f"max by (team) (superkube_team_nodes{{{C}}})", "{{team}}"),
                    ),
                    panel(
                        "Team taints changed, and node patches refused, in the last hour",
                        "Changes by action; refusals by status (403 a policy, 409/422 a node changed since read).",
                        q(
                            f"sum by (action) (increase(superkube_team_taint_changes_total{{{C}}}[1h]))",
                            "{{action}}",
                        ),
                        q(
                            f"sum by (code) (increase(superkube_team_taint_refused_total{{{C}}}[1h]))",
                            "refused {{code}}",
                        ),
                    ),
                    panel(
                        "Teams configuration applied, reconciler reaching the API server",
                        "1 when the superkube-teams ConfigMap could be read and applied.",
                        q(f"min(superkube_team_config_ok{{{C}}})", "configuration applied"),
                        q(f"min(superkube_team_taints_api_up{{{C}}})", "reaching the API server"),
                    ),
                ),
            ),
            Row(
                "Team webhook",
                (
                    panel(
                        "Admissions by decision and code",
                        "200 allowed; 403 the team rules refuse; 400 and 503 errors (TeamWebhookErrors).",
                        q(
                            "sum by (decision, code) (rate(superkube_team_webhook_admissions_total"
                            f"{{{C}}}[$__rate_interval]))",
                            "{{decision}} {{code}}",
                        ),
                        unit="reqps",
                    ),
                    panel(
                        "Answer p99",
                        "The API server gives up at the configuration's 5 s timeout (TeamWebhookSlow over 1 s).",
                        q(
                            "histogram_quantile(0.99, sum by (le) (rate("
                            f"superkube_team_webhook_admission_duration_seconds_bucket{{{C}}}[$__rate_interval])))",
                            "p99",
                        ),
                        unit="s",
                    ),
                ),
            ),
            Row(
                "Use per namespace",
                (
                    panel(
                        "CPU used per namespace",
                        "Cores, from cAdvisor in each kubelet; a namespace's team is its superkube.io/team label.",
                        q(
                            "sum by (namespace) (rate(container_cpu_usage_seconds_total"
                            f"{{{cadvisor}}}[$__rate_interval]))",
                            "{{namespace}}",
                        ),
                    ),
                    panel(
                        "Memory working set per namespace",
                        "From cAdvisor in each kubelet.",
                        q(
                            f"sum by (namespace) (container_memory_working_set_bytes{{{cadvisor}}})",
                            "{{namespace}}",
                        ),
                        unit="bytes",
                    ),
                ),
            ),
        ),
    )


def _network() -> Board:
    pods = f'{C}, namespace=~"$namespace"'
    nodes = f'{C}, pod=""'
    return Board(
        "superkube-network",
        "Network use per namespace and pod",
        "What each namespace and pod sends and receives, split into internet and internal traffic, as "
        "the nodes' iptables accounting counts it (iptables_rule_bytes_total). A node's own series "
        "(pod=\"\") count its pods' internet bytes again: the pod panels read pods' series only.",
        (
            Row(
                "Namespaces",
                (
                    panel(
                        "Internet egress by namespace",
                        "Bits a second each namespace's pods send outside the cluster's and hub's ranges.",
                        q(
                            "sum by (namespace) (rate(iptables_rule_bytes_total"
                            f'{{{pods}, traffic="internet-out"}}[$__rate_interval])) * 8',
                            "{{namespace}}",
                        ),
                        unit="bps",
                    ),
                    panel(
                        "Internet ingress by namespace",
                        "Bits a second each namespace's pods receive from outside.",
                        q(
                            "sum by (namespace) (rate(iptables_rule_bytes_total"
                            f'{{{pods}, traffic="internet-in"}}[$__rate_interval])) * 8',
                            "{{namespace}}",
                        ),
                        unit="bps",
                    ),
                    panel(
                        "Internal traffic by namespace, out and in",
                        "To and from the cluster's and the hub's ranges (other pods, nodes, services).",
                        q(
                            "sum by (namespace) (rate(iptables_rule_bytes_total"
                            f'{{{pods}, traffic="internal-out"}}[$__rate_interval])) * 8',
                            "{{namespace}} out",
                        ),
                        q(
                            "sum by (namespace) (rate(iptables_rule_bytes_total"
                            f'{{{pods}, traffic="internal-in"}}[$__rate_interval])) * 8',
                            "{{namespace}} in",
                        ),
                        unit="bps",
                    ),
                ),
            ),
            Row(
                "Teams",
                (
                    panel(
                        "Traffic by team",
                        "Each namespace's traffic joined to the team its label names "
                        "(superkube_namespace_team, from the team-taints reconciler); namespaces of no "
                        "team are left out.",
                        q(
                            "sum by (team, traffic) (sum by (namespace, traffic) (rate(iptables_rule_bytes_total"
                            f'{{{C}, namespace!=""}}[$__rate_interval])) * on (namespace) group_left (team) '
                            f"max by (namespace, team) (superkube_namespace_team{{{C}}})) * 8",
                            "{{team}} {{traffic}}",
                        ),
                        unit="bps",
                    ),
                ),
            ),
            Row(
                "Pods",
                (
                    panel(
                        "Top 10 pods by internet egress",
                        "A pod's new sandbox is a new chain: the sum over chains keeps one series a pod.",
                        q(
                            "topk(10, sum by (namespace, pod) (rate(iptables_rule_bytes_total"
                            f'{{{pods}, traffic="internet-out"}}[$__rate_interval]))) * 8',
                            "{{namespace}}/{{pod}}",
                        ),
                        unit="bps",
                    ),
                    panel(
                        "Top 10 pods by internet ingress",
                        "Bits a second received from outside.",
                        q(
                            "topk(10, sum by (namespace, pod) (rate(iptables_rule_bytes_total"
                            f'{{{pods}, traffic="internet-in"}}[$__rate_interval]))) * 8',
                            "{{namespace}}/{{pod}}",
                        ),
                        unit="bps",
                    ),
                    panel(
                        "Top 10 pods by internal traffic",
                        "Out and in together.",
                        q(
                            "topk(10, sum by (namespace, pod) (rate(iptables_rule_bytes_total"
                            f'{{{pods}, traffic=~"internal-.*"}}[$__rate_interval]))) * 8',
                            "{{namespace}}/{{pod}}",
                        ),
                        unit="bps",
                    ),
                ),
            ),
            Row(
                "Nodes and the exporter",
                (
                    panel(
                        "Nodes' internet traffic",
                        'The nodes\' own rules (pod=""), every node together: all a node sends and '
                        "receives from outside, its pods' included.",
                        q(
                            "sum by (traffic) (rate(iptables_rule_bytes_total"
                            f'{{{nodes}, traffic=~"internet-.*"}}[$__rate_interval])) * 8',
                            "{{traffic}}",
                        ),
                        unit="bps",
                    ),
                    panel(
                        "Top 10 nodes by internet egress",
                        "NodeInternetEgressHigh fires over 1 Gbit/s for 15 minutes.",
                        q(
                            "topk(10, sum by (instance) (rate(iptables_rule_bytes_total"
                            f'{{{nodes}, traffic="internet-out"}}[$__rate_interval]))) * 8',
                            "{{instance}}",
                        ),
                        unit="bps",
                    ),
                    panel(
                        "Exporters: failing scrapes and tagged rules",
                        "Exporters whose last iptables-save failed, and the tagged label sets they found.",
                        q(f"count(iptables_scrape_success{{{C}}} == 0) or vector(0)", "failing"),
                        q(f"sum(iptables_tagged_rules{{{C}}})", "tagged rules"),
                    ),
                    panel(
                        "Slowest exporter scrape",
                        "iptables-save -c of every table and the parse, on the slowest node.",
                        q(f"max(iptables_scrape_duration_seconds{{{C}}})", "slowest"),
                        unit="s",
                    ),
                ),
            ),
        ),
        variables=("cluster", "namespace"),
    )


def _monitoring() -> Board:
    return Board(
        "superkube-monitoring",
        "Monitoring pipeline",
        "The Prometheus shards' scrapes, their remote write, and the metrics store.",
        (
            Row(
                "Scrapes",
                (
                    panel(
                        "Targets up, by job",
                        "Every shard's targets together: each target is scraped by exactly one shard.",
                        q(f"sum by (job) (up{{{C}}})", "{{job}} up"),
                        q(f"count by (job) (up{{{C}}})", "{{job}} targets"),
                    ),
                    panel(
                        "Targets by shard",
                        "hashmod of the target's address spreads them.",
                        q(f"count by (prometheus_shard) (up{{{C}}})", "shard {{prometheus_shard}}"),
                    ),
                    panel(
                        "Samples kept a scrape, by shard",
                        "After the drop rules: what each shard stores and sends.",
                        q(
                            f"sum by (prometheus_shard) (scrape_samples_post_metric_relabeling{{{C}}})",
                            "shard {{prometheus_shard}}",
                        ),
                    ),
                    panel(
                        "Samples the drop rules remove a scrape, by job",
                        "Scraped less kept: the series explosions each job's drop rules take out.",
                        q(
                            f"sum by (job) (scrape_samples_scraped{{{C}}} - scrape_samples_post_metric_relabeling{{{C}}})",
                            "{{job}}",
                        ),
                    ),
                    panel(
                        "New series a scrape, by shard",
                        "Series churn: new pods and nodes make new series.",
                        q(
                            f"sum by (prometheus_shard) (scrape_series_added{{{C}}})",
                            "shard {{prometheus_shard}}",
                        ),
                    ),
                    panel(
                        "Slowest scrape, by job",
                        "A scrape slower than the interval loses samples.",
                        q(f"max by (job) (scrape_duration_seconds{{{C}}})", "{{job}}"),
                        unit="s",
                    ),
                ),
            ),
            Row(
                "Remote write",
                (
                    panel(
                        "Samples sent and failed, by shard",
                        "Each shard's remote write to the store.",
                        q(
                            "sum by (prometheus_shard) (rate(prometheus_remote_storage_samples_total"
                            f"{{{C}}}[$__rate_interval]))",
                            "shard {{prometheus_shard}} sent",
                        ),
                        q(
                            "sum by (prometheus_shard) (rate(prometheus_remote_storage_samples_failed_total"
                            f"{{{C}}}[$__rate_interval]))",
                            "shard {{prometheus_shard}} failed",
                        ),
                        unit="ops",
                    ),
                    panel(
                        "Samples waiting to be sent, by shard",
                        "Grows while the store is slow or away.",
                        q(
                            f"sum by (prometheus_shard) (prometheus_remote_storage_samples_pending{{{C}}})",
                            "shard {{prometheus_shard}}",
                        ),
                    ),
                    panel(
                        "Head series, by shard",
                        "Each shard's active series: the flagship plans under 3 M a shard.",
                        q(
                            f"sum by (prometheus_shard) (prometheus_tsdb_head_series{{{C}}})",
                            "shard {{prometheus_shard}}",
                        ),
                    ),
                ),
            ),
            Row(
                "The store",
                (
                    panel(
                        "Samples received",
                        "vminsert's rows from the shards' remote write.",
                        q(
                            "sum(rate(vm_rows_inserted_total"
                            f'{{{C}, type="promremotewrite"}}[$__rate_interval]))',
                            "samples",
                        ),
                        unit="ops",
                    ),
                    panel(
                        "Series active in the last hour",
                        "vmstorage's hourly series, summed over the store hosts (every series is kept on 2).",
                        q(f'sum(vm_cache_entries{{{C}, type="storage/hour_metric_ids"}})', "series"),
                    ),
                    panel(
                        "New series",
                        "Series churn as the store sees it.",
                        q(
                            f"sum(rate(vm_new_timeseries_created_total{{{C}}}[$__rate_interval]))",
                            "new series",
                        ),
                        unit="ops",
                    ),
                    panel(
                        "Data and free disk, per store host",
                        "The store keeps 90 days on each host's data disk.",
                        q(f"sum by (instance) (vm_data_size_bytes{{{C}}})", "{{instance}} data"),
                        q(f"min by (instance) (vm_free_disk_space_bytes{{{C}}})", "{{instance}} free"),
                        unit="bytes",
                    ),
                    panel(
                        "vminsert to vmstorage: rows waiting, storage hosts reachable",
                        "Rows each vminsert holds for the vmstorage hosts, and whether it reaches each.",
                        q(f"sum by (instance) (vm_rpc_rows_pending{{{C}}})", "{{instance}} waiting"),
                        q(f"min by (addr) (vm_rpc_vmstorage_is_reachable{{{C}}})", "{{addr}} reachable"),
                    ),
                    panel(
                        "Query errors",
                        "vmselect's failed queries a second, by path.",
                        q(
                            "sum by (path) (rate(vm_http_request_errors_total"
                            f'{{{C}, path=~".*/api/v1/query(_range)?"}}[$__rate_interval]))',
                            "{{path}}",
                        ),
                        unit="reqps",
                    ),
                ),
            ),
        ),
    )


def boards() -> tuple[Board, ...]:
    """Every dashboard, in the order Grafana's folder lists them."""
    return (
        _apiserver(),
        _etcd(),
        _node_joins(),
        _health(),
        _autoscaling(),
        _teams(),
        _network(),
        _monitoring(),
    )


def key(board: Board, p: Panel) -> str:
    """A panel's name in LAB_EMPTY: `<dashboard uid>/<panel title>`."""
    return f"{board.uid}/{p.title}"


# --- what a query names --------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    |(?P<range>\[[^\]]*\])
    |(?P<duration>\d+(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*\b)
    |(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
    |(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)
    |(?P<open>[({])|(?P<close>[)}])
    |(?P<space>\s+)
    |(?P<other>.)""",
    re.X,
)
_AGGREGATIONS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
    "quantile", "limitk", "limit_ratio",
}  # fmt: skip
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
             "offset", "atan2", "inf", "nan"}  # fmt: skip
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}


@dataclass(frozen=True)
class Selector:
    """One vector selector of a query: its metric name ("" for a bare `{...}`) and matchers' text."""

    metric: str
    matchers: str = ""


def concrete(expr: str, **values: str) -> str:
    """The query with Grafana's variables replaced by values a check can use (VARIABLES; a value given
    by the variable's name without `$`, e.g. `__rate_interval="30m"`, in place of its default)."""
    given = {**VARIABLES, **{f"${name}": value for name, value in values.items()}}
    for name in sorted(given, key=len, reverse=True):
        expr = expr.replace(name, given[name])
    return expr


def selectors(expr: str) -> list[Selector]:
    """The vector selectors of a PromQL query, read from its tokens: a name that is not a function,
    an aggregation or a keyword, with the matchers in braces after it; label lists of `by`,
    `without`, `on`, `ignoring` and `group_*` are not selectors. promtool checks that the query
    parses; this reads only what it names."""
    tokens = [(m.lastgroup, m.group()) for m in _TOKEN.finditer(expr) if m.lastgroup != "space"]
    out: list[Selector] = []
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        after = tokens[i + 1] if i + 1 < len(tokens) else ("", "")
        if kind == "name" and text in _LABEL_LISTS:
            i += 1
            if tokens[i : i + 1] and tokens[i][1] == "(":
                while i < len(tokens) and tokens[i][1] != ")":
                    i += 1
            continue
        if kind == "name" and (after[1] == "(" or text in _AGGREGATIONS or text in _KEYWORDS):
            i += 1
            continue
        if kind == "name" or (kind == "open" and text == "{"):
            metric = text if kind == "name" else ""
            j = i + 1 if kind == "name" else i
            matchers = ""
            if j < len(tokens) and tokens[j][1] == "{":
                end = j
                while end < len(tokens) and tokens[end][1] != "}":
                    end += 1
                matchers = "".join(t for _, t in tokens[j + 1 : end])
                j = end + 1
            out.append(Selector(metric, matchers))
            i = j
            continue
        i += 1
    return out


def metrics_of(expr: str) -> set[str]:
    """The metric names a query reads."""
    return {s.metric for s in selectors(concrete(expr))}


def queries() -> Iterator[tuple[Board, Panel, Query]]:
    for board in boards():
        for p in board.panels():
            for query in p.queries:
                yield board, p, query


def not_scraped_in(p: Panel) -> dict[str, str]:
    """The panel's metrics that no scrape job reads yet, with the reason."""
    return {
        m: NOT_SCRAPED[m] for query in p.queries for m in sorted(metrics_of(query.expr)) if m in NOT_SCRAPED
    }


def description(board: Board, p: Panel) -> str:
    """The panel's description as Grafana shows it: what it shows, and why it may show nothing."""
    text = p.description
    if key(board, p) in LAB_EMPTY:
        text += f" Empty on the lab: {LAB_EMPTY[key(board, p)]}."
    missing = not_scraped_in(p)
    for reason in dict.fromkeys(missing.values()):
        names = ", ".join(m for m, why in missing.items() if why == reason)
        text += f" Not scraped yet ({names}): {reason}."
    return text


# --- Grafana's JSON ------------------------------------------------------------------------------


VARIABLE_QUERIES: dict[str, tuple[str, str, bool]] = {
    # name: (label, Grafana's query for its values, whether "All" and several may be picked)
    "cluster": ("Cluster", "label_values(up, cluster)", False),
    "namespace": (
        "Namespace",
        f'label_values(iptables_rule_bytes_total{{{C}, namespace!=""}}, namespace)',
        True,
    ),
}


def _datasource() -> Any:
    from grafana_foundation_sdk.models.dashboard import DataSourceRef

    return DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)


def _variable(name: str) -> Any:
    from grafana_foundation_sdk.builders import dashboard as builders
    from grafana_foundation_sdk.models import dashboard as models

    label, query, every = VARIABLE_QUERIES[name]
    variable = (
        builders.QueryVariable(name)
        .label(label)
        .datasource(_datasource())
        .query(query)
        .refresh(models.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(models.VariableSort.ALPHABETICAL_ASC)
    )
    if every:  # "All" selects every namespace with pods' series (the nodes' own carry none)
        variable = variable.multi(True).include_all(True).all_value(VARIABLES[f"${name}"])
    return variable


def _panel(board: Board, p: Panel, panel_id: int) -> Any:
    from grafana_foundation_sdk.builders import common, prometheus, timeseries
    from grafana_foundation_sdk.models import common as common_models

    builder = (
        timeseries.Panel()
        .fill_opacity(10)
        .line_width(1)
        .legend(
            common.VizLegendOptions()
            .display_mode(common_models.LegendDisplayMode.LIST)
            .placement(common_models.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(
            common.VizTooltipOptions()
            .mode(common_models.TooltipDisplayMode.MULTI)
            .sort(common_models.SortOrder.DESCENDING)
        )
    )
    builder = (
        builder.id(panel_id)
        .title(p.title)
        .description(description(board, p))
        .datasource(_datasource())
        .unit(p.unit)
        .span(12)
        .height(8)
    )
    for ref, query in zip("ABCDEFGH", p.queries, strict=False):
        builder = builder.with_target(
            prometheus.Dataquery()
            .expr(query.expr)
            .legend_format(query.legend or "__auto")
            .ref_id(ref)
            .datasource(_datasource())
        )
    return builder


def dashboard(board: Board) -> dict[str, Any]:
    """One dashboard as Grafana's JSON (a dict), built by the SDK's builders."""
    from grafana_foundation_sdk.builders import dashboard as builders
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    out = (
        builders.Dashboard(board.title)
        .uid(board.uid)
        .description(board.description)
        .tags([TAG])
        .editable()
        .refresh("1m")
        .time("now-6h", "now")
        .timezone("browser")
    )
    for name in board.variables:
        out = out.with_variable(_variable(name))
    panel_id = 0
    for row in board.rows:
        panel_id += 1
        out = out.with_row(builders.Row(row.title).id(panel_id))
        for p in row.panels:
            panel_id += 1
            out = out.with_panel(_panel(board, p, panel_id))
    result: dict[str, Any] = json.loads(JSONEncoder(sort_keys=True).encode(out.build()))
    return result


def provider() -> dict[str, Any]:
    """Grafana's dashboards provider: the dashboards' folder on the host, read-only in the UI."""
    return {
        "apiVersion": 1,
        "providers": [
            {
                "name": "superkube",
                "orgId": 1,
                "folder": FOLDER,
                "type": "file",
                "disableDeletion": True,
                "allowUiUpdates": False,
                "updateIntervalSeconds": 60,
                "options": {"path": DASHBOARDS_DIR},
            }
        ],
    }


def datasource(cluster: str, store_query_url: str) -> dict[str, Any]:
    """Grafana's datasource for the cluster's metrics store: its Prometheus query API (vmselect's
    `/select/0/prometheus` on a store host, or the query API of a store the spec names)."""
    return {
        "apiVersion": 1,
        "datasources": [
            {
                "name": f"superkube {cluster}",
                "uid": DATASOURCE_UID,
                "type": "prometheus",
                "access": "proxy",
                "url": store_query_url,
                "isDefault": True,
                "editable": False,
                # the scrape interval: $__rate_interval is at least four of them
                "jsonData": {"timeInterval": SCRAPE_INTERVAL, "httpMethod": "POST"},
            }
        ],
    }


@dataclass
class Written:
    paths: list[Path] = field(default_factory=list)
    dashboards: int = 0


def write(out: Path, cluster: str, store_query_url: str) -> Written:
    """Every dashboard under `out`/grafana/dashboards, and the provisioning files under
    `out`/grafana/provisioning: copy `out`/grafana to GRAFANA_DIR on a monitoring host."""
    written = Written()
    root = out / "grafana"
    (root / "dashboards").mkdir(parents=True, exist_ok=True)
    for board in boards():
        path = root / "dashboards" / f"{board.uid}.json"
        path.write_text(json.dumps(dashboard(board), indent=2, sort_keys=True) + "\n")
        written.paths.append(path)
        written.dashboards += 1
    files: Mapping[str, tuple[str, dict[str, Any]]] = {
        "dashboards": ("# superkube's dashboards, from `superkube monitoring render`", provider()),
        "datasources": (
            f"# cluster {cluster}'s metrics store, from `superkube monitoring render`"
            + ("" if store_query_url else "; its query URL is not known: set url to the store's query API"),
            datasource(cluster, store_query_url),
        ),
    }
    for folder, (comment, doc) in files.items():
        (root / "provisioning" / folder).mkdir(parents=True, exist_ok=True)
        path = root / "provisioning" / folder / "superkube.yml"
        path.write_text(f"{comment}\n{yaml.safe_dump(doc, sort_keys=False)}")
        written.paths.append(path)
    return written
