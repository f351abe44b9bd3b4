"""The commands that act on a cluster in Azure name their stack: none is assumed."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from superkube.cli import app


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
