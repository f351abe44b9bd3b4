"""Every board, and every panel's queries, as the checks and the JSON walk them."""

from __future__ import annotations

from collections.abc import Iterator

from superkube.cluster.dashboards import (
    apiserver,
    autoscaling,
    etcd,
    health,
    monitoring,
    network,
    node_joins,
    teams,
)
from superkube.cluster.dashboards.panels import LAB_EMPTY, NOT_SCRAPED, Board, Panel, Query
from superkube.cluster.dashboards.promql import metrics_of


def boards() -> tuple[Board, ...]:
    """Every dashboard, in the order Grafana's folder lists them."""
    return (
        apiserver.board(),
        etcd.board(),
        node_joins.board(),
        health.board(),
        autoscaling.board(),
        teams.board(),
        network.board(),
        monitoring.board(),
    )


def key(board: Board, p: Panel) -> str:
    """A panel's name in LAB_EMPTY: `<dashboard uid>/<panel title>`."""
    return f"{board.uid}/{p.title}"


def queries() -> Iterator[tuple[Board, Panel, Query]]:
    for board in boards():
        for p in board.panels():
            for query in p.queries:
                yield board, p, query


def not_scraped_in(p: Panel) -> dict[str, str]:
    """The panel's metrics that no scrape job reads yet, with the reason."""
    return {
        m: NOT_SCRAPED[m] for query in p.queries for m in sorted(metrics_of(query.expr)) if m in NOT_SCRAPED
    }


def description(board: Board, p: Panel) -> str:
    """The panel's description as Grafana shows it: what it shows, and why it may show nothing."""
    text = p.description
    if key(board, p) in LAB_EMPTY:
        text += f" Empty on the lab: {LAB_EMPTY[key(board, p)]}."
    missing = not_scraped_in(p)
    for reason in dict.fromkeys(missing.values()):
        names = ", ".join(m for m, why in missing.items() if why == reason)
        text += f" Not scraped yet ({names}): {reason}."
    return text
