"""A sweep for people: its progress in counts, its runs ranked by the objective, the best run,
the top k, and the swept options against the objective as chart data. Everything is read
from the sweep table (jobs.sweeps.driver.sweep_table, the table the exports write), so the
Sweep page, the Sweeps list and the downloaded files agree."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import altair as alt
import pandas as pd
from pandas.io.formats.style import Styler

from app import charts
from app.views import cell
from jobs.store.records import SweepRecord
from jobs.store.status import RunStatus
from jobs.sweeps.spec import Parameter, SweepSpec

OBJECTIVE = "objective"
STOPPED_EARLY = "stopped early"
BEST_STYLE = "background-color: rgba(255, 200, 0, 0.25)"


@dataclass(frozen=True)
class Progress:
    """How far a sweep is: `runs` made of `budget`, `done` of them ended (complete, stopped
    early or failed: every run counts against the budget)."""

    budget: int
    runs: int
    queued: int
    running: int
    complete: int
    pruned: int
    failed: int

    @property
    def done(self) -> int:
        return self.complete + self.pruned + self.failed

    @property
    def fraction(self) -> float:
        return min(1.0, self.done / self.budget) if self.budget else 0.0


def progress(table: pd.DataFrame, budget: int) -> Progress:
    """Counts of the table's runs. Queued and running follow the run's status; complete,
    pruned (stopped early by the sweep, also while it stops) and failed (a person's cancel
    included) follow the trial's state, which the samplers read."""
    status, state = table["status"], table["state"]
    return Progress(
        budget=budget,
        runs=len(table),
        queued=int((status == RunStatus.QUEUED.value).sum()),
        running=int(((state == "running") & (status != RunStatus.QUEUED.value)).sum()),
        complete=int((state == "complete").sum()),
        pruned=int((state == "pruned").sum()),
        failed=int((state == "failed").sum()),
    )


def listing_row(sweep: SweepRecord, table: pd.DataFrame) -> dict[str, Any]:
    """The Sweeps list's row of a sweep: what it searches, how far it is, its best run."""
    spec = SweepSpec.from_dict(sweep.spec)
    done = progress(table, spec.budget)
    top = best(table)
    return {
        "id": sweep.id,
        "name": sweep.name,
        "status": sweep.status.value,
        "method": spec.method,
        "options": ", ".join(p.name for p in spec.parameters),
        "objective": f"{spec.objective.metric} ({spec.objective.mode})",
        "progress": done.fraction,
        "runs done": f"{done.done} / {done.budget}",
        "live": done.queued + done.running,
        "best": None if top is None else top["objective"],
        "best run": None if top is None else f"/run?run={top['run_id']}",
        "created": sweep.created_at,
        "open": f"/sweep?sweep={sweep.id}",
    }


def ranked(table: pd.DataFrame) -> pd.DataFrame:
    """The table best first: the ranked (complete) runs by rank, then the others by trial."""
    order = table.assign(_unranked=table["rank"].isna()).sort_values(
        ["_unranked", "rank", "trial"], kind="stable"
    )
    return order.drop(columns="_unranked").reset_index(drop=True)


def best(table: pd.DataFrame) -> dict[str, Any] | None:
    """The row of the best complete run, None before one has finished with an objective."""
    top = table[table["rank"] == 1]
    return None if top.empty else top.iloc[0].to_dict()


def is_best(rank: Any) -> bool:
    """Whether a table's rank (pandas' NA for an unranked run) is the best."""
    return bool(pd.notna(rank) and rank == 1)


def top_ids(table: pd.DataFrame, k: int) -> list[int]:
    """The run ids of the `k` best complete runs, best first."""
    scored = ranked(table).dropna(subset=["rank"])
    return [int(i) for i in scored["run_id"].head(k)]


def status_word(status: str, state: str) -> str:
    """A run's status as the sweep sees it: a run its sweep stopped says so."""
    return STOPPED_EARLY if state == "pruned" else status


def shown_table(table: pd.DataFrame, parameters: Sequence[Parameter]) -> pd.DataFrame:
    """The ranked table as the page shows it: rank, the run and a link to its page, its
    status, step, the swept options' values and the objective (so far, for a live run)."""
    rows = ranked(table)
    return pd.DataFrame(
        {
            "rank": rows["rank"],
            "trial": rows["trial"],
            "run": rows["run"],
            "status": [
                status_word(a, b) for a, b in zip(rows["status"], rows["state"], strict=True)
            ],
            "step": rows["step"],
            # as text: an option's values may mix a number and none, which Arrow refuses
            **{p.name: [cell(v) for v in rows[p.name]] for p in parameters},
            OBJECTIVE: rows[OBJECTIVE].astype(float),
            "open": [f"/run?run={i}" for i in rows["run_id"]],
        }
    )


def highlight_best(shown: pd.DataFrame) -> Styler:
    """The shown table with the best run's row highlighted."""
    return shown.style.apply(
        lambda row: [BEST_STYLE if is_best(row["rank"]) else ""] * len(row), axis=1
    )


# -- the chart ----------------------------------------------------------------------------


def options_chart(table: pd.DataFrame, spec: SweepSpec) -> alt.Chart | None:
    """The swept options against the objective, for the runs that have one (so far): a
    scatter when one option is swept, parallel coordinates otherwise; None before any run
    has an objective."""
    scored = table.dropna(subset=[OBJECTIVE])
    if scored.empty:
        return None
    title = f"swept options against {charts.words(spec.objective.metric)}"
    if len(spec.parameters) == 1:
        p = spec.parameters[0]
        points = pd.DataFrame(
            {
                "run": [
                    f"{r} (#{i})" for r, i in zip(scored["run"], scored["run_id"], strict=True)
                ],
                p.name: list(scored[p.name]) if numeric(p) else [cell(v) for v in scored[p.name]],
                OBJECTIVE: scored[OBJECTIVE].astype(float),
                "status": [
                    status_word(a, b)
                    for a, b in zip(scored["status"], scored["state"], strict=True)
                ],
                "best": [is_best(r) for r in scored["rank"]],
            }
        )
        return charts.objective_scatter(points, p.name, numeric(p), p.log, title)
    lines, ticks = coordinates(scored, spec.parameters)
    axes = [p.name for p in spec.parameters] + [OBJECTIVE]
    return charts.parallel_coordinates(lines, ticks, axes, title, spec.objective.mode)


def numeric(parameter: Parameter) -> bool:
    """Whether the option's values lie on a number line (a range, or numbers only)."""
    if parameter.values is None:
        return True
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in parameter.values)


def coordinates(
    table: pd.DataFrame, parameters: Sequence[Parameter]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(lines, ticks) of a parallel-coordinates chart of the runs that have an objective:
    `lines` has one row per run and axis (run, axis, position in 0..1, value as text,
    objective, best), `ticks` the labels along each axis (axis, position, label). Each
    option's axis spans its range (on a log scale when it is drawn so) or its values in
    the space's order; the objective's spans what the runs reached."""
    scored = table.dropna(subset=[OBJECTIVE])
    axes = [(p.name, _placement(p, scored[p.name])) for p in parameters]
    axes.append((OBJECTIVE, _numeric(scored[OBJECTIVE].astype(float), log=False)))
    lines, ticks = [], []
    for name, (place, labels) in axes:
        for _, row in scored.iterrows():
            lines.append(
                {
                    "run": f"{row['run']} (#{row['run_id']})",
                    "axis": name,
                    "position": place(row[name]),
                    "value": cell(row[name]),
                    OBJECTIVE: float(row[OBJECTIVE]),
                    "best": is_best(row["rank"]),
                }
            )
        ticks += [{"axis": name, "position": pos, "label": text} for pos, text in labels]
    return pd.DataFrame(lines), pd.DataFrame(ticks, columns=["axis", "position", "label"])


Placement = tuple[Any, list[tuple[float, str]]]


def _placement(parameter: Parameter, seen: pd.Series) -> Placement:
    """Where a value of `parameter` sits on its axis (0..1), and the axis's labels."""
    if parameter.values is None:
        return _numeric(pd.Series([parameter.low, parameter.high], dtype=float), parameter.log)
    values = list(parameter.values)
    if numeric(parameter):
        return _numeric(pd.Series(values, dtype=float), log=False)
    known = values + [v for v in seen.unique() if v not in values]  # a value set by hand
    step = 1 / (len(known) - 1) if len(known) > 1 else 0.0

    def place(value: Any) -> float:
        return known.index(value) * step if len(known) > 1 else 0.5

    return place, [(place(v), cell(v)) for v in known]


def _numeric(bounds: pd.Series, log: bool) -> Placement:
    """A linear (or log) axis from the smallest to the largest of `bounds`."""
    scale = math.log10 if log else float
    low, high = float(bounds.min()), float(bounds.max())

    def place(value: Any) -> float:
        if value is None or pd.isna(value):
            return 0.5
        if high == low:
            return 0.5
        return (scale(float(value)) - scale(low)) / (scale(high) - scale(low))

    ends = [low] if high == low else [low, high]
    return place, [(place(v), f"{v:.4g}") for v in ends]
