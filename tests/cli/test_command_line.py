"""The command line as people expect it: --version, one --output offered the same way everywhere, a
mistyped option named for what was meant, flags shown as flags, help that wraps cleanly at 80
columns, the Azure commands' --stack required, and counts written in words that agree."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml
from typer.testing import CliRunner

from superkube.cli import app
from tests.conftest import ROOT, dev_config

JOB = str(ROOT / "examples" / "jobs" / "allreduce.yaml")


def run(args: list[str], **kwargs: Any) -> Any:
    return CliRunner().invoke(app, args, **kwargs)


def commands(group: Any = None, words: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """Every command and group of the app, by its words (`lab up`), the app itself as ""."""
    group = group or typer.main.get_command(app)
    yield " ".join(words), group
    for name, command in getattr(group, "commands", {}).items():
        yield from (
            commands(command, (*words, name))
            if getattr(command, "commands", None)
            else [(" ".join((*words, name)), command)]
        )


def test_version_is_the_packages() -> None:
    result = run(["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"superkube {version('superkube')}"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["plan", "-out", "x.json"], "no such option -out; did you mean --out?"),
        (["check", "-plan", "x.json"], "no such option -plan; did you mean --plan?"),
        (["job", "render", JOB, "-o", "table"], "--output table: superkube job render prints yaml or json, not table"),
        (["plan", "--output=yaml"], "--output yaml: superkube plan prints table or json, not yaml"),
        (["check", "-oxml"], "--output xml: superkube check prints table, json, sarif or markdown, not xml"),
        (["render", "-o", "json"], "no such option -o: superkube render writes one format only (see its --help)"),
        (["inventory", "--output", "json"], "no such option --output: superkube inventory writes one format only"),
    ],
    ids=["-out", "-plan", "job render -o table", "plan --output=yaml", "check -oxml", "render -o", "inventory --output"],
)  # fmt: skip
def test_a_mistyped_option_is_named_for_what_was_meant(args: list[str], says: str) -> None:
    result = run(args)
    assert result.exit_code == 2
    assert says in " ".join(result.stderr.replace("│", " ").split()), result.stderr


def test_job_render_prints_yaml_or_json() -> None:
    as_yaml, as_json = run(["job", "render", JOB]), run(["job", "render", JOB, "-o", "json"])
    assert as_yaml.exit_code == as_json.exit_code == 0, as_yaml.stderr + as_json.stderr
    assert yaml.safe_load(as_yaml.stdout) == json.loads(as_json.stdout)
    assert json.loads(as_json.stdout)["kind"] == "MPIJob"


def test_output_is_offered_the_same_way_on_every_command() -> None:
    offered = {}
    for words, command in commands():
        for param in command.params:
            if "--output" in getattr(param, "opts", []):
                assert param.opts == ["--output", "-o"], words
                choices = tuple(str(c.value) for c in param.type_descriptor.choices)
                offered[words] = (choices, param.help)
    assert {w for w, (c, _) in offered.items() if c == ("yaml", "json")} == {"job render"}
    assert {
        w for w, (c, _) in offered.items() if c[:2] != ("table", "json") and c != ("yaml", "json")
    } == set()
    helps = {h for w, (c, h) in offered.items() if c == ("table", "json")}
    assert helps == {"table for people, json for machines."}, helps
    assert len(offered) >= 14


def test_flags_are_shown_as_flags_and_help_wraps_cleanly_at_80_columns() -> None:
    for words, command in commands():
        result = run([*words.split(), "--help"], env={"COLUMNS": "80"})
        assert result.exit_code == 0, words
        assert "<bool>" not in result.stdout, words
        assert max(len(line) for line in result.stdout.splitlines()) <= 80, words
        for paragraph in (command.help or "").split("\n\n"):
            assert "\n" not in paragraph, f"{words}: a line break inside a paragraph wraps raggedly"
        summary = (command.help or "").split("\n\n")[0]
        assert summary and len(summary) <= 100, f"{words}: the first line is the summary: {summary!r}"


def test_the_image_group_names_both_its_commands() -> None:
    group = dict(commands())["image"]
    assert set(group.commands) == {"capture", "roll"}
    assert "capture" in group.help and "roll" in group.help


@pytest.mark.parametrize(
    "args",
    [
        ["image", "capture", "gpu", "--version", "1.0.0", "-i", "dev.azure_rm.yml"],
        ["image", "roll", "gpu", "--kubeconfig", "admin.kubeconfig"],
    ],
    ids=["capture", "roll"],
)
def test_the_azure_commands_require_their_stack(args: list[str]) -> None:
    """They act on a cluster in Azure: no stack is assumed (the default dev would be someone's)."""
    result = run(args)
    assert result.exit_code == 2 and "Missing option '--stack'" in result.stderr, result.stderr
    help_text = " ".join(run([*args[:2], "--help"], env={"COLUMNS": "300"}).stdout.replace("│", " ").split())
    assert "acts on that cluster in Azure" in help_text and "[required]" in help_text


def test_a_count_of_one_is_singular(write_stack: Callable[..., Path]) -> None:
    from superkube.model.words import plural

    assert [plural(1, "scale set"), plural(2, "scale set"), plural(1_500, "batch", "batches")] == [
        "1 scale set",
        "2 scale sets",
        "1,500 batches",
    ]
    config = dev_config()
    config["superkube:node_pools"] = yaml.safe_dump(yaml.safe_load(config["superkube:node_pools"])[:1])
    result = run(["plan", "--stack", str(write_stack(config))])
    assert result.exit_code == 0, result.stderr
    capacity = " ".join(result.stdout.split())
    assert "1 scale set," in capacity and not re.search(
        r"\b1 [a-zA-Z -]+s\b,", capacity.split("Capacity")[-1]
    )
