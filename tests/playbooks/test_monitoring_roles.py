"""The monitoring and metrics_store roles as a cluster's hosts get them, rendered offline by the roles'
own templates over the flagship's inventory: each Prometheus host's shard config passes promtool and
writes to a store host; each store host's units pass systemd-analyze and reach every store host; the
host services on the API-server hosts serve /metrics where the shards scrape them."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from superkube.cluster import kube, wiring
from superkube.plan.engine import Plan
from tests.cluster.test_prometheus import checkable, promtool

PARTS = ("vmstorage", "vminsert", "vmselect")


def hosts(engine: wiring.Wiring, group: str) -> list[wiring.PlanHost]:
    return [h for h in engine.hosts if h.group == group]


def test_each_prometheus_host_runs_its_shard_and_writes_to_a_store_host(
    engine: wiring.Wiring, flagship_plan: Plan, tmp_path: Path
) -> None:
    prometheus = hosts(engine, kube.MONITORING)
    stores = [str(ip) for ip in flagship_plan.addresses.metrics_store_ips]
    assert len(prometheus) == flagship_plan.spec.prometheus_shards == 8
    writes_to = set()
    for host in prometheus:
        (shard,) = engine.render("monitoring", host, ["monitoring_host_shards"])["monitoring_host_shards"]
        assert host.address == str(flagship_plan.addresses.prometheus_ips[shard])
        text = engine.template("monitoring", host, "prometheus.yml.j2", item=shard)
        config = yaml.safe_load(text)
        assert config["global"]["external_labels"]["prometheus_shard"] == str(shard)
        (write,) = config["remote_write"]
        store = re.fullmatch(
            rf"http://([\d.]+):{kube.VMINSERT_PORT}/insert/0/prometheus/api/v1/write", write["url"]
        )
        assert store and store.group(1) in stores, write["url"]
        writes_to.add(store.group(1))
        # the file as the role writes it, checked by promtool as the role's validate step does
        path = tmp_path / f"shard-{shard}.yml"
        path.write_text(yaml.safe_dump(checkable(config, tmp_path / "pki")))
        (tmp_path / "rules").mkdir(exist_ok=True)
        proc = promtool("check", "config", str(path))
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert writes_to == set(stores), "the shards spread their writes over every store host"


def test_each_store_hosts_units_pass_systemd_and_reach_every_store_host(
    engine: wiring.Wiring, flagship_plan: Plan, tmp_path: Path
) -> None:
    stores = hosts(engine, kube.METRICS_STORE)
    ips = sorted(str(ip) for ip in flagship_plan.addresses.metrics_store_ips)
    assert sorted(h.address for h in stores) == ips and len(ips) == 3
    for host in stores:
        for part in PARTS:
            unit = engine.template("metrics_store", host, "superkube-vm.service.j2", item=part)
            (exec_start,) = re.findall(r"^ExecStart=(\S+)(.*)$", unit, re.M)
            binary, flags = exec_start[0], exec_start[1].split()
            assert binary.endswith(f"/v1.104.0/{part}-prod")
            if part != "vmstorage":
                port = kube.VMSTORAGE_INSERT_PORT if part == "vminsert" else kube.VMSTORAGE_SELECT_PORT
                (nodes,) = [f.removeprefix("-storageNode=") for f in flags if f.startswith("-storageNode=")]
                assert sorted(nodes.split(",")) == [f"{ip}:{port}" for ip in ips]
                assert "-replicationFactor=2" in flags
            else:
                assert "RequiresMountsFor=/var/lib/superkube-metrics-store" in unit
            # systemd reads the unit as written; only the release's binary is swapped for one that is here
            path = tmp_path / f"superkube-{part}.service"
            path.write_text(unit.replace(binary, shutil.which("true") or "/bin/true"))
            proc = subprocess.run(
                ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60
            )
            problems = [line for line in proc.stderr.splitlines() if str(path.name) in line]
            assert proc.returncode == 0 and not problems, proc.stderr


def test_each_api_server_hosts_governor_and_publisher_serve_metrics_where_the_shards_scrape(
    engine: wiring.Wiring, flagship_plan: Plan, tmp_path: Path
) -> None:
    """The units the scale_governor and join_tokens roles write pass --metrics-port with superkube's
    port for each, from the inventory; the monitoring hosts' jobs scrape every API-server host there;
    systemd reads the units as written."""
    apiservers = hosts(engine, kube.APISERVERS)
    assert sorted(h.address for h in apiservers) == sorted(map(str, flagship_plan.addresses.apiserver_ips))
    monitoring_host = hosts(engine, kube.MONITORING)[0]
    (shard,) = engine.render("monitoring", monitoring_host, ["monitoring_host_shards"])[
        "monitoring_host_shards"
    ]
    config = yaml.safe_load(engine.template("monitoring", monitoring_host, "prometheus.yml.j2", item=shard))
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    for role, unit, job, port in (
        (
            "scale_governor",
            "superkube-scale-governor.service.j2",
            "scale-governor",
            kube.SCALE_GOVERNOR_METRICS_PORT,
        ),
        ("join_tokens", "superkube-join-tokens.service.j2", "join-tokens", kube.JOIN_TOKENS_METRICS_PORT),
    ):
        (static,) = jobs[job]["static_configs"]
        assert sorted(static["targets"]) == sorted(f"{h.address}:{port}" for h in apiservers)
        for host in apiservers:
            text = engine.template(role, host, unit)
            (exec_start,) = re.findall(r"^ExecStart=(.*)$", text, re.M)
            flags = exec_start.split()
            assert flags[flags.index("--metrics-port") + 1] == str(port), (role, host.name)
            assert flags[flags.index("--metrics-address") + 1] == "0.0.0.0"
        path = tmp_path / unit.removesuffix(".j2")
        path.write_text(text)
        proc = subprocess.run(
            ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60
        )
        problems = [line for line in proc.stderr.splitlines() if path.name in line]
        assert proc.returncode == 0 and not problems, proc.stderr


def test_the_pipelines_own_jobs_scrape_the_ports_its_parts_listen_on(
    engine: wiring.Wiring, flagship_plan: Plan
) -> None:
    """The `prometheus` job reaches every shard where the monitoring role has it listen, and the
    `metrics-store` job every store host's vminsert, vmselect and vmstorage where the metrics_store
    role has them listen: the ports are read from the roles as a host gets them."""
    monitoring_host = hosts(engine, kube.MONITORING)[0]
    (shard,) = engine.render("monitoring", monitoring_host, ["monitoring_host_shards"])[
        "monitoring_host_shards"
    ]
    config = yaml.safe_load(engine.template("monitoring", monitoring_host, "prometheus.yml.j2", item=shard))
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    listen = int(
        engine.render("monitoring", monitoring_host, ["monitoring_prometheus_port"])[
            "monitoring_prometheus_port"
        ]
    )
    (static,) = jobs["prometheus"]["static_configs"]
    assert sorted(static["targets"]) == sorted(
        f"{h.address}:{listen}" for h in hosts(engine, kube.MONITORING)
    )
    store = hosts(engine, kube.METRICS_STORE)[0]
    ports = engine.render("metrics_store", store, ["metrics_store_http_ports"])["metrics_store_http_ports"]
    (static,) = jobs["metrics-store"]["static_configs"]
    assert sorted(static["targets"]) == sorted(
        f"{h.address}:{int(ports[part])}" for h in hosts(engine, kube.METRICS_STORE) for part in PARTS
    )
    assert "cluster-autoscaler" in jobs and flagship_plan.spec.autoscaler_enabled
