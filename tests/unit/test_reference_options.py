"""Options of the references that ES Lab follows: save_best_model, report_to (TensorBoard event
files and W&B's offline run log, each read back with its library's own reader) and ES at
Scale's learning rate rule. The runs use the toy engine of test_trainer.py; the trainer,
checkpoints and sinks are the real ones."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from engine import metrics as mk
from engine.config import ConfigError
from engine.es import update_coefficients
from engine.extras import MissingExtra
from engine.sink import MemorySink, StepReport
from engine.trainer import list_checkpoints, train
from engine.trainer.checkpoints import Checkpoints, TrainerState, best_checkpoint
from engine.trainer.loop import current_schedules
from tests.unit.test_trainer import ToyPool, dataset, make_config  # noqa: F401 (a fixture)

EVAL_REWARD = mk.reward_key(mk.EVAL)


# -- save_best_model


def test_the_best_evaluation_is_saved_kept_and_named(dataset, tmp_path):  # noqa: F811
    sink = MemorySink()
    config = make_config(
        dataset,
        tmp_path,
        save_best_model=True,
        save_strategy="steps",
        save_steps=1,
        save_total_limit=1,
    )
    train(config, sink, pool=ToyPool())
    evals = sink.series(EVAL_REWARD)
    assert evals == [(0, -18.0), (5, -2.0), (10, -2.0)]  # a tie keeps the earlier best
    out = tmp_path / "out"
    assert [p.name for p in list_checkpoints(out)] == ["checkpoint-5", "checkpoint-10"]
    assert best_checkpoint(out) == out / "checkpoint-5"
    state = json.loads((out / "checkpoint-10" / "trainer_state.json").read_text())
    assert (state["best_step"], state["best_metric"]) == (5, -2.0)
    messages = [m for _, m in sink.events if m.startswith("best model so far")]
    assert messages == [
        f"best model so far: checkpoint-0, {EVAL_REWARD} -18 (the first evaluation)",
        f"best model so far: checkpoint-5, {EVAL_REWARD} -2 (previous best -18 at step 0)",
    ]
    assert [s for s, _ in sink.checkpoints] == list(range(11))  # the best one saved once


def evaluation(step: int, value: float) -> StepReport:
    return StepReport(step=step, metrics={EVAL_REWARD: value})


def test_a_worse_evaluation_keeps_the_earlier_best_past_save_total_limit(dataset, tmp_path):  # noqa: F811
    config = make_config(dataset, tmp_path, save_best_model=True, save_total_limit=1)
    out = tmp_path / "out"
    out.mkdir(parents=True)
    sink = MemorySink()
    checkpoints = Checkpoints(config, ToyPool(), out, None, sink)
    checkpoints.keep_if_best(TrainerState(0), evaluation(0, -18.0))
    checkpoints.keep_if_best(TrainerState(5), evaluation(5, -10.0))
    checkpoints.keep_if_best(TrainerState(10), evaluation(10, -12.0))  # worse: nothing saved
    checkpoints.keep_if_best(TrainerState(11), evaluation(11, -10.0))  # a tie keeps the earlier
    checkpoints.save(TrainerState(12))
    checkpoints.save(TrainerState(13))
    assert [p.name for p in list_checkpoints(out)] == ["checkpoint-5", "checkpoint-13"]
    assert best_checkpoint(out) == out / "checkpoint-5"

    resumed = Checkpoints(config, ToyPool(), out, None, MemorySink())
    resumed.resume(out / "checkpoint-13")
    resumed.keep_if_best(TrainerState(14), evaluation(14, -11.0))  # worse than step 5's
    assert best_checkpoint(out) == out / "checkpoint-5"
    resumed.keep_if_best(TrainerState(15), evaluation(15, -1.0))
    assert best_checkpoint(out) == out / "checkpoint-15"


def test_save_best_model_needs_evaluations(dataset, tmp_path):  # noqa: F811
    with pytest.raises(ConfigError, match=r"eval\.save_best_model needs evaluations"):
        make_config(dataset, tmp_path, save_best_model=True, eval_strategy="no")


# -- report_to


def test_tensorboard_event_files_hold_every_metric(dataset, tmp_path):  # noqa: F811
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = MemorySink()
    train(make_config(dataset, tmp_path, report_to="tensorboard"), sink, pool=ToyPool())
    events = EventAccumulator(
        str(tmp_path / "out" / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0}
    )
    events.Reload()
    tags = events.Tags()
    for key in (mk.reward_key(mk.TRAIN), EVAL_REWARD, mk.LEARNING_RATE):
        written = events.Scalars(key)
        assert [e.step for e in written] == [s for s, _ in sink.series(key)]
        assert [e.value for e in written] == pytest.approx([v for _, v in sink.series(key)])
    assert [e.step for e in events.Histograms("train/population/fitness")] == list(range(1, 11))
    assert {"config/text_summary", "events/text_summary"} <= set(tags["tensors"])


def test_report_to_is_validated(dataset, tmp_path):  # noqa: F811
    for bad, message in (
        ("mlflow", "logging.report_to names 'mlflow', which is not a tracker"),
        ("wandb,wandb", "logging.report_to names a tracker twice"),
    ):
        with pytest.raises(ConfigError, match=message):
            make_config(dataset, tmp_path, report_to=bad)
    assert make_config(dataset, tmp_path, report_to="none").logging.report_to is None


def test_reference_key_names_overlay_es_at_scales_charts(dataset, tmp_path):  # noqa: F811
    """With report_key_names reference an ES run's event files hold ES at Scale's keys with
    its meanings: `train/reward/std` is the spread of the members' mean rewards (ES Lab's
    `train/population_reward/std`), ES Lab's spread of every sample moves to
    `eslab/train/reward/std`, sigma and alpha get its names; the store keeps ES Lab's."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = MemorySink()
    config = make_config(
        dataset,
        tmp_path,
        report_to="tensorboard",
        report_key_names="reference",
        max_steps=3,
    )
    train(config, sink, pool=ToyPool())
    events = EventAccumulator(str(tmp_path / "out" / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()

    def written(key: str) -> list[float]:
        return [e.value for e in events.Scalars(key)]

    def stored(key: str) -> list[float]:
        return [v for _, v in sink.series(key)]

    spread = mk.reward_key(mk.TRAIN, mk.POPULATION_REWARD, "std")
    sample_spread = mk.reward_key(mk.TRAIN, "reward", "std")
    assert written("train/reward/std") == pytest.approx(stored(spread))
    assert written("eslab/train/reward/std") == pytest.approx(stored(sample_spread))
    assert written("train/es/sigma") == pytest.approx(stored(mk.NOISE_STD))
    assert written("train/es/alpha") == pytest.approx(stored(mk.LEARNING_RATE))
    assert written("train/es/population") == [config.es.population_size] * 3
    assert written("global_step") == [1, 2, 3]
    assert all("train/es/sigma" not in r.metrics for r in sink.steps)  # the store: ES Lab's


def test_reference_key_names_of_the_alignment_fork_and_lbes():
    from engine.reporters.reference_keys import (
        ALIGNMENT_FORK,
        ES_AT_SCALE,
        reference_metrics,
    )

    step = {
        mk.NOISE_STD: 0.01,
        mk.LAMBDA: 1.0,
        mk.LAMBDA_NEXT: 1.5,
        mk.JC: 0.0,
        mk.JC_RAW: -0.2,
        mk.JC_SMOOTHED: 0.0,
        mk.COST_THRESHOLD: 0.2,
        mk.reward_key(mk.TRAIN, "objective", "max"): 3.0,
    }
    written = reference_metrics(step, 4, ALIGNMENT_FORK, config=None)
    assert written["lambda/value"] == 1.5 and written["lambda/J_C_raw"] == -0.2
    assert written["lambda/J_C"] == 0.0 and written["lambda/d"] == 0.2
    assert written["combined/max"] == 3.0
    assert not any(k.startswith("eslab/") for k in written)  # no clash with the fork's names
    assert {k: written[k] for k in step} == step
    # every key a reference maps from is one ES Lab defines
    for reference in (ES_AT_SCALE, ALIGNMENT_FORK):
        assert all(mk.is_known_key(ours) for ours in reference.keys.values()), reference.name


def test_reference_key_names_need_a_tracker(dataset, tmp_path):  # noqa: F811
    with pytest.raises(ConfigError, match="report_key_names 'reference' names keys for the"):
        make_config(dataset, tmp_path, report_key_names="reference")


def test_wandb_writes_every_step_offline_where_wandb_reads_it_back(
    dataset,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """The real wandb package, offline (no network here), through ES Lab's reporter; what it
    wrote is read back by W&B's own reader of a run's .wandb log (`wandb leet inspect`)."""
    pytest.importorskip("wandb", reason="wandb is not installed: the `wandb` extra (in `dev`)")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "countdown")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for setting in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(setting, str(tmp_path / "wandb-home"))
    sink = MemorySink()
    config = make_config(
        dataset, tmp_path, report_to="wandb", run_name="tiny", max_steps=5, logging_steps=2
    )
    train(config, sink, pool=ToyPool())

    (log,) = (tmp_path / "out" / "wandb").glob("offline-run-*/run-*.wandb")
    records = wandb_records(log)
    (run,) = [r["run"] for r in records if r["type"] == "run"]
    assert (run["project"], run["display_name"]) == ("countdown", "tiny")
    written_config = {k: v for k, v in run["config"]["update"].items() if k != "_wandb"}
    assert written_config == config.to_flat()
    history = {
        r["history"]["step"]["num"]: r["history"]["item"] for r in records if r["type"] == "history"
    }
    assert sorted(history) == [s.step for s in sink.steps] == [0, 2, 4, 5]  # each at its step
    for report in sink.steps:
        written = {k: v for k, v in history[report.step].items() if not k.startswith("_")}
        assert written == pytest.approx(report.metrics, nan_ok=True)
    assert {mk.reward_key(mk.TRAIN), EVAL_REWARD, mk.LEARNING_RATE} <= set(history[5])
    assert [r["exit"]["exit_code"] for r in records if r["type"] == "exit"] == [0]  # finished


def wandb_records(log) -> list[dict]:
    """The records of a .wandb log as W&B's command line prints them, one JSON object a line."""
    printed = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(log)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return [json.loads(line) for line in printed.splitlines() if line.startswith("{")]


def test_a_missing_tracker_library_fails_before_training_naming_the_extra(
    dataset,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    monkeypatch.setitem(sys.modules, "wandb", None)  # an import of it raises ImportError
    sink = MemorySink()
    config = make_config(dataset, tmp_path, report_to="tensorboard,wandb")
    with pytest.raises(MissingExtra, match=r"report_to: wandb needs the `wandb` extra"):
        train(config, sink, pool=ToyPool())
    assert sink.steps == []


# -- ES at Scale's learning rate rule


def test_es_at_scales_rule_takes_the_step_of_its_alpha_of_half_sigma(dataset, tmp_path):  # noqa: F811
    sigma, population = 0.002, 30
    config = make_config(
        dataset,
        tmp_path,
        learning_rate=5e-7,  # the default: not read under the rule
        learning_rate_rule="es_at_scale",
        noise_std=sigma,
        population_size=population,
    )
    noise_std, learning_rate = current_schedules(config, 0, 10)
    assert (noise_std, learning_rate) == (sigma, pytest.approx(2e-6))
    # VsonicV/es-at-scale: alpha = sigma / 2, theta += alpha / N * sum_i z_i * eps_i
    z = np.random.default_rng(0).standard_normal(population)
    reference = (sigma / 2) / population * z
    ours = update_coefficients(z, [1] * population, learning_rate, noise_std)
    assert ours == pytest.approx(reference, rel=1e-12)
    sink = MemorySink()
    train(config.with_overrides(["max_steps=2"]), sink, pool=ToyPool())
    assert [s for s, _ in sink.series(mk.LEARNING_RATE)] == [1, 2]
    assert [v for _, v in sink.series(mk.LEARNING_RATE)] == pytest.approx([2e-6, 2e-6])
    assert current_schedules(make_config(dataset, tmp_path), 0, 10)[1] == 0.02  # fixed
    with pytest.raises(ConfigError, match=r"es\.learning_rate is not read when learning_rate_rule"):
        make_config(dataset, tmp_path, learning_rate_rule="es_at_scale")
