"""`eslab data countdown | gsm8k | math | conciseness`: generate or convert datasets;
`eslab data clean-uploads`: remove dashboard uploads that no run uses. `generate` runs a
generating command line in-process (the New run form's button for a preset's data)."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.data.datasets import WriteResult

COUNTDOWN_FORMATS = ("lbes", "es-at-scale")
OUT_HELP = " (named as a run configuration names it: data/... is in the data folder)"


def config_out(text: str) -> str:
    """argparse type of `--out`: resolved as a run configuration's path is (engine.paths), so
    the data lands where a configuration naming it looks, from any working folder."""
    from engine.paths import resolve_path

    return str(resolve_path(text))


REFERENCE_DATA = (
    "countdown and gsm8k write ES Lab's own prompts, not the references' texts. To train on "
    "a reference's exact data, use its own files: nlp-waseda/lbes's shipped "
    "data/countdown3 and data/gsm8k train.parquet and test.parquet load as they are (name them "
    "as train_file and eval_file), and ES at Scale's archive/countdown/data/countdown.json "
    "converts with its own prompts and splits: eslab data countdown --format es-at-scale "
    "--input FILE. ES at Scale's math DatasetDict folders convert with eslab data math, its "
    "prompt text read from your copy of its template file (--template)."
)


def add_commands(commands: argparse._SubParsersAction) -> None:
    data = commands.add_parser(
        "data", help="generate or convert datasets", description=REFERENCE_DATA
    )
    data_cmds = data.add_subparsers(dest="data_command", required=True, metavar="DATASET")
    countdown = data_cmds.add_parser(
        "countdown",
        help="seeded, always-solvable countdown splits with ES Lab's own prompts, or ES at "
        "Scale's own countdown.json converted (--input); nlp-waseda/lbes's shipped parquet "
        "files are its faithful data and load as they are",
        description=REFERENCE_DATA,
    )
    countdown.add_argument(
        "--format",
        choices=COUNTDOWN_FORMATS,
        default="lbes",
        help="lbes: chat prompts in nlp-waseda/lbes's form, 8192/1024 puzzles; es-at-scale: "
        "raw prompts ending in <think> (prompt_format: raw), 200/2000 puzzles of 3 or 4 "
        "numbers, also as its countdown.json layout",
    )
    countdown.add_argument(
        "--input",
        help="es-at-scale only: your copy of ES at Scale's "
        "archive/countdown/data/countdown.json (2200 puzzles), converted instead of "
        "generating: its first 200 train and its last 2000 test, with its own prompts",
    )
    countdown.add_argument(
        "--n-given-numbers",
        type=int,
        choices=(3, 4),
        help="numbers per puzzle (required for lbes; es-at-scale mixes 3 and 4 unless given)",
    )
    countdown.add_argument(
        "--out", required=True, type=config_out, help="folder for train/test.parquet" + OUT_HELP
    )
    countdown.add_argument("--n-train", type=int, help="lbes: 8192, es-at-scale: 200")
    countdown.add_argument("--n-test", type=int, help="lbes: 1024, es-at-scale: 2000")
    countdown.add_argument("--seed", type=int, help="of generated puzzles (default 42)")
    countdown.set_defaults(func=cmd_data_countdown)
    gsm8k = data_cmds.add_parser(
        "gsm8k",
        help="convert a local GSM8K .jsonl file, with ES Lab's own system prompt; "
        "nlp-waseda/lbes's shipped data/gsm8k parquet files are its faithful data and load "
        "as they are",
        description=REFERENCE_DATA,
    )
    gsm8k.add_argument("--input", required=True, help="GSM8K jsonl: question, answer ... #### N")
    gsm8k.add_argument("--out", required=True, type=config_out, help="parquet file" + OUT_HELP)
    gsm8k.set_defaults(func=cmd_data_gsm8k)
    math = data_cmds.add_parser(
        "math",
        help="convert ES at Scale's math DatasetDict folders (load_from_disk layout, rows "
        "problem/answer): each evaluation split to eval/<split>.parquet for eval_sets, the "
        "training set to train.parquet; raw ChatML prompts graded by math_boxed",
        description=REFERENCE_DATA,
    )
    math.add_argument(
        "--input",
        required=True,
        help="the evaluation DatasetDict folder (holding dataset_dict.json), e.g. ES at "
        "Scale's datasets/evaluation_suite/math",
    )
    math.add_argument(
        "--train", help="the training DatasetDict folder, e.g. datasets/train/math_lvl3to5_8k"
    )
    math.add_argument(
        "--template",
        help="your copy of ES at Scale's template_function/apply_template.py: its "
        "qwen_math_template's prompt text is used (read, not run); ES Lab's own without it",
    )
    math.add_argument(
        "--out", required=True, type=config_out, help="folder for the parquet files" + OUT_HELP
    )
    math.set_defaults(func=cmd_data_math)
    safe = data_cmds.add_parser(
        "safe-rlhf",
        help="convert the alignment fork's prompt file (custom_train_250.jsonl, ...)",
    )
    safe.add_argument("--input", required=True, help='JSON lines with a "prompt" each')
    safe.add_argument("--out", required=True, type=config_out, help="parquet file" + OUT_HELP)
    safe.add_argument(
        "--form",
        choices=("chat", "conversation"),
        default="chat",
        help="chat: the user's message (chat template); conversation: the fork's raw "
        "'BEGINNING OF CONVERSATION: USER: ... ASSISTANT:' (set prompt_format: raw)",
    )
    safe.set_defaults(func=cmd_data_safe_rlhf)
    concise = data_cmds.add_parser(
        "conciseness",
        help="write the shipped conciseness dataset, or convert the ES paper's own pairs",
    )
    concise.add_argument(
        "--input",
        help="the paper's {question, answer} JSON lines (its conciseness/data/train.jsonl "
        "or eval.jsonl): written as raw prompts to the parquet file --out",
    )
    concise.add_argument(
        "--out",
        required=True,
        type=config_out,
        help="folder for train/test.parquet, or with --input a parquet file" + OUT_HELP,
    )
    concise.set_defaults(func=cmd_data_conciseness)
    clean = data_cmds.add_parser(
        "clean-uploads",
        help="remove uploaded datasets no run uses, older than ESLAB_UPLOAD_KEEP_HOURS",
    )
    clean.add_argument("--dry-run", action="store_true", help="list them, remove nothing")
    clean.set_defaults(func=cmd_data_clean_uploads)


def cmd_data_countdown(args: argparse.Namespace) -> int:
    print(countdown_data(args).summary)
    return 0


def countdown_data(args: argparse.Namespace) -> WriteResult:
    from engine.data import countdown, countdown_es_at_scale
    from engine.data.datasets import DatasetError

    if args.input is not None:
        return _converted_countdown(args)
    if args.format == "es-at-scale":
        return countdown_es_at_scale.generate_countdown_es_at_scale(
            args.out,
            n_train=_given(args.n_train, countdown_es_at_scale.DEFAULT_N_TRAIN),
            n_test=_given(args.n_test, countdown_es_at_scale.DEFAULT_N_TEST),
            seed=_given(args.seed, countdown_es_at_scale.DEFAULT_SEED),
            n_given_numbers=args.n_given_numbers,
        )
    elif args.n_given_numbers is None:
        raise DatasetError(
            "eslab data countdown --format lbes needs --n-given-numbers 3 or 4 "
            "(--format es-at-scale mixes them)"
        )
    return countdown.generate_countdown(
        args.n_given_numbers,
        args.out,
        n_train=_given(args.n_train, countdown.DEFAULT_N_TRAIN),
        n_test=_given(args.n_test, countdown.DEFAULT_N_TEST),
        seed=_given(args.seed, countdown.DEFAULT_SEED),
    )


def _converted_countdown(args: argparse.Namespace) -> WriteResult:
    """`--input FILE`: ES at Scale's own file, whose puzzles are given, not drawn."""
    from engine.data import countdown_es_at_scale
    from engine.data.countdown_es_at_scale_file import convert_countdown_es_at_scale
    from engine.data.datasets import DatasetError

    if args.format != "es-at-scale":
        raise DatasetError(
            "eslab data countdown --input reads ES at Scale's countdown.json: give --format "
            "es-at-scale (nlp-waseda/lbes's own parquet files need no conversion: name them as "
            "train_file and eval_file)"
        )
    drawn = [name for name in ("n_given_numbers", "seed") if getattr(args, name) is not None]
    if drawn:
        options = ", ".join("--" + name.replace("_", "-") for name in drawn)
        raise DatasetError(
            f"{options} only apply to generated puzzles; --input converts the file's as they are"
        )
    return convert_countdown_es_at_scale(
        args.input,
        args.out,
        n_train=_given(args.n_train, countdown_es_at_scale.DEFAULT_N_TRAIN),
        n_test=_given(args.n_test, countdown_es_at_scale.DEFAULT_N_TEST),
    )


def _given(value: int | None, default: int) -> int:
    return default if value is None else value


def cmd_data_gsm8k(args: argparse.Namespace) -> int:
    from engine.data.gsm8k import convert_gsm8k

    print(convert_gsm8k(args.input, args.out).summary)
    return 0


def cmd_data_math(args: argparse.Namespace) -> int:
    from engine.data.math_es_at_scale import convert_math_es_at_scale

    result = convert_math_es_at_scale(
        args.input, args.out, train_dir=args.train, template_file=args.template
    )
    print(result.summary)
    return 0


def cmd_data_safe_rlhf(args: argparse.Namespace) -> int:
    from engine.data.safe_rlhf import convert_safe_rlhf

    print(convert_safe_rlhf(args.input, args.out, args.form).summary)
    return 0


def cmd_data_conciseness(args: argparse.Namespace) -> int:
    print(conciseness_data(args).summary)
    return 0


def conciseness_data(args: argparse.Namespace) -> WriteResult:
    from engine.data.conciseness import convert_conciseness_pairs, write_conciseness

    if getattr(args, "input", None):
        return convert_conciseness_pairs(args.input, args.out)
    return write_conciseness(args.out)


# The `eslab data` commands that write datasets from nothing, as `generate` may run them.
GENERATORS: dict[str, Callable[[argparse.Namespace], WriteResult]] = {
    "countdown": countdown_data,
    "conciseness": conciseness_data,
}


def generate(command: str) -> WriteResult:
    """Run `eslab data countdown|conciseness ...` in this process, read by the command's own
    parser (which resolves its --out as a run resolves paths). DatasetError for any other
    command line and for what the generator refuses."""
    from engine.data.datasets import DatasetError

    parser = argparse.ArgumentParser(prog="eslab", add_help=False)
    add_commands(parser.add_subparsers(dest="command", required=True))
    words = shlex.split(command)
    try:
        args = parser.parse_args(words[1:] if words[:1] == ["eslab"] else words)
    except SystemExit:  # argparse has printed why on stderr
        args = None
    if args is None or args.command != "data" or args.data_command not in GENERATORS:
        raise DatasetError(
            f"{command!r} is not a command that generates a dataset "
            f"(eslab data {' | '.join(GENERATORS)} ...)"
        )
    return GENERATORS[args.data_command](args)


def cmd_data_clean_uploads(args: argparse.Namespace) -> int:
    """What the New run page also does after each upload, for a server nobody uploads to."""
    from app.cli.common import open_store, print_error
    from jobs.uploads import clean_uploads

    try:
        with open_store() as store:
            removed = clean_uploads(store, dry_run=args.dry_run)
    except ValueError as exc:  # a malformed ESLAB_UPLOAD_KEEP_HOURS
        print_error(str(exc))
        return 2
    verb = "would remove" if args.dry_run else "removed"
    for path in removed:
        print(f"{verb} {path}")
    print(f"{verb} {len(removed)} unused upload(s)")
    return 0
