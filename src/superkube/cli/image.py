"""`superkube image`: the cluster's node images on Azure."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from superkube.cli.common import (
    Command,
    Output,
    OutputOpt,
    ProjectOpt,
    err,
    fail,
    group,
    out,
    plan_or_exit,
    print_roll,
    project_dir,
    read_file,
    read_inventory,
)
from superkube.model.spec import SpecError

image_app = group("Node images on Azure: capture a pool's image, and roll a pool onto it.")

AzureStackOpt = Annotated[
    str,
    typer.Option(
        "--stack",
        "-s",
        help="The cluster's stack: name (stacks/Pulumi.<name>.yaml) or stack file path; the command "
        "acts on that cluster in Azure.",
        show_default=False,
    ),
]


def _stack(stack: str, project: Path | None, subscription: str) -> tuple[Any, Any]:
    """The stack's spec and address plan, once the subscription is given; one line and exit if not."""
    from superkube.plan import engine as planning

    if not subscription:
        fail("give the cluster's subscription: --subscription ID, or set AZURE_SUBSCRIPTION_ID")
    try:
        _, spec, addresses = planning.load(project_dir(project), stack)
    except SpecError as exc:
        fail(str(exc))
    return spec, addresses


@image_app.command("capture", cls=Command)
def image_capture(
    pool: Annotated[str, typer.Argument(help="The pool whose node image to bake (its kind's definition).")],
    version: Annotated[str, typer.Option("--version", help="The gallery version to make, e.g. 1.4.0.")],
    inventory: Annotated[
        Path, typer.Option("--inventory", "-i", help="The cluster's inventory (superkube inventory --out).")
    ],
    stack: AzureStackOpt,
    subscription: Annotated[
        str,
        typer.Option("--subscription", envvar="AZURE_SUBSCRIPTION_ID", help="The cluster's subscription ID."),
    ] = "",
    keep_builder: Annotated[
        bool, typer.Option("--keep-builder", help="Leave the builder VM (deallocated once captured).")
    ] = False,
    project: ProjectOpt = None,
    arm_url: Annotated[str, typer.Option("--arm-url", hidden=True)] = "",
    output: OutputOpt = Output.table,
) -> None:
    """Bake POOL's node image on a builder VM and capture it (Azure).

    The builder is converged with site.yml, then generalize.yml, and captured as gallery:VERSION of
    the image definition of POOL's kind; then it is deleted (--keep-builder keeps it, deallocated).
    Acts on the cluster of --stack, which must be given."""
    from superkube.fleet import arm, capture
    from superkube.fleet import converge as fleet

    read_inventory(inventory, f"write it with superkube inventory -s {stack} --out FILE.azure_rm.yml")
    spec, addresses = _stack(stack, project, subscription)
    try:
        t = capture.target(
            spec, addresses, subscription, pool, version
        )  # a bad pool or version: before planning
        t = dataclasses.replace(t, pool_files=capture.pool_files(plan_or_exit(stack, project), pool))
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

    # a version's replication can take hours in a busy region
    client = arm.Arm(base=arm_url or os.environ.get("SUPERKUBE_ARM_URL") or arm.ARM, deadline_s=4 * 3600)
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


@image_app.command("roll", cls=Command)
def image_roll(
    pool: Annotated[str, typer.Argument(help="The pool to roll onto the image its scale sets' model names.")],
    kubeconfig: Annotated[
        Path, typer.Option("--kubeconfig", help="The cluster's admin kubeconfig (pki/admin.kubeconfig).")
    ],
    stack: AzureStackOpt,
    subscription: Annotated[
        str,
        typer.Option("--subscription", envvar="AZURE_SUBSCRIPTION_ID", help="The cluster's subscription ID."),
    ] = "",
    batch: Annotated[int, typer.Option("--batch", "-b", min=1, help="Nodes replaced at a time.")] = 2,
    timeout: Annotated[
        int, typer.Option("--timeout", min=30, help="Seconds a batch has from its drain to being in service.")
    ] = 1800,
    drain_timeout: Annotated[
        int, typer.Option("--drain-timeout", min=10, help="Seconds a node's drain may take.")
    ] = 900,
    project: ProjectOpt = None,
    arm_url: Annotated[str, typer.Option("--arm-url", hidden=True)] = "",
    output: OutputOpt = Output.table,
) -> None:
    """Roll POOL onto its model's image in health-gated batches (Azure).

    The instances not on the image its scale sets' model names are replaced; each batch is cordoned and drained, powered off, its Nodes deleted, upgraded and started, and
    waited for until Ready and past preflight; a failed batch stops the roll. Acts on the cluster of
    --stack, which must be given."""
    from superkube.agents.kubeapi import Kube
    from superkube.cluster import inventory, roll
    from superkube.fleet import arm, scalesets

    read_file(
        kubeconfig,
        "--kubeconfig",
        "give the kubeconfig converge writes: pki/admin.kubeconfig beside the inventory",
        what="a kubeconfig (a YAML mapping of clusters, users, contexts)",
    )
    spec, addresses = _stack(stack, project, subscription)
    sets = [s.name for s in addresses.scale_sets if s.pool == pool]
    if not sets:
        known = ", ".join(sorted(p.name for p in spec.node_pools))
        fail(f"pool {pool!r}: the stack has no such pool (pools: {known})")
    try:
        kube = Kube(str(kubeconfig))
    except Exception as exc:  # the client's own errors for a kubeconfig it cannot use
        fail(
            f"--kubeconfig {kubeconfig}: {str(exc).splitlines()[0][:200]}; give the kubeconfig converge "
            "writes (pki/admin.kubeconfig beside the inventory)"
        )
    say = lambda what: err.print(escape(what), highlight=False)  # noqa: E731
    group = f"/subscriptions/{subscription}/resourceGroups/{inventory.resource_group(addresses.cluster)}"
    client = arm.Arm(base=arm_url or os.environ.get("SUPERKUBE_ARM_URL") or arm.ARM)
    scale_sets = scalesets.ScaleSetPool(client, kube, group, pool, sets, drain_timeout, say)
    try:
        version = scale_sets.model_version()
        report = roll.roll(scale_sets, version, batch, timeout, say)
    except (roll.RollError, arm.ArmError) as exc:
        fail(str(exc), code=1)
    print_roll(report, output)
