"""`superkube converge` and `inventory`: the playbooks over a fleet, and the fleet's inventory."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from superkube.cli.common import (
    STDOUT,
    Output,
    OutputOpt,
    ProjectOpt,
    StackOpt,
    err,
    fail,
    fleet_inventory,
    out,
    output_path,
    project_dir,
    write_output,
)
from superkube.model.spec import SpecError


def converge(
    inventory: Annotated[
        Path | None,
        typer.Option(
            "--inventory",
            "-i",
            help="Ansible inventory (default: $SUPERKUBE_INVENTORY, else a running lab's).",
        ),
    ] = None,
    limit: Annotated[
        str | None, typer.Option("--limit", "-l", help="Hosts or groups to converge (Ansible --limit).")
    ] = None,
    tags: Annotated[
        str | None, typer.Option("--tags", "-t", help="Only these roles/tags (Ansible --tags).")
    ] = None,
    retry: Annotated[
        bool, typer.Option("--retry", help="Only the hosts that failed or were unreachable last time.")
    ] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Run the playbooks over a fleet with a live view per host; exit 1 if any host failed."""
    from rich.live import Live

    from superkube.fleet import converge as fleet

    inventory = fleet_inventory(inventory)
    if retry:
        if limit:
            fail("--retry and --limit both choose hosts; give one")
        limit = f"@{fleet.retry_file(inventory)}"

    def table(hosts: dict[str, Any]) -> Table:
        t = Table(title=f"converge {inventory}", title_justify="left")
        for col in ("host", "ok", "changed", "failed", "unreachable", "task"):
            t.add_column(
                col, justify="right" if col in ("ok", "changed", "failed", "unreachable") else "left"
            )
        for name in sorted(hosts):
            h = hosts[name]
            bad = "[red]" if not h.healthy else ""
            t.add_row(
                f"{bad}{name}", str(h.ok), str(h.changed), str(h.failed), str(h.unreachable), h.task[:60]
            )
        return t

    live_view = output is Output.table and sys.stderr.isatty()
    try:
        if live_view:
            with Live(table({}), console=err, refresh_per_second=4, transient=True) as live:
                result = fleet.converge(
                    inventory, limit=limit, tags=tags, on_update=lambda h: live.update(table(h))
                )
        else:
            result = fleet.converge(inventory, limit=limit, tags=tags)
    except fleet.FleetError as exc:
        fail(str(exc))
    if output is Output.json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
    else:
        out.print(table(result.hosts))
        for problem in result.problems:
            out.print(f"[red]{escape(str(problem))}[/]")
        for name in result.failed_hosts:
            h = result.hosts[name]
            what = "unreachable" if h.unreachable else "failed"
            out.print(f"[red]{escape(name)} {escape(str(what))}[/]: {escape(str(h.message))}")
        if result.ok:
            verdict = "converged"
        elif result.failed_hosts:
            verdict = f"{len(result.failed_hosts)} host(s) failed or unreachable"
        else:
            verdict = "ansible-playbook did not run to the end"
        out.print(
            f"{verdict} in {result.seconds:.1f} s"
            + ("; rerun them: superkube converge --retry" if result.retry_file else "")
        )
    if not result.ok:
        raise typer.Exit(1)


def inventory(
    stack: StackOpt = "dev",
    out_file: Annotated[
        Path | None, typer.Option("--out", help="Write to this file (name it *.azure_rm.yml).")
    ] = None,
    project: ProjectOpt = None,
) -> None:
    """Write the Azure dynamic-inventory config: hosts grouped by the role tags the program sets."""
    from superkube.cluster import inventory as inv
    from superkube.plan import engine as planning

    if out_file not in (None, STDOUT) and not out_file.name.endswith(("azure_rm.yml", "azure_rm.yaml")):
        fail(f"--out {out_file}: the azure_rm plugin only reads files named *.azure_rm.yml; rename it")
    out_path = output_path(
        out_file, "--out", "an inventory config superkube wrote", lambda head: inv.PLUGIN.encode() in head
    )
    try:
        _, spec, addresses = planning.load(project_dir(project), stack)
    except SpecError as exc:
        fail(str(exc))
    text = inv.render(spec, addresses)
    if out_path in (None, STDOUT):
        sys.stdout.write(text)
    else:
        write_output(out_path, text)
        out.print(f"inventory written to {out_path}")
