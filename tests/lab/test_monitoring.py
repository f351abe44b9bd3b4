"""Monitoring on the real lab: Prometheus shards (hashmod) remote-writing to VictoriaMetrics.

The monitoring role on the lab's monitoring host runs two Prometheus shards and the store, scraping
the two GPU nodes' node-exporter and iptables exporter through the drop rules of
superkube.cluster.monitoring. Queries go to the shards and the store over HTTP from the monitoring host.
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import quote

import pytest
import yaml

from superkube.cluster.kube import IPTABLES_EXPORTER_PORT, NODE_EXPORTER_PORT
from superkube.fleet import converge as runner
from superkube.lab.state import Lab
from tests.lab.conftest import Labs, counters, deliver, sh

ROLE = yaml.safe_load((runner.PLAYBOOKS / "roles" / "monitoring" / "defaults" / "main.yml").read_text())
HOST = "monitoring-1"
SHARDS = tuple(ROLE["monitoring_prometheus_port"] + i for i in range(ROLE["monitoring_lab_shards"]))
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
    return {f"{fleet_.host(n).address}:{port}" for n in NODES for port in (NODE, IPTABLES)}


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
