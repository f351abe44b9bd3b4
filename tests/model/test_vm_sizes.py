"""The VM size table: a stack on a size it knows plans with that size's facts, every GPU size is judged
by the health probe as its own GPU model and count, and a size it lacks is refused in one line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from superkube.agents import gpu_probe
from superkube.cli import app
from superkube.model import vmsizes
from superkube.model.spec import SpecError
from superkube.plan import engine as planning
from tests.conftest import dev_config

GPU_SIZES = [
    name for name, facts in yaml.safe_load(vmsizes.DATA.read_text())["sizes"].items() if facts["gpus"]
]


def one_node_stack(write_stack: Callable[..., Path], vm_size: str, gpus_per_node: int) -> Path:
    """The dev stack with its pools replaced by a single GPU node of `vm_size`."""
    config = dev_config()
    config["superkube:node_pools"] = yaml.safe_dump(
        [
            {
                "name": "gpu",
                "role": "gpu",
                "vm_size": vm_size,
                "nodes": 1,
                "gpus_per_node": gpus_per_node,
                "pod_ips_per_node": 15,
                "zones": ["1"],
            }
        ]
    )
    return write_stack(config, name="one")


def test_a_one_node_stack_on_an_nc24ads_a100_v4_plans_with_its_facts(
    root: Path, write_stack: Callable[..., Path]
) -> None:
    """One A100 80GB PCIe, 24 vCPUs, 220 GiB: the scale set, the autoscaler's node template, the
    balloon that holds the node and the GPU agents all carry this size's figures, not the H100's."""
    plan = planning.run(root, str(one_node_stack(write_stack, "Standard_NC24ads_A100_v4", 1)))
    [vmss] = plan.of_type("azure-native:compute:VirtualMachineScaleSet")
    assert vmss.inputs["sku"]["name"] == "Standard_NC24ads_A100_v4"
    assert vmss.inputs["tags"]["k8s.io_cluster-autoscaler_node-template_resources_nvidia.com_gpu"] == "1"
    [balloon] = [d for d in plan.of_type("kubernetes:apps/v1:Deployment") if d.name.endswith("balloon-gpu")]
    overhead_cpu, overhead_mib = 1000, 2048  # node_overhead in src/superkube/data/vm_sizes.yaml
    assert balloon.inputs["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"] == {
        "cpu": f"{24 * 1000 - overhead_cpu}m",
        "memory": f"{220 * 1024 - overhead_mib}Mi",
        "nvidia.com/gpu": "1",
    }
    daemonsets = [d for d in plan.of_type("kubernetes:apps/v1:DaemonSet") if d.name.endswith("-gpu")]
    agents = [
        d for d in daemonsets if "nvidia-device-plugin" not in d.name
    ]  # NVIDIA's plugin reads the GPUs itself
    assert {d.name.rsplit("-", 2)[-2] for d in agents} == {"health", "preflight", "reset"}
    assert len(daemonsets) == len(agents) + 1
    for daemonset in agents:
        env = {
            e["name"]: e.get("value")
            for e in daemonset.inputs["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert (env["VM_SIZE"], env["EXPECTED_GPUS"]) == ("Standard_NC24ads_A100_v4", "1")


def test_a_gpu_count_the_size_does_not_have_is_refused_with_the_count_it_has(
    root: Path, write_stack: Callable[..., Path]
) -> None:
    with pytest.raises(SpecError) as refused:
        planning.load(root, str(one_node_stack(write_stack, "Standard_NC24ads_A100_v4", 8)))
    assert str(refused.value) == (
        "superkube:node_pools[0].gpus_per_node: is 8, but a Standard_NC24ads_A100_v4 has 1 GPUs; "
        "set gpus_per_node: 1"
    )


def reading(vm_size: str, gpus: int, figures: dict[str, float], expected_gpus: int) -> gpu_probe.Reading:
    """A node of `vm_size` whose NVML reading is clean and whose burn reached `figures` on every GPU."""
    return gpu_probe.parse_reading(
        {
            "node": "n0",
            "vm_size": vm_size,
            "expected_gpus": expected_gpus,
            "gpus": [{"index": i} for i in range(gpus)],
            "performance": {
                "seconds": 10,
                "gpus": [
                    {
                        "index": i,
                        "checksum": "same",
                        "matmul_tflops": figures["matmul_bf16_tflops"],
                        "memory_copy_gbps": figures["memory_copy_gbps"],
                        "host_to_device_gbps": figures["host_to_device_gbps"],
                    }
                    for i in range(gpus)
                ],
            },
        }
    )


@pytest.mark.parametrize("size", GPU_SIZES)
def test_each_gpu_size_is_judged_as_its_own_gpu_model_and_count(size: str) -> None:
    """The probe looks a node's model up by its VM size: a healthy node of every GPU size meets its
    model's figures (none is left "recorded, not judged"), a slow GPU is failed against that model,
    and a node short of one GPU is failed by the size's own count."""
    vm = vmsizes.size(size, "test")
    expected = gpu_probe.thresholds().performance.expected
    assert vm.gpus >= 1 and vm.gpu_model in expected, (
        f"{size}: gpu_model {vm.gpu_model!r} has no figures in src/superkube/data/gpu_health.yaml"
    )
    figures: dict[str, float] = dict(expected[vm.gpu_model])
    assert set(figures) == {key for key, *_ in gpu_probe.FIGURES}

    healthy = gpu_probe.verdict(reading(size, vm.gpus, figures, vm.gpus))
    assert (healthy.level, healthy.findings) == ("healthy", [])

    slow = dict(figures, matmul_bf16_tflops=figures["matmul_bf16_tflops"] * 0.7)
    judged = gpu_probe.verdict(reading(size, vm.gpus, slow, vm.gpus))
    assert judged.level == "fatal"
    assert {f.gpu for f in judged.findings} == set(range(vm.gpus))
    assert all(
        f"70% of the {figures['matmul_bf16_tflops']:g} a {vm.gpu_model} reaches" in f.reason
        for f in judged.findings
    )

    short = gpu_probe.verdict(reading(size, vm.gpus - 1, figures, vm.gpus))
    assert short.level == "fatal"
    assert [f.reason for f in short.findings] == [
        f"{vm.gpus - 1} of {vm.gpus} GPUs a {size} has are visible (missing index {vm.gpus - 1})"
    ]


def test_an_unknown_size_is_refused_in_one_line_saying_how_to_add_it(
    write_stack: Callable[..., Path],
) -> None:
    result = CliRunner().invoke(
        app, ["plan", "-s", str(one_node_stack(write_stack, "Standard_NC24ads_A100_v9", 1))]
    )
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: superkube:node_pools[0].vm_size: 'Standard_NC24ads_A100_v9' is not in "
        "src/superkube/data/vm_sizes.yaml (the balloons size their pods from it); add it there with its "
        "vcpus, memory_gib and gpus from Azure's size documentation"
    ]


def test_the_probe_and_the_jobs_hear_of_an_unknown_size_in_one_line_too() -> None:
    """Outside a stack (a saved reading, a job rendered for a pool) the lookup's own error is one line."""
    with pytest.raises(vmsizes.UnknownVmSize) as unknown:
        vmsizes.size("Standard_NC24ads_A100_v9", "node_pools[gpu].vm_size")
    message = str(unknown.value)
    assert "\n" not in message and message.startswith(
        "node_pools[gpu].vm_size: VM size 'Standard_NC24ads_A100_v9'"
    )
    assert message.endswith("add it with its vcpus, memory_gib and gpus from Azure's size documentation")
