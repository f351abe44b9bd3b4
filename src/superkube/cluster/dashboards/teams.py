"""The team capacity board."""

from __future__ import annotations

from superkube.cluster.dashboards.panels import Board, C, Row, panel, q

_CADVISOR = f'{C}, job="cadvisor", container!=""'


def _teams_nodes() -> Row:
    """The row "Teams' nodes"."""
    return Row(
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
    )


def _team_webhook() -> Row:
    """The row "Team webhook"."""
    return Row(
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
    )


def _use_per_namespace() -> Row:
    """The row "Use per namespace"."""
    return Row(
        "Use per namespace",
        (
            panel(
                "CPU used per namespace",
                "Cores, from cAdvisor in each kubelet; a namespace's team is its superkube.io/team label.",
                q(
                    "sum by (namespace) (rate(container_cpu_usage_seconds_total"
                    f"{{{_CADVISOR}}}[$__rate_interval]))",
                    "{{namespace}}",
                ),
            ),
            panel(
                "Memory working set per namespace",
                "From cAdvisor in each kubelet.",
                q(
                    f"sum by (namespace) (container_memory_working_set_bytes{{{_CADVISOR}}})",
                    "{{namespace}}",
                ),
                unit="bytes",
            ),
        ),
    )


def board() -> Board:
    return Board(
        "superkube-teams",
        "Team capacity",
        "Nodes per team, the taints that keep them, the webhook that gives pods their team's "
        "toleration, and what each namespace uses.",
        (
            _teams_nodes(),
            _team_webhook(),
            _use_per_namespace(),
        ),
    )
