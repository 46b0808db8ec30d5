"""ES at Scale's math data (VsonicV/es-at-scale, `train.py --task math`) to ES Lab datasets:
`eslab data math --input EVAL_DIR [--train TRAIN_DIR] [--template FILE] --out DIR`.

The reference reads its data with Hugging Face's `load_from_disk`: each of `--train-dataset`
and `--eval-dataset` is a DatasetDict saved to disk (a folder with `dataset_dict.json`, whose
`splits` list names one subfolder per split; each holds `state.json`, whose `_data_files` name
its Arrow stream files). Every row gives `problem` (the question) and `answer` (the truth its
`boxed_reward_fn` grades against, engine.rewards.math_boxed here). This reads that layout with
pyarrow alone, from the user's own folders at run time: nothing of the reference's data is in
this repository.

- Each split of the evaluation DatasetDict becomes `eval/<split>.parquet`, and the summary
  gives the `eval_sets` line that evaluates them all, each logged as
  `eval/<split>/pass@1/mean` with their mean `eval/avgpass@1/mean`, as the reference logs its
  math suite (amc, aime, math500, minerva, olympiad_bench).
- The training DatasetDict gives `train.parquet` from its last split, the one the reference's
  loop over `load_from_disk(...).items()` keeps (conventionally its only split, `train`).
- Prompts are raw text (prompt_format: raw): the problem in ChatML turns under a system
  instruction, as the reference's `qwen_math_template` writes them for any model. With
  `--template`, the user's copy of the reference's `template_function/apply_template.py`, the
  text before and after the question is read from that function's source (never run); without
  it, ES Lab's own instruction (engine.prompts.chatml_prompt, MATH_SYSTEM).

reward_func_args is {ground_truth: answer}, the answer as text (a number is written as Python
writes it, as the reference's grader does) or, where the row gives several, a list of texts.
Every error names the folder or file and, where it applies, the split and row.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from engine.config.eval_sets import NAME, format_eval_sets
from engine.data.datasets import DatasetError, Example, WriteResult, write_dataset
from engine.prompts import chatml_prompt

QUESTION = "problem"
ANSWER = "answer"
TEMPLATE_FUNCTION = "qwen_math_template"
Template = Callable[[str], str]


def convert_math_es_at_scale(
    eval_dir: str | Path,
    out_dir: str | Path,
    *,
    train_dir: str | Path | None = None,
    template_file: str | Path | None = None,
) -> WriteResult:
    """Write `eval/<split>.parquet` for each evaluation split (and `train.parquet` from
    `train_dir`) into `out_dir`; DatasetError naming the folder or file for anything else."""
    template = read_template(Path(template_file)) if template_file else chatml_prompt
    out_dir = Path(out_dir)
    splits = read_dataset_dict(Path(eval_dir))
    for name in splits:
        if NAME.fullmatch(name) is None:
            raise DatasetError(
                f"{eval_dir}: split {name!r} cannot name an eval set (letters, digits, _ . -)"
            )
    paths = [
        write_dataset(
            to_examples(eval_dir, name, rows, template), out_dir / "eval" / f"{name}.parquet"
        )
        for name, rows in splits.items()
    ]
    lines = [
        f"math from {eval_dir}: {', '.join(f'{n} ({len(r)})' for n, r in splits.items())} in "
        f"{out_dir / 'eval'}; prompt_format: raw; "
        + ("the prompts of " + str(template_file) if template_file else "ES Lab's own prompt")
    ]
    if train_dir is not None:
        train_splits = read_dataset_dict(Path(train_dir))
        name, rows = list(train_splits.items())[-1]
        paths.append(
            write_dataset(to_examples(train_dir, name, rows, template), out_dir / "train.parquet")
        )
        lines.append(
            f"train: split {name!r} of {train_dir} ({len(rows)}) in {out_dir / 'train.parquet'}"
        )
    sets = format_eval_sets({name: str(out_dir / "eval" / f"{name}.parquet") for name in splits})
    lines.append(f"eval_sets: {sets}")
    return WriteResult(paths, "\n".join(lines))


def read_dataset_dict(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """`{split: rows}` of a DatasetDict saved to disk, in its `splits` order."""
    index = folder / "dataset_dict.json"
    if not index.is_file():
        raise DatasetError(
            f"{folder}: no dataset_dict.json; give the folder of a DatasetDict saved with "
            "save_to_disk (the one that holds dataset_dict.json, not a split's subfolder)"
        )
    splits = _json(index).get("splits")
    if not isinstance(splits, list) or not splits or not all(isinstance(s, str) for s in splits):
        raise DatasetError(f"{index}: 'splits' must be a non-empty list of split names")
    return {split: _read_split(folder / split) for split in splits}


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path}: not a readable JSON file ({exc})") from exc
    if not isinstance(value, dict):
        raise DatasetError(f"{path}: must hold a JSON object")
    return value


def _read_split(folder: Path) -> list[dict[str, Any]]:
    state = folder / "state.json"
    if not state.is_file():
        raise DatasetError(f"{folder}: no state.json (not a split saved with save_to_disk)")
    files = _json(state).get("_data_files")
    if not isinstance(files, list) or not files:
        raise DatasetError(f"{state}: '_data_files' must list the split's Arrow files")
    rows: list[dict[str, Any]] = []
    for entry in files:
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str) or Path(name).name != name:
            raise DatasetError(
                f"{state}: a '_data_files' entry without a plain filename: {entry!r}"
            )
        rows += _read_arrow(folder / name).to_pylist()
    if not rows:
        raise DatasetError(f"{folder}: the split is empty (0 rows)")
    return rows


def _read_arrow(path: Path) -> pa.Table:
    """An Arrow stream file (what save_to_disk writes)."""
    try:
        with pa.memory_map(str(path)) as source:
            return ipc.open_stream(source).read_all()
    except (OSError, pa.ArrowInvalid) as exc:
        raise DatasetError(f"{path}: not a readable Arrow stream file ({exc})") from exc


def to_examples(
    source: str | Path, split: str, rows: list[dict[str, Any]], template: Template
) -> list[Example]:
    """One raw prompt with {ground_truth} a row."""
    examples = []
    for at, row in enumerate(rows):
        where = f"{source}: split {split!r}, row {at}"
        question, answer = row.get(QUESTION), row.get(ANSWER)
        if not isinstance(question, str) or not question.strip():
            raise DatasetError(f"{where}: {QUESTION!r} must be non-empty text, got {question!r}")
        examples.append(
            Example(
                prompt=template(question), reward_func_args={"ground_truth": _truth(answer, where)}
            )
        )
    kinds = {type(e.reward_func_args["ground_truth"]) for e in examples}
    if len(kinds) > 1:
        raise DatasetError(f"{source}: split {split!r} mixes single answers and lists of answers")
    return examples


def _truth(answer: Any, where: str) -> str | list[str]:
    """The reference's grader takes text, a number (as its text) or a list of texts."""
    if isinstance(answer, str):
        return answer
    if isinstance(answer, int | float) and not isinstance(answer, bool):
        return str(answer)
    if isinstance(answer, list) and answer and all(isinstance(a, str) for a in answer):
        return answer
    raise DatasetError(
        f"{where}: {ANSWER!r} must be text, a number or a list of texts, got {answer!r}"
    )


def read_template(path: Path) -> Template:
    """The prompt of the reference's `qwen_math_template` in the user's copy of its
    template_function/apply_template.py: the function returns string literals joined with `+`
    around its one parameter, and those literals are read from the source (not run)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError) as exc:
        raise DatasetError(f"{path}: not a readable Python file ({exc})") from exc
    functions = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == TEMPLATE_FUNCTION
    ]
    unreadable = DatasetError(
        f"{path}: no {TEMPLATE_FUNCTION}(question) returning text + question + text, "
        "as ES at Scale's template_function/apply_template.py defines it"
    )
    if len(functions) != 1 or len(functions[0].args.args) != 1:
        raise unreadable
    (function,) = functions
    parameter = function.args.args[0].arg
    returns = [node for node in function.body if isinstance(node, ast.Return)]
    parts = _joined(returns[0].value, parameter) if len(returns) == 1 else None
    if parts is None or parts.count(None) != 1:
        raise unreadable
    at = parts.index(None)
    before = "".join(part for part in parts[:at] if part is not None)
    after = "".join(part for part in parts[at + 1 :] if part is not None)
    return lambda question: before + question + after


def _joined(node: ast.expr | None, parameter: str) -> list[str | None] | None:
    """A `+` chain of string literals and `parameter` as its parts (None for the parameter);
    None for anything else."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _joined(node.left, parameter), _joined(node.right, parameter)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name) and node.id == parameter:
        return [None]
    return None
