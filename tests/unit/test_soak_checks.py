"""bench/soak_checks.py: given the store's rows of a soak's runs, each end check passes on a
clean soak and fails, naming the run, on the fault it is there to catch."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from bench.soak_checks import Check, end_checks, step_problems
from engine import metrics as mk
from jobs.store.records import CheckpointRecord, RunExport, RunRecord
from jobs.store.status import RunStatus

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def export(
    run_id: int,
    status: RunStatus = RunStatus.SUCCEEDED,
    steps: list[int] = (1, 2, 3),
    total: int = 3,
    error: str | None = None,
    attempt: int = 1,
) -> RunExport:
    run = RunRecord(
        id=run_id,
        uuid=f"u{run_id}",
        name=f"soak-{run_id}",
        method="es",
        status=status,
        config={},
        created_at=NOW,
        started_at=NOW,
        finished_at=NOW,
        heartbeat_at=NOW,
        step=max(steps, default=0),
        total_steps=total,
        error=error,
        tags=[],
        notes="",
        parent_id=None,
        ray_submission_id=None,
        attempt=attempt,
    )
    metrics = [
        {"key": key, "step": s, "value": 0.1, "wall_time": 0.0}
        for s in steps
        for key in (mk.NOISE_STD, "train/reward/mean")
    ]
    population = [{"step": s, "member": m} for s in steps for m in (0, 1)]
    samples = [
        {"split": "train", "step": s, "prompt_index": 0, "sample_index": 0, "member": m}
        for s in steps
        for m in (0, 1)
    ]
    checkpoints = [CheckpointRecord(s, f"/out/checkpoint-{s}", NOW) for s in steps]
    return RunExport(run, metrics, population, samples, checkpoints, [])


def verdict(exports, submitted=None, resumed=(), jobs=(), processes=()) -> dict[str, Check]:
    checks = end_checks(
        exports, len(exports) if submitted is None else submitted, resumed, jobs, processes
    )
    return {c.name: c for c in checks}


def failed(checks: dict[str, Check]) -> dict[str, str]:
    return {name: c.detail for name, c in checks.items() if not c.passed}


def test_a_clean_soak_passes_every_check():
    exports = [
        export(1),
        export(2, RunStatus.CANCELLED, steps=[1]),
        export(3, RunStatus.FAILED, steps=[1, 2], error="the service stopped"),
        export(4, RunStatus.CANCELLED, steps=[], total=3),  # cancelled while queued
        export(5, attempt=2),
    ]
    checks = verdict(exports, resumed=[5])
    assert failed(checks) == {}
    assert checks["every run ended: succeeded, cancelled or failed"].detail == (
        "5 of 5 runs: 2 cancelled, 1 failed, 2 succeeded"
    )


def test_a_run_left_running_or_lost_fails_the_first_check():
    checks = verdict([export(1), export(2, RunStatus.RUNNING, steps=[1])])
    assert list(failed(checks)) == ["every run ended: succeeded, cancelled or failed"]
    assert "not ended: [2]" in failed(checks)["every run ended: succeeded, cancelled or failed"]
    assert "every run ended" in next(iter(failed(verdict([export(1)], submitted=2))))


def test_a_failure_without_a_reason_is_named():
    checks = verdict([export(1, RunStatus.FAILED, steps=[1], error="  ")])
    assert failed(checks) == {"every failed run says why": "failed without a reason: [1]"}


def test_steps_missing_repeated_or_short_fail_naming_the_run():
    gap = export(1, steps=[1, 3], total=2)
    short = export(2, steps=[1, 2], total=3)
    twice = export(3)
    twice = replace(twice, samples=twice.samples + twice.samples[:1])
    members = export(4)
    members = replace(members, population=members.population + members.population[-1:])
    orphan = export(5, RunStatus.CANCELLED, steps=[1])
    orphan = replace(orphan, checkpoints=[CheckpointRecord(2, "/out/checkpoint-2", NOW)])
    assert step_problems(gap) == ["steps [1, 3] are not 1..2 once each"]
    assert step_problems(short) == ["succeeded with 2 of 3 steps"]
    assert step_problems(twice) == [
        "samples (split, step, prompt, sample, member) recorded twice: [('train', 1, 0, 0, 0)]"
    ]
    assert step_problems(members) == ["population (step, member) recorded twice: [(3, 1)]"]
    assert step_problems(orphan) == ["checkpoints of unrecorded steps [2]"]
    detail = failed(verdict([gap, short, twice, members, orphan, export(6)]))
    assert list(detail) == ["every recorded step present once"]
    assert [f"run {i}:" in detail["every recorded step present once"] for i in range(1, 7)] == [
        True
    ] * 5 + [False]


def test_a_resumed_run_must_succeed_on_a_later_attempt():
    cancelled_again = export(1, RunStatus.CANCELLED, steps=[1], attempt=2)
    never_resumed = export(2, attempt=1)
    checks = verdict([cancelled_again, never_resumed], resumed=[1, 2])
    assert failed(checks) == {
        "every resumed run went on to succeed": "not succeeded after a resume: [1, 2]"
    }


def test_ray_jobs_and_processes_left_behind_fail():
    checks = verdict([export(1)], jobs=["eslab-1-a1"], processes=["123 raylet"])
    assert failed(checks) == {
        "no Ray job left": "1 pending or running: ['eslab-1-a1']",
        "no process left": "1: ['123 raylet']",
    }
