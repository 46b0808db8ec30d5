"""Reward functions, addressed by dotted path.

A reward function is `compute_score(completion_text: str, **reward_func_args) -> dict` with a
`reward` key; any other keys are reward parts (for example `format` and `accuracy`), reported
next to the reward. This is the contract of nlp-waseda/lbes (`reward_func_path`, the
functions of `src/reward_funcs/`). Functions see the completion only, never the prompt
(docs/design.md, "Engine rules").

A function that raises, or returns anything but a dict of finite numbers with a `reward`,
stops the run with a `RewardError` naming the function and the sample: the jbejjani2022 fork
turned scorer failures into silent zero rewards, which ES would then happily optimise.
"""

from __future__ import annotations

import importlib
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

RewardFunction = Callable[..., Mapping[str, Any]]

# Registry name -> dotted path of the built-in reward functions (the dashboard lists these).
BUILTIN_REWARDS: dict[str, str] = {
    "countdown": "engine.rewards.countdown.compute_score",
    "gsm8k": "engine.rewards.gsm8k.compute_score",
    "conciseness": "engine.rewards.conciseness.compute_score",
}

# Long completions and arguments are cut in error messages, which end up in the UI.
_EXCERPT_CHARS = 200


class RewardError(Exception):
    """A reward function could not be loaded, failed, or returned an unusable score."""


def load_reward_function(dotted_path: str) -> RewardFunction:
    """Import `package.module.function` and return the function."""
    module_name, _, attribute = dotted_path.strip().rpartition(".")
    if not module_name or not attribute:
        raise RewardError(
            f"reward function path {dotted_path!r} must be a dotted path 'module.function', "
            f"for example {BUILTIN_REWARDS['countdown']!r}"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Distinguish a wrong path from a module that exists but imports something missing.
        if exc.name and (module_name + ".").startswith(exc.name + "."):
            raise RewardError(
                f"reward function {dotted_path!r}: no module named {module_name!r}; "
                f"built-in reward functions are {', '.join(BUILTIN_REWARDS.values())}"
            ) from exc
        raise RewardError(
            f"reward function {dotted_path!r}: importing {module_name!r} failed: {exc}"
        ) from exc
    except Exception as exc:
        raise RewardError(
            f"reward function {dotted_path!r}: importing {module_name!r} failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    function = getattr(module, attribute, None)
    if function is None:
        raise RewardError(
            f"reward function {dotted_path!r}: module {module_name!r} has no attribute "
            f"{attribute!r}"
        )
    if not callable(function):
        raise RewardError(
            f"reward function {dotted_path!r} is a {type(function).__name__}, not a function"
        )
    return function


def function_path(func: Callable[..., Any]) -> str:
    """The dotted path that names `func` in messages."""
    module = getattr(func, "__module__", None) or "?"
    name = getattr(func, "__qualname__", None) or type(func).__qualname__
    return f"{module}.{name}"


def score_completion(
    func: RewardFunction,
    completion_text: str,
    reward_func_args: Mapping[str, Any],
    *,
    sample_description: str,
) -> dict[str, float]:
    """Call `func(completion_text, **reward_func_args)` and return its parts as floats.

    Raises RewardError naming the function and `sample_description` when the function
    raises, returns a non-dict, has no `reward`, or returns a value that is not a finite
    number.
    """

    def error(problem: str) -> RewardError:
        return RewardError(
            f"reward function {function_path(func)} {problem} on {sample_description} "
            f"(completion {_excerpt(completion_text)}, "
            f"reward_func_args {_excerpt(dict(reward_func_args))})"
        )

    try:
        result = func(completion_text, **reward_func_args)
    except Exception as exc:
        raise error(f"raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(result, Mapping):
        raise error(f"returned a {type(result).__name__}, expected a dict with a 'reward' key")
    if "reward" not in result:
        raise error(f"returned no 'reward' key (keys: {sorted(map(str, result))})")
    scores: dict[str, float] = {}
    for key, value in result.items():
        if not isinstance(key, str):
            raise error(f"returned a non-string key {key!r}")
        # numbers.Real covers Python and NumPy scalars alike.
        if not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise error(f"returned {key}={value!r}, which is not a finite number")
        scores[key] = float(value)
    return scores


def _excerpt(value: Any) -> str:
    text = repr(value)
    if len(text) <= _EXCERPT_CHARS:
        return text
    return f"{text[:_EXCERPT_CHARS]}... ({len(text)} characters)"
