"""The monitoring pipeline's board: the shards, remote write, the store."""

from __future__ import annotations

from superkube.cluster.dashboards.panels import Board, C, Row, panel, q


def _scrapes() -> Row:
    """The row "Scrapes"."""
    return Row(
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
    )


def _remote_write() -> Row:
    """The row "Remote write"."""
    return Row(
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
    )


def _the_store() -> Row:
    """The row "The store"."""
    return Row(
        "The store",
        (
            panel(
                "Samples received",
                "vminsert's rows from the shards' remote write.",
                q(
                    f'sum(rate(vm_rows_inserted_total{{{C}, type="promremotewrite"}}[$__rate_interval]))',
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
    )


def board() -> Board:
    return Board(
        "superkube-monitoring",
        "Monitoring pipeline",
        "The Prometheus shards' scrapes, their remote write, and the metrics store.",
        (
            _scrapes(),
            _remote_write(),
            _the_store(),
        ),
    )
