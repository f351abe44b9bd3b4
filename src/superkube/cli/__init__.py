"""The superkube command line: one typer app, its commands in one module per group (this file is the
table of contents: the order here is the order `superkube --help` lists them in)."""

from __future__ import annotations

import sys

import typer

from superkube.cli import check, etcd, fleet, health, job, lab, monitoring, plan
from superkube.cli.common import err

app = typer.Typer(
    name="superkube",
    help="Stand up and run GPU Kubernetes clusters of thousands of nodes on Azure, as code.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

app.command()(plan.plan)
app.command()(check.check)
app.command()(plan.render)
app.command("policy-config")(check.policy_config)
app.command()(fleet.converge)
app.command()(fleet.inventory)
app.command("config-schema")(plan.config_schema)
app.add_typer(lab.lab_app, name="lab")
app.add_typer(etcd.etcd_app, name="etcd")
app.add_typer(monitoring.monitoring_app, name="monitoring")
app.add_typer(health.health_app, name="health")
app.add_typer(job.job_app, name="job")


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
