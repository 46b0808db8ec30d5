"""The store's part of sweeps (jobs/store/sweeps.py), on SQLite and PostgreSQL: a sweep's
rows, its runs, its status under racing writers, and the reads its driver needs."""

import pytest

from jobs.store.errors import (
    StoreError,
    SweepClosedError,
    SweepNotFoundError,
    TrialTakenError,
)
from jobs.store.status import RunStatus, SweepStatus
from tests.jobs.test_store import CONFIG, step_report

SPEC = {"method": "grid", "budget": 3, "parameters": {"noise_std": {"values": [0.001, 0.002]}}}
BASE = {"method": "es", "es": {"noise_std": 0.001}}


def make_sweep(store, name="sw", **kw):
    return store.create_sweep(name=name, spec=SPEC, base_config=BASE, **kw)


def trial(store, sweep, number, **kw):
    return store.create_run(
        name=f"{sweep.name}-t{number:03d}",
        method="es",
        config=CONFIG,
        total_steps=2,
        tags=[f"sweep:{sweep.name}"],
        sweep_id=sweep.id,
        sweep_trial=number,
        **kw,
    )


def test_a_sweep_round_trips_and_is_found_by_id_or_name(store):
    sweep = make_sweep(store, created_by="alice")
    assert sweep.status is SweepStatus.ACTIVE and sweep.method == "grid"
    assert sweep.spec == SPEC and sweep.base_config == BASE and sweep.created_by == "alice"
    assert sweep.created_at.tzinfo is not None and sweep.updated_at == sweep.created_at
    assert store.get_sweep(sweep.id) == store.get_sweep(str(sweep.id)) == store.get_sweep("sw")
    other = make_sweep(store, name="later")
    assert [s.name for s in store.list_sweeps()] == ["later", "sw"]  # newest first
    assert [s.name for s in store.list_sweeps(limit=1, offset=1)] == ["sw"]
    assert store.get_sweep(other.id).created_by is None
    with pytest.raises(SweepNotFoundError, match=r"no sweep 'nope' .*eslab sweeps"):
        store.get_sweep("nope")


def test_a_sweeps_tags_are_stored_in_their_order_and_default_to_none(store):
    tagged = make_sweep(store, tags=["lr-search", "night"])
    untagged = make_sweep(store, name="plain")
    assert tagged.tags == ["lr-search", "night"]
    assert store.get_sweep("sw").tags == ["lr-search", "night"]
    assert {s.name: s.tags for s in store.list_sweeps()} == {
        "sw": ["lr-search", "night"],
        "plain": [],
    }
    assert store.get_sweep(untagged.id).tags == []


def test_a_sweep_name_is_taken_once(store):
    make_sweep(store)
    with pytest.raises(StoreError, match="a sweep named 'sw' exists already"):
        make_sweep(store)
    assert len(store.list_sweeps()) == 1


def test_a_sweeps_runs_are_ordinary_runs_listed_in_trial_order(store):
    sweep = make_sweep(store)
    second = trial(store, sweep, 2)
    first = trial(store, sweep, 1)
    plain = store.create_run(name="plain", method="es", config=CONFIG)
    assert (first.sweep_id, first.sweep_trial) == (sweep.id, 1)
    assert (plain.sweep_id, plain.sweep_trial) == (None, None)
    assert [r.id for r in store.sweep_runs(sweep.id)] == [first.id, second.id]
    assert [r.id for r in store.sweep_runs("sw")] == [first.id, second.id]
    assert store.get_run(first.id).tags == ["sweep:sw"]
    # a trial is a run like any other: cancelled, listed, found by its tag
    store.request_cancel(first.id)
    runs, total = store.search_runs(tag="sweep:sw")
    assert total == 2 and {r.id for r in runs} == {first.id, second.id}
    assert store.sweep_run_counts([sweep.id, 999]) == {
        sweep.id: {RunStatus.QUEUED: 1, RunStatus.CANCELLED: 1},
        999: {},
    }


def test_a_trial_is_stored_once(store):
    sweep = make_sweep(store)
    trial(store, sweep, 1)
    with pytest.raises(TrialTakenError, match="trial 1 of sweep"):
        trial(store, sweep, 1)
    assert len(store.sweep_runs(sweep.id)) == 1
    # the same number in another sweep is another trial
    trial(store, make_sweep(store, name="other"), 1)
    with pytest.raises(ValueError, match="both sweep_id and sweep_trial"):
        store.create_run(name="x", method="es", config=CONFIG, sweep_id=sweep.id)


def test_only_an_active_sweep_takes_runs(store):
    sweep = make_sweep(store)
    assert store.set_sweep_status(sweep.id, SweepStatus.CANCELLED, expected=[SweepStatus.ACTIVE])
    with pytest.raises(SweepClosedError, match="is cancelled: it queues no more runs"):
        trial(store, sweep, 1)
    assert store.sweep_runs(sweep.id) == []
    assert store.count_runs() == 0
    with pytest.raises(SweepNotFoundError):
        store.create_run(name="x", method="es", config=CONFIG, sweep_id=12345, sweep_trial=1)


def test_a_status_change_is_won_by_one_writer(store):
    sweep = make_sweep(store)
    assert store.set_sweep_status(sweep.id, SweepStatus.FINISHED, expected=[SweepStatus.ACTIVE])
    # a cancel that read the sweep as active before loses: the sweep stays finished
    assert not store.set_sweep_status(
        sweep.id, SweepStatus.CANCELLED, expected=[SweepStatus.ACTIVE]
    )
    again = store.get_sweep(sweep.id)
    assert again.status is SweepStatus.FINISHED and again.updated_at >= sweep.updated_at
    assert store.active_sweeps() == []


def test_a_finished_sweep_with_a_resumed_run_is_active_again(store):
    sweep, quiet = make_sweep(store), make_sweep(store, name="quiet")
    run = trial(store, sweep, 1)
    trial(store, quiet, 1)
    store.request_cancel(run.id)
    store.request_cancel(store.sweep_runs(quiet.id)[0].id)
    for s in (sweep, quiet):
        store.set_sweep_status(s.id, SweepStatus.FINISHED, expected=[SweepStatus.ACTIVE])
    assert store.reopen_sweeps() == []  # no live run: both stay finished
    store.resume_run(run.id, 0)
    assert store.reopen_sweeps() == [sweep.id]
    assert [s.id for s in store.active_sweeps()] == [sweep.id]
    assert store.get_sweep(quiet.id).status is SweepStatus.FINISHED


def test_deleting_a_sweeps_run_leaves_the_sweep(store):
    sweep = make_sweep(store)
    run = trial(store, sweep, 1)
    store.request_cancel(run.id)
    store.delete_run(run.id)
    assert store.sweep_runs(sweep.id) == []
    assert store.get_sweep(sweep.id).status is SweepStatus.ACTIVE


def test_metric_curves_of_many_runs_in_one_read(store):
    sweep = make_sweep(store)
    a, b, c = (trial(store, sweep, n) for n in (1, 2, 3))
    for step in (1, 2, 3):
        store.record_step(a.id, step_report(step, reward=float(step)))
    store.record_step(b.id, step_report(1, reward=-1.0))
    curves = store.metric_curves([a.id, b.id, c.id], "train/reward/mean")
    assert curves == {a.id: {1: 1.0, 2: 2.0, 3: 3.0}, b.id: {1: -1.0}, c.id: {}}
    assert store.metric_curves([a.id], "no/such/key") == {a.id: {}}


def test_a_cancel_can_say_why_and_marks_are_found_by_prefix(store):
    sweep = make_sweep(store)
    a, b = trial(store, sweep, 1), trial(store, sweep, 2)
    store.start_run(a.id)
    cancelled = store.request_cancel(a.id, reason="stopped early: 50% of the 100%")
    assert cancelled.status is RunStatus.CANCELLING
    assert [e.message for e in store.events(a.id)] == [
        "stopped early: 50% of the 100%",
        "cancel requested (running -> cancelling)",
    ]
    store.add_event(b.id, "info", "stopped early, not by this rule")
    # `%` and `_` in the prefix are matched as themselves, not as LIKE's wildcards
    assert store.events_starting_with([a.id, b.id], "stopped early: 50%") == {
        a.id: ["stopped early: 50% of the 100%"],
        b.id: [],
    }
    assert store.events_starting_with([b.id], "stopped_early") == {b.id: []}
