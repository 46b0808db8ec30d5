"""`eslab bon`: best-of-n evaluation of a checkpoint, proxy against gold score as n grows
(engine/best_of_n)."""

from __future__ import annotations

import argparse
from pathlib import Path

from app.cli.common import checkpoint_of, reward_spec
from engine.config import ConfigError, FieldError


def add_commands(commands: argparse._SubParsersAction) -> None:
    bon = commands.add_parser(
        "bon", help="best-of-n evaluation of a checkpoint: proxy vs gold score as n grows"
    )
    bon.add_argument(
        "run", help="run id or uuid (prefix; its latest checkpoint), or a checkpoint-STEP folder"
    )
    bon.add_argument(
        "--gold",
        required=True,
        type=reward_spec,
        help="gold reward: a reward function dotted "
        "path, `scorer` (the run's scorer_url) or a scorer URL",
    )
    bon.add_argument(
        "--proxy", default="run", type=reward_spec, help="proxy reward (default: the run's own)"
    )
    bon.add_argument("--n", default="1,2,4,8", help="comma-separated n values")
    bon.add_argument("--samples", type=int, help="answers per prompt N (default: largest n)")
    bon.add_argument("--prompts", type=int, default=16, help="prompts of the eval set")
    bon.add_argument(
        "--out", help="JSON [{n, proxy_score, gold_score}] (default CHECKPOINT/bon.json)"
    )
    bon.set_defaults(func=cmd_bon)


def cmd_bon(args: argparse.Namespace) -> int:
    from engine.best_of_n.evaluation import evaluate_best_of_n, write_points

    try:
        ns = sorted({int(n) for n in args.n.split(",")})
    except ValueError:
        raise ConfigError(
            [FieldError("n", f"--n must be comma-separated integers, got {args.n!r}")]
        ) from None
    checkpoint = checkpoint_of(args.run)
    points = evaluate_best_of_n(
        checkpoint, args.gold, ns, proxy=args.proxy, samples=args.samples, max_prompts=args.prompts
    )
    out = write_points(points, Path(args.out) if args.out else checkpoint / "bon.json")
    print(f"{'n':>6} {'proxy':>10} {'gold':>10}")
    for p in points:
        print(f"{p.n:>6} {p.proxy_score:>10.4f} {p.gold_score:>10.4f}")
    print(f"best-of-n results in {out}")
    return 0
