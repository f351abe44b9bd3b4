"""`superkube check`: exit codes, the four report formats, saved plans, relaxed rules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from policies.rules import ALL_RULES
from superkube.cli import app
from superkube.plan.engine import Plan
from tests.policies import mutations as m


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def saved(flagship_plan: Plan, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The flagship plan saved once, and a copy with a public IP and SSH open to the internet."""
    base = tmp_path_factory.mktemp("plans")
    doc = flagship_plan.to_dict()
    good = base / "flagship.json"
    good.write_text(json.dumps(doc))
    m.add_public_ip(doc)
    m.allow_ssh_from_internet(doc)
    bad = base / "flagship-bad.json"
    bad.write_text(json.dumps(doc))
    return good, bad


def test_both_shipped_stacks_pass_with_zero_violations() -> None:
    for stack in ("dev", "flagship"):
        result = invoke("check", "--stack", stack, "--output", "json")
        assert result.exit_code == 0, result.stdout
        report = json.loads(result.stdout)
        assert report["passed"] is True
        assert len(report["rules"]) == len(ALL_RULES)
        assert all(r["violations"] == [] for r in report["rules"])


def test_a_saved_plan_is_checked_without_planning(saved: tuple[Path, Path]) -> None:
    good, bad = saved
    assert invoke("check", "--plan", str(good)).exit_code == 0
    result = invoke("check", "--plan", str(bad))
    assert result.exit_code == 1
    assert "network-nic-no-public-ip" in result.stdout and "FAIL" in result.stdout


def test_markdown_is_a_summary_line_then_one_row_per_violation(saved: tuple[Path, Path]) -> None:
    result = invoke("check", "--plan", str(saved[1]), "--output", "markdown")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("**superkube check** `flagship`: FAIL:")
    rows = [line for line in lines if line.startswith("| `")]
    assert {row.split("`")[1] for row in rows} == {
        "network-nic-no-public-ip",
        "network-nsg-deny-internet-inbound",
    }
    assert lines[2] == "| rule | resource | what is wrong | how to fix |"
    assert all(row.count(" | ") == 3 for row in rows), "four columns: rule, resource, what, fix"


def test_sarif_is_2_1_0_with_rules_results_and_locations(saved: tuple[Path, Path]) -> None:
    result = invoke("check", "--plan", str(saved[1]), "--output", "sarif")
    assert result.exit_code == 1
    sarif = json.loads(result.stdout)
    assert sarif["version"] == "2.1.0" and sarif["$schema"].endswith("sarif-2.1.0.json")
    (run,) = sarif["runs"]
    rules = run["tool"]["driver"]["rules"]
    ids = [r["id"] for r in rules]
    assert run["tool"]["driver"]["name"] == "superkube" and len(ids) == len(set(ids)) == len(ALL_RULES)
    assert all(r["shortDescription"]["text"] and r["help"]["text"] for r in rules)
    assert run["results"]
    for res in run["results"]:
        assert ids[res["ruleIndex"]] == res["ruleId"]
        assert res["level"] in ("error", "warning", "note", "none")
        assert res["message"]["text"]
        (loc,) = res["locations"]
        assert loc["physicalLocation"]["artifactLocation"]["uri"] == "stacks/Pulumi.flagship.yaml"
        assert loc["physicalLocation"]["region"]["startLine"] >= 1
        assert loc["logicalLocations"][0]["fullyQualifiedName"].startswith("urn:pulumi:flagship::superkube::")


def test_a_stack_can_make_a_rule_advisory_or_disabled_with_a_reason(
    saved: tuple[Path, Path], tmp_path: Path
) -> None:
    doc = json.loads(saved[1].read_text())
    doc["config"]["superkube:policy_overrides"] = (
        "network-nsg-deny-internet-inbound: {enforcement: advisory, reason: 'lab cluster behind the corporate VPN only'}\n"
        "network-nic-no-public-ip: {enforcement: disabled, reason: 'temporary bastion, ticket OPS-1234'}\n"
    )
    path = tmp_path / "relaxed.json"
    path.write_text(json.dumps(doc))
    result = invoke("check", "--plan", str(path), "--output", "markdown")
    assert result.exit_code == 0, result.stdout
    from policies.rules import ALL_RULES

    assert f"PASS: {len(ALL_RULES) - 1} of {len(ALL_RULES)} rules checked" in result.stdout
    assert "`network-nsg-deny-internet-inbound (advisory)`" in result.stdout
    assert "- `network-nic-no-public-ip` is disabled: temporary bastion, ticket OPS-1234" in result.stdout
    assert "lab cluster behind the corporate VPN only" in result.stdout
    table = invoke("check", "--plan", str(path))
    assert "disabled: temporary bastion" in table.stdout and table.exit_code == 0


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (
            "network-nic-no-public-ipp: {enforcement: advisory, reason: 'a long enough reason'}\n",
            "superkube:policy_overrides.network-nic-no-public-ipp",
        ),
        (
            "network-nic-no-public-ip: {enforcement: advisory, reason: 'short'}\n",
            "superkube:policy_overrides.network-nic-no-public-ip.reason",
        ),
        (
            "network-nic-no-public-ip: {enforcement: off, reason: 'a long enough reason'}\n",
            "superkube:policy_overrides.network-nic-no-public-ip.enforcement",
        ),
    ],
)
def test_bad_overrides_are_user_errors(
    overrides: str, key: str, saved: tuple[Path, Path], tmp_path: Path
) -> None:
    doc = json.loads(saved[0].read_text())
    doc["config"]["superkube:policy_overrides"] = overrides
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    result = invoke("check", "--plan", str(path))
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and f"{key}:" in result.stderr


@pytest.mark.parametrize(
    ("content", "word"),
    [(None, "no such file"), ("{", "is not valid JSON"), ('{"resources": []}', "not a superkube plan")],
)
def test_bad_plan_files(content: str | None, word: str, tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    if content is not None:
        path.write_text(content)
    result = invoke("check", "--plan", str(path))
    assert result.exit_code == 2 and word in result.stderr


def test_list_shows_every_rule() -> None:
    result = invoke("check", "--list")
    assert result.exit_code == 0
    assert all(r.name in result.stdout for r in ALL_RULES)


def test_policy_config_feeds_crossguard_the_stacks_settings() -> None:
    result = invoke("policy-config", "--stack", "dev")
    assert result.exit_code == 0
    config = json.loads(result.stdout)
    assert set(config) == {r.name for r in ALL_RULES}
    assert config["topology-apiserver-count"]["apiserver_count"] == 3
    assert config["compute-vmss-join-jitter"]["enforcementLevel"] == "advisory"
    assert config["network-vnet-ip-limit"]["limits"]["vnet_private_ips"] == 65_536
