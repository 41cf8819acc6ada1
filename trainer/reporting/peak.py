"""A device's peak FLOP/s for MFU, for the dtype the run computes in.

    peak = device_peak(torch.device("cpu"), "fp32")     # Peak(flops=1.8e11, label="CPU fp32 matmul peak, measured ...")

Known GPUs come from a table of dense (no sparsity) figures. Anything else, a CPU above all, is measured:
the best matmul rate over a few sizes, once per machine, dtype and thread count, cached in
$PRETRAIN_HOME/cache/peak_flops.json so that a trainer start costs nothing (the demo starts the trainer
eight times and more). The measurement sizes itself to the machine: on a CPU whose bf16 path is emulated
(~1 GFLOP/s) it stops at small matrices instead of spending seconds on 1024².
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

# Dense peak FLOP/s by dtype, matched against torch.cuda.get_device_name() (fp32: without TF32 tensor cores).
GPU_PEAK_FLOPS = {
    "H200": {"bf16": 989e12, "fp32": 67e12},
    "H100": {"bf16": 989e12, "fp32": 67e12},
    "A100": {"bf16": 312e12, "fp32": 19.5e12},
}
CACHE_FILE = "peak_flops.json"
_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass
class Peak:
    flops: float
    label: str
    cache: Path | None = None  # where a measured peak is kept, so a better one seen in training replaces it
    key: str | None = None

    def raise_to(self, flops: float) -> None:
        """A device cannot beat its peak: a measured peak that training beats was taken on a busy machine.
        Keep the higher figure, here and in the cache (a table or configured peak is never changed)."""
        if self.cache is None or not flops > self.flops:
            return
        self.flops = flops
        _store(self.cache, self.key, flops)


def device_peak(device: torch.device, dtype: str, override: float | None = None) -> Peak:
    """The peak of `device` computing in `dtype` ("bf16" | "fp32"); `override` (metrics.peak_flops) wins."""
    if override:
        return Peak(override, "configured peak")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peaks in GPU_PEAK_FLOPS.items():
            if key in name:
                return Peak(peaks[dtype], f"{key} {dtype} peak")
    cache, key = cache_path(), machine_key(device, dtype)
    known = _load(cache).get(key)
    if known is None:
        known = measure_matmul_peak(device, _DTYPES[dtype])
        _store(cache, key, known)
    what = "CPU" if device.type == "cpu" else torch.cuda.get_device_name(device)
    return Peak(known, f"{what} {dtype} matmul peak, measured", cache=cache, key=key)


def cache_path() -> Path:
    home = Path(os.environ.get("PRETRAIN_HOME") or ".pretrain").expanduser()
    return home / "cache" / CACHE_FILE


def machine_key(device: torch.device, dtype: str) -> str:
    """What the measurement depends on: the processor, the kernels torch picked for it, dtype and threads."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} | {dtype}"
    return (f"{_cpu_model()} | kernels {torch.backends.cpu.get_cpu_capability()} | {dtype} | "
            f"{torch.get_num_threads()} threads")


def measure_matmul_peak(device: torch.device, dtype: torch.dtype = torch.bfloat16, *,
                        sizes: tuple[int, ...] = (256, 512, 1024), budget_s: float = 0.15) -> float:
    """Best matmul FLOP/s on `device` in `dtype` over square sizes, each timed for about `budget_s`.
    Larger sizes are tried only while one matmul stays fast (an emulated dtype would take seconds)."""
    if device.type == "cuda":
        sizes = (4096, 8192)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    best = 0.0
    for n in sizes:
        a = torch.randn(n, n, dtype=dtype, device=device)
        b = torch.randn(n, n, dtype=dtype, device=device)
        a @ b  # warm-up: kernel choice, first-touch of the output
        sync()
        fastest, spent = math.inf, 0.0
        while spent < budget_s:
            t = time.perf_counter()
            a @ b
            sync()
            took = time.perf_counter() - t
            fastest, spent = min(fastest, took), spent + took
        best = max(best, 2 * n**3 / fastest)
        if fastest > budget_s / 3:
            break  # a slow path: bigger matrices would only cost time
    return best


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # absent or unreadable: measure again
    return data if isinstance(data, dict) else {}


def _store(path: Path, key: str, flops: float) -> None:
    """Write the cache atomically (several trainers may start at once); a read-only home just goes uncached."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _load(path)
        data[key] = flops
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass
