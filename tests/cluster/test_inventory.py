"""`superkube inventory`: the azure_rm config groups the program's role tags like the lab does."""

from __future__ import annotations

from pathlib import Path

import jinja2
import yaml
from typer.testing import CliRunner

from superkube.cli import app
from superkube.cluster.kube import GROUPS, MACHINE_GROUPS
from superkube.plan.engine import Plan

ENV = jinja2.Environment()


def evaluate(expression: str, **hostvars: object) -> object:
    return ENV.compile_expression(expression)(**hostvars)


def test_groups_and_host_vars_from_the_recorded_tags(flagship_plan: Plan, tmp_path: Path) -> None:
    out = tmp_path / "flagship.azure_rm.yml"
    result = CliRunner().invoke(app, ["inventory", "--stack", "flagship", "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    config = yaml.safe_load(out.read_text())
    assert config["plugin"] == "azure.azcollection.azure_rm"
    assert config["include_vm_resource_groups"] == ["rg-flagship", "rg-flagship-hub"]
    (keyed,) = config["keyed_groups"]
    machines = [
        r
        for r in flagship_plan.resources
        if r.type in ("azure-native:compute:VirtualMachine", "azure-native:compute:VirtualMachineScaleSet")
    ]
    roles = set()
    for r in machines:
        tags = r.inputs["tags"]
        group = evaluate(keyed["key"], tags=tags)
        assert group == tags["superkube-role"] and group in MACHINE_GROUPS
        roles.add(group)
        # the monitoring hosts watch the cluster from beside it: not members of `cluster`
        assert evaluate(config["conditional_groups"]["cluster"], tags=tags) is (group in GROUPS)
        assert not any(evaluate(f, tags=tags, powerstate="running") for f in config["exclude_host_filters"])
    assert roles == set(MACHINE_GROUPS), "every production group has hosts"
    other = {**machines[0].inputs["tags"], "cluster": "another"}
    assert any(evaluate(f, tags=other, powerstate="running") for f in config["exclude_host_filters"])
    expr = config["hostvar_expressions"]
    assert evaluate(expr["superkube_cluster"]) == "flagship"
    assert evaluate(expr["superkube_cluster_cidrs"]) == ["10.64.0.0/15", "10.0.0.0/22", "10.128.0.0/16"]
    assert evaluate(expr["ansible_host"], private_ipv4_addresses=["10.65.16.5"]) == "10.65.16.5"
    # a capture's builder carries its pool's tags, but never gets a join credential from a converge
    node = next(r.inputs["tags"] for r in machines if r.inputs["tags"].get("superkube-pool"))
    assert evaluate(expr["kubelet_write_bootstrap_kubeconfig"], tags=node) is True
    builder = {**node, "superkube-builder": "1.4.0"}
    assert evaluate(expr["kubelet_write_bootstrap_kubeconfig"], tags=builder) is False


def test_inventory_file_name_must_suit_the_plugin(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["inventory", "--out", str(tmp_path / "inv.yml")])
    assert result.exit_code == 2 and "azure_rm.yml" in result.stderr
    assert not (tmp_path / "inv.yml").exists()
