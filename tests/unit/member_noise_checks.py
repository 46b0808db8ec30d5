"""The member-noise products of `perturbation: full_batched` (engine/backends/vllm/
member_noise.py and its CUDA kernel) against a float64 reference, on a small linear layer
whose tokens belong to slots as vLLM maps them: run by tests/unit/test_member_noise.py, in
Triton's interpreter in a fresh process on a CPU (fp32), compiled on a GPU (bf16)."""

from __future__ import annotations

import json
from typing import ClassVar

import torch
import triton
import triton.language as tl

from engine.backends.vllm.cuda.member_noise import _tile_run

OUT, IN = 80, 128
"""A layer whose output is not a multiple of the kernel's 64 columns (masked edges run), and
whose inputs are, as models' are: at 96 inputs, a kernel loop that missed a shifted block's
last columns would still pass."""

SLOTS = 6

TABLE_LEN = 30_003
"""A table whose end is not 16-byte aligned, and whose last block (at END_OFFSET) starts 3
entries past an aligned one."""
END_OFFSET = TABLE_LEN - OUT * IN


def noise_table(generator: torch.Generator, dtype: torch.dtype, device: str) -> torch.Tensor:
    """A table of TABLE_LEN normals as an engine holds it: followed by TABLE_SLACK more, and
    then by NaNs, which a kernel reading past the slack would carry into its products."""
    from engine.noise import TABLE_SLACK

    values = torch.randn(TABLE_LEN + TABLE_SLACK + 8, generator=generator)
    values[TABLE_LEN + TABLE_SLACK :] = float("nan")
    return values.to(dtype).to(device)[:TABLE_LEN]


def token_mapping(
    indices: torch.Tensor, device: str, slots: int = SLOTS
) -> dict[str, torch.Tensor]:
    """vLLM's LoRAKernelMeta for per-token slot `indices` (-1: no member), as
    prepare_tensors builds it: each token's slot, tokens sorted by slot, the slots present
    (sorted, -1 first), their token counts and starts, padded to `slots` + 1 entries, and its
    two CPU flags (bench/gpu/member_noise_kernel.py builds its passes with it too)."""
    order = torch.sort(indices, stable=True).indices
    ids, counts = torch.unique(indices, sorted=True, return_counts=True)
    lora_ids = torch.full((slots + 1,), -1, dtype=torch.int32)
    per_lora = torch.zeros(slots + 1, dtype=torch.int32)
    starts = torch.zeros(slots + 2, dtype=torch.int32)
    lora_ids[: ids.numel()] = ids.int()
    per_lora[: counts.numel()] = counts.int()
    starts[1 : 1 + counts.numel()] = torch.cumsum(counts, 0).int()
    return {
        "token_slots": indices.int().to(device),
        "sorted_tokens": order.int().to(device),
        "tokens_per_lora": per_lora.to(device),
        "token_start": starts.to(device),
        "lora_ids": lora_ids.to(device),
        "no_lora_flag_cpu": torch.tensor([bool((indices < 0).all())]),
        "num_active_loras": torch.tensor([ids.numel()]),
    }


def headers_of(
    offsets: list[int],
    scales: list[float],
    table: torch.Tensor,
    dtype: torch.dtype,
    inputs: int = IN,
) -> torch.Tensor:
    """A layer of `inputs` inputs: its lora_a_stacked[0] of rank 1 with a member header in
    every slot, one a member of `offsets`."""
    from engine.backends.vllm import member_noise

    headers = torch.zeros(len(offsets), 1, 1, inputs, dtype=dtype, device=table.device)
    words, floats = member_noise.header_views(headers)
    for slot, (offset, scale) in enumerate(zip(offsets, scales, strict=True)):
        words[slot, 0], words[slot, 1] = offset, table.data_ptr()
        floats[slot, 4] = scale
    return headers


def reference(
    y: torch.Tensor,
    x: torch.Tensor,
    indices: torch.Tensor,
    table: torch.Tensor,
    offsets: list[int],
    scales: list[float],
) -> torch.Tensor:
    """y + s * x @ eps^T per token's slot, in float64."""
    out = y.double().clone()
    for t, slot in enumerate(indices.tolist()):
        if slot >= 0:
            eps = table[offsets[slot] : offsets[slot] + OUT * IN].double().view(OUT, IN)
            out[t, :OUT] += scales[slot] * (x[t].double() @ eps.T)
    return out


def check(device: str, dtype: torch.dtype) -> dict[str, float]:
    """Largest errors of the kernel and of the torch path against the reference, relative to
    the largest product, for decode-like (few tokens a slot) and prefill-like (many) passes,
    and whether tokens without a member or with scale 0 changed at all."""
    from engine.backends.vllm import member_noise
    from engine.backends.vllm.cuda import member_noise as cuda_noise

    generator = torch.Generator().manual_seed(3)
    table = noise_table(generator, dtype, device)
    offsets = [0, 7_001, END_OFFSET, 12_345, 501, 9_999]
    scales = [0.5, -0.5, 0.25, 0.0, 1.0, -2.0]  # slot 3: scale 0 adds nothing
    headers = headers_of(offsets, scales, table, dtype)
    member_noise._tables[table.data_ptr()] = table
    outcome: dict[str, float] = {}
    for name, per_slot in (("decode", 5), ("prefill", 70)):
        slots = [s for s in (4, 0, -1, 2, 3, 1, 5) for _ in range(per_slot)]
        indices = torch.tensor(slots)[torch.randperm(len(slots), generator=generator)]
        x = torch.randn(len(slots), IN, generator=generator).to(dtype).to(device)
        y = torch.randn(len(slots), OUT + 3, generator=generator).to(dtype).to(device)
        expected = reference(y.cpu(), x.cpu(), indices, table.cpu(), offsets, scales)
        scale = float((expected - y.cpu().double()).abs().max())
        untouched = (indices < 0) | (indices == 3)
        for way in ("kernel", "torch"):
            got = y.clone()
            if way == "kernel":
                meta = token_mapping(indices, device)
                cuda_noise.member_noise(got, x, headers, OUT, **meta)
            else:
                member_noise.add_noise_products(indices.to(device), got, x, headers, OUT)
            got = got.cpu()
            error = float((got.double() - expected).abs().max()) / scale
            outcome[f"{name}_{way}_error"] = error
            before = y.cpu()
            changed = bits(got[untouched]) != bits(before[untouched])
            outcome[f"{name}_{way}_untouched_changed"] = float(changed.sum())
            padding = bits(got[:, OUT:]) != bits(before[:, OUT:])
            outcome[f"{name}_{way}_padding_changed"] = float(padding.sum())
    outcome["prefill_block_m"] = float(cuda_noise.block_m(70 * 7, 7))
    outcome["decode_block_m"] = float(cuda_noise.block_m(5 * 7, 7))
    return outcome


PAIR_OFFSETS = [0, 0, 3_333, 3_333, 3_333, 501]
"""Members of one noise block: slots 0 and 1 (an antithetic pair), and 2, 3 and 4 (one run
of three, as members of one seed side by side would be)."""
PAIR_SCALES = [0.5, -0.5, 0.25, 0.0, 1.0, -1.0]  # slot 3: scale 0 adds nothing
PAIR_PASSES = {
    # a pair with different counts (a tile holds tokens of both), and three of one block
    # side by side (the second adds nothing) in one run
    "both": {0: 5, 1: 21, 2: 7, 3: 7, 4: 9, -1: 4},
    # no two neighbours of one block
    "alone": {0: 3, 3: 8, 5: 8},
    # a pair whose first adds nothing, in an odd slot
    "shifted": {3: 5, 4: 20},
}
PAIR_TILES = {
    "both": [(1, 0, 26), (1, 16, 26), (3, 0, 23), (3, 16, 23)],
    "alone": [(0, 0, 3), (1, 0, 8), (2, 0, 8)],
    "shifted": [(0, 0, 25), (0, 16, 25)],
}
"""(first group of the run, first row, the run's tokens) of each tile at 16 tokens a block;
groups are listed by slot, -1 first: "both" has groups -1, 0, 1, 2, 3, 4."""


@triton.jit
def _tiles_kernel(
    out, lora_ids, tokens_per_lora, groups, words, header_words,
    BLOCK: tl.constexpr, GROUPS: tl.constexpr,
):  # fmt: skip
    """(group, row, rows) of tile program_id(0), as the member-noise kernel maps it."""
    t = tl.program_id(0)
    g, row, rows = _tile_run(
        t, lora_ids, tokens_per_lora, groups, words, header_words, BLOCK, GROUPS
    )
    tl.store(out + 3 * t, g)
    tl.store(out + 3 * t + 1, row)
    tl.store(out + 3 * t + 2, rows)


def check_pairs(device: str, dtype: torch.dtype) -> dict[str, float]:
    """Antithetic pairs and a run of three, whose tokens share tiles and one read of their
    block: the kernel's largest error against float64 in each pass, whether tokens without
    a member or of scale 0 changed, and whether its tiles are PAIR_TILES (1.0)."""
    from engine.backends.vllm import member_noise
    from engine.backends.vllm.cuda import member_noise as cuda_noise

    generator = torch.Generator().manual_seed(11)
    table = noise_table(generator, dtype, device)
    headers = headers_of(PAIR_OFFSETS, PAIR_SCALES, table, dtype)
    words, _ = member_noise.header_views(headers)
    outcome: dict[str, float] = {}
    for name, counts in PAIR_PASSES.items():
        slots = [s for s, n in counts.items() for _ in range(n)]
        indices = torch.tensor(slots)[torch.randperm(len(slots), generator=generator)]
        x = torch.randn(len(slots), IN, generator=generator).to(dtype).to(device)
        y = torch.randn(len(slots), OUT, generator=generator).to(dtype).to(device)
        expected = reference(y.cpu(), x.cpu(), indices, table.cpu(), PAIR_OFFSETS, PAIR_SCALES)
        meta = token_mapping(indices, device)
        got = y.clone()
        cuda_noise.member_noise(got, x, headers, OUT, **meta)
        got = got.cpu()
        scale = float((expected - y.cpu().double()).abs().max())
        outcome[f"pairs_{name}_error"] = float((got.double() - expected).abs().max()) / scale
        untouched = (indices < 0) | (indices == 3)
        changed = bits(got[untouched]) != bits(y.cpu()[untouched])
        outcome[f"pairs_{name}_untouched_changed"] = float(changed.sum())
        tiles = torch.full((8, 3), -7, dtype=torch.int32, device=device)
        groups = meta["lora_ids"].numel()
        _tiles_kernel[(8,)](
            tiles, meta["lora_ids"], meta["tokens_per_lora"], groups, words, words.stride(0),
            BLOCK=16, GROUPS=triton.next_power_of_2(groups),
        )  # fmt: skip
        mapped = [tuple(row) for row in tiles.cpu().tolist() if row[0] >= 0]
        outcome[f"pairs_{name}_tiles_as_expected"] = float(mapped == PAIR_TILES[name])
    return outcome


class _KernelMeta:
    """vLLM's LoRAKernelMeta as far as the hook reads it (meta_args)."""

    def __init__(self, indices: torch.Tensor, device: str) -> None:
        self.args = tuple(token_mapping(indices, device).values())

    def meta_args(self, tokens: int, specialize_active_lora: bool) -> tuple[torch.Tensor, ...]:
        token_slots, sorted_tokens, *rest = self.args
        return (token_slots[:tokens], sorted_tokens[:tokens], *rest)


def check_traced(device: str, dtype: torch.dtype) -> dict[str, float]:
    """The routed add_lora_linear of a member-noise engine as vLLM's compiled model calls
    it: traced whole by torch.compile (fullgraph, aot_eager: the op's fake implementation
    and its in-place write of y included), through the punica wrapper's configuration
    and token mapping, the registered op and the kernel. Returns its largest error against
    float64 and whether an engine of other LoRA still reaches its own path."""
    from engine.backends.vllm import member_noise
    from engine.backends.vllm.cuda import member_noise as cuda_noise

    cuda_noise.register_op()
    generator = torch.Generator().manual_seed(5)
    table = noise_table(generator, dtype, device)
    offsets, scales = [0, 9_000, 4_000, 11_000, 2_000, 6_000], [0.5, -0.5, 1.0, 0.0, 2.0, -1.0]
    headers = headers_of(offsets, scales, table, dtype)
    indices = torch.tensor([s for s in (2, -1, 0, 5) for _ in range(6)])
    x = torch.randn(len(indices), IN, generator=generator).to(dtype).to(device)
    y = torch.randn(len(indices), OUT, generator=generator).to(dtype).to(device)
    expected = reference(y.cpu(), x.cpu(), indices, table.cpu(), offsets, scales)
    others: list[str] = []

    class Config:
        target_modules: ClassVar[list[str]] = ["q_proj", member_noise.MEMBER_NOISE_TARGET]
        specialize_active_lora = False

    class Wrapper:
        lora_config = Config()
        token_mapping_meta = _KernelMeta(indices, device)

    hook = member_noise._routed(
        lambda *args, **kwargs: others.append("lora"), cuda_noise.add_noise_products
    )

    def layer(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        hook(Wrapper(), y, x, (headers,), (headers,), 1.0, (OUT,))
        return y

    got = torch.compile(layer, fullgraph=True, backend="aot_eager")(y.clone(), x).cpu()
    scale = float((expected - y.cpu().double()).abs().max())
    Config.target_modules = ["q_proj"]
    hook(Wrapper(), y.clone(), x, (headers,), (headers,), 1.0, (OUT,))
    return {
        "traced_error": float((got.double() - expected).abs().max()) / scale,
        "other_lora_calls": float(len(others)),
    }


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


if __name__ == "__main__":
    on_gpu = torch.cuda.is_available()
    dtype = torch.bfloat16 if on_gpu else torch.float32
    device = "cuda" if on_gpu else "cpu"
    checks = (check, check_pairs, check_traced)
    print(json.dumps({k: v for run in checks for k, v in run(device, dtype).items()}))
