"""The command line: the commands that act on a cluster in Azure name their stack (none is assumed),
and counts are written in words that agree (1 scale set)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from superkube.cli import app
from tests.conftest import dev_config


def run(args: list[str], **kwargs: Any) -> Any:
    return CliRunner().invoke(app, args, **kwargs)


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
