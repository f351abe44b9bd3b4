"""What a PromQL query names: its selectors and metrics, and a query with Grafana's variables
filled in (for promtool and the store)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from superkube.cluster.dashboards.panels import VARIABLES

_TOKEN = re.compile(
    r"""(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    |(?P<range>\[[^\]]*\])
    |(?P<duration>\d+(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*\b)
    |(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
    |(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)
    |(?P<open>[({])|(?P<close>[)}])
    |(?P<space>\s+)
    |(?P<other>.)""",
    re.X,
)
_AGGREGATIONS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
    "quantile", "limitk", "limit_ratio",
}  # fmt: skip
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
             "offset", "atan2", "inf", "nan"}  # fmt: skip
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}


@dataclass(frozen=True)
class Selector:
    """One vector selector of a query: its metric name ("" for a bare `{...}`) and matchers' text."""

    metric: str
    matchers: str = ""


def concrete(expr: str, **values: str) -> str:
    """The query with Grafana's variables replaced by values a check can use (VARIABLES; a value given
    by the variable's name without `$`, e.g. `__rate_interval="30m"`, in place of its default)."""
    given = {**VARIABLES, **{f"${name}": value for name, value in values.items()}}
    for name in sorted(given, key=len, reverse=True):
        expr = expr.replace(name, given[name])
    return expr


def selectors(expr: str) -> list[Selector]:
    """The vector selectors of a PromQL query, read from its tokens: a name that is not a function,
    an aggregation or a keyword, with the matchers in braces after it; label lists of `by`,
    `without`, `on`, `ignoring` and `group_*` are not selectors. promtool checks that the query
    parses; this reads only what it names."""
    tokens = [(m.lastgroup, m.group()) for m in _TOKEN.finditer(expr) if m.lastgroup != "space"]
    out: list[Selector] = []
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        after = tokens[i + 1] if i + 1 < len(tokens) else ("", "")
        if kind == "name" and text in _LABEL_LISTS:
            i += 1
            if tokens[i : i + 1] and tokens[i][1] == "(":
                while i < len(tokens) and tokens[i][1] != ")":
                    i += 1
            continue
        if kind == "name" and (after[1] == "(" or text in _AGGREGATIONS or text in _KEYWORDS):
            i += 1
            continue
        if kind == "name" or (kind == "open" and text == "{"):
            metric = text if kind == "name" else ""
            j = i + 1 if kind == "name" else i
            matchers = ""
            if j < len(tokens) and tokens[j][1] == "{":
                end = j
                while end < len(tokens) and tokens[end][1] != "}":
                    end += 1
                matchers = "".join(t for _, t in tokens[j + 1 : end])
                j = end + 1
            out.append(Selector(metric, matchers))
            i = j
            continue
        i += 1
    return out


def metrics_of(expr: str) -> set[str]:
    """The metric names a query reads."""
    return {s.metric for s in selectors(concrete(expr))}
