"""The superkube command line: one typer app, its commands in one module per group (this file is the
table of contents: the order here is the order `superkube --help` lists them in)."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import Annotated, NoReturn

from superkube.plan import collector

# The command line's imports leave objects that live as long as the process: the collector would
# scan them again and again as they pile up, and at every full collection after.
with collector.set_aside():
    import typer

    from superkube.cli import check, doctor, etcd, fleet, health, image, job, lab, monitoring, plan, usage
    from superkube.cli.common import Command, Group, err, out, package_version

app = typer.Typer(
    name="superkube",
    help="Stand up and run GPU Kubernetes clusters of thousands of nodes on Azure, as code.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    cls=Group,
)


def _print_version(wanted: bool) -> None:
    if wanted:
        out.print(f"superkube {package_version()}", highlight=False)
        raise typer.Exit()


@app.callback()
def _superkube(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print superkube's version and exit."
        ),
    ] = False,
) -> None:
    pass


app.command(cls=Command)(plan.plan)
app.command(cls=Command)(check.check)
app.command(cls=Command)(plan.render)
app.command("policy-config", cls=Command)(check.policy_config)
app.command(cls=Command)(fleet.converge)
app.command(cls=Command)(fleet.inventory)
app.command("config-schema", cls=Command)(plan.config_schema)
app.add_typer(lab.lab_app, name="lab")
app.add_typer(etcd.etcd_app, name="etcd")
app.add_typer(monitoring.monitoring_app, name="monitoring")
app.command(cls=Command)(usage.usage)
app.add_typer(health.health_app, name="health")
app.add_typer(job.job_app, name="job")
app.add_typer(image.image_app, name="image")
app.command(cls=Command)(doctor.doctor)


def _named(info: typer.models.CommandInfo) -> str:
    """A command's name on the command line (plan, policy-config, ...)."""
    assert info.callback is not None
    return info.name or typer.main.get_command_name(info.callback.__name__)


def main() -> NoReturn:
    collector.process_ends_with_command()  # _leave below: nothing runs after the command
    wanted = [info for info in app.registered_commands if sys.argv[1:2] == [_named(info)]]
    if wanted:
        # A command outside the groups (plan, check, ...): no other command can be asked for, and
        # the framework builds every command it has (each one's options read from its signature)
        # before it runs one, most of its start.
        app.registered_commands[:] = wanted
        app.registered_groups.clear()
    try:
        app()
        code: object = 0
    except KeyboardInterrupt:
        err.print("interrupted")
        code = 130
    except SystemExit as exc:
        code = exc.code
        # `superkube plan | head -1`: the reader closed the pipe because it had what it wanted. The
        # CLI framework then quietly wraps stdout and exits 1; that is not a failure of ours.
        if code == 1 and type(sys.stdout).__name__ == "PacifyFlushWrapper":
            code = 0
    _leave(code)


def _leave(code: object) -> NoReturn:
    """Exit without tearing the interpreter down object by object.

    A plan leaves the cloud provider's typed classes and every recorded resource in memory: freeing
    them one at a time at exit took 0.4 s of each planning command (bench/plan.py), work the operating
    system does at once when the process ends. What exit must do still happens: the atexit handlers
    run (temporary directories, logging) and stdout and stderr are flushed. While another thread is
    still running, exit the usual way, which waits for it."""
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    if threading.active_count() > 1:
        raise SystemExit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: the reader wants nothing more
            stream.flush()
    os._exit(code)
