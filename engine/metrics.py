"""Metric key names, defined once. The trainer writes them; the database, the dashboard and
`eslab export` read them. Keys are slash paths: `<split>/<what>[/<stat>]`."""

from __future__ import annotations

import difflib
import re
from functools import cache

TRAIN = "train"
EVAL = "eval"

NOISE_STD = "train/noise_std"
LEARNING_RATE = "train/learning_rate"
EPOCH = "train/epoch"
NUM_TOKENS = "train/num_tokens"  # cumulative over the run: prompt (once a sample) + completion
TOKENS_PER_SECOND = "train/tokens_per_second"
SAMPLES_PER_SECOND = "train/samples_per_second"
FRAC_REWARD_ZERO_STD = "train/frac_reward_zero_std"
RETAINED_PROMPT_RATIO = "train/retained_prompt_ratio"
RETAINED_REWARD_RATIO = "train/retained_reward_ratio"
CORRELATION_MEAN = "train/correlation/mean"
POPULATION_REWARD = "population_reward"
"""ES: the part name of the statistics over the members' mean rewards (`train/population_reward/
std`, ...), where `train/reward/std` is the reference's spread of each sample's reward."""
EVAL_RUNTIME = "eval/runtime"
EVAL_SAMPLES_PER_SECOND = "eval/samples_per_second"
EVAL_TOTAL_SAMPLES = "eval/total_samples"  # completions the evaluation scored
TIME_TOTAL = "time/total"  # cumulative time/step over the run
LORA_RANK = "train/lora/rank"
"""Rank of the members' perturbation; logged only by runs with perturbation lora, so its
presence marks the mode on the dashboard's charts."""

# Alignment runs (engine/alignment/aligner.py). Mean reward and mean cost are
# `train/reward/mean` and `train/cost/mean` (reward_key), the objective mean(R) - lambda * mean(C)
# `train/objective/*`, and each ensemble member's score `train/member/<name>/mean`.
LAMBDA = "train/lambda"  # the lambda this step's fitness used
LAMBDA_NEXT = "train/lambda/next"  # after this step's update: the next step's lambda
JC_RAW = "train/j_c/raw"  # mean cost of the unperturbed model - d, never clipped
JC = "train/j_c"  # J_C the rule averages: JC_RAW, its positive part with lambda_pos_cost_only
JC_SMOOTHED = "train/j_c/smoothed"  # the moving average of JC, which moves ln(lambda)
COST_THRESHOLD = "train/cost_threshold_d"  # d of the constraint mean(C) <= d, every update
SAFE_RATIO = "train/safe_ratio"  # share of the population's responses with cost <= 0
BASE_COST_MEAN = "train/base/cost/mean"  # the unperturbed model's mean cost
BASE_SAFE_RATIO = "train/base/safe_ratio"
EVAL_MEAN_COMBINED = "eval/mean_combined"  # the objective on the eval set, this step's lambda

# Best-of-n (`eslab bon`, engine/best_of_n/selections.py): the curves of one scoring, one per
# selection rule, keyed by which proxy picked the answer: each ensemble member alone, as the
# reference's per-seed results, then the ensemble's mean, min (WCO) and uwo at each weight.
BON_RULES = ("member", "mean", "min", "uwo")


def bon_key(rule: str, detail: str | float | None = None) -> str:
    """`bon/member/<name>`, `bon/mean`, `bon/min`, `bon/uwo/<weight>` (`bon/uwo/0.5`)."""
    if rule not in BON_RULES:
        raise KeyError(f"unknown best-of-n rule {rule!r}; known: {', '.join(BON_RULES)}")
    takes_detail = rule in ("member", "uwo")  # a member's name, uwo's weight
    if takes_detail != (detail is not None):
        raise KeyError(f"best-of-n rule {rule!r} {'needs' if takes_detail else 'takes no'} detail")
    if rule == "uwo":
        return f"bon/uwo/{float(detail):g}"  # type: ignore[arg-type]
    return f"bon/{rule}" if detail is None else f"bon/{rule}/{detail}"


# Time per phase of a step, in seconds.
PHASES = (
    "generation",
    "perturb",
    "restore",
    "reward",
    "logprobs",
    "update",
    "step",
)


RATES = (TOKENS_PER_SECOND, SAMPLES_PER_SECOND, EVAL_RUNTIME, EVAL_SAMPLES_PER_SECOND)


def depends_on_wall_clock(key: str) -> bool:
    """Timings and rates: the keys whose values differ between two runs of the same seed,
    which a reproducibility check leaves out."""
    return key.startswith("time/") or key in RATES


def time_key(phase: str) -> str:
    if phase not in PHASES:
        raise KeyError(f"unknown phase {phase!r}; known: {', '.join(PHASES)}")
    return f"time/{phase}"


STATS = ("mean", "std", "min", "max")


def reward_key(split: str, part: str = "reward", stat: str = "mean") -> str:
    """`train/reward/mean`, `eval/accuracy/mean`, ...: one key per reward part and statistic."""
    return f"{split}/{part}/{stat}"


ACCURACY = "accuracy"
"""The reward part that says whether a completion is correct: 1 or 0. A reward function
declares it by returning it (the built-in countdown and GSM8K rewards do; ES at Scale's
countdown derives it as answer_reward > 0, as its evaluation scripts count a solved puzzle),
and its mean is then reported like any part's, on the eval set the accuracy the papers
report, which a sweep may take as its objective."""
TRAIN_ACCURACY = reward_key(TRAIN, ACCURACY)  # over every member's completions of the step
EVAL_ACCURACY = reward_key(EVAL, ACCURACY)  # the share of eval prompts solved

EVAL_SETS_MEAN = "eval/avgpass@1/mean"
"""The plain mean over the run's eval_sets of their eval_set_key values: ES at Scale's
`eval/avgpass@1/mean` (VsonicV/es-at-scale, trainer/es_trainer.py `eval_step`)."""


def eval_set_key(name: str) -> str:
    """`eval/<name>/pass@1/mean`: the mean reward on eval set `name` (one greedy completion a
    prompt, so with a 0/1 reward the share solved), ES at Scale's key for each evaluation set.
    A reward part statistic by its shape (REWARD_PART_KEY)."""
    return reward_key(EVAL, name, "pass@1/mean")


EVAL_SET_KEY = re.compile(r"eval/(?P<name>[^/]+)/pass@1/mean")
"""An eval_set_key, its set's name as `name`."""


COMPLETION_STATS = (
    "mean_length",
    "min_length",
    "max_length",
    "clipped_ratio",
    "mean_terminated_length",
    "min_terminated_length",
    "max_terminated_length",
)


def completion_key(split: str, stat: str) -> str:
    """Completion lengths in tokens (`mean_length`, ..., `mean_terminated_length`: of the
    completions the model ended itself) and `clipped_ratio`."""
    if stat not in COMPLETION_STATS:
        known = ", ".join(COMPLETION_STATS)
        raise KeyError(f"unknown completion statistic {stat!r}; known: {known}")
    return f"{split}/completions/{stat}"


REWARD_PART_KEY = re.compile(rf"(train|eval)/[^/]+(/[^/]+)?/({'|'.join(STATS)})")
"""A statistic of a reward part (`train/<part>/mean`) or an ensemble member
(`train/member/<name>/mean`): reward functions and ensembles name their parts at run time, so
such keys are known by their shape only."""


@cache
def fixed_keys() -> frozenset[str]:
    """Every key this module defines or builds from its own names (reward parts aside)."""
    constants = {
        value
        for name, value in globals().items()
        if name.isupper() and isinstance(value, str) and "/" in value
    }
    return frozenset(
        constants
        | {time_key(p) for p in PHASES}
        | {completion_key(s, c) for s in (TRAIN, EVAL) for c in COMPLETION_STATS}
        | {reward_key(s, "reward", stat) for s in (TRAIN, EVAL) for stat in STATS}
        | {reward_key(TRAIN, POPULATION_REWARD, s) for s in ("std", "min", "max")}
    )


def is_known_key(key: str) -> bool:
    """Whether a run may report `key`: one of fixed_keys(), or a reward part's statistic."""
    return key in fixed_keys() or REWARD_PART_KEY.fullmatch(key) is not None


def close_key(key: str) -> str | None:
    """The fixed key `key` was most likely meant to be (a typo's correction), if any."""
    close = difflib.get_close_matches(key, sorted(fixed_keys()), n=1, cutoff=0.8)
    return close[0] if close else None
