"""A run as ONE self-contained HTML file, for people who cannot reach the server: summary,
the Run page's charts, the configuration and some samples. Charts are rendered to inline SVG
by vl-convert (Vega-Lite compiled by an embedded engine, offline), so the file holds no
script at all and opens anywhere, without network, as it was when it was written.

A run of a sweep names its sweep and trial in its summary; a sweep's report (`eslab export
--sweep ID --format html`) lists the sweep's runs ranked by its objective, with the search
and the base configuration."""

from __future__ import annotations

import html
from datetime import UTC, datetime

import altair as alt

from app import run_charts
from app.sweep_view import ranked
from app.views import MISSING, cell, duration, elapsed, mode
from engine import metrics as mk
from engine.extras import require
from jobs.store.records import RunRecord
from jobs.store.store import Store

SAMPLES_PER_SPLIT = 8
CHART_WIDTH = 430  # two charts a row in the 1150 px page
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1150px;
       color: #222; }
h1 { margin-bottom: 0.2rem; } .sub { color: #666; margin-top: 0; }
table { border-collapse: collapse; margin: 0.5rem 0 1.5rem; font-size: 0.9rem; }
td, th { border: 1px solid #ddd; padding: 0.25rem 0.6rem; text-align: left;
         vertical-align: top; }
th { background: #f4f4f4; }
.charts { display: flex; flex-wrap: wrap; gap: 1rem; }
.chart { border: 1px solid #eee; padding: 0.5rem; }
pre { white-space: pre-wrap; margin: 0; font-size: 0.85rem; }
"""


def vega_lite_version() -> str:
    """The Vega-Lite version Altair writes, as vl-convert names it (e.g. "6.4"), or the
    newest vl-convert has when it lacks that one."""
    vl_convert = require("vl_convert", "report", "the HTML report")
    wanted = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    known = vl_convert.get_vegalite_versions()
    return wanted if wanted in known else known[-1]


def chart_svg(chart: alt.TopLevelMixin) -> str:
    vl_convert = require("vl_convert", "report", "the HTML report")
    return vl_convert.vegalite_to_svg(chart.to_dict(), vl_version=vega_lite_version())


def _table(rows: list[tuple[str, object]] | list[dict], header: bool = False) -> str:
    if header and rows:
        keys = list(rows[0])
        head = "".join(f"<th>{html.escape(k)}</th>" for k in keys)
        body = "".join(
            "<tr>"
            + "".join(f"<td><pre>{html.escape(str(r[k]))}</pre></td>" for k in keys)
            + "</tr>"
            for r in rows
        )
        return f"<table><tr>{head}</tr>{body}</table>"
    return (
        "<table>"
        + "".join(
            f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
            for k, v in rows
        )
        + "</table>"
    )


def summary_rows(store: Store, run: RunRecord) -> list[tuple[str, object]]:
    latest = store.latest_metrics([run.id]).get(run.id, {})
    best = store.best_metrics([run.id], mk.reward_key(mk.EVAL)).get(run.id)
    return [
        ("status", run.status.value),
        ("method", run.method),
        ("mode", mode(run)),
        ("model", run.config.get("model")),
        ("task", run.config.get("train_file")),
        ("step", f"{run.step} / {run.total_steps or '?'}"),
        ("created", run.created_at),
        ("started", run.started_at or MISSING),
        ("finished", run.finished_at or MISSING),
        ("elapsed", duration(elapsed(run))),
        ("latest train reward", latest.get(mk.reward_key(mk.TRAIN), MISSING)),
        ("best eval reward", MISSING if best is None else best),
        ("tags", ", ".join(run.tags) or MISSING),
        *([("sweep", sweep_line(store, run))] if run.sweep_id is not None else []),
        ("uuid", run.uuid),
        *([("error", run.error)] if run.error else []),
    ]


def sweep_line(store: Store, run: RunRecord) -> str:
    sweep = store.get_sweep(run.sweep_id)
    return f"{sweep.name} (sweep {sweep.id}, {sweep.status.value}), trial {run.sweep_trial}"


def sample_rows(store: Store, run: RunRecord) -> list[dict]:
    """The first samples of the latest step of each split."""
    rows = []
    for split in ("train", "eval"):
        steps = store.sample_steps(run.id, split)
        if steps:
            for s in store.samples(run.id, split=split, step=steps[-1])[:SAMPLES_PER_SPLIT]:
                rows.append(
                    {
                        "split": split,
                        "step": steps[-1],
                        "prompt": s.prompt,
                        "completion": s.completion,
                        "reward": s.reward,
                    }
                )
    return rows


def _document(title: str, sub: str, body: str) -> str:
    written = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)} · {html.escape(sub)}</title><style>{STYLE}</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p class="sub">{html.escape(sub)} · report written {written}</p>
{body}
</body></html>
"""


def run_report(store: Store, run_id: int | str) -> str:
    """The HTML document of run `run_id` as the store holds it now."""
    run = store.get_run(run_id)
    figures = [f for f in (run_charts.population(store, run),) if f is not None]
    figures += run_charts.metric_figures(store, run)
    svgs = (
        "".join(
            f'<div class="chart">{chart_svg(f.properties(width=CHART_WIDTH))}</div>'
            for f in figures
        )
        or "<p>No steps recorded yet.</p>"
    )
    samples = sample_rows(store, run)
    body = f"""<h2>Summary</h2>{_table(summary_rows(store, run))}
<h2>Charts</h2><div class="charts">{svgs}</div>
<h2>Samples</h2>{_table(samples, header=True) if samples else "<p>No samples yet.</p>"}
<h2>Configuration</h2>{_table(sorted(run.config.items()))}"""
    return _document(run.name, f"ES Lab run {run.id} · {run.method}", body)


def sweep_report(store: Store, sweep_id: int | str) -> str:
    """The HTML document of a sweep as the store holds it now: what it searches, its runs
    best first (then those without a rank, in trial order), its base configuration."""
    from jobs.sweeps.driver import sweep_base, sweep_table
    from jobs.sweeps.spec import SweepSpec

    sweep = store.get_sweep(sweep_id)
    spec = SweepSpec.from_dict(sweep.spec)
    table = ranked(sweep_table(store, sweep.id))
    objective = spec.objective
    summary = [
        ("status", sweep.status.value),
        ("method", spec.method),
        ("objective", f"{objective.metric} ({objective.mode}, {objective.summary})"),
        ("runs", f"{len(table)} of {spec.budget}, {spec.parallel} at a time"),
        ("early stopping", spec.early_stopping or MISSING),
        ("created", sweep.created_at),
        ("created by", sweep.created_by or MISSING),
        ("tags", ", ".join(sweep.tags) or MISSING),
    ]
    rows = [{k: cell(v) for k, v in row.items()} for row in table.to_dict(orient="records")]
    runs = _table(rows, header=True) if rows else "<p>No runs yet.</p>"
    body = f"""<h2>Summary</h2>{_table(summary)}
<h2>Runs, best first</h2>{runs}
<h2>Search</h2><pre>{html.escape(spec.to_yaml())}</pre>
<h2>Base configuration</h2>{_table(sorted(sweep_base(sweep).to_flat().items()))}"""
    return _document(sweep.name, f"ES Lab sweep {sweep.id} · {spec.method}", body)
