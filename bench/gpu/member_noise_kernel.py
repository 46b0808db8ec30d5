"""Time the member-noise kernel of `perturbation: full_batched` on a model's layers, against
the card's copy bandwidth, for a grid of launch tiles: what the kernel's tiles should be.

No engine starts. The layers as vLLM serves them (q/k/v and gate/up fused) take their
shapes from the model's safetensors headers; every member's noise block sits at a random
offset of a noise table as an engine builds it (as long as the engine's, twice the largest
tensor or more; any alignment, as noise offsets are). A launch stages the inputs and then
runs the product (cuda/member_noise.py), and both are timed. One
pass is a decode step of `population` members with `tokens` tokens each (8 prompts a member:
8), antithetic pairs in neighbouring slots with --antithetic. Each tile setting is first
checked against the torch path (member_noise.add_noise_products) on the widest layer, then
each layer's launch is timed (median over --repeats after a warm-up, synchronized). Printed
per setting: microseconds a layer (and the rate it reads its noise at: the small layers
have few programs), the whole model's noise products of one pass (all layers), and the
noise read per second (each member's block once, a pair's once) against the bytes a copy of
1 GiB moves per second on the card (read and written).

    python3 bench/gpu/member_noise_kernel.py MODEL_DIR [--population 32] [--tokens 8]
        [--antithetic] [--tiles 64,64,4,3 128,128,8,3 ...] [--json FILE]

A tile setting is BLOCK_N,BLOCK_K,num_warps,num_stages. On a CPU it runs in Triton's
interpreter (TRITON_INTERPRET=1, fp32): a check that the script works, not a timing.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import torch
from triton.runtime.errors import OutOfResources

from engine import noise
from engine.backends.vllm import member_noise
from engine.backends.vllm.cuda import member_noise as cuda_noise

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
from weight_kernels import checkpoint_shapes, timed  # noqa: E402

from tests.unit.member_noise_checks import headers_of, token_mapping  # noqa: E402

FUSED = {
    "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "o": ("self_attn.o_proj",),
    "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "down": ("mlp.down_proj",),
}
"""vLLM's linear layers of a decoder layer and the checkpoint's modules each one holds."""

COPY_BYTES = 2**30
"""The copy that gives the card's memory rate: 1 GiB (a pass's noise may not fit twice)."""

DEFAULT_TILES = [
    f"{n},{k},{w},{s}" for n in (64, 128) for k in (64, 128, 256) for w in (4, 8) for s in (3, 4)
]


def layer_shapes(model: Path) -> tuple[dict[str, tuple[int, int]], int]:
    """({layer: (out, in)} of decoder layer 0 as vLLM fuses them, number of decoder layers)."""
    shapes = checkpoint_shapes(model)
    layers = {int(m[1]) for k in shapes if (m := re.match(r".*layers\.(\d+)\.", k))}
    fused = {}
    for name, modules in FUSED.items():
        found = [
            v for k, v in shapes.items() for m in modules if k.endswith(f"layers.0.{m}.weight")
        ]
        if len(found) == len(modules):
            fused[name] = (sum(s[0] for s in found), found[0][1])
    if not fused:
        raise SystemExit(f"{model}: no decoder layer's linear weights in its *.safetensors")
    return fused, len(layers)


def parse_tiles(text: str) -> dict[str, int]:
    n, k, warps, stages = (int(v) for v in text.split(","))
    return {"BLOCK_N": n, "BLOCK_K": k, "num_warps": warps, "num_stages": stages}


def copy_rate(size: int, dtype: torch.dtype, device: str) -> float:
    """TB/s that a copy of `size` bytes moves (what it reads and what it writes: the card's
    memory traffic, which the kernel's is almost all reads)."""
    source = torch.empty(size // dtype.itemsize, dtype=dtype, device=device)
    target = torch.empty_like(source)
    return 2 * size / timed(lambda _: target.copy_(source), 5) / 1e12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--population", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=8, help="tokens a member in the pass")
    parser.add_argument("--antithetic", action="store_true")
    parser.add_argument("--tiles", nargs="+", default=DEFAULT_TILES)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    on_gpu = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if on_gpu else ("cpu", torch.float32)
    shapes, layers = layer_shapes(args.model)
    generator = torch.Generator().manual_seed(0)
    # the engine's table: twice the largest tensor (the embedding) or more. Blocks of a table
    # only twice the largest layer overlapped, and their reads hit the L2 cache.
    table_len = noise.noise_table_len(
        max(math.prod(s) for s in checkpoint_shapes(args.model).values())
    )
    table = noise.build_noise_table(table_len + noise.TABLE_SLACK, dtype=dtype, device=device)
    table = table[:table_len]
    member_noise._tables[table.data_ptr()] = table
    blocks = args.population // 2 if args.antithetic else args.population
    owner = [m // 2 if args.antithetic else m for m in range(args.population)]
    scales = [0.001 * (-1) ** m if args.antithetic else 0.001 for m in range(args.population)]
    indices = torch.tensor([m for m in range(args.population) for _ in range(args.tokens)])
    meta = token_mapping(indices, device, slots=args.population)
    keys = ("token_slots", "sorted_tokens", "tokens_per_lora", "token_start", "lora_ids")
    mapping = [meta[k] for k in keys]
    flags = meta["no_lora_flag_cpu"], meta["num_active_loras"]
    passes = {}
    for name, (out, inputs) in shapes.items():
        starts = torch.randint(0, table_len - out * inputs + 1, (blocks,), generator=generator)
        offsets = [int(starts[b]) for b in owner]
        x = torch.randn(len(indices), inputs, generator=generator).to(dtype).to(device)
        y = torch.zeros(len(indices), out, dtype=dtype, device=device)
        passes[name] = (x, y, headers_of(offsets, scales, table, dtype, inputs), out)
    layer_bytes = {n: blocks * o * i * table.element_size() for n, (o, i) in shapes.items()}
    stage_us = {}
    for name, (x, _, headers, _) in passes.items():
        words = member_noise.header_views(headers)[0]
        stage_us[name] = 1e6 * timed(
            lambda _, x=x, w=words: cuda_noise.stage_inputs(x, w, mapping[0]), args.repeats
        )
    print(
        "staging the inputs (in each launch below): "
        + ", ".join(f"{n} {us:.1f} us" for n, us in stage_us.items())
    )
    noise_bytes = layers * sum(layer_bytes.values())
    copy_tb_per_s = copy_rate(min(noise_bytes, COPY_BYTES), dtype, device)
    print(
        f"{args.model.name}: {layers} layers {shapes}, population {args.population} x "
        f"{args.tokens} tokens{', antithetic' if args.antithetic else ''}; one pass reads "
        f"{noise_bytes / 1e9:.2f} GB of noise; a copy moves {copy_tb_per_s:.2f} TB/s"
    )
    widest = max(shapes, key=lambda n: shapes[n][0] * shapes[n][1])
    results = {
        "card": torch.cuda.get_device_name(0) if on_gpu else "cpu (interpreter)",
        "model": str(args.model),
        "shapes": shapes,
        "layers": layers,
        "population": args.population,
        "tokens": args.tokens,
        "antithetic": args.antithetic,
        "noise_bytes": noise_bytes,
        "copy_tb_per_s": copy_tb_per_s,
        "stage_us": stage_us,
        "tiles": [],
    }
    x, y, headers, out = passes[widest]
    before = y.clone()  # the timed launches below add to y
    expected = before.clone()
    member_noise.add_noise_products(indices.to(device), expected, x, headers, out)
    for text in args.tiles:
        tiles = parse_tiles(text)
        got = before.clone()
        try:
            cuda_noise.launch(got, x, headers, out, mapping, *flags, tiles)
        except OutOfResources as error:  # tiles whose pipeline stages outgrow shared memory
            print(f"tiles {text}: {error}")
            results["tiles"].append({"tiles": text, "failed": str(error)})
            continue
        error = float((got.float() - expected.float()).abs().max() / expected.float().abs().max())
        layer_us = {
            name: 1e6
            * timed(
                lambda _, p=p, t=tiles: cuda_noise.launch(
                    p[1], p[0], p[2], p[3], mapping, *flags, t
                ),
                args.repeats,
            )
            for name, p in passes.items()
        }
        pass_ms = layers * sum(layer_us.values()) / 1e3
        layer_tb_per_s = {n: layer_bytes[n] / (us / 1e6) / 1e12 for n, us in layer_us.items()}
        row = {
            "tiles": text,
            "error": error,
            "layer_us": layer_us,
            "layer_tb_per_s": layer_tb_per_s,
            "pass_ms": pass_ms,
            "noise_tb_per_s": noise_bytes / (pass_ms / 1e3) / 1e12,
        }
        results["tiles"].append(row)
        print(
            f"tiles {text}: error {error:.1e}; "
            + ", ".join(
                f"{n} {us:.0f} us ({layer_tb_per_s[n]:.2f} TB/s)" for n, us in layer_us.items()
            )
            + f"; a pass {pass_ms:.2f} ms, noise read at {row['noise_tb_per_s']:.2f} TB/s "
            + f"({row['noise_tb_per_s'] / copy_tb_per_s:.0%} of the copy's)"
        )
    best = min((r for r in results["tiles"] if "pass_ms" in r), key=lambda r: r["pass_ms"])
    print(f"fastest: tiles {best['tiles']}, a pass {best['pass_ms']:.2f} ms")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
