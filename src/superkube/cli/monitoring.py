"""`superkube monitoring`: Prometheus and Grafana's dashboards for a cluster."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from superkube.cli.common import (
    Command,
    ProjectOpt,
    StackOpt,
    fail,
    group,
    out,
    project_dir,
)
from superkube.model.spec import SpecError
from superkube.model.words import plural

monitoring_app = group("Prometheus for the cluster: sharded scrape configs, rules and Grafana dashboards.")


@monitoring_app.command("render", cls=Command)
def monitoring_render(
    stack: StackOpt = "dev",
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Write prometheus-<shard>.yml, rules/ and grafana/ into this directory (made if missing).",
        ),
    ] = None,
    project: ProjectOpt = None,
) -> None:
    """Write each Prometheus shard's configuration, the rules and Grafana's dashboards, from the spec.

    Beside the dashboards (grafana/dashboards/), Grafana's provisioning files: a dashboards provider
    and a datasource for the cluster's metrics store (grafana/provisioning/).
    """

    from superkube.cluster import dashboards, monitoring
    from superkube.cluster.kube import metrics_store_query_url
    from superkube.plan import engine as planning

    if out_dir is not None:
        if out_dir.exists() and not out_dir.is_dir():
            fail(f"--out {out_dir}: is a file; give a directory")
        if not out_dir.resolve().parent.is_dir():
            fail(f"--out {out_dir}: {out_dir.resolve().parent} does not exist; create it first")
    try:
        _, spec, addresses = planning.load(project_dir(project), stack)
    except SpecError as exc:
        fail(str(exc))
    cluster = spec.name(planning.stack_name(stack))
    store = metrics_store_query_url(spec, addresses)
    if out_dir is None:
        with tempfile.TemporaryDirectory() as tmp:
            paths = [*monitoring.write(spec, addresses, Path(tmp), cluster)]
            paths += dashboards.write(Path(tmp), cluster, store).paths
            for path in paths:
                sys.stdout.write(f"# file: {path.relative_to(tmp)}\n{path.read_text()}")
        return
    out_dir.mkdir(exist_ok=True)
    written = monitoring.write(spec, addresses, out_dir, cluster)
    grafana = dashboards.write(out_dir, cluster, store)
    out.print(
        f"{plural(spec.prometheus_shards, 'Prometheus shard config')}, "
        f"{plural(len(written) - spec.prometheus_shards, 'rule file')} and "
        f"{plural(grafana.dashboards, 'Grafana dashboard')} with Grafana's provisioning under {out_dir}; "
        "check them with promtool check config / test rules; the monitoring role writes the same files "
        f"on the monitoring hosts (grafana/ in {dashboards.GRAFANA_DIR}, which its Grafana reads)"
    )
    if not store:
        out.print(
            f"[yellow]the stack's metrics_store_url {spec.metrics_store_url} does not say where the store "
            "answers queries: set the url in grafana/provisioning/datasources/superkube.yml[/yellow]"
        )
