"""One real lab for the lab tests: up once per session, down at the end, nothing left behind."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from superkube import lab
from superkube.kube import IPTABLES_EXPORTER_PORT

FLEET = "8"  # the cycle of groups: 2 GPU, 2 CPU, NAT host, one of each control-plane group
# the control plane, and one node of each kind plus the NAT host to join it
CONTROL_PLANE = "gpu_nodes=1,cpu_nodes=1,nat_host=1,etcd_main=5,etcd_events=3,apiservers=1"
POD_NETWORK = "gpu_nodes=2,monitoring=1"  # two nodes of one pool, Prometheus + store (+ hub client, internet)


class Labs:
    """One real lab at a time: a module asks for a shape; a different shape replaces the lab."""

    def __init__(self) -> None:
        self.shape: str | None = None
        self.current: lab.Lab | None = None

    def get(self, shape: str) -> lab.Lab:
        if shape != self.shape or self.current is None:
            lab.down()  # the previous shape, or a lab left by an interrupted run
            self.current = lab.up(shape, lambda what, fraction: None)
            self.shape = shape
        return self.current


@pytest.fixture(scope="session")
def labs() -> Iterator[Labs]:
    held = Labs()
    yield held
    in_lab = [pid for name in lab._lab_namespaces() for pid in lab._namespace_pids(name)]
    clients = lab._lab_clients(lab.STATE_DIR)
    lab.down()
    assert lab._leftovers() == []
    still = [pid for pid in in_lab + clients if lab.running(pid)]
    assert still == [], f"processes of the lab outlived lab down: {still}"


@pytest.fixture(scope="module")
def fleet(labs: Labs) -> lab.Lab:
    return labs.get(FLEET)


@pytest.fixture(scope="module")
def pod_network(labs: Labs) -> lab.Lab:
    return labs.get(POD_NETWORK)


@pytest.fixture(scope="module")
def monitored(labs: Labs) -> lab.Lab:
    return labs.get(POD_NETWORK)  # the same small lab: its nodes are what the monitoring host scrapes


@pytest.fixture(scope="module")
def control_plane(labs: Labs) -> lab.Lab:
    return labs.get(CONTROL_PLANE)


def sh(fleet: lab.Lab, host: str, command: str, timeout: float = 60) -> str:
    proc = lab.ssh(fleet, fleet.host(host), command, timeout=timeout)
    assert proc.returncode == 0, f"{host}: {command}: {proc.stderr}"
    return proc.stdout


def counters(fleet_: lab.Lab, host: str) -> dict[str, float]:
    text = sh(fleet_, host, f"curl -s -m 5 http://127.0.0.1:{IPTABLES_EXPORTER_PORT}/metrics")
    out = {}
    for m in re.finditer(r"^iptables_rule_bytes_total\{([^}]*)\} (\S+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        assert labels["cluster"] == "flagship" and labels["table"] == "mangle"
        out[labels["traffic"]] = float(m.group(2))
    assert "iptables_scrape_success 1.0" in text
    return out
