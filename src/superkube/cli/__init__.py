"""The superkube command line."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from superkube.cluster.kube import APISERVER_PORT
from superkube.model.spec import SpecError
from superkube.plan import diagram, report

app = typer.Typer(
    name="superkube",
    help="Stand up and run GPU Kubernetes clusters of thousands of nodes on Azure, as code.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 150)
err = Console(stderr=True, soft_wrap=True)

USER_ERROR = 2


class Output(StrEnum):
    table = "table"
    json = "json"


StackOpt = Annotated[
    str, typer.Option("--stack", "-s", help="Stack name (stacks/Pulumi.<name>.yaml) or a stack file path.")
]
ProjectOpt = Annotated[
    Path | None,
    typer.Option("--project", help="superkube project directory (default: found from the current one)."),
]


def fail(message: str, code: int = USER_ERROR) -> NoReturn:
    # the message is printed verbatim: brackets in a pattern or a key path are not markup
    err.print(f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False)
    raise typer.Exit(code)


def _project(project: Path | None) -> Path:
    from superkube.plan.engine import find_project

    return project.resolve() if project else find_project()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_atomically(path: Path, text: str) -> None:
    """Write through a temporary file and rename, so a reader never sees half a file. The file gets
    the mode any new file gets (0666 less the umask), not the temporary file's private 0600."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _check_writable(path: Path | None, option: str) -> None:
    if path is None:
        return
    parent = path.resolve().parent
    if path.is_dir():
        fail(f"{option} {path}: is a directory; give a file name")
    if not parent.is_dir():
        fail(f"{option} {path}: directory {parent} does not exist; create it first")
    if parent.exists() and not os.access(parent, os.W_OK):
        fail(f"{option} {path}: directory is not writable; choose another path")


def _planned(stack: str, project: Path | None) -> Any:
    """Plan a stack under the mock engine with a spinner; a bad stack or program is one line and exit."""
    from superkube.plan import engine as planning

    try:
        root = _project(project)
        with err.status(f"planning stack {stack} under the mock engine", spinner="dots"):
            return planning.run(root, stack)
    except SpecError as exc:
        fail(str(exc))
    except planning.PlanError as exc:
        fail(str(exc), code=1)


@app.command()
def plan(
    stack: StackOpt = "dev",
    output: Annotated[
        Output, typer.Option("--output", "-o", help="table for people, json for machines.")
    ] = Output.table,
    out_file: Annotated[
        Path | None, typer.Option("--out", help="Also write the whole plan as JSON to this file.")
    ] = None,
    diagram_file: Annotated[
        Path | None, typer.Option("--diagram", help="Draw the topology to this SVG file.")
    ] = None,
    project: ProjectOpt = None,
) -> None:
    """Run the Pulumi program offline under the mock engine and show what it would create."""

    _check_writable(out_file, "--out")
    _check_writable(diagram_file, "--diagram")
    if diagram_file is not None and diagram_file.suffix.lower() != ".svg":
        fail(f"--diagram {diagram_file}: the diagram is SVG; name the file *.svg")
    result = _planned(stack, project)
    document = result.to_dict()
    if out_file is not None:
        _write_atomically(out_file, json.dumps(document, indent=2) + "\n")
    if diagram_file is not None:
        _write_atomically(diagram_file, diagram.render(document))
    if output is Output.json:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return
    _print_plan(result, document)
    if out_file is not None:
        out.print(f"plan written to {out_file}")
    if diagram_file is not None:
        out.print(f"diagram written to {diagram_file}")


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
        f"{len(result.resources)} resources in {result.seconds:.2f} s, no cloud calls"
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
    spoke.add(f"{len(api['members'])} API servers behind {api['load_balancer']}:{APISERVER_PORT}")
    spoke.add(
        f"etcd main: {len(topo['spoke']['etcd_main'])} members; etcd events: {len(topo['spoke']['etcd_events'])} members"
    )
    spoke.add(
        f"beside the cluster: {len(topo['spoke']['prometheus'])} Prometheus shards writing to "
        f"{len(topo['spoke']['metrics_store'])} metrics store hosts"
    )
    for pool in topo["spoke"]["pools"]:
        branch = spoke.add(
            f"pool [bold]{pool['name']}[/] ({pool['role']}, {pool['vm_size']}): {pool['nodes']:,} nodes, {pool['gpus']:,} GPUs, "
            + (
                f"pod egress {_rate(pool['pod_egress_limit_bits'])} by default"
                if pool["pod_egress_limit_bits"]
                else "pod egress unlimited"
            )
        )
        for s in pool["scale_sets"]:
            branch.add(
                f"{s['name']}: {s['capacity']:,} VMs, zones {','.join(s['zones'])}, subnet {s['subnet']}"
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
        f"[bold]Capacity[/]: {cap['nodes']:,} nodes ({cap['gpu_nodes']:,} GPU), {cap['gpus']:,} GPUs, "
        f"{cap['pod_ips']:,} pod IPs, {cap['scale_sets']} scale sets, {cap['control_plane_vms']} control-plane VMs"
    )


class CheckOutput(StrEnum):
    table = "table"
    json = "json"
    sarif = "sarif"
    markdown = "markdown"


def _load_plan_document(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        fail(f"--plan {path}: no such file; write one with: superkube plan --stack <name> --out {path}")
    except (OSError, json.JSONDecodeError) as exc:
        fail(f"--plan {path}: not a JSON plan ({exc}); write one with: superkube plan --out {path}")
    if not isinstance(document, dict) or document.get("format") != "superkube-plan/1":
        fail(
            f"--plan {path}: not a superkube plan (format superkube-plan/1); write one with: superkube plan --out {path}"
        )
    return document


def _stack_report_inputs(stack: str, plan_file: Path | None, project: Path | None) -> tuple[Any, ...]:
    """(view, spec, addresses, stack name, source path) for a stack or a saved plan."""
    from superkube.plan import checks
    from superkube.plan import engine as planning

    root = _project(project)
    if plan_file is not None:
        document = _load_plan_document(plan_file)
        name = str(document.get("stack", "plan"))
        spec, addresses = planning.spec_from_config(document.get("config") or {}, name)
        source = _relative(planning.stack_path(root, name), root)
        return checks.view_from_plan_document(document), spec, addresses, name, source, root
    with err.status(f"planning stack {stack} under the mock engine", spinner="dots"):
        result = planning.run(root, stack)
    view = checks.StackView(
        checks.PlanResource(r.urn, r.type, r.name, r.inputs, r.parent, tuple(r.dependencies))
        for r in result.resources
    )
    return (
        view,
        result.spec,
        result.addresses,
        result.stack,
        _relative(planning.stack_path(root, stack), root),
        root,
    )


def _relative(path: Path, root: Path) -> str:
    """A path as code scanning wants it: relative to the project, with forward slashes."""
    return Path(os.path.relpath(path.resolve(), root)).as_posix()


def _rule_dict(rule: Any) -> dict[str, str]:
    return {
        "name": rule.name,
        "severity": rule.severity,
        "enforcement": rule.enforcement,
        "description": rule.description,
        "remediation": rule.remediation,
    }


@app.command()
def check(
    stack: Annotated[
        str | None,
        typer.Option("--stack", "-s", help="Stack name or stack file path (default: dev); not with --plan."),
    ] = None,
    plan_file: Annotated[
        Path | None,
        typer.Option("--plan", help="Check a plan saved by `superkube plan --out` instead of planning."),
    ] = None,
    output: Annotated[
        CheckOutput,
        typer.Option("--output", "-o", help="table, json, sarif (code scanning) or markdown (PR comment)."),
    ] = CheckOutput.table,
    list_rules: Annotated[bool, typer.Option("--list", help="List every rule and exit.")] = False,
    project: ProjectOpt = None,
) -> None:
    """Evaluate every policy rule on the offline plan; exit 1 on any mandatory violation."""
    from superkube.plan import checks
    from superkube.plan import engine as planning

    if plan_file is not None and stack is not None:
        fail(f"--plan {plan_file} and --stack {stack}: a saved plan names its own stack; give one of them")
    stack = stack or "dev"
    try:
        rules = checks.load_rules(_project(project))
        if list_rules:
            if output is CheckOutput.json:
                sys.stdout.write(json.dumps([_rule_dict(r) for r in rules], indent=2) + "\n")
            elif output is not CheckOutput.table:
                fail(f"--list prints a table or json, not {output.value}")
            else:
                _print_rules(rules)
            return
        view, spec, addresses, name, source, _ = _stack_report_inputs(stack, plan_file, project)
        checks.check_overrides(spec.policy_overrides, rules)
        report = checks.evaluate(
            view, rules, checks.rule_config(spec, addresses), spec.policy_overrides, stack=name, source=source
        )
    except SpecError as exc:
        fail(str(exc))
    except planning.PlanError as exc:
        fail(str(exc), code=1)
    if output is CheckOutput.json:
        sys.stdout.write(checks.to_json(report) + "\n")
    elif output is CheckOutput.sarif:
        sys.stdout.write(checks.to_sarif(report, _version()) + "\n")
    elif output is CheckOutput.markdown:
        sys.stdout.write(checks.to_markdown(report))
    else:
        _print_report(report)
    if not report.passed:
        raise typer.Exit(1)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("superkube")
    except PackageNotFoundError:
        return "0+unknown"


def _print_rules(rules: list[Any]) -> None:
    table = Table(title="Policy rules", title_justify="left")
    for col in ("rule", "severity", "default", "what it checks"):
        table.add_column(col)
    for r in rules:
        table.add_row(r.name, r.severity, r.enforcement, r.description)
    out.print(table)


def _print_report(report: Any) -> None:
    from superkube.plan import checks

    table = Table(title=f"superkube check: {report.stack}", title_justify="left")
    for col in ("rule", "severity", "enforcement", "result"):
        table.add_column(col)
    for o in report.outcomes:
        if o.enforcement == "disabled":
            result = f"[dim]disabled: {o.reason}[/]"
        elif o.violations:
            colour = "red" if o.enforcement == "mandatory" else "yellow"
            result = f"[{colour}]{len(o.violations)} violation(s)[/]"
        else:
            result = "[green]ok[/]"
        if o.reason and o.enforcement == "advisory":
            result += f" [dim](advisory: {o.reason})[/]"
        table.add_row(o.rule.name, o.rule.severity, o.enforcement, result)
    out.print(table)
    for v in report.violations:
        out.print(
            f"[bold]{v.rule}[/] {escape(v.resource)}: {escape(v.message)}\n  fix: {escape(v.remediation)}",
            highlight=False,
        )
    out.print(checks.summary(report), highlight=False)


@app.command()
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
    from superkube.plan import render as rendering

    if out_dir is not None:
        if out_dir.exists() and not out_dir.is_dir():
            fail(f"--out {out_dir}: is a file; give a directory")
        if not out_dir.resolve().parent.is_dir():
            fail(f"--out {out_dir}: {out_dir.resolve().parent} does not exist; create it first")
    result = _planned(stack, project)
    by_component = rendering.objects(result)
    if not by_component:
        fail(
            f"stack {result.stack} has no in-cluster layer (superkube:in_cluster_layer is false); "
            f"set it true to render",
            code=1,
        )
    version = result.spec.kubernetes_version
    found = rendering.problems(result, version)
    if found:
        for problem in found:
            err.print(f"[bold red]invalid:[/] {escape(str(problem))}", markup=True, highlight=False)
        fail(f"{len(found)} invalid object(s) against Kubernetes {version}; nothing written", code=1)
    total = sum(len(objs) for objs in by_component.values())
    if out_dir is None:
        for component, objs in by_component.items():
            sys.stdout.write(f"# component: {component}\n---\n" + rendering.to_yaml(objs))
        return
    out_dir.mkdir(exist_ok=True)
    names = rendering.file_names(list(by_component))
    for component, objs in by_component.items():
        _write_atomically(out_dir / names[component], rendering.to_yaml(objs))
    out.print(
        f"{total} objects in {len(by_component)} files under {out_dir}, "
        f"valid against Kubernetes {version} (strict)"
    )


@app.command("policy-config")
def policy_config(
    stack: StackOpt = "dev",
    project: ProjectOpt = None,
) -> None:
    """Write the CrossGuard policy-pack config for a stack (for `pulumi preview --policy-pack-config`)."""
    from superkube.plan import checks
    from superkube.plan import engine as planning

    try:
        root = _project(project)
        rules = checks.load_rules(root)
        _, spec, addresses = planning.load(root, stack)
        checks.check_overrides(spec.policy_overrides, rules)
    except SpecError as exc:
        fail(str(exc))
    shared = checks.rule_config(spec, addresses).to_dict()
    document = {}
    for rule in rules:
        override = spec.policy_overrides.get(rule.name)
        document[rule.name] = {
            "enforcementLevel": override.enforcement if override else rule.enforcement,
            **shared,
        }
    sys.stdout.write(json.dumps(document, indent=2) + "\n")


lab_app = typer.Typer(
    help="A real node fleet on this machine: booted Debian hosts in network namespaces.", no_args_is_help=True
)
app.add_typer(lab_app, name="lab")


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


@app.command()
def converge(
    inventory: Annotated[
        Path | None, typer.Option("--inventory", "-i", help="Ansible inventory (default: the lab's).")
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
    output: Annotated[
        Output, typer.Option("--output", "-o", help="table for people, json for machines.")
    ] = Output.table,
) -> None:
    """Run the playbooks over a fleet with a live view per host; exit 1 if any host failed."""
    from rich.live import Live

    from superkube.fleet import converge as fleet
    from superkube.lab import hosts as lab

    if inventory is None:
        inventory = lab.STATE_DIR / "inventory.yml"
        if not inventory.is_file():
            fail(
                "no --inventory given and no lab is up; start one (superkube lab up) or pass --inventory FILE"
            )
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


@app.command()
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

    if out_file is not None and not out_file.name.endswith(("azure_rm.yml", "azure_rm.yaml")):
        fail(f"--out {out_file}: the azure_rm plugin only reads files named *.azure_rm.yml; rename it")
    _check_writable(out_file, "--out")
    try:
        _, spec, addresses = planning.load(_project(project), stack)
    except SpecError as exc:
        fail(str(exc))
    text = inv.render(spec, addresses)
    if out_file is None:
        sys.stdout.write(text)
    else:
        _write_atomically(out_file, text)
        out.print(f"inventory written to {out_file}")


@app.command("config-schema")
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
    root = _project(project)
    if write:
        schema.write(root)
        out.print(f"wrote {root / 'Pulumi.yaml'}")
    elif check:
        if (root / "Pulumi.yaml").read_text() != text:
            fail(
                "Pulumi.yaml is out of date with superkube.model.spec; run: superkube config-schema --write",
                code=1,
            )
        out.print("Pulumi.yaml matches the spec")
    else:
        sys.stdout.write(text)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        raise SystemExit(130) from None
    except SystemExit as exc:
        # `superkube plan | head -1`: the reader closed the pipe because it had what it wanted. The
        # CLI framework then quietly wraps stdout and exits 1; that is not a failure of ours.
        if exc.code == 1 and type(sys.stdout).__name__ == "PacifyFlushWrapper":
            raise SystemExit(0) from None
        raise


etcd_app = typer.Typer(help="The cluster's two etcd clusters (main and events).", no_args_is_help=True)
app.add_typer(etcd_app, name="etcd")


@etcd_app.command("status")
def etcd_status(
    inventory: Annotated[
        Path | None, typer.Option("--inventory", "-i", help="Ansible inventory (default: the lab's).")
    ] = None,
    output: Annotated[Output, typer.Option("--output", "-o")] = Output.table,
) -> None:
    """Members, health, leader and DB size of the main and events clusters, as each member reports."""
    from superkube.fleet import converge as fleet
    from superkube.lab import hosts as lab

    if inventory is None:
        inventory = lab.STATE_DIR / "inventory.yml"
        if not inventory.is_file():
            fail(
                "no --inventory given and no lab is up; start one (superkube lab up) or pass --inventory FILE"
            )
    elif not inventory.is_file():
        fail(f"--inventory {inventory}: no such file")
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


monitoring_app = typer.Typer(
    help="Prometheus for the cluster: sharded scrape configs and rules.", no_args_is_help=True
)
app.add_typer(monitoring_app, name="monitoring")


@monitoring_app.command("render")
def monitoring_render(
    stack: StackOpt = "dev",
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Write prometheus-<shard>.yml and rules/ into this directory (made if missing)."
        ),
    ] = None,
    project: ProjectOpt = None,
) -> None:
    """Write each Prometheus shard's configuration and the alert and recording rules, from the spec."""
    import tempfile

    from superkube.cluster import monitoring
    from superkube.plan import engine as planning

    if out_dir is not None:
        if out_dir.exists() and not out_dir.is_dir():
            fail(f"--out {out_dir}: is a file; give a directory")
        if not out_dir.resolve().parent.is_dir():
            fail(f"--out {out_dir}: {out_dir.resolve().parent} does not exist; create it first")
    try:
        _, spec, addresses = planning.load(_project(project), stack)
    except SpecError as exc:
        fail(str(exc))
    if out_dir is None:
        with tempfile.TemporaryDirectory() as tmp:
            for path in monitoring.write(spec, addresses, Path(tmp), spec.name(planning.stack_name(stack))):
                sys.stdout.write(f"# file: {path.relative_to(tmp)}\n{path.read_text()}")
        return
    out_dir.mkdir(exist_ok=True)
    written = monitoring.write(spec, addresses, out_dir, spec.name(planning.stack_name(stack)))
    out.print(
        f"{spec.prometheus_shards} Prometheus shard configs and {len(written) - spec.prometheus_shards} rule file "
        f"under {out_dir}; check them with promtool check config / test rules"
    )


health_app = typer.Typer(help="GPU node health: what a probe reading means.", no_args_is_help=True)
app.add_typer(health_app, name="health")


@health_app.command("explain")
def health_explain(
    reading_file: Annotated[Path, typer.Argument(help="A saved probe reading (JSON).")],
    dcgm: Annotated[
        Path | None, typer.Option("--dcgm", help="A saved dcgm-exporter scrape of the node, merged in.")
    ] = None,
    output: Annotated[Output, typer.Option("--output", "-o")] = Output.table,
) -> None:
    """The verdict on a saved GPU probe reading and every reason for it (exit 1 when fatal)."""
    from superkube.agents import gpu_probe

    try:
        reading = gpu_probe.load_reading(reading_file)
        if dcgm is not None:
            try:
                text = dcgm.read_text()
            except OSError as exc:
                fail(f"{dcgm}: cannot read: {exc.strerror}")
            reading = gpu_probe.merge_dcgm(reading, text, str(dcgm))
        result = gpu_probe.verdict(reading)
    except gpu_probe.ReadingError as exc:
        fail(str(exc))
    if output is Output.json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
    else:
        colour = {"healthy": "green", "warning": "yellow", "fatal": "red"}[result.level]
        out.print(f"{escape(result.node)}: [bold {colour}]{result.level}[/]", highlight=False)
        for finding in result.findings:
            out.print(f"  {escape(str(finding))}", highlight=False)
    if result.level == "fatal":
        raise typer.Exit(1)


job_app = typer.Typer(
    help="MPI jobs: a short job description as a gang-scheduled MPIJob.", no_args_is_help=True
)
app.add_typer(job_app, name="job")


@job_app.command("render")
def job_render(
    job_file: Annotated[
        Path, typer.Argument(help="A job description (YAML): name, image, command, workers, team, ...")
    ],
    stack: Annotated[
        str, typer.Option("--stack", "-s", help="The stack the job runs on (its pools and teams).")
    ] = "dev",
    project: Annotated[Path | None, typer.Option("--project", help="superkube project directory.")] = None,
    output: Annotated[Output, typer.Option("--output", "-o")] = Output.table,
) -> None:
    """Write the MPIJob for a job description, checked against the MPIJob CRD and the pod schema."""
    from superkube.cluster import jobs
    from superkube.plan import engine as planning

    try:
        job = jobs.load(job_file)
        _, spec, _ = planning.load(_project(project), stack)
        mpijob = jobs.render(job, spec)
    except (jobs.JobError, SpecError) as exc:
        fail(str(exc))
    found = jobs.problems(mpijob, spec.kubernetes_version)
    if found:
        fail(f"{job_file}: the MPIJob is not valid: {found[0]}", code=1)
    if output is Output.json:
        sys.stdout.write(json.dumps(mpijob, indent=2) + "\n")
    else:
        from superkube.plan.render import to_yaml

        sys.stdout.write(to_yaml([mpijob]))
