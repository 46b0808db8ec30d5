"""The rules that tie options together (a strategy and its step count, a method and the
options only it reads, ...): each a small function of the flat, typed values that yields the
problems it finds."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from engine.config.errors import FieldError, show
from engine.config.eval_sets import parse_eval_sets
from engine.config.fields import METHODS
from engine.config.schema import SPECS
from engine.rewards import path_refusal
from engine.scoring.members import SCORER_MEMBER, is_function, parse_members

Check = Callable[[dict[str, Any]], Iterator[FieldError]]


@dataclass(frozen=True)
class Rule:
    """A check across options; skipped when one of `fields` already failed its own check, so
    a bad value is reported once, not again by every rule that reads it."""

    fields: tuple[str, ...]
    check: Check


RULES: list[Rule] = []


def _rule(*fields: str) -> Callable[[Check], Check]:
    """Register the decorated check as a rule reading `fields`."""

    def register(check: Check) -> Check:
        RULES.append(Rule(fields, check))
        return check

    return register


@_rule("reward_func_path", "reward_source")
def _reward_path(v: dict[str, Any]) -> Iterator[FieldError]:
    if v["reward_func_path"] is None:
        if v["reward_source"] == "function":
            yield FieldError(
                "reward_func_path",
                f"reward.reward_func_path is required: {SPECS['reward_func_path'].help}",
            )
    elif (problem := path_refusal(v["reward_func_path"])) is not None:
        # Checked as text, before anything is imported: the path names code.
        yield FieldError(
            "reward_func_path", f"reward.reward_func_path {v['reward_func_path']!r} {problem}"
        )


@_rule("antithetic", "population_size")
def _antithetic_even(v: dict[str, Any]) -> Iterator[FieldError]:
    if v["antithetic"] and v["population_size"] % 2:
        yield FieldError(
            "population_size",
            f"es.population_size must be even when es.antithetic is true, got "
            f"{v['population_size']}: use {v['population_size'] + 1} or set "
            "antithetic false",
        )


@_rule("learning_rate_rule", "learning_rate")
def _learning_rate_rule(v: dict[str, Any]) -> Iterator[FieldError]:
    # A learning_rate that the rule replaces would be silently ignored: refuse it.
    if v["learning_rate_rule"] != "fixed" and v["learning_rate"] != SPECS["learning_rate"].default:
        yield FieldError(
            "learning_rate",
            f"es.learning_rate is not read when learning_rate_rule is "
            f"{v['learning_rate_rule']!r} (it derives the learning rate from noise_std), got "
            f"{show(v['learning_rate'])}: remove it or set learning_rate_rule fixed",
        )


def _every_steps_rule(kind: str) -> None:
    """`<kind>_strategy: steps` needs `<kind>_steps`; the same rule for eval and save."""
    strategy, steps = f"{kind}_strategy", f"{kind}_steps"

    def check(v: dict[str, Any]) -> Iterator[FieldError]:
        if v[strategy] == "steps" and v[steps] is None:
            yield FieldError(
                steps,
                f"eval.{steps} must be >= 1 when {strategy} is 'steps', got None: "
                f"set {steps} or use {strategy} 'epoch' or 'no'",
            )

    _rule(strategy, steps)(check)


_every_steps_rule("eval")
_every_steps_rule("save")


@_rule("save_best_model", "eval_strategy")
def _best_needs_eval(v: dict[str, Any]) -> Iterator[FieldError]:
    if v["save_best_model"] and v["eval_strategy"] == "no":
        yield FieldError(
            "save_best_model",
            "eval.save_best_model needs evaluations to compare, but eval_strategy is 'no': "
            "set eval_strategy 'steps' or 'epoch', or save_best_model false",
        )


@_rule("eval_strategy", "eval_file", "eval_sets")
def _eval_file(v: dict[str, Any]) -> Iterator[FieldError]:
    if v["eval_strategy"] != "no" and v["eval_file"] is None and v["eval_sets"] is None:
        yield FieldError(
            "eval_file",
            f"data.eval_file is required when eval_strategy is "
            f"{v['eval_strategy']!r}, got None: give a parquet file (or data.eval_sets) or "
            "set eval_strategy 'no'",
        )


@_rule("eval_sets")
def _eval_sets(v: dict[str, Any]) -> Iterator[FieldError]:
    from engine.paths import input_problem

    try:
        sets = parse_eval_sets(v["eval_sets"])
    except ValueError as exc:
        yield FieldError("eval_sets", f"data.eval_sets {exc}")
        return
    for name, path in sets.items():
        if problem := input_problem(path):
            yield FieldError("eval_sets", f"data.eval_sets: set {name!r}, {path[:200]!r} {problem}")


_METHOD_SPECIFIC = tuple(s for s in SPECS.values() if s.methods != METHODS)


@_rule("method", *(s.name for s in _METHOD_SPECIFIC))
def _method_options(v: dict[str, Any]) -> Iterator[FieldError]:
    # An option the chosen method never reads would be silently ignored: refuse it.
    for spec in _METHOD_SPECIFIC:
        if v["method"] not in spec.methods and v[spec.name] != spec.default:
            only = " or ".join(repr(m) for m in spec.methods)
            yield FieldError(
                spec.name,
                f"{spec.path} only applies to method {only}, got "
                f"{show(v[spec.name])} with method {v['method']!r}: "
                f"remove it or set method {spec.methods[0]}",
            )


@_rule("method", "flat_corrcoef", "n", "temperature")
def _per_prompt_correlation(v: dict[str, Any]) -> Iterator[FieldError]:
    if v["method"] != "lbes" or v["flat_corrcoef"]:
        return
    if v["n"] < 2:
        yield FieldError(
            "n",
            f"sampling.n must be >= 2 for lbes per-prompt correlation, got "
            f"{v['n']}: raise n or set flat_corrcoef true",
        )
    elif v["temperature"] == 0:
        yield FieldError(
            "temperature",
            "sampling.temperature must be > 0 for lbes per-prompt correlation, got "
            "0.0: greedy decoding makes a prompt's n samples identical, so every "
            "correlation is undefined; use e.g. 1.0 or set flat_corrcoef true",
        )


@_rule("method", "data_batch_size", "n")
def _enough_samples(v: dict[str, Any]) -> Iterator[FieldError]:
    if v["method"] == "lbes" and v["data_batch_size"] * v["n"] < 2:
        yield FieldError(
            "data_batch_size",
            f"data.data_batch_size * sampling.n must be >= 2 for lbes, got "
            f"{v['data_batch_size']} * {v['n']}: a correlation needs two samples",
        )


@_rule(
    "method",
    "n",
    "data_batch_size",
    "top_k_rewards",
    "bottom_k_rewards",
    "top_k_prompt_reward_var",
    "flat_top_k_rewards",
    "flat_bottom_k_rewards",
)
def _filter_sizes(v: dict[str, Any]) -> Iterator[FieldError]:
    # A k larger than what it selects from is a mistake the reference hides by clamping k.
    if v["method"] != "lbes":
        return
    limits = {
        "top_k_rewards": ("sampling.n", v["n"]),
        "bottom_k_rewards": ("sampling.n", v["n"]),
        "top_k_prompt_reward_var": ("data.data_batch_size", v["data_batch_size"]),
        "flat_top_k_rewards": ("data_batch_size * n", v["data_batch_size"] * v["n"]),
        "flat_bottom_k_rewards": ("data_batch_size * n", v["data_batch_size"] * v["n"]),
    }
    for name, (what, limit) in limits.items():
        if v[name] is not None and v[name] > limit:
            yield FieldError(
                name,
                f"{SPECS[name].path} must be <= {what} ({limit}), got "
                f"{v[name]}: lower it or raise {what}",
            )


@_rule("method", "flat_corrcoef", "top_k_rewards", "bottom_k_rewards")
def _two_per_prompt(v: dict[str, Any]) -> Iterator[FieldError]:
    top, bottom = v["top_k_rewards"], v["bottom_k_rewards"]
    if v["method"] != "lbes" or v["flat_corrcoef"] or (top is None and bottom is None):
        return
    if (top or 0) + (bottom or 0) < 2:
        name = "top_k_rewards" if top is not None else "bottom_k_rewards"
        yield FieldError(
            name,
            f"lbes.{name} keeps 1 sample per prompt, but per-prompt "
            "correlation needs 2: set top_k_rewards + bottom_k_rewards >= 2 "
            "or flat_corrcoef true",
        )


_LORA_OPTIONS = (
    "lora_rank",
    "lora_alpha",
    "lora_target_modules",
    "lora_target_layers",
    "lora_noise_scaling",
    "lora_update",
)

_TARGET_OPTIONS = ("lora_target_modules", "lora_target_layers")
"""The options of _LORA_OPTIONS that perturbation full_batched reads too."""


@_rule("method", "perturbation", "tensor_parallel_size", *_LORA_OPTIONS)
def _lora_options(v: dict[str, Any]) -> Iterator[FieldError]:
    from engine.lowrank.factors import parse_layers, parse_modules

    perturbation = v["perturbation"]
    applies = {
        "full": (),
        "full_batched": _TARGET_OPTIONS,
        "lora": _LORA_OPTIONS,
    }[perturbation]
    for name in _LORA_OPTIONS:  # silently ignored otherwise
        if name not in applies and v[name] != SPECS[name].default:
            modes = "'lora' or 'full_batched'" if name in _TARGET_OPTIONS else "'lora'"
            yield FieldError(
                name,
                f"lora.{name} only applies to perturbation {modes}, got "
                f"{show(v[name])}: remove it or set perturbation lora",
            )
    if perturbation == "full":
        return
    if perturbation == "lora" and v["method"] != "es":
        yield FieldError(
            "perturbation",
            f"lora.perturbation 'lora' needs method es, got "
            f"{v['method']!r}: use perturbation full or full_batched for lbes",
        )
    if perturbation == "full_batched" and v["tensor_parallel_size"] != 1:
        yield FieldError(
            "perturbation",
            "lora.perturbation 'full_batched' needs tensor_parallel_size 1, got "
            f"{v['tensor_parallel_size']}: use perturbation full for tensor parallelism",
        )
    for name, parse in (
        ("lora_target_modules", parse_modules),
        ("lora_target_layers", parse_layers),
    ):
        try:
            parse(v[name])
        except ValueError as exc:
            yield FieldError(name, f"lora.{name} {exc}")


# The alignment options


@_rule("reward_source", "scorer_url", "lambda_adapt", "ensemble_members")
def _reward_sources(v: dict[str, Any]) -> Iterator[FieldError]:
    members = parse_members(v["ensemble_members"])
    if v["reward_source"] == "scorer" and v["scorer_url"] is None:
        yield FieldError(
            "scorer_url",
            "alignment.scorer_url is required when reward_source "
            "is 'scorer', got None: e.g. http://127.0.0.1:8000",
        )
    if v["lambda_adapt"] and v["scorer_url"] is None:
        yield FieldError(
            "scorer_url",
            "alignment.scorer_url is required when lambda_adapt is "
            "true: lambda adapts to the scorer's costs",
        )
    if v["reward_source"] == "ensemble" and len(members) < 2:
        yield FieldError(
            "ensemble_members",
            f"ensemble.ensemble_members must name at least 2 members when "
            f"reward_source is 'ensemble', got {v['ensemble_members']!r}",
        )
    if SCORER_MEMBER in members and v["scorer_url"] is None:
        yield FieldError(
            "ensemble_members",
            "ensemble.ensemble_members names `scorer` but alignment.scorer_url is None",
        )
    for member in filter(is_function, members):
        if (problem := path_refusal(member)) is not None:
            yield FieldError(
                "ensemble_members",
                f"ensemble.ensemble_members: {member!r} is neither `scorer`, an http(s) URL "
                f"nor an allowed reward function: it {problem}",
            )
    if v["reward_source"] != "ensemble" and members:
        yield FieldError(
            "ensemble_members",
            "ensemble.ensemble_members is only read when "
            "reward_source is 'ensemble': remove it or set "
            "reward_source ensemble",
        )


@_rule("lambda_min", "lambda_max")
def _lambda_range(v: dict[str, Any]) -> Iterator[FieldError]:
    if v["lambda_min"] > v["lambda_max"]:
        yield FieldError(
            "lambda_min",
            f"alignment.lambda_min must be <= lambda_max "
            f"({v['lambda_max']:g}), got {v['lambda_min']:g}",
        )


@_rule("macro_advantage", "scorer_url")
def _macro_with_cost(v: dict[str, Any]) -> Iterator[FieldError]:
    # macro_advantage shapes per-sample rewards and would ignore the cost term entirely.
    if v["macro_advantage"] and v["scorer_url"] is not None:
        yield FieldError(
            "macro_advantage",
            "es.macro_advantage cannot be combined with "
            "alignment.scorer_url: it shapes rewards per sample "
            "and would ignore lambda * cost; set it false",
        )


# Paths, names, the model and service addresses: what whoever launches a run may point at


RUN_NAME = re.compile(r"\w(?:[\w .-]{0,98}[\w.-])?")
"""A run's name: letters (any script), digits, '_', '-', '.' and inner spaces, at most 100
characters, starting with a letter, digit or '_'. Names are shown on pages and in exports
and file names: no markup, slashes, quotes or control characters."""


def run_name_problem(name: str) -> str | None:
    """Why `name` is no run name, None when it is one."""
    if RUN_NAME.fullmatch(name):
        return None
    return (
        f"must be 1 to 100 letters, digits, '_', '-', '.' or inner spaces, starting with a "
        f"letter, digit or '_', got {name[:100]!r}"
    )


@_rule("report_to", "report_key_names")
def _report_to(v: dict[str, Any]) -> Iterator[FieldError]:
    from engine.reporters import parse_report_to

    try:
        trackers = parse_report_to(v["report_to"])
    except ValueError as exc:
        yield FieldError("report_to", f"logging.report_to {exc}")
        return
    if v["report_key_names"] == "reference" and not trackers:
        yield FieldError(
            "report_key_names",
            "logging.report_key_names 'reference' names keys for the trackers, and "
            "logging.report_to names none: add tensorboard or wandb, or use eslab",
        )


@_rule("run_name")
def _run_name(v: dict[str, Any]) -> Iterator[FieldError]:
    if v["run_name"] is not None and (problem := run_name_problem(v["run_name"])):
        yield FieldError("run_name", f"logging.run_name {problem}")


@_rule("output_dir", "model")
def _output_dir(v: dict[str, Any]) -> Iterator[FieldError]:
    from engine.model_files import local_model
    from engine.paths import default_model_dir, output_dir_problem

    if v["output_dir"] is None:
        return
    models = [m for m in (local_model(v["model"]), default_model_dir()) if m is not None]
    if problem := output_dir_problem(v["output_dir"], models):
        yield FieldError("output_dir", f"data.output_dir {v['output_dir'][:200]!r} {problem}")


@_rule("model")
def _model_name(v: dict[str, Any]) -> Iterator[FieldError]:
    from engine.model_files import local_model, model_name_problem
    from engine.paths import input_problem

    if problem := model_name_problem(v["model"]):
        yield FieldError("model", f"model.model {v['model'][:100]!r} {problem}")
    elif (local := local_model(v["model"])) and (problem := input_problem(str(local))):
        # a folder here (a hub id is looked up in the hub's cache, never as a path)
        yield FieldError("model", f"model.model {v['model'][:200]!r} {problem}")


def _dataset_path(name: str) -> Check:
    """The rule that dataset option `name` names a file a run may read."""

    def check(v: dict[str, Any]) -> Iterator[FieldError]:
        from engine.paths import input_problem

        if v[name] is not None and (problem := input_problem(v[name])):
            yield FieldError(name, f"data.{name} {v[name][:200]!r} {problem}")

    return check


for _dataset in ("train_file", "eval_file"):
    _rule(_dataset)(_dataset_path(_dataset))


@_rule("scorer_url", "ensemble_members")
def _service_urls(v: dict[str, Any]) -> Iterator[FieldError]:
    from engine.config.urls import url_problem

    if v["scorer_url"] is not None and (problem := url_problem(v["scorer_url"])):
        yield FieldError("scorer_url", f"alignment.scorer_url {problem}")
    for member in (v["ensemble_members"] or "").split(","):
        if member.strip().startswith(("http://", "https://")) and (problem := url_problem(member)):
            yield FieldError("ensemble_members", f"ensemble.ensemble_members: a URL {problem}")
