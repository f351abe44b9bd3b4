"""The GPU reset, on the real API server with a stand-in NVML and nvidia-smi (tests/agents/
standin_nvml.py): a lent GPU is never reset. First the reset agent alone (what it records, and when it
refuses), then the whole loop as the layer's service accounts under its admission policies: the health
agent reports a fault a reset may clear, the controller cordons, drains and labels the node, the reset
clears the GPUs, the agent forgives the Xid dcgm-exporter still reports, and the controller uncordons."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from superkube.agents import gpu_probe, gpu_reset, kubeapi
from superkube.agents import health_controller as hc
from superkube.agents import node_health as nh
from superkube.agents.kubeapi import Kube
from superkube.cluster import health
from superkube.harness.apiserver import LocalApi
from tests.agents import standin_nvml
from tests.agents.conftest import admin, apply, identity, make_node, namespace, serving, unique

VM_SIZE = "Standard_ND96isr_H100_v5"


class Node:
    """One GPU node's stand-ins: its GPUs' state file, its nvidia-smi, its dcgm-exporter's last Xids."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **faults: Any) -> None:
        self.state = tmp_path / "gpus.json"
        self.state.write_text(json.dumps(standin_nvml.state(**faults)))
        self.smi = standin_nvml.write_nvidia_smi(tmp_path, self.state)
        self.nvml = standin_nvml.module(self.state)
        monkeypatch.setitem(__import__("sys").modules, "pynvml", self.nvml)  # read_nvml imports it
        self.last_xid: dict[int, int] = {}

    @property
    def resets(self) -> int:
        return int(json.loads(self.state.read_text())["resets"])

    def reprobe(self, name: str) -> gpu_probe.Verdict:
        return gpu_probe.verdict(gpu_probe.read_nvml(name, VM_SIZE, 8), gpu_probe.thresholds())


@pytest.fixture
def dcgm() -> Iterator[tuple[str, dict[int, int]]]:
    """A dcgm-exporter on loopback serving the last Xid of each GPU from the dict it yields."""
    last: dict[int, int] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = standin_nvml.dcgm_text(last).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with serving(ThreadingHTTPServer(("127.0.0.1", 0), Handler)) as url:
        yield f"{url}/metrics", last


def cordoned_node(api: LocalApi, labelled: bool = True, pool: str = "gpu") -> str:
    """A node health cordoned (and drained) for a fault a reset may clear, labelled for the reset."""
    name = unique("reset")
    make_node(
        api, name, {"superkube.io/pool": pool, **({health.GPU_RESET_LABEL: "requested"} if labelled else {})}
    )
    at = kubeapi.now()
    value = "fatal: GPU 1: Xid 48: double-bit ECC error (uncorrectable memory error)" + health.RESET_HINT
    admin(api).patch_node(name, nh.report_patch(value, at))
    admin(api).patch_node(name, nh.cordon_patch(value, at))
    return name


def annotation(api: LocalApi, name: str, key: str = health.GPU_RESET) -> str:
    return str((admin(api).read_node(name).metadata.annotations or {}).get(key, ""))


def reset_of(api: LocalApi, name: str, node: Node, dcgm_url: str = "") -> gpu_reset.Reset:
    return gpu_reset.Reset(
        name, Kube(str(api.kubeconfig)), lambda: node.reprobe(name), node.nvml, dcgm_url, str(node.smi)
    )


def test_a_reset_that_clears_is_recorded_once_with_the_xids_to_forgive(
    api: LocalApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dcgm: tuple[str, dict[int, int]]
) -> None:
    url, last = dcgm
    last[1] = 48
    gpus = Node(tmp_path, monkeypatch, dbe={1: 2})
    name = cordoned_node(api)
    reset = reset_of(api, name, gpus, url)
    assert reset.round() is False
    value = annotation(api, name)
    outcome, at, forgiven = health.reset_outcome(value)
    assert (outcome, forgiven, gpus.resets) == ("cleared", {1: 48}, 1), value
    assert at >= annotation(api, name, health.CORDONED_AT)
    reset.round()  # the pod stays until the label goes: it never resets twice for one cordon
    assert gpus.resets == 1 and annotation(api, name) == value
    events = admin(api).list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items
    assert [e.reason for e in events if e.source.component == gpu_reset.COMPONENT] == ["GPUResetCleared"]


@pytest.mark.parametrize(
    ("faults", "said", "resets"),
    [
        ({"busy": {0: [4242]}}, "GPUs still in use, not reset: GPU 0: pid 4242", 0),
        ({"dbe": {3: 1}, "sticky": {3: True}}, "still fatal after the reset: fatal: GPU 3: 1 uncorrectable", 1),
        ({"dbe": {3: 1}, "reset_fails": "In use by another client"},
         "nvidia-smi --gpu-reset exited 3: Unable to reset GPU 00000001:00:00.0: In use by another client", 1),
    ],
    ids=["a-process-still-computes", "the-fault-stays", "nvidia-smi-refuses"],
)  # fmt: skip
def test_a_reset_that_cannot_clear_is_recorded_failed_with_why(
    api: LocalApi,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    faults: dict[str, Any],
    said: str,
    resets: int,
) -> None:
    gpus = Node(tmp_path, monkeypatch, **faults)
    name = cordoned_node(api)
    reset_of(api, name, gpus).round()
    value = annotation(api, name)
    assert value.startswith("failed ") and said in value, value
    assert gpus.resets == resets


def test_no_reset_without_the_controllers_label_or_after_this_cordons_outcome(
    api: LocalApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpus = Node(tmp_path, monkeypatch, dbe={1: 1})
    unlabelled = cordoned_node(api, labelled=False)
    reset_of(api, unlabelled, gpus).round()
    assert gpus.resets == 0 and annotation(api, unlabelled) == ""
    # an outcome older than the node's cordon is history: a new cordon gets its own reset
    name = cordoned_node(api)
    admin(api).patch_node(
        name, {"metadata": {"annotations": {health.GPU_RESET: "failed 2020-01-01T00:00:00Z: x"}}}
    )
    reset_of(api, name, gpus).round()
    assert gpus.resets == 1 and annotation(api, name).startswith("cleared ")


# --- the whole loop, as the layer's service accounts under its admission policies -----------------


@pytest.fixture(scope="module")
def layer_fences(api: LocalApi) -> LocalApi:
    from modules.platform import node_health as component
    from modules.platform import objects
    from modules.platform.foundation import NAMESPACE
    from tests.agents.test_real_api import _args

    core = admin(api)
    if NAMESPACE not in {n.metadata.name for n in core.list_namespace().items}:
        namespace(api, NAMESPACE)
    controller = [m for m in component.controller(_args()) if m["kind"] != "Deployment"]
    reset_access = objects.service_account_access(
        component.GPU_RESET, component.COMPONENT, NAMESPACE, component.GPU_RESET_RULES
    )
    apply(api, *component.agent_access("health"), *component.fence("health"), *controller,
          *component.fence("health-controller"), *reset_access, *component.fence("gpu-reset"))  # fmt: skip
    # a new admission policy takes a moment to be enforced: wait until both refuse what they must,
    # so that a test's first request that a policy should refuse is not admitted before it loads
    probe = unique("fence-probe")
    make_node(api, probe, {"superkube.io/pool": probe})
    cordon = nh.cordon_patch("probe", kubeapi.now())
    ctl, reset = as_kube(api, hc.COMPONENT, probe), as_kube(api, component.GPU_RESET, probe)
    refused(lambda: ctl.patch_node(probe, cordon))
    note = {"metadata": {"annotations": {health.GPU_RESET: "failed 2099-01-01T00:00:00Z: probe"}}}
    refused(lambda: reset.patch_node(probe, note))
    return api


def as_kube(api: LocalApi, account: str, node: str) -> Kube:
    from modules.platform.foundation import NAMESPACE

    return Kube(str(identity(api, NAMESPACE, account, node)))


def refused(call: Any) -> str:
    from tests.agents.test_real_api import refusal

    return refusal(call)


def plain(api: LocalApi, name: str) -> dict[str, Any]:
    core = admin(api)
    node: dict[str, Any] = core.api_client.sanitize_for_serialization(core.read_node(name))
    return node


def test_the_loop_cordons_drains_resets_forgives_and_uncordons(
    layer_fences: LocalApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dcgm: tuple[str, dict[int, int]]
) -> None:
    from modules.platform import node_health as component

    api = layer_fences
    url, last = dcgm
    pool = unique("resetpool")
    name, other = f"{pool}-a", f"{pool}-b"
    for n in (name, other, f"{pool}-c"):
        make_node(api, n, {"superkube.io/pool": pool})
    gpus = Node(tmp_path, monkeypatch, dbe={1: 2})
    last[1] = 48
    # the health agent, as its account: Xid 48 from the exporter and the ECC count from NVML
    probe = kubeapi.probe_of(name, VM_SIZE, 8, None, gpu_probe.thresholds(), url)
    agent = nh.Agent(name, pool, probe, as_kube(api, nh.COMPONENT, name), lambda: plain(api, name))
    assert agent.round().endswith(health.RESET_HINT)
    ctl_kube = as_kube(api, hc.COMPONENT, other)
    ctl = hc.Controller(ctl_kube, lambda: {n["metadata"]["name"]: hc.slim(n) for n in
                        (plain(api, x) for x in (name, other, f"{pool}-c"))}, frozenset({pool}), 0.5)  # fmt: skip

    def rounds(until: Any, most: int = 5) -> None:
        for _ in range(most):
            ctl.round()
            if until():
                return
        raise AssertionError(f"not after {most} rounds: {plain(api, name)['metadata']}")

    def labelled() -> bool:
        labels = plain(api, name)["metadata"].get("labels") or {}
        return bool(labels.get(health.GPU_RESET_LABEL) == health.RESET_REQUESTED)

    rounds(labelled)  # cordon, drained (no pods), then the label
    assert plain(api, name)["spec"].get("unschedulable") is True
    # the controller may not uncordon before a reset cleared the node, nor label another value
    uncordon = {"spec": {"unschedulable": False}}
    assert "uncordon only a node whose GPU reset cleared it" in refused(
        lambda: ctl_kube.patch_node(name, uncordon)
    )
    odd = {"metadata": {"labels": {health.GPU_RESET_LABEL: "now"}}}
    assert f"may only set the {health.GPU_RESET_LABEL} label" in refused(
        lambda: ctl_kube.patch_node(name, odd)
    )
    # the reset, as its account on its node; on another node, or another annotation, refused
    reset_kube = as_kube(api, component.GPU_RESET, name)
    reset = gpu_reset.Reset(name, reset_kube, lambda: gpus.reprobe(name), gpus.nvml, url, str(gpus.smi))
    note = {"metadata": {"annotations": {health.GPU_RESET: "cleared 2099-01-01T00:00:00Z"}}}
    assert "may change only the node its pod runs on" in refused(lambda: reset_kube.patch_node(other, note))
    verdict = {"metadata": {"annotations": {health.VERDICT: "healthy"}}}
    assert f"may only set the {health.GPU_RESET} annotation" in refused(
        lambda: reset_kube.patch_node(name, verdict)
    )
    reset.round()
    assert annotation(api, name).startswith("cleared ") and gpus.resets == 1
    ctl.round()  # cleared, but the agent has not judged the reset GPUs yet: still cordoned
    assert plain(api, name)["spec"].get("unschedulable") is True
    time.sleep(1.1)  # the agent's verdict time must not be older than the reset's (second resolution)
    assert agent.round() == "healthy"  # Xid 48 is still the exporter's last on GPU 1: forgiven
    rounds(lambda: not plain(api, name)["spec"].get("unschedulable"))
    assert health.GPU_RESET_LABEL not in (plain(api, name)["metadata"].get("labels") or {})
    notes = plain(api, name)["metadata"]["annotations"]  # the cordon's marks went with it
    assert not {health.CORDONED, health.CORDONED_AT, health.DRAINED_AT} & set(notes), notes
    # a different Xid on that GPU after the reset is not forgiven
    last[1] = 79
    assert agent.round().startswith("fatal: GPU 1: Xid 79")


def test_an_xid_a_reset_does_not_clear_fails_the_reset_rather_than_be_forgiven(
    api: LocalApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dcgm: tuple[str, dict[int, int]]
) -> None:
    url, last = dcgm
    last.update({1: 48, 3: 74})  # NVLink's Xid came after the node was labelled
    gpus = Node(tmp_path, monkeypatch, dbe={1: 2})
    name = cordoned_node(api)
    reset_of(api, name, gpus, url).round()
    value = annotation(api, name)
    assert value.startswith("failed ") and "Xid 74 on GPU 3: not a fault a reset clears" in value, value
    assert gpus.resets == 0


def test_the_controller_asks_once_per_cordon_and_may_not_move_the_cordons_time(
    layer_fences: LocalApi,
) -> None:
    """What admission holds the controller to, beyond its code: the cordon's time is set by the cordon
    alone (a reset's outcome is measured against it); the label only on a cordoned, drained node
    reported fatal whose reset has not ended since; an uncordon only after the reset it asked for."""
    api = layer_fences
    pool = unique("asks")
    name, other = f"{pool}-a", f"{pool}-b"
    for n in (name, other):
        make_node(api, n, {"superkube.io/pool": pool})
    value = "fatal: GPU 1: Xid 48: double-bit ECC error" + health.RESET_HINT
    admin(api).patch_node(name, nh.report_patch(value, kubeapi.now()))
    ctl = as_kube(api, hc.COMPONENT, other)
    ctl.patch_node(name, nh.cordon_patch(value, kubeapi.now()))  # the cordon sets its time: admitted
    label = {"metadata": {"labels": {health.GPU_RESET_LABEL: health.RESET_REQUESTED}}}
    assert "may label for a reset only a cordoned, drained node" in refused(
        lambda: ctl.patch_node(name, label)
    )
    backdate = {"metadata": {"annotations": {health.CORDONED_AT: "2000-01-01T00:00:00Z"}}}
    assert "may set the cordon's time only in the request that cordons" in refused(
        lambda: ctl.patch_node(name, backdate)
    )
    # an outcome since this cordon (here written by the admin) means the reset was had: no second one
    outcome = {"metadata": {"annotations": {health.GPU_RESET: f"cleared {kubeapi.stamp(kubeapi.now())}"}}}
    admin(api).patch_node(name, outcome)
    ctl.patch_node(name, {"metadata": {"annotations": {nh.DRAINED_AT: kubeapi.stamp(kubeapi.now())}}})
    assert "may label for a reset only" in refused(lambda: ctl.patch_node(name, label))
    # cleared since the cordon and no longer fatal, but not the reset it asked for (no label)
    admin(api).patch_node(name, nh.report_patch("healthy", kubeapi.now()))
    uncordon = {"spec": {"unschedulable": False}}
    assert "uncordon only a node whose GPU reset cleared it" in refused(
        lambda: ctl.patch_node(name, uncordon)
    )
