"""The team capacity board."""

from __future__ import annotations

from superkube.cluster.dashboards.panels import Board, C, Row, panel, q


def board() -> Board:
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
