"""Altair charts for the dashboard. Data is reduced before it is drawn: buckets along x keep
their min, max and mean (W&B "full fidelity"), so spikes stay visible and no chart gets more
rows than Altair draws comfortably (its default limit is 5,000)."""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import pandas as pd

MAX_POINTS = 400


def downsample(
    df: pd.DataFrame, x: str, y: str, points: int = MAX_POINTS, by: str | None = None
) -> pd.DataFrame:
    """At most `points` buckets along `x` (per `by` group): each row has the bucket's first x,
    the mean of `y`, and its `min` and `max`, so no spike is lost."""
    if df.empty:
        return df.assign(min=pd.Series(dtype=float), max=pd.Series(dtype=float))
    groups = df.groupby(by, sort=False) if by else [(None, df)]
    out = []
    for key, part in groups:
        part = part.sort_values(x).reset_index(drop=True)
        size = max(1, -(-len(part) // points))
        bucket = part.index // size
        reduced = part.groupby(bucket).agg(
            **{x: (x, "first"), y: (y, "mean"), "min": (y, "min"), "max": (y, "max")}
        )
        if by:
            reduced[by] = key[0] if isinstance(key, tuple) else key
        out.append(reduced)
    return pd.concat(out, ignore_index=True)


def ema(values: Sequence[float] | pd.Series, smoothing: float) -> pd.Series:
    """Exponential moving average; smoothing 0 returns the values, 0.99 smooths heavily."""
    series = pd.Series(values, dtype=float)
    if smoothing <= 0:
        return series
    return series.ewm(alpha=1.0 - min(smoothing, 0.999), adjust=False).mean()


def words(key: str) -> str:
    """A metric key in words, for a title: `train/noise_std` -> `train noise std`."""
    return key.replace("/", " ").replace("_", " ")


def chart_title(text: str, key: str | None = None) -> str | alt.TitleParams:
    """Every chart's title in one style: what it shows, in lower-case words, and beneath, in
    small type, the metric key it draws (the name to look for in Compare and in exports)."""
    return alt.TitleParams(text, subtitle=key) if key else text


def x_axis(x: str = "step") -> alt.X:
    """Steps are whole numbers: no 1.05 ticks; wall time stays continuous. The labelExpr
    blanks fractional ticks where a renderer ignores tickMinStep (vl-convert's does)."""
    axis = (
        alt.Axis(tickMinStep=1, format="d", labelExpr="datum.value % 1 ? '' : datum.label")
        if x == "step"
        else alt.Axis()
    )
    return alt.X(f"{x}:Q", title=x.replace("_", " "), axis=axis)


def metric_chart(
    df: pd.DataFrame,
    x: str,
    title: str,
    color: str | None = None,
    band: bool = True,
    height: int = 220,
    key: str | None = None,
) -> alt.Chart:
    """A line of `value` against `x`, a min-max band where the data were bucketed, colour by
    `color` (a run name in Compare); `key`, the metric drawn, goes under the title."""
    base = alt.Chart(df).encode(x=x_axis(x))
    enc = {"color": alt.Color(f"{color}:N", title=None)} if color else {}
    line = base.mark_line().encode(
        y=alt.Y("value:Q", title=None), **enc, tooltip=[x, "value"] + ([color] if color else [])
    )
    layers = [line]
    if band and {"min", "max"} <= set(df.columns) and (df["min"] != df["max"]).any():
        layers.insert(0, base.mark_area(opacity=0.2).encode(y="min:Q", y2="max:Q", **enc))
    return alt.layer(*layers).properties(title=chart_title(title, key), height=height)


def planned_chart(done: pd.DataFrame, plan: pd.DataFrame, key: str) -> alt.Chart:
    """What was used (solid) and the planned schedule ahead (dashed) of the metric `key`."""
    planned = (
        alt.Chart(plan)
        .mark_line(strokeDash=[4, 4], color="gray")
        .encode(x=x_axis(), y=alt.Y("value:Q", title=None))
    )
    used = alt.Chart(done).mark_line().encode(x="step:Q", y="value:Q")
    title = chart_title(f"{words(key)} (planned: dashed)", key)
    return alt.layer(planned, used).properties(title=title, height=220)


def member_tooltip(*fields: str) -> list[str | alt.Tooltip]:
    """What hovering a member's dot says: the member, its seed, `fields`, and its raw and
    shaped fitness (the store's population row)."""
    return [
        "member",
        alt.Tooltip("seed:Q", format="d"),
        *fields,
        alt.Tooltip("fitness:Q", title="raw fitness"),
        alt.Tooltip("shaped_fitness:Q", title="shaped fitness"),
    ]


def population_chart(points: pd.DataFrame, summary: pd.DataFrame) -> alt.Chart:
    """Every member's fitness as points, the mean as a line and the min-max as a band;
    hovering a point names the member, its seed, and its raw and shaped fitness."""
    band = (
        alt.Chart(summary)
        .mark_area(opacity=0.2)
        .encode(x=x_axis(), y=alt.Y("min:Q", title="fitness"), y2="max:Q")
    )
    mean = alt.Chart(summary).mark_line(color="black").encode(x="step:Q", y="mean:Q")
    dots = (
        alt.Chart(points)
        .mark_circle(size=30, opacity=0.6)
        .encode(
            x="step:Q",
            y="fitness:Q",
            tooltip=["step", *member_tooltip()],
        )
    )
    # the members on top: under the mean line they would hide
    return alt.layer(band, mean, dots).properties(title="population fitness per step", height=260)


def frame(buckets: list[dict], x: str = "step", smoothing: float = 0.0) -> pd.DataFrame:
    """Store buckets (step, value, min, max, wall_time) as a chart frame; wall time becomes
    minutes since the first point, and smoothing applies to the mean line."""
    df = pd.DataFrame(buckets, columns=["step", "value", "min", "max", "wall_time"])
    if x == "wall_time" and not df.empty:
        df["wall_time"] = (df["wall_time"] - df["wall_time"].min()) / 60.0
    if smoothing > 0 and not df.empty:
        df["value"] = ema(df["value"], smoothing).to_numpy()
    return df


def parallel_coordinates(
    lines: pd.DataFrame, ticks: pd.DataFrame, axes: Sequence[str], title: str, mode: str
) -> alt.Chart:
    """One line per run across `axes` (each normalised to 0..1 beforehand, its labels in
    `ticks`), coloured by the objective, brighter the better by `mode`, the best run drawn
    thicker; hovering a line names the run and its value on each axis."""
    x = alt.X("axis:N", sort=list(axes), title=None, axis=alt.Axis(labelAngle=0))
    y = alt.Y("position:Q", axis=None, scale=alt.Scale(domain=[0, 1]))
    rules = (
        alt.Chart(pd.DataFrame({"axis": list(axes), "position": 0.0, "top": 1.0}))
        .mark_rule(color="gray", opacity=0.6)
        .encode(x=x, y=y, y2="top:Q")
    )
    runs = (
        alt.Chart(lines)
        .mark_line(opacity=0.8)
        .encode(
            x=x,
            y=y,
            detail="run:N",
            color=alt.Color(
                "objective:Q",
                title="objective",
                scale=alt.Scale(scheme="viridis", reverse=mode == "min"),
            ),
            strokeWidth=alt.condition("datum.best", alt.value(4), alt.value(1.5)),
            tooltip=["run", "axis", "value", alt.Tooltip("objective:Q", format=".4g")],
        )
    )
    labels = (
        alt.Chart(ticks)
        .mark_text(align="left", dx=4, fontSize=10, color="gray")
        .encode(x=x, y=y, text="label:N")
    )
    return alt.layer(rules, runs, labels).properties(title=chart_title(title), height=320)


def objective_scatter(
    runs: pd.DataFrame, option: str, numeric: bool, log: bool, title: str
) -> alt.Chart:
    """The objective of each run against the one swept option (a log axis where the option
    is drawn on one), coloured by the run's status; the best run drawn larger."""
    kind = "Q" if numeric else "N"
    scale = alt.Scale(type="log") if log else alt.Scale(zero=False)
    x = alt.X(f"{option}:{kind}", title=option, **({"scale": scale} if numeric else {}))
    return (
        alt.Chart(runs)
        .mark_point(filled=True)
        .encode(
            x=x,
            y=alt.Y("objective:Q", title="objective", scale=alt.Scale(zero=False)),
            color=alt.Color("status:N", title=None),
            size=alt.condition("datum.best", alt.value(160), alt.value(60)),
            tooltip=["run", option, alt.Tooltip("objective:Q", format=".4g"), "status"],
        )
        .properties(title=chart_title(title), height=320)
    )
