"""One real lab for the lab tests: up once per session, down at the end, nothing left behind."""

from __future__ import annotations

import base64
import json
import re
import shlex
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from modules.platform import monitoring_access
from superkube.cli import app
from superkube.cluster import dashboards
from superkube.cluster.kube import IPTABLES_EXPORTER_PORT, MONITORING, PROMETHEUS_PKI_DIR, SYSTEM_NAMESPACE
from superkube.fleet import converge as runner
from superkube.lab import hosts as lab
from superkube.lab import layer, machines, processes
from superkube.lab.state import STATE_DIR, Lab

PROMETHEUS_TOKEN = f"{monitoring_access.NAME}-token"

# the control plane, and one node of each kind plus the NAT host to join it
# (the second GPU node joins in test_running_the_agents, watched, behind a preflight that fails first)
# (and a monitoring host, scraping it all once the layer gives it a token: Labs.apply)
CONTROL_PLANE = "gpu_nodes=2,cpu_nodes=1,nat_host=1,etcd_main=5,etcd_events=3,apiservers=2,monitoring=1"
POD_NETWORK = "gpu_nodes=2,monitoring=1"  # two nodes of one pool, Prometheus + store (+ hub client, internet)
ORDER = {
    POD_NETWORK: ("test_monitoring.py", "test_pod_network.py"),
    # the control plane's modules build on what the ones before them left: its first converge, the one
    # with two hosts powered off mid-run and retried (which every later module shares), the lab's own
    # checks before any node joins, members stopped and hosts lost, nodes joined, then the second
    # converge that must change nothing (before the scale-out, whose instances' kubelets would only slow
    # it), a pool's image baked and scaled out, then the roll
    CONTROL_PLANE: (
        "test_converge.py",
        "test_lab.py",
        "test_running_control_plane.py",
        "test_running_nodes.py",
        "test_running_the_agents.py",
        "test_training_job.py",
        "test_health_loop.py",
        "test_seeing_the_cluster.py",
        "test_split_control_plane.py",
        "test_scaling_out.py",
        "test_upgrading_nodes.py",
    ),
}
"""The lab runs by the shape of their lab, each shape booted once: the modules of a shape run together,
in this order (a lab test module must be named here; tests/layout holds it)."""
MODULES = [module for modules in ORDER.values() for module in modules]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    at = [n for n, item in enumerate(items) if item.path.parent == here]
    if not at:
        return
    rank = {name: n for n, name in enumerate(MODULES)}
    # stable: a module's tests keep their order; the lab's block stays where it was collected
    ours = sorted((items[n] for n in at), key=lambda item: rank.get(item.path.name, len(rank)))
    rest = [item for item in items if item.path.parent != here]
    items[:] = rest[: at[0]] + ours + rest[at[0] :]


class Labs:
    """One real lab at a time: a module asks for a shape; a different shape replaces the lab."""

    def __init__(self) -> None:
        self.shape: str | None = None
        self.current: Lab | None = None
        self.converged: dict[str | None, runner.ConvergeResult] = {}
        self.applied: list[dict[str, Any]] | None = None

    def get(self, shape: str) -> Lab:
        if shape != self.shape or self.current is None:
            lab.down()  # the previous shape, or a lab left by an interrupted run
            self.current = lab.up(shape, lambda what, fraction: None)
            self.shape = shape
            self.converged = {}
            self.applied = None
        return self.current

    def converge(self, fleet: Lab, tags: str | None = None) -> runner.ConvergeResult:
        """Converge this lab once (for these tags): the next module of the same shape finds its hosts
        as the first left them, and a run over a few hundred tasks per host costs minutes here. That
        a second run changes nothing is a test of its own (test_split_control_plane)."""
        assert fleet is self.current, "converge the lab this session holds"
        wanted = set(tags.split(",")) if tags else None
        done = next(
            (
                result
                for ran, result in self.converged.items()
                if result.ok and (ran is None or (wanted is not None and wanted <= set(ran.split(","))))
            ),
            None,
        )
        if done is None:
            done = self.converged[tags] = runner.converge(fleet.inventory, tags=tags)
        assert done.ok, {n: (h.task, h.message) for n, h in done.hosts.items() if not h.healthy}
        return done

    def apply(self, fleet: Lab) -> list[dict[str, Any]]:
        """Apply the in-cluster layer to this lab once, through the command a user runs (`superkube lab
        apply`), after its converge; the next module of the same shape finds it applied. What it
        reported, file by file. That a second apply changes nothing is test_running_control_plane's."""
        assert fleet is self.current, "apply to the lab this session holds"
        self.converge(fleet)
        if self.applied is None:
            result = CliRunner().invoke(app, ["lab", "apply", "--output", "json"])
            assert result.exit_code == 0, result.output
            self.applied = list(json.loads(result.stdout))
            if any(h.group == MONITORING for h in fleet.hosts):
                watch_the_cluster(fleet)
        return self.applied

    def retried(self, fleet: Lab, first: runner.ConvergeResult, retry: runner.ConvergeResult) -> None:
        """A whole converge that failed on some hosts, and its retry that converged exactly those:
        together the lab's converge, which the next module shares instead of running its own."""
        assert fleet is self.current and not first.ok and retry.ok
        assert sorted(retry.hosts) == first.failed_hosts, (sorted(retry.hosts), first.failed_hosts)
        self.converged[None] = runner.ConvergeResult(
            hosts={**first.hosts, **retry.hosts},
            seconds=first.seconds + retry.seconds,
            status=retry.status,
            playbook=first.playbook,
        )


def watch_the_cluster(fleet: Lab) -> None:
    """Give the lab's monitoring hosts what an operator places after the layer's first apply (the
    cluster CA and the Prometheus token, modules/platform/monitoring_access.py), and converge them: the
    monitoring role then scrapes every job, with nodes and agents' pods discovered from the API server.
    A later converge finds them placed and changes nothing."""
    ca = (fleet.inventory.parent / "pki" / "kubernetes" / "ca.crt").read_text()
    deadline = time.monotonic() + 60
    while not (
        token := ok(
            fleet, "-n", SYSTEM_NAMESPACE, "get", "secret", PROMETHEUS_TOKEN, "-o", "jsonpath={.data.token}"
        )
    ):
        assert time.monotonic() < deadline, f"the token controller never filled {PROMETHEUS_TOKEN}"
        time.sleep(1)
    for host in (h.name for h in fleet.hosts if h.group == MONITORING):
        machines.put(fleet, host, f"{PROMETHEUS_PKI_DIR}/ca.crt", ca)
        machines.put(fleet, host, f"{PROMETHEUS_PKI_DIR}/token", base64.b64decode(token).decode())
    done = runner.converge(fleet.inventory, tags="monitoring", limit=MONITORING)
    assert done.ok, {n: (h.task, h.message) for n, h in done.hosts.items() if not h.healthy}


@pytest.fixture(scope="session")
def labs() -> Iterator[Labs]:
    held = Labs()
    yield held
    in_lab = [pid for name in processes.lab_namespaces() for pid in processes.namespace_pids(name)]
    clients = processes.lab_clients(STATE_DIR)
    lab.down()
    assert processes.leftovers() == []
    still = [pid for pid in in_lab + clients if processes.running(pid)]
    assert still == [], f"processes of the lab outlived lab down: {still}"


@pytest.fixture(scope="module")
def fleet(labs: Labs) -> Lab:
    return labs.get(CONTROL_PLANE)  # the lab's own tests and converge's: on the control plane's hosts


@pytest.fixture(scope="module")
def pod_network(labs: Labs) -> Lab:
    return labs.get(POD_NETWORK)


@pytest.fixture(scope="module")
def monitored(labs: Labs) -> Lab:
    return labs.get(POD_NETWORK)  # the same small lab: its nodes are what the monitoring host scrapes


@pytest.fixture(scope="module")
def control_plane(labs: Labs) -> Lab:
    return labs.get(CONTROL_PLANE)


def kubectl(
    fleet: Lab, *args: str, stdin: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """The lab's built kubectl as the admin, from the switch namespace (where the API's address is).
    A command given its own --timeout (wait, rollout status, delete) is given that and half a minute
    more, so that kubectl's own answer, not the test's clock, says what it waited for."""
    for arg in args:
        if arg.startswith("--timeout=") and (told := re.fullmatch(r"(\d+)s", arg.removeprefix("--timeout="))):
            timeout = max(timeout, int(told.group(1)) + 30)
    return subprocess.run(
        [*layer.kubectl(fleet), *args], input=stdin, capture_output=True, text=True, timeout=timeout
    )


def ok(fleet: Lab, *args: str, stdin: str | None = None) -> str:
    proc = kubectl(fleet, *args, stdin=stdin)
    assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr}"
    return proc.stdout


def get(fleet: Lab, *args: str) -> dict[str, Any]:
    return dict(json.loads(ok(fleet, "get", *args, "-o", "json")))


def sh(fleet: Lab, host: str, command: str, timeout: float = 60) -> str:
    proc = machines.ssh(fleet, fleet.host(host), command, timeout=timeout)
    assert proc.returncode == 0, f"{host}: {command}: {proc.stderr}"
    return proc.stdout


SRC = Path(__file__).resolve().parents[2] / "src" / "superkube"
CNIRUN = "cd /root/cni && python3 cnirun.py"
"""The lab's CNI runner on a node (superkube/lab/cnirun.py): pods as network namespaces, no kubelet."""


def put_cnirun(fleet_: Lab, hosts: tuple[str, ...]) -> None:
    """Copy the CNI runner (and the rate parser beside it) to each of `hosts`, where CNIRUN runs it."""
    for host in hosts:
        for name in ("lab/cnirun.py", "model/rates.py"):
            machines.put(fleet_, host, f"/root/cni/{Path(name).name}", (SRC / name).read_text())


def counters(fleet_: Lab, host: str) -> dict[str, float]:
    text = sh(fleet_, host, f"curl -s -m 5 http://127.0.0.1:{IPTABLES_EXPORTER_PORT}/metrics")
    out = {}
    for m in re.finditer(r"^iptables_rule_bytes_total\{([^}]*)\} (\S+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        assert labels["cluster"] == "flagship" and labels["table"] == "mangle"
        if "pod" not in labels:  # the node's own rules; a pod's are counted by superkube-pod-accounting
            out[labels["traffic"]] = float(m.group(2))
    assert "iptables_scrape_success 1.0" in text
    return out


# A sink that reads one connection to its end, then answers with the bytes it read; the sender
# returns only after that answer, so every byte has crossed the sender's node (iperf3 -n ends once
# its bytes are in the socket, and the socket may never send the rest before the test ends).
_SINK = """import socket
s = socket.create_server(("0.0.0.0", {port}))
c, _ = s.accept()
n = 0
while b := c.recv(1 << 16):
    n += len(b)
c.sendall(str(n).encode())
c.close()"""
_SEND = """import socket, time
for _ in range(200):
    try:
        c = socket.create_connection(("{ip}", {port}), timeout=60)
        break
    except OSError:
        time.sleep(0.05)
c.sendall(bytes({size}))
c.shutdown(socket.SHUT_WR)
print(c.recv(64).decode())"""


def deliver(
    fleet_: Lab,
    sender: str,
    receiver: str,
    ip: str,
    size: int,
    pods: tuple[str, str] = ("", ""),
    port: int = 7100,
) -> int:
    """Send `size` bytes over TCP from `sender` to `ip` on `receiver` (each inside its pod's network
    namespace, if named) and return the count the receiver read, once it has read all of them."""
    into = [f"ip netns exec {pod} " if pod else "" for pod in pods]
    sink = shlex.quote(_SINK.format(port=port))
    sh(fleet_, receiver, f"(timeout 120 {into[1]}python3 -c {sink} > /dev/null 2>&1 &)")
    send = shlex.quote(_SEND.format(ip=ip, port=port, size=size))
    return int(sh(fleet_, sender, f"{into[0]}python3 -c {send}", timeout=120).strip())


class NodeWatch:
    """Every version of the cluster's Nodes the API server sends a watch, from the list that opens it
    to `stop()`: how a Node looked when its kubelet registered it, before any agent changed it."""

    def __init__(self, fleet: Lab) -> None:
        command = [*layer.kubectl(fleet), "get", "nodes", "--watch", "--output-watch-events", "-o", "json"]
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        decoder, buffer = json.JSONDecoder(), ""
        for line in self.proc.stdout:
            buffer += line
            try:
                event, end = decoder.raw_decode(buffer.lstrip())
            except json.JSONDecodeError:
                continue  # an object printed over several lines: not whole yet
            buffer = buffer.lstrip()[end:]
            self.events.append((event["type"], event["object"]))

    def versions(self, name: str) -> list[dict[str, Any]]:
        return [obj for _, obj in self.events if obj["metadata"]["name"] == name]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self._reader.join(timeout=10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


MONITORING_ROLE = yaml.safe_load(
    (runner.PLAYBOOKS / "roles" / "monitoring" / "defaults" / "main.yml").read_text()
)
SHARD_PORT = MONITORING_ROLE["monitoring_prometheus_port"]  # the lab's first shard
STORE_PORT = MONITORING_ROLE["monitoring_store_port"]  # the lab's single-node store


def from_the_store(fleet: Lab, query: str) -> list[dict[str, Any]]:
    """The series an instant query of the lab's store returns, asked on its monitoring host."""
    host = next(h.name for h in fleet.hosts if h.group == MONITORING)
    text = sh(
        fleet,
        host,
        f"curl -sf http://127.0.0.1:{STORE_PORT}/api/v1/query --data-urlencode {shlex.quote('query=' + query)}",
    )
    return list(json.loads(text)["data"]["result"])


_ASK = """
import json, sys, time, urllib.parse, urllib.request
exprs, shard, store, window, step = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
end = time.time()
out = []
for expr in exprs:
    row = []
    for port in (shard, store):
        query = {"query": expr, "start": end - window, "end": end, "step": step}
        url = f"http://127.0.0.1:{port}/api/v1/query_range?" + urllib.parse.urlencode(query)
        try:
            got = json.load(urllib.request.urlopen(url, timeout=60))
            row.append([got["status"], len(got["data"]["result"])])
        except Exception as e:  # a refused query is an HTTP 400 with the parser's error
            row.append(["error", str(getattr(e, "read", lambda: str(e).encode())().decode()[:300])])
    out.append(row)
print(json.dumps(out))
"""
PANEL_WINDOW_S = 3600
"""The time range the check asks each panel for, as a dashboard's "last hour" does: a lab's run is
shorter, so everything it scraped is in range."""
PANEL_STEP = "30s"
PANEL_RATE_INTERVAL = "1m"
"""What Grafana makes `$__rate_interval` of the lab's 5 s scrapes at a 30 s step: the larger of four
scrape intervals and the step plus one (35 s), rounded up."""


def panels_on_the_lab(fleet: Lab, host: str, boards: set[str]) -> dict[str, list[str]]:
    """Every query of every panel of these dashboards, as Grafana sends it for a time-series panel
    (a range query over the last hour, its variables filled in), asked of a Prometheus shard (it must
    parse) and of the store the dashboards read (it must return series): the panels, by `LAB_EMPTY`
    key, whose every query came back empty from the store, and the queries a shard or the store
    refused."""
    asked = [
        (dashboards.key(board, p), dashboards.concrete(query.expr, __rate_interval=PANEL_RATE_INTERVAL))
        for board in dashboards.boards()
        if board.uid in boards
        for p in board.panels()
        for query in p.queries
    ]
    machines.put(fleet, host, "/root/panels/queries.json", json.dumps([expr for _, expr in asked]))
    machines.put(fleet, host, "/root/panels/ask.py", _ASK)
    answers = json.loads(
        sh(
            fleet,
            host,
            f"python3 /root/panels/ask.py /root/panels/queries.json {SHARD_PORT} {STORE_PORT} {PANEL_WINDOW_S} {PANEL_STEP}",
            timeout=300,
        )
    )
    refused = [
        f"{key}: {expr}: {answer}"
        for (key, expr), row in zip(asked, answers, strict=True)
        for answer in row
        if answer[0] != "success"
    ]
    with_data = {
        key for (key, _), (_, store) in zip(asked, answers, strict=True) if store[0] == "success" and store[1]
    }
    empty = sorted({key for key, _ in asked} - with_data)
    return {"empty": empty, "refused": refused}
