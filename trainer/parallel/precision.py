"""The run's precision, chosen by the hardware: bf16 where the device computes it natively, fp32 elsewhere.

    precision = resolve_precision("auto", torch.device("cpu"))
    precision.bf16, precision.reason      # False, "auto: fp32, this CPU has no native bf16 (kernels AVX2, ...)"

`deepspeed.bf16` is `auto` (the default), `true` or `false`. On a CPU without AVX-512 BF16 or AMX a bf16
matmul runs ~50× slower than fp32 (STACK.md): auto picks bf16 only where it is native, on CUDA devices that
support it and on CPUs whose kernels have it. A resumed run keeps the precision it started with unless the
config forces one (`resolve_precision(..., resumed=<the checkpoint's record>)`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Kernel families (torch.backends.cpu.get_cpu_capability()) under which oneDNN can run bf16 matmuls natively.
# "AVX2" / "DEFAULT" (no AVX-512) never can; ATEN_CPU_CAPABILITY=avx2 brings a machine down to that level.
_BF16_CAPABLE_KERNELS = ("AVX512", "AMX")


@dataclass(frozen=True)
class Precision:
    bf16: bool
    requested: str  # "auto", "true" or "false": what the config asked for
    reason: str

    @property
    def dtype(self) -> str:
        return "bf16" if self.bf16 else "fp32"

    def record(self) -> dict:
        """What goes into metrics.jsonl, the checkpoint manifest and the asset metadata."""
        return {"dtype": self.dtype, "requested": self.requested, "reason": self.reason}


def cpu_native_bf16() -> tuple[bool, str]:
    """(whether this CPU runs bf16 matmuls natively, what the probe saw)."""
    kernels = torch.backends.cpu.get_cpu_capability()
    onednn = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    native = onednn and kernels.startswith(_BF16_CAPABLE_KERNELS)
    return native, f"kernels {kernels}, oneDNN bf16 {'yes' if onednn else 'no'}"


def device_native_bf16(device: torch.device) -> tuple[bool, str]:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return bool(torch.cuda.is_bf16_supported()), name
    if device.type == "cpu":
        return cpu_native_bf16()
    return False, f"device type {device.type}"


def resolve_precision(requested: bool | str, device: torch.device, *, resumed: dict | None = None) -> Precision:
    """The precision to run in. `requested` is the config's deepspeed.bf16; `resumed` the precision record of
    the checkpoint the run resumes from (it wins over `auto`: a run does not change precision half-way)."""
    if requested is True or requested is False:
        label = "true" if requested else "false"
        return Precision(bf16=requested, requested=label, reason=f"deepspeed.bf16 = {label} in the config")
    if requested != "auto":
        raise ValueError(f"deepspeed.bf16: expected true, false or \"auto\", got {requested!r}")
    if resumed is not None and resumed.get("dtype") in ("bf16", "fp32"):
        return Precision(bf16=resumed["dtype"] == "bf16", requested="auto",
                         reason=f"auto: {resumed['dtype']}, the precision this run started with (the checkpoint's)")
    native, probe = device_native_bf16(device)
    if native:
        return Precision(bf16=True, requested="auto", reason=f"auto: bf16, native on this {device.type} ({probe})")
    return Precision(bf16=False, requested="auto",
                     reason=f"auto: fp32, this {device.type} has no native bf16 ({probe})")
