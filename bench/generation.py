"""Plain batched generation on the CPU against the machine's limits, by thread count.

    .venv/bin/python bench/generation.py [--threads 1 2] [--batch 64 8] [--tokens 64]
                                         [--model DIR]

For each thread count, a fresh process (an engine's OpenMP threads are fixed when it starts)
starts one engine of the model with OMP_NUM_THREADS = that count and times, for each batch
size, one call of that many prompts, each held to `tokens` generated tokens (ignore_eos,
greedy), after a warm-up call. It also measures what bounds such a call on these threads
(bench/model_costs.py), for the call's prefill (every prompt token; the vocabulary projection
of each prompt's last one) and its decode steps (`batch` rows each):

- the model's linear layers alone: every one (q, k, v fused, and gate, up fused, as vLLM
  serves them, and the vocabulary projection) in bf16 with torch.nn.functional.linear, as ES
  Lab's CPU engine computes them, one layer after the other over all the weights, as a
  forward pass reads them: the engine cannot be faster with these kernels;
- the roofline: the FLOPs of the call (2 per multiply-add of every linear layer, plus
  attention over the mean context) at the best of torch's bf16 and fp32 products of 2048 x
  2048, or the weights read once a forward pass at the bytes/s of summing a 1 GiB fp32
  tensor, whichever takes longer: what the cores could do at best.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from model_costs import best_seconds, linear_seconds, linear_shapes, print_markdown_table

PROJECT = Path(__file__).resolve().parent.parent
PROMPTS = [f"Tell me something about the number {i}." for i in range(1000)]


def matmul_flops() -> float:
    """FLOP/s of the better of torch's bf16 and fp32 products of two 2048 x 2048 matrices."""
    import torch

    n = 2048
    rates = []
    for dtype in (torch.bfloat16, torch.float32):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        rates.append(2 * n**3 / best_seconds(lambda a=a, b=b: torch.mm(a, b)))
    return max(rates)


def read_bytes_per_second() -> float:
    """Bytes/s of summing a 1 GiB fp32 tensor (a read of every byte; a bf16 sum converts
    and is bound by that, not by memory)."""
    import torch

    x = torch.ones(2**28, dtype=torch.float32)
    return x.numel() * 4 / best_seconds(lambda: x.sum())


def limits(
    shapes: list[tuple[int, int]],
    config: dict,
    prompt_tokens: int,
    batch: int,
    tokens: int,
    flops: float,
    bandwidth: float,
) -> tuple[float, float]:
    """(seconds of the linear layers alone, roofline seconds) of one call: the prefill of
    every prompt token (the vocabulary projection of the last one of each prompt only),
    then `tokens` decode steps of `batch` rows."""
    trunk, vocab = shapes[:-1], shapes[-1:]
    linear_s = (
        linear_seconds(trunk, prompt_tokens)
        + linear_seconds(vocab, batch)
        + tokens * linear_seconds(shapes, batch)
    )
    trunk_flops = 2 * sum(r * c for r, c in trunk)
    vocab_flops = 2 * vocab[0][0] * vocab[0][1]
    context = prompt_tokens / batch + tokens / 2
    attention = 4 * config["num_hidden_layers"] * config["hidden_size"] * context
    total_flops = (prompt_tokens + batch * tokens) * (trunk_flops + attention) + batch * (
        tokens + 1
    ) * vocab_flops
    weight_bytes = 2 * sum(r * c for r, c in shapes)  # bf16, read once a forward pass
    roofline_s = max(total_flops / flops, (tokens + 1) * weight_bytes / bandwidth)
    return linear_s, roofline_s


def one_process(
    model: str, threads: int, batches: list[int], tokens: int
) -> dict[int, dict[str, float]]:
    """Runs in the child, with OMP_NUM_THREADS = threads: per batch size, its figures."""
    import torch

    torch.set_num_threads(threads)
    shapes, config = linear_shapes(model)
    flops, bandwidth = matmul_flops(), read_bytes_per_second()

    from vllm import SamplingParams

    from engine.backends.vllm.engine import VLLMEngine

    engine = VLLMEngine(model, max_model_len=1024)
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    timed = {}
    for batch in batches:
        requests = [
            {"prompt_token_ids": engine.prompt_token_ids([{"role": "user", "content": p}])}
            for p in PROMPTS[:batch]
        ]
        engine.llm.generate(requests, params, use_tqdm=False)  # warm-up
        engine.llm.reset_prefix_cache()
        start = time.perf_counter()
        engine.llm.generate(requests, params, use_tqdm=False)
        prompt_tokens = sum(len(r["prompt_token_ids"]) for r in requests)
        timed[batch] = (time.perf_counter() - start, prompt_tokens)
    engine.shutdown()
    results = {}
    for batch, (seconds, prompt_tokens) in timed.items():
        linear_s, roofline_s = limits(
            shapes, config, prompt_tokens, batch, tokens, flops, bandwidth
        )
        results[batch] = {
            "tokens/s": batch * tokens / seconds,
            "prompt tokens": prompt_tokens,
            "gemm limit": batch * tokens / linear_s,
            "roofline": batch * tokens / roofline_s,
            "GFLOP/s": flops / 1e9,
            "GB/s": bandwidth / 1e9,
        }
    return results


def main() -> None:
    from engine.backends.vllm.cpu.resources import cpu_model
    from engine.paths import default_model_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(default_model_dir()))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, len(os.sched_getaffinity(0))])
    parser.add_argument("--batch", type=int, nargs="+", default=[64, 8])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        result = one_process(args.model, args.child, args.batch, args.tokens)
        print("RESULT " + json.dumps(result), flush=True)
        return
    print("command: .venv/bin/python " + shlex.join(sys.argv), flush=True)
    print(f"cpu: {cpu_model()}, {len(os.sched_getaffinity(0))} cores usable", flush=True)
    print(f"{args.tokens} generated tokens a prompt, one call a batch", flush=True)
    header = [
        "threads",
        "prompts",
        "prompt tokens",
        "tokens/s",
        "per thread",
        "linear layers alone",
        "reached",
        "roofline",
        "reached",
    ]
    rows = []
    for threads in args.threads:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        env.pop("ESLAB_CPU_THREADS", None)
        out = subprocess.run(
            [sys.executable, __file__, *sys.argv[1:], "--child", str(threads)],
            cwd=PROJECT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        results = json.loads(next(x for x in out.splitlines() if x.startswith("RESULT "))[7:])
        for batch, r in results.items():
            print(
                f"{threads} threads, {batch} prompts: {r['tokens/s']:.0f} tokens/s "
                f"(matmul {r['GFLOP/s']:.0f} GFLOP/s, read {r['GB/s']:.1f} GB/s)",
                flush=True,
            )
            rows.append(
                [
                    str(threads),
                    batch,
                    f"{r['prompt tokens']}",
                    f"{r['tokens/s']:.0f}",
                    f"{r['tokens/s'] / threads:.0f}",
                    f"{r['gemm limit']:.0f}",
                    f"{r['tokens/s'] / r['gemm limit']:.2f}",
                    f"{r['roofline']:.0f}",
                    f"{r['tokens/s'] / r['roofline']:.2f}",
                ]
            )
    print_markdown_table(header, rows)


if __name__ == "__main__":
    main()
