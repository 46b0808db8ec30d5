"""`eslab scorer serve | train-default`: the alignment reward/cost scorer service (the
top-level scorer package), which alignment runs reach over HTTP."""

from __future__ import annotations

import argparse
from pathlib import Path

from app.cli.common import port


def add_commands(commands: argparse._SubParsersAction) -> None:
    from scorer.default import default_scorer_dir
    from scorer.models import DEFAULT_MAX_LENGTH, INPUT_FORMATS

    scorer = commands.add_parser("scorer", help="the alignment reward/cost scorer service")
    scorer_cmds = scorer.add_subparsers(dest="scorer_command", required=True, metavar="ACTION")
    serve = scorer_cmds.add_parser(
        "serve",
        help="serve GET /health, POST /score_batch and /score {prompts, responses}, "
        "POST /score_texts {texts}",
    )
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind: 127.0.0.1 (default) is this machine only; any other address "
        "needs a token in ESLAB_SCORER_TOKEN (the runs send it from their environment)",
    )
    serve.add_argument("--port", type=port, default=8000)
    serve.add_argument(
        "--reward-model",
        default=str(default_scorer_dir() / "reward"),
        help="Hugging Face sequence-classification folder (default: the "
        "`train-default` reward model)",
    )
    serve.add_argument(
        "--cost-model",
        default=str(default_scorer_dir() / "cost"),
        help="Hugging Face sequence-classification folder; cost > 0 is unsafe",
    )
    serve.add_argument("--batch-size", type=int, default=32, help="pairs per forward pass")
    serve.add_argument(
        "--max-length", type=int, default=DEFAULT_MAX_LENGTH, help="tokens per pair (truncated)"
    )
    serve.add_argument(
        "--input-format",
        choices=INPUT_FORMATS,
        default="pair",
        help="what the models read: prompt and response as two segments (pair, the "
        "train-default models), or one text 'BEGINNING OF CONVERSATION: USER: {prompt} "
        "ASSISTANT:{response}' + EOS (conversation, Safe-RLHF-style models), or "
        "'<|prompter|>{prompt}<|endoftext|><|assistant|>{response}<|endoftext|>' (prompter, "
        "Open-Assistant reward models such as the ensembles paper's)",
    )
    serve.set_defaults(func=cmd_scorer_serve)
    train = scorer_cmds.add_parser(
        "train-default", help="fine-tune the offline MiniLM reward and cost models (CPU)"
    )
    train.add_argument("--epochs", type=int, default=3)
    train.add_argument(
        "--out", help=f"folder for reward/ and cost/ (default {default_scorer_dir()})"
    )
    train.set_defaults(func=cmd_scorer_train_default)


def cmd_scorer_serve(args: argparse.Namespace) -> int:
    """Serve until interrupted; a non-loopback --host without ESLAB_SCORER_TOKEN is refused
    before any model loads."""
    import os

    from app.cli.common import print_error
    from engine.scoring.client import TOKEN_ENV
    from scorer.service import ScorerServiceError, serve

    try:
        serve(
            args.reward_model,
            args.cost_model,
            host=args.host,
            port=args.port,
            batch_size=args.batch_size,
            max_length=args.max_length,
            input_format=args.input_format,
            token=os.environ.get(TOKEN_ENV, "").strip() or None,
        )
    except ScorerServiceError as exc:
        print_error(str(exc))
        return 2
    return 0


def cmd_scorer_train_default(args: argparse.Namespace) -> int:
    from scorer.default import train_default_scorers

    train_default_scorers(Path(args.out) if args.out else None, epochs=args.epochs)
    return 0
