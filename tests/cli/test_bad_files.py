"""Every command that reads a file, handed a bad one: one line on stderr naming it, exit 2, no
traceback. Exit 1 stays what it means (a policy violated, a run that failed), so CI can tell a
crash or a bad input from a failed check.

The corpus: a directory, a file that cannot be read (a socket; one without read permission), bytes
that are not UTF-8 text (binary, UTF-16, Latin-1), an empty file, truncated YAML or JSON, a document
of the wrong shape (a list, a scalar) and one missing a part the command needs. Each command reads
its kind of file (a stack, a saved plan, a job, a probe reading, a dcgm scrape, an inventory, a
kubeconfig, the project's Pulumi.yaml); every command fails before it plans, contacts Azure or
starts Ansible, so the corpus runs in process, in seconds.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from superkube.cli import app
from tests.conftest import ROOT

READING = ROOT / "tests" / "agents" / "readings" / "healthy.json"
JOB = ROOT / "examples" / "jobs" / "allreduce.yaml"
DEV = ROOT / "stacks" / "Pulumi.dev.yaml"
SUBSCRIPTION = "00000000-0000-0000-0000-000000000000"

# what each kind of file holds when it is truncated, of the wrong shape, or missing a part
YAML_WRONG = {
    "truncated": "config:\n  superkube:region: [eastus\n",
    "list": "- a\n- b\n",
    "scalar": "just words\n",
}
JSON_WRONG = {"truncated": '{"format": "superkube-plan/1", "stack": ', "list": "[1, 2]\n", "scalar": "42\n"}
MISSING = {
    "stack": "secretsprovider: passphrase\n",  # no config:
    "plan": '{"format": "superkube-plan/1", "stack": "dev", "config": {}}\n',  # no resources
    "job": "name: train\nworkers: 2\n",  # no image, no command
    "reading": '{"node": "gpu-0"}\n',  # no gpus
    "kubeconfig": "apiVersion: v1\nkind: Config\n",  # no current-context, no clusters
}


@dataclass(frozen=True)
class Reader:
    """A command and the kind of file it reads (`args` with FILE where the bad file goes)."""

    args: tuple[str, ...]
    kind: str  # stack, plan, job, reading, dcgm, inventory, kubeconfig, project
    name: str = "bad.yaml"
    env: tuple[tuple[str, str], ...] = ()


READERS: dict[str, Reader] = {
    "plan --stack": Reader(("plan", "--stack", "FILE"), "stack"),
    "check --stack": Reader(("check", "--stack", "FILE"), "stack"),
    "render --stack": Reader(("render", "--stack", "FILE"), "stack"),
    "policy-config --stack": Reader(("policy-config", "--stack", "FILE"), "stack"),
    "inventory --stack": Reader(("inventory", "--stack", "FILE"), "stack"),
    "monitoring render --stack": Reader(("monitoring", "render", "--stack", "FILE"), "stack"),
    "job render --stack": Reader(("job", "render", str(JOB), "--stack", "FILE"), "stack"),
    "config-schema --check --project": Reader(
        ("config-schema", "--check", "--project", "DIR"), "project-text", "Pulumi.yaml"
    ),
    "check --plan": Reader(("check", "--plan", "FILE"), "plan", "plan.json"),
    "job render": Reader(("job", "render", "FILE"), "job"),
    "health explain": Reader(("health", "explain", "FILE"), "reading", "reading.json"),
    "health explain --dcgm": Reader(
        ("health", "explain", str(READING), "--dcgm", "FILE"), "dcgm", "scrape.prom"
    ),
    "converge --inventory": Reader(("converge", "--inventory", "FILE"), "inventory", "hosts.yml"),
    "etcd status --inventory": Reader(("etcd", "status", "--inventory", "FILE"), "inventory", "hosts.yml"),
    "image capture --inventory": Reader(
        (
            "image",
            "capture",
            "gpu",
            "--version",
            "1.0.0",
            "-s",
            "dev",
            "--subscription",
            SUBSCRIPTION,
            "-i",
            "FILE",
        ),
        "inventory",
        "dev.azure_rm.yml",
    ),
    "image roll --kubeconfig": Reader(
        ("image", "roll", "gpu", "-s", "dev", "--subscription", SUBSCRIPTION, "--kubeconfig", "FILE"),
        "kubeconfig",
        "admin.kubeconfig",
        (("SUPERKUBE_ARM_URL", "http://127.0.0.1:9/"),),  # nothing may be asked: the file fails first
    ),
}

# --project DIR, where DIR/Pulumi.yaml is bad: every command that plans reads it, after its other
# files (good ones here: the checkout's dev stack, a job, an inventory, a kubeconfig)
for _reader in (
    ("plan",),
    ("check",),
    ("render",),
    ("policy-config",),
    ("inventory",),
    ("monitoring", "render"),
    ("usage",),  # its --stack names the metrics store from the plan's addresses
    ("job", "render", str(JOB)),
    ("image", "capture", "gpu", "--version", "1.0.0", "--subscription", SUBSCRIPTION, "-i", "INVENTORY"),
    ("image", "roll", "gpu", "--subscription", SUBSCRIPTION, "--kubeconfig", "KUBECONFIG"),
):
    _words = " ".join(w for w in _reader[:2] if w != "gpu")
    READERS[f"{_words} --project"] = Reader(
        (*_reader, "-s", str(DEV), "--project", "DIR"), "project", "Pulumi.yaml"
    )
GOOD = {
    "INVENTORY": ("dev.azure_rm.yml", "plugin: azure.azcollection.azure_rm\n"),
    "KUBECONFIG": ("admin.kubeconfig", "{}\n"),
}

EVERY = ("directory", "socket", "no-permission", "binary", "utf-16", "latin-1", "empty")
KINDS: dict[str, tuple[str, ...]] = {
    "stack": (*EVERY, "truncated", "list", "scalar", "missing"),
    "project": (*EVERY, "truncated", "list", "scalar"),
    # compared as text: truncated or of another shape, it is out of date (exit 1), not unreadable
    "project-text": ("directory", "socket", "no-permission", "binary", "utf-16", "latin-1"),
    "plan": (*EVERY, "truncated", "list", "scalar", "missing"),
    "job": (*EVERY, "truncated", "list", "scalar", "missing"),
    "reading": (*EVERY, "truncated", "list", "scalar", "missing"),
    "dcgm": (*EVERY, "truncated"),
    "inventory": (*EVERY, "truncated", "list", "scalar"),
    "kubeconfig": (*EVERY, "truncated", "list", "scalar", "missing"),
}
JSON_KINDS = ("plan", "reading")


def content(kind: str, bad: str) -> bytes:
    if bad == "binary":
        return b"\x7fELF\x02\x01\x01\x00\x00\x00" + bytes(range(256))
    if bad == "utf-16":
        return "config:\n  superkube:region: eastus\n".encode("utf-16")
    if bad == "latin-1":
        return "# caf\xe9 and cr\xe8me\nconfig:\n  superkube:region: eastus\n".encode("latin-1")
    if bad == "empty":
        return b""
    if kind == "dcgm":  # truncated: a sample cut in its labels
        return b'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-'
    if bad == "missing":
        return MISSING[kind].encode()
    return (JSON_WRONG if kind in JSON_KINDS else YAML_WRONG)[bad].encode()


@contextlib.contextmanager
def bad_file(path: Path, kind: str, bad: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if bad == "directory":
        path.mkdir()
    elif bad == "socket":  # a file no one can read, root included
        here = Path.cwd()
        os.chdir(path.parent)  # a socket's path is short, whatever the test's folder
        try:
            server = socket.socket(socket.AF_UNIX)
            server.bind(path.name)
        finally:
            os.chdir(here)
    else:
        path.write_bytes(content(kind, "utf-16" if bad == "no-permission" else bad))
        if bad == "no-permission":
            path.chmod(0)
            if os.geteuid() == 0:  # root reads it anyway: make the read fail as it would for anyone else
                real = pathlib.Path.read_bytes

                def read_bytes(self: Path) -> bytes:
                    if self.resolve() == path.resolve():
                        raise PermissionError(13, "Permission denied", str(self))
                    return real(self)

                monkeypatch.setattr(pathlib.Path, "read_bytes", read_bytes)
    try:
        yield
    finally:
        if bad == "socket":
            server.close()


CASES = [(reader, bad) for reader, r in READERS.items() for bad in KINDS[r.kind]]


@pytest.mark.parametrize(("reader", "bad"), CASES, ids=[f"{r}-{b}" for r, b in CASES])
def test_a_bad_file_is_one_line_and_exit_2(
    reader: str, bad: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = READERS[reader]
    if r.kind.startswith("project"):
        project = tmp_path / "project"
        project.mkdir()
        path = project / "Pulumi.yaml"
        args = [str(project) if a == "DIR" else a for a in r.args]
        for placeholder, (name, text) in GOOD.items():
            if placeholder in args:
                (tmp_path / name).write_text(text)
                args[args.index(placeholder)] = str(tmp_path / name)
    else:
        path = tmp_path / r.name
        args = [str(path) if a == "FILE" else a for a in r.args]
    monkeypatch.chdir(tmp_path)
    with bad_file(path, r.kind, bad, monkeypatch):
        result = CliRunner().invoke(app, args, env=dict(r.env))
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert not isinstance(result.exception, Exception), result.exception
    assert "Traceback" not in result.output
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ") and path.name in lines[0], lines[0]
    assert "; " in lines[0], f"the line says how to fix it: {lines[0]}"
    assert result.stdout == ""


def test_the_corpus_covers_every_command_that_takes_a_file() -> None:
    """Every argument or option of a command that takes a path to read is in the corpus."""
    import typer.main

    written = {"--out", "--diagram"}  # the files a command writes: check_writable checks those
    taken = []

    def walk(group: Any, words: list[str]) -> None:
        for name, command in group.commands.items():
            if getattr(command, "commands", None):
                walk(command, [*words, name])
                continue
            for param in command.params:
                if getattr(param.type_descriptor, "is_path", False) and not set(param.opts) & written:
                    taken.append(([*words, name], tuple(o for o in param.opts if o.startswith("-"))))

    walk(typer.main.get_command(app), [])
    assert len(taken) >= 9
    missing = [" ".join([*words, *options]) for words, options in taken if not _covered(words, options)]
    assert not missing, missing


def _covered(words: list[str], options: tuple[str, ...]) -> bool:
    """Whether a reader hands a bad file to this command's argument (no options) or option."""
    for r in READERS.values():
        if list(r.args[: len(words)]) != words:
            continue
        rest = list(r.args[len(words) :])
        if any(o in rest and rest[rest.index(o) + 1] in ("FILE", "DIR") for o in options):
            return True
        if not options and rest[:1] == ["FILE"]:
            return True
    return False


def test_the_corpus_is_every_reader_with_every_kind_of_bad_file() -> None:
    assert len(CASES) == sum(len(KINDS[r.kind]) for r in READERS.values()) > 150
