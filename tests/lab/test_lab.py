"""`superkube lab`: booted Debian hosts with their own roots and namespaces, reached over SSH."""

from __future__ import annotations

import subprocess
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from superkube.cli import app
from superkube.cluster import cloudinit
from superkube.cluster.kube import GROUPS, NODE_EXPORTER_PORT
from superkube.lab import hosts as lab
from superkube.lab import machines, processes
from superkube.lab.state import Lab
from tests.lab.conftest import CONTROL_PLANE, sh


def test_every_host_is_booted_and_reachable(fleet: Lab) -> None:
    state = lab.status()
    # the shape's counts, read here and not by the code under test: group=count,...
    cluster_hosts = sum(int(part.split("=")[1]) for part in CONTROL_PLANE.split(","))
    assert cluster_hosts == 15
    assert state["up"] and len(state["hosts"]) == cluster_hosts + 2  # and the hub client, the internet
    assert all(h["running"] and h["ssh"] for h in state["hosts"]), state
    for h in fleet.hosts:
        assert sh(fleet, h.name, "hostname").strip() == h.name
        assert sh(fleet, h.name, "systemctl is-system-running").strip() == "running"


def test_status_json_through_the_cli(fleet: Lab) -> None:
    result = CliRunner().invoke(app, ["lab", "status", "--output", "json"])
    assert result.exit_code == 0
    assert {h["name"] for h in __import__("json").loads(result.stdout)["hosts"]} == {
        h.name for h in fleet.hosts
    }


def test_inventory_groups_match_production(fleet: Lab) -> None:
    inventory = yaml.safe_load(fleet.inventory.read_text())["all"]
    groups = inventory["children"]
    for group in GROUPS:
        assert groups[group]["hosts"], group
    assert set(groups["cluster"]["children"]) == set(GROUPS)
    assert list(groups["internet"]["hosts"]) == ["internet"]
    internet = IPv4Address(groups["internet"]["hosts"]["internet"]["ansible_host"])
    assert not any(internet in IPv4Network(c) for c in inventory["vars"]["superkube_cluster_cidrs"])


def test_each_host_has_its_own_root_over_the_shared_image(fleet: Lab) -> None:
    sh(fleet, "gpu-1", "echo only-here > /root/marker")
    assert sh(fleet, "gpu-1", "cat /root/marker").strip() == "only-here"
    assert "absent" in sh(fleet, "gpu-2", "cat /root/marker 2>/dev/null || echo absent")
    assert not (Path(fleet.base_image) / "root" / "marker").exists()


def test_each_host_lives_in_its_own_network_namespace(fleet: Lab) -> None:
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    for h in fleet.hosts:
        assert h.netns in namespaces
        addr = subprocess.run(
            ["ip", "-n", h.netns, "-br", "addr", "show", "eth0"], capture_output=True, text=True, check=True
        ).stdout
        assert f"{h.address}/{h.prefixlen}" in addr
    root_links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True, check=True).stdout
    assert "skl" not in root_links, "no lab link stays in the machine's own namespace"


def test_hosts_reach_each_other_across_subnets(fleet: Lab) -> None:
    gpu = fleet.host("gpu-1")
    assert (
        sh(
            fleet,
            "hub-client",
            f"curl -s -m 5 -o /dev/null -w '%{{http_code}}' http://{gpu.address}:{NODE_EXPORTER_PORT}/metrics",
        )
        == "200"
    )


def test_a_stopped_host_keeps_its_disk(fleet: Lab) -> None:
    sh(fleet, "cpu-1", "echo kept > /root/kept")
    lab.stop_host("cpu-1")
    assert not processes.alive(fleet.host("cpu-1").pid)
    assert machines.ssh(Lab.load(), fleet.host("cpu-1"), "true", timeout=15).returncode != 0
    lab.start_host("cpu-1")
    reloaded = Lab.load()
    assert reloaded is not None
    assert sh(reloaded, "cpu-1", "cat /root/kept").strip() == "kept"


def test_a_second_lab_up_is_refused(fleet: Lab) -> None:
    with pytest.raises(lab.LabError, match="already up"):
        lab.up(1, lambda what, fraction: None)


def test_bad_host_names_are_user_errors(fleet: Lab) -> None:
    result = CliRunner().invoke(app, ["lab", "stop", "nosuch"])
    assert result.exit_code == 2 and "no lab host 'nosuch'" in result.stderr


def test_only_node_hosts_join_and_not_before_converge(fleet: Lab) -> None:
    result = CliRunner().invoke(app, ["lab", "join", "etcd-main-1"])
    assert result.exit_code == 2 and "etcd-main-1: not a GPU or CPU node host" in result.stderr
    # a node converge has not reached yet (whether or not converge ran in this lab before)
    kubeconfig = cloudinit.BOOTSTRAP_KUBECONFIG
    sh(fleet, "gpu-1", f"if [ -e {kubeconfig} ]; then mv {kubeconfig} {kubeconfig}.aside; fi")
    try:
        result = CliRunner().invoke(app, ["lab", "join", "gpu-1"])
    finally:
        sh(fleet, "gpu-1", f"if [ -e {kubeconfig}.aside ]; then mv {kubeconfig}.aside {kubeconfig}; fi")
    assert result.exit_code == 2 and "run `superkube converge` on the lab first" in result.stderr
    assert sh(fleet, "gpu-1", "systemctl is-enabled superkube-join.path || true").strip() != "enabled"
