"""`superkube converge` on the real lab: the fault case, accounting and the NAT path (that a second
run changes nothing is test_split_control_plane's, on every role, after nodes joined and members failed).

Runs in file order, first on the control plane's lab: the fault test is the lab's first converge, and
with its retry the one every later module of that lab shares.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import yaml
from typer.testing import CliRunner

from superkube.cli import app
from superkube.cluster import gang
from superkube.cluster.kube import NODE_EXPORTER_PORT
from superkube.fleet import converge as runner
from superkube.lab import hosts as lab
from superkube.lab.state import Lab
from tests.lab.conftest import Labs, counters, get, kubectl, ok, sh
from tests.lab.test_running_the_agents import wait_for

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


PROBE_NODE = "scheduling-probe"
PODGROUPS = gang.GANG_CRDS[0]


def _probe_node() -> dict[str, Any]:
    """A Node with room for pods and no kubelet behind it: what the scheduler needs to place a pod
    (binding it is the scheduler's whole part); nothing will run it."""
    room = {"cpu": "4", "memory": "8Gi", "pods": "10"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": PROBE_NODE, "labels": {"kubernetes.io/hostname": PROBE_NODE}},
        "status": {"capacity": room, "allocatable": room},
    }


def _probe_pod(name: str, fleet: Lab) -> str:
    """An ordinary pod (no pod group), for the probe node alone, tolerating the taints the node
    lifecycle controller gives a node whose kubelet never reports."""
    return yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": PROBE_NODE},
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "pause", "image": fleet.images["pause"]["ref"]}],
        },
    })  # fmt: skip


def _scheduled(fleet: Lab, name: str) -> str:
    """The node the scheduler bound the pod to, once it has."""
    return str(
        wait_for(
            f"pod {name} scheduled",
            lambda: get(fleet, "pod", name, "-n", "default")["spec"].get("nodeName"),
            timeout=60,
        )
    )


def test_ordinary_pods_are_scheduled_before_the_layer_and_after_the_podgroup_crd_returns(fleet: Lab) -> None:
    """The one scheduler runs Coscheduling, whose informer waits for PodGroups: converge applies their
    CRD before any scheduler starts, so ordinary pods are placed on a cluster whose in-cluster layer
    is not applied yet; deleted, the CRD comes back with the next converge of the API servers."""
    assert kubectl(fleet, "get", "crd", PODGROUPS).returncode == 0  # converged, layer not applied
    assert kubectl(fleet, "get", "deployment", "-A", "-l", "app.kubernetes.io/part-of=superkube",
                   "-o", "name").stdout.strip() == ""  # fmt: skip
    first = next(h.name for h in fleet.hosts if h.group == "apiservers")
    ok(fleet, "create", "-f", "-", stdin=yaml.safe_dump(_probe_node()))
    try:
        ok(fleet, "create", "-f", "-", stdin=_probe_pod("before-layer", fleet))
        assert _scheduled(fleet, "before-layer") == PROBE_NODE

        ok(fleet, "delete", "crd", PODGROUPS, "--wait=true")
        again = runner.converge(fleet.inventory, tags="kube_apiserver", limit=first)
        assert again.ok, {n: (h.task, h.message) for n, h in again.hosts.items() if not h.healthy}
        assert again.hosts[first].changed > 0  # the CRD applied anew
        assert "Apply them (once per cluster)" in again.hosts[first].changed_tasks, again.hosts[first]
        crd = get(fleet, "crd", PODGROUPS)
        assert any(c["type"] == "Established" and c["status"] == "True" for c in crd["status"]["conditions"])
        ok(fleet, "create", "-f", "-", stdin=_probe_pod("after-crd-restored", fleet))
        assert _scheduled(fleet, "after-crd-restored") == PROBE_NODE
    finally:
        kubectl(fleet, "delete", "pod", "-n", "default", "before-layer", "after-crd-restored",
                "--force", "--grace-period=0", "--ignore-not-found")  # fmt: skip
        kubectl(fleet, "delete", "node", PROBE_NODE, "--ignore-not-found")


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
