"""`superkube lab`: a real node fleet on this machine."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.table import Table

from superkube.cli.common import (
    Command,
    Output,
    OutputOpt,
    PassThrough,
    err,
    fail,
    group,
    out,
)
from superkube.cli.lab_nodes import COMMANDS, lab_call, loaded

lab_app = group("A real node fleet on this machine: booted Debian hosts in network namespaces.")


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
        result = lab_call(lab.up, hosts, lambda what, f: bar.update(task, description=what, completed=f))
    out.print(f"lab up: {len(result.hosts)} hosts; inventory {result.inventory}")
    for h in result.hosts:
        out.print(f"  {h.name:<14} {h.group:<12} {h.address}")


@lab_app.command("status", cls=Command)
def lab_status(output: OutputOpt = Output.table) -> None:
    """Show every host: group, address, running, reachable over SSH."""
    from superkube.lab import hosts as lab

    state = lab_call(lab.status)
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

    lab_call(lab.stop_host, host)
    out.print(f"{host} stopped")


@lab_app.command("start", cls=Command)
def lab_start(host: str) -> None:
    """Boot a stopped host again and wait until it is ready."""
    from superkube.lab import hosts as lab

    lab_call(lab.start_host, host)
    out.print(f"{host} started")


@lab_app.command("down", cls=Command)
def lab_down() -> None:
    """Stop every host and remove what the lab made.

    Every namespace, link, mount and state file goes; the image cache stays."""
    from superkube.lab import hosts as lab

    removed = lab_call(lab.down)
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
    done = lab_call(layer.apply, fleet, lambda what: err.print(what, highlight=False))
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
    joined = lab_call(nodes.join, fleet, hosts or (), 180, lambda what: err.print(what, highlight=False))
    if output is Output.json:
        doc = [{"node": j.name, "kubelet_to_ready_s": j.kubelet_to_ready_s} for j in joined]
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    for j in joined:
        if j.kubelet_to_ready_s is None:
            out.print(f"{j.name}: already Ready")
        else:
            out.print(f"{j.name}: Ready {j.kubelet_to_ready_s:.1f} s after its kubelet started")


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


@lab_app.command(
    "kubectl",
    cls=PassThrough,
    context_settings={
        "ignore_unknown_options": True,
        "allow_extra_args": True,
        "allow_interspersed_args": False,
    },
)  # every argument after the first is kubectl's, -o and --help included
def lab_kubectl(ctx: typer.Context) -> None:
    """Run the lab's kubectl as its admin, where the lab's API server is reachable.

    Every argument goes to kubectl, standard input too: `superkube job render JOB | superkube lab
    kubectl apply --server-side -f -`. The lab's own pinned kubectl, with the kubeconfig converge
    wrote, inside the namespace that holds the API servers' load balancer (root)."""
    import os

    from superkube.lab import layer

    argv = lab_call(layer.kubectl, loaded())
    sys.stdout.flush()
    try:
        os.execvp(argv[0], [*argv, *ctx.args])
    except OSError as exc:
        fail(
            f"{argv[0]}: cannot run it ({exc.strerror or exc}); the lab needs iproute2 (superkube doctor lab)"
        )


for _name, _command, _settings in COMMANDS:  # after build in `lab --help`
    lab_app.command(_name, cls=Command, context_settings=_settings)(_command)
