"""Could full-rank members share their weight reads? The linear layers of one decode step of
a whole population, timed three ways on a model's shapes (no engine, no vLLM):

- **separate copies** (what ES Lab does today, `engines_per_gpu` engines each holding one
  member's perturbed weights): every member's 8 tokens through its own copy of every linear
  weight, so each member reads all the weights (two copies used in turn so that no read is
  served from the L2 cache), by cuBLAS and by a split-K Triton product for a few tokens; the
  faster of the two is the baseline.
- **shared + noise** (`y = W x + s_m * (eps_m x)`): one GEMM of all members' tokens through
  the unperturbed weights, then a Triton kernel that adds each member's noise product, reading
  eps_m straight from the noise table.
- **shared, exact** (`y = bf16(W + s_m * eps_m) x`): one Triton kernel that builds each
  member's perturbed weight tile as the engine's perturbation writes it (the same bf16 bits)
  and multiplies; W and the noise are read once per tile and member, through the L2 cache.

The noise table is read at each member's offset. With the table's hashed offsets (`--spread
table`, what engine.noise does now) the members' blocks lie anywhere in the table and every
member's read goes to HBM: no saving. With the members' offsets of one tensor drawn within
`--spread S` entries of a common base (a different noise scheme, not implemented in the
engine), the members' blocks overlap in the table, and the L2 cache can serve most of them.
The spreads time how much of that the cache delivers.

Each way is captured in one CUDA graph (as vLLM runs a decode step) and timed as the median
of --repeats replays. Also printed: one read of all the linear weights (by `sum`, tensor by
tensor; slower than a member's cuBLAS products, so not a floor) and the unperturbed GEMM alone
at the population's token count (what one batched call of the same tokens costs); each shared
row says how many times faster than the baseline it is. A check first compares every kernel
with torch on a small linear (errors relative to the output's largest entry; for the exact
way, the share of perturbed entries whose bits differ from the engine's perturbation).
Results, one JSON object, go to --json. Runs on the GPU image as it comes (torch and Triton,
and engine/noise.py's table length, which needs nothing installed):

    python3 bench/gpu/shared_reads.py [--model 1b|135m] [--members 32] [--tokens 8]
        [--spreads table 1048576 65536 0] [--json FILE]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from engine.noise import noise_table_len  # stdlib imports only: runs without an install

# (hidden, intermediate, layers, query heads, key-value heads, head dim, vocabulary), as
# bench/gpu/make_models.py builds them; the embedding is tied, so lm_head reads it.
MODELS = {
    "1b": (2048, 8192, 16, 32, 8, 64, 49152),
    "135m": (576, 1536, 30, 9, 3, 64, 49152),
}
SPREADS = ["table", "16777216", "1048576", "65536", "0"]
"""Member offsets of the timed rows: see member_offsets."""
TOKEN_TILE = 16
"""A member's tokens padded to the smallest tl.dot width."""


def linear_shapes(model: str) -> list[tuple[int, int]]:
    """(out, in) of every linear of one decode step, as vLLM fuses them (qkv, gate_up)."""
    hidden, inter, layers, heads, kv_heads, head_dim, vocab = MODELS[model]
    layer = [
        ((heads + 2 * kv_heads) * head_dim, hidden),
        (hidden, heads * head_dim),
        (2 * inter, hidden),
        (hidden, inter),
    ]
    return layer * layers + [(vocab, hidden)]


@triton.jit
def _noise_product(
    x_ptr, table_ptr, offsets_ptr, scales_ptr, out_ptr, active_ptr, N, K, M,
    TOKENS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, TT: tl.constexpr,
    PAIRS: tl.constexpr, WHEN: tl.constexpr,
):  # fmt: skip
    """out[m's tokens, rows] += s_m * (eps_m[rows, :] @ x[m's tokens].T), eps_m the table's
    block at offsets[m] (in the table's dtype, widened to x's). Programs go member-fastest:
    the members of one row block run side by side, so blocks that overlap in the table meet
    in the L2 cache. With PAIRS, members m and m + M (antithetic: one seed, scales s and -s)
    share block m, and their tokens fill one tile, so one read of the noise serves both.
    With WHEN > 0 the kernel adds only while the int32 at active_ptr equals WHEN, and
    otherwise reads and writes nothing: a flag on the GPU that switches kernels captured in
    CUDA graphs (bench/gpu/shared_noise_engine.py)."""
    if WHEN:  # noqa: SIM108 (a constexpr branch: Triton compiles only the taken one)
        on = (tl.load(active_ptr) == WHEN).to(tl.int32)
    else:
        on = tl.full((), 1, tl.int32)
    pid = tl.program_id(0)
    m = pid % M
    rows = (pid // M) * BN + tl.arange(0, BN)
    toks = tl.arange(0, TT)
    if PAIRS:
        first = toks < TOKENS
        token_row = tl.where(first, m * TOKENS + toks, (m + M) * TOKENS + toks - TOKENS)
        valid = toks < 2 * TOKENS
        scale = tl.where(first, tl.load(scales_ptr + m), tl.load(scales_ptr + m + M))
    else:
        token_row = m * TOKENS + toks
        valid = toks < TOKENS
        scale = tl.zeros((TT,), dtype=tl.float32) + tl.load(scales_ptr + m)
    base = tl.load(offsets_ptr + m)
    acc = tl.zeros((BN, TT), dtype=tl.float32)
    for k0 in range(0, K * on, BK):
        cols = k0 + tl.arange(0, BK)
        xt = tl.load(
            x_ptr + token_row[None, :] * K + cols[:, None],
            mask=valid[None, :] & (cols[:, None] < K),
            other=0.0,
        )
        eps = tl.load(
            table_ptr + base + rows[:, None] * K + cols[None, :],
            mask=(rows[:, None] < N) & (cols[None, :] < K),
            other=0.0,
        )
        acc = tl.dot(eps.to(xt.dtype), xt, acc)
    out = out_ptr + token_row[None, :] * N + rows[:, None]
    live = (tl.zeros((TT,), dtype=tl.int32) + on) > 0
    mask = (rows[:, None] < N) & (valid & live)[None, :]
    before = tl.load(out, mask=mask, other=0.0).to(tl.float32)
    tl.store(out, (before + scale[None, :] * acc).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _small_batch_product(
    x_ptr, w_ptr, out_ptr, N, K, KS,
    TOKENS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, TT: tl.constexpr,
):  # fmt: skip
    """out[:TOKENS, rows] += w[rows, ks] @ x[:, ks].T over this program's KS columns (fp32
    out, atomically): a split-K product for a few tokens, so that enough programs stream
    the weight to use the card's bandwidth."""
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    toks = tl.arange(0, TT)
    acc = tl.zeros((BN, TT), dtype=tl.float32)
    for k0 in range(tl.program_id(1) * KS, tl.minimum((tl.program_id(1) + 1) * KS, K), BK):
        cols = k0 + tl.arange(0, BK)
        w = tl.load(
            w_ptr + rows[:, None] * K + cols[None, :],
            mask=(rows[:, None] < N) & (cols[None, :] < K),
            other=0.0,
        )
        xt = tl.load(
            x_ptr + toks[None, :] * K + cols[:, None],
            mask=(toks[None, :] < TOKENS) & (cols[:, None] < K),
            other=0.0,
        )
        acc = tl.dot(w, xt, acc)
    mask = (rows[:, None] < N) & (toks[None, :] < TOKENS)
    tl.atomic_add(out_ptr + toks[None, :] * N + rows[:, None], acc, mask=mask)


@triton.jit
def _perturbed_product(
    x_ptr, w_ptr, table_ptr, offsets_ptr, scales_ptr, out_ptr, N, K, M,
    TOKENS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, TT: tl.constexpr,
):  # fmt: skip
    """out[m's tokens, rows] = bf16(w + s_m * eps_m)[rows, :] @ x[m's tokens].T, the
    perturbed tile computed as engine/backends/vllm/cuda/kernels.py perturbs: fma(eps, s,
    w) in fp32, rounded once to nearest even."""
    pid = tl.program_id(0)
    m = pid % M
    rows = (pid // M) * BN + tl.arange(0, BN)
    toks = tl.arange(0, TT)
    base = tl.load(offsets_ptr + m)
    scale = tl.load(scales_ptr + m)
    acc = tl.zeros((BN, TT), dtype=tl.float32)
    for k0 in range(0, K, BK):
        cols = k0 + tl.arange(0, BK)
        mask = (rows[:, None] < N) & (cols[None, :] < K)
        index = rows[:, None] * K + cols[None, :]
        w = tl.load(w_ptr + index, mask=mask, other=0.0).to(tl.float32)
        eps = tl.load(table_ptr + base + index, mask=mask, other=0.0).to(tl.float32)
        tile = tl.fma(eps, tl.zeros((BN, BK), dtype=tl.float32) + scale, w)
        tile = tile.to(w_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
        xt = tl.load(
            x_ptr + (m * TOKENS + toks[None, :]) * K + cols[:, None],
            mask=(toks[None, :] < TOKENS) & (cols[:, None] < K),
            other=0.0,
        )
        acc = tl.dot(tile, xt, acc)
    out = out_ptr + (m * TOKENS + toks[None, :]) * N + rows[:, None]
    tl.store(
        out,
        acc.to(out_ptr.dtype.element_ty),
        mask=(rows[:, None] < N) & (toks[None, :] < TOKENS),
    )


def add_noise_product(
    x,
    table,
    offsets,
    scales,
    out,
    tokens: int,
    bn: int,
    bk: int,
    pairs: bool = False,
    active: torch.Tensor | None = None,
    when: int = 0,
) -> None:
    """See _noise_product; with `pairs`, offsets has one block for each pair of members;
    with `active` (an int32 on the GPU), the product is added only while it holds `when`."""
    if (active is None) != (when == 0):
        raise ValueError("a gated product needs both the flag and the value it runs at")
    blocks = offsets.numel()
    n, k = out.shape[1], x.shape[1]
    if pairs and 2 * tokens > TOKEN_TILE:
        raise ValueError(f"a pair's {2 * tokens} tokens exceed the tile's {TOKEN_TILE}")
    grid = (triton.cdiv(n, bn) * blocks,)
    _noise_product[grid](
        x, table, offsets, scales, out, scales if active is None else active, n, k, blocks,
        TOKENS=tokens, BN=bn, BK=bk, TT=TOKEN_TILE, PAIRS=pairs, WHEN=when,
    )  # fmt: skip


def small_batch_product(x, w, out32, tokens: int, bn: int, bk: int, programs: int) -> None:
    """out32 (fp32, zeroed here) = x @ w.T for `tokens` rows of x, split over K until
    about `programs` programs run."""
    n, k = w.shape
    blocks = triton.cdiv(n, bn)
    splits = max(1, min(k // bk, triton.cdiv(programs, blocks)))
    ks = bk * triton.cdiv(triton.cdiv(k, splits), bk)
    out32.zero_()
    _small_batch_product[(blocks, triton.cdiv(k, ks))](
        x, w, out32, n, k, ks, TOKENS=tokens, BN=bn, BK=bk, TT=TOKEN_TILE
    )


def perturbed_product(x, w, table, offsets, scales, out, tokens: int, bn: int, bk: int) -> None:
    members = offsets.numel()
    n, k = w.shape
    grid = (triton.cdiv(n, bn) * members,)
    _perturbed_product[grid](
        x, w, table, offsets, scales, out, n, k, members,
        TOKENS=tokens, BN=bn, BK=bk, TT=TOKEN_TILE,
    )  # fmt: skip


def member_offsets(
    spread: str, members: int, numel: int, table_len: int, gen: torch.Generator
) -> torch.Tensor:
    """One tensor's members' table offsets: anywhere in the table (`table`), or distinct
    multiples of 64 entries (128-byte lines) within `spread` entries of a common base; `0`
    gives every member the same block (the cache's best case, not a usable scheme)."""
    if spread == "table":
        return torch.randint(0, table_len - numel + 1, (members,), generator=gen)
    width = int(spread)
    if width and width < 64 * members:
        raise ValueError(f"--spreads {width}: at least 64 entries a member, {64 * members}")
    base = int(torch.randint(0, table_len - numel - width + 1, (1,), generator=gen))
    if not width:
        return torch.full((members,), base, dtype=torch.int64)
    return base + 64 * torch.randperm(width // 64, generator=gen)[:members]


def graph_seconds(step: Callable[[], None], repeats: int) -> float:
    """Median seconds of one replay of `step` captured in a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def check_kernels(
    tokens: int, members: int, bn: int, bk: int, device: str = "cuda", dtype=torch.bfloat16
) -> dict:
    """Each kernel against torch on one small linear: the largest error relative to the
    output's largest entry (the noise product alone, with antithetic pairs: members m and
    m + members/2 on one block at +s and -s, and gated by a flag that holds its value), the
    share of outputs that the gated product changed with its flag off, and the share of the
    exact kernel's perturbed entries whose bits differ from torch.add(w, eps, alpha=s) (read
    back through a product with the identity, which rounds nothing)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    n, k, s = 192, 256, 1e-3
    w = (0.02 * torch.randn(n, k, generator=gen)).to(device, dtype)
    table = torch.randn(4 * n * k, generator=gen).to(device, dtype)
    offsets = member_offsets("table", members, n * k, table.numel(), gen).to(device)
    half = members // 2
    pair_offsets = offsets[:half].repeat(2)
    scales = torch.full((members,), s, device=device)
    pair_scales = torch.tensor([s] * half + [-s] * half, device=device)
    x = torch.randn(members * tokens, k, generator=gen).to(device, dtype)
    xs = x.view(members, tokens, k).float()

    def noise(offs: torch.Tensor) -> torch.Tensor:
        return torch.stack([table[o : o + n * k].view(n, k) for o in offs.tolist()])

    def error(got: torch.Tensor, want: torch.Tensor) -> float:
        return (got.float().view_as(want) - want).abs().max().item() / top

    eps = noise(offsets)
    perturbed = torch.add(w, eps, alpha=s)
    want_exact = torch.einsum("mtk,mnk->mtn", xs, perturbed.float())
    top = want_exact.abs().max().item()
    want_noise = torch.einsum("mtk,mnk->mtn", xs, w.float() + s * eps.float())
    signed = pair_scales.view(-1, 1, 1) * noise(pair_offsets).float()
    want_pairs = torch.einsum("mtk,mnk->mtn", xs, w.float() + signed)
    got = x @ w.T
    add_noise_product(x, table, offsets, scales, got, tokens, bn, bk)
    got_pairs = x @ w.T
    add_noise_product(x, table, offsets[:half], pair_scales, got_pairs, tokens, bn, bk, True)
    flag = torch.zeros(1, dtype=torch.int32, device=device)
    gated = {}
    for state in (0, 2):  # the flag off (0), then on at the kernel's value
        flag.fill_(state)
        gated[state] = x @ w.T
        add_noise_product(x, table, offsets, scales, gated[state], tokens, bn, bk, False, flag, 2)
    exact = torch.empty_like(got)
    perturbed_product(x, w, table, offsets, scales, exact, tokens, bn, bk)
    rows = torch.arange(members * tokens, device=device)
    identity = torch.zeros(members * tokens, k, device=device, dtype=dtype)
    identity[rows, rows % k] = 1
    tiles = torch.empty_like(got)
    perturbed_product(identity, w, table, offsets, scales, tiles, tokens, bn, bk)
    expected = perturbed[rows // tokens, :, rows % k]
    return {
        "noise_kernel_error": error(got, want_noise),
        "noise_pairs_kernel_error": error(got_pairs, want_pairs),
        "gated_on_error": error(gated[2], want_noise),
        "gated_off_changed": (gated[0] != x @ w.T).float().mean().item(),
        "exact_kernel_error": error(exact, want_exact),
        "exact_bits_differ": (tiles != expected).float().mean().item(),
    }


@dataclass
class Step:
    """One decode step's linears for the whole population, on the GPU."""

    shapes: list[tuple[int, int]]
    tokens: int
    weights: list[list[torch.Tensor]]  # two copies of every linear weight
    tables: dict[str, torch.Tensor]  # the noise table, in bf16 and in fp8
    inputs: dict[int, torch.Tensor]  # every member's tokens, by input width
    outs: list[torch.Tensor]
    outs32: list[torch.Tensor]  # one member's output, fp32, for the split-K product
    scales: torch.Tensor  # members 0..M/2-1 at +s, their antithetic partners at -s
    programs: int

    @classmethod
    def make(cls, model: str, members: int, tokens: int) -> Step:
        shapes = linear_shapes(model)
        largest = max(n * k for n, k in shapes)
        x = torch.randn(members * tokens, max(k for _, k in shapes), device="cuda").bfloat16()
        table = torch.randn(noise_table_len(largest), device="cuda", dtype=torch.bfloat16)
        half = members // 2
        return cls(
            shapes=shapes,
            tokens=tokens,
            weights=[[_random(n, k) for n, k in shapes] for _ in range(2)],
            tables={"bf16": table, "fp8": table.to(torch.float8_e4m3fn)},
            inputs={k: x[:, :k].contiguous() for _, k in shapes},
            outs=[_random(members * tokens, n) for n, _ in shapes],
            outs32=[torch.zeros(tokens, n, device="cuda") for n, _ in shapes],
            scales=torch.tensor([1e-3] * half + [-1e-3] * (members - half), device="cuda"),
            programs=4 * torch.cuda.get_device_properties(0).multi_processor_count,
        )

    def read_all(self) -> None:
        for w in self.weights[0]:
            w.sum(dtype=torch.float32)

    def separate(self) -> None:
        for m in range(self.scales.numel()):
            rows = slice(m * self.tokens, (m + 1) * self.tokens)
            for (_, k), w, out in zip(self.shapes, self.weights[m % 2], self.outs, strict=True):
                torch.matmul(self.inputs[k][rows], w.T, out=out[rows])

    def separate_split_k(self, bn: int, bk: int) -> None:
        for m in range(self.scales.numel()):
            first = m * self.tokens
            parts = zip(self.shapes, self.weights[m % 2], self.outs32, strict=True)
            for (_, k), w, out32 in parts:
                x = self.inputs[k][first:]
                small_batch_product(x, w, out32, self.tokens, bn, bk, self.programs)

    def unperturbed(self) -> None:
        for (_, k), w, out in zip(self.shapes, self.weights[0], self.outs, strict=True):
            torch.matmul(self.inputs[k], w.T, out=out)

    def shared_noise(
        self, offsets: list[torch.Tensor], bn: int, bk: int, table: str, pairs: bool
    ) -> None:
        self.unperturbed()
        for (_, k), out, off in zip(self.shapes, self.outs, offsets, strict=True):
            blocks = off[: off.numel() // 2] if pairs else off
            add_noise_product(
                self.inputs[k], self.tables[table], blocks, self.scales, out, self.tokens,
                bn, bk, pairs,
            )  # fmt: skip

    def shared_exact(self, offsets: list[torch.Tensor], bn: int, bk: int) -> None:
        parts = zip(self.shapes, self.weights[0], self.outs, offsets, strict=True)
        for (_, k), w, out, off in parts:
            perturbed_product(
                self.inputs[k], w, self.tables["bf16"], off, self.scales, out, self.tokens, bn, bk
            )


def _random(rows: int, cols: int) -> torch.Tensor:
    return torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)


WAYS = {
    "noise": lambda step, off, bn, bk: step.shared_noise(off, bn, bk, "bf16", False),
    "noise_pairs": lambda step, off, bn, bk: step.shared_noise(off, bn, bk, "bf16", True),
    "noise_pairs_fp8": lambda step, off, bn, bk: step.shared_noise(off, bn, bk, "fp8", True),
    "exact": lambda step, off, bn, bk: step.shared_exact(off, bn, bk),
}
"""The shared ways, by name: the noise product (one member a block; antithetic pairs
sharing a block; pairs with the table in fp8, half the bytes, a different table) and the
exact perturbed product."""


def shared_row(step: Step, offsets: list[torch.Tensor], tile: str, repeats: int) -> dict:
    """Every shared way at one tile size; a way that fails (a tile Triton cannot build) is
    kept as its error."""
    bn, bk = _tile(tile)
    row: dict = {"tile": tile}
    for name, way in WAYS.items():
        try:
            row[f"{name}_s"] = graph_seconds(functools.partial(way, step, offsets, bn, bk), repeats)
        except Exception as exc:
            row[f"{name}_s"] = None
            row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return row


def _tile(tile: str) -> tuple[int, int]:
    """BN and BK of a tile named `BNxBK`."""
    bn, bk = (int(v) for v in tile.split("x"))
    return bn, bk


def describe(row: dict, separate_s: float) -> str:
    cells = []
    for name in WAYS:
        seconds = row[f"{name}_s"]
        cells.append(
            f"{name} failed"
            if seconds is None
            else f"{name} {1e3 * seconds:.2f} ms ({separate_s / seconds:.2f}x)"
        )
    return f"  spread {row['spread']:>9} tile {row['tile']}: " + "  ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="1b")
    parser.add_argument("--members", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=8, help="sequences of one member")
    parser.add_argument("--spreads", nargs="+", default=SPREADS)
    parser.add_argument("--tiles", nargs="+", default=["64x64", "128x64", "64x128"])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    step = Step.make(args.model, args.members, args.tokens)
    params = sum(n * k for n, k in step.shapes)
    result: dict = {
        "card": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "model": args.model,
        "linear_parameters": params,
        "members": args.members,
        "tokens_per_member": args.tokens,
        "read_all_weights_s": graph_seconds(step.read_all, args.repeats),
        "separate_copies_s": graph_seconds(step.separate, args.repeats),
        "unperturbed_gemm_s": graph_seconds(step.unperturbed, args.repeats),
        "separate_split_k_s": {
            tile: graph_seconds(
                functools.partial(step.separate_split_k, *_tile(tile)), args.repeats
            )
            for tile in args.tiles
        },
        "checks": check_kernels(args.tokens, min(args.members, 4), 64, 64),
        "rows": [],
    }
    # The baseline the shared ways are held against: the faster of cuBLAS and the split-K
    # product for today's separate copies, so that a shared way does not win against a slow
    # small-batch GEMM.
    separate_s = min(result["separate_copies_s"], *result["separate_split_k_s"].values())
    result["separate_best_s"] = separate_s
    print(
        f"{result['card']}, {args.model} ({params / 1e6:.0f}M linear parameters), "
        f"{args.members} members x {args.tokens} tokens, one decode step's linears:\n"
        f"  one read of all weights            {1e3 * result['read_all_weights_s']:8.3f} ms\n"
        f"  separate copies (today), cuBLAS    {1e3 * result['separate_copies_s']:8.3f} ms\n"
        f"  separate copies, split-K by tile   "
        + "  ".join(f"{t} {1e3 * v:.3f} ms" for t, v in result["separate_split_k_s"].items())
        + "\n"
        f"  unperturbed GEMM, all tokens       {1e3 * result['unperturbed_gemm_s']:8.3f} ms\n"
        f"  kernel checks: {result['checks']}",
        flush=True,
    )
    gen = torch.Generator(device="cpu").manual_seed(0)
    for spread in args.spreads:
        offsets = [
            member_offsets(spread, args.members, n * k, step.tables["bf16"].numel(), gen).cuda()
            for n, k in step.shapes
        ]
        for tile in args.tiles:
            row = {"spread": spread} | shared_row(step, offsets, tile, args.repeats)
            result["rows"].append(row)
            print(describe(row, separate_s), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
