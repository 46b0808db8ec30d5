"""Alignment runs on the real engine with the default policy model and the default scorer
pair (MiniLM reward and cost models, trained by `eslab scorer train-default` when missing),
served for real on 127.0.0.1."""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from engine import metrics as mk
from engine.config import RunConfig
from engine.scoring.client import ScorerError
from engine.sink import MemorySink
from engine.trainer import train
from scorer.default import default_scorer_dir, default_scorers_ready, train_default_scorers
from tests.integration.scorers import running_scorer

pytestmark = pytest.mark.heavy

ALIGNMENT = Path(__file__).resolve().parents[2] / "data" / "alignment"


SCORER_EPOCHS = 1  # what they score matters here, not how well


def trained_scorers_cache() -> Path:
    """Where the scorers this file trains, when data/models/scorers has none, are kept for
    later sessions: the user's cache (XDG_CACHE_HOME, as vLLM's and ES Lab's compiled
    kernels), under a key of everything the training reads (the scorer package's code, the
    shipped sets, the epochs, torch and transformers), so that a change to any of them trains
    afresh. Training them took 33 s of a quiet 2-core machine, over 60 s beside the other
    worker, in every session; the training itself is `eslab scorer train-default`'s, seeded."""
    import torch
    import transformers

    import scorer
    from scorer.default_data import SCORER_DATA_DIR

    digest = hashlib.sha256()
    code = sorted(Path(scorer.__file__).parent.glob("*.py"))
    for path in [*code, *sorted(SCORER_DATA_DIR.glob("*.jsonl"))]:
        digest.update(f"{path.name}\0".encode() + path.read_bytes())
    digest.update(f"{SCORER_EPOCHS} {torch.__version__} {transformers.__version__}".encode())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "eslab" / "test-scorers" / digest.hexdigest()[:16]


def cached_default_scorers() -> Path:
    """The default scorer pair trained once into trained_scorers_cache(): trained in a
    folder beside it and renamed into place, so that a session that stops halfway, or two
    sessions at once, never leave a half-written pair that the next one would trust."""
    folder = trained_scorers_cache()
    if not default_scorers_ready(folder):
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        try:
            train_default_scorers(staging, epochs=SCORER_EPOCHS)
            shutil.rmtree(staging / "minilm-base")  # the base they were trained from
            try:
                staging.rename(folder)
            except OSError:  # another session put its pair there first
                if not default_scorers_ready(folder):
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return folder


@pytest.fixture(scope="module")
def default_scorer():
    folder = default_scorer_dir()
    if not default_scorers_ready(folder):
        folder = cached_default_scorers()
    with running_scorer(folder / "reward", folder / "cost") as scorer:
        yield scorer


def alignment_config(tmp_path: Path, url: str, **options) -> RunConfig:
    base = {
        "method": "es",
        "train_file": str(ALIGNMENT / "train.parquet"),
        "output_dir": str(tmp_path / "out"),
        "reward_source": "scorer",
        "scorer_url": url,
        "population_size": 4,
        "data_batch_size": 4,
        "max_steps": 2,
        # 8 tokens: a decode step of the default model costs about 0.17 s on the CPU (its fp32
        # weights read once per step), whatever the batch; the lambda rule, the costs and the
        # resume are the same at any length (16 tokens made the file 60 s longer)
        "max_tokens": 8,
        "noise_std": 0.002,
        "learning_rate": 4e-5,
        "seed": 3,
        "lambda_cost": 1.0,
        "lambda_adapt": True,
        "lambda_lr": 0.2,
        "scorer_timeout_s": 30,
        "scorer_retries": 0,
    }
    return RunConfig.from_flat({**base, **options})


EVERY_STEP_SAVED = {"max_steps": 2, "save_strategy": "steps", "save_steps": 1}
"""The uninterrupted run's and its resume's options: a checkpoint every step."""


@pytest.fixture(scope="module")
def straight_run(vllm_engine, initial_master, default_scorer, tmp_path_factory):
    """(sink, output folder) of one uninterrupted run at the default threshold d = 0, a
    checkpoint every step, from the input model: the lambda rule is checked on it, and the
    resume test resumes from its checkpoint, so the suite runs it once for both."""
    from engine.backends.pool import EnginePool

    folder = tmp_path_factory.mktemp("alignment-straight")
    sink = MemorySink()
    vllm_engine.load_master(str(initial_master))
    try:
        train(
            alignment_config(folder, default_scorer.url, **EVERY_STEP_SAVED),
            sink,
            pool=EnginePool.wrap(vllm_engine),
        )
    finally:
        vllm_engine.load_master(str(initial_master))
    return sink, folder / "out"


def assert_lambda_follows_the_cost(sink: MemorySink) -> None:
    """Two steps: the rule is checked at each, and the second uses the lambda the first
    computed."""
    assert [r.step for r in sink.steps] == [1, 2]
    for report in sink.steps:
        m = report.metrics
        print(
            f"step {report.step}: lambda {m[mk.LAMBDA]:.4f} -> {m[mk.LAMBDA_NEXT]:.4f}, "
            f"J_C {m[mk.JC_RAW]:+.3f} (smoothed {m[mk.JC_SMOOTHED]:+.3f}), reward "
            f"{m[mk.reward_key(mk.TRAIN)]:+.3f}, cost {m[mk.reward_key(mk.TRAIN, 'cost')]:+.3f}"
            f", safe {m[mk.SAFE_RATIO]:.2f}"
        )
        # ln(lambda) moved by lambda_lr * J (up when the cost is above d, down below it),
        # then clipped to [lambda_min, lambda_max] = [1e-4, 10]
        moved = min(max(m[mk.LAMBDA] * math.exp(0.2 * m[mk.JC_SMOOTHED]), 1e-4), 10.0)
        assert m[mk.LAMBDA_NEXT] == pytest.approx(moved, rel=1e-9)
        assert abs(m[mk.JC_SMOOTHED]) > 1e-6  # the scorer's costs are never exactly zero
        assert 0.0 <= m[mk.SAFE_RATIO] <= 1.0
        assert len(report.population) == 4
        for row in report.population:
            assert row.reward is not None and row.cost is not None
            # the fitness is the objective with the lambda this step used
            assert row.fitness == pytest.approx(row.reward - m[mk.LAMBDA] * row.cost)
        base = [s for s in report.samples if s.member is None]
        assert len(base) == 4 and all("cost" in s.reward_parts for s in base)
    assert sink.steps[0].metrics[mk.LAMBDA] == 1.0
    for before, after in zip(sink.steps, sink.steps[1:], strict=False):
        assert after.metrics[mk.LAMBDA] == before.metrics[mk.LAMBDA_NEXT]  # effective next step


def test_lambda_follows_the_cost_of_the_unperturbed_model(straight_run):
    """With d = 0 lambda follows the model's mean cost."""
    sink, _ = straight_run
    assert_lambda_follows_the_cost(sink)


def test_lambda_rises_to_its_clip_when_every_cost_is_above_the_threshold(
    pool, default_scorer, tmp_path
):
    """d = -50 puts every cost far above the threshold (the scorer's log-odds are far
    smaller), so lambda must rise to the clip at 10 in its first update (ln(lambda) moves by
    lambda_lr * J_C >= 0.2 * 12 > ln(10) while the mean cost is above -38)."""
    sink = MemorySink()
    train(alignment_config(tmp_path, default_scorer.url, cost_threshold_d=-50.0), sink, pool=pool)
    assert_lambda_follows_the_cost(sink)
    lambdas = [r.metrics[mk.LAMBDA] for r in sink.steps]
    assert lambdas == sorted(lambdas) and lambdas[-1] == 10.0


def test_resume_continues_with_the_checkpointed_lambda(
    pool, vllm_engine, default_scorer, straight_run, tmp_path
):
    """Resumed from the uninterrupted run's checkpoint of step 1, into an output folder of
    its own and with the input model in the engine (nothing of the run left in RAM), step 2
    is the uninterrupted run's step 2: same lambda, same J_C average, same metrics. (That a
    run stopped after step 1 repeats step 1 exactly is test_training's.)"""
    from tests.integration.test_training import untimed

    straight, out = straight_run
    config = alignment_config(tmp_path / "resumed", default_scorer.url, **EVERY_STEP_SAVED)
    resumed = MemorySink()
    train(config, resumed, pool=pool, resume_from=out / "checkpoint-1")
    assert resumed.steps[0].metrics[mk.LAMBDA] == straight.steps[0].metrics[mk.LAMBDA_NEXT] != 1.0
    assert [untimed(r.metrics) for r in resumed.steps] == [untimed(straight.steps[1].metrics)]


def test_a_scorer_stopped_mid_run_fails_the_run_naming_it(pool, tmp_path):
    from tests.integration.scorers import tiny_checkpoint

    reward = tiny_checkpoint(tmp_path / "reward", num_labels=1, seed=0)
    cost = tiny_checkpoint(tmp_path / "cost", num_labels=2, seed=1)
    with running_scorer(reward, cost) as scorer:

        class StopScorerAfterFirstStep(MemorySink):
            def log_step(self, report):
                super().log_step(report)
                scorer.stop()

        sink = StopScorerAfterFirstStep()
        with pytest.raises(ScorerError, match=f"scorer {scorer.url}") as info:
            train(alignment_config(tmp_path, scorer.url, max_steps=3), sink, pool=pool)
    assert [r.step for r in sink.steps] == [1]
    print(f"the run failed with: {info.value}")
