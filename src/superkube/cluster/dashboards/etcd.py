"""The etcd clusters' board."""

from __future__ import annotations

from superkube.cluster.dashboards.panels import Board, C, Row, panel, q

_SEL = f'{C}, job=~"etcd-main|etcd-events"'


def _leaders() -> Row:
    """The row "Leaders"."""
    return Row(
        "Leaders",
        (
            panel(
                "Members with a leader, and members",
                "A member without a leader serves no writes (the EtcdNoLeader alert).",
                q(f"sum by (job) (etcd_server_has_leader{{{_SEL}}})", "{{job}} with a leader"),
                q(f"count by (job) (etcd_server_has_leader{{{_SEL}}})", "{{job}} members"),
            ),
            panel(
                "Leader changes in the last hour",
                "More than 3 an hour is the EtcdFrequentLeaderChanges alert: slow disks or CPU "
                "starvation, usually.",
                q(
                    f"sum by (job) (increase(etcd_server_leader_changes_seen_total{{{_SEL}}}[1h]))",
                    "{{job}}",
                ),
            ),
        ),
    )


def _disk() -> Row:
    """The row "Disk"."""
    return Row(
        "Disk",
        (
            panel(
                "WAL fsync p99 (the recording rule)",
                "job:etcd_disk_wal_fsync_duration_seconds:p99, each shard's for its members; etcd "
                "wants it under 10 ms, the EtcdSlowFsync alert fires over 100 ms.",
                q(
                    f"max by (job) (job:etcd_disk_wal_fsync_duration_seconds:p99{{{_SEL}}})",
                    "{{job}}",
                ),
                unit="s",
            ),
            panel(
                "Backend commit p99",
                "bbolt commits; slow ones stall applies.",
                q(
                    "histogram_quantile(0.99, sum by (job, le) (rate("
                    f"etcd_disk_backend_commit_duration_seconds_bucket{{{_SEL}}}[$__rate_interval])))",
                    "{{job}}",
                ),
                unit="s",
            ),
            panel(
                "Database size and quota",
                "Each member's file; at the quota etcd raises NOSPACE and refuses writes.",
                q(
                    f"max by (job, instance) (etcd_mvcc_db_total_size_in_bytes{{{_SEL}}})",
                    "{{job}} {{instance}}",
                ),
                q(f"max by (job) (etcd_server_quota_backend_bytes{{{_SEL}}})", "{{job}} quota"),
                unit="bytes",
            ),
            panel(
                "Database in use",
                "Logically used; the gap to the file's size is what a defragmentation returns.",
                q(
                    f"max by (job, instance) (etcd_mvcc_db_total_size_in_use_in_bytes{{{_SEL}}})",
                    "{{job}} {{instance}}",
                ),
                unit="bytes",
            ),
        ),
    )


def _raft_and_clients() -> Row:
    """The row "Raft and clients"."""
    return Row(
        "Raft and clients",
        (
            panel(
                "Proposals committed and failed",
                "Failed proposals mean lost leadership or quorum.",
                q(
                    f"sum by (job) (rate(etcd_server_proposals_committed_total{{{_SEL}}}[$__rate_interval]))",
                    "{{job}} committed",
                ),
                q(
                    f"sum by (job) (rate(etcd_server_proposals_failed_total{{{_SEL}}}[$__rate_interval]))",
                    "{{job}} failed",
                ),
                unit="ops",
            ),
            panel(
                "Proposals pending",
                "Proposals waiting to commit.",
                q(f"sum by (job) (etcd_server_proposals_pending{{{_SEL}}})", "{{job}}"),
            ),
            panel(
                "Peer round trip p99",
                "Between the members of each cluster (a one-member cluster has none).",
                q(
                    "histogram_quantile(0.99, sum by (job, le) (rate("
                    f"etcd_network_peer_round_trip_time_seconds_bucket{{{_SEL}}}[$__rate_interval])))",
                    "{{job}}",
                ),
                unit="s",
            ),
            panel(
                "gRPC requests by code",
                "What the API servers ask of each cluster.",
                q(
                    f"sum by (job, grpc_code) (rate(grpc_server_handled_total{{{_SEL}}}[$__rate_interval]))",
                    "{{job}} {{grpc_code}}",
                ),
                unit="reqps",
            ),
        ),
    )


def board() -> Board:
    return Board(
        "superkube-etcd",
        "etcd: main and events",
        "Both etcd clusters side by side: main (everything but Events) is job etcd-main, the Events "
        "cluster etcd-events. Each is its own quorum and fails on its own.",
        (
            _leaders(),
            _disk(),
            _raft_and_clients(),
        ),
    )
