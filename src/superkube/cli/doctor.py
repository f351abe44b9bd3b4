"""`superkube doctor`: what this machine lacks for each way of using superkube, one line each."""

from __future__ import annotations

from typing import Annotated

import typer

from superkube.cli.common import fail
from superkube.cli.prerequisites import PATHS, main


def doctor(
    paths: Annotated[
        list[str] | None,
        typer.Argument(help="offline, lab or azure (default: all three), each needing the one before it."),
    ] = None,
) -> None:
    """Say what this machine lacks for the offline plan, the lab and Azure, and how to get it.

    One line for each thing needed, found or missing; exit 1 when something is missing. `make doctor`
    runs the same checks before superkube is installed."""
    unknown = [p for p in paths or [] if p not in PATHS]
    if unknown:
        fail(f"{unknown[0]!r} is not a path; give offline, lab or azure (or none for all)")
    raise typer.Exit(main(list(paths or [])))
