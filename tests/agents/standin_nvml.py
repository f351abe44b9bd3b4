"""A stand-in for the NVML binding (the `pynvml` module of nvidia-ml-py) and for `nvidia-smi
--gpu-reset`, for the GPU reset's tests: a lent GPU is never reset.

The GPUs' state is a JSON file both read: per GPU its volatile uncorrectable ECC count, a pending
row remap, and the pids computing on it. The stand-in nvidia-smi (`write_nvidia_smi`) clears what a
reset clears, counts its calls, and can be told to fail or to leave a GPU faulty ("sticky"), so the
agent's real code reads the outcome the way it reads real GPUs: through the binding's calls."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

MODEL = "NVIDIA H100 80GB HBM3"


def state(gpus: int = 8, **faults: Any) -> dict[str, Any]:
    """A healthy node of `gpus` GPUs; `faults` set per-GPU fields, e.g. dbe={1: 2}, busy={0: [4242]}."""
    out = {
        "gpus": [{"dbe": 0, "remap_pending": False, "pids": [], "sticky": False} for _ in range(gpus)],
        "reset_fails": faults.pop("reset_fails", ""),
        "resets": 0,
    }
    field = {"dbe": "dbe", "remap_pending": "remap_pending", "busy": "pids", "sticky": "sticky"}
    for key, per_gpu in faults.items():
        for index, value in per_gpu.items():
            out["gpus"][index][field[key]] = value
    return out


def module(path: Path) -> types.ModuleType:
    """A `pynvml` whose GPUs are those of the state file at `path` (read at each nvmlInit)."""
    nvml = types.ModuleType("pynvml")
    held: dict[str, Any] = {}

    class NVMLError(Exception):
        pass

    def init() -> None:
        held["state"] = json.loads(path.read_text())

    def gpu(handle: int) -> dict[str, Any]:
        return dict(held["state"]["gpus"][handle])

    def ecc(handle: int, kind: int, counter: int) -> int:
        uncorrected = kind == nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        return int(gpu(handle)["dbe"]) if uncorrected and counter == nvml.NVML_VOLATILE_ECC else 0

    nvml.NVMLError = NVMLError  # type: ignore[attr-defined]
    consts = {
        "NVML_MEMORY_ERROR_TYPE_CORRECTED": 0, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
        "NVML_VOLATILE_ECC": 0, "NVML_AGGREGATE_ECC": 1, "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR": 1,
        "NVML_NVLINK_MAX_LINKS": 18,
    }  # fmt: skip
    calls = {
        "nvmlInit": init,
        "nvmlShutdown": lambda: held.pop("state", None),
        "nvmlDeviceGetCount": lambda: len(held["state"]["gpus"]),
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetUUID": lambda h: f"GPU-{h:08d}-0000-0000-0000-000000000000",
        "nvmlDeviceGetName": lambda h: MODEL,
        "nvmlDeviceGetTotalEccErrors": ecc,
        "nvmlDeviceGetRemappedRows": lambda h: (0, 0, bool(gpu(h)["remap_pending"]), False),
        "nvmlDeviceGetRetiredPagesPendingStatus": lambda h: 0,
        "nvmlDeviceGetRetiredPages": lambda h, cause: [],
        "nvmlDeviceGetNvLinkState": lambda h, link: 1,
        "nvmlDeviceGetCurrPcieLinkWidth": lambda h: 16,
        "nvmlDeviceGetMaxPcieLinkWidth": lambda h: 16,
        "nvmlDeviceGetCurrPcieLinkGeneration": lambda h: 5,
        "nvmlDeviceGetMaxPcieLinkGeneration": lambda h: 5,
        "nvmlDeviceGetComputeRunningProcesses": lambda h: [
            types.SimpleNamespace(pid=p, usedGpuMemory=1 << 30) for p in gpu(h)["pids"]
        ],
    }
    for name, value in {**consts, **calls}.items():
        setattr(nvml, name, value)
    return nvml


NVIDIA_SMI = """#!{python}
import json, sys
path = {state!r}
data = json.load(open(path))
if sys.argv[1:] != ["--gpu-reset"]:
    sys.exit("stand-in nvidia-smi: only --gpu-reset, got " + " ".join(sys.argv[1:]))
data["resets"] += 1
if data["reset_fails"]:
    json.dump(data, open(path, "w"))
    print("Unable to reset GPU 00000001:00:00.0: " + data["reset_fails"])
    sys.exit(3)
for gpu in data["gpus"]:
    if not gpu["sticky"]:
        gpu["dbe"], gpu["remap_pending"] = 0, False
json.dump(data, open(path, "w"))
print("All done.")
"""


def write_nvidia_smi(directory: Path, state_path: Path) -> Path:
    """The stand-in nvidia-smi, an executable in `directory`, acting on the state at `state_path`."""
    path = directory / "nvidia-smi"
    path.write_text(NVIDIA_SMI.format(python=sys.executable, state=str(state_path)))
    path.chmod(0o755)
    return path


def dcgm_text(last_xid: dict[int, int], gpus: int = 8) -> str:
    """dcgm-exporter's last-Xid gauge for each GPU, as it serves it."""
    lines = ["# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.",
             "# TYPE DCGM_FI_DEV_XID_ERRORS gauge"]  # fmt: skip
    lines += [
        f'DCGM_FI_DEV_XID_ERRORS{{gpu="{i}",UUID="GPU-{i:08d}",modelName="{MODEL}"}} {last_xid.get(i, 0)}'
        for i in range(gpus)
    ]
    return "\n".join(lines) + "\n"
