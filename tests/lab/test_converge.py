"""`superkube converge` on the real lab: the fault case, accounting and the NAT path (that a second
run changes nothing is test_split_control_plane's, on every role, after nodes joined and members failed).

Runs in file order, first on the control plane's lab: the fault test is the lab's first converge, and
with its retry the one every later module of that lab shares.
"""

from __future__ import annotations

import json
import threading

from typer.testing import CliRunner

from superkube.cli import app
from superkube.cluster.kube import NODE_EXPORTER_PORT
from superkube.fleet import converge as runner
from superkube.lab import hosts as lab
from superkube.lab.state import Lab
from tests.lab.conftest import Labs, counters, sh

STOPPED = ("cpu-1", "gpu-2")  # node hosts: the control plane converges whole beside them


def test_two_hosts_stopped_mid_fleet_then_retried(labs: Labs, fleet: Lab) -> None:
    stopper: list[threading.Thread] = []

    def on_update(hosts: dict[str, runner.HostResult]) -> None:
        # once the run is under way (facts gathered somewhere), power two hosts off
        if not stopper and any(h.ok >= 2 for h in hosts.values()):
            t = threading.Thread(target=lambda: [lab.stop_host(name) for name in STOPPED])
            stopper.append(t)
            t.start()

    first = runner.converge(fleet.inventory, on_update=on_update)
    stopper[0].join()
    assert not first.ok
    why = {name: (h.task, h.message) for name, h in first.hosts.items() if not h.healthy}
    assert first.failed_hosts == sorted(STOPPED), why
    for name, h in first.hosts.items():
        if name not in STOPPED:
            assert h.healthy and h.changed > 0, (name, h)
    assert runner.retry_file(fleet.inventory).read_text().split() == sorted(STOPPED)

    # while they are down, the CLI names the two and exits non-zero
    result = CliRunner().invoke(app, ["converge", "--limit", ",".join(STOPPED)])
    assert result.exit_code == 1
    assert all(f"{name} unreachable" in result.stdout for name in STOPPED), result.stdout

    for name in STOPPED:
        lab.start_host(name)
    retried = CliRunner().invoke(app, ["converge", "--retry", "--output", "json"])
    assert retried.exit_code == 0, retried.stdout
    summary = json.loads(retried.stdout)
    assert sorted(summary["hosts"]) == sorted(STOPPED) and summary["ok"]
    assert not runner.retry_file(fleet.inventory).exists()
    labs.retried(
        fleet,
        first,
        runner.ConvergeResult(
            hosts={name: runner.HostResult(**h) for name, h in summary["hosts"].items()},
            seconds=summary["seconds"],
            status=summary["status"],
            playbook=summary["playbook"],
        ),
    )
    # nothing half-applied: the rules are whole and hooked, the exporter answers
    for name in STOPPED:
        assert "SUPERKUBE-ACCT-IN" in sh(fleet, name, "iptables -t mangle -S INPUT")
        assert sh(
            fleet, name, "systemctl is-active superkube-iptables@accounting superkube-iptables-exporter"
        ).split() == ["active", "active"]


def test_rules_come_back_at_boot_without_a_converge(fleet: Lab) -> None:
    for name in ("gpu-2", "nat"):
        lab.stop_host(name)
        lab.start_host(name)
    booted = Lab.load()
    assert booted is not None
    for name in ("gpu-2", "nat"):
        hooks = sh(booted, name, "iptables -t mangle -S INPUT; iptables -t mangle -S OUTPUT")
        assert "-j SUPERKUBE-ACCT-IN" in hooks and "-j SUPERKUBE-ACCT-OUT" in hooks
        assert "traffic=internet-out" in sh(booted, name, "iptables -t mangle -S SUPERKUBE-ACCT-OUT")
    assert "-j SUPERKUBE-NAT-POST" in sh(booted, "nat", "iptables -t nat -S POSTROUTING")
    assert sh(booted, "nat", "sysctl -n net.ipv4.ip_forward").strip() == "1"


def test_internet_traffic_is_counted_and_internal_traffic_is_not(fleet: Lab) -> None:
    internet = fleet.host("internet").address
    peer = fleet.host("cpu-1").address
    before = counters(fleet, "gpu-1")
    assert set(before) == {"internet-in", "internet-out"}
    assert (
        sh(
            fleet,
            "gpu-1",
            f"curl -s -m 5 -o /dev/null -w '%{{http_code}}' http://{peer}:{NODE_EXPORTER_PORT}/metrics",
        )
        == "200"
    )
    internal = counters(fleet, "gpu-1")
    assert internal == before, "node-to-node traffic is internal"
    assert (
        sh(
            fleet,
            "gpu-1",
            f"curl -s -m 5 -o /dev/null -w '%{{http_code}}' http://{internet}:{NODE_EXPORTER_PORT}/metrics",
        )
        == "200"
    )
    after = counters(fleet, "gpu-1")
    assert after["internet-out"] > before["internet-out"]
    assert after["internet-in"] > before["internet-in"] + 10_000, (
        "the response body came in from the internet"
    )
