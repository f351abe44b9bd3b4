"""`superkube plan` outputs: JSON for machines, a saved plan, an SVG, the config schema check."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from superkube.cli import app
from tests.conftest import ROOT, dev_config


def test_plan_json_has_every_resource_with_type_name_inputs_parent_and_dependencies() -> None:
    result = CliRunner().invoke(app, ["plan", "--stack", "dev", "--output", "json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["format"] == "superkube-plan/1" and doc["stack"] == "dev"
    urns = {r["urn"] for r in doc["resources"]}
    assert sum(doc["resource_counts"].values()) == len(doc["resources"]) > 40
    for r in doc["resources"]:
        assert {"type", "name", "inputs", "parent", "dependencies"} <= set(r)
        assert r["parent"] in urns or r["type"] == "superkube:cluster:Cluster"
        assert set(r["dependencies"]) <= urns
    deps = [r for r in doc["resources"] if r["type"] == "azure-native:network:Subnet"]
    assert all(any("VirtualNetwork::" in d for d in r["dependencies"]) for r in deps)
    assert {row["subnet"] for row in doc["address_plan"]["subnets"]} >= {
        "nat",
        "shared",
        "apiservers",
        "gpu-0",
        "cpu-0",
    }


def test_plan_out_and_diagram_files(tmp_path: Path) -> None:
    (tmp_path / "plans").mkdir()
    out, svg = tmp_path / "plans" / "flagship.json", tmp_path / "flagship.svg"
    result = CliRunner().invoke(app, ["plan", "-s", "flagship", "--out", str(out), "--diagram", str(svg)])
    assert result.exit_code == 0, result.stderr
    assert (
        "vmss-flagship-gpu-7" in result.stdout
        and "63,995" in result.stdout
        and "60,000 GPUs" in result.stdout
    )
    doc = json.loads(out.read_text())
    assert doc["capacity"]["scale_sets"] == 9
    root = ET.fromstring(svg.read_text())
    texts = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
    assert "vmss-flagship-gpu-0" in texts and "NAT host" in texts and "10.128.0.0/16 -> 10.0.1.4" in texts


def test_config_schema_check_passes_on_the_checkout() -> None:
    result = CliRunner().invoke(app, ["config-schema", "--check"])
    assert result.exit_code == 0 and "matches" in result.stdout


def test_config_schema_check_fails_when_stale(tmp_path: Path, root: Path) -> None:
    (tmp_path / "Pulumi.yaml").write_text(
        (root / "Pulumi.yaml").read_text().replace("default: 300", "default: 301")
    )
    result = CliRunner().invoke(app, ["config-schema", "--check", "--project", str(tmp_path)])
    assert result.exit_code == 1 and "out of date" in result.stderr


def test_saved_plans_list_resources_in_one_stable_order(dev_plan: Any) -> None:
    """Two plans of one stack are the same document, so a saved plan diffs only where the stack did."""
    from superkube.plan import engine as planning
    from tests.conftest import ROOT

    urns = [r.urn for r in dev_plan.resources]
    assert urns == sorted(urns)
    again = planning.run(ROOT, "dev").to_dict()
    first = dev_plan.to_dict()
    assert [r["urn"] for r in again["resources"]] == [r["urn"] for r in first["resources"]]


@pytest.mark.parametrize(
    "stack", sorted(p.name.split(".")[1] for p in (ROOT / "stacks").glob("Pulumi.*.yaml"))
)
def test_two_plans_of_a_shipped_stack_are_the_same_bytes(stack: str, tmp_path: Path) -> None:
    """Separate processes (other hash seeds, other timing), one byte stream: a saved plan diffs only
    where the stack changed."""
    written = []
    for seed in ("1", "2"):
        out = tmp_path / f"{stack}-{seed}.json"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "superkube.cli",
                "plan",
                "--stack",
                stack,
                "--out",
                str(out),
                "-o",
                "json",
            ],
            capture_output=True,
            timeout=120,
            env={**os.environ, "PYTHONHASHSEED": seed},
            cwd=ROOT,
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == out.read_bytes()
        written.append(proc.stdout)
    assert written[0] == written[1]


def test_recorded_inputs_have_their_keys_sorted_at_every_depth() -> None:
    from superkube.plan.engine import _plain

    shuffled = {"tags": {"b": "2", "a": "1"}, "location": "x", "props": [{"z": 1.0, "y": {"d": 0, "c": 0}}]}
    plain = _plain(shuffled)
    assert json.dumps(plain) == json.dumps(
        {"location": "x", "props": [{"y": {"c": 0, "d": 0}, "z": 1}], "tags": {"a": "1", "b": "2"}}
    )


def test_an_out_file_in_a_missing_directory_is_refused_not_created(tmp_path: Path) -> None:
    target = tmp_path / "no" / "such" / "plan.json"
    result = CliRunner().invoke(app, ["plan", "--out", str(target)])
    assert result.exit_code == 2
    assert (
        result.stderr.strip()
        == f"error: --out {target}: directory {target.parent} does not exist; create it first"
    )
    assert not (tmp_path / "no").exists()


def test_output_files_get_the_umasks_mode_not_a_private_one(tmp_path: Path) -> None:
    out = tmp_path / "dev.azure_rm.yml"
    old = os.umask(0o022)
    try:
        result = CliRunner().invoke(app, ["inventory", "--out", str(out)])
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o644


def test_check_list_as_json_is_json() -> None:
    from policies.rules import ALL_RULES

    result = CliRunner().invoke(app, ["check", "--list", "-o", "json"])
    assert result.exit_code == 0, result.stderr
    rules = json.loads(result.stdout)
    assert [r["name"] for r in rules] == [r.name for r in ALL_RULES]
    assert all(r["description"] and r["remediation"] for r in rules)


def test_check_refuses_a_saved_plan_and_a_stack_together(tmp_path: Path) -> None:
    saved = tmp_path / "dev.json"
    assert CliRunner().invoke(app, ["plan", "--out", str(saved)]).exit_code == 0
    result = CliRunner().invoke(app, ["check", "--plan", str(saved), "--stack", "flagship"])
    assert result.exit_code == 2
    assert "a saved plan names its own stack; give one of them" in result.stderr


@pytest.mark.parametrize("output", ["json", "table"])
def test_a_reader_that_stops_early_is_not_an_error(output: str) -> None:
    """`superkube plan | head -1`: exit 0 and nothing on stderr once the reader has its line."""
    proc = subprocess.run(
        f"{shlex.quote(sys.executable)} -m superkube.cli plan -s flagship -o {output} | head -c 1; "
        "echo; echo status=${PIPESTATUS[0]}",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.stdout.splitlines() == ["{" if output == "json" else "s", "status=0"], (
        proc.stdout + proc.stderr
    )
    assert proc.stderr == ""


def test_every_command_group_is_reachable_through_python_dash_m() -> None:
    """`python -m superkube.cli etcd` must reach the etcd commands (they register below the entry point)."""
    proc = subprocess.run(
        [sys.executable, "-m", "superkube.cli", "etcd", "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "status" in proc.stdout


def test_a_pools_default_egress_limit_is_planned_tagged_and_shown(write_stack: Callable[..., Path]) -> None:
    config = dev_config()
    pools = yaml.safe_load(config["superkube:node_pools"])
    pools[1]["egress_limit"] = "500M"
    config["superkube:node_pools"] = yaml.safe_dump(pools)
    stack = str(write_stack(config))
    result = CliRunner().invoke(app, ["plan", "--stack", stack])
    assert result.exit_code == 0, result.stderr
    shown = " ".join(result.stdout.split())
    assert f"pool {pools[1]['name']}" in shown and "pod egress 500 Mbit/s by default" in shown
    assert f"pool {pools[0]['name']}" in shown and "pod egress unlimited" in shown
    doc = json.loads(CliRunner().invoke(app, ["plan", "--stack", stack, "--output", "json"]).stdout)
    tags = {
        r["inputs"]["tags"]["superkube-pool"]: r["inputs"]["tags"].get("superkube-egress-limit")
        for r in doc["resources"]
        if r["type"] == "azure-native:compute:VirtualMachineScaleSet"
    }
    # the nodes read this tag from instance metadata at boot (bits per second)
    assert tags == {pools[0]["name"]: None, pools[1]["name"]: "500000000"}


def test_leaving_early_still_runs_the_exit_handlers_and_keeps_the_status(tmp_path: Path) -> None:
    """The CLI skips the interpreter's teardown; exit handlers, flushed output and the status stay."""
    marker = tmp_path / "exit-handler-ran"
    program = (
        "import atexit, pathlib, sys\n"
        f"atexit.register(pathlib.Path({str(marker)!r}).write_text, 'yes')\n"
        "from superkube.cli import main\n"
        "sys.argv = ['superkube', 'plan', '--stack', 'no-such-stack']\n"
        "print('before', end='')\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, marker.read_text()) == (2, "before", "yes")
    assert "no such stack file" in proc.stderr
