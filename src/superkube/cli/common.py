"""What every command of the command line shares: consoles, options, one-line failures, planning."""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import stat
import sys
import tempfile
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from superkube.model import files
from superkube.model.spec import SpecError


class _Output(Console):
    """stdout: a reader that closes the pipe early (`superkube plan | head`) had what it wanted."""

    def on_broken_pipe(self) -> None:
        try:
            super().on_broken_pipe()  # goes quiet and points stdout at /dev/null, then exits 1
        except SystemExit:
            raise SystemExit(0) from None


out = _Output(soft_wrap=True, width=None if sys.stdout.isatty() else 150)
err = Console(stderr=True, soft_wrap=True)

USER_ERROR = 2


class Output(StrEnum):
    table = "table"
    json = "json"


class Document(StrEnum):
    yaml = "yaml"
    json = "json"


OutputOpt = Annotated[Output, typer.Option("--output", "-o", help="table for people, json for machines.")]
"""`--output` of every command that prints a result: a table (the default), or JSON."""
DocumentOpt = Annotated[
    Document,
    typer.Option("--output", "-o", help="yaml (what kubectl applies), or json."),
]
"""`--output` of a command that prints a Kubernetes object: YAML (the default), or JSON."""

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


def project_dir(project: Path | None) -> Path:
    from superkube.plan.engine import find_project

    if project is None:
        return find_project()
    if not (project / "Pulumi.yaml").is_file():
        what = "is not a directory" if project.exists() and not project.is_dir() else "has no Pulumi.yaml"
        fail(f"--project {project}: {what}; give the superkube project's directory (the checkout)")
    return project.resolve()


def read_file(
    path: Path,
    option: str,
    fix: str,
    *,
    kind: str = "yaml",
    want: type | None = dict,
    what: str = "",
    missing: str = "",
) -> Any:
    """A file a command was handed, parsed (kind yaml, json, or text for the text alone): anything
    wrong with it (no such file, a directory, not readable, not UTF-8 text, empty, not YAML or JSON,
    not a `want`) is one line naming the option and the file, ending in `fix`, and exit 2."""
    try:
        if kind == "text":
            text = files.read_text(path, option, missing or fix)
            if not text.strip():
                raise files.FileError(files.where(path, option), "is empty", fix)
            return text
        return files.load(path, option, fix=fix, kind=kind, want=want, what=what, missing=missing)
    except files.FileError as exc:
        fail(str(exc))


def read_inventory(path: Path, fix: str, option: str = "--inventory") -> None:
    """An Ansible inventory a command hands to Ansible: text, and where it is YAML (named *.yml or
    *.yaml, as the azure_rm plugin's config and the lab's inventory are), a YAML mapping; else one
    line and exit 2, before Ansible is started."""
    if path.suffix in (".yml", ".yaml", ".json"):
        read_file(path, option, fix, what="an inventory (a YAML mapping of groups, or a plugin's config)")
    else:
        read_file(path, option, fix, kind="text")


def fleet_inventory(inventory: Path | None) -> Path:
    """The inventory a fleet command acts on: the one given, else $SUPERKUBE_INVENTORY, else the
    running lab's; checked as read_inventory checks it (one line and exit 2)."""
    from superkube.fleet import converge as fleet

    if inventory is None:
        try:
            inventory = fleet.default_inventory()
        except fleet.FleetError as exc:
            fail(str(exc))
    read_inventory(inventory, "give an inventory: superkube inventory writes one, superkube lab up another")
    return inventory


def package_version() -> str:
    """superkube's version, from the installed package's metadata."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("superkube")
    except PackageNotFoundError:
        return "0+unknown"


# --- the command line's own conventions, on every command -----------------------------------------


def _reflowed(text: str | None) -> str | None:
    """Help text with each paragraph on one line, for the help to wrap at the terminal's width (a
    docstring's own line breaks would break lines a second time, raggedly)."""
    if not text:
        return text
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(text).split("\n\n"))


def _bare_flags(params: list[Any]) -> list[Any]:
    """A flag takes no value: its help shows none (typer shows `<bool>`)."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


_SINGLE_DASH_LONG = re.compile(r"-[A-Za-z][A-Za-z0-9-]+")


def _refuse_misspelt_options(command: Any, ctx: Any, args: list[str]) -> None:
    """`-out x` would be read as `-o ut`, and `-o` where a command has no --output is a bare "no such
    option": say what was meant instead."""
    opts = {o for p in command.params for o in getattr(p, "opts", [])}
    for i, arg in enumerate(args):
        if arg == "--":
            return
        if _SINGLE_DASH_LONG.fullmatch(arg) and f"-{arg}" in opts:
            ctx.fail(f"no such option {arg}; did you mean -{arg}?")
        _refuse_an_output_not_offered(command, ctx, arg, args[i + 1] if i + 1 < len(args) else "")
        if "--output" not in opts and "-o" not in opts:
            named = arg.partition("=")[0] if arg.partition("=")[0] == "--output" else ""
            named = named or ("-o" if re.match(r"-o(?!-)", arg) else "")
            if named:
                ctx.fail(
                    f"no such option {named}: {ctx.command_path} writes one format only (see its --help)"
                )


def _refuse_an_output_not_offered(command: Any, ctx: Any, arg: str, following: str) -> None:
    """`-o table` where a command prints yaml or json: say which outputs it has."""
    param = next((p for p in command.params if "--output" in getattr(p, "opts", [])), None)
    choices = getattr(getattr(param, "type_descriptor", None), "choices", None)
    if not choices:
        return
    if arg in ("-o", "--output"):
        value = following
    elif arg.startswith("--output="):
        value = arg.partition("=")[2]
    elif arg.startswith("-o") and not arg.startswith("--"):
        value = arg[2:]
    else:
        return
    offered = [str(getattr(c, "value", c)) for c in choices]
    if value and value not in offered:
        ctx.fail(
            f"--output {value}: {ctx.command_path} prints {', '.join(offered[:-1])} or {offered[-1]}, "
            f"not {value}"
        )


class Command(TyperCommand):
    """Every superkube command: help that wraps cleanly, flags shown as flags, and a long option
    written with one dash named for what it is."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = _reflowed(self.help)

    def get_params(self, ctx: Any) -> list[Any]:
        return _bare_flags(super().get_params(ctx))

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        _refuse_misspelt_options(self, ctx, args)
        return super().parse_args(ctx, args)


class PassThrough(Command):
    """A command whose arguments are another program's (`lab kubectl`): none is refused or read as
    ours after the first, `--help` first shows ours."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return TyperCommand.parse_args(self, ctx, args)


class Group(TyperGroup):
    """Every group of commands, alike."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = _reflowed(self.help)

    def get_params(self, ctx: Any) -> list[Any]:
        return _bare_flags(super().get_params(ctx))


def group(help: str) -> typer.Typer:
    """A group of commands (`superkube lab`, `image`, ...): its commands are added with
    `@<group>.command(name, cls=Command)`."""
    return typer.Typer(help=help, no_args_is_help=True, cls=Group)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomically(path: Path, text: str) -> None:
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


STDOUT = Path("-")
"""`--out -`: write to standard output, on purpose."""

_NOT_REGULAR = (
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def output_path(path: Path | None, option: str, what: str, ours: Callable[[bytes], bool]) -> Path | None:
    """Where a command writes `what` for `option`, checked before any work is done: None for no
    such option, STDOUT for `-`, else the file itself, or the file a symbolic link names (written
    through the link, which stays). Refused in one line, with exit 2: a directory; a pipe, device or
    socket (`-` is how to write to standard output); an existing file `ours` does not recognise from
    its first bytes as one this command writes (a stack file would be lost); a directory that is
    missing or where no file can be made."""
    if path is None or path == STDOUT:
        return path
    at = f"{option} {path}"
    try:
        info = path.stat()
    except FileNotFoundError:
        info = None
    except OSError as exc:
        fail(f"{at}: cannot be looked at ({exc.strerror or exc}); choose another path")
    if info is not None and stat.S_ISDIR(info.st_mode):
        fail(f"{at}: is a directory; give a file name")
    for test, kind in _NOT_REGULAR:
        if info is not None and test(info.st_mode):
            fail(f"{at}: is {kind}, not a file; give a file name, or {option} - for standard output")
    target = path.resolve() if path.is_symlink() else path
    if info is not None and info.st_size:
        try:
            with target.open("rb") as f:
                head = f.read(4096)
        except OSError as exc:
            fail(f"{at}: cannot be read to see what it is ({exc.strerror or exc}); choose another path")
        if not ours(head):
            fail(
                f"{at}: exists and is not {what}, which writing would replace; "
                "give a new file name, or remove the file first"
            )
    parent = target.resolve().parent
    if not parent.is_dir():
        fail(f"{at}: directory {parent} does not exist; create it first")
    try:
        fd, probe = tempfile.mkstemp(dir=parent, prefix=f".{target.name}.")
    except OSError as exc:
        fail(f"{at}: no file can be written in {parent} ({exc.strerror or exc}); choose another path")
    os.close(fd)
    os.unlink(probe)
    return target


def write_output(path: Path, text: str) -> None:
    """Write what output_path allowed: to standard output for STDOUT, else atomically."""
    if path == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_atomically(path, text)


def plan_or_exit(stack: str, project: Path | None) -> Any:
    """Plan a stack under the mock engine with a spinner; a bad stack or program is one line and exit."""
    from superkube.plan import engine as planning

    try:
        root = project_dir(project)
        # a spinner only where someone watches: elsewhere it draws nothing, from a thread of its own
        spinner = (
            err.status(f"planning stack {stack} under the mock engine", spinner="dots")
            if err.is_terminal
            else contextlib.nullcontext()
        )
        with spinner:
            return planning.run(root, stack)
    except SpecError as exc:
        fail(str(exc))
    except planning.PlanError as exc:
        fail(str(exc), code=1)


def print_roll(report: Any, output: Output) -> NoReturn:
    """A roll's report (superkube.cluster.roll.RollReport): its batches on stdout, its summary on
    stderr; exit 1 when it stopped."""
    import json

    if output is Output.json:
        sys.stdout.write(json.dumps(report.as_dict(), indent=2) + "\n")
    else:
        for i, b in enumerate(report.batches, 1):
            out.print(
                f"batch {i}: {', '.join(b.nodes)}: {b.state}"
                + (f" in {b.seconds:.0f} s" if b.seconds else ""),
                highlight=False,
            )
    err.print(escape(report.summary()), highlight=False)
    raise typer.Exit(0 if report.ok else 1)
