"""Grafana's JSON: the dashboards, the dashboards provider and the datasource, written to a folder."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from superkube.cluster.dashboards.catalog import boards, description
from superkube.cluster.dashboards.panels import (
    DASHBOARDS_DIR,
    DATASOURCE_UID,
    FOLDER,
    TAG,
    VARIABLES,
    Board,
    C,
    Panel,
)
from superkube.cluster.monitoring import SCRAPE_INTERVAL

VARIABLE_QUERIES: dict[str, tuple[str, str, bool]] = {
    # name: (label, Grafana's query for its values, whether "All" and several may be picked)
    "cluster": ("Cluster", "label_values(up, cluster)", False),
    "namespace": (
        "Namespace",
        f'label_values(iptables_rule_bytes_total{{{C}, namespace!=""}}, namespace)',
        True,
    ),
}


def _datasource() -> Any:
    from grafana_foundation_sdk.models.dashboard import DataSourceRef

    return DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)


def _variable(name: str) -> Any:
    from grafana_foundation_sdk.builders import dashboard as builders
    from grafana_foundation_sdk.models import dashboard as models

    label, query, every = VARIABLE_QUERIES[name]
    variable = (
        builders.QueryVariable(name)
        .label(label)
        .datasource(_datasource())
        .query(query)
        .refresh(models.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(models.VariableSort.ALPHABETICAL_ASC)
    )
    if every:  # "All" selects every namespace with pods' series (the nodes' own carry none)
        variable = variable.multi(True).include_all(True).all_value(VARIABLES[f"${name}"])
    return variable


def _panel(board: Board, p: Panel, panel_id: int) -> Any:
    from grafana_foundation_sdk.builders import common, prometheus, timeseries
    from grafana_foundation_sdk.models import common as common_models

    builder = (
        timeseries.Panel()
        .fill_opacity(10)
        .line_width(1)
        .legend(
            common.VizLegendOptions()
            .display_mode(common_models.LegendDisplayMode.LIST)
            .placement(common_models.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(
            common.VizTooltipOptions()
            .mode(common_models.TooltipDisplayMode.MULTI)
            .sort(common_models.SortOrder.DESCENDING)
        )
    )
    builder = (
        builder.id(panel_id)
        .title(p.title)
        .description(description(board, p))
        .datasource(_datasource())
        .unit(p.unit)
        .span(12)
        .height(8)
    )
    for ref, query in zip("ABCDEFGH", p.queries, strict=False):
        builder = builder.with_target(
            prometheus.Dataquery()
            .expr(query.expr)
            .legend_format(query.legend or "__auto")
            .ref_id(ref)
            .datasource(_datasource())
        )
    return builder


def dashboard(board: Board) -> dict[str, Any]:
    """One dashboard as Grafana's JSON (a dict), built by the SDK's builders."""
    from grafana_foundation_sdk.builders import dashboard as builders
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    out = (
        builders.Dashboard(board.title)
        .uid(board.uid)
        .description(board.description)
        .tags([TAG])
        .editable()
        .refresh("1m")
        .time("now-6h", "now")
        .timezone("browser")
    )
    for name in board.variables:
        out = out.with_variable(_variable(name))
    panel_id = 0
    for row in board.rows:
        panel_id += 1
        out = out.with_row(builders.Row(row.title).id(panel_id))
        for p in row.panels:
            panel_id += 1
            out = out.with_panel(_panel(board, p, panel_id))
    result: dict[str, Any] = json.loads(JSONEncoder(sort_keys=True).encode(out.build()))
    return result


def provider() -> dict[str, Any]:
    """Grafana's dashboards provider: the dashboards' folder on the host, read-only in the UI."""
    return {
        "apiVersion": 1,
        "providers": [
            {
                "name": "superkube",
                "orgId": 1,
                "folder": FOLDER,
                "type": "file",
                "disableDeletion": True,
                "allowUiUpdates": False,
                "updateIntervalSeconds": 60,
                "options": {"path": DASHBOARDS_DIR},
            }
        ],
    }


def datasource(cluster: str, store_query_url: str) -> dict[str, Any]:
    """Grafana's datasource for the cluster's metrics store: its Prometheus query API (vmselect's
    `/select/0/prometheus` on a store host, or the query API of a store the spec names)."""
    return {
        "apiVersion": 1,
        "datasources": [
            {
                "name": f"superkube {cluster}",
                "uid": DATASOURCE_UID,
                "type": "prometheus",
                "access": "proxy",
                "url": store_query_url,
                "isDefault": True,
                "editable": False,
                # the scrape interval: $__rate_interval is at least four of them
                "jsonData": {"timeInterval": SCRAPE_INTERVAL, "httpMethod": "POST"},
            }
        ],
    }


@dataclass
class Written:
    paths: list[Path] = field(default_factory=list)
    dashboards: int = 0


def write(out: Path, cluster: str, store_query_url: str) -> Written:
    """Every dashboard under `out`/grafana/dashboards, and the provisioning files under
    `out`/grafana/provisioning: copy `out`/grafana to GRAFANA_DIR on a monitoring host."""
    written = Written()
    root = out / "grafana"
    (root / "dashboards").mkdir(parents=True, exist_ok=True)
    for board in boards():
        path = root / "dashboards" / f"{board.uid}.json"
        path.write_text(json.dumps(dashboard(board), indent=2, sort_keys=True) + "\n")
        written.paths.append(path)
        written.dashboards += 1
    files: Mapping[str, tuple[str, dict[str, Any]]] = {
        "dashboards": ("# superkube's dashboards, from `superkube monitoring render`", provider()),
        "datasources": (
            f"# cluster {cluster}'s metrics store, from `superkube monitoring render`"
            + ("" if store_query_url else "; its query URL is not known: set url to the store's query API"),
            datasource(cluster, store_query_url),
        ),
    }
    for folder, (comment, doc) in files.items():
        (root / "provisioning" / folder).mkdir(parents=True, exist_ok=True)
        path = root / "provisioning" / folder / "superkube.yml"
        path.write_text(f"{comment}\n{yaml.safe_dump(doc, sort_keys=False)}")
        written.paths.append(path)
    return written
