"""The node joins' board: bootstrap, registration, serving certificates, the join flow."""

from __future__ import annotations

from superkube.cluster.dashboards.panels import Board, C, Row, panel, q
from superkube.cluster.kube import APF_NODE_JOIN_LEVEL

_API = f'{C}, job="apiserver"'
_JOIN = f'{_API}, priority_level="{APF_NODE_JOIN_LEVEL}"'


def _joins() -> Row:
    """The row "Joins"."""
    return Row(
        "Joins",
        (
            panel(
                "Nodes",
                "Node objects the API servers hold.",
                q(f'max(apiserver_resource_objects{{{_API}, resource="nodes"}})', "nodes"),
            ),
            panel(
                "Certificate requests and Node registrations",
                "Creates a second: a joining kubelet asks for its client certificate, then "
                "registers its Node.",
                q(
                    "sum by (resource) (rate(apiserver_request_total"
                    f'{{{_API}, verb="POST", resource=~"certificatesigningrequests|nodes"}}[$__rate_interval]))',
                    "{{resource}}",
                ),
                unit="reqps",
            ),
            panel(
                f"The join's priority level ({APF_NODE_JOIN_LEVEL})",
                "Joins dispatched by flow schema, and waiting in the level's queues.",
                q(
                    "sum by (flow_schema) (rate(apiserver_flowcontrol_dispatched_requests_total"
                    f"{{{_JOIN}}}[$__rate_interval]))",
                    "{{flow_schema}} dispatched",
                ),
                q(f"sum(apiserver_flowcontrol_current_inqueue_requests{{{_JOIN}}})", "waiting"),
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
    )


def _join_token() -> Row:
    """The row "Join token"."""
    return Row(
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
    )


def _preflight() -> Row:
    """The row "Preflight"."""
    return Row(
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
                    f'sum by (reason) (increase(superkube_preflight_checks_total{{{C}, result="fail"}}[1h]))',
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
    )


def board() -> Board:
    return Board(
        "superkube-node-joins",
        "Node joins and preflight",
        "New nodes: their certificate requests and registrations, the join's own priority level, the "
        "serving certificates, the join token the scale sets carry, and preflight.",
        (
            _joins(),
            _join_token(),
            _preflight(),
        ),
    )
