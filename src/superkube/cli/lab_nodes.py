"""`superkube lab bake, publish, scale, fault, roll`: the lab's node pools as Azure's scale sets
are run: images baked, instances added and returned, faults put on nodes, pools rolled. And the two
calls every lab command makes: into the lab (`lab_call`), and for the lab that is up (`loaded`)."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer

from superkube.cli.common import Output, OutputOpt, err, fail, out, print_roll


def lab_call(fn: Any, *args: Any) -> Any:
    """fn(*args), a LabError from it one line and exit 2: every lab command's call into the lab."""
    from superkube.lab import hosts as lab

    try:
        return fn(*args)
    except lab.LabError as exc:
        fail(str(exc))


def loaded() -> Any:
    """The lab that is up; one line and exit 2 when none is."""
    from superkube.lab.state import Lab

    fleet = Lab.load()
    if fleet is None:
        fail("no lab is up; run `superkube lab up` and `superkube converge` first")
    return fleet


def lab_bake(
    pool: Annotated[str, typer.Argument(help="The node pool whose image to bake, e.g. gpu.")],
) -> None:
    """Bake a pool's node image: converge a builder host with the node roles, keep its root."""
    from superkube.lab import scaleout

    path = lab_call(scaleout.bake, loaded(), pool, lambda what: err.print(what, highlight=False))
    out.print(f"{pool}: image {path}")


def lab_publish(output: OutputOpt = Output.table) -> None:
    """Run one round of the join-token publisher.

    A short-lived token is written into each scale set's model."""
    from superkube.lab import scaleout

    done = lab_call(scaleout.publish, loaded())
    if output is Output.json:
        sys.stdout.write(json.dumps(done, indent=2) + "\n")
        return
    state = "issued" if done["issued"] else "kept"
    out.print(f"join token {done['token_id']} {state}, valid until {done['expires']}")
    for name in done["written"]:
        out.print(f"  {name}: model written")


def lab_scale(
    pool: Annotated[str, typer.Argument(help="The node pool, e.g. gpu.")],
    change: Annotated[
        str, typer.Argument(help="+N instances from the baked image, or -N to return the newest N.")
    ],
    name: Annotated[
        list[str] | None,
        typer.Option("--name", help="With -N: the instances to return (as remediation deletes a VM)."),
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Add instances to a pool, or drain and delete some.

    New instances join from the pool's image and custom data alone."""
    from superkube.lab import scaleout

    sign, digits = change[:1], change[1:]
    if sign not in "+-" or not digits.isdigit() or int(digits) == 0:
        fail(f"{change!r}: give +N to add instances or -N to return them, e.g. `lab scale {pool} +4`")
    if name and sign != "-":
        fail(f"--name goes with -N (the instances to return), not with {change!r}")
    fleet = loaded()
    say = lambda what: err.print(what, highlight=False)  # noqa: E731
    if sign == "-":
        gone = lab_call(scaleout.scale_in, fleet, pool, int(digits), say, name or [])
        out.print(f"{pool}: returned {', '.join(gone)}")
        return
    added = lab_call(scaleout.scale_out, fleet, pool, int(digits), 300, say)
    if output is Output.json:
        doc = [{"node": i.name, "boot_to_ready_s": i.boot_to_ready_s,
                "boot_to_schedulable_s": i.boot_to_schedulable_s} for i in added]  # fmt: skip
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    for i in added:
        out.print(
            f"{i.name}: Ready {i.boot_to_ready_s:.1f} s, schedulable {i.boot_to_schedulable_s:.1f} s after boot"
        )


def lab_fault(
    host: Annotated[str, typer.Argument(help="The node, e.g. gpu-2 or cpu-1.")],
    kind: Annotated[
        str,
        typer.Argument(help="scheduled-event, disk-full, api-unreachable, gpu-fatal, or clear."),
    ],
    event_type: Annotated[
        str, typer.Option("--type", help="The scheduled event: Reboot, Redeploy or Terminate.")
    ] = "Reboot",
    not_before: Annotated[
        int | None,
        typer.Option(
            "--in",
            help="Seconds until the scheduled event's NotBefore (default: five minutes, as `lab fault` documents).",
            min=1,
        ),
    ] = None,
) -> None:
    """Put a fault on a lab node for the health loop to find, or clear it.

    Each is real and confined to the node; `clear` takes them all away (the node
    stays cordoned until a person uncordons it)."""
    from superkube.lab import faults

    ahead = faults.NOT_BEFORE_S if not_before is None else not_before
    out.print(lab_call(faults.inject, loaded(), host, kind, event_type, ahead))


def lab_roll(
    pool: Annotated[str, typer.Argument(help="The node pool to roll onto its newest baked image, e.g. gpu.")],
    batch: Annotated[int, typer.Option("--batch", "-b", min=1, help="Nodes replaced at a time.")] = 2,
    timeout: Annotated[
        int, typer.Option("--timeout", min=30, help="Seconds a batch has from its drain to being in service.")
    ] = 600,
    fault: Annotated[
        list[str] | None,
        typer.Option(
            "--fault",
            help="NODE=FAULT: that instance comes up from the new image with a GPU fault "
            "(gpu-missing or xid-79), to see a roll stop. Repeatable.",
        ),
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Roll a pool onto its newest baked image, in health-gated batches.

    A failed batch stops the roll."""
    from superkube.lab import scaleout

    faults: dict[str, str] = {}
    for item in fault or []:
        node, sep, kind = item.partition("=")
        if not sep or not node or not kind:
            fail(f"--fault {item!r}: give NODE=FAULT, e.g. --fault gpu-3=gpu-missing")
        faults[node] = kind
    say = lambda what: err.print(what, highlight=False)  # noqa: E731
    report = lab_call(scaleout.roll_pool, loaded(), pool, batch, timeout, faults, say)
    print_roll(report, output)


COMMANDS: list[tuple[str, Any, dict[str, Any] | None]] = [
    ("bake", lab_bake, None),
    ("publish", lab_publish, None),
    ("scale", lab_scale, {"ignore_unknown_options": True}),  # -N is a change, not an option
    ("fault", lab_fault, None),
    ("roll", lab_roll, None),
]
"""The commands, in the order `superkube lab --help` lists them, with their parsing settings."""
