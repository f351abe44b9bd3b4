"""What a newcomer's second pass found getting through: each input refused in one line with exit 2,
each output path either written where it was meant or refused before any work, the team view."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from superkube.cli import app
from tests.conftest import ROOT, dev_config

SUPERKUBE = Path(sys.executable).with_name("superkube")
ALLREDUCE = ROOT / "examples/jobs/allreduce.yaml"


def one_line_exit_2(result: Any) -> str:
    """The one line a refused command printed (stdout empty, no traceback)."""
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1, lines
    assert "Traceback" not in result.output and "; " in lines[0], lines[0]
    assert result.stdout == ""
    return lines[0]


def run(args: list[str]) -> Any:
    return CliRunner().invoke(app, args)


# --- the stack ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("region", "words"),
    [
        (None, "superkube:region: has no value (YAML null); write one, or remove the line for the default (eastus)"),
        ("null", "superkube:region: 'null' is not an Azure region"),
        ("eastus9", "did you mean 'eastus'?"),
        ("mars", "write a region's programmatic name, e.g. eastus"),
    ],
    ids=["null", "the word null", "no such region", "not Azure's"],
)  # fmt: skip
def test_a_region_azure_has_not_is_refused(
    region: str | None, words: str, write_stack: Callable[..., Path]
) -> None:
    stack = write_stack({**dev_config(), "superkube:region": region})
    assert words in one_line_exit_2(run(["plan", "--stack", str(stack)]))


def test_every_listed_region_plans_its_name_only() -> None:
    from superkube.model.spec import azure_regions, from_config

    regions = azure_regions()
    assert len(regions) == len(set(regions)) > 50 and {"eastus", "southcentralus", "westeurope"} <= set(
        regions
    )
    config = {k.partition(":")[2]: v for k, v in dev_config().items()}
    for region in regions:
        assert from_config({**config, "region": region}).region == region


@pytest.mark.parametrize("stack_name", ["dév", "My_Cluster", "a" * 40, "9lives"])
def test_a_stack_file_name_that_is_no_cluster_name_is_refused(
    stack_name: str, write_stack: Callable[..., Path]
) -> None:
    config = {k: v for k, v in dev_config().items() if k != "superkube:cluster_name"}
    stack = write_stack(config, name=stack_name)
    line = one_line_exit_2(run(["plan", "--stack", str(stack)]))
    assert line.startswith(f"error: superkube:cluster_name: is not set, so the stack's name {stack_name!r}")
    assert f"pulumi config set -s {stack_name} superkube:cluster_name" in line
    # the fix it gives plans
    config["superkube:cluster_name"] = "gpu-west"
    assert run(["plan", "--stack", str(write_stack(config, name=stack_name))]).exit_code == 0


TEAM_CASES = [
    (
        "- {selector: {superkube.io/pool: gpux}, team: research}\n",
        "superkube:teams[0].selector: {'superkube.io/pool': 'gpux'} matches no pool's nodes",
        "select labels a pool's nodes carry, e.g. {superkube.io/pool: gpu}",
    ),
    (
        "- {selector: {superkube.io/pool: gpu, superkube.io/role: cpu}, team: research}\n",
        "matches no pool's nodes",
        "select labels a pool's nodes carry, e.g. {superkube.io/pool: gpu}",
    ),
    (
        "- {selector: {superkube.io/pool: gpu}, team: research}\n"
        "- {selector: {superkube.io/role: gpu}, team: any, priority: 10}\n",
        "superkube:teams[0]: team 'research' owns no node: pool gpu's nodes go to 'any' (priority 10, over 0)",
        "give research's tuple a priority above 10, or select other nodes",
    ),
]


@pytest.mark.parametrize(
    ("teams", "problem", "fix"), TEAM_CASES, ids=["no such pool", "no pool is both", "shadowed"]
)
def test_a_team_that_can_own_no_node_is_refused(
    teams: str, problem: str, fix: str, write_stack: Callable[..., Path]
) -> None:
    line = one_line_exit_2(
        run(["plan", "--stack", str(write_stack({**dev_config(), "superkube:teams": teams}))])
    )
    assert problem in line and line.endswith(fix), line


def test_a_tuple_on_a_label_nodes_get_later_is_left_to_the_cluster(write_stack: Callable[..., Path]) -> None:
    """A rack label is not known when the stack is planned: such a tuple is never refused for it."""
    teams = (
        "- {selector: {superkube.io/role: gpu}, team: any}\n"
        "- {selector: {superkube.io/pool: gpu, rack: a}, team: research, priority: 10}\n"
    )
    result = run(["plan", "--stack", str(write_stack({**dev_config(), "superkube:teams": teams}))])
    assert result.exit_code == 0, result.output
    assert "│ gpu  │     4 │ any (anyone may borrow) │ research" in result.stdout, result.stdout


def test_plan_shows_whose_each_pool_s_nodes_are() -> None:
    result = run(["plan", "--stack", "dev", "--project", str(ROOT)])
    assert result.exit_code == 0, result.output
    table = result.stdout[result.stdout.index("Teams: whose nodes") :]
    rows = {
        line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
        for line in table.splitlines()
        if line.startswith("│")
    }
    assert rows == {"gpu": ["4", "research", ""], "cpu": ["3", "anyone's (no team)", ""]}, table


# --- jobs ---------------------------------------------------------------------------------------


def _job(tmp_path: Path, drop: tuple[str, ...] = (), **change: Any) -> Path:
    job = {k: v for k, v in yaml.safe_load(ALLREDUCE.read_text()).items() if k not in drop}
    job.update(change)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def _render(job: Path, stack: str = "dev") -> Any:
    return run(["job", "render", str(job), "--stack", stack, "--project", str(ROOT)])


def test_a_misspelt_key_is_named_not_the_key_it_leaves_missing(tmp_path: Path) -> None:
    job = yaml.safe_load(ALLREDUCE.read_text())
    job["worker"] = job.pop("workers")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    line = one_line_exit_2(_render(tmp_path / "job.yaml"))
    assert "job.yaml: worker: unknown key; did you mean 'workers'?" in line


def test_a_team_s_job_without_a_namespace_is_refused_not_sent_to_default(tmp_path: Path) -> None:
    line = one_line_exit_2(_render(_job(tmp_path, drop=("namespace",))))
    assert (
        "job allreduce: no namespace, and the team webhook admits research's pods only in a namespace" in line
    )
    assert "kubectl label namespace <name> superkube.io/team=research" in line


def test_a_job_on_a_stack_without_teams_defaults_to_the_default_namespace(
    tmp_path: Path, write_stack: Callable[..., Path]
) -> None:
    stack = write_stack({k: v for k, v in dev_config().items() if k != "superkube:teams"})
    result = _render(_job(tmp_path, drop=("namespace",)), str(stack))
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout)["metadata"]["namespace"] == "default"


def _three_pools(write_stack: Callable[..., Path]) -> str:
    config = dev_config()
    pools = yaml.safe_load(config["superkube:node_pools"])
    gpu = next(p for p in pools if p["role"] == "gpu")
    pools += [{**gpu, "name": "gpub"}, {**gpu, "name": "gpuc"}]
    config["superkube:node_pools"] = yaml.safe_dump(pools, sort_keys=False)
    config["superkube:teams"] = (
        "- {selector: {superkube.io/pool: gpu}, team: research}\n"
        "- {selector: {superkube.io/pool: gpub}, team: any}\n"
        "- {selector: {superkube.io/pool: gpuc}, team: training}\n"
    )
    return str(write_stack(config))


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            {"pool": "gpuc"},
            "pool gpuc's nodes belong to team 'training' (superkube:teams), so team 'research''s workers "
            "could never be placed; run it on research's pool (gpu)",
        ),
        ({"pool": "gpub"}, "pool gpub's nodes belong to team 'any' (superkube:teams)"),
    ],
    ids=["another team's pool", "borrowable without borrow"],
)
def test_a_job_on_nodes_its_team_can_never_use_is_refused(
    change: dict[str, Any], words: str, tmp_path: Path, write_stack: Callable[..., Path]
) -> None:
    stack = _three_pools(write_stack)
    line = one_line_exit_2(_render(_job(tmp_path, **change), stack))
    assert words in line, line
    if change["pool"] == "gpub":
        assert line.endswith("set borrow: true to run on it")
        borrowing = _render(_job(tmp_path, borrow=True, **change), stack)
        assert borrowing.exit_code == 0, borrowing.output
    assert _render(_job(tmp_path, pool="gpu"), stack).exit_code == 0


# --- output paths -------------------------------------------------------------------------------


def test_out_dash_writes_the_plan_to_standard_output_alone() -> None:
    result = run(["plan", "--stack", "dev", "--project", str(ROOT), "--out", "-"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["format"] == "superkube-plan/1"


def test_out_through_a_symlink_writes_the_file_it_names(tmp_path: Path) -> None:
    (tmp_path / "plans").mkdir()
    target = tmp_path / "plans" / "dev.json"
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    for _ in range(2):  # a dangling link first, then one to the plan it wrote
        result = run(["plan", "--stack", "dev", "--project", str(ROOT), "--out", str(link)])
        assert result.exit_code == 0, result.output
        assert link.is_symlink() and json.loads(target.read_text())["stack"] == "dev"


def test_a_file_that_is_not_a_plan_is_never_written_over(tmp_path: Path) -> None:
    stack = tmp_path / "Pulumi.dev.yaml"
    stack.write_text((ROOT / "stacks/Pulumi.dev.yaml").read_text())
    before = stack.read_text()
    line = one_line_exit_2(run(["plan", "--stack", "dev", "--project", str(ROOT), "--out", str(stack)]))
    assert line.endswith("exists and is not a plan superkube wrote (JSON), which writing would replace; "
                         "give a new file name, or remove the file first")  # fmt: skip
    assert stack.read_text() == before
    # and check, handed that stack file as a plan, points at --stack, never at writing a plan over it
    line = one_line_exit_2(run(["check", "--plan", str(stack)]))
    assert line.endswith(f"check a stack with superkube check --stack {stack}") and "--out" not in line


def test_a_pipe_or_a_device_is_refused_and_stays(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    line = one_line_exit_2(run(["plan", "--stack", "dev", "--project", str(ROOT), "--out", str(fifo)]))
    assert "is a named pipe, not a file; give a file name, or --out - for standard output" in line
    assert fifo.is_fifo()
    line = one_line_exit_2(run(["plan", "--stack", "dev", "--project", str(ROOT), "--out", "/dev/null"]))
    assert "--out /dev/null: is a character device" in line
    assert Path("/dev/null").is_char_device()


def test_a_directory_no_file_can_be_made_in_is_one_line() -> None:
    line = one_line_exit_2(run(["plan", "--stack", "dev", "--project", str(ROOT), "--out", "/proc/x.json"]))
    assert line.startswith("error: --out /proc/x.json: no file can be written in /proc")


def test_the_inventory_writes_over_its_own_file_only(tmp_path: Path) -> None:
    inventory = tmp_path / "dev.azure_rm.yml"
    for _ in range(2):
        result = run(["inventory", "--stack", "dev", "--project", str(ROOT), "--out", str(inventory)])
        assert result.exit_code == 0, result.output
    inventory.write_text("all:\n  hosts: {}\n")
    line = one_line_exit_2(
        run(["inventory", "--stack", "dev", "--project", str(ROOT), "--out", str(inventory)])
    )
    assert "exists and is not an inventory config superkube wrote" in line


# --- what the machine lacks ---------------------------------------------------------------------


def test_doctor_from_outside_the_checkout_finds_this_machine_ready_offline(tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(SUPERKUBE), "doctor", "offline"], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "0 missing" and all(line.startswith("ok ") for line in lines[:-1]), proc.stdout


def test_doctor_before_install_names_each_missing_piece_on_a_bare_machine(tmp_path: Path) -> None:
    """What `make doctor` runs: the system's python3 on the file alone, here with a PATH that holds
    nothing but python3 and a home with no Pulumi or Azure login: a fresh machine's view."""
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python3").symlink_to(sys.executable)
    env = {"PATH": str(bare), "HOME": str(tmp_path)}
    proc = subprocess.run(
        ["python3", str(ROOT / "src/superkube/cli/prerequisites.py"), "lab", "azure"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    missing = {
        line.split(":")[0].split(maxsplit=2)[2]
        for line in proc.stdout.splitlines()
        if line.startswith("missing")
    }
    assert {"debootstrap", "systemd-nspawn", "iptables", "kubectl", "go", "pulumi", "pulumi backend",
            "az", "azure login"} <= missing, proc.stdout  # fmt: skip
    for line in proc.stdout.splitlines()[:-1]:
        assert line.startswith(("ok ", "missing ")) and ": " in line, line
    assert "missing debootstrap: apt-get install debootstrap" in proc.stdout.replace("lab     ", "")
    count = sum(line.startswith("missing") for line in proc.stdout.splitlines())
    assert proc.stdout.splitlines()[-1].startswith(f"{count} missing (")
