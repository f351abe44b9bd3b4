"""`superkube lab`: a real node fleet on this machine."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.table import Table

from superkube.cli.common import (
    Command,
    Output,
    OutputOpt,
    err,
    fail,
    group,
    out,
    print_roll,
)

lab_app = group("A real node fleet on this machine: booted Debian hosts in network namespaces.")


def _lab_call(fn: Any, *args: Any) -> Any:
    from superkube.lab import hosts as lab

    try:
        return fn(*args)
    except lab.LabError as exc:
        fail(str(exc))


@lab_app.command("up", cls=Command)
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
    """Boot the lab's hosts and write their inventory.

    The base image and the pinned components are built first, once."""
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


@lab_app.command("status", cls=Command)
def lab_status(output: OutputOpt = Output.table) -> None:
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


@lab_app.command("stop", cls=Command)
def lab_stop(host: str) -> None:
    """Power one host off (its disk is kept)."""
    from superkube.lab import hosts as lab

    _lab_call(lab.stop_host, host)
    out.print(f"{host} stopped")


@lab_app.command("start", cls=Command)
def lab_start(host: str) -> None:
    """Boot a stopped host again and wait until it is ready."""
    from superkube.lab import hosts as lab

    _lab_call(lab.start_host, host)
    out.print(f"{host} started")


@lab_app.command("down", cls=Command)
def lab_down() -> None:
    """Stop every host and remove what the lab made.

    Every namespace, link, mount and state file goes; the image cache stays."""
    from superkube.lab import hosts as lab

    removed = _lab_call(lab.down)
    out.print(f"lab down: removed {len(removed)} things" if removed else "no lab was up")


@lab_app.command("apply", cls=Command)
def lab_apply(
    output: OutputOpt = Output.table,
) -> None:
    """Apply the in-cluster layer to the lab's API server, after converge.

    The layer is what `superkube render` writes for the lab's stack, applied with `kubectl apply
    --server-side`, as `pulumi up` does in production."""
    from superkube.lab import layer
    from superkube.lab.state import Lab

    fleet = Lab.load()
    if fleet is None:
        fail("no lab is up; run `superkube lab up` and `superkube converge` first")
    done = _lab_call(layer.apply, fleet, lambda what: err.print(what, highlight=False))
    if output is Output.json:
        doc = [{"file": a.file, "objects": a.objects, "established": a.established} for a in done]
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    table = Table(title="lab apply", title_justify="left")
    for col in ("file", "objects", "CRDs established", "seconds"):
        table.add_column(col)
    for a in done:
        table.add_row(a.file, str(len(a.objects)), str(len(a.established)), f"{a.seconds:.1f}")
    out.print(table)
    out.print(f"{sum(len(a.objects) for a in done)} objects applied to the lab's API server")


@lab_app.command("join", cls=Command)
def lab_join(
    hosts: Annotated[
        list[str] | None, typer.Argument(help="Node hosts to join (default: every GPU and CPU node).")
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Join node hosts to the lab's control plane, after converge.

    They join for real: each host's cloud-init join unit is started (TLS bootstrap, its CSR signed by the
    controller-manager), and each Node waited for until Ready."""
    from superkube.lab import nodes
    from superkube.lab.state import Lab

    fleet = Lab.load()
    if fleet is None:
        fail("no lab is up; run `superkube lab up` and `superkube converge` first")
    joined = _lab_call(nodes.join, fleet, hosts or (), 180, lambda what: err.print(what, highlight=False))
    if output is Output.json:
        doc = [{"node": j.name, "kubelet_to_ready_s": j.kubelet_to_ready_s} for j in joined]
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    for j in joined:
        if j.kubelet_to_ready_s is None:
            out.print(f"{j.name}: already Ready")
        else:
            out.print(f"{j.name}: Ready {j.kubelet_to_ready_s:.1f} s after its kubelet started")


def _loaded() -> Any:
    from superkube.lab.state import Lab

    fleet = Lab.load()
    if fleet is None:
        fail("no lab is up; run `superkube lab up` and `superkube converge` first")
    return fleet


@lab_app.command("bake", cls=Command)
def lab_bake(
    pool: Annotated[str, typer.Argument(help="The node pool whose image to bake, e.g. gpu.")],
) -> None:
    """Bake a pool's node image: converge a builder host with the node roles, keep its root."""
    from superkube.lab import scaleout

    path = _lab_call(scaleout.bake, _loaded(), pool, lambda what: err.print(what, highlight=False))
    out.print(f"{pool}: image {path}")


@lab_app.command("publish", cls=Command)
def lab_publish(output: OutputOpt = Output.table) -> None:
    """Run one round of the join-token publisher.

    A short-lived token is written into each scale set's model."""
    from superkube.lab import scaleout

    done = _lab_call(scaleout.publish, _loaded())
    if output is Output.json:
        sys.stdout.write(json.dumps(done, indent=2) + "\n")
        return
    state = "issued" if done["issued"] else "kept"
    out.print(f"join token {done['token_id']} {state}, valid until {done['expires']}")
    for name in done["written"]:
        out.print(f"  {name}: model written")


@lab_app.command(
    "scale", cls=Command, context_settings={"ignore_unknown_options": True}
)  # -N is a change, not an option
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
    fleet = _loaded()
    say = lambda what: err.print(what, highlight=False)  # noqa: E731
    if sign == "-":
        gone = _lab_call(scaleout.scale_in, fleet, pool, int(digits), say, name or [])
        out.print(f"{pool}: returned {', '.join(gone)}")
        return
    added = _lab_call(scaleout.scale_out, fleet, pool, int(digits), 300, say)
    if output is Output.json:
        doc = [{"node": i.name, "boot_to_ready_s": i.boot_to_ready_s,
                "boot_to_schedulable_s": i.boot_to_schedulable_s} for i in added]  # fmt: skip
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    for i in added:
        out.print(
            f"{i.name}: Ready {i.boot_to_ready_s:.1f} s, schedulable {i.boot_to_schedulable_s:.1f} s after boot"
        )


@lab_app.command("fault", cls=Command)
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
    out.print(_lab_call(faults.inject, _loaded(), host, kind, event_type, ahead))


@lab_app.command("roll", cls=Command)
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
    report = _lab_call(scaleout.roll_pool, _loaded(), pool, batch, timeout, faults, say)
    print_roll(report, output)


@lab_app.command("build", cls=Command)
def lab_build(
    only: Annotated[
        list[str] | None,
        typer.Option(
            "--only",
            help="Build only this component (lab build --help lists them); repeatable.",
        ),
    ] = None,
    jobs: Annotated[
        int,
        typer.Option("--jobs", "-j", min=1, help="Components built at once (two of one module never are)."),
    ] = 2,
    pin: Annotated[
        list[str] | None,
        typer.Option("--pin", help="Build another version than the roles pin: NAME=VERSION; repeatable."),
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Build the pinned components into the build cache.

    Each is built from its Go module; a second run builds nothing. The components: etcd, kubernetes, kubernetes-node,
    scheduler-plugins, containerd, runc, kwok, scheduler-plugins-controller, mpi-operator, coredns."""
    from superkube.harness import build

    pins = {}
    for item in pin or []:
        name, sep, version = item.partition("=")
        if not sep or not name or not version:
            fail(f"--pin {item}: expected NAME=VERSION, e.g. --pin etcd=3.6.6")
        pins[name] = version
    unknown = sorted(set(only or []) - set(build.NAMES))
    if unknown:
        fail(f"--only {', '.join(unknown)}: no such component; the components are {', '.join(build.NAMES)}")
    try:
        wanted = [c for c in build.components(pins) if not only or c.name in only]
    except build.PinError as exc:
        fail(f"--pin {exc}")
    try:
        results = build.build_all(
            wanted, lambda component, what: err.print(f"{component}: {what}", highlight=False), jobs=jobs
        )
    except build.BuildError as exc:
        fail(str(exc), code=1)
    if output is Output.json:
        doc = [
            {"path": str(b.path), "cached": b.cached, "seconds": round(b.seconds, 1), **b.manifest}
            for b in results
        ]
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        return
    table = Table(title="lab build", title_justify="left")
    for col in ("component", "version", "go", "binary", "sha256", "state"):
        table.add_column(col)
    for b in results:
        state = "cached" if b.cached else f"built in {b.seconds:.0f} s"
        for name, info in b.manifest["binaries"].items():
            table.add_row(
                b.component.name, b.component.version, b.manifest["go"], name, info["sha256"][:16], state
            )
    out.print(table)
    for b in results:
        for name, info in b.manifest["binaries"].items():
            for module in info.get("substitutes_compiled_in", []):
                out.print(
                    f"{name}: built with {module}: the module proxy refused upstream's pin (manifest.json says why)"
                )
    out.print(f"cache: {build.CACHE_DIR}")
