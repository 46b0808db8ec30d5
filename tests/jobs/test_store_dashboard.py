"""The dashboard's store reads (search, sparklines, SQL bucketing) and delete_run, on SQLite
and PostgreSQL (the `store` fixture runs each test on both)."""

import pytest

from engine import metrics as mk
from engine.sink import PopulationRecord, StepReport
from jobs.store.errors import InvalidTransitionError
from jobs.store.status import RunStatus

TRAIN = mk.reward_key(mk.TRAIN)


def seed(store, name, method="es", tags=(), steps=10):
    run = store.create_run(
        name=name,
        method=method,
        config={},
        total_steps=steps,
        tags=list(tags),
        status=RunStatus.RUNNING,
    )
    for step in range(steps):
        store.record_step(
            run.id,
            StepReport(
                step=step,
                metrics={TRAIN: 100.0 if step == 7 else float(step)},
                population=[
                    PopulationRecord(member=m, seed=m, fitness=float(m), shaped_fitness=0.0)
                    for m in range(3)
                ],
                wall_time=float(step),
            ),
        )
    return run


def test_search_filters_sorts_and_pages(store):
    a = seed(store, "alpha", tags=["x", "long tag"])
    b = seed(store, "beta", method="lbes", tags=["xy"])
    store.set_status(b.id, RunStatus.SUCCEEDED)
    assert store.search_runs(text="ALP")[0] == [store.get_run(a.id)]
    # an id matches that run; a uuid prefix too (run a's random uuid may start with the same
    # digit, so the id search is checked for inclusion and the prefix search exactly)
    assert b.id in [r.id for r in store.search_runs(text=str(b.id))[0]]
    assert a.id not in [r.id for r in store.search_runs(text=str(b.id))[0]] or a.uuid.startswith(
        str(b.id)
    )
    assert [r.id for r in store.search_runs(text=b.uuid[:12])[0]] == [b.id]
    assert [r.id for r in store.search_runs(tag="x")[0]] == [a.id]  # not "xy"
    assert [r.id for r in store.search_runs(tag="long tag")[0]] == [a.id]
    assert [r.id for r in store.search_runs(statuses=["succeeded"])[0]] == [b.id]
    assert [r.id for r in store.search_runs(methods=["lbes"])[0]] == [b.id]
    assert [r.name for r in store.search_runs(order="name")[0]] == ["alpha", "beta"]
    assert [r.name for r in store.search_runs(order="-name")[0]] == ["beta", "alpha"]
    runs, total = store.search_runs(limit=1, offset=1, order="name")
    assert total == 2 and [r.name for r in runs] == ["beta"]
    with pytest.raises(ValueError, match="cannot sort"):
        store.search_runs(order="config")


def test_sparklines_best_and_buckets_keep_spikes(store):
    run = seed(store, "alpha")
    lines = store.sparklines([run.id, 999], TRAIN, points=5)
    assert len(lines[run.id]) == 5 and lines[999] == []
    assert lines[run.id][0] == pytest.approx(0.5)  # mean of steps 0 and 1
    assert store.best_metrics([run.id], TRAIN) == {run.id: 100.0}
    buckets = store.metric_buckets(run.id, TRAIN, points=3)
    assert len(buckets) == 3 and [b["step"] for b in buckets] == [0, 4, 8]
    assert max(b["max"] for b in buckets) == 100.0  # the spike at step 7 survives
    assert [b["last"] for b in buckets] == [3.0, 100.0, 9.0]  # each bucket's last value
    assert store.metric_buckets(run.id, "no/such/key") == []


def test_population_points_stride_and_steps(store):
    run = seed(store, "alpha")
    assert len(store.population_points(run.id)) == 30
    few = store.population_points(run.id, max_points=10)
    assert {p["step"] for p in few} == {0, 3, 6, 9} and len(few) == 12
    assert store.population_steps(run.id) == list(range(10))


def test_delete_run(store):
    run = seed(store, "alpha")
    with pytest.raises(InvalidTransitionError):
        store.delete_run(run.id)
    store.set_status(run.id, RunStatus.FAILED)
    store.delete_run(run.id)
    assert store.count_runs() == 0
    assert store.search_runs() == ([], 0)
