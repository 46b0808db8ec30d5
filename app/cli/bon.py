"""`eslab bon`: best-of-n evaluation, proxy against gold score as n grows (engine/best_of_n):
of a checkpoint's sampled answers, or of pre-labelled gold generations (`--gold-gens`, the
ensembles paper's setup), with one reward model, a run's ensemble, or per-seed reward-model
folders (`--proxy-models`) scored once for every member, ensemble rule and UWO weight."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.cli.common import checkpoint_of, reward_spec
from engine.config import ConfigError, FieldError

if TYPE_CHECKING:
    import numpy as np

    from engine.backends.base import Completion
    from engine.best_of_n.evaluation import ProxyMembers
    from engine.prompts import Prompt


def add_commands(commands: argparse._SubParsersAction) -> None:
    from scorer.models import DEFAULT_MAX_LENGTH, INPUT_FORMATS

    bon = commands.add_parser("bon", help="best-of-n evaluation: proxy vs gold score as n grows")
    bon.add_argument(
        "run",
        nargs="?",
        help="run id or uuid (prefix; its latest checkpoint), or a checkpoint-STEP folder, "
        "whose answers are sampled (leave out with --gold-gens)",
    )
    bon.add_argument(
        "--gold",
        type=reward_spec,
        help="gold reward of sampled answers (needed with RUN): a reward function dotted "
        "path, `scorer` (the run's scorer_url) or a scorer URL",
    )
    bon.add_argument(
        "--gold-gens",
        metavar="FILE",
        help="instead of sampling, the answers of a gold-labelled file in the layout of "
        "tlc4418/llm_optimization's gold_labelled_gens (.parquet, .jsonl or .json rows of "
        "instruction, input, answers, gold_scores)",
    )
    bon.add_argument(
        "--proxy",
        type=reward_specs,
        help="proxy reward: a reward function dotted path, `scorer` or a scorer URL, or "
        "several comma-separated as an ensemble (one scorer service per seed's reward "
        "model); default: the run's own reward",
    )
    bon.add_argument(
        "--proxy-models",
        metavar="FOLDERS",
        help="proxy reward models scored in this process, as an ensemble: comma-separated "
        "Hugging Face folders, or one pattern with {seed} filled by --seeds "
        "(models/rm_seed{seed})",
    )
    bon.add_argument("--seeds", help="comma-separated seeds for the {seed} of --proxy-models")
    bon.add_argument(
        "--uwo-weights",
        help="comma-separated UWO variance weights, each its own curve of the one scoring "
        "(default: the run's uwo_weight, for an ensemble)",
    )
    bon.add_argument(
        "--input-format",
        choices=INPUT_FORMATS,
        default="pair",
        help="what --proxy-models read, as `eslab scorer serve --input-format` (prompter "
        "for the ensembles paper's Open-Assistant reward models)",
    )
    bon.add_argument(
        "--max-length",
        type=int,
        default=DEFAULT_MAX_LENGTH,
        help="tokens per pair for --proxy-models (truncated)",
    )
    bon.add_argument("--n", default="1,2,4,8", help="comma-separated n values")
    bon.add_argument(
        "--samples",
        type=int,
        help="answers per prompt N (default: the largest n; with --gold-gens, every row's "
        "first N, default all)",
    )
    bon.add_argument("--prompts", type=int, default=16, help="prompts of the eval set")
    bon.add_argument(
        "--out",
        help="JSON [{n, proxy_score, gold_score}], or {curve: that} for an ensemble "
        "(default CHECKPOINT/bon.json, or FILE's name with .bon.json)",
    )
    bon.set_defaults(func=cmd_bon)


def reward_specs(text: str) -> str:
    """argparse type of --proxy: comma-separated rewards, each checked as reward_spec."""
    for spec in text.split(","):
        reward_spec(spec.strip())
    return text


def _numbers(text: str, option: str, kind: type[int] | type[float]) -> list[Any]:
    """`--n 1,2,4` or `--uwo-weights 0.1,0.5` as numbers; ConfigError naming the option."""
    try:
        return [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        flag = f"--{option.replace('_', '-')}"
        message = f"{flag} must be comma-separated {kind.__name__}s, got {text!r}"
        raise ConfigError([FieldError(option, message)]) from None


def _check_mode(args: argparse.Namespace) -> None:
    """Exactly one source of answers, and the options that go with it."""
    problems = []
    if (args.run is None) == (args.gold_gens is None):
        problems.append(FieldError("run", "give either RUN (sample answers) or --gold-gens FILE"))
    if args.run is not None and args.gold is None:
        problems.append(FieldError("gold", "--gold is needed to score sampled answers"))
    if args.gold_gens is not None and args.gold is not None:
        problems.append(FieldError("gold", "--gold-gens carries its gold scores: leave out --gold"))
    if args.gold is not None and "," in args.gold:
        problems.append(FieldError("gold", f"--gold names one reward, got {args.gold!r}"))
    if args.proxy is not None and args.proxy_models is not None:
        problems.append(FieldError("proxy", "give --proxy or --proxy-models, not both"))
    if args.gold_gens is not None and args.proxy is None and args.proxy_models is None:
        problems.append(FieldError("proxy", "--gold-gens needs a proxy: --proxy-models or --proxy"))
    if args.seeds is not None and args.proxy_models is None:
        problems.append(FieldError("seeds", "--seeds goes with --proxy-models"))
    if problems:
        raise ConfigError(problems)


def cmd_bon(args: argparse.Namespace) -> int:
    from engine.best_of_n.evaluation import (
        RUN_PROXY,
        evaluate_best_of_n,
        evaluate_gold_generations,
        source_members,
        spec_source,
        write_curves,
    )

    _check_mode(args)
    ns = sorted(set(_numbers(args.n, "n", int)))
    weights = None if args.uwo_weights is None else _numbers(args.uwo_weights, "uwo_weights", float)
    members = _folder_members(args) if args.proxy_models is not None else None
    if args.gold_gens is not None:
        path = Path(args.gold_gens)
        curves = evaluate_gold_generations(
            path,
            ns,
            members or source_members(spec_source(args.proxy)),
            uwo_weights=weights,
            samples=args.samples,
        )
        default_out = path.with_name(f"{path.stem}.bon.json")
    else:
        checkpoint = checkpoint_of(args.run)
        curves = evaluate_best_of_n(
            checkpoint,
            args.gold,
            ns,
            proxy=args.proxy or RUN_PROXY,
            proxy_members=members,
            uwo_weights=weights,
            samples=args.samples,
            max_prompts=args.prompts,
        )
        default_out = checkpoint / "bon.json"
    out = write_curves(curves, Path(args.out) if args.out else default_out)
    for key, points in curves.items():
        print(key)
        print(f"{'n':>6} {'proxy':>10} {'gold':>10}")
        for p in points:
            print(f"{p.n:>6} {p.proxy_score:>10.4f} {p.gold_score:>10.4f}")
    print(f"best-of-n results in {out}")
    return 0


def _folder_members(args: argparse.Namespace) -> ProxyMembers:
    """--proxy-models as ProxyMembers: every folder checked now, each model loaded in turn
    when the answers are scored (scorer/folders.py)."""
    from engine.best_of_n.evaluation import ProxyMembers
    from engine.best_of_n.reward_models import parse_seeds, reward_model_folders
    from engine.prompts import user_text
    from scorer.folders import score_with_folders

    folders = reward_model_folders(args.proxy_models, parse_seeds(args.seeds))

    def score(
        prompts: list[Prompt], outputs: list[list[Completion]], _: list[dict[str, Any]]
    ) -> dict[str, np.ndarray]:
        return score_with_folders(
            folders,
            [user_text(p) for p in prompts],
            [[c.text for c in cs] for cs in outputs],
            input_format=args.input_format,
            max_length=args.max_length,
        )

    return ProxyMembers(tuple(folders), score)
