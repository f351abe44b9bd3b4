"""`superkube monitoring`: Prometheus for a cluster."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from superkube.cli.common import (
    Command,
    ProjectOpt,
    StackOpt,
    fail,
    group,
    out,
    project_dir,
)
from superkube.model.spec import SpecError
from superkube.model.words import plural

monitoring_app = group("Prometheus for the cluster: sharded scrape configs and rules.")


@monitoring_app.command("render", cls=Command)
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

    from superkube.cluster import monitoring
    from superkube.plan import engine as planning

    if out_dir is not None:
        if out_dir.exists() and not out_dir.is_dir():
            fail(f"--out {out_dir}: is a file; give a directory")
        if not out_dir.resolve().parent.is_dir():
            fail(f"--out {out_dir}: {out_dir.resolve().parent} does not exist; create it first")
    try:
        _, spec, addresses = planning.load(project_dir(project), stack)
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
        f"{plural(spec.prometheus_shards, 'Prometheus shard config')} and "
        f"{plural(len(written) - spec.prometheus_shards, 'rule file')} under {out_dir}; check them with "
        "promtool check config / test rules"
    )
