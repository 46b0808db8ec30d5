"""What this CPU computes in hardware, for the CPU kernels' choices between paths."""

from __future__ import annotations

import functools
import os
from pathlib import Path


@functools.cache
def cpu_flags() -> str:
    """The CPU's feature flags as /proc/cpuinfo lists them (the machine name elsewhere)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return os.uname().machine
    return next((line for line in lines if line.startswith(("flags", "Features"))), "")


NO_BF16_ENV = "ESLAB_CPU_NO_BF16"
"""Set to 1 to take this CPU for one without bf16 matmul hardware (nor AMX packing): the
fp32 path of an AVX2 CPU, measured or tested on an AMX or AVX-512 BF16 machine."""


def bf16_matmul_in_hardware() -> bool:
    """Whether the CPU multiplies bf16 in hardware (AMX or AVX-512 BF16), unless NO_BF16_ENV
    says to take it for one that does not. Without, torch emulates bf16 matmuls at a
    fraction of its fp32 speed: on an AVX2 Zen 3, one thread, [128, 576] x [576, 1536] took
    30 ms in bf16 against 4.1 ms converted to fp32 and back (bench/lora_kernels.py shows the
    same for the LoRA terms)."""
    if os.environ.get(NO_BF16_ENV, "") not in ("", "0"):
        return False
    return any(flag in cpu_flags().split() for flag in ("amx_bf16", "avx512_bf16"))
