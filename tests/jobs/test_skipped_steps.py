"""A finished LBES run whose filters skipped some steps, trained by the real trainer (the toy
engine of tests/unit/test_trainer.py) through the database sink into a real SQLite store: its
progress counts every batch, as nlp-waseda/lbes's progress bar does, so the dashboard and
`eslab runs` show total / total, while its metrics end at the global step total - skipped."""

from __future__ import annotations

from app.cli import main
from app.views import progress
from engine import metrics as mk
from engine.trainer import plan_total_steps, train
from jobs.outcome import RunOutcome
from jobs.sink import DatabaseSink
from jobs.store.status import RunStatus
from tests.unit.test_trainer import (  # noqa: F401 (dataset: a fixture)
    HalfFlatEngine,
    ToyPool,
    dataset,
    skipping_lbes_config,
)


def test_a_finished_run_with_skipped_steps_shows_all_its_steps_done(
    sqlite_store,
    sqlite_url,
    dataset,  # noqa: F811
    tmp_path,
    monkeypatch,
    capsys,
):
    config = skipping_lbes_config(dataset, tmp_path)
    total = plan_total_steps(config)
    run = sqlite_store.create_run(
        name="skips",
        method="lbes",
        config=config.to_flat(),
        total_steps=total,
        status=RunStatus.RUNNING,
    )
    pool = ToyPool()
    pool.engine = HalfFlatEngine()  # two of the eight prompts are skipped, once an epoch
    output = train(config, DatabaseSink(sqlite_store, run.id, run.attempt), pool=pool)
    RunOutcome(sqlite_store, run.id, run.attempt).succeeded(output)

    finished = sqlite_store.get_run(run.id)
    assert finished.status is RunStatus.SUCCEEDED
    assert (finished.step, finished.total_steps) == (16, 16)
    assert progress(finished) == 1.0  # the Runs page's progress bar
    reward = sqlite_store.metric_series(run.id, mk.reward_key(mk.TRAIN))
    assert [p.step for p in reward] == list(range(1, 16 - 4 + 1))  # the global step

    monkeypatch.setenv("ESLAB_DATABASE_URL", sqlite_url)
    assert main(["runs"]) == 0
    (row,) = capsys.readouterr().out.splitlines()[1:]
    assert row.split()[3:5] == ["succeeded", "16/16"]
