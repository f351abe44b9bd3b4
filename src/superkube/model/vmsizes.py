"""What one VM of each Azure size has (vCPUs, memory, GPUs), read once from src/superkube/data/vm_sizes.yaml."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from superkube.model import strictyaml
from superkube.model.spec import ClusterSpec, SpecError

DATA = Path(__file__).resolve().parents[1] / "data" / "vm_sizes.yaml"

GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource NVIDIA's device plugin advertises, which pods request and templates declare."""


class UnknownVmSize(LookupError):
    """A VM size the data file does not describe; the message says what to add."""


@dataclass(frozen=True)
class VmSize:
    name: str
    vcpus: int
    memory_gib: int
    gpus: int
    gpu_model: str = ""


@dataclass(frozen=True)
class Overhead:
    cpu_millicores: int
    memory_mib: int


@cache
def _load() -> tuple[dict[str, VmSize], Overhead]:
    doc = strictyaml.safe_load(DATA.read_text())
    sizes = {name: VmSize(name=name, **facts) for name, facts in doc["sizes"].items()}
    return sizes, Overhead(**doc["node_overhead"])


def size(name: str, where: str) -> VmSize:
    """The size's facts; `where` names the spec key that asked, for the error line."""
    sizes, _ = _load()
    if name not in sizes:
        raise UnknownVmSize(
            f"{where}: VM size {name!r} is not in src/superkube/data/vm_sizes.yaml; add it with its vcpus, memory_gib "
            "and gpus from Azure's size documentation"
        )
    return sizes[name]


def check(spec: ClusterSpec) -> None:
    """Every pool's VM size must be known, and agree on GPUs, before the in-cluster layer is built."""
    if not spec.in_cluster_layer:
        return
    for i, pool in enumerate(spec.node_pools):
        key = f"superkube:node_pools[{i}].vm_size"
        try:
            vm = size(pool.vm_size, key)
        except UnknownVmSize:
            raise SpecError(
                key,
                f"{pool.vm_size!r} is not in src/superkube/data/vm_sizes.yaml (the balloons size their pods from it)",
                "add it there with its vcpus, memory_gib and gpus from Azure's size documentation",
            ) from None
        if vm.gpus != pool.gpus_per_node:
            raise SpecError(
                f"superkube:node_pools[{i}].gpus_per_node",
                f"is {pool.gpus_per_node}, but a {vm.name} has {vm.gpus} GPUs",
                f"set gpus_per_node: {vm.gpus}",
            )


def fill_one_node(vm: VmSize) -> dict[str, str]:
    """Requests that take all of one node of this size except the node agents' overhead."""
    _, overhead = _load()
    requests = {
        "cpu": f"{vm.vcpus * 1000 - overhead.cpu_millicores}m",
        "memory": f"{vm.memory_gib * 1024 - overhead.memory_mib}Mi",
    }
    if vm.gpus:
        requests[GPU_RESOURCE] = str(vm.gpus)
    return requests
