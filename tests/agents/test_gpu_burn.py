"""The active check (matrix-multiply burn, memory and PCIe bandwidth) judged against the GPU model's
expected figures, and the periodic GPU test that records it on its own node.

The burn-*.json readings are written in the probe's format with the figures the burn reports: a
healthy H100 node, one GPU slow under load, one computing wrong numbers, one on a narrowed PCIe link.
They are not captures from failing hardware: this machine has no GPU. The burn itself runs on CUDA
only; the device test at the end runs it on a real GPU (`pytest -m gpu`)."""

from __future__ import annotations

import copy
import json
import shutil
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
from superkube.model import vmsizes
from tests.agents.loopback import Api
from tests.agents.test_node_health import PODS, READINGS, node, run_agent
from tests.agents.test_preflight import admits as preflight_admits
from tests.agents.test_preflight import apply

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


def run_test(api: Api, tmp_path: Path, reading: str, *extra: str) -> tuple[int, str]:
    proc, _ = run_agent(api.kubeconfig(tmp_path / "k"), reading, *extra, module="superkube.agents.gpu_test")
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


@pytest.mark.parametrize(
    ("reading", "code", "event", "says"),
    [
        ("burn-healthy", 0, ("Normal", "GpuTestPassed"), "passed "),
        ("burn-slow-gpu5", 1, ("Warning", "GpuTestFailed"), "failed "),
    ],
)
def test_the_test_records_its_result_on_its_own_node(
    tmp_path: Path, reading: str, code: int, event: tuple[str, str], says: str
) -> None:
    api = Api([node("gpu-1"), node("gpu-2")], PODS, set())
    try:
        returncode, err = run_test(api, tmp_path, reading)
    finally:
        api.server.shutdown()
        api.server.server_close()
    assert returncode == code, err
    ((method, path, ctype, ops),) = [w for w in api.writes if w[0] == "PATCH"]
    assert (method, path, ctype) == ("PATCH", "/api/v1/nodes/gpu-1", "application/json-patch+json")
    after = apply(node("gpu-1"), ops)
    assert after["metadata"]["annotations"][gpu_test.RESULT_ANNOTATION].startswith(says)
    assert admits(node("gpu-1"), after) == []
    (ev,) = [w[3] for w in api.writes if w[1].endswith("/events")]
    assert (ev["type"], ev["reason"]) == event and render.validate(ev, VERSION) == []
    if code:
        assert "GPU 5: bf16 matrix multiply 512.3 TFLOP/s" in ev["message"]


def test_a_dry_run_records_nothing(tmp_path: Path) -> None:
    api = Api([node("gpu-1")], PODS, set())
    try:
        returncode, err = run_test(api, tmp_path, "burn-slow-gpu5", "--dry-run")
    finally:
        api.server.shutdown()
        api.server.server_close()
    assert returncode == 1 and api.writes == []
    assert "dry-run: would record on gpu-1: failed" in err


def test_without_an_api_server_the_result_is_said_and_the_exit_is_3(tmp_path: Path) -> None:
    gone = Api([node("gpu-1")], PODS, set())
    gone.server.shutdown()
    gone.server.server_close()
    returncode, err = run_test(gone, tmp_path, "burn-healthy", "--max-backoff", "0.05")
    assert returncode == 3 and "Traceback" not in err
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith("superkube-gpu-test: the API server was not reachable in 5 attempts; the result (passed ")
    )


class OneNode:
    """The health agent's calls for one healthy-probing node whose periodic test failed."""

    def __init__(self, n: dict[str, Any]) -> None:
        self.n, self.patches = n, []

    def patch_node(self, name: str, body: Any) -> None:
        self.patches.append(body)

    def pods_on(self, name: str) -> list[dict[str, Any]]:
        return []

    def create_event(self, body: Any) -> None:
        pass


def test_a_node_that_failed_its_test_is_reported_fatal_and_the_controller_takes_it_out() -> None:
    from superkube.agents import health_controller as hc

    n = node("gpu-1")
    n["metadata"]["annotations"][gpu_test.RESULT_ANNOTATION] = (
        "failed 2026-11-23T08:00:00Z: fatal: GPU 5: slow"
    )
    kube = OneNode(n)
    healthy = gpu_probe.load_reading(READINGS / "healthy.json")
    agent = nh.Agent("gpu-1", "gpu", lambda: gpu_probe.verdict(healthy), kube, lambda: n)
    reported = agent.round()
    assert reported.startswith("fatal:") and "periodic GPU test failed 2026-11-23T08:00:00Z" in reported
    assert agent.metrics.gpu_test_failed.labels("gpu")._value.get() == 1
    # the controller acts on the report
    n["metadata"]["annotations"].update(kube.patches[0]["metadata"]["annotations"])
    pool = {f"gpu-{i}": hc.slim(node(f"gpu-{i}")) for i in range(2, 41)} | {"gpu-1": hc.slim(n)}
    decisions = hc.Controller(kube, lambda: pool, frozenset({"gpu"}), 0.05).round()
    assert "periodic GPU test failed" in decisions["gpu-1"].cordon
    assert kube.patches[-1]["spec"] == {"unschedulable": True}
    # a passed test is no finding
    n["metadata"]["annotations"][gpu_test.RESULT_ANNOTATION] = "passed 2026-11-23T14:00:00Z"
    again = nh.Agent("gpu-1", "gpu", lambda: gpu_probe.verdict(healthy), OneNode(n), lambda: n)
    assert again.round() == "healthy"
    assert again.metrics.gpu_test_failed.labels("gpu")._value.get() == 0


# --- on a GPU -----------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_the_burn_on_the_real_gpus_computes_right_and_meets_the_models_figures() -> None:
    """On a GPU machine: a short burn on every GPU, each product bit-identical to its first and the
    GPUs agreeing; where the GPU's model is one src/superkube/data/vm_sizes.yaml knows, its figures pass."""
    assert shutil.which("nvidia-smi"), "this test needs an NVIDIA GPU and its driver"
    performance = gpu_burn.measure(seconds=10)
    print(performance.model_dump_json(indent=2))
    assert performance.gpus and all(
        g.matmul_tflops > 0 and g.matmul_mismatches == 0 for g in performance.gpus
    )
    assert len({g.checksum for g in performance.gpus}) == 1
    reading = gpu_probe.read_nvml("device", "device", expected_gpus=len(performance.gpus))
    name = reading.gpus[0].name
    sizes = yaml.safe_load(vmsizes.DATA.read_text())["sizes"]
    size = next((s for s, f in sizes.items() if f["gpus"] and f["gpu_model"].split("-")[0] in name), "device")
    result = gpu_probe.verdict(reading.model_copy(update={"vm_size": size, "performance": performance}))
    print(json.dumps(result.to_dict(), indent=2))
    assert [f for f in result.findings if f.level == "fatal"] == []
