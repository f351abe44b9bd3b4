"""The active GPU check of the preflight and periodic tests: a short matrix-multiply burn and two
bandwidth checks on every GPU of the node at once, measured, never judged here.

For each GPU it measures:
- `matmul_tflops`: dense bf16 matrix products (n x n, fp32 accumulation) issued back to back on all
  GPUs together for `seconds`, so the node runs at full power and heat, timed by CUDA events on
  each GPU's own stream;
- `matmul_mismatches`: products whose result is not bit-identical to that GPU's first one (the same
  inputs on the same GPU give the same bits), and `checksum`, a digest of that first result: every
  GPU multiplies the same seeded inputs, so a GPU whose checksum differs from the others' computes
  wrong numbers (silent data corruption), which speed alone never shows;
- `memory_copy_gbps`: device-to-device copies within the GPU's memory, bytes read plus written;
- `host_to_device_gbps`: copies from pinned host memory over the GPU's PCIe link.

gpu_probe.verdict judges these against the figures src/superkube/data/gpu_health.yaml expects of the VM size's GPU
model. The burn needs PyTorch with CUDA (the GPU tests' image, Dockerfile.gputests); it is imported
only when `measure` runs, so the rest of superkube never needs it.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MATMUL_N = 8192
COPY_BYTES = 1 << 30
H2D_BYTES = 1 << 28


class GpuPerformance(BaseModel):
    """What the burn measured on one GPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(ge=0)
    matmul_tflops: float = Field(ge=0)
    matmul_mismatches: int = Field(default=0, ge=0)
    checksum: str = ""
    memory_copy_gbps: float = Field(ge=0)
    host_to_device_gbps: float = Field(ge=0)


class Performance(BaseModel):
    """One burn of a node: how long, on which inputs, and each GPU's figures."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seconds: float = Field(gt=0)
    matmul_n: int = Field(default=MATMUL_N, ge=1)
    gpus: list[GpuPerformance]


class BurnError(RuntimeError):
    """The burn could not run (no PyTorch with CUDA, no GPU): one line saying which."""


def _digest(tensor: Any) -> str:
    """A digest of a tensor's bits, taken on its GPU: a sum of its raw 16-bit words in int64 and of
    those words times their position (a difference in any bit, or two swapped values, changes it)."""
    import torch

    words = tensor.contiguous().view(torch.int16).flatten().to(torch.int64)
    position = torch.arange(words.numel(), device=words.device, dtype=torch.int64)
    pair = f"{int(words.sum())}:{int((words * (position % 65521 + 1)).sum())}"
    return hashlib.sha256(pair.encode()).hexdigest()[:16]


def measure(seconds: float = 30.0, n: int = MATMUL_N, devices: list[int] | None = None) -> Performance:
    """Burn every GPU (or `devices`) for about `seconds` and measure it. Raises BurnError when there is
    no PyTorch with CUDA or no GPU."""
    try:
        import torch
    except ImportError:
        raise BurnError("the GPU burn needs PyTorch with CUDA (run it from the GPU tests' image)") from None
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        raise BurnError("the GPU burn found no CUDA GPU (is the NVIDIA runtime giving the pod the GPUs?)")
    indexes = devices if devices is not None else list(range(torch.cuda.device_count()))
    inputs, reference, mismatches = {}, {}, dict.fromkeys(indexes, 0)
    for i in indexes:
        gen = torch.Generator(device=f"cuda:{i}").manual_seed(20261123)
        a = torch.randn(n, n, device=f"cuda:{i}", dtype=torch.bfloat16, generator=gen)
        b = torch.randn(n, n, device=f"cuda:{i}", dtype=torch.bfloat16, generator=gen)
        inputs[i] = (a, b)
        reference[i] = a @ b  # also the warm-up: cuBLAS picks its kernel here
    for i in indexes:
        torch.cuda.synchronize(i)
    # the burn: a batch of products on every GPU, then a bitwise check of the last one, until time is up
    batch, products = 8, dict.fromkeys(indexes, 0)
    elapsed_ms = dict.fromkeys(indexes, 0.0)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        events = {}
        for i in indexes:
            with torch.cuda.device(i):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a, b = inputs[i]
                start.record()
                for _ in range(batch):
                    out = a @ b
                end.record()
                events[i] = (start, end, out)
        for i, (start, end, out) in events.items():
            end.synchronize()
            elapsed_ms[i] += start.elapsed_time(end)
            products[i] += batch
            if not torch.equal(out, reference[i]):
                mismatches[i] += 1
    gpus = []
    for i in indexes:
        tflops = 2 * n**3 * products[i] / (elapsed_ms[i] / 1000) / 1e12 if elapsed_ms[i] else 0.0
        gpus.append(
            GpuPerformance(
                index=i,
                matmul_tflops=round(tflops, 1),
                matmul_mismatches=mismatches[i],
                checksum=_digest(reference[i]),
                memory_copy_gbps=round(_copy_gbps(i), 1),
                host_to_device_gbps=round(_h2d_gbps(i), 1),
            )
        )
        del inputs[i], reference[i]
    torch.cuda.empty_cache()
    return Performance(seconds=seconds, matmul_n=n, gpus=gpus)


def _timed(device: int, copy: Any, repeats: int) -> float:
    """Seconds per call of `copy`, on `device`'s stream, after one warm-up call."""
    import torch

    with torch.cuda.device(device):
        copy()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            copy()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1000 / repeats


def _copy_gbps(device: int, size: int = COPY_BYTES, repeats: int = 20) -> float:
    import torch

    src = torch.empty(size, dtype=torch.uint8, device=f"cuda:{device}")
    dst = torch.empty_like(src)
    seconds = _timed(device, lambda: dst.copy_(src), repeats)
    return 2 * size / seconds / 1e9  # each byte is read once and written once


def _h2d_gbps(device: int, size: int = H2D_BYTES, repeats: int = 10) -> float:
    import torch

    src = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(size, dtype=torch.uint8, device=f"cuda:{device}")
    seconds = _timed(device, lambda: dst.copy_(src, non_blocking=True), repeats)
    return size / seconds / 1e9
