"""`eslab kl`: the KL of a checkpoint's sampled answers to its base model, per token, as the
ES paper's conciseness table reports it (engine/alignment/kl.py)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_commands(commands: argparse._SubParsersAction) -> None:
    kl = commands.add_parser(
        "kl", help="mean per-token KL of a checkpoint's sampled answers to its base model"
    )
    kl.add_argument(
        "run", help="run id or uuid (prefix; its latest checkpoint), or a checkpoint-STEP folder"
    )
    kl.add_argument("--base", help="base model folder or hub name (default: the run's model)")
    kl.add_argument("--samples", type=int, default=20, help="answers per prompt (default 20)")
    kl.add_argument("--max-new-tokens", type=int, default=128, help="tokens per answer")
    kl.add_argument(
        "--temperature",
        type=float,
        help="sampling temperature (default: the model's generation config, as the reference)",
    )
    kl.add_argument("--prompts", type=int, help="first N prompts of the eval set (default all)")
    kl.add_argument("--seed", type=int, help="seed of the sampling")
    kl.add_argument("--out", help="JSON result (default CHECKPOINT/kl.json)")
    kl.set_defaults(func=cmd_kl)


def cmd_kl(args: argparse.Namespace) -> int:
    from app.cli.common import checkpoint_of
    from engine.alignment.kl import KLSettings, kl_to_base, write_result
    from engine.best_of_n.evaluation import checkpoint_config
    from engine.data.datasets import load_dataset
    from engine.paths import resolve_path

    checkpoint = checkpoint_of(args.run)
    config = checkpoint_config(checkpoint)
    data_file = config.data.eval_file or config.data.train_file
    examples = load_dataset(resolve_path(data_file))[: args.prompts]
    base = args.base or config.model.model
    local = resolve_path(base)
    result = kl_to_base(
        checkpoint,
        local if local.exists() else base,
        [e.prompt for e in examples],
        KLSettings(
            samples=args.samples,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            seed=args.seed,
        ),
        dtype=config.model.dtype,
    )
    out = write_result(result, Path(args.out) if args.out else checkpoint / "kl.json")
    print(
        f"KL to {base}: {result.mean_per_token:.6f} per token over {result.total_tokens} "
        f"tokens of {len(result.per_sample_mean)} answers; result in {out}"
    )
    return 0
