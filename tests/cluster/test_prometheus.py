"""Prometheus for a cluster, checked with Prometheus's own tools (Debian's promtool and prometheus).

`scripts/debian-deps.sh` (run by `make test`) unpacks both into .tools/bin; every server a test
starts listens on loopback.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from superkube.cli import app
from superkube.cluster import monitoring
from superkube.cluster.kube import (
    APISERVERS,
    CPU_NODES,
    ETCD_EVENTS,
    ETCD_MAIN,
    GPU_NODES,
    JOIN_TOKENS_METRICS_PORT,
    NAT_HOST,
    SCALE_GOVERNOR_METRICS_PORT,
    SYSTEM_NAMESPACE,
    apiserver_url,
)
from superkube.plan import engine as planning
from tests.conftest import ROOT

TOOLS = monitoring.ROOT / ".tools" / "bin"


def tool(name: str) -> str:
    path = TOOLS / name
    assert path.is_file(), f"{path} is missing: run `bash scripts/debian-deps.sh` (make test does)"
    return str(path)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("promtool"), *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module", params=["dev", "flagship"])
def rendered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp(request.param) / "monitoring"
    result = CliRunner().invoke(app, ["monitoring", "render", "--stack", request.param, "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    (out / ".stack").write_text(request.param)
    return out


def rule_tests() -> list[Path]:
    files = sorted(monitoring.RULE_TESTS.glob("*.yml"))
    assert {p.name for p in files} >= {"rules_test.yml", "agents_test.yml"}
    return files


def test_every_alert_fires_and_stays_quiet_under_promtool() -> None:
    files = rule_tests()
    proc = promtool("test", "rules", *map(str, files))
    assert proc.returncode == 0 and proc.stdout.count("SUCCESS") == len(files), proc.stdout + proc.stderr
    lint = promtool("check", "rules", "--lint=all", str(monitoring.RULES))
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_every_alert_has_a_firing_case_and_a_quiet_case() -> None:
    alerts = {
        rule["alert"]
        for group in yaml.safe_load(monitoring.RULES.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    fires: set[str] = set()
    quiet: set[str] = set()
    for path in rule_tests():
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fires if check["exp_alerts"] else quiet).add(check["alertname"])
    assert alerts == fires, f"alerts never shown firing: {alerts - fires}"
    assert alerts == quiet, f"alerts never shown quiet: {alerts - quiet}"


@pytest.mark.parametrize(
    ("tests", "rule", "broken", "alert"),
    [
        ("rules_test.yml", "> 0.01", "> 0.5", "APIServerThrottling"),
        ("agents_test.yml", "sum(superkube_scale_governor_leader) < 1", "sum(superkube_scale_governor_leader) < 0",
         "ScaleGovernorNoLeader"),
        ("agents_test.yml", "denials_total[1h])) > 0", "denials_total[1h])) > 3", "ServingCertificatesDenied"),
    ],
)  # fmt: skip
def test_a_broken_alert_fails_its_unit_test(
    tmp_path: Path, tests: str, rule: str, broken: str, alert: str
) -> None:
    # the unit tests can fail: raise one threshold and promtool says which alert no longer fires
    (tmp_path / "tests").mkdir()
    assert rule in monitoring.RULES.read_text()
    (tmp_path / "rules.yml").write_text(monitoring.RULES.read_text().replace(rule, broken, 1))
    (tmp_path / "tests" / tests).write_text((monitoring.RULE_TESTS / tests).read_text())
    proc = promtool("test", "rules", str(tmp_path / "tests" / tests))
    assert proc.returncode != 0 and f"alertname: {alert}" in proc.stdout + proc.stderr


def checkable(config: dict[str, Any], pki: Path) -> dict[str, Any]:
    """Debian builds Prometheus without Kubernetes discovery, so its promtool rejects the block; put
    an equivalent file discovery in its place so that everything else in the job is still checked.
    promtool also opens the CA and token files: point them at stand-ins under `pki`."""
    pki.mkdir(exist_ok=True)
    for job in config["scrape_configs"]:
        if job.pop("kubernetes_sd_configs", None) is not None:
            job["file_sd_configs"] = [{"files": [str(pki / "nodes.json")]}]
        if "tls_config" in job:
            assert job["tls_config"]["ca_file"] == "/etc/prometheus/pki/ca.crt"
            assert job["authorization"]["credentials_file"] == "/etc/prometheus/pki/token"
            job["tls_config"]["ca_file"] = str(pki / "ca.crt")
            job["authorization"]["credentials_file"] = str(pki / "token")
    for name in ("ca.crt", "token"):
        (pki / name).write_text("stand-in\n")
    return config


def test_every_shard_config_passes_promtool(rendered: Path) -> None:
    shards = sorted(rendered.glob("prometheus-*.yml"))
    assert shards
    for path in shards:
        config = yaml.safe_load(path.read_text())
        # discovery from beside the cluster: its API server at the plan's address, as a client of it
        sds = [sd for job in config["scrape_configs"] for sd in job.get("kubernetes_sd_configs", [])]
        assert {sd["role"] for sd in sds} == {"node", "pod"}
        _, _, addresses = planning.load(ROOT, (rendered / ".stack").read_text())
        assert {sd["api_server"] for sd in sds} == {apiserver_url(addresses.apiserver_lb_ip)}
        assert all(sd["authorization"]["credentials_file"] == "/etc/prometheus/pki/token" for sd in sds)
        checked = path.with_name(f"checked-{path.name}")
        checked.write_text(yaml.safe_dump(checkable(config, rendered / "pki")))
        proc = promtool("check", "config", str(checked))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "SUCCESS: 1 rule files found" in proc.stdout, proc.stdout


def test_the_agents_are_scraped_where_they_serve(rendered: Path) -> None:
    """The host services on every API-server host at their named ports; the in-cluster agents'
    pods (the approver, the team webhook and reconciler) by pod discovery in superkube's namespace."""
    _, _, addresses = planning.load(ROOT, (rendered / ".stack").read_text())
    config = yaml.safe_load((rendered / "prometheus-0.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    for job, port in (
        ("scale-governor", SCALE_GOVERNOR_METRICS_PORT),
        ("join-tokens", JOIN_TOKENS_METRICS_PORT),
    ):
        (static,) = jobs[job]["static_configs"]
        assert static["targets"] == [f"{ip}:{port}" for ip in sorted(map(str, addresses.apiserver_ips))]
    (sd,) = jobs["platform-agents"]["kubernetes_sd_configs"]
    assert (sd["role"], sd["namespaces"]) == ("pod", {"names": [SYSTEM_NAMESPACE]})
    keep = [r for r in jobs["platform-agents"]["relabel_configs"] if r.get("action") == "keep"]
    assert keep[0]["regex"] == "serving-certs|team-capacity" and keep[1]["regex"] == "metrics"


def test_the_labs_static_config_passes_promtool_as_it_is(tmp_path: Path) -> None:
    targets = {
        g: [f"10.0.{i}.{j}" for j in range(1, 4)]
        for i, g in enumerate((GPU_NODES, CPU_NODES, NAT_HOST, ETCD_MAIN, ETCD_EVENTS, APISERVERS))
    }
    config = monitoring.prometheus_config(
        "lab", 2, 1, "http://127.0.0.1:8428/api/v1/write", targets, nodes_from_kubernetes=False, rule_files=()
    )
    path = tmp_path / "prometheus.yml"
    checkable(config, tmp_path / "pki")
    path.write_text(monitoring.render(config))
    proc = promtool("check", "config", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_shards_split_targets_and_write_to_one_store(rendered: Path) -> None:
    shards = sorted(rendered.glob("prometheus-*.yml"))
    for index, path in enumerate(shards):
        config = yaml.safe_load(path.read_text())
        assert config["global"]["external_labels"]["prometheus_shard"] == str(index)
        assert len({w["url"] for w in config["remote_write"]}) == 1
        for job in config["scrape_configs"]:
            hashmod, keep = job["relabel_configs"][-2:]
            assert hashmod == {
                "source_labels": ["__address__"],
                "modulus": len(shards),
                "target_label": "__tmp_shard",
                "action": "hashmod",
            }
            assert keep == {"source_labels": ["__tmp_shard"], "regex": str(index), "action": "keep"}


def test_every_drop_rule_carries_its_reason(rendered: Path) -> None:
    text = (rendered / "prometheus-0.yml").read_text()
    config = yaml.safe_load(text)
    drops = [
        r
        for job in config["scrape_configs"]
        for r in job.get("metric_relabel_configs", [])
        if r["action"] == "drop"
    ]
    assert len(drops) == sum(len(monitoring.DROP[j.drops]) for j in monitoring.jobs() if j.drops)
    assert text.count("# drops: ") == len(drops)
    # every job that scrapes a large exporter reviews what it drops
    assert {j["job_name"] for j in config["scrape_configs"] if j.get("metric_relabel_configs")} >= {
        "apiserver",
        "etcd-main",
        "etcd-events",
        "kubelet",
        "cadvisor",
        "node-exporter",
    }


# --- the drop rules in a real Prometheus ----------------------------------------------------------


def apiserver_page() -> str:
    """A metrics page shaped like an API server's: the families the drop rules touch and their siblings."""
    lines = []
    le = [
        "0.005",
        "0.025",
        "0.05",
        "0.1",
        "0.2",
        "0.4",
        "0.6",
        "0.8",
        "1",
        "1.25",
        "1.5",
        "2",
        "3",
        "4",
        "5",
        "6",
        "8",
        "10",
        "15",
        "20",
        "30",
        "45",
        "60",
        "+Inf",
    ]
    for verb in ("GET", "LIST", "WATCH", "POST", "PATCH"):
        for resource in ("pods", "nodes", "events", "leases"):
            labels = f'verb="{verb}",resource="{resource}",scope="cluster",component="apiserver"'
            for b in le:
                lines.append(f'apiserver_request_duration_seconds_bucket{{{labels},le="{b}"}} 1')
            lines.append(f"apiserver_request_duration_seconds_sum{{{labels}}} 1")
            lines.append(f"apiserver_request_duration_seconds_count{{{labels}}} 1")
            lines.append(f'apiserver_request_total{{{labels},code="200"}} 5')
            for b in ("0.005", "0.1", "1", "+Inf"):
                lines.append(
                    f'etcd_request_duration_seconds_bucket{{operation="get",type="{resource}",le="{b}"}} 1'
                )
            lines.append(f'etcd_request_duration_seconds_count{{operation="get",type="{resource}"}} 1')
    return "\n".join(dict.fromkeys(lines)) + "\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    """A real Prometheus on loopback scraping the page once a second through the apiserver job's
    drop rules: (its port, the number of series on the page)."""
    page = apiserver_page().encode()

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    exporter = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    work = tmp_path_factory.mktemp("prometheus")
    job = next(
        j
        for j in monitoring.prometheus_config("t", 1, 0, "http://127.0.0.1:1/w", {APISERVERS: ["x"]})[
            "scrape_configs"
        ]
        if j["job_name"] == "apiserver"
    )
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "apiserver",
                "static_configs": [{"targets": [f"127.0.0.1:{exporter.server_address[1]}"]}],
                "metric_relabel_configs": job["metric_relabel_configs"],
            }
        ],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = _free_port()
    server = subprocess.Popen(
        [
            tool("prometheus"),
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if query(port, "count(up == 1)"):
                    time.sleep(2)  # a few scrapes in
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            raise AssertionError("prometheus did not scrape the page within 60 s")
        yield port, len([line for line in page.decode().splitlines() if line and not line.startswith("#")])
    finally:
        server.terminate()
        server.wait(timeout=30)
        exporter.shutdown()
        exporter.server_close()


def query(port: int, expr: str) -> list[dict[str, Any]]:
    import json
    from urllib.parse import quote

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/query?query={quote(expr)}", timeout=5) as r:
        return list(json.load(r)["data"]["result"])


def test_drop_rules_remove_their_series_and_keep_the_siblings(scraped: tuple[int, int]) -> None:
    port, on_page = scraped
    les = {
        r["metric"]["le"]
        for r in query(port, 'apiserver_request_duration_seconds_bucket{verb="GET",resource="pods"}')
    }
    assert les == {"0.05", "0.1", "0.4", "1", "5", "10", "60", "+Inf"}
    assert query(port, "etcd_request_duration_seconds_bucket") == []
    assert len(query(port, "etcd_request_duration_seconds_count")) == 4
    assert len(query(port, "apiserver_request_duration_seconds_count")) == 20
    assert len(query(port, "apiserver_request_total")) == 20
    kept = int(float(query(port, 'scrape_samples_post_metric_relabeling{job="apiserver"}')[0]["value"][1]))
    scraped_ = int(float(query(port, 'scrape_samples_scraped{job="apiserver"}')[0]["value"][1]))
    assert scraped_ == on_page
    # 20 label sets x (24 -> 8 buckets) and 4 x 4 etcd buckets gone
    assert scraped_ - kept == 20 * 16 + 4 * 4
