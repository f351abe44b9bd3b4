"""The pull-request workflow is valid GitHub Actions and its check step works here as written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

WORKFLOW = Path(".github/workflows/superkube-check.yml")


def test_workflow_matches_the_github_workflows_schema(root: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.github-workflows",
            str(root / WORKFLOW),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def run_check_step(root: Path, tmp_path: Path, extra_stack: str | None = None) -> tuple[Path, str, str]:
    """Run the workflow's check step as written in a copy of the checkout; (copy, summary, outputs)."""
    workflow = yaml.safe_load((root / WORKFLOW).read_text())
    (step,) = [s for s in workflow["jobs"]["check"]["steps"] if s.get("id") == "check"]
    work = tmp_path / "repo"
    shutil.copytree(
        root, work, ignore=shutil.ignore_patterns(".venv", ".git", "out", "__pycache__", ".hypothesis")
    )
    (work / ".venv").mkdir()
    (work / ".venv" / "bin").symlink_to(Path(sys.executable).parent)
    if extra_stack:
        (work / "stacks" / "Pulumi.extra.yaml").write_text(extra_stack)
    summary, outputs = tmp_path / "summary.md", tmp_path / "outputs"
    env = {**os.environ, "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_OUTPUT": str(outputs)}
    proc = subprocess.run(
        ["bash", "-c", step["run"]], cwd=work, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return work, summary.read_text(), outputs.read_text().strip()


def test_the_check_step_plans_once_and_reports_every_stack(root: Path, tmp_path: Path) -> None:
    work, summary_text, outputs = run_check_step(root, tmp_path)
    assert outputs == "status=0"
    stacks = sorted(
        p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in (root / "stacks").glob("Pulumi.*.yaml")
    )
    assert sorted(p.stem for p in (work / "out" / "sarif").glob("*.sarif")) == stacks
    for stack in stacks:
        assert json.loads((work / "out" / "sarif" / f"{stack}.sarif").read_text())["version"] == "2.1.0"
        assert f"**superkube check** `{stack}`: PASS" in summary_text


def test_a_violating_stack_turns_the_verdict_red(root: Path, tmp_path: Path) -> None:
    dev = (root / "stacks" / "Pulumi.dev.yaml").read_text()
    _, summary_text, outputs = run_check_step(
        root, tmp_path, dev + "  superkube:safe_join_rate_per_minute: 1\n"
    )
    assert outputs == "status=1"
    assert "**superkube check** `extra`: FAIL" in summary_text
    assert "`platform-autoscaler-join-rate`" in summary_text
