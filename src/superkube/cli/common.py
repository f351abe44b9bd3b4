"""What every command of the command line shares: consoles, options, one-line failures, planning."""

from __future__ import annotations

import os
import sys
import tempfile
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

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


def check_writable(path: Path | None, option: str) -> None:
    if path is None:
        return
    parent = path.resolve().parent
    if path.is_dir():
        fail(f"{option} {path}: is a directory; give a file name")
    if not parent.is_dir():
        fail(f"{option} {path}: directory {parent} does not exist; create it first")
    if parent.exists() and not os.access(parent, os.W_OK):
        fail(f"{option} {path}: directory is not writable; choose another path")


def planned(stack: str, project: Path | None) -> Any:
    """Plan a stack under the mock engine with a spinner; a bad stack or program is one line and exit."""
    from superkube.plan import engine as planning

    try:
        root = project_dir(project)
        with err.status(f"planning stack {stack} under the mock engine", spinner="dots"):
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
