"""The autoscaling board: the autoscaler's view and the scale governor's."""

from __future__ import annotations

from superkube.cluster.dashboards.panels import Board, C, Row, panel, q


def _cluster_autoscaler() -> Row:
    """The row "cluster-autoscaler"."""
    return Row(
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
    )


def _scale_governor() -> Row:
    """The row "Scale governor"."""
    return Row(
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
                "Writes by result (ScaleGovernorWritesRefused when refusals land nothing), rounds by result.",
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
    )


def board() -> Board:
    return Board(
        "superkube-autoscaling",
        "Autoscaler and scale governor",
        "cluster-autoscaler's view of the nodes and its scale-ups, and the governor that paces them by "
        "the room it grants each scale set.",
        (
            _cluster_autoscaler(),
            _scale_governor(),
        ),
    )
