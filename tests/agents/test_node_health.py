"""The health decisions: recorded GPU readings -> verdict -> actions, the breaker, every request body
against the official schema; and the per-node agent as a process against the real API server, as
its service account on its node, counting what it asks the server (its audit log)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from superkube.agents import gpu_probe, kubeapi
from superkube.agents import node_health as nh
from superkube.cluster import render
from superkube.cluster.cloudinit import POOL_LABEL
from superkube.harness.apiserver import LocalApi
from superkube.model.spec import PREFLIGHT_TAINT_KEY
from tests.agents.conftest import admin, apply, identity, make_node, namespace, unique

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
            "labels": {POOL_LABEL: "gpu", "kubernetes.io/hostname": name},
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


def test_behind_the_preflight_taint_the_agent_reports_preflight_not_its_reading() -> None:
    """A fatal verdict written during a failed preflight would outlive the pass that lifts the taint,
    and the controller would cordon a node that had just passed (the lab saw it)."""
    fatal = verdict_of("xid-79-off-the-bus")
    assert nh.note(fatal, node("gpu-1", preflight=True)) == nh.IN_PREFLIGHT
    assert (
        nh.reported(
            {"metadata": {"name": "gpu-1", "annotations": {nh.VERDICT_ANNOTATION: nh.IN_PREFLIGHT}}}
        ).level
        == "healthy"
    )  # type: ignore[union-attr]
    assert nh.note(fatal, node("gpu-1")).startswith("fatal")  # past preflight: what the GPUs read
    patches: list[dict[str, Any]] = []
    for behind, expected in ((True, nh.IN_PREFLIGHT), (False, "fatal")):
        agent = nh.Agent(
            "gpu-1", "gpu", lambda: fatal, SimpleNamespace(patch_node=lambda n, p: patches.append(p)),
            lambda behind=behind: node("gpu-1", preflight=behind),
        )  # fmt: skip
        assert agent.round().startswith(expected)
    assert [p["metadata"]["annotations"][nh.VERDICT_ANNOTATION].split(":")[0] for p in patches] == [
        nh.IN_PREFLIGHT,
        "fatal",
    ]


def test_a_drain_moves_the_balloons_but_no_other_system_pod() -> None:
    held = pod("balloon-gpu-5d8f9-x2x", "superkube-system",
               meta={"labels": {"app.kubernetes.io/component": "balloons"}})  # fmt: skip
    agent = pod("superkube-node-health-gpu-x", "superkube-system", owner="DaemonSet")
    lookalike = pod("balloon-gpu-fake", "superkube-system")  # no balloons label: not one of ours
    assert [p.name for p in nh.evictable([held, agent, lookalike, *PODS])] == [
        "balloon-gpu-5d8f9-x2x", "trainer-0", "trainer-1"
    ]  # fmt: skip


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


# --- the agent as a process, against the real API server ----------------------------------------


def test_the_report_patch_is_a_valid_node_change() -> None:
    n = node("gpu-1")
    patch = nh.report_patch("fatal: GPU 3: Xid 79: GPU has fallen off the bus", AT)
    patched = {**n, "metadata": {**n["metadata"], "annotations": patch["metadata"]["annotations"]}}
    assert render.validate(patched, VERSION) == []


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
    node_name: str = "gpu-1",
) -> tuple[subprocess.Popen[str], int]:
    """An agent as a process on node `node_name` of pool gpu; `reading` names a recorded reading or is a file."""
    port = free_port()
    path = reading if isinstance(reading, Path) else READINGS / f"{reading}.json"
    if node_name != "gpu-1" and path.parent == READINGS:
        doc = json.loads(path.read_text())
        path = kubeconfig.parent / f"{node_name}-{path.name}"
        path.write_text(json.dumps({**doc, "node": node_name}))
    command = [sys.executable, "-m", module, "--node", node_name]
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
        if line and not line.startswith("#")
    }


@pytest.fixture(scope="module")
def agent_api(api: LocalApi) -> LocalApi:
    """The real API server with the health agent's service account, role and admission policy, as
    the layer renders them."""
    from modules.platform import node_health as component
    from modules.platform.foundation import NAMESPACE

    if NAMESPACE not in {n.metadata.name for n in admin(api).list_namespace().items}:
        namespace(api, NAMESPACE)
    apply(api, *component.agent_access("health"), *component.fence("health"))
    return api


def verdict_on(api: LocalApi, name: str) -> str | None:
    notes = admin(api).read_node(name).metadata.annotations or {}
    return notes.get(nh.VERDICT_ANNOTATION)


def test_the_agent_reports_on_its_own_node_and_reads_nothing_else(
    agent_api: LocalApi, tmp_path: Path
) -> None:
    """As its service account on its node: it watches that one Node, writes its verdict there when it
    changes (never again while it holds), and asks for no other node and no pod."""
    from modules.platform.foundation import NAMESPACE

    name = unique("gpu")
    make_node(agent_api, name, {POOL_LABEL: "gpu"})
    for other in range(3):
        make_node(agent_api, f"{name}-other-{other}", {POOL_LABEL: "gpu"})
    kubeconfig = identity(agent_api, NAMESPACE, nh.COMPONENT, name)
    user = f"system:serviceaccount:{NAMESPACE}:{nh.COMPONENT}"
    before = len(agent_api.requests(user))  # other tests' agents use the same account on this server
    proc, _ = run_agent(kubeconfig, "healthy", rounds=3, node_name=name)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert verdict_on(agent_api, name) == "healthy"
    proc, _ = run_agent(kubeconfig, "xid-79-off-the-bus", rounds=3, node_name=name)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert verdict_on(agent_api, name) == (
        "fatal: node: 7 of 8 GPUs a Standard_ND96isr_H100_v5 has are visible (missing index 6)"
    )
    assert admin(agent_api).read_node(name).spec.unschedulable is not True  # cordons are the controller's
    requests = agent_api.requests(user)[before:]
    nodes = [r for r in requests if "/nodes" in r["uri"]]
    assert nodes and all(
        f"fieldSelector=metadata.name%3D{name}" in r["uri"]
        or r["uri"].split("?")[0].endswith(f"/nodes/{name}")
        for r in nodes
    ), nodes
    assert not any("/pods" in r["uri"] for r in requests)
    # one write per change of verdict (two runs: healthy, then fatal), not one per round
    assert [r["verb"] for r in nodes if r["verb"] == "patch"] == ["patch", "patch"]


def test_dry_run_writes_nothing(agent_api: LocalApi, tmp_path: Path) -> None:
    from modules.platform.foundation import NAMESPACE

    name = unique("gpu")
    make_node(agent_api, name, {POOL_LABEL: "gpu"})
    kubeconfig = identity(agent_api, NAMESPACE, nh.COMPONENT, name)
    proc, _ = run_agent(kubeconfig, "xid-48-dbe", "--dry-run", node_name=name)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert verdict_on(agent_api, name) is None and "dry-run: would report fatal: GPU 2: Xid 48" in err


def test_without_an_api_server_it_backs_off_and_keeps_serving_metrics(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    proc, metrics_port = run_agent(kubeconfig, "healthy", rounds=3)
    try:
        deadline = time.monotonic() + 30
        healthy = 'superkube_health_checks_total{result="healthy"}'
        seen: dict[str, float] = {}
        while time.monotonic() < deadline and seen.get(healthy, 0) < 2:
            with contextlib.suppress(OSError):
                seen = metrics(metrics_port)
            time.sleep(0.05)
        # rounds go on (the probe runs, the agent lives) while the API is down, and it says so
        assert seen.get(healthy, 0) >= 2 and seen["superkube_health_api_up"] == 0.0
    finally:
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert err.count("API server unreachable") == 3 and "Traceback" not in err


def test_a_malformed_reading_is_one_line(api: LocalApi, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"node": "gpu-1", "vm_size": "x", "expected_gpus": "eight", "gpus": []}))
    proc, _ = run_agent(api.kubeconfig, bad)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.strip().splitlines()[-1].startswith(f"{nh.COMPONENT}: {bad}: expected_gpus")
    assert "Traceback" not in err


def test_the_peer_check_is_off_unless_asked_and_its_flags_are_checked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from superkube.agents import host_checks

    base = ["--node", "gpu-1", "--pool", "gpu", "--reading", str(READINGS / "healthy.json")]
    args = nh._args(base)
    assert args.peers == 0 and args.host.peers is None  # the list and the connections only when asked
    args = nh._args([*base, "--peers=3"])
    assert (args.peers, args.peer_port, args.peer_list_limit, args.peer_refresh) == (
        3, host_checks.KUBELET_PORT, host_checks.PEER_LIST_LIMIT, host_checks.PEER_REFRESH_S,
    )  # fmt: skip
    for bad, said in (
        ("--peers=1", "--peers must be 0 or from 2"),
        ("--peers=101", "--peers must be 0 or from 2 to --peer-list-limit"),
        ("--peer-refresh=5", "--peer-refresh must be at least 60 seconds"),
    ):
        with pytest.raises(SystemExit) as exited:
            nh._args([*base, "--peers=3", bad])
        assert exited.value.code == 2 and said in capsys.readouterr().err, bad


def test_every_filesystem_flag_is_a_watched_filesystem_in_order() -> None:
    base = ["--node", "gpu-1", "--pool", "gpu", "--reading", str(READINGS / "healthy.json")]
    args = nh._args([*base, "--filesystem=root=/host/fs/root", "--filesystem=data=/host/fs/data"])
    assert list(args.host.filesystems) == [("root", "/host/fs/root"), ("data", "/host/fs/data")]
