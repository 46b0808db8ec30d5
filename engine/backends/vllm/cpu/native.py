"""The CPU's C kernels, compiled for this CPU at first use: the per-token multi-LoRA kernel
(lora_tokens.c, `kernel()`) and the perturbation of packed weights (packed_perturb.c, used by
cpu/packed.py through `library()`).

A C compiler is all they need: a source is built with `-O3 -march=native -fopenmp` into a
cache folder keyed by the source, the flags and the CPU's feature flags (a library built for
one CPU may not run on another sharing the home folder), and loaded with ctypes. OpenMP
resolves to the libgomp torch has already loaded, so the kernels share torch's threads.
Without a compiler, or where the build fails, `library()` is None and the caller keeps to its
PyTorch path, which computes the same numbers (tests/unit/test_cpu_lora.py and
test_cpu_packed.py hold both to it).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from engine.backends.vllm.cpu import features as cpu_features

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("lora_tokens.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
CACHE_ENV = "ESLAB_KERNEL_CACHE"
"""Where built kernels are kept (default ~/.cache/eslab/kernels)."""

Kernel = Callable[..., None]


def _library_path(compiler: str, source: Path, flags: tuple[str, ...]) -> Path:
    key = hashlib.sha256()
    for part in (
        source.read_bytes(),
        " ".join((compiler, *flags)).encode(),
        cpu_features.cpu_flags().encode(),
    ):
        key.update(part)
    caches = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    cache = Path(os.environ.get(CACHE_ENV) or caches / "eslab" / "kernels")
    return cache / f"cpu_{source.stem}-{key.hexdigest()[:16]}.so"


def _build(compiler: str, source: Path, flags: tuple[str, ...], library: Path) -> None:
    """Compile into a temporary file and rename it into place, so that processes building
    at the same time (vLLM's worker and a test) never load a half-written library."""
    library.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=library.parent) as scratch:
        built = Path(scratch) / library.name
        subprocess.run(
            [compiler, *flags, str(source), "-o", str(built)],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
        os.replace(built, library)


def library(source: Path, flags: tuple[str, ...], purpose: str) -> ctypes.CDLL | None:
    """`source` built with `flags` for this CPU (from the cache when it is there) and loaded,
    or None where it cannot be built here; the reason is logged, naming `purpose`."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("no C compiler: %s on the CPU runs the slower PyTorch path", purpose)
        return None
    path = _library_path(compiler, source, flags)
    try:
        if not path.exists():
            _build(compiler, source, flags, path)
        return ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError) as error:
        detail = getattr(error, "stderr", "") or error
        log.warning("the %s CPU kernel did not build (%s): the PyTorch path runs", purpose, detail)
        return None


@functools.cache
def kernel() -> Kernel | None:
    """The compiled multi-LoRA kernel as a function of tensors (see `lora_tokens`), or None
    where it cannot be built here (the reason is logged once)."""
    native = library(SOURCE, FLAGS, "multi-LoRA")
    if native is None:
        return None
    function = native.lora_tokens
    function.restype = ctypes.c_int
    function.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_void_p,
        ctypes.c_float,
    ]
    return functools.partial(lora_tokens, function)


def lora_tokens(
    function: Any,
    y: torch.Tensor,
    x: torch.Tensor,
    index: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    bounds: torch.Tensor,
    rank: int,
    scale: float,
) -> None:
    """y[t, bounds[s]:bounds[s + 1]] += scale * (x[t] . a[index[t], rows of s]) b[index[t],
    rows of s, same columns] for each token t with index[t] >= 0 and each slice s, where the
    rows of slice s are s * rank .. (s + 1) * rank. x [T, in] and y [T, out] bf16 with
    contiguous rows, a [L, S * rank, in] and b [L, S * rank, out] contiguous bf16, index [T]
    and bounds [S + 1] contiguous int64. Shapes are checked here: the C code trusts them."""
    tokens, features = x.shape
    slices = bounds.numel() - 1
    if not (
        y.shape[0] >= tokens
        and index.shape == (tokens,)
        and a.shape[1:] == (slices * rank, features)
        and b.shape[:2] == a.shape[:2]
        and int(bounds[-1]) <= min(b.shape[2], y.shape[1])
    ):
        raise ValueError(
            f"lora_tokens: mismatched shapes x {tuple(x.shape)}, y "
            f"{tuple(y.shape)}, index {tuple(index.shape)}, a {tuple(a.shape)}, "
            f"b {tuple(b.shape)}, bounds {bounds.tolist()}, rank {rank}"
        )
    if (
        any(t.dtype != torch.bfloat16 for t in (x, y, a, b))
        or x.stride(1) != 1
        or y.stride(1) != 1
        or not (a.is_contiguous() and b.is_contiguous())
    ):
        raise ValueError("lora_tokens: x, y, a, b must be bf16 with contiguous rows")
    if (
        index.dtype != torch.int64
        or bounds.dtype != torch.int64
        or not (index.is_contiguous() and bounds.is_contiguous())
    ):
        raise ValueError("lora_tokens: index and bounds must be contiguous int64")
    if tokens and int(index.max()) >= a.shape[0]:
        raise ValueError(
            f"lora_tokens: adapter index {int(index.max())} beyond the {a.shape[0]} adapters"
        )
    failed = function(
        x.data_ptr(),
        x.stride(0),
        y.data_ptr(),
        y.stride(0),
        index.data_ptr(),
        tokens,
        a.data_ptr(),
        b.data_ptr(),
        features,
        b.shape[2],
        slices,
        rank,
        bounds.data_ptr(),
        scale,
    )
    if failed == -1:
        raise ValueError(
            f"lora_tokens: {slices} slices of rank {rank} exceed the kernel's 256 rows"
        )
    if failed:
        raise MemoryError("lora_tokens: no memory for the kernel's scratch space")
