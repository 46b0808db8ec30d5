"""Reward functions, addressed by dotted path.

A reward function is `compute_score(completion_text: str, **reward_func_args) -> dict` with a
`reward` key; any other keys are reward parts (for example `format` and `accuracy`), reported
next to the reward. This is the contract of nlp-waseda/lbes (`reward_func_path`, the
functions of `src/reward_funcs/`). Functions see the completion only, never the prompt
(docs/design.md, "Engine rules").

A path names code, and whoever launches a run writes it, so:
- only a public, plain Python function defined in an allowed module can be loaded: a module
  under engine.rewards or one the operator lists in ESLAB_REWARD_MODULES (the rules and the
  setting's format: engine/rewards/_allowed.py). The path is checked before anything is
  imported, and what it names after: not a class, not a builtin, not a function that the
  module only imports (`from os import system` does not make `system` a reward function).
- a function is called with the arguments its signature takes. Its first parameter takes the
  completion text (positionally), and no key of a row's reward_func_args may name it. A
  function with `**kwargs` gets every other key, as nlp-waseda/lbes's documented
  `compute_score(completion_text: str, **kwargs)` expects: its module is allowed, so what it
  does with them is its author's, the operator's, choice. A function without `**kwargs` gets
  only keys that name one of its other parameters (positional-or-keyword or keyword-only), and
  any other key is refused, never dropped, so a dataset cannot add `shell=True` to a function
  that does not ask for extra keywords. Every such parameter without a default must be given.
  The same holds for each function member of an ensemble, which gets the same
  reward_func_args.

A function that raises, or returns anything but a dict of finite numbers with a `reward`,
stops the run with a `RewardError` naming the function and the sample: the jbejjani2022 fork
turned scorer failures into silent zero rewards, which ES would then happily optimise.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import math
import numbers
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from engine.rewards._allowed import (
    REWARD_MODULES_SETTING,
    folder_to_import_from,
    path_refusal,
)

RewardFunction = Callable[..., Mapping[str, Any]]

# Registry name -> dotted path of the built-in reward functions (the dashboard lists these).
BUILTIN_REWARDS: dict[str, str] = {
    "countdown": "engine.rewards.countdown.compute_score",
    "countdown_es_at_scale": "engine.rewards.countdown_es_at_scale.compute_score",
    "gsm8k": "engine.rewards.gsm8k.compute_score",
    "math_boxed": "engine.rewards.math_boxed.compute_score",
    "conciseness": "engine.rewards.conciseness.compute_score",
}

# Long completions and arguments are cut in error messages, which end up in the UI.
_EXCERPT_CHARS = 200

__all__ = [
    "BUILTIN_REWARDS",
    "REWARD_MODULES_SETTING",
    "RewardError",
    "RewardFunction",
    "argument_problem",
    "check_arguments",
    "function_path",
    "load_reward_function",
    "path_refusal",
    "score_completion",
]


class RewardError(Exception):
    """A reward function could not be loaded, failed, or returned an unusable score."""


def load_reward_function(dotted_path: str) -> RewardFunction:
    """The public function that `package.module.function` names, from an allowed place only.

    Raises RewardError naming the path: a path outside the allowed places (checked before any
    import), a module that does not import, or an attribute that is not a plain Python
    function defined by that module, or whose signature cannot take reward_func_args.
    """
    path = dotted_path.strip()
    problem = path_refusal(path)
    if problem is not None:
        raise RewardError(f"reward function {path!r} {problem}")
    module_name, _, attribute = path.rpartition(".")
    module = _import(path, module_name)
    function = getattr(module, attribute, None)
    if function is None:
        raise RewardError(
            f"reward function {path!r}: module {module_name!r} has no attribute {attribute!r}"
        )
    if not inspect.isfunction(function):
        raise RewardError(
            f"reward function {path!r} is a {type(function).__name__}, not a function "
            f"defined in module {module_name!r}"
        )
    if function.__module__ != module.__name__:
        raise RewardError(
            f"reward function {path!r} is defined in module "
            f"{public_module_name(function.__module__)!r}, not in "
            f"{module_name!r}: a reward function is named by the module that defines it, "
            "and only allowed modules are"
        )
    try:
        _parameters(function)
    except ValueError as exc:
        raise RewardError(f"reward function {path!r} {exc}") from None
    return function


def _import(path: str, module_name: str) -> ModuleType:
    folder = folder_to_import_from(module_name)
    try:
        if folder is None:
            return importlib.import_module(module_name)
        return _import_from_folder(module_name, folder)
    except ModuleNotFoundError as exc:
        # Distinguish a wrong path from a module that exists but imports something missing.
        if exc.name and (module_name + ".").startswith(exc.name + "."):
            raise RewardError(
                f"reward function {path!r}: no module named {module_name!r}; "
                f"built-in reward functions are {', '.join(BUILTIN_REWARDS.values())}"
            ) from exc
        raise RewardError(
            f"reward function {path!r}: importing {module_name!r} failed: {exc}"
        ) from exc
    except Exception as exc:
        raise RewardError(
            f"reward function {path!r}: importing {module_name!r} failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


FOLDER_NAMESPACE = "eslab_rewards"
"""The package under which the modules of listed folders are imported (a private name)."""


def _import_from_folder(module_name: str, folder: Path) -> ModuleType:
    """Import `module_name` from the files of `folder`, as
    `eslab_rewards.<folder's hash>.<module_name>`: never under its own name, and without the
    folder on sys.path, so a file `hmac.py` there is the reward module `hmac` and never
    stands for the standard `hmac` (for this process, or any import after it), and the
    standard one never stands for it. Its modules reach each other by relative imports
    (`from . import helpers`)."""
    package = _folder_package(folder)
    try:
        return importlib.import_module(f"{package}.{module_name}")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith(package + "."):  # said as the path names it
            name = exc.name.removeprefix(package + ".")
            raise ModuleNotFoundError(f"no module named {name!r} in {folder}", name=name) from exc
        raise


def _folder_package(folder: Path) -> str:
    """The name of the package whose __path__ is `folder` alone, created at first use."""
    digest = hashlib.sha256(str(folder).encode()).hexdigest()[:16]
    name = f"{FOLDER_NAMESPACE}.f{digest}"
    if name not in sys.modules:
        _package(FOLDER_NAMESPACE, [])
        setattr(sys.modules[FOLDER_NAMESPACE], f"f{digest}", _package(name, [str(folder)]))
    return name


def _package(name: str, path: list[str]) -> ModuleType:
    """sys.modules[name], made an empty package searching `path` when missing."""
    if name not in sys.modules:
        package = ModuleType(name, f"reward modules of {path[0] if path else 'listed folders'}")
        package.__path__ = path
        package.__package__ = name
        sys.modules[name] = package
    return sys.modules[name]


def public_module_name(module: str) -> str:
    """`module` as a path names it: a listed folder's module without its private package."""
    if module.startswith(FOLDER_NAMESPACE + "."):
        return module.split(".", 2)[2] if module.count(".") >= 2 else module
    return module


@dataclass(frozen=True)
class _Parameters:
    """The names reward_func_args may give a function, and those it must give."""

    named: frozenset[str]
    required: frozenset[str]
    completion: str | None
    """The completion text's parameter, when a keyword could also give it (not positional-only)."""
    any_keyword: bool
    """The function takes `**kwargs`: keys it does not name go there."""


_BY_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


@functools.lru_cache(maxsize=256)
def _parameters(func: Callable[..., Any]) -> _Parameters:
    """Raises ValueError (a phrase that follows the function's name) when `func` cannot be
    called as func(completion_text, **reward_func_args). Cached: scoring asks per sample."""
    try:
        parameters = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError) as exc:
        raise ValueError(f"has no signature to check reward_func_args against ({exc})") from None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if not parameters or parameters[0].kind not in positional:
        raise ValueError("must take the completion text as its first, positional parameter")
    rest = parameters[1:]
    unfillable = [
        p.name for p in rest if p.kind is inspect.Parameter.POSITIONAL_ONLY and p.default is p.empty
    ]
    if unfillable:
        raise ValueError(
            f"has positional-only parameters {unfillable} that reward_func_args cannot give"
        )
    by_keyword = [p for p in rest if p.kind in _BY_KEYWORD]
    first = parameters[0]
    return _Parameters(
        named=frozenset(p.name for p in by_keyword),
        required=frozenset(p.name for p in by_keyword if p.default is p.empty),
        completion=first.name if first.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD else None,
        any_keyword=any(p.kind is inspect.Parameter.VAR_KEYWORD for p in rest),
    )


def argument_problem(func: Callable[..., Any], reward_func_args: Mapping[str, Any]) -> str | None:
    """Why `func(completion_text, **reward_func_args)` breaks the rule of this module's
    docstring (a phrase that follows the function's name), or None."""
    try:
        parameters = _parameters(func)
    except ValueError as exc:
        return str(exc)
    given = set(reward_func_args)
    if parameters.completion in given:
        return (
            f"is given reward_func_args [{parameters.completion!r}], the name of its "
            "parameter that takes the completion text"
        )
    unknown = [] if parameters.any_keyword else sorted(map(str, given - parameters.named))
    if unknown:
        names = ", ".join(sorted(parameters.named)) or "none"
        return (
            f"is given reward_func_args {unknown} that are not its parameters (its "
            f"parameters: {names}); a function without **kwargs gets only the arguments "
            "its signature names"
        )
    missing = sorted(parameters.required - given)
    if missing:
        return f"needs reward_func_args {missing}, which are missing"
    return None


def check_arguments(
    path: str, func: RewardFunction, rows: Iterable[Mapping[str, Any]], where: str
) -> None:
    """RewardError at the first of `rows` (the reward_func_args of each row of `where`, a
    dataset) that `func` may not be called with: a run is refused before it starts."""
    for row, reward_func_args in enumerate(rows):
        problem = argument_problem(func, reward_func_args)
        if problem is not None:
            raise RewardError(f"reward function {path} {problem}: {where}, row {row}")


def function_path(func: Callable[..., Any]) -> str:
    """The dotted path that names `func` in messages."""
    module = public_module_name(getattr(func, "__module__", None) or "?")
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

    Raises RewardError naming the function and `sample_description` when reward_func_args
    break the rule of this module's docstring (the function is then not called), or the
    function raises, returns a non-dict, has no `reward`, or returns a value that is not a
    finite number.
    """

    def error(problem: str) -> RewardError:
        return RewardError(
            f"reward function {function_path(func)} {problem} on {sample_description} "
            f"(completion {_excerpt(completion_text)}, "
            f"reward_func_args {_excerpt(dict(reward_func_args))})"
        )

    problem = argument_problem(func, reward_func_args)
    if problem is not None:
        raise error(problem)
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
