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


def ask_for_amx_state() -> None:
    """Ask Linux for AMX's tile state where the CPU has AMX (arch_prctl ARCH_REQ_XCOMP_PERM,
    through torch); a process that executes a tile instruction before it asked is killed.

    vLLM's CPU attention uses AMX and counts on a oneDNN or MKL product having asked already.
    With the linear layers on ES Lab's kernels (the SGL kernel of packed weights, or
    linear_bf16.c where ESLAB_CPU_NO_BF16 takes the CPU for one without bf16), nothing had
    asked when an engine's first call, of one short prompt, reached attention: SIGILL in
    cpu_attention_with_kv_cache (bench/engine_start.py, on two AMX Xeons)."""
    if "amx_tile" in cpu_flags().split():
        import torch

        torch.cpu._init_amx()
