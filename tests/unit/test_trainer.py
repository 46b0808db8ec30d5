"""The training loop's logic, around a toy engine (a vector of numbers whose first entry sets
the completion length). The real vLLM engine runs the same loop in
tests/integration/test_training.py; here the fake makes exact, fast checks possible."""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from engine import metrics as mk
from engine.backends.base import EvaluationStopped
from engine.config import RunConfig
from engine.data.datasets import Example, write_dataset
from engine.rewards import RewardError
from engine.sink import MemorySink
from engine.trainer import list_checkpoints, train

DIM = 4
TOY_X = 87  # the toy engine's one token: "x"
TOY_EOS = 2


@dataclass
class ToyCompletion:
    text: str
    num_tokens: int
    finished: bool
    token_ids: tuple[int, ...] = ()
    prompt_tokens: int = 3


class ToyEngine:
    def __init__(self) -> None:
        self.master = np.zeros(DIM)
        self.weights = self.master.copy()

    @staticmethod
    def eps(seed: int) -> np.ndarray:
        return np.random.default_rng(seed).standard_normal(DIM)

    def perturb(self, seed: int, scale: float) -> None:
        self.weights = self.master + scale * self.eps(seed)

    def restore(self) -> None:
        self.weights = self.master.copy()

    def update(self, seeds, coefficients) -> None:
        for seed, c in zip(seeds, coefficients, strict=True):
            self.master = self.master + c * self.eps(seed)
        self.weights = self.master.copy()

    def generate(self, prompts, *, n, temperature, max_tokens, seed):
        length = int(np.clip(round(20 + 100 * self.weights[0]), 0, max_tokens))
        completion = ToyCompletion("x" * length, length, length < max_tokens, (TOY_X,) * length)
        return [[completion] * n for _ in prompts]

    def completion_logprobs(self, prompts, completions):
        return [-len(c) * (1 + self.weights[1]) for c in completions]


class ToyPool:
    """The EnginePool interface over one ToyEngine."""

    def __init__(self) -> None:
        self.engine = ToyEngine()
        self.last_stats = {"perturb_s": 0.0, "restore_s": 0.0}

    def generate(self, prompts, **sampling):
        return self.engine.generate(prompts, **sampling)

    def evaluate(self, perturbations, task, stop=None):
        results = []
        for seed, scale in perturbations:
            if stop is not None and stop():
                self.engine.restore()
                raise EvaluationStopped("stopped")
            self.engine.perturb(seed, scale)
            results.append(task(self.engine))
            self.engine.restore()
        return results

    def update(self, seeds, coefficients) -> None:
        self.engine.update(seeds, coefficients)

    def save_hf(self, path: str) -> None:
        from pathlib import Path

        Path(path).mkdir(parents=True, exist_ok=True)
        np.save(Path(path) / "weights.npy", self.engine.master)

    def save_master(self, path: str) -> None:
        self.save_hf(path)

    def load_master(self, path: str) -> None:
        from pathlib import Path

        self.engine.master = np.load(Path(path) / "weights.npy")
        self.engine.weights = self.engine.master.copy()

    def shutdown(self) -> None:
        pass


def raising_reward(completion_text: str, target: str):
    raise ValueError("boom")


@pytest.fixture
def dataset(tmp_path):
    examples = [
        Example(
            prompt=[{"role": "user", "content": f"question {i}"}], reward_func_args={"target": "ok"}
        )
        for i in range(8)
    ]
    return str(write_dataset(examples, tmp_path / "train.parquet"))


def make_config(dataset, tmp_path, **options):
    base = {
        "method": "es",
        "train_file": dataset,
        "eval_file": dataset,
        "output_dir": str(tmp_path / "out"),
        "reward_func_path": "engine.rewards.conciseness.compute_score",
        "population_size": 8,
        "noise_std": 0.05,
        "learning_rate": 0.02,
        "data_batch_size": 4,
        "max_steps": 10,
        "max_tokens": 64,
        "eval_strategy": "steps",
        "eval_steps": 5,
    }
    return RunConfig.from_flat({**base, **options})


def test_es_on_the_toy_engine_raises_the_eval_reward(dataset, tmp_path):
    sink = MemorySink()
    train(make_config(dataset, tmp_path), sink, pool=ToyPool())
    evals = sink.series(mk.reward_key(mk.EVAL))
    assert [s for s, _ in evals] == [0, 5, 10]  # eval before training, then every 5 steps
    assert evals[0][1] == -18.0  # 20 characters against a 2-character target
    assert evals[-1][1] > evals[0][1] + 5
    assert [r.step for r in sink.steps if mk.NOISE_STD in r.metrics] == list(range(1, 11))
    step = next(r for r in sink.steps if r.step == 1 and r.population)
    assert len(step.population) == 8
    assert np.isclose(np.mean([p.shaped_fitness for p in step.population]), 0.0)
    assert (tmp_path / "out" / "weights.npy").is_file()  # the final model


def test_evaluations_run_every_eval_steps_and_at_the_last_step_whatever_logging_steps(
    dataset, tmp_path
):
    """As docs/algorithms.md ("When evaluation runs") says: step 0, every eval_steps-th
    step, and the last step; logging_steps thins the training metrics, never an evaluation."""
    sink = MemorySink()
    config = make_config(dataset, tmp_path, eval_steps=3, logging_steps=2)
    train(config, sink, pool=ToyPool())
    assert [s for s, _ in sink.series(mk.reward_key(mk.EVAL))] == [0, 3, 6, 9, 10]
    assert [s for s, _ in sink.series(mk.reward_key(mk.TRAIN))] == [2, 4, 6, 8, 10]
    (at_3,) = [r for r in sink.steps if r.step == 3]  # the evaluation's report alone
    assert not at_3.population and mk.NOISE_STD not in at_3.metrics


def test_resuming_from_a_checkpoint_gives_the_same_metrics(dataset, tmp_path):
    straight = MemorySink()
    train(
        make_config(dataset, tmp_path / "a", max_steps=6, save_strategy="steps", save_steps=3),
        straight,
        pool=ToyPool(),
    )

    first = MemorySink()
    config = make_config(dataset, tmp_path / "b", max_steps=6, save_strategy="steps", save_steps=3)
    train(config.with_overrides(["max_steps=3"]), first, pool=ToyPool())
    checkpoint = tmp_path / "b" / "out" / "checkpoint-3"
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == 3
    resumed = MemorySink()
    train(config, resumed, pool=ToyPool(), resume_from=checkpoint)

    key = mk.reward_key(mk.TRAIN)
    assert straight.series(key) == first.series(key) + resumed.series(key)
    assert straight.series(mk.reward_key(mk.EVAL))[-1] == resumed.series(mk.reward_key(mk.EVAL))[-1]


def test_save_total_limit_keeps_the_newest_checkpoints(dataset, tmp_path):
    sink = MemorySink()
    train(
        make_config(
            dataset, tmp_path, max_steps=5, save_strategy="steps", save_steps=1, save_total_limit=2
        ),
        sink,
        pool=ToyPool(),
    )
    assert [p.name for p in list_checkpoints(tmp_path / "out")] == ["checkpoint-4", "checkpoint-5"]
    assert [s for s, _ in sink.checkpoints] == [1, 2, 3, 4, 5]


class StoppedAtRecording(MemorySink):
    """A worker stopped while it records checkpoint 2 (the step's watchdog gave up on it)."""

    def log_checkpoint(self, step: int, path: str) -> None:
        if step == 2:
            raise SystemExit("stopped")
        super().log_checkpoint(step, path)


def test_a_recorded_checkpoint_is_never_rotated_away_before_its_successor_is_recorded(
    dataset, tmp_path
):
    """With one checkpoint kept, checkpoint 1 stays until checkpoint 2 is recorded: a resume
    from what the run recorded must find its files."""
    sink = StoppedAtRecording()
    config = make_config(
        dataset, tmp_path, max_steps=3, save_strategy="steps", save_steps=1, save_total_limit=1
    )
    with pytest.raises(SystemExit):
        train(config, sink, pool=ToyPool())
    (recorded,) = [path for _, path in sink.checkpoints]
    assert (Path(recorded) / "trainer_state.json").is_file()


def test_lbes_skips_steps_whose_samples_all_tie_and_gives_up_after_an_epoch(dataset, tmp_path):
    config = make_config(
        dataset,
        tmp_path,
        method="lbes",
        n=2,
        temperature=1.0,
        exclude_same_rewards_samples=True,
        eval_strategy="no",
    )
    sink = MemorySink()
    with pytest.raises(RuntimeError, match="whole epoch"):
        train(config, sink, pool=ToyPool())
    assert sink.steps == []  # no step advanced: every base sample had the same reward
    assert [level for level, _ in sink.events] == ["warning", "warning"]


def test_lbes_reports_every_base_sample_with_its_filter(dataset, tmp_path):
    config = make_config(
        dataset,
        tmp_path,
        method="lbes",
        n=2,
        temperature=1.0,
        eval_strategy="no",
        max_steps=1,
        flat_top_k_rewards=3,
    )
    sink = MemorySink()
    train(config, sink, pool=ToyPool())
    (report,) = sink.steps
    assert len(report.samples) == 4 * 2  # every base sample of the batch
    assert sum(s.kept for s in report.samples) == 3
    assert {s.dropped_by for s in report.samples if not s.kept} == {"flat_top_k_rewards"}
    assert report.metrics[mk.RETAINED_REWARD_RATIO] == 3 / 8


def test_a_failing_reward_function_stops_the_run_naming_it(dataset, tmp_path):
    config = make_config(
        dataset, tmp_path, reward_func_path="tests.unit.test_trainer.raising_reward"
    )
    with pytest.raises(RewardError, match="raising_reward raised ValueError: boom"):
        train(config, MemorySink(), pool=ToyPool())


def test_a_stop_request_saves_a_checkpoint_and_resume_continues(dataset, tmp_path):
    from engine.trainer import TrainingStopped

    sink = MemorySink()
    with pytest.raises(TrainingStopped, match="after step 2"):
        train(
            make_config(dataset, tmp_path, max_steps=4, eval_strategy="no"),
            sink,
            pool=ToyPool(),
            should_stop=lambda: len(sink.steps) >= 2,
        )
    assert [s for s, _ in sink.checkpoints] == [2]
    resumed = MemorySink()
    train(
        make_config(dataset, tmp_path, max_steps=4, eval_strategy="no"),
        resumed,
        pool=ToyPool(),
        resume_from=tmp_path / "out" / "checkpoint-2",
    )
    assert [r.step for r in resumed.steps] == [3, 4]


def test_a_stop_during_a_step_checkpoints_the_last_finished_step(dataset, tmp_path):
    from engine.trainer import TrainingStopped

    calls = iter(range(1000))  # 8 members a step + 1 check after it: stop in step 2
    sink = MemorySink()
    with pytest.raises(TrainingStopped, match="during step 2, checkpoint of step 1"):
        train(
            make_config(dataset, tmp_path, max_steps=4, eval_strategy="no"),
            sink,
            pool=ToyPool(),
            should_stop=lambda: next(calls) >= 12,
        )
    assert [r.step for r in sink.steps] == [1]
    assert [s for s, _ in sink.checkpoints] == [1]


class ScriptedLbesEngine(ToyEngine):
    """Base samples per prompt: a stop token alone (empty text), and a text whose generated
    ids are not the ones its text tokenizes to ("xx" generated as two "x" tokens, where a
    tokenizer would give one "xx" token). Scores only token ids, as the vLLM engine refuses
    a completion without tokens; records what it was asked to score."""

    SAMPLES = (
        ToyCompletion("", 1, True, (TOY_EOS,)),
        ToyCompletion("xx", 3, True, (TOY_X, TOY_X, TOY_EOS)),
    )

    def __init__(self) -> None:
        super().__init__()
        self.scored: list[list] = []

    def generate(self, prompts, *, n, temperature, max_tokens, seed):
        return [[self.SAMPLES[j % 2] for j in range(n)] for _ in prompts]

    def completion_logprobs(self, prompts, completions):
        self.scored.append(list(completions))
        if any(isinstance(c, str) or not c for c in completions):
            raise ValueError("completions must be the generated token ids, and not empty")
        return [-len(c) * (1 + self.weights[1]) for c in completions]


def test_lbes_scores_the_generated_token_ids_stop_token_included(dataset, tmp_path):
    config = make_config(
        dataset, tmp_path, method="lbes", n=2, temperature=1.0, eval_strategy="no", max_steps=1
    )
    pool = ToyPool()
    pool.engine = ScriptedLbesEngine()
    sink = MemorySink()
    train(config, sink, pool=pool)
    (report,) = sink.steps
    assert len(pool.engine.scored) == 8  # once per member
    expected = [c.token_ids for _ in range(4) for c in ScriptedLbesEngine.SAMPLES]
    assert all(scored == expected for scored in pool.engine.scored)
    by_sample = {(s.prompt_index, s.sample_index): s.logprob for s in report.samples}
    # Each member scores a sample -len(ids) * (1 + its perturbation); the mean over members:
    assert by_sample[(0, 0)] == pytest.approx(-1.0, abs=0.1)  # the stop token alone, scored
    assert by_sample[(0, 1)] == pytest.approx(3 * by_sample[(0, 0)])  # 3 generated ids, not 2


class HalfFlatEngine(ToyEngine):
    """Base samples that differ in length, except for the prompts named in `flat`, whose
    samples are all alike: a batch of flat prompts is skipped by exclude_same_rewards_samples."""

    def __init__(self, flat: tuple[str, ...] = ("question 0", "question 1")) -> None:
        super().__init__()
        self.flat = flat
        self.batches = 0

    def generate(self, prompts, *, n, temperature, max_tokens, seed):
        self.batches += 1

        def sample(prompt, j: int) -> ToyCompletion:
            length = 5 if prompt[-1]["content"] in self.flat else 5 + j
            return ToyCompletion("x" * length, length, True, (TOY_X,) * length)

        return [[sample(p, j) for j in range(n)] for p in prompts]


def skipping_lbes_config(dataset, tmp_path, **options):
    """LBES over two epochs of one-prompt batches, same-reward prompts dropped: with
    HalfFlatEngine the two flat prompts are skipped once an epoch."""
    return make_config(
        dataset,
        tmp_path,
        method="lbes",
        n=2,
        temperature=1.0,
        exclude_same_rewards_samples=True,
        eval_strategy="no",
        max_steps=None,
        num_train_epochs=2,
        data_batch_size=1,
        **options,
    )


def test_lbes_skipped_steps_use_up_their_batch_and_no_batch_is_drawn_past_the_epochs(
    dataset, tmp_path
):
    """As nlp-waseda/lbes: the loop goes over num_train_epochs of batches; a skipped batch does
    not advance the global step (nor the schedules), and no batch is drawn past the epochs."""
    from engine.progress import ProgressSink
    from engine.trainer import plan_total_steps
    from engine.trainer.loop import current_schedules

    config = skipping_lbes_config(dataset, tmp_path, lr_scheduler_type="linear", lr_final=0.0)
    pool = ToyPool()
    pool.engine = HalfFlatEngine()
    sink = MemorySink()
    bar = ProgressSink(sink, plan_total_steps(config))
    train(config, bar, pool=pool)
    bar.close()
    total = plan_total_steps(config)
    assert total == 8 * 2  # 8 prompts, one a batch, two epochs
    assert pool.engine.batches == total  # never a batch past the second epoch
    skipped = [m for level, m in sink.events if level == "warning" and "skipped:" in m]
    assert len(skipped) == 2 * 2  # the two flat prompts, once an epoch
    steps = [r.step for r in sink.steps]
    assert steps == list(range(1, total - len(skipped) + 1))
    # The bar counts the batches, a skipped step too, as the reference's bar and the dashboard
    assert bar.bar.total == total and bar.bar.n == total
    for report in sink.steps:  # the schedules advanced with the global step only
        _, learning_rate = current_schedules(config, report.step - 1, total)
        assert report.metrics[mk.LEARNING_RATE] == pytest.approx(learning_rate)


def test_an_epoch_whose_last_batch_is_skipped_still_evaluates_and_saves_at_its_end(
    dataset, tmp_path
):
    """As nlp-waseda/lbes, whose epoch-end eval and save follow its loop over the batches."""
    from engine.batches import Batches, Position

    config = make_config(
        dataset,
        tmp_path,
        method="lbes",
        n=2,
        temperature=1.0,
        exclude_same_rewards_samples=True,
        eval_strategy="epoch",
        save_strategy="epoch",
        max_steps=None,
        num_train_epochs=2,
        data_batch_size=1,
    )
    (last_of_first_epoch,) = Batches(8, 1, config.data.seed).indices(Position(0, 7))
    pool = ToyPool()
    pool.engine = HalfFlatEngine(flat=(f"question {last_of_first_epoch}",))
    sink = MemorySink()
    train(config, sink, pool=pool)
    assert [s for s, _ in sink.series(mk.reward_key(mk.EVAL))] == [0, 7, 14]
    assert [s for s, _ in sink.checkpoints] == [7, 14]
