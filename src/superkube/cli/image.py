"""`superkube image`: the cluster's node images on Azure."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from superkube.cli.common import Output, ProjectOpt, StackOpt, err, fail, out, planned, project_dir
from superkube.model.spec import SpecError

image_app = typer.Typer(
    help="Node images: bake a pool's image on Azure and capture it.", no_args_is_help=True
)


@image_app.command("capture")
def image_capture(
    pool: Annotated[str, typer.Argument(help="The pool whose node image to bake (its kind's definition).")],
    version: Annotated[str, typer.Option("--version", help="The gallery version to make, e.g. 1.4.0.")],
    inventory: Annotated[
        Path, typer.Option("--inventory", "-i", help="The cluster's inventory (superkube inventory --out).")
    ],
    stack: StackOpt = "dev",
    subscription: Annotated[
        str,
        typer.Option("--subscription", envvar="AZURE_SUBSCRIPTION_ID", help="The cluster's subscription ID."),
    ] = "",
    keep_builder: Annotated[
        bool, typer.Option("--keep-builder", help="Leave the builder VM (deallocated once captured).")
    ] = False,
    project: ProjectOpt = None,
    arm_url: Annotated[str, typer.Option("--arm-url", hidden=True)] = "",
    output: Annotated[Output, typer.Option("--output", "-o")] = Output.table,
) -> None:
    """Bake POOL's node image on a builder VM (site.yml, then generalize.yml) and capture it as
    gallery:VERSION of its kind's image definition; the builder is deleted (Azure only)."""
    from superkube.fleet import arm, capture
    from superkube.fleet import converge as fleet
    from superkube.plan import engine as planning

    if not subscription:
        fail("give the cluster's subscription: --subscription ID, or set AZURE_SUBSCRIPTION_ID")
    if not inventory.is_file():
        fail(
            f"--inventory {inventory}: no such file; write it with superkube inventory -s {stack} --out FILE"
        )
    try:
        _, spec, addresses = planning.load(project_dir(project), stack)
    except SpecError as exc:
        fail(str(exc))
    try:
        capture.target(spec, addresses, subscription, pool, version)  # a bad pool or version: before planning
        files = capture.pool_files(planned(stack, project), pool)
        t = capture.target(spec, addresses, subscription, pool, version, files)
    except capture.CaptureError as exc:
        fail(str(exc))

    def converge(playbook: str, limit: str, extra_vars: dict[str, Any]) -> None:
        result = fleet.converge(inventory, playbook=playbook, limit=limit, extra_vars=extra_vars)
        if result.ok and limit not in result.hosts:
            raise capture.CaptureError(
                f"{playbook} reached no host {limit}: is it in the inventory (tagged, running, reachable)?"
            )
        if not result.ok:
            why = "; ".join(f"{h}: {r.task}: {r.message}" for h, r in result.hosts.items() if not r.healthy)
            raise capture.CaptureError(
                f"{playbook} on {limit} failed ({why or 'no host matched: is the builder in the inventory?'})"
            )

    client = arm.Arm(base=arm_url or os.environ.get("SUPERKUBE_ARM_URL") or arm.ARM)
    try:
        made = capture.capture(
            client, t, converge, lambda line: err.print(escape(line), highlight=False), keep_builder
        )
    except (capture.CaptureError, arm.ArmError, fleet.FleetError) as exc:
        fail(str(exc), code=1)
    if output is Output.json:
        sys.stdout.write(json.dumps(made, indent=2) + "\n")
    else:
        out.print(
            f"captured {escape(made['image'])} for {t.kind} nodes: set pool {pool}'s image to "
            f"{escape(made['image'])} and run pulumi up, then roll the pool",
            highlight=False,
        )
