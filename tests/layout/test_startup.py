"""Each command imports what it uses: the heavy packages load only in the commands that need them.

`superkube plan` runs the Pulumi program, so it loads Pulumi and the providers' SDKs; it must not
load Ansible, the Kubernetes client or the schema checkers. `--help` loads none of them at all.
Read from `python -X importtime`, which lists every module a process imports.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

NEVER_TO_PLAN = {
    "ansible",
    "ansible_runner",
    "kubernetes",  # the client: agents and the lab use it
    "kubernetes_validate",
    "jsonschema",
    "starlette",
    "uvicorn",
    "pynvml",
}
NEVER_TO_HELP = NEVER_TO_PLAN | {"pulumi", "pulumi_azure_native", "pulumi_kubernetes", "pulumi_policy"}


def imported(args: list[str]) -> set[str]:
    """The top-level packages a `superkube ARGS` process imports."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "superkube.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {
        line.rpartition("|")[2].strip().split(".")[0]
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


def test_plan_loads_no_ansible_kubernetes_client_or_schema_checker() -> None:
    found = imported(["plan", "--stack", "flagship", "--output", "json"])
    assert "pulumi_azure_native" in found  # the reader sees the imports the plan does need
    assert found & NEVER_TO_PLAN == set()


@pytest.mark.parametrize("args", [["--help"], ["plan", "--help"], ["lab", "--help"], ["converge", "--help"]])
def test_help_loads_no_sdk_at_all(args: list[str]) -> None:
    found = imported(args)
    assert "typer" in found
    assert found & NEVER_TO_HELP == set()
