"""`superkube job`: jobs for the gang scheduler."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from superkube.cli.common import (
    Command,
    Document,
    DocumentOpt,
    ProjectOpt,
    fail,
    group,
    project_dir,
)
from superkube.model.spec import SpecError

job_app = group("MPI jobs: a short job description as a gang-scheduled MPIJob.")


@job_app.command("render", cls=Command)
def job_render(
    job_file: Annotated[
        Path, typer.Argument(help="A job description (YAML): name, image, command, workers, team, ...")
    ],
    stack: Annotated[
        str, typer.Option("--stack", "-s", help="The stack the job runs on (its pools and teams).")
    ] = "dev",
    project: ProjectOpt = None,
    output: DocumentOpt = Document.yaml,
) -> None:
    """Write the MPIJob for a job description, checked against the MPIJob CRD and the pod schema."""
    from superkube.cluster import jobs
    from superkube.plan import engine as planning

    try:
        job = jobs.load(job_file)
        _, spec, addresses = planning.load(project_dir(project), stack)
        mpijob = jobs.render(job, spec, addresses.cluster)
    except (jobs.JobError, SpecError) as exc:
        fail(str(exc))
    found = jobs.problems(mpijob, spec.kubernetes_version)
    if found:
        fail(f"{job_file}: the MPIJob is not valid: {found[0]}", code=1)
    if output is Document.json:
        sys.stdout.write(json.dumps(mpijob, indent=2) + "\n")
    else:
        from superkube.cluster.render import to_yaml

        sys.stdout.write(to_yaml([mpijob]))
