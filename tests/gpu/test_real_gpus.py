"""On a machine with an NVIDIA GPU and its driver: the probe, the burn and the agents' probe on real
GPUs (`pytest -m gpu tests/gpu`). The default run leaves them out by their marker.

This module imports only what the agents' image holds (the agents, PyYAML, pydantic; PyTorch for the
burn), so it runs on a GPU machine with superkube installed without its other dependencies
(`pip install --no-deps .` and pydantic): `python -m pytest -m gpu --noconftest tests/gpu`."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml

from superkube.agents import gpu_burn, gpu_probe, kubeapi
from superkube.model import vmsizes

pytestmark = pytest.mark.gpu


def listed_gpus() -> int:
    smi = shutil.which("nvidia-smi")
    assert smi, "nvidia-smi is not on PATH: this test needs an NVIDIA GPU and its driver"
    out = subprocess.run([smi, "-L"], capture_output=True, text=True, check=True).stdout
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def size_of(gpu_name: str) -> str:
    """The VM size in vm_sizes.yaml whose GPU model this GPU is (`device` when none is): of the sizes
    whose model has this GPU's chip (A100, H100, H200), the one whose model shares most of its other
    parts with the name NVML reports (form factor, memory), so an `NVIDIA H100 NVL` is judged as an
    H100-NVL-94GB and an `NVIDIA H100 80GB HBM3` as an H100-SXM5-80GB. A tie between two models (an
    `NVIDIA H100 PCIe`, which no size has) is no model."""
    sizes = yaml.safe_load(vmsizes.DATA.read_text())["sizes"]
    name = gpu_name.upper()
    scored = [
        (sum(part in name for part in f["gpu_model"].upper().split("-")), f["gpu_model"], s)
        for s, f in sizes.items()
        if f["gpus"] and f["gpu_model"].split("-")[0] in gpu_name
    ]
    best = max((score for score, _, _ in scored), default=0)
    top = [(model, s) for score, model, s in scored if score == best]
    return top[0][1] if top and len({model for model, _ in top}) == 1 else "device"


def test_the_real_gpus_read_healthy_with_the_right_count() -> None:
    """NVML's reading of every GPU is healthy, and counts what nvidia-smi lists."""
    listed = listed_gpus()
    reading = gpu_probe.read_nvml("device", "device", expected_gpus=listed)
    result = gpu_probe.verdict(reading)
    print(json.dumps({"reading": reading.model_dump(), "verdict": result.to_dict()}, indent=2))
    assert len(reading.gpus) == listed >= 1
    assert result.level == "healthy", result.findings


def test_the_burn_on_the_real_gpus_computes_right_and_meets_the_models_figures() -> None:
    """A short burn on every GPU: each product bit-identical to its first and the GPUs agreeing; where
    the GPU's model is one vm_sizes.yaml knows, no figure below its fatal share."""
    performance = gpu_burn.measure(seconds=10)
    print(performance.model_dump_json(indent=2))
    assert performance.gpus and all(
        g.matmul_tflops > 0 and g.matmul_mismatches == 0 for g in performance.gpus
    )
    assert len({g.checksum for g in performance.gpus}) == 1
    reading = gpu_probe.read_nvml("device", "device", expected_gpus=len(performance.gpus))
    size = size_of(reading.gpus[0].name)
    result = gpu_probe.verdict(reading.model_copy(update={"vm_size": size, "performance": performance}))
    print(size, json.dumps(result.to_dict(), indent=2))
    assert [f for f in result.findings if f.level == "fatal"] == []


def test_the_agents_probe_passes_these_gpus_and_fails_a_missing_one() -> None:
    """The probe preflight and the periodic test run (NVML, then the burn, judged by the shipped
    thresholds) passes this machine; told to expect one GPU more than it has, it fails it by count."""
    listed = listed_gpus()
    name = gpu_probe.read_nvml("device", "device", expected_gpus=listed).gpus[0].name
    size = size_of(name)
    limits = gpu_probe.thresholds()
    passed = kubeapi.probe_of("device", size, listed, None, limits, burn_seconds=5)()
    print(size, json.dumps(passed.to_dict(), indent=2))
    assert passed.level != "fatal", passed.findings
    missing = kubeapi.probe_of("device", size, listed + 1, None, limits)()
    assert missing.level == "fatal"
    assert any(f"{listed} of {listed + 1} GPUs" in f.reason for f in missing.findings), missing.findings
