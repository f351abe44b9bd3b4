"""One GPU probe for the preflight, periodic and health agents: readings in, a verdict out.

A reading is what NVML reports for every GPU of a node (the count, Xid events, ECC counters, retired
pages, remapped rows, PCIe link, NVLink state), saved as JSON so an incident can be explained later
(`superkube health explain FILE`). The verdict applies `src/superkube/data/gpu_health.yaml`: `fatal` takes the node
out of service, `warning` is recorded, `healthy` is neither. Reading NVML needs a GPU and the
maintained NVIDIA binding (`nvidia-ml-py`, imported only when `read_nvml` runs); the verdict is pure.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from superkube.agents.gpu_burn import Performance
from superkube.cluster import health

THRESHOLDS = health.THRESHOLDS
Level = Literal["healthy", "warning", "maintenance", "fatal"]
"""maintenance: Azure's scheduled event for the VM (superkube.agents.scheduled_events), not a failure"""
ORDER = {"healthy": 0, "warning": 1, "maintenance": 2, "fatal": 3}


class ReadingError(ValueError):
    """A malformed reading or thresholds file: one line naming the field."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Ecc(_Model):
    volatile_single_bit: int = Field(default=0, ge=0)
    volatile_double_bit: int = Field(default=0, ge=0)
    aggregate_double_bit: int = Field(default=0, ge=0)


class RetiredPages(_Model):
    total: int = Field(default=0, ge=0)
    pending: bool = False


class RemappedRows(_Model):
    pending: bool = False
    failure: bool = False


class Pcie(_Model):
    link_width: int = Field(ge=0)
    max_link_width: int = Field(ge=1)
    link_generation: int = Field(ge=0)
    max_link_generation: int = Field(ge=1)


class NvLink(_Model):
    active: int = Field(ge=0)
    total: int = Field(ge=0)


class Gpu(_Model):
    index: int = Field(ge=0)
    uuid: str = ""
    name: str = ""
    xid_errors: list[int] = Field(default_factory=list)
    ecc: Ecc = Field(default_factory=Ecc)
    retired_pages: RetiredPages = Field(default_factory=RetiredPages)
    remapped_rows: RemappedRows = Field(default_factory=RemappedRows)
    pcie: Pcie | None = None
    nvlink: NvLink | None = None


class Reading(_Model):
    node: str
    vm_size: str
    expected_gpus: int = Field(ge=0)
    gpus: list[Gpu]
    performance: Performance | None = None
    """The active check's figures (preflight and periodic tests run it; the health agent never does)."""


Figure = Literal["matmul_bf16_tflops", "memory_copy_gbps", "host_to_device_gbps"]


class PerformanceLimits(_Model):
    fatal_below: float = Field(gt=0, le=1)
    warning_below: float = Field(gt=0, le=1)
    expected: dict[str, dict[Figure, float]]


class ResetClears(_Model):
    xid: list[int] = Field(default_factory=list)
    volatile_double_bit: bool = False
    pending_retirement: bool = False
    pending_remap: bool = False


class Thresholds(_Model):
    xid: dict[Literal["fatal", "warning"], dict[int, str]]
    reset_clears: ResetClears = Field(default_factory=ResetClears)
    ecc: dict[
        Literal["volatile_double_bit_fatal", "aggregate_double_bit_warning", "volatile_single_bit_warning"],
        int,
    ]
    retired_pages: dict[Literal["pending_fatal", "total_warning", "total_fatal"], int | bool]
    remapped_rows: dict[Literal["pending_fatal", "failure_fatal"], bool]
    pcie: dict[Literal["degraded_warning"], bool]
    nvlink: dict[Literal["inactive_fatal"], bool]
    performance: PerformanceLimits


def _where(error: ValidationError) -> str:
    first = error.errors(include_url=False)[0]
    path = ".".join(str(p) for p in first["loc"])
    return f"{path}: {first['msg']}"


def parse_reading(data: Any, source: str = "reading") -> Reading:
    try:
        return Reading.model_validate(data)
    except ValidationError as exc:
        raise ReadingError(f"{source}: {_where(exc)}") from None


def load_reading(path: Path) -> Reading:
    from superkube.model import files

    fix = "give a GPU probe reading saved as JSON (an object of node, vm_size, expected_gpus, gpus)"
    try:
        data = files.load(
            path, kind="json", fix=fix, what="a JSON object of node, vm_size, expected_gpus, gpus"
        )
        return parse_reading(data, str(path))
    except files.FileError as exc:
        raise ReadingError(str(exc)) from None
    except ReadingError as exc:
        raise ReadingError(f"{exc}; {fix}") from None


# dcgm-exporter's fields (its default counters, or the ECC and retirement ones a counters file adds)
# and where each lands in a reading; samples carry the GPU's index in the label `gpu`.
DCGM_XID = "DCGM_FI_DEV_XID_ERRORS"  # gauge: the last Xid the GPU reported (0: none)
DCGM_ECC = {
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "volatile_single_bit",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "volatile_double_bit",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "aggregate_double_bit",
}
DCGM_RETIRED = ("DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE")
DCGM_RETIRED_PENDING = "DCGM_FI_DEV_RETIRED_PENDING"
DCGM_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
DCGM_REMAP_PENDING = "DCGM_FI_DEV_ROW_REMAP_PENDING"


def dcgm_samples(text: str, source: str = "dcgm-exporter") -> dict[int, dict[str, float]]:
    """GPU index -> field -> value from a dcgm-exporter scrape (Prometheus text format)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[int, dict[str, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if not sample.name.startswith("DCGM_FI_") or "gpu" not in sample.labels:
                    continue
                try:
                    index = int(sample.labels["gpu"])
                except ValueError:
                    raise ReadingError(
                        f"{source}: {sample.name}: gpu label {sample.labels['gpu']!r} is not an index"
                    ) from None
                # the parser names a counter's samples <name>_total even when the exposition did not;
                # DCGM's own names end in upper-case _TOTAL, which this leaves alone
                out.setdefault(index, {})[sample.name.removesuffix("_total")] = float(sample.value)
    except ValueError as exc:  # the parser's own errors
        if isinstance(exc, ReadingError):
            raise
        raise ReadingError(
            f"{source}: not Prometheus text format ({str(exc).splitlines()[0]}); "
            "give dcgm-exporter's /metrics as it serves them"
        ) from None
    return out


def merge_dcgm(reading: Reading, text: str, source: str = "dcgm-exporter") -> Reading:
    """The reading with what dcgm-exporter adds: the Xid each GPU last reported (NVML keeps no Xid
    state), and ECC, retired-page and row-remap counters where the exporter has them and they are
    worse than NVML's. GPUs the reading lacks are not invented: NVML's count stays the truth."""
    samples = dcgm_samples(text, source)
    gpus = []
    for gpu in reading.gpus:
        got = samples.get(gpu.index, {})
        xids = list(gpu.xid_errors)
        last = int(got.get(DCGM_XID, 0))
        if last and last not in xids:
            xids.append(last)
        ecc = gpu.ecc.model_copy(
            update={
                field: max(getattr(gpu.ecc, field), int(got[name]))
                for name, field in DCGM_ECC.items()
                if name in got
            }
        )
        retired = gpu.retired_pages
        if any(name in got for name in DCGM_RETIRED) or DCGM_RETIRED_PENDING in got:
            retired = RetiredPages(
                total=max(retired.total, int(sum(got.get(name, 0) for name in DCGM_RETIRED))),
                pending=retired.pending or got.get(DCGM_RETIRED_PENDING, 0) > 0,
            )
        remapped = RemappedRows(
            pending=gpu.remapped_rows.pending or got.get(DCGM_REMAP_PENDING, 0) > 0,
            failure=gpu.remapped_rows.failure or got.get(DCGM_REMAP_FAILURE, 0) > 0,
        )
        gpus.append(
            gpu.model_copy(
                update={"xid_errors": xids, "ecc": ecc, "retired_pages": retired, "remapped_rows": remapped}
            )
        )
    return reading.model_copy(update={"gpus": gpus})


def read_dcgm(url: str, timeout: float = 5) -> str:
    """One scrape of the node's dcgm-exporter."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as resp:
        text: str = resp.read().decode()
    return text


@cache
def thresholds(path: Path = THRESHOLDS) -> Thresholds:
    try:
        return Thresholds.model_validate(yaml.safe_load(path.read_text()))
    except ValidationError as exc:
        raise ReadingError(f"{path}: {_where(exc)}") from None


@dataclass(frozen=True)
class Finding:
    level: Level
    gpu: int | None  # None: the node as a whole
    reason: str
    xid: int | None = None  # the Xid this finding is about, if any
    reset_clears: bool = False  # a GPU reset may clear it (gpu_health.yaml `reset_clears`)

    def __str__(self) -> str:
        where = f"GPU {self.gpu}" if self.gpu is not None else "node"
        return f"{self.level}: {where}: {self.reason}"


@dataclass(frozen=True)
class Verdict:
    node: str
    level: Level
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "verdict": self.level,
            "findings": [{"level": f.level, "gpu": f.gpu, "reason": f.reason} for f in self.findings],
        }


def _gpu_findings(gpu: Gpu, t: Thresholds) -> list[Finding]:
    out: list[Finding] = []
    i = gpu.index
    clears = t.reset_clears
    for xid in sorted(set(gpu.xid_errors)):
        if xid in t.xid["fatal"]:
            out.append(Finding("fatal", i, f"Xid {xid}: {t.xid['fatal'][xid]}", xid, xid in clears.xid))
        elif xid in t.xid["warning"]:
            out.append(Finding("warning", i, f"Xid {xid}: {t.xid['warning'][xid]}", xid))
        else:
            out.append(
                Finding(
                    "warning", i, f"Xid {xid}: not in src/superkube/data/gpu_health.yaml; look it up", xid
                )
            )
    if gpu.ecc.volatile_double_bit >= t.ecc["volatile_double_bit_fatal"]:
        out.append(
            Finding(
                "fatal",
                i,
                f"{gpu.ecc.volatile_double_bit} uncorrectable ECC errors since the driver loaded",
                reset_clears=clears.volatile_double_bit,
            )
        )
    elif gpu.ecc.aggregate_double_bit >= t.ecc["aggregate_double_bit_warning"]:
        out.append(
            Finding("warning", i, f"{gpu.ecc.aggregate_double_bit} uncorrectable ECC errors in its lifetime")
        )
    if gpu.ecc.volatile_single_bit >= t.ecc["volatile_single_bit_warning"]:
        out.append(
            Finding(
                "warning", i, f"{gpu.ecc.volatile_single_bit} corrected ECC errors since the driver loaded"
            )
        )
    pages = gpu.retired_pages
    if pages.pending and t.retired_pages["pending_fatal"]:
        out.append(
            Finding(
                "fatal",
                i,
                "a memory page is pending retirement: reset the GPU before use",
                reset_clears=clears.pending_retirement,
            )
        )
    if pages.total >= int(t.retired_pages["total_fatal"]):
        out.append(Finding("fatal", i, f"{pages.total} retired pages: due for replacement"))
    elif pages.total >= int(t.retired_pages["total_warning"]):
        out.append(Finding("warning", i, f"{pages.total} retired pages"))
    rows = gpu.remapped_rows
    if rows.failure and t.remapped_rows["failure_fatal"]:
        out.append(Finding("fatal", i, "row remapping failed: the GPU needs service"))
    if rows.pending and t.remapped_rows["pending_fatal"]:
        out.append(
            Finding(
                "fatal",
                i,
                "a row remap is pending: reset the GPU before use",
                reset_clears=clears.pending_remap,
            )
        )
    if gpu.pcie and t.pcie["degraded_warning"]:
        p = gpu.pcie
        if p.link_width < p.max_link_width or p.link_generation < p.max_link_generation:
            out.append(
                Finding(
                    "warning",
                    i,
                    f"PCIe link x{p.link_width} gen{p.link_generation}, below the GPU's x{p.max_link_width} gen{p.max_link_generation}",
                )
            )
    if gpu.nvlink and gpu.nvlink.active < gpu.nvlink.total and t.nvlink["inactive_fatal"]:
        out.append(
            Finding("fatal", i, f"{gpu.nvlink.total - gpu.nvlink.active} of {gpu.nvlink.total} NVLinks down")
        )
    return out


# (expected figure in src/superkube/data/gpu_health.yaml, the burn's field, what it is, its unit)
FIGURES: tuple[tuple[Figure, str, str, str], ...] = (
    ("matmul_bf16_tflops", "matmul_tflops", "bf16 matrix multiply", "TFLOP/s"),
    ("memory_copy_gbps", "memory_copy_gbps", "memory copy", "GB/s"),
    ("host_to_device_gbps", "host_to_device_gbps", "host-to-device copy", "GB/s"),
)


def _gpu_model(vm_size: str) -> str:
    from superkube.model import vmsizes

    try:
        return vmsizes.size(vm_size, "vm_size").gpu_model
    except vmsizes.UnknownVmSize:
        return ""


def _performance_findings(reading: Reading, t: Thresholds) -> list[Finding]:
    """Wrong numbers are fatal whatever the speed; slow figures are judged against what the VM size's
    GPU model is expected to reach."""
    perf = reading.performance
    if perf is None:
        return []
    out: list[Finding] = []
    sums = Counter(g.checksum for g in perf.gpus if g.checksum)
    agreed, votes = sums.most_common(1)[0] if sums else ("", 0)
    for g in perf.gpus:
        if g.matmul_mismatches:
            out.append(
                Finding(
                    "fatal",
                    g.index,
                    f"{g.matmul_mismatches} matrix products differed from its first on the same inputs "
                    "(silent data corruption)",
                )
            )
        if votes * 2 > len(perf.gpus) and g.checksum and g.checksum != agreed:
            out.append(
                Finding(
                    "fatal",
                    g.index,
                    "its matrix product differs from the other GPUs' on the same inputs (silent data corruption)",
                )
            )
    model = _gpu_model(reading.vm_size)
    expected = t.performance.expected.get(model)
    if expected is None:
        out.append(
            Finding(
                "warning",
                None,
                f"no expected performance for {model or reading.vm_size} in src/superkube/data/gpu_health.yaml: "
                "the burn's figures were recorded, not judged",
            )
        )
        return out
    for g in perf.gpus:
        for key, field_, what, unit in FIGURES:
            if key not in expected:
                continue
            got, want = getattr(g, field_), expected[key]
            share = got / want
            level: Level | None = (
                "fatal"
                if share < t.performance.fatal_below
                else "warning"
                if share < t.performance.warning_below
                else None
            )
            if level:
                out.append(
                    Finding(
                        level,
                        g.index,
                        f"{what} {got:g} {unit}, {share:.0%} of the {want:g} a {model} reaches",
                    )
                )
    return out


def verdict(reading: Reading, t: Thresholds | None = None) -> Verdict:
    """The node's verdict: the worst of its findings."""
    t = t or thresholds()
    findings: list[Finding] = []
    if len(reading.gpus) < reading.expected_gpus:
        seen = {g.index for g in reading.gpus}
        missing = [i for i in range(reading.expected_gpus) if i not in seen]
        findings.append(
            Finding(
                "fatal",
                None,
                f"{len(reading.gpus)} of {reading.expected_gpus} GPUs a {reading.vm_size} has are visible"
                + (f" (missing index {', '.join(map(str, missing))})" if missing else ""),
            )
        )
    for gpu in reading.gpus:
        findings += _gpu_findings(gpu, t)
    findings += _performance_findings(reading, t)
    level: Level = max((f.level for f in findings), key=ORDER.__getitem__, default="healthy")
    return Verdict(reading.node, level, findings)


def reset_may_clear(v: Verdict) -> bool:
    """A fatal verdict whose every fatal finding a GPU reset may clear."""
    fatal = [f for f in v.findings if f.level == "fatal"]
    return bool(fatal) and all(f.reset_clears for f in fatal)


def forgive(v: Verdict, forgiven: dict[int, int]) -> Verdict:
    """The verdict without the Xids a GPU reset cleared ({GPU index: Xid}): dcgm-exporter keeps
    reporting a GPU's last Xid after the reset, so the same Xid on the same GPU is history until
    another takes its place. Every other finding stays."""
    if not forgiven:
        return v
    kept = [f for f in v.findings if f.xid is None or f.gpu is None or forgiven.get(f.gpu) != f.xid]
    level: Level = max((f.level for f in kept), key=ORDER.__getitem__, default="healthy")
    return Verdict(v.node, level, kept)


def read_nvml(node: str, vm_size: str, expected_gpus: int) -> Reading:
    """Read every GPU through NVML (nvidia-ml-py): needs a GPU and its driver.

    Counters NVML does not support on a GPU are left at their healthy defaults rather than guessed.
    Xid events are not state NVML keeps: the health agent collects them from NVML's event set as
    they happen and adds them to its readings, so a one-shot reading here has none."""
    import pynvml

    def maybe(fn: Any, *args: Any, default: Any = None) -> Any:
        try:
            return fn(*args)
        except pynvml.NVMLError:
            return default

    pynvml.nvmlInit()
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            ecc = Ecc(
                volatile_single_bit=maybe(
                    pynvml.nvmlDeviceGetTotalEccErrors,
                    h,
                    pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                    pynvml.NVML_VOLATILE_ECC,
                    default=0,
                ),
                volatile_double_bit=maybe(
                    pynvml.nvmlDeviceGetTotalEccErrors,
                    h,
                    pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    pynvml.NVML_VOLATILE_ECC,
                    default=0,
                ),
                aggregate_double_bit=maybe(
                    pynvml.nvmlDeviceGetTotalEccErrors,
                    h,
                    pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    pynvml.NVML_AGGREGATE_ECC,
                    default=0,
                ),
            )
            remap = maybe(pynvml.nvmlDeviceGetRemappedRows, h)
            pending_pages = maybe(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, h, default=0)
            retired = maybe(
                pynvml.nvmlDeviceGetRetiredPages,
                h,
                pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
                default=[],
            )
            links = [
                maybe(pynvml.nvmlDeviceGetNvLinkState, h, link, default=None)
                for link in range(pynvml.NVML_NVLINK_MAX_LINKS)
            ]
            present = [state for state in links if state is not None]
            gpus.append(
                Gpu(
                    index=i,
                    uuid=str(maybe(pynvml.nvmlDeviceGetUUID, h, default="")),
                    name=str(maybe(pynvml.nvmlDeviceGetName, h, default="")),
                    ecc=ecc,
                    retired_pages=RetiredPages(total=len(retired or []), pending=bool(pending_pages)),
                    remapped_rows=RemappedRows(pending=bool(remap[2]), failure=bool(remap[3]))
                    if remap
                    else RemappedRows(),
                    pcie=Pcie(
                        link_width=pynvml.nvmlDeviceGetCurrPcieLinkWidth(h),
                        max_link_width=pynvml.nvmlDeviceGetMaxPcieLinkWidth(h),
                        link_generation=pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
                        max_link_generation=pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h),
                    ),
                    nvlink=NvLink(active=sum(1 for s in present if s), total=len(present))
                    if present
                    else None,
                )
            )
        return Reading(node=node, vm_size=vm_size, expected_gpus=expected_gpus, gpus=gpus)
    finally:
        pynvml.nvmlShutdown()


def main(argv: list[str] | None = None) -> int:
    """`python -m superkube.agents.gpu_probe`: this node's GPUs read once through NVML, printed as the
    JSON reading `superkube health explain` judges. Run it on a GPU node, or in its health agent's pod
    (which sets NODE_NAME, VM_SIZE and EXPECTED_GPUS)."""
    import argparse
    import json
    import os
    import socket
    import sys

    p = argparse.ArgumentParser(prog="python -m superkube.agents.gpu_probe", description=main.__doc__)
    p.add_argument("--node", default=os.environ.get("NODE_NAME") or socket.gethostname())
    p.add_argument("--vm-size", default=os.environ.get("VM_SIZE", ""), help="the node's Azure VM size")
    p.add_argument("--expected-gpus", type=int, default=int(os.environ.get("EXPECTED_GPUS") or 0))
    args = p.parse_args(argv)
    try:
        reading = read_nvml(args.node, args.vm_size, args.expected_gpus)
    except ImportError:
        print("error: nvidia-ml-py is not installed; pip install nvidia-ml-py (the agents' image has it)",
              file=sys.stderr)  # fmt: skip
        return 2
    except Exception as exc:  # pynvml.NVMLError and its many subclasses: no driver, no GPU
        if type(exc).__module__ != "pynvml":
            raise
        print(
            f"error: NVML cannot be read ({exc}); run it on a GPU node whose driver is loaded",
            file=sys.stderr,
        )
        return 2
    sys.stdout.write(json.dumps(reading.model_dump(mode="json", exclude_none=True), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
