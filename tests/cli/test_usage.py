"""`superkube usage` against a real Prometheus on loopback that holds known traffic.

The counters are written as OpenMetrics and made into TSDB blocks by promtool's backfill, one sample a
minute from three hours ago to twenty minutes ahead, so that whenever a test asks, each window has
samples within a minute of both its ends. Every series grows at a constant rate; for such a series
Prometheus' increase() extrapolates to the window's ends exactly, so a pod's bytes over a window are
its rate times the window's seconds, and the tests ask for exactly that. One pod's counter restarts
from zero mid-window (its exporter restarted) and still counts every byte; the nodes' own rules (no
namespace or pod), a packet counter and another cluster's series are there to be left out.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from superkube.cli import app
from superkube.cli.usage import human
from superkube.cluster.kube import VMSELECT_PORT, metrics_store_query_url, query_url_of_write_url
from superkube.plan import engine as planning
from tests.conftest import ROOT, dev_config

TOOLS = ROOT / ".tools" / "bin"
STEP_S = 60
TRAFFIC = ("internet-out", "internet-in", "internal-out", "internal-in")
CLUSTER, OTHER = "test", "other"
"""the cluster the test stack names (its file is Pulumi.test.yaml), and one more the store holds"""


@dataclass(frozen=True)
class Series:
    cluster: str
    namespace: str
    pod: str
    node: str
    traffic: str
    rate: int
    """bytes a second"""
    restarts_at: int = 0
    """seconds before the data's `now` at which the exporter restarted (its counter from zero)"""


SERIES = (
    Series(CLUSTER, "train", "train-0", "gpu-1", "internet-out", 1000),
    Series(CLUSTER, "train", "train-0", "gpu-1", "internet-in", 200),
    Series(CLUSTER, "train", "train-0", "gpu-1", "internal-out", 5000),
    Series(CLUSTER, "train", "train-0", "gpu-1", "internal-in", 4000),
    Series(CLUSTER, "train", "train-1", "gpu-2", "internet-out", 500),
    Series(CLUSTER, "train", "train-1", "gpu-2", "internal-out", 3000),
    Series(CLUSTER, "train", "train-1", "gpu-2", "internal-in", 6000),
    Series(CLUSTER, "infer", "infer-a", "cpu-1", "internet-out", 50),
    Series(CLUSTER, "infer", "infer-a", "cpu-1", "internet-in", 20000),
    Series(CLUSTER, "infer", "infer-a", "cpu-1", "internal-in", 10),
    Series(CLUSTER, "infer", "infer-b", "cpu-1", "internal-out", 300, restarts_at=40 * 60),
    Series(CLUSTER, "tiny", "tiny-0", "cpu-1", "internal-in", 1),
    Series(OTHER, "train", "train-0", "gpu-9", "internet-out", 7),
)
NODE_RULES = {"internet-out": 10**6, "internet-in": 10**6}
"""each node's own accounting (no namespace, no pod), far above any pod's: it must not show"""


def expected(by: str = "namespace", window_s: int = 3600, cluster: str | None = None) -> list[dict[str, Any]]:
    """What `usage -o json` must list, ranked by total bytes."""
    rows: dict[tuple[str, ...], dict[str, Any]] = {}
    for s in SERIES:
        if cluster is not None and s.cluster != cluster:
            continue
        name = (s.namespace, s.pod) if by == "pod" else (s.namespace,)
        row = rows.setdefault(
            name,
            {
                "namespace": s.namespace,
                **({"pod": s.pod} if by == "pod" else {}),
                **dict.fromkeys(TRAFFIC, 0),
            },
        )
        row[s.traffic] += s.rate * window_s
    out = []
    for row in rows.values():
        got = {k.replace("-", "_"): v for k, v in row.items()}
        got["internet"] = got["internet_out"] + got["internet_in"]
        got["internal"] = got["internal_out"] + got["internal_in"]
        got["total"] = got["internet"] + got["internal"]
        out.append(got)
    return sorted(out, key=lambda r: (-r["total"], r["namespace"], r.get("pod", "")))


def openmetrics(now: int) -> str:
    lines = ["# TYPE iptables_rule_bytes counter"]
    times = range(now - 3 * 3600, now + 20 * 60 + 1, STEP_S)
    for s in SERIES:
        labels = (
            f'cluster="{s.cluster}",instance="{s.node}:9455",node="{s.node}",'
            f'namespace="{s.namespace}",pod="{s.pod}",traffic="{s.traffic}"'
        )
        restart = now - s.restarts_at if s.restarts_at else None
        for t in times:
            if restart is not None and t >= restart:  # restarted just after the sample before
                value = s.rate * (t - restart + STEP_S)
            else:
                value = 10**9 + s.rate * (t - times[0])
            lines.append(f"iptables_rule_bytes_total{{{labels}}} {value} {t}")
    for node in ("gpu-1", "cpu-1"):
        for traffic, rate in NODE_RULES.items():
            for t in times:
                lines.append(
                    f'iptables_rule_bytes_total{{cluster="{CLUSTER}",instance="{node}:9455",node="{node}",'
                    f'namespace="",pod="",traffic="{traffic}"}} {rate * (t - times[0])} {t}'
                )
    lines.append("# TYPE iptables_rule_packets counter")
    for t in times:
        lines.append(
            f'iptables_rule_packets_total{{cluster="{CLUSTER}",instance="gpu-1:9455",node="gpu-1",'
            f'namespace="train",pod="train-0",traffic="internet-out"}} {10**6 * (t - times[0])} {t}'
        )
    return "\n".join([*lines, "# EOF"]) + "\n"


def tool(name: str) -> str:
    path = TOOLS / name
    assert path.is_file(), f"{path} is missing: run `bash scripts/debian-deps.sh` (make test does)"
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a Prometheus on loopback holding SERIES."""
    work = tmp_path_factory.mktemp("usage-prometheus")
    (work / "counters.om").write_text(openmetrics(int(time.time())))
    made = subprocess.run(
        [
            tool("promtool"),
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(work / "counters.om"),
            str(work / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    (work / "prometheus.yml").write_text("global: {}\n")
    port = free_port()
    log = (work / "prometheus.log").open("w")
    server = subprocess.Popen(
        [
            tool("prometheus"),
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=5) as ready:
                    if ready.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None, (work / "prometheus.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "prometheus was not ready within 60 s"
            time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def run(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(app, ["usage", *args], env=env)


def as_json(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = run(*args, "-o", "json", env=env)
    assert result.exit_code == 0, result.stderr
    return dict(json.loads(result.stdout))


def table_rows(text: str) -> list[list[str]]:
    """The body rows of a rich table, cell by cell."""
    return [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]


def one_line_error(result: Any, *says: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for said in says:
        assert said in lines[0], lines[0]


# --- what it shows --------------------------------------------------------------------------------


def test_json_gives_each_namespaces_bytes_in_and_out_over_the_window(store: str) -> None:
    got = as_json("--store", store)
    assert got["rows"] == expected()
    assert [r["namespace"] for r in got["rows"]] == ["infer", "train", "tiny"]
    assert got["count"] == 3 and got["window"] == "1h" and got["by"] == "namespace" and got["unit"] == "bytes"
    assert got["store"] == store and got["cluster"] is None


def test_the_table_shows_the_same_bytes_in_human_units(store: str) -> None:
    result = run("--store", store)
    assert result.exit_code == 0, result.stderr
    assert "top 3 of 3 namespaces by total bytes" in result.stdout
    want = [
        [r["namespace"], *(human(r[t.replace("-", "_")]) for t in TRAFFIC), human(r["total"])]
        for r in expected()
    ]
    assert table_rows(result.stdout) == want
    assert want[1] == ["train", "5.2 MiB", "703 KiB", "27.5 MiB", "34.3 MiB", "67.7 MiB"]


def test_by_pod_ranks_each_pod_and_a_namespace_narrows_it(store: str) -> None:
    every = as_json("--store", store, "--by", "pod")
    assert every["rows"] == expected("pod")
    assert len(every["rows"]) == 5  # train-0 of both clusters is one row
    restarted = next(r for r in every["rows"] if r["pod"] == "infer-b")
    assert restarted["internal_out"] == 300 * 3600, "a counter that restarted mid-window loses no bytes"
    train = as_json("--store", store, "--by", "pod", "-n", "train")
    assert train["rows"] == [r for r in expected("pod") if r["namespace"] == "train"]
    assert train["namespace"] == "train" and train["count"] == 2
    result = run("--store", store, "--by", "pod", "--namespace", "train")
    assert [row[:2] for row in table_rows(result.stdout)] == [["train", "train-0"], ["train", "train-1"]]


def test_the_window_sets_the_span_counted(store: str) -> None:
    assert as_json("--store", store, "--window", "30m")["rows"] == expected(window_s=1800)
    assert as_json("--store", store, "-w", "1h30m")["rows"] == expected(window_s=5400)


def test_top_keeps_the_first_n_of_the_ranking_and_sort_chooses_it(store: str) -> None:
    first = as_json("--store", store, "--top", "1")
    assert [r["namespace"] for r in first["rows"]] == ["infer"] and first["count"] == 3
    assert [
        r["namespace"] for r in as_json("--store", store, "--top", "1", "--sort", "internal")["rows"]
    ] == ["train"]
    by_in = as_json("--store", store, "--by", "pod", "--sort", "internal-in", "--top", "2")["rows"]
    assert [r["pod"] for r in by_in] == ["train-1", "train-0"]
    result = run("--store", store, "--top", "2")
    assert "top 2 of 3 namespaces" in result.stdout
    assert [row[0] for row in table_rows(result.stdout)] == ["infer", "train"]


def test_a_namespace_without_traffic_is_said_plainly(store: str) -> None:
    result = run("--store", store, "--namespace", "idle")
    assert result.exit_code == 0 and "no traffic of any namespaces in idle in the last 1h" in result.stdout
    assert as_json("--store", store, "-n", "idle")["rows"] == []


# --- where the store is ---------------------------------------------------------------------------


def test_a_stack_names_its_store_and_its_cluster(store: str, tmp_path: Path) -> None:
    config = {**dev_config(), "superkube:metrics_store_url": f"{store}/api/v1/write"}
    stack = tmp_path / f"Pulumi.{CLUSTER}.yaml"
    stack.write_text(yaml.safe_dump({"config": config}))
    got = as_json("--stack", str(stack), "--by", "pod")
    assert got["store"] == store and got["cluster"] == CLUSTER
    assert got["rows"] == expected("pod", cluster=CLUSTER)
    # --store wins over the stack's store; the stack still picks the cluster
    assert as_json("--store", store, "--stack", str(stack))["rows"] == expected(cluster=CLUSTER)


def test_the_stacks_own_store_is_vmselect_on_its_first_store_host() -> None:
    _, spec, addresses = planning.load(ROOT, "dev")
    assert metrics_store_query_url(spec, addresses) == (
        f"http://{addresses.metrics_store_ips[0]}:{VMSELECT_PORT}/select/0/prometheus"
    )
    assert query_url_of_write_url("http://vm:8480/insert/3/prometheus/api/v1/write") == (
        "http://vm:8481/select/3/prometheus"
    )
    assert query_url_of_write_url("https://vmauth:443/insert/0/prometheus/api/v1/write") == (
        "https://vmauth:443/select/0/prometheus"
    )
    assert query_url_of_write_url("http://prom:9090/api/v1/write") == "http://prom:9090"
    assert query_url_of_write_url("https://remote.example/push") == ""


def inventory(tmp_path: Path, port: int, hosts: dict[str, Any]) -> dict[str, str]:
    """A lab's inventory, its hosts reached through a ProxyCommand as the lab's are; the env naming it."""
    path = tmp_path / "inventory.yml"
    path.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "vars": {
                        "monitoring_single_node_store": True,
                        "superkube_cluster": OTHER,
                        "monitoring_store_port": port,
                        "ansible_ssh_common_args": "-o ProxyCommand='nc %h %p' -o StrictHostKeyChecking=yes",
                    },
                    "children": hosts,
                }
            }
        )
    )
    return {**os.environ, "SUPERKUBE_INVENTORY": str(path)}


def test_with_a_lab_running_its_store_is_asked_through_the_labs_proxy(store: str, tmp_path: Path) -> None:
    port = int(store.rpartition(":")[2])
    env = inventory(
        tmp_path, port, {"monitoring": {"hosts": {"monitoring-1": {"ansible_host": "127.0.0.1"}}}}
    )
    got = as_json("--by", "pod", env=env)
    assert got["store"] == store and got["cluster"] == OTHER
    assert got["rows"] == expected("pod", cluster=OTHER)
    result = run(env=env)
    assert table_rows(result.stdout) == [["train", human(7 * 3600), "0 B", "0 B", "0 B", human(7 * 3600)]]


# --- what goes wrong: one line, exit 2 ------------------------------------------------------------


def test_an_unreachable_store_is_one_line() -> None:
    port = free_port()
    one_line_error(run("--store", f"http://127.0.0.1:{port}"), f"http://127.0.0.1:{port}", "unreachable")
    one_line_error(run("--store", "not-a-url"), "not an http:// or https:// URL")
    one_line_error(run("--store", "http://store:abc"), "not a URL")


def test_an_unreachable_lab_store_is_one_line(tmp_path: Path) -> None:
    env = inventory(
        tmp_path, free_port(), {"monitoring": {"hosts": {"monitoring-1": {"ansible_host": "127.0.0.1"}}}}
    )
    one_line_error(run(env=env), "unreachable through ProxyCommand 'nc 127.0.0.1")


def test_no_store_known_is_one_line(tmp_path: Path) -> None:
    env = inventory(tmp_path, 1, {"gpu_nodes": {"hosts": {"gpu-1": {"ansible_host": "127.0.0.1"}}}})
    one_line_error(run(env=env), "lists no monitoring host", "--store URL")
    missing = {**os.environ, "SUPERKUBE_INVENTORY": str(tmp_path / "gone.yml")}
    one_line_error(run(env=missing), "no --store and no --stack, and SUPERKUBE_INVENTORY=", "no such file")


def test_an_http_error_and_a_query_the_store_refuses_are_one_line(store: str) -> None:
    one_line_error(run("--store", f"{store}/elsewhere"), "HTTP 404", "Prometheus query API")
    # a window Prometheus cannot hold is its own refusal, passed on in its words
    one_line_error(run("--store", store, "--window", "300y"), "refused the query (bad_data)", "out of range")


@pytest.fixture(scope="module")
def liar() -> Iterator[tuple[str, dict[str, tuple[int, bytes]]]]:
    """A server on loopback that answers each path as it is told: (its URL, path -> answer)."""
    answers: dict[str, tuple[int, bytes]] = {}

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = answers[self.path.partition("/api/")[0]]
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", answers
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("status", "body", "says"),
    [
        (200, b"<html>hello</html>", "malformed answer: '<html>hello</html>'"),
        (200, b'{"status":"success","data":{"resultType":"matrix","result":[]}}', "malformed answer"),
        (200, b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{}}]}}', "malformed"),
        (200, b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"x"]}]}}', "malformed"),
        (503, b'{"status":"error","errorType":"timeout","error":"query timed out"}', "refused the query (timeout): query timed out"),
        (500, b"oops", "HTTP 500"),
    ],
    ids=["html", "matrix", "no-value", "not-a-number", "timeout", "500"],
)  # fmt: skip
def test_a_malformed_or_refused_answer_is_one_line(
    liar: tuple[str, dict[str, tuple[int, bytes]]], status: int, body: bytes, says: str
) -> None:
    url, answers = liar
    answers[f"/{status}-{len(body)}"] = (status, body)
    one_line_error(run("--store", f"{url}/{status}-{len(body)}"), says)


@pytest.mark.parametrize("window", ["1x", "h", "0s", "1m1h", "-1h", "1.5h", ""])
def test_a_bad_window_is_one_line(window: str) -> None:
    one_line_error(run("--store", "http://127.0.0.1:1", "--window", window), f"--window {window!r}", "1h30m")


def test_a_bad_top_or_namespace_is_one_line() -> None:
    one_line_error(run("--store", "http://127.0.0.1:1", "--top", "0"), "--top 0")
    one_line_error(
        run("--store", "http://127.0.0.1:1", "-n", "Not_A_Namespace"), "not a Kubernetes namespace"
    )


def test_human_units() -> None:
    assert [human(b) for b in (0, 512, 1536, 5_425_200, 120 * 2**30, 3 * 2**50)] == [
        "0 B",
        "512 B",
        "1.5 KiB",
        "5.2 MiB",
        "120 GiB",
        "3.0 PiB",
    ]
