"""`superkube lab`: booted Debian hosts with their own roots and namespaces, reached over SSH."""

from __future__ import annotations

import os
import subprocess
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from superkube.cli import app
from superkube.cluster import cloudinit
from superkube.cluster.kube import NODE_EXPORTER_PORT
from superkube.lab import hosts as lab
from tests.lab.conftest import sh


def test_every_host_is_booted_and_reachable(fleet: lab.Lab) -> None:
    state = lab.status()
    assert state["up"] and len(state["hosts"]) == 10
    assert all(h["running"] and h["ssh"] for h in state["hosts"]), state
    for h in fleet.hosts:
        assert sh(fleet, h.name, "hostname").strip() == h.name
        assert sh(fleet, h.name, "systemctl is-system-running").strip() == "running"


def test_status_json_through_the_cli(fleet: lab.Lab) -> None:
    result = CliRunner().invoke(app, ["lab", "status", "--output", "json"])
    assert result.exit_code == 0
    assert {h["name"] for h in __import__("json").loads(result.stdout)["hosts"]} == {
        h.name for h in fleet.hosts
    }


def test_inventory_groups_match_production(fleet: lab.Lab) -> None:
    inventory = yaml.safe_load(fleet.inventory.read_text())["all"]
    groups = inventory["children"]
    for group in lab.GROUPS:
        assert groups[group]["hosts"], group
    assert set(groups["cluster"]["children"]) == set(lab.GROUPS)
    assert list(groups["internet"]["hosts"]) == ["internet"]
    internet = IPv4Address(groups["internet"]["hosts"]["internet"]["ansible_host"])
    assert not any(internet in IPv4Network(c) for c in inventory["vars"]["superkube_cluster_cidrs"])


def test_each_host_has_its_own_root_over_the_shared_image(fleet: lab.Lab) -> None:
    sh(fleet, "gpu-1", "echo only-here > /root/marker")
    assert sh(fleet, "gpu-1", "cat /root/marker").strip() == "only-here"
    assert "absent" in sh(fleet, "gpu-2", "cat /root/marker 2>/dev/null || echo absent")
    assert not (Path(fleet.base_image) / "root" / "marker").exists()


def test_each_host_lives_in_its_own_network_namespace(fleet: lab.Lab) -> None:
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    for h in fleet.hosts:
        assert h.netns in namespaces
        addr = subprocess.run(
            ["ip", "-n", h.netns, "-br", "addr", "show", "eth0"], capture_output=True, text=True, check=True
        ).stdout
        assert f"{h.address}/{h.prefixlen}" in addr
    root_links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True, check=True).stdout
    assert "skl" not in root_links, "no lab link stays in the machine's own namespace"


def test_hosts_reach_each_other_across_subnets(fleet: lab.Lab) -> None:
    gpu = fleet.host("gpu-1")
    assert (
        sh(
            fleet,
            "hub-client",
            f"curl -s -m 5 -o /dev/null -w '%{{http_code}}' http://{gpu.address}:{NODE_EXPORTER_PORT}/metrics",
        )
        == "200"
    )


def test_a_stopped_host_keeps_its_disk(fleet: lab.Lab) -> None:
    sh(fleet, "cpu-2", "echo kept > /root/kept")
    lab.stop_host("cpu-2")
    assert not lab.alive(fleet.host("cpu-2").pid)
    assert lab.ssh(lab.Lab.load(), fleet.host("cpu-2"), "true", timeout=15).returncode != 0
    lab.start_host("cpu-2")
    reloaded = lab.Lab.load()
    assert reloaded is not None
    assert sh(reloaded, "cpu-2", "cat /root/kept").strip() == "kept"


def test_a_second_lab_up_is_refused(fleet: lab.Lab) -> None:
    with pytest.raises(lab.LabError, match="already up"):
        lab.up(1, lambda what, fraction: None)


def test_bad_host_names_are_user_errors(fleet: lab.Lab) -> None:
    result = CliRunner().invoke(app, ["lab", "stop", "nosuch"])
    assert result.exit_code == 2 and "no lab host 'nosuch'" in result.stderr


def test_only_node_hosts_join_and_not_before_converge(fleet: lab.Lab) -> None:
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


def test_the_labs_join_script_is_the_plans_with_a_short_jitter() -> None:
    doc = yaml.safe_load(
        cloudinit.render(
            cluster="c", pool="gpu", role="gpu", apiserver_endpoint="https://10.0.0.4:6443",
            kubernetes_version="1.35.0", join_jitter_seconds=600, labels={}, taints=[],
        ).removeprefix("#cloud-config\n")
    )  # fmt: skip
    script = next(f["content"] for f in doc["write_files"] if f["path"] == cloudinit.JOIN_SCRIPT)
    short = lab.lab_join_script(script)
    assert cloudinit.join_jitter_seconds(script) == 600
    assert cloudinit.join_jitter_seconds(short) == lab.LAB_JOIN_JITTER_S
    changed = [(a, b) for a, b in zip(script.splitlines(), short.splitlines(), strict=True) if a != b]
    assert len(changed) == 1 and "shuf" in changed[0][0]
    with pytest.raises(lab.LabError, match="no jitter"):
        lab.lab_join_script("#!/bin/sh\nsystemctl enable --now kubelet\n")


def test_runs_as_root() -> None:
    assert os.geteuid() == 0, "the lab tests need root; CI runs as root"


def test_layouts_of_every_size_are_routable() -> None:
    for n in (1, 2, 4, 8, 12):
        hosts, subnets, facts = lab.layout(n)
        assert len(hosts) == n + 2
        for h in hosts:
            assert any(IPv4Address(h.address) in IPv4Network(s) for s in subnets)
        for source, _, via in facts["route_tables"]:
            assert any(IPv4Address(via) in IPv4Network(s) for s in subnets), (
                "the next hop is on a routed subnet"
            )
            assert source in subnets
        assert bool(facts["route_tables"]) == any(h.group == "nat_host" for h in hosts)


def test_the_kubelets_kernel_tunables_are_set_for_the_lab_and_put_back_by_down(tmp_path: Path) -> None:
    sysctl, state = tmp_path / "sys", tmp_path / "state"
    state.mkdir()
    machine = {**lab.KUBELET_KERNEL_TUNABLES, "kernel/panic": 1, "kernel/panic_on_oops": 0}
    for key, value in machine.items():
        (sysctl / key).parent.mkdir(parents=True, exist_ok=True)
        (sysctl / key).write_text(f"{value}\n")
    lab._set_kernel_for_kubelets(state, sysctl)
    assert {k: int((sysctl / k).read_text()) for k in machine} == lab.KUBELET_KERNEL_TUNABLES
    lab._set_kernel_for_kubelets(state, sysctl)  # again (a retried up): what the machine had stays saved
    removed: list[str] = []
    lab._restore_kernel(state, removed, sysctl)
    assert {k: int((sysctl / k).read_text()) for k in machine} == machine
    assert sorted(removed) == ["kernel kernel.panic=1 restored", "kernel kernel.panic_on_oops=0 restored"]
    assert not (state / lab.KERNEL_SAVED).exists()


def test_the_inotify_limit_is_raised_for_the_hosts_and_never_lowered(tmp_path: Path) -> None:
    limit = tmp_path / "max_user_instances"
    limit.write_text("128\n")
    lab._ensure_inotify_instances(16, limit)  # 16 booted hosts hold more than 128 (134 measured)
    assert int(limit.read_text()) == 256 + lab.INOTIFY_INSTANCES_PER_HOST * 16
    limit.write_text("100000\n")
    lab._ensure_inotify_instances(16, limit)
    assert limit.read_text() == "100000\n"
