"""Small helpers the pages share: URL state, run labels and table rows, and how text that
people wrote (run names, tags, errors, completions, file names) is shown: as text.

Streamlit renders Markdown in titles, captions, alerts and widget labels: a run named
`[click](javascript:...)` or `![x](http://host/x.png)` would be a link or an image that loads
from another server when a collaborator opens the page. Every such text goes through
`inert` (one line) or `show_error` (an error with its details); long text goes to st.text,
st.code or a dataframe, which render nothing."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import streamlit as st

from jobs.store.records import RunRecord

# Every ASCII punctuation character: CommonMark reads each one after a backslash as itself,
# so no link, image, HTML, heading, list, emphasis, table, LaTeX ($) or Streamlit directive
# (:red[...]) can start, and no autolink (its "://", "www." or "@") can be recognised.
_MARKDOWN_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")


def param(name: str, default: str = "") -> str:
    return st.query_params.get(name, default)


def int_param(name: str, default: int) -> int:
    value = param(name)
    return int(value) if value.isdigit() else default


def smoothing_param() -> float:
    """The EMA smoothing in the URL (`smooth`), clamped to the slider's range."""
    try:
        return min(0.99, max(0.0, float(param("smooth", "0") or 0)))
    except ValueError:
        return 0.0


def param_list(name: str) -> list[str]:
    raw = st.query_params.get(name, "")
    return [x for x in raw.split(",") if x]


def set_param(name: str, value: str | Sequence[str] | None) -> None:
    """Keep a view setting in the URL (an empty value removes it)."""
    if isinstance(value, list | tuple):
        value = ",".join(str(v) for v in value)
    if value in (None, ""):
        st.query_params.pop(name, None)
    elif st.query_params.get(name) != str(value):
        st.query_params[name] = str(value)


def inert(text: object) -> str:
    """`text` for an element that renders Markdown, escaped so that it shows as written."""
    return _MARKDOWN_PUNCTUATION.sub(r"\\\1", str(text))


def show_error(text: object) -> None:
    """An error that may quote what people wrote (a stored traceback, a job log's tail, a
    message naming a value): its last line as the alert, the whole text, when it has more
    lines, verbatim in a code block below it."""
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    st.error(inert(lines[-1] if lines else text))
    if len(lines) > 1:
        with st.expander("Details"):
            st.code(str(text), language=None)


def label(run: RunRecord) -> str:
    return f"{run.name} (#{run.id})"


def mode(run: RunRecord) -> str:
    """How the run perturbs its members: `full` (full-rank noise, one member at a time), or
    `lora rR` (a rank-R adapter per member, all evaluated in one call), `+ adapter` when the
    update is kept as a trained adapter rather than merged."""
    config = run.config
    if config.get("perturbation", "full") != "lora":
        return "full"
    text = f"lora r{config.get('lora_rank', '?')}"
    return f"{text} + adapter" if config.get("lora_update") == "adapter" else text


def model_name(run: RunRecord) -> str:
    return Path(str(run.config.get("model") or "")).name


def task_name(run: RunRecord) -> str:
    path = run.config.get("train_file") or ""
    return Path(path).parent.name or Path(path).stem


def progress(run: RunRecord) -> float:
    return run.step / run.total_steps if run.total_steps else 0.0


def elapsed(run: RunRecord) -> float | None:
    """Seconds the run has been running (to its end once it has finished)."""
    if run.started_at is None:
        return None
    end = run.finished_at or datetime.now(UTC)
    return max(0.0, (end - run.started_at).total_seconds())


def eta(run: RunRecord) -> float | None:
    """Seconds left at the pace so far (None before the first step or after the end)."""
    spent = elapsed(run)
    if spent is None or not run.step or not run.total_steps or run.status.is_terminal():
        return None
    return spent / run.step * max(0, run.total_steps - run.step)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h {m:02d}m" if h else f"{m}m {s:02d}s"
