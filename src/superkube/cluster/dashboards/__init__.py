"""Grafana dashboards for one cluster, as code: built with Grafana's own `grafana-foundation-sdk`
(pinned in pyproject.toml; its builders target Grafana 11.6, the version the `monitoring` role pins)
and written as Grafana's JSON by `superkube monitoring render`, beside the Prometheus configuration,
with Grafana's provisioning files: a dashboards provider and a datasource for the cluster's metrics
store (every Prometheus shard remote-writes there, so one query sees every shard's series).

Every panel's query is written once, as PromQL, in its board's module (one per board; panels.py
holds what they share). What a query may name is checked
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

from superkube.cluster.dashboards.catalog import boards, description, key, not_scraped_in, queries
from superkube.cluster.dashboards.grafana import (
    VARIABLE_QUERIES,
    Written,
    dashboard,
    datasource,
    provider,
    write,
)
from superkube.cluster.dashboards.panels import (
    AUTOSCALER_ONLY,
    CADVISOR_VERSION,
    CLUSTER_STORE_ONLY,
    DASHBOARDS_DIR,
    DATASOURCE_UID,
    ETCD_VERSION,
    EVERY_JOB,
    FOLDER,
    GOVERNOR_ONLY,
    GPU_RESET_ONLY,
    GRAFANA_DIR,
    KUBERNETES_VERSION,
    LAB_EMPTY,
    NOT_SCRAPED,
    PROMETHEUS_VERSION,
    REMEDIATION_OFF,
    SCRAPED_BY,
    TAG,
    UPSTREAM,
    VARIABLES,
    VICTORIA_METRICS_VERSION,
    Board,
    C,
    Panel,
    Query,
    Row,
    Source,
    panel,
    q,
)
from superkube.cluster.dashboards.promql import Selector, concrete, metrics_of, selectors

__all__ = [
    "AUTOSCALER_ONLY", "CADVISOR_VERSION", "CLUSTER_STORE_ONLY", "DASHBOARDS_DIR", "DATASOURCE_UID",
    "ETCD_VERSION", "EVERY_JOB", "FOLDER", "GOVERNOR_ONLY", "GPU_RESET_ONLY", "GRAFANA_DIR",
    "KUBERNETES_VERSION", "LAB_EMPTY", "NOT_SCRAPED", "PROMETHEUS_VERSION", "REMEDIATION_OFF", "SCRAPED_BY",
    "TAG", "UPSTREAM", "VARIABLES", "VARIABLE_QUERIES", "VICTORIA_METRICS_VERSION", "Board", "C", "Panel",
    "Query", "Row", "Selector", "Source", "Written", "boards", "concrete", "dashboard", "datasource",
    "description", "key", "metrics_of", "not_scraped_in", "panel", "provider", "q", "queries", "selectors",
    "write",
]  # fmt: skip
