"""The active check (matrix-multiply burn, memory and PCIe bandwidth) judged against the GPU model's
expected figures, and the periodic GPU test that records it on its own node.

The burn-*.json readings are written in the probe's format with the figures the burn reports: a
healthy H100 node, one GPU slow under load, one computing wrong numbers, one on a narrowed PCIe link.
They are not captures from failing hardware: this machine has no GPU. The burn itself runs on CUDA
only; tests/gpu runs it on a real GPU (`pytest -m gpu`)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from modules.platform import node_health as component
from superkube.agents import gpu_burn, gpu_probe, gpu_test
from superkube.agents import node_health as nh
from superkube.agents import preflight as pf
from superkube.cli import app
from superkube.cluster import render
from superkube.harness.apiserver import LocalApi
from superkube.model import vmsizes
from superkube.model.spec import POOL_LABEL
from tests.agents.conftest import admin, identity, make_node, namespace, unique
from tests.agents.conftest import apply as apply_objects
from tests.agents.test_node_health import READINGS, node, run_agent
from tests.agents.test_preflight import admits as preflight_admits
from tests.agents.test_preflight import apply
from tests.agents.test_real_api import refusal

VERSION = "1.35.0"
SA = "system:serviceaccount:superkube-system:superkube-gpu-test"


def judged(name: str) -> gpu_probe.Verdict:
    return gpu_probe.verdict(gpu_probe.load_reading(READINGS / f"{name}.json"))


CASES = [
    ("burn-healthy", "healthy", []),
    (
        "burn-slow-gpu5",
        "fatal",
        [
            ("warning", 2, "bf16 matrix multiply 611 TFLOP/s, 87% of the 700 a H100-SXM5-80GB reaches"),
            ("fatal", 5, "bf16 matrix multiply 512.3 TFLOP/s, 73% of the 700 a H100-SXM5-80GB reaches"),
        ],
    ),
    (
        "burn-wrong-results-gpu3",
        "fatal",
        [
            ("fatal", 3, "2 matrix products differed from its first on the same inputs (silent data corruption)"),
            ("fatal", 3, "its matrix product differs from the other GPUs' on the same inputs (silent data corruption)"),
        ],
    ),
    (
        "burn-pcie-x8-gpu6",
        "fatal",
        [("fatal", 6, "host-to-device copy 26.3 GB/s, 58% of the 45 a H100-SXM5-80GB reaches")],
    ),
]  # fmt: skip


@pytest.mark.parametrize(("reading", "level", "findings"), CASES, ids=[c[0] for c in CASES])
def test_each_burn_is_judged_against_the_models_figures(
    reading: str, level: str, findings: list[tuple[str, int, str]]
) -> None:
    result = judged(reading)
    assert result.level == level
    assert [(f.level, f.gpu, f.reason) for f in result.findings] == findings


def test_every_burn_reading_on_file_has_a_case() -> None:
    assert {p.stem for p in READINGS.glob("burn-*.json")} == {c[0] for c in CASES}


def test_the_same_figures_on_an_unknown_model_are_recorded_not_judged(tmp_path: Path) -> None:
    doc = json.loads((READINGS / "burn-slow-gpu5.json").read_text())
    doc["vm_size"] = "Standard_ND40rs_v2"  # not in src/superkube/data/vm_sizes.yaml
    path = tmp_path / "reading.json"
    path.write_text(json.dumps(doc))
    result = gpu_probe.verdict(gpu_probe.load_reading(path))
    assert [(f.level, f.reason) for f in result.findings] == [
        (
            "warning",
            "no expected performance for Standard_ND40rs_v2 in src/superkube/data/gpu_health.yaml: the burn's figures "
            "were recorded, not judged",
        )
    ]


def test_every_gpu_size_has_expected_figures() -> None:
    """A GPU VM size added without them would have its burns recorded but never judged."""
    expected = gpu_probe.thresholds().performance.expected
    sizes = yaml.safe_load(vmsizes.DATA.read_text())["sizes"]
    models = {facts["gpu_model"] for facts in sizes.values() if facts["gpus"]}
    assert models and models <= set(expected), models - set(expected)
    for model in models:
        assert set(expected[model]) == {key for key, *_ in gpu_probe.FIGURES}, model


@pytest.mark.parametrize(
    ("reading", "codes"),
    [
        ("burn-slow-gpu5", {"performance"}),
        ("burn-pcie-x8-gpu6", {"performance"}),
        ("burn-wrong-results-gpu3", {"wrong-results"}),
    ],
)
def test_preflight_counts_burn_failures_under_bounded_reasons(reading: str, codes: set[str]) -> None:
    assert {pf.reason_code(f) for f in judged(reading).findings if f.level == "fatal"} == codes


def test_explain_shows_the_burns_findings() -> None:
    result = CliRunner().invoke(
        app, ["health", "explain", str(READINGS / "burn-wrong-results-gpu3.json"), "-o", "json"]
    )
    assert result.exit_code == 1
    assert {f["reason"] for f in json.loads(result.stdout)["findings"]} == {
        reason for _, _, reason in CASES[2][2]
    }


def test_a_malformed_figure_is_one_line_naming_it(tmp_path: Path) -> None:
    doc = json.loads((READINGS / "burn-healthy.json").read_text())
    doc["performance"]["gpus"][4]["memory_copy_gbps"] = -1
    path = tmp_path / "reading.json"
    path.write_text(json.dumps(doc))
    result = CliRunner().invoke(app, ["health", "explain", str(path)])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {path}: performance.gpus.4.memory_copy_gbps: "), line


def test_without_pytorch_the_burn_says_so_in_one_line() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(gpu_burn.BurnError, match="needs PyTorch with CUDA"):
            gpu_burn.measure(1)
    else:  # a machine with PyTorch but no GPU
        with pytest.raises(gpu_burn.BurnError, match="found no CUDA GPU"):
            gpu_burn.measure(1)


# --- the periodic test's fence -------------------------------------------------------------------------


def admits(old: dict[str, Any], new: dict[str, Any], node_name: str = "gpu-1") -> list[str]:
    """The messages of the gpu-test policy's validations that reject this update (empty: admitted)."""
    return preflight_admits(old, new, SA, node_name, agent="gpu-test")


def test_the_fence_admits_the_tests_own_result_and_is_a_valid_object() -> None:
    for obj in component.fence("gpu-test"):
        assert render.validate(obj, VERSION) == [], obj["kind"]
    before = node("gpu-1")
    assert admits(before, apply(before, gpu_test.result_patch(before, "failed: slow"))) == []
    bare = node("gpu-1")
    del bare["metadata"]["annotations"]
    assert admits(bare, apply(bare, gpu_test.result_patch(bare, "passed"))) == []


BREACHES = [
    ("another node", None, "gpu-2", "may change only the node its pod runs on"),
    ("cordon", lambda n: n["spec"].update(unschedulable=True), "gpu-1", "may not cordon or uncordon"),
    (
        "taint the node",
        lambda n: n["spec"].setdefault("taints", []).append({"key": "superkube.io/preflight", "effect": "NoSchedule"}),
        "gpu-1",
        "may not change taints",
    ),
    ("relabel", lambda n: n["metadata"]["labels"].update({"superkube.io/pool": "cpu"}), "gpu-1", "may not change labels"),
    (
        "the health agent's annotation",
        lambda n: n["metadata"]["annotations"].update({nh.ANNOTATION: "x"}),
        "gpu-1",
        f"may only set the {gpu_test.RESULT_ANNOTATION} annotation",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("change", "on", "message"), [b[1:] for b in BREACHES], ids=[b[0] for b in BREACHES])
def test_the_fence_rejects_anything_else(change: Any, on: str, message: str) -> None:
    before = node("gpu-1")
    after = copy.deepcopy(before)
    if change:
        change(after)
    else:
        after = apply(before, gpu_test.result_patch(before, "passed"))
    assert f"the periodic GPU test {message}" in admits(before, after, node_name=on)


# --- the periodic test as a process, and the health agent acting on its result ------------------------


@pytest.fixture(scope="module")
def gpu_test_fenced(api: LocalApi) -> LocalApi:
    """The periodic test's service account, role and admission policy, as the layer renders them."""
    from modules.platform.foundation import NAMESPACE

    core = admin(api)
    if NAMESPACE not in {n.metadata.name for n in core.list_namespace().items}:
        namespace(api, NAMESPACE)
    from modules.platform import objects

    access = objects.service_account_access(
        component.GPU_TEST, component.COMPONENT, NAMESPACE, component.GPU_TEST_RULES
    )
    apply_objects(api, *access, *component.fence("gpu-test"))
    return api


def run_test(kubeconfig: Path, node_name: str, reading: str, *extra: str) -> tuple[int, str]:
    proc, _ = run_agent(kubeconfig, reading, *extra, module="superkube.agents.gpu_test", node_name=node_name)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def as_gpu_test(api: LocalApi, node_name: str) -> Path:
    """The periodic test's credentials as its pod on `node_name` holds them."""
    from modules.platform.foundation import NAMESPACE

    return identity(api, NAMESPACE, gpu_test.COMPONENT, node_name)


@pytest.mark.parametrize(
    ("reading", "code", "event", "says"),
    [
        ("burn-healthy", 0, ("Normal", "GpuTestPassed"), "passed "),
        ("burn-slow-gpu5", 1, ("Warning", "GpuTestFailed"), "failed "),
    ],
)
def test_the_test_records_its_result_on_its_own_node(
    gpu_test_fenced: LocalApi, reading: str, code: int, event: tuple[str, str], says: str
) -> None:
    """As its own service account, through its admission policy, on the real server: the result on
    its own node (and nothing else of it changed), an Event that says so; another node refused."""
    api = gpu_test_fenced
    mine, other = unique("gputest"), unique("gputest")
    before = make_node(api, mine, {POOL_LABEL: "gpu"})
    make_node(api, other, {POOL_LABEL: "gpu"})
    kubeconfig = as_gpu_test(api, mine)
    returncode, err = run_test(kubeconfig, mine, reading)
    assert returncode == code, err
    core = admin(api)
    after = core.api_client.sanitize_for_serialization(core.read_node(mine))
    assert after["metadata"]["annotations"][gpu_test.RESULT_ANNOTATION].startswith(says)
    assert {k: v for k, v in after["metadata"]["annotations"].items() if k != gpu_test.RESULT_ANNOTATION} == (
        before["metadata"].get("annotations") or {}
    )
    assert after["spec"] == before["spec"] and after["metadata"]["labels"] == before["metadata"]["labels"]
    (ev,) = core.list_namespaced_event("default", field_selector=f"involvedObject.name={mine}").items
    assert (ev.type, ev.reason) == event
    if code:
        assert "GPU 5: bf16 matrix multiply 512.3 TFLOP/s" in ev.message
    other_node = core.api_client.sanitize_for_serialization(core.read_node(other))
    theirs = client_of(kubeconfig)
    assert "may change only the node its pod runs on" in refusal(
        lambda: theirs.patch_node(other, gpu_test.result_patch(other_node, "passed"))
    )


def test_a_dry_run_records_nothing(gpu_test_fenced: LocalApi) -> None:
    api = gpu_test_fenced
    mine = unique("gputest")
    make_node(api, mine, {POOL_LABEL: "gpu"})
    kubeconfig = as_gpu_test(api, mine)
    user = f"system:serviceaccount:superkube-system:{gpu_test.COMPONENT}"
    seen = len(api.requests(user))
    returncode, err = run_test(kubeconfig, mine, "burn-slow-gpu5", "--dry-run")
    assert returncode == 1 and "dry-run: would record on " + mine + ": failed" in err, err
    assert {r["verb"] for r in api.requests(user)[seen:]} <= {"get", "list", "watch"}
    assert gpu_test.RESULT_ANNOTATION not in (admin(api).read_node(mine).metadata.annotations or {})


def client_of(kubeconfig: Path) -> Any:
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))


def test_without_an_api_server_the_result_is_said_and_the_exit_is_3(api: LocalApi, tmp_path: Path) -> None:
    """The server's address with nothing listening there (the server's CA, a port no one holds)."""
    from superkube.harness import apiserver

    gone = apiserver.kubeconfig(tmp_path / "k", f"https://127.0.0.1:{apiserver.free_port()}",
                                api.dir / "pki" / "ca.crt", {"token": "unused"})  # fmt: skip
    returncode, err = run_test(gone, "gpu-1", "burn-healthy", "--max-backoff", "0.05")
    assert returncode == 3 and "Traceback" not in err
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith("superkube-gpu-test: the API server was not reachable in 5 attempts; the result (passed ")
    )


def test_a_node_that_failed_its_test_is_reported_fatal_and_the_controller_takes_it_out(api: LocalApi) -> None:
    """On the real server: the agent reads a failed periodic test off its node and reports fatal; the
    controller cordons that node from the report; a later passed test is no finding."""
    from superkube.agents import health_controller as hc
    from superkube.agents.kubeapi import Kube

    name = unique("gputest")
    make_node(api, name, {POOL_LABEL: "gpu"})
    kube = Kube(str(api.kubeconfig))
    failed = "failed 2026-11-23T08:00:00Z: fatal: GPU 5: slow"
    kube.patch_node(name, {"metadata": {"annotations": {gpu_test.RESULT_ANNOTATION: failed}}})
    healthy = gpu_probe.load_reading(READINGS / "healthy.json")
    agent = nh.Agent(name, "gpu", lambda: gpu_probe.verdict(healthy), kube, lambda: kube.node(name))
    reported = agent.round()
    assert reported.startswith("fatal:") and "periodic GPU test failed 2026-11-23T08:00:00Z" in reported
    assert kube.node(name)["metadata"]["annotations"][nh.VERDICT_ANNOTATION] == reported
    assert agent.metrics.gpu_test_failed.labels("gpu")._value.get() == 1
    # the controller acts on the report as the server holds it (39 healthy nodes beside it)
    pool = {f"gpu-{i}": hc.slim(node(f"gpu-{i}")) for i in range(2, 41)} | {name: hc.slim(kube.node(name))}
    decisions = hc.Controller(kube, lambda: pool, frozenset({"gpu"}), 0.05).round()
    assert "periodic GPU test failed" in decisions[name].cordon
    assert kube.node(name)["spec"].get("unschedulable") is True
    # a passed test is no finding
    passed = "passed 2026-11-23T14:00:00Z"
    kube.patch_node(name, {"metadata": {"annotations": {gpu_test.RESULT_ANNOTATION: passed}}})
    again = nh.Agent(name, "gpu", lambda: gpu_probe.verdict(healthy), kube, lambda: kube.node(name))
    assert again.round() == "healthy"
    assert again.metrics.gpu_test_failed.labels("gpu")._value.get() == 0
