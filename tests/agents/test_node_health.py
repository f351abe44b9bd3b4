"""The health agent: recorded GPU readings -> verdict -> actions, the breaker, every request body
against the official schema, and the agent as a process against the Kubernetes client's real HTTP
path (a loopback server that records each request and answers as the API documents: the objects it
was given, 201 for creations, 429 for an eviction a PodDisruptionBudget refuses)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from superkube.agents import gpu_probe, kubeapi
from superkube.agents import node_health as nh
from superkube.cluster import render
from superkube.model.spec import PREFLIGHT_TAINT_KEY

READINGS = Path(__file__).parent / "readings"
VERSION = "1.35.0"
FATAL = [
    "xid-48-dbe",
    "xid-63-remap-pending",
    "xid-64-remap-failure",
    "xid-79-off-the-bus",
    "xid-94-contained",
    "xid-95-uncontained",
    "nvlink-down",
]
NOT_FATAL = ["healthy", "healthy-corrected-ecc", "app-fault-xid-13", "pcie-degraded"]
AT = datetime(2026, 11, 23, 8, 0, tzinfo=UTC)


def verdict_of(name: str, node: str = "gpu-1") -> gpu_probe.Verdict:
    reading = gpu_probe.load_reading(READINGS / f"{name}.json").model_copy(update={"node": node})
    return gpu_probe.verdict(reading)


def node(name: str, *, cordoned: bool = False, preflight: bool = False) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {kubeapi.POOL_LABEL: "gpu", "kubernetes.io/hostname": name},
            "annotations": {nh.ANNOTATION: "Xid 79"} if cordoned else {},
        },
        "spec": {"unschedulable": cordoned},
    }
    if preflight:
        obj["spec"]["taints"] = [{"key": PREFLIGHT_TAINT_KEY, "value": "pending", "effect": "NoSchedule"}]
    return obj


def pod(name: str, namespace: str = "team-a", *, owner: str = "ReplicaSet", **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": owner, "name": f"{name}-owner", "uid": f"u-{name}"}
        ],
        **extra.pop("meta", {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": "gpu-1", "containers": [{"name": "main", "image": "registry.example/train:1"}]},
        "status": {"phase": extra.pop("phase", "Running")},
    }


PODS = [
    pod("trainer-0"),
    pod("trainer-1", "team-b"),
    pod("node-health-x", "superkube-system", owner="DaemonSet"),
    pod("static", "kube-system", owner="Node", meta={"annotations": {nh.MIRROR_ANNOTATION: "abc"}}),
    pod("finished", phase="Succeeded"),
]
POOL = [node("gpu-1")] + [node(f"gpu-{i}") for i in range(2, 41)]  # 40 nodes past preflight


def test_the_recorded_objects_are_valid_kubernetes_objects() -> None:
    for obj in [*PODS, *POOL, node("x", cordoned=True, preflight=True)]:
        assert render.validate(obj, VERSION) == [], obj["metadata"]["name"]


@pytest.mark.parametrize("reading", FATAL)
def test_each_fatal_reading_cordons_and_evicts_what_a_drain_moves(reading: str) -> None:
    d = nh.decide(verdict_of(reading), POOL[0], POOL, PODS, max_cordoned_share=0.05)
    assert d.cordon and not d.breaker_open
    assert d.evict == (kubeapi.PodRef("team-a", "trainer-0"), kubeapi.PodRef("team-b", "trainer-1"))
    (cordon_event,) = [e for e in d.events if e[1] == "GPUHealthCordon"]
    assert cordon_event[0] == "Warning" and d.cordon in cordon_event[2]
    assert [e[2] for e in d.events if e[1] == "GPUHealthEvict"] == [
        "evicting team-a/trainer-0",
        "evicting team-b/trainer-1",
    ]


@pytest.mark.parametrize("reading", NOT_FATAL)
def test_a_reading_that_is_not_fatal_never_cordons(reading: str) -> None:
    v = verdict_of(reading)
    d = nh.decide(v, POOL[0], POOL, PODS, max_cordoned_share=0.05)
    assert not d.cordon and not d.evict
    if v.level == "warning":
        assert [e[1] for e in d.events] == ["GPUHealthWarning"]
        # the same warning is not sent again next round
        again = nh.decide(v, POOL[0], POOL, PODS, 0.05, warned=d.events[0][2])
        assert again.events == ()
    else:
        assert d.events == ()


def test_the_reason_names_the_gpu_and_the_xid() -> None:
    off_the_bus = nh.decide(verdict_of("xid-79-off-the-bus"), POOL[0], POOL, PODS, 0.05).cordon
    assert (
        off_the_bus == "fatal: node: 7 of 8 GPUs a Standard_ND96isr_H100_v5 has are visible (missing index 6)"
    )
    dbe = nh.decide(verdict_of("xid-48-dbe"), POOL[0], POOL, PODS, 0.05).cordon
    assert dbe.startswith("fatal: GPU 2: Xid 48: double-bit ECC error")


def test_a_node_behind_the_preflight_taint_is_left_to_preflight() -> None:
    n = node("gpu-1", preflight=True)
    assert nh.decide(verdict_of("xid-79-off-the-bus"), n, [n, *POOL[1:]], PODS, 0.05) == nh.Decision(
        cordoned_share=0.0
    )


def test_an_already_cordoned_node_only_moves_what_is_left() -> None:
    n = node("gpu-1", cordoned=True)
    d = nh.decide(verdict_of("xid-95-uncontained"), n, [n, *POOL[1:]], PODS, 0.05)
    assert not d.cordon and d.events == () and len(d.evict) == 2


def test_the_breaker_stops_cordoning_past_the_share_and_says_so() -> None:
    # 40 nodes past preflight, 0.05: the 2nd cordon is allowed (2/40), the 3rd is not (3/40)
    one = [node("gpu-2", cordoned=True), *POOL[2:]]
    assert nh.decide(verdict_of("xid-48-dbe"), POOL[0], [POOL[0], *one], PODS, 0.05).cordon
    two = [node("gpu-2", cordoned=True), node("gpu-3", cordoned=True), *POOL[3:]]
    d = nh.decide(verdict_of("xid-48-dbe"), POOL[0], [POOL[0], *two], PODS, 0.05)
    assert d.breaker_open and not d.cordon and not d.evict
    ((type_, reason, message),) = d.events
    assert (type_, reason) == ("Warning", "HealthBreakerOpen") and "3 of 40" in message


def test_new_nodes_still_in_preflight_do_not_count_toward_the_breaker() -> None:
    # an autoscaler burst: 400 joining nodes look bad before their driver is ready; they are not
    # counted, so the pool's share is still 1 of 40 past preflight
    burst = [node(f"new-{i}", preflight=True) for i in range(400)]
    one = [node("gpu-2", cordoned=True), *POOL[2:]]
    d = nh.decide(verdict_of("xid-79-off-the-bus"), POOL[0], [POOL[0], *one, *burst], PODS, 0.05)
    assert d.cordon and d.cordoned_share == pytest.approx(2 / 40)


def test_every_request_body_is_valid_against_the_official_schema() -> None:
    n = node("gpu-1")
    patch = nh.cordon_patch("fatal: GPU 3: Xid 79: GPU has fallen off the bus", AT)
    patched = {
        **n,
        "metadata": {**n["metadata"], "annotations": patch["metadata"]["annotations"]},
        "spec": {**n["spec"], **patch["spec"]},
    }
    assert render.validate(patched, VERSION) == []
    assert render.validate(kubeapi.eviction(kubeapi.PodRef("team-a", "trainer-0")), VERSION) == []
    ev = kubeapi.event(n, nh.COMPONENT, "Warning", "GPUHealthCordon", "x" * 5000, AT)
    assert render.validate(ev, VERSION) == [] and len(ev["message"]) == kubeapi.MAX_MESSAGE
    # and the check can fail: a field the Event kind does not have
    assert render.validate({**ev, "severity": "high"}, VERSION)


# --- the agent as a process against the client's HTTP path -----------------------------------------


class Api:
    """A loopback endpoint for the calls the agent makes: reads answer with the objects given, every
    write is recorded; evictions named in `refuse` get the API's 429 (a PodDisruptionBudget)."""

    def __init__(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]], refuse: set[str]) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.pods, self.refuse = pods, refuse
        self.writes: list[tuple[str, str, str, dict[str, Any]]] = []
        self.reads: list[str] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                api.reads.append(self.path)
                path = self.path.split("?")[0]
                if path == "/api/v1/nodes":
                    self._send(
                        200,
                        {
                            "apiVersion": "v1",
                            "kind": "NodeList",
                            "metadata": {},
                            "items": list(api.nodes.values()),
                        },
                    )
                elif path.startswith("/api/v1/nodes/"):
                    self._send(200, api.nodes[path.rsplit("/", 1)[1]])
                elif path == "/api/v1/pods":
                    self._send(
                        200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": api.pods}
                    )
                else:
                    self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404})

            def _write(self, method: str) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                api.writes.append((method, self.path, self.headers.get("Content-Type", ""), body))
                if self.path.endswith("/eviction") and body["metadata"]["name"] in api.refuse:
                    self._send(
                        429,
                        {
                            "kind": "Status",
                            "apiVersion": "v1",
                            "status": "Failure",
                            "code": 429,
                            "reason": "TooManyRequests",
                            "message": "Cannot evict pod as it would violate the pod's disruption budget.",
                        },
                    )
                elif method == "PATCH":
                    self._send(200, api.nodes[self.path.rsplit("/", 1)[1]])
                elif self.path.endswith("/eviction"):
                    self._send(201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201})
                else:
                    self._send(201, body)

            def do_POST(self) -> None:
                self._write("POST")

            def do_PATCH(self) -> None:
                self._write("PATCH")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                }
            )
        )
        return path


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_agent(
    kubeconfig: Path,
    reading: str | Path,
    *extra: str,
    rounds: int = 1,
    module: str = "superkube.agents.node_health",
) -> tuple[subprocess.Popen[str], int]:
    """An agent as a process on node gpu-1 of pool gpu; `reading` names a recorded reading or is a file."""
    port = free_port()
    path = reading if isinstance(reading, Path) else READINGS / f"{reading}.json"
    command = [sys.executable, "-m", module, "--node", "gpu-1"]
    command += ["--pool", "gpu"] if module.endswith("node_health") else []
    command += ["--reading", str(path), "--kubeconfig", str(kubeconfig), "--metrics-port", str(port)]
    command += ["--metrics-address", "127.0.0.1", "--interval", "0.2", "--rounds", str(rounds), *extra]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, port


def metrics(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("superkube_")
    }


@pytest.fixture
def api() -> Iterator[Api]:
    a = Api(POOL, PODS, refuse={"trainer-1"})
    yield a
    a.server.shutdown()
    a.server.server_close()


def test_the_agent_cordons_evicts_and_records_through_the_api(api: Api, tmp_path: Path) -> None:
    proc, _ = run_agent(api.kubeconfig(tmp_path / "kubeconfig"), "xid-79-off-the-bus")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    patches = [w for w in api.writes if w[0] == "PATCH"]
    evictions = [w for w in api.writes if w[1].endswith("/eviction")]
    events = [w for w in api.writes if w[1] == "/api/v1/namespaces/default/events"]
    ((_, path, _, body),) = patches
    assert path == "/api/v1/nodes/gpu-1" and body["spec"] == {"unschedulable": True}
    assert body["metadata"]["annotations"][nh.ANNOTATION].startswith("fatal: node: 7 of 8 GPUs")
    assert [w[1] for w in evictions] == [
        "/api/v1/namespaces/team-a/pods/trainer-0/eviction",
        "/api/v1/namespaces/team-b/pods/trainer-1/eviction",
    ]
    assert not any(w[0] == "DELETE" for w in api.writes), "pods are evicted, never deleted"
    for _, _, _, obj in evictions + events:
        assert render.validate(obj, VERSION) == [], obj
    assert {e[3]["reason"] for e in events} == {"GPUHealthCordon", "GPUHealthEvict"}
    assert "disruption budget holds team-b/trainer-1" in err.replace(
        "PodDisruptionBudget holds", "disruption budget holds"
    )


def test_only_a_round_that_may_cordon_lists_the_pool_and_from_the_cache(api: Api, tmp_path: Path) -> None:
    """At 7,500 nodes a whole-pool list from every agent every round would swamp the API servers."""
    proc, _ = run_agent(api.kubeconfig(tmp_path / "kubeconfig"), "healthy", rounds=3)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert api.reads and not any(r.startswith("/api/v1/nodes?") for r in api.reads), api.reads
    proc, _ = run_agent(api.kubeconfig(tmp_path / "kubeconfig"), "xid-79-off-the-bus")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    (listed,) = [r for r in api.reads if r.startswith("/api/v1/nodes?")]
    assert "labelSelector=superkube.io/pool%3Dgpu" in listed and "resourceVersion=0" in listed


class FakeKube:
    """The agent's calls on a list of nodes; counts pool lists, applies cordons."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.listed = 0

    def node(self, name: str) -> dict[str, Any]:
        return self.nodes[name]

    def pool_nodes(self, pool: str) -> list[dict[str, Any]]:
        self.listed += 1
        return list(self.nodes.values())

    def pods_on(self, name: str) -> list[dict[str, Any]]:
        return []

    def patch_node(self, name: str, body: Any) -> None:
        self.nodes[name] = node(name, cordoned=True)

    def evict(self, pod: Any) -> bool:
        return True

    def create_event(self, body: Any) -> None:
        pass


def test_each_agent_counts_only_its_own_node_so_a_pool_sum_is_exact() -> None:
    kube = FakeKube(
        [
            node("gpu-1"),
            *(node(f"gpu-{i}", cordoned=True) for i in range(2, 4)),
            *(node(f"gpu-{i}") for i in range(4, 41)),
        ]
    )
    agent = nh.Agent("gpu-1", "gpu", lambda: verdict_of("xid-79-off-the-bus"), kube, 0.5)
    agent.round()
    assert agent.metrics.cordoned.labels("gpu")._value.get() == 1  # its own cordon, not the pool's 3
    healthy = nh.Agent("gpu-5", "gpu", lambda: verdict_of("healthy", "gpu-5"), kube, 0.5)
    healthy.round()
    assert healthy.metrics.cordoned.labels("gpu")._value.get() == 0
    assert kube.listed == 1  # the healthy round read no pool


def test_dry_run_sends_no_write(api: Api, tmp_path: Path) -> None:
    proc, _ = run_agent(api.kubeconfig(tmp_path / "kubeconfig"), "xid-48-dbe", "--dry-run")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert api.writes == []
    assert "dry-run: would cordon gpu-1" in err and "dry-run: would evict team-a/trainer-0" in err


def test_without_an_api_server_it_backs_off_and_keeps_serving_metrics(tmp_path: Path) -> None:
    gone = Api(POOL, PODS, set())
    gone.server.shutdown()
    gone.server.server_close()  # nothing listens on its port any more
    proc, port = run_agent(gone.kubeconfig(tmp_path / "kubeconfig"), "healthy", rounds=3)
    try:
        deadline = time.monotonic() + 30
        healthy = 'superkube_health_checks_total{result="healthy"}'
        seen: dict[str, float] = {}
        while time.monotonic() < deadline and seen.get(healthy, 0) < 2:
            with contextlib.suppress(OSError):
                seen = metrics(port)
            time.sleep(0.05)
        # rounds go on (the probe runs, the agent lives) while the API is down, and it says so
        assert seen.get(healthy, 0) >= 2 and seen["superkube_health_api_up"] == 0.0
    finally:
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert err.count("API server unreachable") == 3 and "Traceback" not in err


def test_a_malformed_reading_is_one_line(api: Api, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"node": "gpu-1", "vm_size": "x", "expected_gpus": "eight", "gpus": []}))
    proc, _ = run_agent(api.kubeconfig(tmp_path / "k"), bad)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.strip().splitlines()[-1].startswith(f"{nh.COMPONENT}: {bad}: expected_gpus")
    assert "Traceback" not in err
