"""The lab's own parts without booting a lab: layouts, the join script it shortens, the kernel
settings `lab up` makes and `lab down` puts back."""

from __future__ import annotations

import os
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import pytest
import yaml

from superkube.cluster import cloudinit
from superkube.lab import fabric, kernel, machines
from superkube.lab import hosts as lab


def test_the_labs_join_script_is_the_plans_with_a_short_jitter() -> None:
    doc = yaml.safe_load(
        cloudinit.render(
            cluster="c", pool="gpu", role="gpu", apiserver_endpoint="https://10.0.0.4:6443",
            kubernetes_version="1.35.0", join_jitter_seconds=600, labels={}, taints=[],
        ).removeprefix("#cloud-config\n")
    )  # fmt: skip
    script = next(f["content"] for f in doc["write_files"] if f["path"] == cloudinit.JOIN_SCRIPT)
    short = machines.lab_join_script(script)
    assert cloudinit.join_jitter_seconds(script) == 600
    assert cloudinit.join_jitter_seconds(short) == machines.LAB_JOIN_JITTER_S
    changed = [(a, b) for a, b in zip(script.splitlines(), short.splitlines(), strict=True) if a != b]
    assert len(changed) == 1 and "shuf" in changed[0][0]
    with pytest.raises(lab.LabError, match="no jitter"):
        machines.lab_join_script("#!/bin/sh\nsystemctl enable --now kubelet\n")


def test_runs_as_root() -> None:
    assert os.geteuid() == 0, "the lab tests need root; CI runs as root"


def test_layouts_of_every_size_are_routable() -> None:
    for n in (1, 2, 4, 8, 12):
        hosts, subnets, facts = fabric.layout(n)
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
    machine = {**kernel.KUBELET_KERNEL_TUNABLES, "kernel/panic": 1, "kernel/panic_on_oops": 0}
    for key, value in machine.items():
        (sysctl / key).parent.mkdir(parents=True, exist_ok=True)
        (sysctl / key).write_text(f"{value}\n")
    kernel.set_kernel_for_kubelets(state, sysctl)
    assert {k: int((sysctl / k).read_text()) for k in machine} == kernel.KUBELET_KERNEL_TUNABLES
    kernel.set_kernel_for_kubelets(state, sysctl)  # again (a retried up): what the machine had stays saved
    removed: list[str] = []
    kernel.restore_kernel(state, removed, sysctl)
    assert {k: int((sysctl / k).read_text()) for k in machine} == machine
    assert sorted(removed) == ["kernel kernel.panic=1 restored", "kernel kernel.panic_on_oops=0 restored"]
    assert not (state / kernel.KERNEL_SAVED).exists()


def test_the_inotify_limit_is_raised_for_the_hosts_and_never_lowered(tmp_path: Path) -> None:
    limit = tmp_path / "max_user_instances"
    limit.write_text("128\n")
    kernel.ensure_inotify_instances(16, limit)  # 16 booted hosts hold more than 128 (134 measured)
    assert int(limit.read_text()) == 256 + kernel.INOTIFY_INSTANCES_PER_HOST * 16
    limit.write_text("100000\n")
    kernel.ensure_inotify_instances(16, limit)
    assert limit.read_text() == "100000\n"
