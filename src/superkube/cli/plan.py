"""`superkube plan`, `render` and `config-schema`: the offline plan and what is written from it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from superkube.cli.common import (
    STDOUT,
    Output,
    OutputOpt,
    ProjectOpt,
    StackOpt,
    err,
    fail,
    out,
    output_path,
    plan_or_exit,
    project_dir,
    read_file,
    write_atomically,
    write_output,
)
from superkube.cluster.kube import APISERVER_PORT
from superkube.model.words import plural
from superkube.plan import collector, report


def plan(
    stack: StackOpt = "dev",
    output: OutputOpt = Output.table,
    out_file: Annotated[
        Path | None, typer.Option("--out", help="Also write the whole plan as JSON to this file.")
    ] = None,
    diagram_file: Annotated[
        Path | None, typer.Option("--diagram", help="Draw the topology to this SVG file.")
    ] = None,
    project: ProjectOpt = None,
) -> None:
    """Run the Pulumi program offline under the mock engine and show what it would create.

    `--out -` (or `--diagram -`) writes that to standard output instead of the table."""

    if out_file == STDOUT and diagram_file == STDOUT:
        fail("--out - and --diagram -: only one of them can be standard output; write the other to a file")
    if diagram_file not in (None, STDOUT) and diagram_file.suffix.lower() != ".svg":
        fail(f"--diagram {diagram_file}: the diagram is SVG; name the file *.svg")
    out_path = output_path(out_file, "--out", "a plan superkube wrote (JSON)", is_plan_json)
    diagram_path = output_path(diagram_file, "--diagram", "a diagram (SVG)", _is_svg)
    # The plan and its document are a few hundred thousand objects that live until the command ends;
    # the cycle collector would scan them all again as the document is built and printed, for nothing.
    with collector.paused(for_the_command=True):
        result = plan_or_exit(stack, project)
        document = result.to_dict()
        if out_path is not None:
            write_output(out_path, json.dumps(document, indent=2) + "\n")
        if diagram_path is not None:
            from superkube.plan import diagram  # only with --diagram

            write_output(diagram_path, diagram.render(document))
        if STDOUT in (out_path, diagram_path):
            return
        if output is Output.json:
            sys.stdout.write(json.dumps(document, indent=2) + "\n")
            return
        _print_plan(result, document)
    if out_file is not None:
        out.print(f"plan written to {out_path}")
    if diagram_file is not None:
        out.print(f"diagram written to {diagram_path}")


def is_plan_json(head: bytes) -> bool:
    """The start of a plan `superkube plan --out` wrote: its format is the document's first key."""
    return head.lstrip().startswith(b"{") and b'"format": "superkube-plan/' in head[:200]


def _is_svg(head: bytes) -> bool:
    return head.lstrip().startswith((b"<svg", b"<?xml"))


def _rate(bits: int) -> str:
    for unit, size in (("Gbit/s", 10**9), ("Mbit/s", 10**6), ("kbit/s", 10**3)):
        if bits >= size:
            return f"{bits / size:g} {unit}"
    return f"{bits} bit/s"


def _print_plan(result: object, document: dict[str, object]) -> None:
    from superkube.plan.engine import Plan

    assert isinstance(result, Plan)
    a = result.addresses
    out.print(
        f"[bold]superkube plan[/] stack [cyan]{result.stack}[/] (cluster {result.cluster}, {result.spec.region}): "
        f"{plural(len(result.resources), 'resource')} in {result.seconds:.2f} s, no cloud calls"
    )
    counts = Table(title="Resources by type", title_justify="left")
    counts.add_column("type")
    counts.add_column("count", justify="right")
    for type_, n in result.counts().items():
        counts.add_row(type_, str(n))
    out.print(counts)

    topo = report.topology(result)
    tree = Tree(f"[bold]hub[/] {topo['hub']['address_space']}")
    tree.add(f"NAT host {topo['hub']['nat_host']} (IP forwarding, no public IP)")
    for route in topo["hub"]["routes"]:
        tree.add(f"route {route['prefix']} -> {route['next_hop']} in {route['table']}")
    for name, space in topo["peered_spokes"].items():
        tree.add(f"[dim]peered spoke {name} {space} (another cluster)[/]")
    spoke = tree.add(f"[bold]spoke[/] {topo['spoke']['address_space']} (peered with the hub only)")
    api = topo["spoke"]["apiservers"]
    spoke.add(f"{plural(len(api['members']), 'API server')} behind {api['load_balancer']}:{APISERVER_PORT}")
    spoke.add(
        f"etcd main: {plural(len(topo['spoke']['etcd_main']), 'member')}; "
        f"etcd events: {plural(len(topo['spoke']['etcd_events']), 'member')}"
    )
    spoke.add(
        f"beside the cluster: {plural(len(topo['spoke']['prometheus']), 'Prometheus shard')} writing to "
        f"{plural(len(topo['spoke']['metrics_store']), 'metrics store host')}"
    )
    for pool in topo["spoke"]["pools"]:
        branch = spoke.add(
            f"pool [bold]{pool['name']}[/] ({pool['role']}, {pool['vm_size']}): {plural(pool['nodes'], 'node')}, "
            f"{plural(pool['gpus'], 'GPU')}, "
            + (
                f"pod egress {_rate(pool['pod_egress_limit_bits'])} by default"
                if pool["pod_egress_limit_bits"]
                else "pod egress unlimited"
            )
        )
        for s in pool["scale_sets"]:
            branch.add(
                f"{s['name']}: {plural(s['capacity'], 'VM')}, zones {','.join(s['zones'])}, subnet {s['subnet']}"
            )
    out.print("[bold]Topology[/]")
    out.print(tree)

    table = Table(title="Address plan", title_justify="left")
    for col, just in [
        ("vnet", "left"),
        ("subnet", "left"),
        ("cidr", "left"),
        ("addresses", "right"),
        ("usable", "right"),
        ("NICs", "right"),
        ("IPs/NIC", "right"),
        ("IPs used", "right"),
        ("fill", "right"),
    ]:
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for row in report.address_rows(a):
        table.add_row(
            row["vnet"],
            row["subnet"],
            row["cidr"],
            f"{row['addresses']:,}",
            f"{row['usable']:,}",
            f"{row['nics']:,}",
            str(row["ips_per_nic"]),
            f"{row['ips_used']:,}" + (" reserved" if row["reserved"] else ""),
            f"{100 * row['ips_used'] / row['usable']:.0f}%",
        )
    out.print(table)

    limits = Table(title="Azure limits", title_justify="left")
    for col in ("limit", "scope", "used", "max", "headroom", "source"):
        limits.add_column(col, justify="right" if col in ("used", "max", "headroom") else "left")
    for row in report.limit_rows(a):
        source = f"override: {row['override_reason']}" if row["override_reason"] else "Azure default"
        limits.add_row(
            row["what"], row["scope"], f"{row['used']:,}", f"{row['max']:,}", f"{row['headroom']:,}", source
        )
    out.print(limits)

    cap = report.capacity(a)
    out.print(
        f"[bold]Capacity[/]: {plural(cap['nodes'], 'node')} ({cap['gpu_nodes']:,} GPU), {plural(cap['gpus'], 'GPU')}, "
        f"{plural(cap['pod_ips'], 'pod IP')}, {plural(cap['scale_sets'], 'scale set')}, "
        f"{plural(cap['control_plane_vms'], 'control-plane VM')}"
    )
    _print_teams(result)
    _print_withheld(result)
    out.print(
        f"[bold]Next[/]: superkube check --stack {escape(result.stack)} (the policy rules on this plan); "
        "then the main loop in README.md, step 3",
        highlight=False,
    )


def _print_teams(result: object) -> None:
    """Whose each pool's nodes are (superkube:teams), as the nodes register and as later labels
    may change it: what `job render` holds a job's team to."""
    from superkube.model.teams import ANY
    from superkube.plan.engine import Plan

    assert isinstance(result, Plan)
    spec = result.spec
    if not spec.teams:
        return
    table = Table(title="Teams: whose nodes", title_justify="left")
    for col in ("pool", "nodes", "team", "on later labels (a rack)"):
        table.add_column(col, justify="right" if col == "nodes" else "left")
    owners = spec.team_pools(result.cluster)
    for pool in spec.node_pools:
        owner = owners[pool.name]
        said = "anyone's (no team)" if not owner else "any (anyone may borrow)" if owner == ANY else owner
        table.add_row(pool.name, f"{pool.nodes:,}", said, ", ".join(spec.later_teams(pool, result.cluster)))
    out.print(table)


def _print_withheld(result: object) -> None:
    """The layer's Secrets whose data the plan stands in for: `pulumi up` needs the stack's secret."""
    from superkube.plan import layer
    from superkube.plan.engine import Plan

    assert isinstance(result, Plan)
    _, withheld = layer.written(result)
    for w in withheld:
        out.print(
            f"[bold]Secret data[/]: {escape(w.obj)} holds a secret of the stack, which the plan stands in for"
            + (f"; before pulumi up: {escape(w.fix)}" if w.fix else ""),
            highlight=False,
        )


def render(
    stack: StackOpt = "dev",
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Write one YAML file per component into this directory (made if missing)."
        ),
    ] = None,
    project: ProjectOpt = None,
) -> None:
    """Write the in-cluster layer's Kubernetes objects as YAML, each checked against its official schema."""
    from superkube.cluster import render as rendering
    from superkube.plan import layer

    if out_dir is not None:
        if out_dir.exists() and not out_dir.is_dir():
            fail(f"--out {out_dir}: is a file; give a directory")
        if not out_dir.resolve().parent.is_dir():
            fail(f"--out {out_dir}: {out_dir.resolve().parent} does not exist; create it first")
    result = plan_or_exit(stack, project)
    by_component, withheld = layer.written(result)
    if not by_component:
        fail(
            f"stack {result.stack} has no in-cluster layer (superkube:in_cluster_layer is false); "
            f"set it true to render",
            code=1,
        )
    version = result.spec.kubernetes_version
    # what is written is what is checked, each object as a real API server would take it
    found = [p for c, objs in by_component.items() for o in objs for p in rendering.validate(o, version, c)]
    if found:
        for problem in found:
            err.print(f"[bold red]invalid:[/] {escape(str(problem))}", markup=True, highlight=False)
        fail(f"{len(found)} invalid object(s) against Kubernetes {version}; nothing written", code=1)
    for w in withheld:
        err.print(f"[bold]left out:[/] {escape(str(w))}", markup=True, highlight=False)
    total = sum(len(objs) for objs in by_component.values())
    if out_dir is None:
        for component, objs in by_component.items():
            sys.stdout.write(f"# component: {component}\n---\n" + rendering.to_yaml(objs))
        return
    out_dir.mkdir(exist_ok=True)
    names = layer.file_names(list(by_component))
    for component, objs in by_component.items():
        write_atomically(out_dir / names[component], rendering.to_yaml(objs))
    out.print(
        f"{plural(total, 'object')} in {plural(len(by_component), 'file')} under {out_dir}, "
        f"valid against Kubernetes {version} (strict)"
        + (f"; {plural(len(withheld), 'Secret')} left out (above)" if withheld else "")
    )


def config_schema(
    write: Annotated[bool, typer.Option("--write", help="Rewrite Pulumi.yaml from the spec.")] = False,
    check: Annotated[
        bool, typer.Option("--check", help="Exit 1 if Pulumi.yaml differs from the spec.")
    ] = False,
    project: ProjectOpt = None,
) -> None:
    """Print (or write, or check) Pulumi.yaml's config declarations, generated from the spec."""
    from superkube.plan import schema

    text = schema.pulumi_yaml()
    root = project_dir(project)
    if write:
        schema.write(root)
        out.print(f"wrote {root / 'Pulumi.yaml'}")
    elif check:
        current = read_file(
            root / "Pulumi.yaml", "", "write it: superkube config-schema --write", kind="text"
        )
        if current != text:
            fail(
                "Pulumi.yaml is out of date with superkube.model.spec; run: superkube config-schema --write",
                code=1,
            )
        out.print("Pulumi.yaml matches the spec")
    else:
        sys.stdout.write(text)
