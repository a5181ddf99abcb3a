"""Whether bfloat16 pays on this CPU: it does where the CPU multiplies it in hardware
(avx512_bf16 or AMX), and is several times slower than float32 where torch emulates it."""

from __future__ import annotations

import platform
import warnings

import torch


def on_x86() -> bool:
    """Whether this is an x86 CPU, the only kind the CPU-specific choices were measured on."""
    return platform.machine().lower() in ("x86_64", "amd64")


def native_bf16() -> bool:
    """False only on an x86 CPU with neither avx512_bf16 nor amx_bf16, where bfloat16 was
    measured slower (docs/performance.md); other CPUs are not judged."""
    if not on_x86():
        return True
    caps = torch.cpu.get_capabilities()
    return bool(caps["avx512_bf16"] or caps["amx_bf16"])


def warn_if_emulated_bf16(dtype: torch.dtype, device: str, setting: str) -> None:
    """Warn where `setting` asks for bfloat16 on a CPU that emulates it: a config written on
    one machine is often run on another, and nothing else would say why it crawls."""
    if dtype == torch.bfloat16 and torch.device(device).type == "cpu" and not native_bf16():
        warnings.warn(f"{setting} bfloat16: this CPU has neither avx512_bf16 nor amx_bf16, so "
                      "torch emulates bfloat16, about 4x slower than float32 "
                      "(docs/performance.md); use float32 here", stacklevel=3)
