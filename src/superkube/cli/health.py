"""`superkube health`: what a GPU probe reading means."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from superkube.cli.common import (
    Command,
    Output,
    OutputOpt,
    fail,
    group,
    out,
    read_file,
)

health_app = group("GPU node health: what a probe reading means.")


@health_app.command("explain", cls=Command)
def health_explain(
    reading_file: Annotated[
        Path,
        typer.Argument(
            help="A probe reading (JSON): `python -m superkube.agents.gpu_probe > reading.json` on the node "
            "or in its health agent's pod writes one; tests/agents/readings/ holds a healthy one and one of "
            "each fault."
        ),
    ],
    dcgm: Annotated[
        Path | None, typer.Option("--dcgm", help="A saved dcgm-exporter scrape of the node, merged in.")
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """The verdict on a saved GPU probe reading and every reason for it (exit 1 when fatal)."""
    from superkube.agents import gpu_probe

    try:
        reading = gpu_probe.load_reading(reading_file)
        if dcgm is not None:
            text = read_file(
                dcgm,
                "--dcgm",
                "give a saved scrape of dcgm-exporter (curl http://<node>:9400/metrics > FILE)",
                kind="text",
            )
            reading = gpu_probe.merge_dcgm(reading, text, f"--dcgm {dcgm}")
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
