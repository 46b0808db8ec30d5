"""Options of the references that ES Lab follows: save_best_model, report_to (TensorBoard event
files read back with TensorBoard's own reader; W&B around a stand-in module, since the package
is an optional extra) and ES at Scale's learning rate rule. The runs use the toy engine of
test_trainer.py; the trainer, checkpoints and sinks are the real ones."""

from __future__ import annotations

import json
import sys
import types

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


class StandInWandb(types.ModuleType):
    """What WandbSink calls of the wandb package: init, then log and finish on the run."""

    def __init__(self) -> None:
        super().__init__("wandb")
        self.init_kwargs: dict = {}
        self.logged: list[tuple[dict, int]] = []
        self.finished = False

    def init(self, **kwargs):
        self.init_kwargs = kwargs
        return self

    def log(self, data: dict, step: int) -> None:
        self.logged.append((data, step))

    def finish(self) -> None:
        self.finished = True


def test_wandb_gets_every_step_at_its_step_and_is_finished(
    dataset,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    wandb = StandInWandb()
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    monkeypatch.setenv("WANDB_PROJECT", "countdown")
    sink = MemorySink()
    config = make_config(dataset, tmp_path, report_to="wandb", run_name="tiny")
    train(config, sink, pool=ToyPool())
    assert wandb.init_kwargs == {
        "project": "countdown",
        "name": "tiny",
        "dir": str(tmp_path / "out"),
        "config": config.to_flat(),
    }
    assert [(s.metrics, s.step) for s in sink.steps] == wandb.logged
    assert wandb.finished


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
