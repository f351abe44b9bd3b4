"""The superkube command line: one typer app, its commands in one module per group (this file is the
table of contents: the order here is the order `superkube --help` lists them in).

A command's module is imported when that command runs, not before: `superkube plan` loads the plan
command's module and what it needs, not the lab's, the image's or the checks' (bench/plan.py times the
whole process). `superkube --help`, a command this table does not name, and `app` (the tests', the
reference docs') load them all."""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import sys
import threading
from typing import Annotated, Any, NoReturn

import typer

from superkube.cli.common import Command, Group, err, out, package_version
from superkube.plan import collector

COMMANDS = (
    ("plan", "plan", "plan"),
    ("check", "check", "check"),
    ("render", "plan", "render"),
    ("policy-config", "check", "policy_config"),
    ("converge", "fleet", "converge"),
    ("inventory", "fleet", "inventory"),
    ("config-schema", "plan", "config_schema"),
)
"""(command, module of superkube.cli, function)"""
GROUPS = (
    ("lab", "lab", "lab_app"),
    ("etcd", "etcd", "etcd_app"),
    ("monitoring", "monitoring", "monitoring_app"),
    ("health", "health", "health_app"),
    ("job", "job", "job_app"),
    ("image", "image", "image_app"),
)
"""(group, module of superkube.cli, its typer app)"""


def _print_version(wanted: bool) -> None:
    if wanted:
        out.print(f"superkube {package_version()}", highlight=False)
        raise typer.Exit()


def _superkube(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print superkube's version and exit."
        ),
    ] = False,
) -> None:
    pass


def build(only: str | None = None) -> typer.Typer:
    """The command line with every command, or (`only`) with that one command or group alone."""
    cli = typer.Typer(
        name="superkube",
        help="Stand up and run GPU Kubernetes clusters of thousands of nodes on Azure, as code.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
        cls=Group,
    )
    cli.callback()(_superkube)
    for name, module, attr in COMMANDS:
        if only in (None, name):
            cli.command(name, cls=Command)(getattr(importlib.import_module(f"superkube.cli.{module}"), attr))
    for name, module, attr in GROUPS:
        if only in (None, name):
            cli.add_typer(getattr(importlib.import_module(f"superkube.cli.{module}"), attr), name=name)
    return cli


def _wanted(args: list[str]) -> str | None:
    """The command or group `args` name, if this table has it (the first word that is not an option:
    the app itself takes no option with a value)."""
    word = next((a for a in args if not a.startswith("-")), None)
    known = {name for name, _, _ in COMMANDS} | {name for name, _, _ in GROUPS}
    return word if word in known and "--help" not in args[: args.index(word)] else None


def __getattr__(name: str) -> Any:
    if name == "app":  # the whole command line, built once
        globals()["app"] = built = build()
        return built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> NoReturn:
    collector.process_ends_with_command()  # _leave below: nothing runs after the command
    try:
        build(_wanted(sys.argv[1:]))()
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
