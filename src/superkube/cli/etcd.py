"""`superkube etcd`: the cluster's two etcd clusters."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from superkube.cli.common import (
    Command,
    Output,
    OutputOpt,
    err,
    fleet_inventory,
    group,
    out,
)

etcd_app = group("The cluster's two etcd clusters (main and events).")


@etcd_app.command("status", cls=Command)
def etcd_status(
    inventory: Annotated[
        Path | None,
        typer.Option(
            "--inventory",
            "-i",
            help="Ansible inventory (default: $SUPERKUBE_INVENTORY, else a running lab's).",
        ),
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Members, health, leader and DB size of the main and events clusters, as each member reports."""
    from superkube.fleet import converge as fleet

    inventory = fleet_inventory(inventory)
    with err.status("asking every etcd member"):
        state = fleet.etcd_status(inventory)
    clusters = state["clusters"]
    if output == Output.json:
        out.print_json(data=state)
    else:
        for name in ("main", "events"):
            c = clusters.get(name)
            if c is None:
                out.print(f"[bold]etcd {name}[/]: no hosts in etcd_{name}")
                continue
            t = Table(
                title=f"etcd {name}: {c['healthy']}/{c['member_count']} healthy, leader {c['leader'] or 'none'}",
                title_justify="left",
            )
            for col in ("host", "member id", "healthy", "leader", "db size", "raft index", "version"):
                t.add_column(col)
            for m in c["members"]:
                size = f"{m['db_size'] / 1024:,.0f} KiB" if m.get("db_size") is not None else "-"
                t.add_row(
                    m["host"],
                    m.get("id", "-"),
                    "yes" if m["healthy"] else f"[red]no[/] {(m.get('error') or '')[:40]}",
                    "yes" if m.get("leader") else "",
                    size,
                    str(m.get("raft_index", "-")),
                    m.get("version", "-"),
                )
            out.print(t)
    if any(not c["quorum"] for c in clusters.values()) or not clusters:
        raise typer.Exit(1)
