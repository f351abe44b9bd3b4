"""The API servers' board."""

from __future__ import annotations

from superkube.cluster.dashboards.panels import Board, C, Row, panel, q

_SEL = f'{C}, job="apiserver"'
_READS_WRITES = f'{_SEL}, verb!~"WATCH|CONNECT"'


def _requests() -> Row:
    """The row "Requests"."""
    return Row(
        "Requests",
        (
            panel(
                "Requests by verb",
                "Requests a second, every API server together.",
                q(
                    f"sum by (verb) (rate(apiserver_request_total{{{_SEL}}}[$__rate_interval]))",
                    "{{verb}}",
                ),
                unit="reqps",
            ),
            panel(
                "Requests by API server",
                "Requests a second per server: the load balancer should spread them evenly.",
                q(
                    f"sum by (instance) (rate(apiserver_request_total{{{_SEL}}}[$__rate_interval]))",
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
                    f'(sum(rate(apiserver_request_total{{{_SEL}, code="429"}}[$__rate_interval])) or vector(0))'
                    f" / sum(rate(apiserver_request_total{{{_SEL}}}[$__rate_interval]))",
                    "429",
                ),
                q(
                    f'(sum(rate(apiserver_request_total{{{_SEL}, code=~"5.."}}[$__rate_interval])) or vector(0))'
                    f" / sum(rate(apiserver_request_total{{{_SEL}}}[$__rate_interval]))",
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
    )


def _errors_and_latency() -> Row:
    """The row "Errors and latency"."""
    return Row(
        "Errors and latency",
        (
            panel(
                "5xx by verb and resource",
                "Which requests fail; empty while none does.",
                q(
                    f'sum by (verb, resource, code) (rate(apiserver_request_total{{{_SEL}, code=~"5.."}}'
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
                    f"apiserver_request_duration_seconds_bucket{{{_READS_WRITES}}}[$__rate_interval])))",
                    "{{verb}}",
                ),
                unit="s",
            ),
            panel(
                "Request latency p50 and p99",
                "Every request but watches and proxied connections.",
                q(
                    "histogram_quantile(0.5, sum by (le) (rate("
                    f"apiserver_request_duration_seconds_bucket{{{_READS_WRITES}}}[$__rate_interval])))",
                    "p50",
                ),
                q(
                    "histogram_quantile(0.99, sum by (le) (rate("
                    f"apiserver_request_duration_seconds_bucket{{{_READS_WRITES}}}[$__rate_interval])))",
                    "p99",
                ),
                unit="s",
            ),
        ),
    )


def _api_priority_and_fairness() -> Row:
    """The row "API Priority and Fairness"."""
    return Row(
        "API Priority and Fairness",
        (
            panel(
                "Requests waiting in queues, by priority level",
                "Requests a level holds in its queues because its seats are taken; when its queues "
                "are full the next one is answered 429.",
                q(
                    f"sum by (priority_level) (apiserver_flowcontrol_current_inqueue_requests{{{_SEL}}})",
                    "{{priority_level}}",
                ),
            ),
            panel(
                "Seats in use and nominal limit, by priority level",
                "Over every API server: a level whose seats in use reach its limit queues.",
                q(
                    f"sum by (priority_level) (apiserver_flowcontrol_current_executing_seats{{{_SEL}}})",
                    "{{priority_level}} in use",
                ),
                q(
                    f"sum by (priority_level) (apiserver_flowcontrol_nominal_limit_seats{{{_SEL}}})",
                    "{{priority_level}} limit",
                ),
            ),
            panel(
                "Queue wait p99, by priority level",
                "How long requests wait for a seat.",
                q(
                    "histogram_quantile(0.99, sum by (le, priority_level) (rate("
                    "apiserver_flowcontrol_request_wait_duration_seconds_bucket"
                    f"{{{_SEL}}}[$__rate_interval])))",
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
                    f"apiserver_flowcontrol_rejected_requests_total{{{_SEL}}}[$__rate_interval]))",
                    "{{priority_level}} {{flow_schema}} {{reason}}",
                ),
                unit="reqps",
            ),
            panel(
                "Dispatched by priority level",
                "Requests a second that got a seat.",
                q(
                    "sum by (priority_level) (rate("
                    f"apiserver_flowcontrol_dispatched_requests_total{{{_SEL}}}[$__rate_interval]))",
                    "{{priority_level}}",
                ),
                unit="reqps",
            ),
        ),
    )


def board() -> Board:
    return Board(
        "superkube-apiserver",
        "API servers",
        "Requests, their 429s and 5xx, latency and API Priority and Fairness, over every API server.",
        (
            _requests(),
            _errors_and_latency(),
            _api_priority_and_fairness(),
        ),
    )
