"""Full-rank members served in one batched call (`perturbation: full_batched`).

A full-rank member serves W + s_m * eps_m, eps_m its noise block of the worker's table
(engine/noise.py). Written into the weights, each member needs its own pass over a copy of
them: members then generate one after another, or in several engines a card, each reading
its own copy (bench/gpu/utilization.py measured the card idle 91% of a step). Here no
member's weights are written. Every linear layer computes its unperturbed product for all
members' tokens at once and adds, for the tokens of member m,

    y_m += s_m * x_m @ eps_m^T

so one engine serves the whole population in one `generate` call, as the low-rank mode does
(bench/gpu/shared_noise_engine.py measured the way inside vLLM: docs/gpu.md, "Members that
share the weight reads").

Tokens are mapped to members by vLLM's multi-LoRA machinery, which the low-rank mode uses
too (lora_slots.py): each member is registered in an adapter slot, every prompt names its
member's slot, and vLLM keeps, for every forward pass (prefill and decode alike, under CUDA
graphs too), which slot each token belongs to. The LoRA layers' own product is replaced
(`install`): in an engine started with `noise_llm_args`, whose LoRA target list carries the
marker MEMBER_NOISE_TARGET, the punica wrapper's `add_lora_linear` adds the members' noise
products instead of x A B. The marker is in vLLM's LoRA configuration, which the wrapper
holds, so the choice is made per engine and is fixed when vLLM traces and captures its
graphs (an environment variable would be per process, and a process may hold engines of
both kinds: the test session does).

What a slot says about a layer lives in the slot's own LoRA buffer of that layer, whose
weights this mode never uses: the first bytes of `lora_a_stacked[0][slot, 0, 0]` hold a
header of three int64 words (HEADER): the member's noise offset for the layer's tensor, the
address of the noise table, and the scale as fp32 bits (0: the slot adds nothing there).
Headers are written in place between steps; the CUDA graphs captured at start-up, before
the worker's table existed, read them as data, so the table's address travels in them too
(cuda/member_noise.py). vLLM writes a slot's buffers only when it activates an adapter in
it, which registration does once, before the first headers are written.

Which tensors: the weights of the LoRA-wrapped linear layers named by the run's
`lora_target_modules` in `lora_target_layers` (`noise_tensors`), whole: a fused layer
(q/k/v, gate/up) is perturbed only when every module it fuses is named. The embedding,
the norms, biases and the LM head keep the unperturbed values, and the update
(`apply_update`) changes only the perturbed tensors, with the same offsets and coefficients
as the one-member-at-a-time full rank, which perturbs every tensor (docs/algorithms.md).
The products are not those of weights rounded to bf16 with the noise in them (the noise
term is added to the product), so a run's samples differ from those of `perturbation: full`
at the same seed, which still fixes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from engine.backends.vllm.lora_slots import active_member_slots, locate, logical_name

if TYPE_CHECKING:
    import torch

MEMBER_NOISE_TARGET = "eslab_member_noise"
"""Marker in vLLM's LoRA target modules of an engine whose slots hold full-rank members. It
names no module, so vLLM wraps only the real targets; it is part of vLLM's compile cache key
(LoRAConfig.compute_hash), so graphs traced for one kind are not reused for the other."""

HEADER = 3
"""int64 words at the start of a slot's buffer: noise offset, table address, scale bits."""

_tables: dict[int, torch.Tensor] = {}
"""Table address (as the headers hold it) -> the table the CPU products read: the worker's
fp32 copy of the same values (the fast same-dtype matmul there)."""


def noise_llm_args(max_members: int, modules: Sequence[str]) -> dict[str, Any]:
    """`LLM(...)` arguments of an engine serving `max_members` full-rank members at once on
    the linear `modules` (Hugging Face names such as q_proj). Rank 1 is vLLM's least: the
    slots' buffers then hold a header a layer and little else."""
    return {
        "enable_lora": True,
        "max_loras": max_members,
        "max_lora_rank": 1,
        "max_cpu_loras": max_members,
        "lora_target_modules": [*modules, MEMBER_NOISE_TARGET],
    }


def serves_member_noise(wrapper: Any) -> bool:
    """Whether a punica wrapper belongs to an engine of `noise_llm_args`."""
    config = getattr(wrapper, "lora_config", None)
    return MEMBER_NOISE_TARGET in (getattr(config, "target_modules", None) or ())


# ---- the layers' path -----------------------------------------------------------------------


def install() -> bool:
    """Route the platform's punica wrapper's `add_lora_linear` through `add_lora_linear`
    below (once a process; at the worker extension's import, before vLLM builds and traces
    the model; on CUDA the kernel's op is registered then too). vLLM's CPU wrapper keeps no
    LoRA configuration, so its constructor is wrapped to keep it, as the GPU wrapper does.
    Returns whether the wrapper was found."""
    from vllm.platforms import current_platform

    if current_platform.is_cuda():
        from engine.backends.vllm.cuda import member_noise as cuda_noise

        cuda_noise.register_op()
        module, name = "vllm.lora.punica_wrapper.punica_gpu", "PunicaWrapperGPU"
        products = cuda_noise.add_noise_products
    else:
        module, name = "vllm.lora.punica_wrapper.punica_cpu", "PunicaWrapperCPU"
        products = _cpu_products
    try:
        wrapper = getattr(__import__(module, fromlist=[name]), name)
    except (ImportError, AttributeError):
        return False
    if not getattr(wrapper.add_lora_linear, "_eslab_member_noise", False):
        _keep_lora_config(wrapper)
        wrapper.add_lora_linear = _routed(wrapper.add_lora_linear, products)
    return True


def _keep_lora_config(wrapper: type) -> None:
    init = wrapper.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if not hasattr(self, "lora_config"):
            self.lora_config = kwargs.get("lora_config")

    wrapper.__init__ = __init__


def _cpu_products(
    wrapper: Any, y: torch.Tensor, x: torch.Tensor, headers: torch.Tensor, out: int
) -> None:
    add_noise_products(wrapper.token_lora_indices, y, x, headers, out)


def _routed(original: Any, products: Any) -> Any:
    """The wrapper's add_lora_linear: `original` in engines of other LoRA, else `products`
    (wrapper, y, x, a layer's headers, its output width), chosen at install so that the
    path vLLM traces on CUDA imports nothing."""

    def add_lora_linear(
        self: Any,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: tuple[torch.Tensor, ...],
        lora_b_stacked: tuple[torch.Tensor, ...],
        scale: float,
        output_slices: tuple[int, ...],
        **kwargs: Any,
    ) -> Any:
        """vLLM's contract (y += the tokens' adapters' products, in place), or in a member
        noise engine the members' noise products."""
        if not serves_member_noise(self):
            return original(
                self, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices, **kwargs
            )
        products(self, y, x, lora_a_stacked[0], sum(output_slices))
        return y

    add_lora_linear._eslab_member_noise = True  # type: ignore[attr-defined]
    return add_lora_linear


def add_noise_products(
    indices: torch.Tensor, y: torch.Tensor, x: torch.Tensor, headers: torch.Tensor, out: int
) -> None:
    """y[t, :out] += s * x[t] @ eps^T for every token t whose slot (indices[t] >= 0) holds a
    member here, from the slot's header in `headers` (a layer's lora_a_stacked[0]), in fp32
    and rounded once to y's dtype: the torch path, on the CPU and in the tests. A slot's
    tokens are gathered and its noise block read once a call."""
    import torch

    inputs = x.reshape(-1, x.shape[-1])
    flat = y.view(-1, y.shape[-1])
    indices = indices[: inputs.shape[0]]
    words, floats = header_views(headers)
    for slot in torch.unique(indices[indices >= 0]).tolist():
        scale = float(floats[slot, 4])
        if scale == 0.0:
            continue
        offset, address = int(words[slot, 0]), int(words[slot, 1])
        eps = _tables[address][offset : offset + out * inputs.shape[1]].view(out, -1)
        rows = torch.nonzero(indices == slot).flatten()
        product = inputs.index_select(0, rows).to(eps.dtype) @ eps.T
        target = flat[:, :out]
        target.index_copy_(
            0, rows, (target.index_select(0, rows).float() + scale * product.float()).to(y.dtype)
        )


def header_views(headers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer's slot buffers [slots, 1, rank, in] as int64 and fp32 rows, one a slot."""
    import torch

    rows = headers.reshape(headers.shape[0], -1)
    size = rows.shape[1] * rows.element_size()
    if size % 8 or size < 8 * HEADER:
        raise ValueError(f"a LoRA slot buffer {tuple(headers.shape)} cannot hold a member header")
    return rows.view(torch.int64), rows.view(torch.float32)


# ---- the worker's side ------------------------------------------------------------------------


def noise_spec(targets: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """What the workers need of a full_batched run: its target modules as lora_update_spec
    lists them ([name, layer, module, in, out], Hugging Face names)."""
    return {"kind": "noise", "targets": [list(t) for t in targets]}


def is_noise_spec(spec: Mapping[str, Any]) -> bool:
    return spec.get("kind") == "noise"


def noise_tensors(worker: Any, model: torch.nn.Module, spec: Mapping[str, Any]) -> list[int]:
    """Indices (in the worker's parameter list) of the weights the spec's members perturb:
    every vLLM parameter that holds a target, which must hold nothing else (all of a fused
    layer's modules named), checked once a spec."""
    key = repr(spec["targets"])
    cached = getattr(worker, "_es_noise_tensors", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    index = {name: i for i, name in enumerate(worker._es_names)}
    rows: dict[str, int] = {}
    for name, *_, out_features in spec["targets"]:
        param, _ = locate(model, name)
        rows[param] = rows.get(param, 0) + int(out_features)
    for param, covered in rows.items():
        whole = worker._es_maps[index[param]].shape[0]
        if covered != whole:
            raise ValueError(
                f"lora_target_modules: {param} fuses several modules and only some are "
                "named; perturbation full_batched perturbs whole tensors, so name all of "
                f"them ({covered} of its {whole} rows are named)"
            )
    found = sorted(index[param] for param in rows)
    worker._es_noise_tensors = (key, found)
    return found


def write_members(
    worker: Any, model: torch.nn.Module, spec: Mapping[str, Any], members: Sequence[Sequence[Any]]
) -> list[int]:
    """Write members (slot, seed, scale) into their slots' headers of every LoRA layer: the
    offset of the member's noise for the layer's tensor (the worker's own offsets, as its
    perturbations and updates use them), the table's address and the scale; layers whose
    tensor the spec does not perturb get scale 0. One indexed write a layer. Returns the
    slots not registered here (nothing is written then: the engine registers them and calls
    again)."""
    import torch

    if worker._es_tp_size != 1:
        raise NotImplementedError("perturbation full_batched needs tensor_parallel_size 1")
    manager = worker.model_runner.lora_manager._adapter_manager
    slots, missing = active_member_slots(manager, [int(m[0]) for m in members])
    if missing:
        return missing
    targets = set(noise_tensors(worker, model, spec))
    table = worker._es_table
    address = table.data_ptr()
    _tables[address] = worker._es_update_table
    device = table.device
    offsets = torch.tensor(
        [worker._es_offsets(int(m[1])) for m in members], dtype=torch.int64, device=device
    )
    bits = torch.tensor([float(m[2]) for m in members], dtype=torch.float32)
    bits = bits.view(torch.int32).to(torch.int64).bitwise_and(0xFFFFFFFF).to(device)
    rows = torch.tensor(slots, device=device)
    index = {name: i for i, name in enumerate(worker._es_names)}
    with torch.inference_mode():
        for path, layer in manager.modules.items():
            if not hasattr(layer, "lora_a_stacked"):
                continue
            i = index[logical_name(f"{path}.weight")]
            header = torch.zeros(len(members), HEADER, dtype=torch.int64, device=device)
            if i in targets:
                header[:, 0] = offsets[:, i]
                header[:, 1] = address
                header[:, 2] = bits
            words, _ = header_views(layer.lora_a_stacked[0])
            words[rows, :HEADER] = header
    return []


def apply_update(
    worker: Any,
    model: torch.nn.Module,
    spec: Mapping[str, Any],
    seeds: Sequence[int],
    coefficients: Sequence[float],
) -> None:
    """The full-rank update of the tensors the spec's members perturb, and of no other."""
    worker._es_update_tensors(seeds, coefficients, noise_tensors(worker, model, spec))
