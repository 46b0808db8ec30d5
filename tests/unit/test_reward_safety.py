"""No code from a form or a YAML file: a path that names code resolves only to a reward
function in an allowed place (engine.rewards, ESLAB_REWARD_MODULES), checked before anything
is imported, and a reward function gets only the reward_func_args its signature names."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.backends.base import Completion
from engine.config import ConfigError, RunConfig
from engine.data.datasets import Example, write_dataset
from engine.rewards import (
    REWARD_MODULES_SETTING,
    RewardError,
    function_path,
    load_reward_function,
    score_completion,
)
from engine.rewards._allowed import AllowList, SettingError
from engine.scoring.batch import score_batch
from engine.trainer import plan_total_steps
from jobs.planning import plan_run

CONCISE = "engine.rewards.conciseness.compute_score"
ROOT = Path(__file__).resolve().parents[2]

# What a form or a YAML file may write, and the message each gets, at validation and at load.
REFUSED = [
    ("os.system", "is not in an allowed place", "add 'os' (or the folder"),
    ("subprocess.run", "is not in an allowed place", "add 'subprocess'"),
    ("builtins.exec", "is not in an allowed place", "add 'builtins'"),
    ("pydoc.pipepager", "is not in an allowed place", "add 'pydoc'"),
    ("posix.system", "is not in an allowed place", "add 'posix'"),
    (
        "engine.rewards.os.system",
        "is not a built-in reward function",
        "engine.rewards has no module 'engine.rewards.os'",
    ),
    (
        "engine.rewards.countdown.re.compile",
        "is not a built-in reward function",
        "has no module 'engine.rewards.countdown.re'",
    ),
    (
        "engine.rewards.load_reward_function",
        "names ES Lab's reward loader, not a reward function",
        "in the modules under engine.rewards",
    ),
    ("engine.rewards._allowed.path_refusal", "names a private module or function", "'_'"),
    ("builtins.__import__", "names a private module or function", "not a reward function"),
    ("engine.rewards.countdown._evaluate", "names a private module or function", "'_'"),
    (".countdown.compute_score", "must be a dotted path module.function", "e.g. engine.rewards"),
    ("engine/rewards/countdown.compute_score", "must be a dotted path", "module.function"),
    ("os:system", "must be a dotted path", "module.function"),
]


@pytest.fixture
def no_setting(monkeypatch):
    """The default: no operator setting (the test session allows `tests`, conftest.py)."""
    monkeypatch.delenv(REWARD_MODULES_SETTING, raising=False)


def config(**options) -> RunConfig:
    return RunConfig.from_flat({"train_file": "t.parquet", "output_dir": "data/runs/o", **options})


def errors_of(**options) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        config(**options)
    return {e.field: e.message for e in info.value.errors}


@pytest.mark.parametrize(("path", "message", "hint"), REFUSED)
def test_validation_refuses_code_outside_the_allowed_places(no_setting, path, message, hint):
    errors = errors_of(reward_func_path=path)
    assert list(errors) == ["reward_func_path"]
    text = errors["reward_func_path"]
    assert text.startswith(f"reward.reward_func_path {path!r} ")
    assert message in text and hint in text
    if "allowed place" in message:
        assert text.endswith("to ESLAB_REWARD_MODULES")


@pytest.mark.parametrize(("path", "message", "hint"), REFUSED)
def test_ensemble_members_are_refused_alike(no_setting, path, message, hint):
    errors = errors_of(
        reward_source="ensemble", reward_func_path=None, ensemble_members=f"{CONCISE}, {path}"
    )
    assert list(errors) == ["ensemble_members"]
    assert errors["ensemble_members"].startswith(f"ensemble.ensemble_members: {path!r} ")
    assert message in errors["ensemble_members"] and hint in errors["ensemble_members"]


@pytest.mark.parametrize(("path", "message", "hint"), REFUSED)
def test_the_loader_refuses_them_too(no_setting, path, message, hint):
    with pytest.raises(RewardError) as info:
        load_reward_function(path)
    assert f"reward function {path!r}" in str(info.value)
    assert message in str(info.value) and hint in str(info.value)


def test_builtin_reward_functions_need_no_setting(no_setting):
    assert config(reward_func_path=CONCISE).reward.reward_func_path == CONCISE
    assert callable(load_reward_function(CONCISE))


# --- nothing is imported to validate ----------------------------------------------------


@pytest.fixture
def noisy_module(tmp_path, monkeypatch) -> Path:
    """A module on sys.path whose import leaves a mark: importing it is running code."""
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "noisy_reward.py").write_text(
        "from pathlib import Path\n"
        f"Path({str(tmp_path / 'imported')!r}).touch()\n"
        "def compute_score(completion_text):\n"
        "    return {'reward': 1.0}\n"
    )
    monkeypatch.syspath_prepend(str(folder))
    yield tmp_path / "imported"
    sys.modules.pop("noisy_reward", None)


def test_a_path_outside_the_allow_list_is_never_imported(no_setting, noisy_module):
    error = errors_of(reward_func_path="noisy_reward.compute_score")["reward_func_path"]
    assert "is not in an allowed place" in error
    with pytest.raises(RewardError, match="is not in an allowed place"):
        load_reward_function("noisy_reward.compute_score")
    assert not noisy_module.exists() and "noisy_reward" not in sys.modules


def test_validation_imports_nothing_even_when_the_module_is_allowed(monkeypatch, noisy_module):
    monkeypatch.setenv(REWARD_MODULES_SETTING, "noisy_reward")
    config(reward_func_path="noisy_reward.compute_score")
    assert not noisy_module.exists()
    func = load_reward_function("noisy_reward.compute_score")  # the run's own import
    assert noisy_module.exists() and func("x") == {"reward": 1.0}


# --- after import: a plain Python function that the allowed module defines ----------------

TRICKS = """
from os import system
from subprocess import run
from engine.rewards.countdown import compute_score

class Scorer:
    def __call__(self, completion_text):
        return {"reward": 0.0}

scorer = Scorer()
LIMIT = 3

def no_text():
    return {"reward": 0.0}

def keyword_text(*, completion_text):
    return {"reward": 0.0}

def length(completion_text, *, target):
    return {"reward": float(len(completion_text))}
"""


@pytest.fixture
def lab_folder(tmp_path, monkeypatch) -> Path:
    """An operator's folder of reward modules, listed by its path."""
    folder = tmp_path / "lab"
    folder.mkdir()
    (folder / "labrewards.py").write_text(TRICKS)
    monkeypatch.setenv(REWARD_MODULES_SETTING, f"mylab.rewards,{folder}")
    yield folder
    sys.modules.pop("labrewards", None)


@pytest.mark.parametrize(
    ("attribute", "message"),
    [
        ("system", "is a builtin_function_or_method, not a function defined in module"),
        ("run", "is defined in module 'subprocess', not in 'labrewards'"),
        ("compute_score", "is defined in module 'engine.rewards.countdown', not in 'labrewards'"),
        ("Scorer", "is a type, not a function defined in module 'labrewards'"),
        ("scorer", "is a Scorer, not a function"),
        ("LIMIT", "is a int, not a function"),
        ("no_text", "must take the completion text as its first, positional parameter"),
        ("keyword_text", "must take the completion text as its first, positional parameter"),
    ],
)
def test_only_functions_the_allowed_module_defines_load(lab_folder, attribute, message):
    path = f"labrewards.{attribute}"
    config(reward_func_path=path)  # as text, the path is in an allowed place
    with pytest.raises(RewardError) as info:
        load_reward_function(path)
    assert f"reward function {path!r} {message}" in str(info.value)


def test_a_listed_folder_is_imported_from_that_folder_only(lab_folder, tmp_path):
    func = load_reward_function("labrewards.length")
    assert Path(func.__code__.co_filename) == lab_folder / "labrewards.py"
    assert func("abc", target="x") == {"reward": 3.0}
    # a file named like a module that is already imported elsewhere cannot stand for it,
    # nor the other way round: each is itself
    (lab_folder / "json.py").write_text("def compute_score(completion_text):\n    return {}\n")
    func = load_reward_function("json.compute_score")
    assert Path(func.__code__.co_filename) == lab_folder / "json.py"
    assert function_path(func) == "json.compute_score"
    assert sys.modules["json"].__file__ != str(lab_folder / "json.py")


SHADOW = """
def compute_score(completion_text):
    return {"reward": 1.0}

def compare_digest(a, b):  # a standard function's name, answering "equal" to anything
    return True
"""


def test_a_folder_file_named_like_a_standard_module_never_replaces_it(tmp_path):
    """`hmac.py` in a listed folder is the reward module `hmac`; the process's `hmac`, loaded
    before or after it, is still the standard one (a fresh process: nothing imported yet)."""
    (tmp_path / "hmac.py").write_text(SHADOW)
    check = (
        "from engine.rewards import load_reward_function\n"
        "func = load_reward_function('hmac.compute_score')\n"
        "assert func('x') == {'reward': 1.0}\n"
        "import hmac\n"
        "print(hmac.__file__, hmac.compare_digest(b'a', b'b'))\n"
    )
    env = {**os.environ, REWARD_MODULES_SETTING: str(tmp_path), "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    where, equal = result.stdout.split()
    assert Path(where).parent != tmp_path and equal == "False"


def test_a_folder_modules_reach_each_other_by_relative_imports(tmp_path, monkeypatch):
    (tmp_path / "helpers.py").write_text("BONUS = 2.0\n")
    (tmp_path / "mine.py").write_text(
        "from . import helpers\n\n"
        "def compute_score(completion_text):\n"
        "    return {'reward': helpers.BONUS}\n"
    )
    monkeypatch.setenv(REWARD_MODULES_SETTING, str(tmp_path))
    assert load_reward_function("mine.compute_score")("x") == {"reward": 2.0}
    assert "mine" not in sys.modules and "helpers" not in sys.modules


# --- the setting ------------------------------------------------------------------------


def test_the_setting_takes_modules_and_absolute_folders(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "rewards").mkdir()
    value = f" mylab.rewards , tests.jobs.standin,,{os.pathsep}~/rewards{os.pathsep}{tmp_path} "
    allowed = AllowList.parse(value)
    assert allowed.modules == ("mylab.rewards", "tests.jobs.standin")
    assert allowed.folders == (tmp_path / "rewards", tmp_path)
    assert allowed.lists_module("mylab.rewards") and allowed.lists_module("mylab.rewards.x")
    assert not allowed.lists_module("mylab") and not allowed.lists_module("mylab.rewardsx")
    assert AllowList.parse("") == AllowList()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("rewards/mine", "entry 'rewards/mine' is neither a dotted module name"),
        ("my-lab", "entry 'my-lab' is neither a dotted module name"),
        ("/no/such/folder", "entry '/no/such/folder' is not an existing folder"),
    ],
)
def test_a_bad_setting_is_named_where_it_matters(monkeypatch, value, message):
    with pytest.raises(SettingError, match=message):
        AllowList.parse(value)
    monkeypatch.setenv(REWARD_MODULES_SETTING, value)
    error = errors_of(reward_func_path="mylab.rewards.compute_score")["reward_func_path"]
    assert f"is not a built-in reward function, and ESLAB_REWARD_MODULES {message}" in error
    assert config(reward_func_path=CONCISE)  # the built-ins do not depend on it


# --- a reward function gets the arguments its signature takes ------------------------------


def run_command(completion_text: str, *, target: str, check: bool = False) -> dict:
    """A reward function that would run its completion as a command with `shell=True`."""
    import subprocess

    subprocess.run(completion_text, check=check)
    return {"reward": 0.0}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            {"target": "x", "shell": True},
            "is given reward_func_args ['shell'] that are not its parameters (its "
            "parameters: check, target); a function without **kwargs gets only the arguments "
            "its signature names",
        ),
        (
            {"target": "x", "completion_text": "y"},
            "is given reward_func_args ['completion_text'], the name of its parameter that "
            "takes the completion text",
        ),
        ({}, "needs reward_func_args ['target'], which are missing"),
    ],
)
def test_reward_func_args_must_be_parameters_of_the_function(tmp_path, args, message):
    marker = tmp_path / "ran"
    with pytest.raises(RewardError) as info:
        score_completion(run_command, f"touch {marker}", args, sample_description="row 0")
    assert str(info.value).startswith(f"reward function {__name__}.run_command {message}")
    assert "on row 0" in str(info.value)
    assert not marker.exists()  # refused before the call


def test_shell_true_in_a_dataset_is_refused_while_scoring(tmp_path):
    marker = tmp_path / "ran"
    outputs = [[Completion(f"touch {marker}", 2, True)]]
    with pytest.raises(RewardError, match=r"reward_func_args \['shell'\] that are not"):
        score_batch(outputs, [{"target": "x", "shell": True}], f"{__name__}.run_command", "t")
    assert not marker.exists()


def test_a_dataset_whose_args_the_function_does_not_name_is_refused_at_planning(tmp_path):
    train = write_dataset(
        [
            Example([{"role": "user", "content": "q"}], {"target": "ok"}),
            Example([{"role": "user", "content": "q"}], {"target": "ok", "shell": True}),
        ],
        tmp_path / "train.parquet",
    )
    run = config(train_file=str(train), reward_func_path=CONCISE, model="some-org/some-model")
    with pytest.raises(RewardError) as info:
        plan_total_steps(run)
    assert str(info.value) == (
        f"reward function {CONCISE} is given reward_func_args ['shell'] that are not its "
        "parameters (its parameters: target); a function without **kwargs gets only the "
        f"arguments its signature names: data.train_file {train}, row 1"
    )


# nlp-waseda/lbes's README documents a reward function as
# `compute_score(completion_text: str, **kwargs) -> dict[str, float]`, its reward_func_args
# passed through **kwargs.
LBES_DOCUMENTED = """
def compute_score(completion_text: str, **kwargs) -> dict[str, float]:
    hit = float(completion_text.strip() == str(kwargs["target"]))
    return {"reward": hit, "given": float(len(kwargs))}
"""


@pytest.fixture
def lbes_module(tmp_path, monkeypatch) -> str:
    """A reward module of that shape in an operator's folder, allowed by its path."""
    folder = tmp_path / "rewards"
    folder.mkdir()
    (folder / "mine.py").write_text(LBES_DOCUMENTED)
    monkeypatch.setenv(REWARD_MODULES_SETTING, str(folder))
    return "mine.compute_score"


def test_a_function_with_kwargs_gets_every_key_when_planned_and_scored(tmp_path, lbes_module):
    args = [{"target": "7", "numbers": [3, 4]}, {"target": "12", "numbers": [3, 4]}]
    train = write_dataset(
        [Example([{"role": "user", "content": "q"}], a) for a in args], tmp_path / "train.parquet"
    )
    run = config(train_file=str(train), reward_func_path=lbes_module, model="some-org/some-model")
    # jobs.planning.plan_run: the checks of the New run form and `eslab submit` (jobs.launch)
    assert plan_run(run, name="lbes-kwargs").total_steps == plan_total_steps(run)
    outputs = [[Completion("7", 1, True), Completion("8", 1, True)]] * 2
    scored = score_batch(outputs, args, lbes_module, "step 0")
    assert scored.rewards.tolist() == [[1.0, 0.0], [0.0, 0.0]]
    assert scored.parts["given"].tolist() == [[2.0, 2.0], [2.0, 2.0]]


def test_a_function_with_kwargs_is_still_refused_its_completion_parameter(lbes_module):
    func = load_reward_function(lbes_module)
    with pytest.raises(RewardError) as info:
        score_completion(
            func, "7", {"target": "7", "completion_text": "8"}, sample_description="row 3"
        )
    assert str(info.value).startswith(
        "reward function mine.compute_score is given reward_func_args ['completion_text'], "
        "the name of its parameter that takes the completion text on row 3"
    )
