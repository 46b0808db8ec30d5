"""reward_timeout_seconds: a reward function that hangs stops the run with an error naming the
function and the sample; the child process that ran it is killed, and the next batch gets a
fresh one. Real subprocesses; the reward functions below are the slow parts."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from engine.backends.base import Completion
from engine.config import ConfigError, RunConfig
from engine.rewards import RewardError
from engine.scoring import reward_process
from engine.scoring.batch import score_batch
from engine.scoring.reward_process import RewardLimit, RewardTimeout

HERE = __name__


def sleepy(completion: str, seconds: float) -> dict:
    """Sleeps `seconds` when the completion says "hang"; prints, to prove stdout is safe."""
    print("a reward function that prints")
    if completion == "hang":
        time.sleep(seconds)
    return {"reward": float(len(completion)), "format": 0.5}


def spin(completion: str) -> dict:
    """Hangs in a loop no signal handler of the trainer's could rely on reaching."""
    while completion == "hang":
        pass
    return {"reward": 1.0}


def crash(completion: str) -> dict:
    os._exit(3)


def broken(completion: str) -> dict:
    raise ValueError("bad input")


def completions(*texts: str) -> list[list[Completion]]:
    return [[Completion(t, 1, True)] for t in texts]


def test_a_hanging_reward_stops_with_the_sample_named_and_the_child_killed():
    started = time.monotonic()
    with pytest.raises(RewardTimeout) as info:
        score_batch(
            completions("ok", "hang"),
            [{}, {}],
            f"{HERE}.spin",
            "step 3, member 1",
            limit=RewardLimit(0.5),
        )
    assert time.monotonic() - started < 5
    message = str(info.value)
    assert f"reward function {HERE}.spin ran longer than reward_timeout_seconds (0.5 s)" in message
    assert "step 3, member 1, prompt 1 sample 0" in message
    assert "'hang'" in message
    assert reward_process._process is not None and not reward_process._process.alive


def test_scores_match_the_in_process_path_and_a_fresh_child_follows_a_timeout():
    with pytest.raises(RewardTimeout):
        score_batch(
            completions("hang"), [{"seconds": 30}], f"{HERE}.sleepy", "d", limit=RewardLimit(0.3)
        )
    outputs = completions("a", "bbb", "hang")
    args = [{"seconds": 0.0}] * 3
    timed = score_batch(outputs, args, f"{HERE}.sleepy", "d", limit=RewardLimit(5))
    plain = score_batch(outputs, args, f"{HERE}.sleepy", "d")
    assert timed.rewards.tolist() == plain.rewards.tolist() == [[1.0], [3.0], [4.0]]
    assert timed.parts["format"].tolist() == plain.parts["format"].tolist()


def test_a_failing_reward_keeps_its_message_and_a_dying_one_is_named():
    with pytest.raises(RewardError, match=r"broken raised ValueError: bad input on d, prompt 0"):
        score_batch(completions("x"), [{}], f"{HERE}.broken", "d", limit=RewardLimit(5))
    with pytest.raises(RewardError, match=r"exited with code 3 while scoring d, prompt 0"):
        score_batch(completions("x"), [{}], f"{HERE}.crash", "d", limit=RewardLimit(5))
    assert (
        score_batch(completions("x"), [{}], f"{HERE}.spin", "d", limit=RewardLimit(5)).fitness
        == 1.0
    )


def test_the_child_outlives_the_signals_that_ask_the_trainer_to_stop():
    assert (
        score_batch(completions("x"), [{}], f"{HERE}.spin", "d", limit=RewardLimit(5)).fitness
        == 1.0
    )
    child = reward_process._process
    assert child is not None
    for sig in (signal.SIGINT, signal.SIGTERM):  # a Ctrl-C, Ray's stop_job: the trainer's
        os.kill(child._proc.pid, sig)
    time.sleep(0.2)
    assert child.alive
    assert (
        score_batch(completions("x"), [{}], f"{HERE}.spin", "d", limit=RewardLimit(5)).fitness
        == 1.0
    )
    assert reward_process._process is child


def test_score_zero_scores_each_hanging_completion_0_and_keeps_every_other_score():
    """ES at Scale's choice: a completion past the limit scores 0 and the batch goes on; the
    scores before it survive the child that hung, and a fresh child scores the rest."""
    outputs = completions("a", "hang", "bbb", "hang", "cc")
    args = [{"seconds": 30.0}] * 5
    started = time.monotonic()
    batch = score_batch(outputs, args, f"{HERE}.sleepy", "d", RewardLimit(0.3, "score_zero"))
    assert time.monotonic() - started < 10  # two limits and two fresh children, not 60 s
    assert batch.rewards.reshape(-1).tolist() == [1.0, 0.0, 3.0, 0.0, 2.0]
    formats = batch.parts["format"].reshape(-1)
    assert formats[[0, 2, 4]].tolist() == [0.5] * 3 and np.isnan(formats[[1, 3]]).all()
    assert reward_process._process is not None and reward_process._process.alive


def test_the_timeout_action_is_an_option_of_two_values(tmp_path):
    base = {
        "train_file": "t.parquet",
        "output_dir": str(tmp_path / "out"),
        "reward_func_path": "engine.rewards.countdown.compute_score",
    }
    assert RunConfig.from_flat(base).reward.limit() == RewardLimit(10.0, "stop")
    zero = RunConfig.from_flat({**base, "reward_timeout_action": "score_zero"})
    assert zero.reward.limit() == RewardLimit(10.0, "score_zero")
    assert RunConfig.from_flat({**base, "reward_timeout_seconds": None}).reward.limit() is None
    with pytest.raises(ConfigError, match="reward_timeout_action must be one of stop, score_zero"):
        RunConfig.from_flat({**base, "reward_timeout_action": "zero"})


def test_the_option_defaults_to_the_reference_and_refuses_bad_values(tmp_path):
    base = {"train_file": "t.parquet", "output_dir": str(tmp_path / "out")}
    base["reward_func_path"] = "engine.rewards.countdown.compute_score"
    assert RunConfig.from_flat(base).reward.reward_timeout_seconds == 10.0
    assert (
        RunConfig.from_flat({**base, "reward_timeout_seconds": None}).reward.reward_timeout_seconds
        is None
    )
    for bad in ("0", "-1", "soon"):
        with pytest.raises(ConfigError, match="reward_timeout_seconds"):
            RunConfig.from_flat({**base, "reward_timeout_seconds": bad})


def hang_always(completion: str, target: str) -> dict:
    """Hangs on every completion: the run's first scoring call never returns by itself."""
    while True:
        pass


def test_a_training_run_with_a_hanging_reward_fails_naming_it(tmp_path):
    from engine.data.datasets import Example, write_dataset
    from engine.sink import MemorySink
    from engine.trainer import train
    from tests.unit.test_trainer import ToyPool, make_config

    rows = [Example([{"role": "user", "content": "q"}], {"target": "ok"})] * 4
    dataset = str(write_dataset(rows, tmp_path / "train.parquet"))
    config = make_config(
        dataset,
        tmp_path,
        reward_func_path=f"{HERE}.hang_always",
        reward_timeout_seconds=0.5,
        eval_strategy="no",
        eval_steps=None,
    )
    with pytest.raises(RewardTimeout, match=r"\(0\.5 s\) on step 1, prompt 0 sample 0"):
        train(config, MemorySink(), pool=ToyPool())
