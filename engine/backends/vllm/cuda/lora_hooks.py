"""Which multi-LoRA kernels the linear layers of a CUDA engine call: ES Lab's
(cuda/lora_kernels.py, launched per adapter block) or vLLM's own.

ESLAB_CUDA_LORA_KERNELS=eslab, read when the worker extension is imported in a worker process
(before vLLM builds the model, traces it for torch.compile and captures its CUDA graphs), makes
vLLM's `PunicaWrapperGPU.add_lora_linear`, the LoRA path of every linear layer, call one
custom op, `vllm::eslab_lora_linear`, that runs the two kernels; the embedding and the LM head
(which ES Lab's engines do not wrap, see lora_slots.lora_llm_args) keep vLLM's. Being a
registered op, it is opaque to torch.compile and is captured into the CUDA graphs like vLLM's
own; the traced file is this one, which vLLM's compile cache key covers, so a graph compiled
with vLLM's kernels is never reused with these or the other way round. Any other value, or a
machine without CUDA, leaves vLLM alone.
"""

import os
from typing import Any

import torch

ENV = "ESLAB_CUDA_LORA_KERNELS"
CHOICES = ("eslab", "vllm")

_installed = False


def install_from_environment() -> bool:
    """Put ES Lab's kernels into vLLM's CUDA punica wrapper where ENV asks for them (once a
    process); True when they are in."""
    global _installed
    choice = os.environ.get(ENV, "vllm")
    if choice not in CHOICES:
        raise ValueError(f"{ENV} must be one of {CHOICES}, got {choice!r}")
    if _installed or choice != "eslab":
        return _installed
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return False
    from vllm.lora.punica_wrapper.punica_gpu import PunicaWrapperGPU

    register_op()
    PunicaWrapperGPU.add_lora_linear = add_lora_linear
    _installed = True
    return True


def register_op() -> None:
    """Define `vllm::eslab_lora_linear` for this platform's device (once a process)."""
    if hasattr(torch.ops.vllm, "eslab_lora_linear"):
        return
    from vllm.utils.torch_utils import direct_register_custom_op

    direct_register_custom_op(
        op_name="eslab_lora_linear",
        op_func=_lora_linear_op,
        mutates_args=["y"],
        fake_impl=_lora_linear_fake,
    )


def add_lora_linear(
    self: Any,
    y: Any,
    x: Any,
    lora_a_stacked: tuple[Any, ...],
    lora_b_stacked: tuple[Any, ...],
    scale: float,
    output_slices: tuple[int, ...],
    *,
    buffer: Any = None,
    **kwargs: Any,
) -> None:
    """PunicaWrapperGPU.add_lora_linear's contract (y[:, slice s] += x @ A_s^T @ B_s^T *
    scale, per token's adapter, in place), by ES Lab's kernels."""
    if buffer is not None:
        raise ValueError("add_lora_linear makes its own scratch; no buffer is passed")
    add_inputs = bool(kwargs.pop("add_inputs", True))
    x = x.view(-1, x.shape[-1])
    meta = self.token_mapping_meta.meta_args(x.size(0), self.lora_config.specialize_active_lora)
    _, sorted_tokens, tokens_per_lora, token_start, lora_ids, no_lora, active = meta
    torch.ops.vllm.eslab_lora_linear(
        y.view(-1, y.shape[-1]), x.contiguous(), list(lora_a_stacked), list(lora_b_stacked),
        float(scale), list(output_slices), add_inputs, sorted_tokens, tokens_per_lora,
        token_start, lora_ids, no_lora, active,
    )  # fmt: skip


def _lora_linear_op(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: list[torch.Tensor],
    lora_b: list[torch.Tensor],
    scale: float,
    output_slices: list[int],
    add_inputs: bool,
    sorted_tokens: torch.Tensor,
    tokens_per_lora: torch.Tensor,
    token_start: torch.Tensor,
    lora_ids: torch.Tensor,
    no_lora_flag_cpu: torch.Tensor,
    num_active_loras: torch.Tensor,
) -> None:
    """The op's body; the two flags are CPU tensors, as in vLLM's ops (no wait on the GPU)."""
    if bool(no_lora_flag_cpu.item()):
        return
    from engine.backends.vllm.cuda import lora_kernels

    lora_kernels.lora_linear(
        y, x, lora_a, lora_b, scale, output_slices, add_inputs, sorted_tokens,
        tokens_per_lora, token_start, lora_ids, int(num_active_loras.item()),
    )  # fmt: skip


def _lora_linear_fake(*args: Any) -> None:
    """The op's shape function for torch.compile: it only writes y in place."""
