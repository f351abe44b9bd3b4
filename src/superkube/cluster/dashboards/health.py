"""The node health board: verdicts, cordons, maintenance, remediation, GPU resets."""

from __future__ import annotations

from superkube.cluster.dashboards.panels import Board, C, Row, panel, q


def _verdicts() -> Row:
    """The row "Verdicts"."""
    return Row(
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
                    f'sum by (level) (increase(superkube_health_reports_total{{{C}, dry_run="false"}}[1h]))',
                    "{{level}}",
                ),
            ),
            panel(
                "Nodes failing the periodic GPU test, by pool",
                "Nodes whose latest periodic GPU test failed.",
                q(f"sum by (pool) (superkube_health_gpu_test_failed{{{C}}})", "{{pool}}"),
            ),
        ),
    )


def _cordons_and_the_breaker() -> Row:
    """The row "Cordons and the breaker"."""
    return Row(
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
                    f'sum by (action) (increase(superkube_health_actions_total{{{C}, dry_run="false"}}[1h]))',
                    "{{action}}",
                ),
            ),
        ),
    )


def _remediation() -> Row:
    """The row "Remediation"."""
    return Row(
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
    )


def board() -> Board:
    return Board(
        "superkube-health",
        "Node health and remediation",
        "The health agents' verdicts, the controller's cordons and breaker, its actions, GPU resets and "
        "Azure's scheduled events.",
        (
            _verdicts(),
            _cordons_and_the_breaker(),
            _remediation(),
        ),
    )
