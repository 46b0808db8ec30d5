"""Low-rank population members: each perturbation is a seeded LoRA adapter.

EGGROLL (arXiv 2511.16652) and earlier ES-over-LoRA work on multi-LoRA servers, whose
per-layer noise scale (mean |W| of the layer) is kept here (docs/algorithms.md, "Low-rank"):
instead of perturbing every weight, member i perturbs each target linear weight W (of layer
l) by a rank-r product,

    delta_i W = sign_i * sigma * m_l * E_i,   E_i = B_i A_i / sqrt(r),
    A_i ~ N(0, 1) [r, in],  B_i ~ N(0, 1) [out, r]   (from the member seed, below),

so the entries of E_i have unit variance, as eps does in full-rank ES, and m_l is the
per-layer noise scale of the reference (mean |W| over the layer's targets, or 1). Such a
perturbation is a LoRA adapter, and vLLM serves many adapters in one batch (multi-LoRA),
so a whole population is evaluated in one engine call. Antithetic pairs share A and B and
differ only in the sign (carried by B, as EGGROLL on vLLM does).

The ES update keeps the full-rank convention theta += lr / (N * sigma) * sum_i A_i eps_i with
eps_i = sign_i * m_l * E_i: with coefficients c_i from engine.es.update_coefficients,

    W += m_l / sqrt(r) * sum_i c_i B_i A_i          (dense, fp32)

which is either merged into the base weights (`merge`, by the engine from seeds and
coefficients, never shipped as matrices) or folded into one trained adapter of rank r
(`adapter`): the trained delta plus the update, truncated to rank r by an exact SVD of the
low-rank factors (`TrainedAdapter.add`). A and B are regenerated from the seed and never
saved: the serving engine holds a step's factors in its LoRA slots, and (its worker) in
memory for that step's update (engine/backends/vllm/lora_slots.SeedFactors).

A and B come from the shared noise table of full-rank ES (engine/noise.py), not from a
generator: member `seed`'s factors on a target are one contiguous block of r * (in + out)
table entries at the offset hashed from (seed, "lora/" + target name), A its first r * in
entries and B the rest, in fp32. The table is bit-identical on every device, so the worker
draws the factors where its LoRA slots live (a gather on the GPU, no generator on the CPU
and no copy to the device on a GPU step's path), and the trainer's process, which folds
them into the trained adapter in `adapter` mode, draws the same ones from a copy of the
table (engine.noise.shared_noise_table). The entries are the table's (bf16 by default)
normals, so their variance is 1 up to that rounding; A and B of one target never overlap,
and blocks of different seeds or targets overlap at a shift at most, as full-rank noise
blocks do (engine/noise.py).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.noise import noise_offsets

if TYPE_CHECKING:
    import torch

TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear modules of a Llama-family layer (the reference's default targets)."""

NOISE_SCALINGS = ("layer", "none")
"""layer: m_l = mean |W| over the layer's target weights (the reference); none: m_l = 1."""

LORA_KERNELS = ("deterministic", "fast")
"""On CUDA, deterministic: vLLM's LoRA shrink kernel without split-K (the same sums in the
same order every run, engine/backends/vllm/cuda/lora_configs.py); fast:
vLLM's default, whose split-K partial sums are added with atomics in an order that changes
from run to run. CPU kernels are deterministic either way."""

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."

_WEIGHT = re.compile(r"^model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.weight$")


@dataclass(frozen=True)
class LoraTarget:
    """One target linear layer, named as in the Hugging Face checkpoint."""

    name: str  # model.layers.3.self_attn.q_proj
    layer: int
    module: str  # q_proj
    in_features: int
    out_features: int


def parse_modules(text: str) -> tuple[str, ...]:
    """`q_proj,v_proj` -> ("q_proj", "v_proj"); empty items are an error."""
    items = tuple(item.strip() for item in text.split(","))
    if not items or any(not item for item in items):
        raise ValueError(f"must be a comma-separated list of module names, got {text!r}")
    return items


def parse_layers(text: str | None) -> tuple[int, ...] | None:
    """`0-9,12` -> (0, ..., 9, 12); None means every layer."""
    if text is None:
        return None
    layers: set[int] = set()
    for item in text.split(","):
        first, dash, last = item.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"must be layer numbers or ranges such as 0-9,12, got {text!r}")
        start, stop = int(first), int(last) if dash else int(first)
        if stop < start:
            raise ValueError(f"range {item.strip()!r} runs backwards")
        layers.update(range(start, stop + 1))
    return tuple(sorted(layers))


def find_targets(
    specs: Mapping[str, tuple[tuple[int, ...], str]],
    modules: Sequence[str],
    layers: Sequence[int] | None,
) -> list[LoraTarget]:
    """The target layers of a checkpoint (`specs`: name -> (shape, dtype), as read by
    hf_export.source_tensor_specs), sorted by name; unknown modules or layers are errors."""
    found: dict[str, LoraTarget] = {}
    present_layers: set[int] = set()
    present_modules: set[str] = set()
    for key, (shape, _) in specs.items():
        match = _WEIGHT.match(key)
        if not match or len(shape) != 2:
            continue
        layer, module = int(match.group(1)), match.group(3)
        present_layers.add(layer)
        present_modules.add(module)
        if module in modules and (layers is None or layer in layers):
            name = key.removesuffix(".weight")
            found[name] = LoraTarget(name, layer, module, int(shape[1]), int(shape[0]))
    missing = sorted(set(modules) - present_modules)
    if missing:
        raise ValueError(
            f"lora_target_modules {missing} are not linear modules of this model; "
            f"it has {sorted(present_modules)}"
        )
    if layers is not None and (bad := sorted(set(layers) - present_layers)):
        raise ValueError(
            f"lora_target_layers {bad} do not exist: the model has layers 0-{max(present_layers)}"
        )
    return [found[name] for name in sorted(found)]


def layer_scales(
    weights: Mapping[str, torch.Tensor], targets: Sequence[LoraTarget], scaling: str
) -> dict[int, float]:
    """m_l per target layer: mean |W| over the layer's target weights, or 1 for `none`."""
    if scaling not in NOISE_SCALINGS:
        raise ValueError(f"lora_noise_scaling must be one of {NOISE_SCALINGS}, got {scaling!r}")
    layers = sorted({t.layer for t in targets})
    if scaling == "none":
        return dict.fromkeys(layers, 1.0)
    means: dict[int, list[float]] = {layer: [] for layer in layers}
    for t in targets:
        means[t.layer].append(float(weights[f"{t.name}.weight"].float().abs().mean()))
    return {layer: sum(values) / len(values) for layer, values in means.items()}


LORA_KEY = "lora/"
"""Noise-table key prefix of a target's factors ("lora/" + target name): the factors never
share a key with a weight tensor's full-rank noise."""


def factor_size(target: LoraTarget, rank: int) -> int:
    """Table entries of one member's factors on `target`: r * in for A, then out * r for B."""
    return rank * (target.in_features + target.out_features)


def factor_offsets(
    seed: int, targets: Sequence[LoraTarget], rank: int, table_len: int
) -> list[int]:
    """Where member `seed`'s factors on each target start in the table (noise_offsets: pairwise
    distinct within the member, depending only on the seed and the set of targets)."""
    keys = [(LORA_KEY + t.name, factor_size(t, rank)) for t in targets]
    return noise_offsets(seed, keys, table_len)


Factors = dict[str, tuple["torch.Tensor", "torch.Tensor"]]
"""(A [S, r, in], B [S, out, r]) by target name, stacked over S seeds."""


def member_factors(
    table: torch.Tensor, seeds: Sequence[int], targets: Sequence[LoraTarget], rank: int
) -> Factors:
    """Factors of every seed on every target, stacked in seed order, as fp32 on the table's
    device: member `seed`'s block of factor_size entries at its offset, A its first r * in
    entries viewed [r, in] and B the rest viewed [out, r]. The table is the same on every
    device (engine.noise.build_noise_table), so are the factors; one gather a target."""
    import torch

    rows = [factor_offsets(int(s), targets, rank, table.numel()) for s in seeds]
    offsets = torch.tensor(rows, dtype=torch.long).reshape(len(seeds), len(targets))
    offsets = offsets.to(table.device)
    drawn: Factors = {}
    for j, t in enumerate(targets):
        blocks = table.unfold(0, factor_size(t, rank), 1)[offsets[:, j]].float()  # [S, size]
        split = rank * t.in_features
        drawn[t.name] = (
            blocks[:, :split].view(-1, rank, t.in_features),
            blocks[:, split:].view(-1, t.out_features, rank),
        )
    return drawn


def unit_factors(
    table: torch.Tensor,
    seeds: Sequence[int],
    targets: Sequence[LoraTarget],
    rank: int,
    scales: Mapping[int, float],
) -> Factors:
    """member_factors with B' = B * m_l / sqrt(r), so B' A = m_l * B A / sqrt(r): each seed's
    delta at scale 1. The members of a seed (an antithetic pair) serve (A, scale * B')."""
    drawn = member_factors(table, seeds, targets, rank)
    for t in targets:  # in place: B is a view of a block drawn for this call alone
        drawn[t.name][1].mul_(scales[t.layer] / math.sqrt(rank))
    return drawn


def member_stack(
    units: tuple[torch.Tensor, torch.Tensor],
    picks: torch.Tensor,
    scales: torch.Tensor,
    trained: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Members' factors on one target, stacked ([M, r, in], [M, out, r]): member m serves
    the unit factors (unit_factors, stacked by seed) of seed `picks[m]` with B times
    `scales[m]` (sign * sigma); with `trained` (adapter mode: the trained adapter's factors)
    those go in front, so each member serves the trained delta plus its perturbation as one
    rank-2r adapter. `picks` and `scales` are tensors on the factors' device."""
    import torch

    a = units[0].index_select(0, picks)
    b = units[1].index_select(0, picks) * scales[:, None, None]
    if trained is not None:
        a0, b0 = trained
        a = torch.cat([a0.expand(len(picks), -1, -1), a], dim=1)
        b = torch.cat([b0.expand(len(picks), -1, -1), b], dim=2)
    return a, b


def low_rank_sum(a: torch.Tensor, b: torch.Tensor, coefficients: torch.Tensor) -> torch.Tensor:
    """sum_i c_i B_i A_i as a dense fp32 [out, in] matrix, one matmul on the factors' device
    (a [N, r, in], b [N, out, r], coefficients [N] there too; on a GPU, a 1B model's 32
    members are ~256 GFLOP: seconds on the CPU)."""
    if not len(a) == len(b) == len(coefficients) or not len(a):
        raise ValueError(f"{len(a)} factor pairs and {len(coefficients)} coefficients")
    n, rank, in_features = a.shape
    scaled = b * coefficients[:, None, None]  # [N, out, r]
    return scaled.permute(1, 0, 2).reshape(-1, n * rank) @ a.reshape(n * rank, in_features)


# ---------------------------------------------------------------------------- adapters on disk


def adapter_tensors(
    factors: Mapping[str, tuple[torch.Tensor, torch.Tensor]], scaling: float
) -> dict[str, torch.Tensor]:
    """PEFT tensor names -> tensors for effective factors (A, B) with delta = B A; B is
    divided by the adapter's scaling (lora_alpha / r), which PEFT and vLLM multiply back."""
    tensors = {}
    for name, (a, b) in factors.items():
        tensors[f"{PEFT_PREFIX}{name}.lora_A.weight"] = a.contiguous()
        tensors[f"{PEFT_PREFIX}{name}.lora_B.weight"] = (b / scaling).contiguous()
    return tensors


def write_adapter(
    folder: str | Path,
    factors: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
    *,
    rank: int,
    alpha: float,
    base_model: str,
    dtype: torch.dtype | None = None,
) -> Path:
    """A PEFT LoRA folder (adapter_config.json + adapter_model.safetensors) whose delta on each
    named module is B A; transformers + PEFT and vLLM both load it."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = adapter_tensors(factors, alpha / rank)
    if dtype is not None:
        tensors = {k: v.to(dtype) for k, v in tensors.items()}
    modules = sorted({name.rpartition(".")[2] for name in factors})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": alpha,
        "target_modules": modules,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "init_lora_weights": True,
        "inference_mode": True,
        "layers_to_transform": sorted({int(n.split(".")[2]) for n in factors}),
    }
    (folder / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2))
    save_file(tensors, str(folder / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    return folder


# ---------------------------------------------------------------------------- trained adapter


class TrainedAdapter:
    """The `adapter` update mode: the trained delta of every target kept as rank-r factors
    (fp32, effective: delta = B A), the base weights untouched.

    `add` applies one ES update and truncates back to rank r by an exact SVD of the low-rank
    sum (QR of both factor stacks, SVD of the small core), so its cost grows with N * r,
    never with out * in.
    """

    def __init__(self, targets: Sequence[LoraTarget], rank: int) -> None:
        import torch

        self.targets = list(targets)
        self.rank = rank
        self.factors = {
            t.name: (torch.zeros(rank, t.in_features), torch.zeros(t.out_features, rank))
            for t in self.targets
        }

    def add(
        self,
        table: torch.Tensor,
        seeds: Sequence[int],
        coefficients: Sequence[float],
        scales: Mapping[int, float],
    ) -> None:
        """delta := best rank-r approximation of (delta + m_l / sqrt(r) * sum_i c_i B_i A_i),
        the factors drawn from `table` (a copy of the engines' noise table, so they are the
        ones the engines served: unit_factors)."""
        import torch

        if not seeds:
            return
        units = unit_factors(table, seeds, self.targets, self.rank, scales)
        weights = torch.tensor(coefficients, dtype=torch.float32)
        for t in self.targets:
            a0, b0 = self.factors[t.name]
            ua, ub = units[t.name]  # [N, r, in], [N, out, r]
            a = torch.cat([a0, ua.reshape(-1, t.in_features)])  # [K, in]
            b = torch.cat(
                [b0, (ub * weights[:, None, None]).permute(1, 0, 2).reshape(t.out_features, -1)],
                dim=1,
            )  # [out, K]
            q_b, r_b = torch.linalg.qr(b)  # b = q_b r_b, q_b [out, K]
            q_a, r_a = torch.linalg.qr(a.T)  # a = r_a^T q_a^T, q_a [in, K]
            u, s, vh = torch.linalg.svd(r_b @ r_a.T)  # [K, K] core
            root = s[: self.rank].sqrt()
            self.factors[t.name] = (
                (root[:, None] * vh[: self.rank]) @ q_a.T,
                (q_b @ u[:, : self.rank]) * root,
            )

    def delta(self, name: str) -> torch.Tensor:
        a, b = self.factors[name]
        return b @ a

    def state(self) -> dict[str, torch.Tensor]:
        """Flat tensors for a checkpoint (load_state reads them back)."""
        return {
            f"{n}.{k}": t for n, (a, b) in self.factors.items() for k, t in (("A", a), ("B", b))
        }

    def load_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        for name in self.factors:
            self.factors[name] = (tensors[f"{name}.A"].float(), tensors[f"{name}.B"].float())
