"""`superkube usage`: the researcher's view of network use, per namespace or pod, from the metrics store."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from superkube.cli.common import Output, OutputOpt, ProjectOpt, err, fail, out, project_dir
from superkube.fleet.usage_options import TRAFFIC, By, Sort

if TYPE_CHECKING:
    from superkube.fleet.usage import Store

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def human(size: float) -> str:
    """Bytes in binary units, three significant figures or so: 0 B, 512 B, 1.5 KiB, 120 GiB."""
    size = max(0.0, size)
    unit = 0
    while size >= 1024 and unit < len(_UNITS) - 1:
        size /= 1024
        unit += 1
    if unit == 0:
        return f"{size:.0f} B"
    return f"{size:.1f} {_UNITS[unit]}" if size < 100 else f"{size:.0f} {_UNITS[unit]}"


def usage(
    by: Annotated[By, typer.Option("--by", help="Rank namespaces, or each pod of them.")] = By.namespace,
    window: Annotated[
        str,
        typer.Option(
            "--window",
            "-w",
            help="How far back to count, in Prometheus' duration syntax (30m, 1h, 1h30m, 7d).",
        ),
    ] = "1h",
    top: Annotated[int, typer.Option("--top", help="Show the first N (of the ranking).")] = 10,
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", help="Only this namespace (its pods with --by pod).")
    ] = None,
    sort: Annotated[
        Sort,
        typer.Option("--sort", help="Rank by the bytes of all traffic (total), one kind, or one direction."),
    ] = Sort.total,
    store: Annotated[
        str | None,
        typer.Option(
            "--store",
            help=(
                "The store's query API: Prometheus' or VictoriaMetrics' base URL, e.g. http://HOST:9090 "
                "(default: the stack's store, else a running lab's)."
            ),
        ),
    ] = None,
    stack: Annotated[
        str | None,
        typer.Option(
            "--stack",
            "-s",
            help="Stack name or file: its metrics store (unless --store), and only its cluster's series.",
        ),
    ] = None,
    project: ProjectOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Top namespaces or pods by internet and internal traffic over a window, from the metrics store.

    Bytes in and out per namespace (or pod) as the nodes' iptables accounting counted them
    (iptables_rule_bytes_total), summed with increase() over --window; the nodes' own traffic, which
    belongs to no pod, is left out. Exit 2 when the store cannot be asked or its answer is not one.
    """
    from superkube.fleet import usage as counting

    try:
        counting.window_seconds(window)
        if namespace is not None:
            counting.check_namespace(namespace)
    except counting.UsageError as exc:
        fail(str(exc))
    if top < 1:
        fail(f"--top {top}: show at least 1")
    where = _store(store, stack, project)
    try:
        with err.status(f"asking the {where.where}", spinner="dots"):
            uses = counting.usage(where, window, by, namespace, sort)
    except counting.StoreError as exc:
        fail(str(exc))
    shown = uses[:top]
    if output is Output.json:
        document = {
            "store": where.url,
            "cluster": where.cluster,
            "window": window,
            "by": by.value,
            "namespace": namespace,
            "sort": sort.value,
            "unit": "bytes",
            "count": len(uses),
            "rows": [u.as_dict(by) for u in shown],
        }
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return
    of = f"{by.value}s" + (f" in {namespace}" if namespace else "")
    if not uses:
        out.print(
            f"no traffic of any {of} in the last {window} at the {escape(where.where)}", highlight=False
        )
        return
    table = Table(
        title=(
            f"Network use in the last {window}: top {len(shown)} of {len(uses)} {of} by {sort.value} bytes"
            + (f", cluster {where.cluster}" if where.cluster else "")
        ),
        title_justify="left",
    )
    table.add_column("namespace")
    if by is By.pod:
        table.add_column("pod")
    for traffic in (*TRAFFIC, "total"):
        table.add_column(traffic.replace("-", " "), justify="right")
    for u in shown:
        names = [u.namespace, u.pod] if by is By.pod else [u.namespace]
        table.add_row(*map(escape, names), *(human(u.bytes[t]) for t in TRAFFIC), human(u.total))
    out.print(table)


def _store(url: str | None, stack: str | None, project: Path | None) -> Store:
    """The store to ask: --store, else the stack's, else the one of the fleet the default inventory
    lists (a running lab's); one line and exit 2 when none is known."""
    from superkube.cluster.kube import metrics_store_query_url
    from superkube.fleet import converge as fleet
    from superkube.fleet.usage import Store, inventory_store

    cluster = None
    if stack is not None:
        from superkube.model.spec import SpecError
        from superkube.plan import engine as planning

        try:
            _, spec, addresses = planning.load(project_dir(project), stack)
        except SpecError as exc:
            fail(str(exc))
        cluster = spec.name(planning.stack_name(stack))
        if url is None:
            url = metrics_store_query_url(spec, addresses)
            if not url:
                fail(
                    f"stack {stack}: its metrics_store_url {spec.metrics_store_url} does not say where the "
                    "store answers queries; pass --store URL (its Prometheus query API)"
                )
            return Store(url, f"stack {stack}", cluster=cluster)
    if url is not None:
        return Store(url, "--store", cluster=cluster)
    try:
        inventory = fleet.default_inventory()
    except fleet.FleetError as exc:
        if os.environ.get(fleet.INVENTORY_ENV):  # the inventory named is not there: say so
            fail(f"no --store and no --stack, and {exc}")
        fail(
            "no --store and no --stack, and no lab is running: pass --store URL (Prometheus or "
            "VictoriaMetrics), or --stack NAME for that cluster's store"
        )
    found = inventory_store(inventory)
    if found is None:
        fail(
            f"no --store and no --stack, and the inventory {inventory} lists no monitoring host: pass "
            "--store URL (Prometheus or VictoriaMetrics), or --stack NAME for that cluster's store"
        )
    return found
