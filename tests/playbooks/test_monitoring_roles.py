"""The monitoring and metrics_store roles as a cluster's hosts get them, rendered offline by the roles'
own templates over the flagship's inventory: each Prometheus host's shard config passes promtool and
writes to a store host; each store host's units pass systemd-analyze and reach every store host; the
host services on the API-server hosts serve /metrics where the shards scrape them; each monitoring
host's Grafana runs the checked release with the files `superkube monitoring render` writes."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from superkube.cli import app
from superkube.cluster import dashboards, kube, wiring
from superkube.cluster.kube import metrics_store_query_url
from superkube.lab.inventory import LAB_ROLE_VARS
from superkube.plan.engine import Plan
from tests.cluster.test_prometheus import checkable, promtool
from tests.conftest import ROOT

PARTS = ("vmstorage", "vminsert", "vmselect")
MONITORING_ROLE = wiring.PLAYBOOKS / "roles" / "monitoring"


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


# --- Grafana ---------------------------------------------------------------------------------------


def grafana_tasks() -> list[dict[str, Any]]:
    tasks: list[dict[str, Any]] = yaml.safe_load((MONITORING_ROLE / "tasks" / "grafana.yml").read_text())
    return tasks


def grafana_task(module: str) -> dict[str, Any]:
    (task,) = [t for t in grafana_tasks() if module in t]
    return task


def test_each_monitoring_hosts_grafana_unit_passes_systemd_and_runs_the_release_with_its_config(
    engine: wiring.Wiring, tmp_path: Path
) -> None:
    """The unit runs `grafana server` from the unpacked release with the role's grafana.ini, whose
    provisioning folder is where the dashboards' files go and whose data folder is the unit's state
    directory; anonymous access and reporting are off; systemd reads the unit as written."""
    # the role writes the configuration where the unit reads it
    written = {
        t["ansible.builtin.template"]["src"]: t["ansible.builtin.template"]["dest"]
        for t in grafana_tasks()
        if "ansible.builtin.template" in t
    }
    assert written == {
        "grafana.ini.j2": "{{ monitoring_grafana_config }}",
        "superkube-grafana.service.j2": "/etc/systemd/system/superkube-grafana.service",
    }
    for host in hosts(engine, kube.MONITORING):
        names = ["monitoring_grafana_home", "monitoring_grafana_config", "monitoring_grafana_data_dir"]
        got = engine.render("monitoring", host, names)
        home, config_path, data = (str(got[n]) for n in names)
        assert home == "/opt/superkube-grafana/v11.6.0"
        unit = engine.template("monitoring", host, "superkube-grafana.service.j2")
        (exec_start,) = re.findall(r"^ExecStart=(\S+)(.*)$", unit, re.M)
        binary, flags = exec_start[0], exec_start[1].split()
        assert binary == f"{home}/bin/grafana"
        assert flags == ["server", f"--homepath={home}", f"--config={config_path}"]
        assert re.findall(r"^User=(.*)$", unit, re.M) == ["grafana"]
        (state,) = re.findall(r"^StateDirectory=(.*)$", unit, re.M)
        assert data == f"/var/lib/{state}"

        config = configparser.ConfigParser()
        config.read_string(engine.template("monitoring", host, "grafana.ini.j2"))
        assert config["server"]["http_port"] == "3000"
        assert config["paths"]["provisioning"] == f"{dashboards.GRAFANA_DIR}/provisioning"
        assert config["paths"]["data"] == data
        assert config["analytics"]["reporting_enabled"] == "false"
        assert config["auth.anonymous"]["enabled"] == "false"
        # never Grafana's default first login: a password the role makes once per host, kept after
        assert config["security"]["admin_password"] == f"$__file{{{dashboards.GRAFANA_DIR}/admin-password}}"
        (made,) = [
            t["ansible.builtin.copy"] for t in grafana_tasks() if t["name"] == "Make Grafana's admin password"
        ]
        assert made["force"] is False and made["mode"] == "0640" and made["group"] == "grafana"

        # systemd reads the unit as written; only the release's binary is swapped for one that is here
        path = tmp_path / "superkube-grafana.service"
        path.write_text(unit.replace(binary, shutil.which("true") or "/bin/true"))
        proc = subprocess.run(
            ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60
        )
        problems = [line for line in proc.stderr.splitlines() if path.name in line]
        assert proc.returncode == 0 and not problems, proc.stderr


def test_each_monitoring_hosts_grafana_files_are_what_monitoring_render_writes(
    engine: wiring.Wiring, flagship_plan: Plan, tmp_path: Path
) -> None:
    """The dashboards and provisioning files the role copies under GRAFANA_DIR are, path for path and
    byte for byte, what `superkube monitoring render --stack flagship` writes under grafana/: the same
    dashboards, the same provider and a datasource at the flagship store's query URL."""
    out = tmp_path / "monitoring"
    result = CliRunner().invoke(
        app, ["monitoring", "render", "--stack", "flagship", "--project", str(ROOT), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    grafana = out / "grafana"
    rendered = {str(p.relative_to(grafana)): p.read_text() for p in grafana.rglob("*") if p.is_file()}
    assert len(rendered) == len(dashboards.boards()) + 2
    store = metrics_store_query_url(flagship_plan.spec, flagship_plan.addresses)
    first_store = flagship_plan.addresses.metrics_store_ips[0]
    assert store == f"http://{first_store}:{kube.VMSELECT_PORT}/select/0/prometheus"

    (copy,) = [t for t in grafana_tasks() if "ansible.builtin.copy" in t and "loop" in t]
    assert copy["loop"] == "{{ monitoring_grafana_files | dict2items }}"
    assert copy["ansible.builtin.copy"]["dest"] == "{{ monitoring_grafana_dir }}/{{ item.key }}"
    for host in hosts(engine, kube.MONITORING):
        got = engine.render(
            "monitoring",
            host,
            ["monitoring_grafana_files", "monitoring_grafana_dir", "monitoring_grafana_store_url"],
        )
        assert got["monitoring_grafana_dir"] == dashboards.GRAFANA_DIR
        assert got["monitoring_grafana_store_url"] == store
        assert got["monitoring_grafana_files"] == rendered, host.name
    (source,) = yaml.safe_load(rendered["provisioning/datasources/superkube.yml"])["datasources"]
    assert source["url"] == store and source["uid"] == dashboards.DATASOURCE_UID


def test_the_grafana_tarball_is_checked_against_the_sha256_published_beside_it(engine: wiring.Wiring) -> None:
    """get_url fetches the release's tarball for the host's architecture and checks it against the
    file Grafana publishes at the tarball's URL + .sha256 (as the Prometheus release is checked
    against its published checksums); the release is unpacked into its versioned folder."""
    fetch = grafana_task("ansible.builtin.get_url")["ansible.builtin.get_url"]
    assert fetch["url"] == "{{ monitoring_grafana_url }}"
    assert fetch["checksum"] == "{{ monitoring_grafana_checksum }}"
    unpack = grafana_task("ansible.builtin.unarchive")["ansible.builtin.unarchive"]
    assert unpack["dest"] == "{{ monitoring_grafana_home }}" and unpack["remote_src"] is True
    host = hosts(engine, kube.MONITORING)[0]
    for architecture, arch in (("x86_64", "amd64"), ("aarch64", "arm64")):
        got = engine.render(
            "monitoring",
            host,
            ["monitoring_grafana_url", "monitoring_grafana_checksum"],
            ansible_facts={"architecture": architecture},
        )
        url = got["monitoring_grafana_url"]
        assert url == f"https://dl.grafana.com/oss/release/grafana-11.6.0.linux-{arch}.tar.gz"
        assert got["monitoring_grafana_checksum"] == f"sha256:{url}.sha256"


def test_no_grafana_task_runs_in_the_lab(engine: wiring.Wiring) -> None:
    """Every Grafana task and its handler run only where monitoring_grafana_install holds: a
    cluster's monitoring hosts, never the lab's (which can neither fetch nor run Grafana)."""
    main = yaml.safe_load((MONITORING_ROLE / "tasks" / "main.yml").read_text())
    # the import's condition holds for every task the file has (Ansible adds it to each)
    assert {
        "name": "Grafana",
        "ansible.builtin.import_tasks": "grafana.yml",
        "tags": ["monitoring_grafana"],
        "when": "monitoring_grafana_install | bool",
    } in main
    assert all("import_tasks" not in str(t) and "include_tasks" not in str(t) for t in grafana_tasks())
    handlers = yaml.safe_load((MONITORING_ROLE / "handlers" / "main.yml").read_text())
    (handler,) = [h for h in handlers if h["name"] == "Restart grafana"]
    assert handler["when"] == "monitoring_grafana_install | bool"
    # no other task file of the role touches Grafana
    for path in (MONITORING_ROLE / "tasks").glob("*.yml"):
        if path.name not in ("grafana.yml", "main.yml"):
            assert "grafana" not in path.read_text().lower(), path.name
    host = hosts(engine, kube.MONITORING)[0]
    assert engine.render("monitoring", host, ["monitoring_grafana_install"]) == {
        "monitoring_grafana_install": True
    }
    lab = engine.render(
        "monitoring", host, ["monitoring_grafana_install", "monitoring_grafana_files"], **LAB_ROLE_VARS
    )
    assert lab == {"monitoring_grafana_install": False, "monitoring_grafana_files": {}}
