"""The etcd clusters' board."""

from __future__ import annotations

from superkube.cluster.dashboards.panels import Board, C, Row, panel, q


def board() -> Board:
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
