"""`eslab kl` and `eslab robustness`: the ES paper's conciseness table and robustness sweep.

`eslab kl` gives a checkpoint's KL to its base model per token and, when the eval set has
conciseness targets, the reward column of the same sampled answers (engine/alignment/kl.py);
`eslab robustness` perturbs the checkpoint and measures both again
(engine/alignment/robustness.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

RUN_HELP = "run id or uuid (prefix; its latest checkpoint), or a checkpoint-STEP folder"


def add_commands(commands: argparse._SubParsersAction) -> None:
    kl = commands.add_parser(
        "kl",
        help="mean per-token KL of a checkpoint's sampled answers to its base model, and "
        "their conciseness reward",
    )
    kl.add_argument("run", help=RUN_HELP)
    kl.add_argument("--base", help="base model folder or hub name (default: the run's model)")
    _sampling_options(kl)
    kl.add_argument("--out", help="JSON result (default CHECKPOINT/kl.json)")
    kl.set_defaults(func=cmd_kl)

    robust = commands.add_parser(
        "robustness",
        help="conciseness reward and KL of a checkpoint under Gaussian weight noise "
        "(the ES paper's robustness sweep)",
    )
    robust.add_argument("run", help=RUN_HELP)
    robust.add_argument("--sigma", type=float, nargs="+", required=True, help="noise std(s)")
    robust.add_argument(
        "--kind",
        nargs="+",
        default=["lm_head.weight", "all"],
        help="what to perturb: lm_head.weight and/or all (default both)",
    )
    robust.add_argument("--trials", type=int, default=8, help="trials per sigma and kind (8)")
    _sampling_options(robust, seed=0)
    robust.add_argument("--out", help="JSON result (default CHECKPOINT/robustness.json)")
    robust.set_defaults(func=cmd_robustness)


def _sampling_options(parser: argparse.ArgumentParser, seed: int | None = None) -> None:
    parser.add_argument("--samples", type=int, default=20, help="answers per prompt (default 20)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens per answer")
    parser.add_argument(
        "--temperature",
        type=float,
        help="sampling temperature (default: the model's generation config, as the reference)",
    )
    parser.add_argument("--prompts", type=int, help="first N prompts of the eval set (default all)")
    parser.add_argument("--seed", type=int, default=seed, help="seed of the sampling")


def _settings(args: argparse.Namespace) -> Any:
    from engine.alignment.kl import KLSettings

    return KLSettings(
        samples=args.samples,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        seed=args.seed,
    )


def _eval_set(args: argparse.Namespace) -> tuple[Path, Any, list, list[str] | None]:
    """The checkpoint, its configuration, the eval set's prompts and their conciseness
    targets (None unless every example has one)."""
    from app.cli.common import checkpoint_of
    from engine.best_of_n.evaluation import checkpoint_config
    from engine.data.datasets import load_dataset
    from engine.paths import resolve_path

    checkpoint = checkpoint_of(args.run)
    config = checkpoint_config(checkpoint)
    data_file = config.data.eval_file or config.data.train_file
    examples = load_dataset(resolve_path(data_file))[: args.prompts]
    targets = [e.reward_func_args.get("target") for e in examples]
    has_targets = all(isinstance(t, str) for t in targets)
    return checkpoint, config, [e.prompt for e in examples], targets if has_targets else None


def _write(result: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.to_json(), indent=2))
    return path


def cmd_kl(args: argparse.Namespace) -> int:
    from engine.alignment.kl import kl_to_base
    from engine.paths import resolve_path

    checkpoint, config, prompts, targets = _eval_set(args)
    base = args.base or config.model.model
    local = resolve_path(base)
    result = kl_to_base(
        checkpoint,
        local if local.exists() else base,
        prompts,
        _settings(args),
        targets=targets,
        dtype=config.model.dtype,
    )
    out = _write(result, Path(args.out) if args.out else checkpoint / "kl.json")
    print(
        f"KL to {base}: {result.mean_per_token:.6f} per token over {result.total_tokens} "
        f"tokens of {len(result.per_sample_mean)} answers; result in {out}"
    )
    if result.reward is not None:
        r = result.reward
        print(
            f"conciseness reward: {r.mean:.2f} +/- {r.std:.2f} over {r.answers} answers, "
            f"normalized {r.normalized_mean:.4f} +/- {r.normalized_std:.4f}"
        )
    return 0


def cmd_robustness(args: argparse.Namespace) -> int:
    from engine.alignment.robustness import robustness_sweep
    from engine.model_files import ModelError

    checkpoint, config, prompts, targets = _eval_set(args)
    if targets is None:
        raise ModelError(
            f"the eval set of {checkpoint} has no conciseness targets (reward_func_args "
            "target): the robustness sweep measures the conciseness reward"
        )
    sweep = robustness_sweep(
        checkpoint,
        prompts,
        targets,
        args.sigma,
        kinds=args.kind,
        trials=args.trials,
        settings=_settings(args),
        dtype=config.model.dtype,
    )
    out = _write(sweep, Path(args.out) if args.out else checkpoint / "robustness.json")
    worst = max(sweep.trials, key=lambda t: t.normalized_reward_degradation)
    drop = worst.normalized_reward_degradation
    print(
        f"robustness: {len(sweep.trials)} trials; unperturbed normalized reward "
        f"{sweep.baseline.normalized_mean:.4f}, largest drop {drop:.4f} "
        f"(sigma {worst.sigma:g}, {worst.kind}); result in {out}"
    )
    return 0
