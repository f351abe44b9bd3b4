"""`superkube lab`: a real node fleet on this machine."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.table import Table

from superkube.cli.common import (
    Output,
    err,
    fail,
    out,
)

lab_app = typer.Typer(
    help="A real node fleet on this machine: booted Debian hosts in network namespaces.", no_args_is_help=True
)


def _lab_call(fn: Any, *args: Any) -> Any:
    from superkube.lab import hosts as lab

    try:
        return fn(*args)
    except lab.LabError as exc:
        fail(str(exc))


@lab_app.command("up")
def lab_up(
    hosts: Annotated[
        str,
        typer.Option(
            "--hosts",
            "-n",
            help="Cluster hosts (plus a hub client and an internet host): a count, spread over the groups, "
            "or counts per group, e.g. etcd_main=5,etcd_events=3,apiservers=1.",
        ),
    ] = "8",
) -> None:
    """Build (once) the base image, then boot the hosts and write the Ansible inventory."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from superkube.lab import hosts as lab

    with Progress(
        TextColumn("{task.description:<48}"), BarColumn(), TimeElapsedColumn(), console=err, transient=False
    ) as bar:
        task = bar.add_task("starting", total=1.0)
        result = _lab_call(lab.up, hosts, lambda what, f: bar.update(task, description=what, completed=f))
    out.print(f"lab up: {len(result.hosts)} hosts; inventory {result.inventory}")
    for h in result.hosts:
        out.print(f"  {h.name:<14} {h.group:<12} {h.address}")


@lab_app.command("status")
def lab_status(output: Annotated[Output, typer.Option("--output", "-o")] = Output.table) -> None:
    """Show every host: group, address, running, reachable over SSH."""
    from superkube.lab import hosts as lab

    state = _lab_call(lab.status)
    if output is Output.json:
        sys.stdout.write(json.dumps(state, indent=2) + "\n")
        return
    if not state["up"]:
        out.print(
            "no lab is up" + (f"; left over: {', '.join(state['leftovers'])}" if state["leftovers"] else "")
        )
        return
    table = Table(title=f"lab ({state['inventory']})", title_justify="left")
    for col in ("host", "group", "address", "running", "ssh"):
        table.add_column(col)
    for h in state["hosts"]:
        table.add_row(
            h["name"],
            h["group"],
            h["address"],
            "yes" if h["running"] else "[red]no[/]",
            "yes" if h["ssh"] else "[red]no[/]",
        )
    out.print(table)


@lab_app.command("stop")
def lab_stop(host: str) -> None:
    """Power one host off (its disk is kept)."""
    from superkube.lab import hosts as lab

    _lab_call(lab.stop_host, host)
    out.print(f"{host} stopped")


@lab_app.command("start")
def lab_start(host: str) -> None:
    """Boot a stopped host again and wait until it is ready."""
    from superkube.lab import hosts as lab

    _lab_call(lab.start_host, host)
    out.print(f"{host} started")


@lab_app.command("down")
def lab_down() -> None:
    """Stop every host and remove every namespace, link, mount and state file (the image cache stays)."""
    from superkube.lab import hosts as lab

    removed = _lab_call(lab.down)
    out.print(f"lab down: removed {len(removed)} things" if removed else "no lab was up")
