"""The end checks of bench/soak.py, kept apart from the soak so that a unit test can hand them
store rows and see which pass: a broken check would otherwise only show in a soak of hours.

Each check reads what the store exported of the soak's runs (`Store.export_run`), plus what
the soak counted of Ray and of the processes after `eslab serve` stopped."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from engine import metrics as mk
from jobs.store.records import RunExport
from jobs.store.status import RunStatus


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str


def train_steps(export: RunExport) -> list[int]:
    """The training steps a run recorded: those of its noise std, which every ES step
    reports (logging_steps 1, the soak's runs)."""
    return sorted(m["step"] for m in export.metrics if m["key"] == mk.NOISE_STD)


def step_problems(export: RunExport) -> list[str]:
    """What is wrong with the steps a run recorded: a gap or a repeat in its steps, a
    succeeded run short of its total, a population member or sample recorded twice, a
    checkpoint of a step that has no record."""
    run, steps = export.run, train_steps(export)
    problems = []
    if steps != list(range(1, len(steps) + 1)):
        problems.append(f"steps {steps} are not 1..{len(steps)} once each")
    if run.status is RunStatus.SUCCEEDED and len(set(steps)) != run.total_steps:
        problems.append(f"succeeded with {len(set(steps))} of {run.total_steps} steps")
    members = _repeats((p["step"], p["member"]) for p in export.population)
    if members:
        problems.append(f"population (step, member) recorded twice: {members}")
    samples = _repeats(
        (s["split"], s["step"], s["prompt_index"], s["sample_index"], s["member"])
        for s in export.samples
    )
    if samples:
        problems.append(f"samples (split, step, prompt, sample, member) recorded twice: {samples}")
    orphans = sorted({c.step for c in export.checkpoints} - set(steps))
    if orphans:
        problems.append(f"checkpoints of unrecorded steps {orphans}")
    return problems


def _repeats(keys: Iterable[tuple]) -> list[tuple]:
    return sorted(key for key, count in Counter(keys).items() if count > 1)


def end_checks(
    exports: Sequence[RunExport],
    submitted: int,
    resumed: Collection[int],
    ray_jobs_left: Sequence[str],
    processes_left: Sequence[str],
) -> list[Check]:
    """The soak's verdict: `submitted` runs were queued, those of `resumed` were cancelled
    and resumed; `ray_jobs_left` are the Ray jobs still pending or running once every run
    had ended, `processes_left` the processes of serve's that outlived its stop."""
    runs = {e.run.id: e.run for e in exports}
    statuses = Counter(r.status.value for r in runs.values())
    unended = sorted(i for i, r in runs.items() if not r.status.is_terminal())
    reasonless = sorted(
        i for i, r in runs.items() if r.status is RunStatus.FAILED and not (r.error or "").strip()
    )
    bad_steps = {e.run.id: p for e in exports if (p := step_problems(e))}
    unfinished = sorted(
        i for i in resumed if runs[i].status is not RunStatus.SUCCEEDED or runs[i].attempt < 2
    )
    counts = ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))
    return [
        Check(
            "every run ended: succeeded, cancelled or failed",
            not unended and len(runs) == submitted,
            f"{len(runs)} of {submitted} runs: {counts}"
            + (f"; not ended: {unended}" if unended else ""),
        ),
        Check(
            "every failed run says why",
            not reasonless,
            f"failed without a reason: {reasonless}"
            if reasonless
            else f"{statuses['failed']} failed",
        ),
        Check(
            "every recorded step present once",
            not bad_steps,
            "; ".join(f"run {i}: {', '.join(p)}" for i, p in bad_steps.items())
            or f"{sum(len(train_steps(e)) for e in exports)} steps",
        ),
        Check(
            "every resumed run went on to succeed",
            not unfinished,
            f"not succeeded after a resume: {unfinished}"
            if unfinished
            else f"{len(resumed)} resumed",
        ),
        Check(
            "no Ray job left",
            not ray_jobs_left,
            f"{len(ray_jobs_left)} pending or running: {list(ray_jobs_left)}"
            if ray_jobs_left
            else "0",
        ),
        Check(
            "no process left",
            not processes_left,
            f"{len(processes_left)}: {list(processes_left)}" if processes_left else "0",
        ),
    ]
