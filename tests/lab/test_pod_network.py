"""Pods on VNet IPs on the real lab: the node's CNI from instance metadata, pods across nodes, accounting,
exhaustion and leaks, a reboot, and per-pod egress limits measured with iperf3.

Two GPU nodes of the flagship's pool, converged with node_software (the CNI plugins, our boot unit
and our shaping plugin) and the iptables accounting. Pods are network namespaces on the nodes with
the CNI chain run as a container runtime runs it (superkube/lab/cnirun.py, copied to each node):
these tests drive CNI calls directly (an ADD past the last IP, 500 ADD/DEL cycles, a reboot, a
hand-written conflist) or measure the chain alone. Pods through kubelet and containerd, across two
nodes and under the egress annotation, are tests/lab/test_running_nodes.py's. Runs in file order
on one lab.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from superkube.harness import build
from superkube.lab import hosts as lab
from superkube.lab import machines
from superkube.lab.state import Lab
from superkube.model import rates
from tests.lab.conftest import CNIRUN, Labs, counters, deliver, put_cnirun, sh

CONFLIST = "/etc/cni/net.d/10-superkube.conflist"
ALLOCATIONS = "/run/superkube/cni/networks/superkube"
NODES = ("gpu-1", "gpu-2")


@pytest.fixture(scope="module")
def net(labs: Labs, pod_network: Lab) -> Lab:
    labs.converge(pod_network, tags="node_software,iptables_accounting,iptables_exporter")
    put_cnirun(pod_network, NODES)
    sh(pod_network, "internet", "iperf3 -s -D -p 5201 && iperf3 -s -D -p 5202")
    return pod_network


@pytest.fixture(autouse=True)
def no_pods_left(net: Lab) -> Iterator[None]:
    """A failed test's pods would use up the node's IPs for the next one: DEL whatever is left."""
    yield
    for host in NODES:
        sh(net, host, f"for pod in $(ip netns list | cut -d' ' -f1); do {CNIRUN} del $pod || true; done")


def add(fleet_: Lab, host: str, pod: str, extra: str = "") -> dict[str, Any]:
    return json.loads(sh(fleet_, host, f"{CNIRUN} add {pod} {extra}"))


def pod_ip(result: dict[str, Any]) -> str:
    return str(result["ips"][0]["address"].split("/")[0])


def iperf(fleet_: Lab, host: str, pod: str, seconds: int = 5, port: int = 5201, size: str = "") -> float:
    """bits/s the internet host received from the pod."""
    target = fleet_.host("internet").address
    how = f"-n {size}" if size else f"-t {seconds}"
    out = json.loads(sh(fleet_, host, f"ip netns exec {pod} iperf3 -c {target} -p {port} {how} -J"))
    return float(out["end"]["sum_received"]["bits_per_second"])


LISTENER = (
    "import socket; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
    "s.bind(('0.0.0.0', 7000)); s.listen(); c, a = s.accept(); print(a[0], c.recv(64).decode(), flush=True)"
)


def listen(fleet_: Lab, host: str, pod: str) -> None:
    """One TCP connection's peer address and first line, written to /root/peer on `host`."""
    inside = f"ip netns exec {pod} " if pod else ""
    sh(fleet_, host, f'rm -f /root/peer; (timeout 30 {inside}python3 -c "{LISTENER}" > /root/peer 2>&1 &)')
    for _ in range(100):
        if ":7000 " in sh(fleet_, host, f"{inside}ss -ltnH"):
            return
    raise AssertionError(f"no listener on {host} {pod}")


def heard(fleet_: Lab, host: str) -> list[str]:
    return sh(
        fleet_, host, "for i in $(seq 50); do [ -s /root/peer ] && break; sleep 0.1; done; cat /root/peer"
    ).split()


def state(fleet_: Lab, host: str) -> dict[str, str]:
    """What a pod leaves on a node if it leaks: links, routes, namespaces, allocations, rules, qdiscs."""
    return {
        "links": sh(fleet_, host, "ip -o link show | awk -F': ' '{print $2}' | sort"),
        "routes": sh(fleet_, host, "ip route show | sort"),
        "netns": sh(fleet_, host, "ip netns list | sort"),
        "allocations": sh(
            fleet_, host, f"ls {ALLOCATIONS} 2>/dev/null | grep -v -e lock -e last_reserved || true"
        ),
        "iptables": sh(fleet_, host, "iptables-save | grep -v -e '^#' -e '^:' | sort"),
        "nat-chains": sh(fleet_, host, "iptables-save -t nat | grep '^:' | cut -d' ' -f1 | sort"),
        "qdiscs": sh(fleet_, host, "tc qdisc show | grep -v noqueue | sort"),
    }


def test_nodes_run_the_containerd_and_runc_pinned_with_kubernetes(net: Lab) -> None:
    """Not the distribution's containerd 1.x: the release file's containerd 2.x and runc, from the
    lab's build, running under the role's unit and configuration."""
    runtime = build.release()["runtime"]
    containerd = f"v{runtime['containerd']['version']}"
    for host in NODES:
        assert sh(net, host, "systemctl is-active containerd").strip() == "active"
        said = sh(net, host, "ctr version")  # the client's version and the running daemon's
        assert said.count(containerd) == 2, said
        assert f"runc version {runtime['runc']['version']}" in sh(net, host, "runc --version")
        assert "/usr/local/bin/runc" in sh(net, host, "cat /etc/containerd/config.toml")
        assert sh(net, host, "dpkg-query -W -f='${Status}' containerd 2>/dev/null || true") == ""


def test_each_node_writes_its_cni_network_from_instance_metadata(net: Lab) -> None:
    for name in NODES:
        host = net.host(name)
        conf = json.loads(sh(net, name, f"cat {CONFLIST}"))
        assert [p["type"] for p in conf["plugins"]] == [
            "ptp",
            "superkube-bandwidth",
            "superkube-pod-accounting",
            "portmap",
        ]
        (ranges,) = conf["plugins"][0]["ipam"]["ranges"]
        listed = set()
        for r in ranges:
            first, last = (
                int.from_bytes(bytes(map(int, r[k].split("."))), "big") for k in ("rangeStart", "rangeEnd")
            )
            listed |= {".".join(str(b) for b in n.to_bytes(4, "big")) for n in range(first, last + 1)}
            assert r["gateway"] == host.address
        # exactly the NIC's secondary IPs, as many as the plan's pod-NNN IP configurations
        assert listed == set(host.secondary)
        assert len(host.secondary) == net.pools[host.pool]["secondary_ips"] == 7
        # the flagship's GPU pool sets no default limit: the plan's tags say so and the node agrees
        assert "superkube-egress-limit" not in net.pools[host.pool]["tags"]
        assert "defaultEgressRate" not in conf["plugins"][1]
        journal = sh(net, name, "journalctl -b -u superkube-cni-config -o cat --no-pager")
        assert f"7 pod IPs in {conf['plugins'][0]['ipam']['ranges'][0][0]['subnet']}" in journal
        sh(net, name, "systemd-analyze verify /etc/systemd/system/superkube-cni-config.service")


def test_metadata_needs_its_header_and_a_bad_answer_changes_no_config(net: Lab) -> None:
    url = "http://169.254.169.254/metadata/instance/network?api-version=2021-02-01"
    assert sh(net, "gpu-1", f"curl -s -o /dev/null -w '%{{http_code}}' {url}") == "400"
    doc = json.loads(sh(net, "gpu-1", f"curl -s -H Metadata:true {url}"))
    assert doc["interface"][0]["ipv4"]["ipAddress"][0]["privateIpAddress"] == net.host("gpu-1").address
    before = sh(net, "gpu-1", f"sha256sum {CONFLIST}")
    for base in ("http://169.254.169.254/metadata/nothing", "http://169.254.169.254:81/metadata/instance"):
        proc = machines.ssh(
            net,
            net.host("gpu-1"),
            f"python3 /usr/local/lib/superkube/cni_config.py --tries 1 --metadata {base} --out {CONFLIST}",
        )
        assert proc.returncode == 1
        assert proc.stderr.count("\n") == 1 and "kept the previous one" in proc.stderr, proc.stderr
    assert sh(net, "gpu-1", f"sha256sum {CONFLIST}") == before
    assert sh(net, "gpu-1", "ls -A /etc/cni/net.d").split() == ["10-superkube.conflist"]


def test_a_pods_internet_bytes_count_as_internet_and_its_vnet_bytes_do_not(net: Lab) -> None:
    ip_a = pod_ip(add(net, "gpu-1", "acct-a"))
    ip_b = pod_ip(add(net, "gpu-2", "acct-b"))
    try:
        size = 20 * 2**20
        before = counters(net, "gpu-1")
        assert deliver(net, "gpu-1", "gpu-2", ip_b, size, pods=("acct-a", "acct-b")) == size
        between = counters(net, "gpu-1")
        assert between["internet-out"] - before["internet-out"] < 0.01 * size, "pod to pod is internal"
        internet = net.host("internet").address
        assert deliver(net, "gpu-1", "internet", internet, size, pods=("acct-a", "")) == size
        # every byte has reached the receiver, so the node's counter holds it once the exporter reads it
        deadline = time.monotonic() + 15
        while (counted := counters(net, "gpu-1")["internet-out"] - between["internet-out"]) < size:
            assert time.monotonic() < deadline, (
                f"the pod's upload counts as internet: {counted} of {size} bytes"
            )
            time.sleep(0.5)
        # and no more than was sent, with its TCP/IP headers
        assert counted <= size * 1.05 + 2**16, (counted, size)
        # it left with the pod's own VNet IP (in Azure the VNet's edge translates it, not the node)
        listen(net, "internet", "")
        sh(net, "gpu-1", f"echo out | ip netns exec acct-a nc -N -w 5 {net.host('internet').address} 7000")
        assert heard(net, "internet") == [ip_a, "out"]
    finally:
        sh(net, "gpu-1", f"{CNIRUN} del acct-a")
        sh(net, "gpu-2", f"{CNIRUN} del acct-b")


def test_a_pod_beyond_the_nodes_ips_fails_leaks_nothing_and_del_frees_its_ip(net: Lab) -> None:
    clean = state(net, "gpu-1")
    pods = [f"full-{i}" for i in range(7)]
    ips = [pod_ip(add(net, "gpu-1", pod)) for pod in pods]
    assert sorted(ips) == sorted(net.host("gpu-1").secondary)
    full = state(net, "gpu-1")
    proc = machines.ssh(net, net.host("gpu-1"), f"{CNIRUN} add one-too-many")
    assert proc.returncode == 1 and "no IP addresses available" in proc.stderr, proc.stderr
    assert state(net, "gpu-1") == full, "the failed pod left something behind"
    sh(net, "gpu-1", f"{CNIRUN} del full-3")
    assert pod_ip(add(net, "gpu-1", "one-more")) == ips[3], "DEL freed the IP for the next pod"
    for pod in [*pods[:3], *pods[4:], "one-more"]:
        sh(net, "gpu-1", f"{CNIRUN} del {pod}")
    assert state(net, "gpu-1") == clean


def test_500_add_del_cycles_leave_nothing_behind(net: Lab) -> None:
    # one shaped pod with a port mapping first: the shared chains portmap makes once are not a leak
    sh(net, "gpu-1", f"{CNIRUN} cycles 1 --egress 100M --port 8080:80")
    clean = state(net, "gpu-1")
    assert "CNI-HOSTPORT-DNAT" in clean["nat-chains"]
    out = json.loads(
        sh(net, "gpu-1", f"{CNIRUN} cycles 500 --egress 100M --port 8080:80 --alternate", timeout=600)
    )
    assert out["cycles"] == 500
    assert state(net, "gpu-1") == clean


def test_a_reboot_releases_every_allocation_and_rewrites_the_config(net: Lab) -> None:
    for i in range(3):
        add(net, "gpu-1", f"before-{i}")
    assert len(state(net, "gpu-1")["allocations"].split()) == 3
    lab.stop_host("gpu-1")
    lab.start_host("gpu-1")
    # pods end with the boot, and so do their IPs (host-local's state is under /run)
    assert state(net, "gpu-1")["allocations"] == ""
    assert sh(net, "gpu-1", "ip netns list") == ""
    assert "7 pod IPs" in sh(net, "gpu-1", "journalctl -b -u superkube-cni-config -o cat --no-pager")
    ips = [pod_ip(add(net, "gpu-1", f"after-{i}")) for i in range(7)]
    assert sorted(ips) == sorted(net.host("gpu-1").secondary)
    for i in range(7):
        sh(net, "gpu-1", f"{CNIRUN} del after-{i}")
    sh(net, "gpu-1", "rm -f /var/lib/cni/results/superkube-before-*")  # the old boot's runtime cache


@pytest.mark.parametrize("limit", ["10M", "100M", "1G"])
def test_an_egress_annotation_holds_the_pod_to_its_limit(net: Lab, limit: str) -> None:
    add(net, "gpu-1", "shaped", f"--egress {limit}")
    try:
        rate = iperf(net, "gpu-1", "shaped", seconds=5)
    finally:
        sh(net, "gpu-1", f"{CNIRUN} del shaped")
    assert 0.9 <= rate / rates.parse_rate(limit) <= 1.1, f"{limit}: {rate / 1e6:.1f} Mbit/s"


def test_an_unshaped_pod_beside_a_shaped_one_is_not_held_back(net: Lab) -> None:
    add(net, "gpu-1", "slow", "--egress 10M")
    add(net, "gpu-1", "free")
    internet = net.host("internet").address
    try:
        both = sh(
            net,
            "gpu-1",
            f"(ip netns exec slow iperf3 -c {internet} -p 5202 -t 5 -J > /root/slow.json &) ; "
            f"ip netns exec free iperf3 -c {internet} -p 5201 -t 5 -J > /root/free.json; sleep 1; "
            "cat /root/slow.json; echo '=====' ; cat /root/free.json",
        )
        slow, free = (
            json.loads(part)["end"]["sum_received"]["bits_per_second"] for part in both.split("=====")
        )
        node = json.loads(sh(net, "gpu-1", f"iperf3 -c {internet} -t 5 -J"))["end"]["sum_received"][
            "bits_per_second"
        ]
    finally:
        sh(net, "gpu-1", f"{CNIRUN} del slow; {CNIRUN} del free")
    assert 0.9 <= slow / 1e7 <= 1.1
    assert free > 100 * 1e7 and free > 0.5 * node, (free, node)


def test_the_pools_default_limit_holds_a_pod_that_asks_for_none(net: Lab) -> None:
    conf = json.loads(sh(net, "gpu-1", f"cat {CONFLIST}"))
    conf["plugins"][1]["defaultEgressRate"] = 50_000_000  # as the pool's egress_limit: 50M would write it
    machines.put(net, "gpu-1", "/root/cni/default.conflist", json.dumps(conf))
    add(net, "gpu-1", "plain", "--conflist /root/cni/default.conflist")
    try:
        rate = iperf(net, "gpu-1", "plain", seconds=5)
    finally:
        sh(net, "gpu-1", f"{CNIRUN} del plain --conflist /root/cni/default.conflist")
    assert 0.9 <= rate / 5e7 <= 1.1, rate
