"""Monitoring on the real lab: Prometheus shards (hashmod) remote-writing to VictoriaMetrics.

The monitoring role on the lab's monitoring host runs two Prometheus shards and the store, scraping
the two GPU nodes' node-exporter and iptables exporter through the drop rules of
superkube.cluster.monitoring. Queries go to the shards and the store over HTTP from the monitoring host,
and through `superkube usage`, the command a researcher runs, for each pod's and namespace's traffic
(pods made on the nodes by the lab's CNI runner, superkube/lab/cnirun.py, through the node's chain).
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml

from superkube.cluster import dashboards
from superkube.cluster.kube import IPTABLES_EXPORTER_PORT, NODE_EXPORTER_PORT
from superkube.fleet import converge as runner
from superkube.fleet.usage import TRAFFIC
from superkube.lab.inventory import LAB_SHARDS
from superkube.lab.state import Lab
from tests.lab.conftest import CNIRUN, Labs, counters, deliver, panels_on_the_lab, put_cnirun, sh

ROLE = yaml.safe_load((runner.PLAYBOOKS / "roles" / "monitoring" / "defaults" / "main.yml").read_text())
HOST = "monitoring-1"
SHARDS = tuple(ROLE["monitoring_prometheus_port"] + i for i in range(LAB_SHARDS))
STORE = ROLE["monitoring_store_port"]
NODES = ("gpu-1", "gpu-2")
NODE, IPTABLES = NODE_EXPORTER_PORT, IPTABLES_EXPORTER_PORT


def get(fleet_: Lab, url: str) -> Any:
    return json.loads(sh(fleet_, HOST, f"curl -sf '{url}'"))


def query(fleet_: Lab, port: int, expr: str) -> list[dict[str, Any]]:
    return list(
        get(fleet_, f"http://127.0.0.1:{port}/api/v1/query?query={quote(expr)}&nocache=1")["data"]["result"]
    )


def export(fleet_: Lab, match: str, since: float) -> list[dict[str, Any]]:
    """Raw samples the store holds for `match` since `since` (unix seconds)."""
    text = sh(
        fleet_,
        HOST,
        f"curl -sf 'http://127.0.0.1:{STORE}/api/v1/export?match[]={quote(match)}&start={int(since)}'",
    )
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def wait_for(check: Any, timeout: float = 60, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(1)


@pytest.fixture(scope="module")
def mon(labs: Labs, monitored: Lab) -> Lab:
    labs.converge(monitored, tags="node_software,iptables_accounting,iptables_exporter,monitoring")
    return monitored


def targets(fleet_: Lab) -> set[str]:
    """The nodes' exporters, and the monitoring pipeline itself: each shard's and the store's /metrics."""
    monitoring = fleet_.host(HOST).address
    return {f"{fleet_.host(n).address}:{port}" for n in NODES for port in (NODE, IPTABLES)} | {
        f"{monitoring}:{port}" for port in (*SHARDS, STORE)
    }


def test_every_target_is_up_in_exactly_one_shard_and_in_the_store(mon: Lab) -> None:
    def per_shard() -> list[set[str]] | None:
        seen = [{r["metric"]["instance"] for r in query(mon, port, "up == 1")} for port in SHARDS]
        return seen if set().union(*seen) == targets(mon) else None

    seen = wait_for(per_shard, what="every target up")
    assert not seen[0] & seen[1], "hashmod gives each target to one shard"
    wait_for(
        lambda: {r["metric"]["instance"] for r in query(mon, STORE, "up == 1")} == targets(mon),
        what="the store to hold every target's up",
    )
    shards = {r["metric"]["prometheus_shard"] for r in query(mon, STORE, "up")}
    assert shards == {str(i) for i, s in enumerate(seen) if s}
    # the units as systemd reads them (the template through an instance of it)
    sh(mon, HOST, "systemd-analyze verify /etc/systemd/system/superkube-victoria-metrics.service")
    sh(
        mon,
        HOST,
        "cp /etc/systemd/system/superkube-prometheus@.service /run/superkube-prometheus@0.service"
        " && systemd-analyze verify /run/superkube-prometheus@0.service",
    )


def test_the_accounting_counter_in_the_store_grows_by_the_bytes_sent(mon: Lab) -> None:
    node = mon.host("gpu-1").address
    expr = f'sum(iptables_rule_bytes_total{{traffic="internet-out", pod="", instance="{node}:{IPTABLES}"}})'

    def value() -> float:
        result = query(mon, STORE, expr)
        return float(result[0]["value"][1]) if result else -1.0

    wait_for(lambda: value() >= 0, what="the counter in the store")
    before = value()
    size = 8 * 2**20
    internet = mon.host("internet").address
    assert deliver(mon, "gpu-1", "internet", internet, size) == size
    try:
        wait_for(lambda: value() >= before + size, timeout=60, what="the bytes to reach the store")
    except AssertionError as e:
        # say where the bytes stopped: at the node's counter, in the shard, or on the way to the store
        at_node = counters(mon, "gpu-1").get("internet-out")
        in_shards = [query(mon, port, expr) for port in SHARDS]
        raise AssertionError(
            f"{e}: before {before:.0f} + sent {size}; store now {value():.0f}, node's exporter {at_node}, "
            f"shards {in_shards}"
        ) from None
    # and no more than was sent, with its TCP/IP headers
    assert value() <= before + size * 1.05 + 2**16, (before, size, value())


# Pods in two namespaces, as the runtime names them: sandbox -> (node, namespace, pod)
PODS = {
    "use-a0": ("gpu-1", "team-a", "trainer-0"),
    "use-a1": ("gpu-2", "team-a", "trainer-1"),
    "use-b0": ("gpu-2", "team-b", "loader-0"),
}
# Who sends to whom: (client sandbox, server sandbox or "internet", datagrams, payload bytes). Each
# kind of traffic of every pod is non-zero: internet both ways, across nodes and within one node.
FLOWS = (
    ("use-a0", "internet", 1500, 1200),
    ("use-a1", "internet", 1000, 1000),
    ("use-b0", "internet", 600, 1400),
    ("use-a0", "use-b0", 1000, 900),  # gpu-1 to gpu-2, team-a to team-b
    ("use-b0", "use-a1", 800, 1100),  # within gpu-2, team-b to team-a
)
IP_UDP = 28  # an IPv4 header without options and a UDP header: what iptables counts beyond the payload
# Request and answer over UDP, one datagram in flight, so no queue between the pods overflows and every
# datagram is counted where it was sent and where it arrived. Each side tallies the IP bytes it sent and
# received (payload + IP_UDP); a datagram sent again after a timeout is tallied again, as it is counted.
_SERVER = """import json, socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", {port}))
s.settimeout(20)
tally = {{"sent": 0, "received": 0}}
try:
    while True:
        data, peer = s.recvfrom(65536)
        tally["received"] += len(data) + {ip_udp}
        s.sendto(data[:4], peer)
        tally["sent"] += 4 + {ip_udp}
        if int.from_bytes(data[:4], "big") == {count} - 1:
            break
except TimeoutError:
    pass
print(json.dumps(tally), flush=True)"""
_CLIENT = """import json, socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect(("{ip}", {port}))
s.settimeout(0.5)
tally = {{"sent": 0, "received": 0}}
for seq in range({count}):
    data = seq.to_bytes(4, "big") + bytes({size} - 4)
    for _ in range(20):
        s.send(data)
        tally["sent"] += len(data) + {ip_udp}
        try:
            while (answer := s.recv(64)) != data[:4]:
                tally["received"] += len(answer) + {ip_udp}
            tally["received"] += len(answer) + {ip_udp}
            break
        except TimeoutError:
            continue
    else:
        raise SystemExit(f"no answer to datagram {{seq}}")
print(json.dumps(tally))"""


def exchange(
    fleet_: Lab, client: str, server: str, count: int, size: int, port: int
) -> tuple[dict[str, int], dict[str, int]]:
    """`count` datagrams of `size` bytes from pod `client` to `server` (a pod, or the internet host) and
    an answer of 4 bytes to each: what each side tallied, {"sent": IP bytes, "received": IP bytes}."""
    host, into = (server, "") if server == "internet" else (PODS[server][0], f"ip netns exec {server} ")
    ip = fleet_.host("internet").address if server == "internet" else pod_address(fleet_, server)
    serve = shlex.quote(_SERVER.format(port=port, count=count, ip_udp=IP_UDP))
    sh(
        fleet_,
        host,
        f"rm -f /root/udp-{port}; (timeout 120 {into}python3 -c {serve} > /root/udp-{port} 2>&1 &)",
    )
    wait_for(lambda: f":{port} " in sh(fleet_, host, f"{into}ss -lunH"), timeout=10, what="the server's port")
    send = shlex.quote(_CLIENT.format(ip=ip, port=port, count=count, size=size, ip_udp=IP_UDP))
    sent = json.loads(sh(fleet_, PODS[client][0], f"ip netns exec {client} python3 -c {send}", timeout=120))
    answered = wait_for(
        lambda: sh(fleet_, host, f"cat /root/udp-{port}").strip(), timeout=30, what="the tally"
    )
    return sent, json.loads(answered)


def pod_address(fleet_: Lab, sandbox: str) -> str:
    node = PODS[sandbox][0]
    return sh(fleet_, node, f"ip -n {sandbox} -4 -o addr show dev eth0").split()[3].split("/")[0]


def pod_counters(fleet_: Lab, host: str) -> dict[tuple[str, str, str], float]:
    """The node exporter's per-pod byte counters: {(namespace, pod, traffic): bytes}."""
    text = sh(fleet_, host, f"curl -sf -m 5 http://127.0.0.1:{IPTABLES}/metrics")
    out = {}
    for line in text.splitlines():
        if line.startswith("iptables_rule_bytes_total{") and 'pod="' in line:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            out[labels["namespace"], labels["pod"], labels["traffic"]] = float(line.rsplit(" ", 1)[1])
    return out


def usage(*args: str) -> dict[str, Any]:
    """`superkube usage -o json` as a researcher runs it beside the running lab: no --store, so it finds
    the lab's store through the fleet's current inventory and reaches it through its ProxyCommand."""
    env = {k: v for k, v in os.environ.items() if k != runner.INVENTORY_ENV}
    command = [str(Path(sys.executable).with_name("superkube")), "usage", "-o", "json", "--top", "100", *args]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def since(start: float) -> str:
    """A window of whole seconds back to `start`: the test's own traffic, none of an earlier run's."""
    return f"{math.ceil(time.time() - start) + 1}s"


def close(counted: float, sent: float) -> bool:
    """Within 2 % of what was sent (the tallies are exact IP bytes; the slack is for a stray packet)."""
    return abs(counted - sent) <= 0.02 * sent


def test_each_pods_and_namespaces_bytes_are_what_they_sent_and_received(mon: Lab) -> None:
    """Pods in two namespaces trade datagrams with the internet host and with each other; the nodes'
    per-pod counters and `superkube usage` (from the store) show each pod's and each namespace's IP
    bytes; a pod's DEL takes its series off its node's exporter, and out of the store's answers."""
    put_cnirun(mon, NODES)
    names = {pod for _, _, pod in PODS.values()}
    added = time.time()
    try:
        for sandbox, (node, namespace, pod) in PODS.items():
            sh(mon, node, f"{CNIRUN} add {sandbox} --namespace {namespace} --name {pod}")
        # the store holds each new series at 0 before a byte moves: the first sample a window's
        # increase() starts from (a series first seen already large would be counted from there)
        series = f'iptables_rule_bytes_total{{namespace=~"team-a|team-b", instance=~".*:{IPTABLES}"}}'
        wait_for(
            lambda: len(query(mon, STORE, series)) == 4 * len(PODS), what="the pods' series in the store"
        )

        expected: Counter[tuple[str, str, str]] = Counter()  # (namespace, pod, traffic) -> IP bytes
        for n, (client, server, count, size) in enumerate(FLOWS):
            sent, answered = exchange(mon, client, server, count, size, port=7200 + n)
            kind = "internet" if server == "internet" else "internal"
            _, namespace, pod = PODS[client]
            expected[namespace, pod, f"{kind}-out"] += sent["sent"]
            expected[namespace, pod, f"{kind}-in"] += sent["received"]
            if server != "internet":
                _, namespace, pod = PODS[server]
                expected[namespace, pod, "internal-in"] += answered["received"]
                expected[namespace, pod, "internal-out"] += answered["sent"]

        # at the nodes: each pod's four counters, labelled with its namespace and name
        at_nodes: dict[tuple[str, str, str], float] = {}
        for node in NODES:
            at_nodes |= {k: v for k, v in pod_counters(mon, node).items() if k[1] in names}
        assert set(at_nodes) == set(expected), sorted(set(at_nodes) ^ set(expected))
        off = {k: (at_nodes[k], sent) for k, sent in expected.items() if not close(at_nodes[k], sent)}
        assert not off, f"counted vs sent: {off}"

        # in the store, as the command shows it: each pod, and each namespace (its pods summed), once
        # the samples scraped after the last datagram have reached the store
        for by in ("pod", "namespace"):
            want: Counter[tuple[str, str, str]] = Counter()
            for (namespace, pod, traffic), sent in expected.items():
                want[namespace, pod if by == "pod" else "", traffic] += sent
            deadline = time.monotonic() + 60
            while True:
                shown = {
                    (row["namespace"], row.get("pod", ""), traffic): float(row[traffic.replace("-", "_")])
                    for row in usage("--by", by, "--window", since(added))["rows"]
                    if row["namespace"] in ("team-a", "team-b")
                    for traffic in TRAFFIC
                }
                arrived = shown.keys() == want.keys() and all(shown[k] >= 0.98 * want[k] for k in want)
                if arrived or time.monotonic() > deadline:
                    break
                time.sleep(2)
            off = {k: (shown.get(k), sent) for k, sent in want.items() if not close(shown.get(k, 0), sent)}
            assert shown.keys() == want.keys() and not off, f"usage --by {by}: shown vs sent: {off}"
    finally:
        for sandbox, (node, _, _) in PODS.items():
            sh(mon, node, f"{CNIRUN} del {sandbox}")
    # a deleted pod's series are gone from its node's exporter, and the node's own stay; the shards
    # mark them stale, and the store stops answering for them
    for node in NODES:
        assert not [k for k in pod_counters(mon, node) if k[1] in names]
        assert counters(mon, node)["internet-out"] > 0
    wait_for(lambda: query(mon, STORE, series) == [], timeout=30, what="the pods' series to go stale")


def test_a_dropped_series_is_gone_and_its_siblings_stay(mon: Lab) -> None:
    node = mon.host("gpu-1").address
    raw = sh(mon, HOST, f"curl -sf http://{node}:{NODE}/metrics")
    assert "node_scrape_collector_duration_seconds" in raw, "the exporter does export it"
    raw_iptables = sh(mon, HOST, f"curl -sf http://{node}:{IPTABLES}/metrics")
    assert "iptables_rule_packets_total" in raw_iptables
    wait_for(
        lambda: query(mon, STORE, f'node_cpu_seconds_total{{instance="{node}:{NODE}"}}'), what="node series"
    )
    assert query(mon, STORE, f'node_scrape_collector_duration_seconds{{instance="{node}:{NODE}"}}') == []
    assert query(mon, STORE, f'node_scrape_collector_success{{instance="{node}:{NODE}"}}') == []
    assert query(mon, STORE, f'node_memory_MemTotal_bytes{{instance="{node}:{NODE}"}}')
    assert query(mon, STORE, f'iptables_rule_packets_total{{instance="{node}:{IPTABLES}"}}') == []
    assert query(mon, STORE, f'iptables_rule_bytes_total{{instance="{node}:{IPTABLES}"}}')


def test_killing_one_shard_stales_only_its_targets_and_the_store_keeps_what_it_had(mon: Lab) -> None:
    owned = [{r["metric"]["instance"] for r in query(mon, port, "up")} for port in SHARDS]
    victim = 0 if owned[0] else 1
    lost, kept = owned[victim], owned[1 - victim]
    start = time.time() - 60
    sh(
        mon,
        HOST,
        f"systemctl kill -s KILL superkube-prometheus@{victim} && systemctl stop superkube-prometheus@{victim}",
    )
    killed = time.time()
    try:
        time.sleep(20)  # four scrape intervals

        def newest(instance: str) -> float:
            series = export(mon, f'up{{instance="{instance}"}}', start)
            return max((t for s in series for t in s["timestamps"]), default=0) / 1000

        for instance in lost:
            assert newest(instance) < killed + 1, f"{instance} still gets samples"
            assert newest(instance) > start, f"{instance}'s earlier samples are gone from the store"
        for instance in kept:
            assert newest(instance) > killed + 10, f"{instance} lost samples with the other shard"
    finally:
        sh(mon, HOST, f"systemctl start superkube-prometheus@{victim}")


# what this lab shows: the network dashboard (pods here send known traffic) and the pipeline's own;
# the control-plane lab checks the rest (test_seeing_the_cluster), the team join among them
PANEL_BOARDS = {"superkube-network", "superkube-monitoring"}
ELSEWHERE = {"superkube-network/Traffic by team"}


def test_every_network_and_pipeline_panel_returns_data_from_the_store(mon: Lab) -> None:
    """Each query as Grafana sends it (a range query over the last hour) parses on a shard and, but
    for the LAB_EMPTY panels, returns series from the store; the pods' traffic came from the tests
    above (their series are stale now, and the hour still holds them)."""
    want = (
        {
            dashboards.key(board, p)
            for board in dashboards.boards()
            if board.uid in PANEL_BOARDS
            for p in board.panels()
        }
        - set(dashboards.LAB_EMPTY)
        - ELSEWHERE
    )
    got = panels_on_the_lab(mon, HOST, PANEL_BOARDS)
    assert not got["refused"], got["refused"]
    assert not want & set(got["empty"]), f"panels with no data on the lab: {sorted(want & set(got['empty']))}"
