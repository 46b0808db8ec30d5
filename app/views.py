"""Small helpers the pages share: URL state, tickets for the routes beside the dashboard,
run labels and table rows, and how text that
people wrote (run names, tags, errors, completions, file names) is shown: as text.

Streamlit renders Markdown in titles, captions, alerts and widget labels: a run named
`[click](javascript:...)` or `![x](http://host/x.png)` would be a link or an image that loads
from another server when a collaborator opens the page. Every such text goes through
`inert` (one line) or `show_error` (an error with its details); long text goes to st.text,
st.code or a dataframe, which render nothing."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import streamlit as st

from app import auth, tickets
from jobs.outcome import LOG_TAIL
from jobs.store.records import RunRecord

# Every ASCII punctuation character: CommonMark reads each one after a backslash as itself,
# so no link, image, HTML, heading, list, emphasis, table, LaTeX ($) or Streamlit directive
# (:red[...]) can start, and no autolink (its "://", "www." or "@") can be recognised.
_MARKDOWN_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")
_DECIMAL = re.compile(r"[0-9]{1,19}")
MAX_ID = 2**63 - 1
"""The largest run id (a 64-bit database integer)."""
MAX_PAGE = 1_000_000
MISSING = "-"
"""What every page shows for a value that is not there (st.dataframe's `placeholder` too)."""
TRACEBACK = "Traceback (most recent call last):"


def param(name: str, default: str = "") -> str:
    return st.query_params.get(name, default)


def plain_number(text: str) -> int | None:
    """`text` as a number from 0 when it is written plainly (at most 19 ASCII digits), else
    None. str.isdigit() also passes '²', which int() refuses, and other scripts' digits ('٣'),
    which int() reads as another number; int() alone also reads ' 5', '+5' and '1_000'."""
    return int(text) if _DECIMAL.fullmatch(text) else None


def whole_number(text: str, maximum: int = MAX_ID) -> int | None:
    """`text` as a number from 1 to `maximum` when it is written plainly, else None (an id
    past 64 bits would make the database raise instead of answering 'no such run')."""
    number = plain_number(text)
    return number if number is not None and 1 <= number <= maximum else None


def id_params(name: str, what: str = "run", most: int | None = None) -> list[int]:
    """The ids (of runs, or of `what`) of `?name=ID,ID,...` (none when absent), each once, in
    the order first named. Anything else than plain decimal numbers, or more than `most` ids,
    stops the page with a message saying what the address needs: every id costs the page
    queries, and an address is something anyone may hand-edit."""
    ids = [whole_number(x) for x in param_list(name)]
    if None in ids:
        st.error(
            f"This page's address has a bad `{name}` value: it takes {what} ids, plain decimal "
            f"numbers such as `?{name}=12`."
        )
        st.stop()
    unique = list(dict.fromkeys(i for i in ids if i is not None))
    if most is not None and len(unique) > most:
        st.error(
            f"This page's address names {len(unique)} {what}s in `{name}`: it takes at most "
            f"{most}. Remove some from the address, or select fewer."
        )
        st.stop()
    return unique


def id_param(name: str, what: str = "run") -> int | None:
    """The id of `?name=ID`, None when absent; otherwise as `id_params`."""
    ids = id_params(name, what)
    if len(ids) > 1:
        st.error(f"This page's address has several `{name}` ids: it takes one, e.g. `?{name}=12`.")
        st.stop()
    return ids[0] if ids else None


def page_param(name: str = "page") -> int:
    """The page number of `?page=N`, 1 when absent; anything but a plain decimal number up to
    MAX_PAGE shows a warning and page 1."""
    raw = param(name)
    number = whole_number(raw, MAX_PAGE) if raw else 1
    if number is None:
        st.warning(
            f"This page's address has a bad `{name}` value: it takes a page number from 1 to "
            f"{MAX_PAGE}; showing page 1."
        )
        return 1
    return number


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


def page_origin() -> str:
    """`scheme://host:port` of the dashboard as this tab reached it ("" when unknown): the
    routes beside the dashboard answer on the same address."""
    url = urlsplit(st.context.url or "")
    return f"{url.scheme}://{url.netloc}" if url.netloc else ""


def tab_ticket(purpose: tickets.Purpose, subject: str = "") -> str:
    """A ticket of this tab's login (auth.LOCAL_USER's when logins are off) for `purpose` on
    `subject` (app/tickets.py)."""
    session = st.session_state.get(auth.SESSION_KEY) if auth.auth_path() else None
    return tickets.mint(session or tickets.local_session(), purpose, subject)


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


def show_run_error(text: str) -> None:
    """A failed run's error: what went wrong in words first, then the traceback or the end of
    the worker's log behind an expander (see `error_parts`)."""
    summary, details, title = error_parts(text)
    st.error("  \n".join(inert(line) for line in summary.splitlines()))
    if details:
        with st.expander(title):
            st.code(details, language=None)


def error_parts(text: str) -> tuple[str, str | None, str]:
    """(summary, details, what the details are) of a run's error. The worker stores its
    traceback, whose last exception is the summary; the scheduler stores why it ended the
    run and the end of the worker's log, in which the last exception, if any, is named."""
    text = str(text).strip()
    reason, marker, tail = text.partition(f"; {LOG_TAIL}\n")
    if marker:
        last = last_exception(tail)
        summary = (
            f"{reason}.\nThe last error in its log: {last.splitlines()[0]}" if last else reason
        )
        return summary, tail, "The end of the worker's log"
    last = last_exception(text)
    if last is not None:
        return last, text, "Traceback"
    return text, None, ""


def last_exception(text: str) -> str | None:
    """The exception that ends the last traceback in `text` (its type and message: the
    lines after the traceback's last indented frame line), None when there is none."""
    start = text.rfind(TRACEBACK)
    if start < 0:
        return None
    lines = text[start:].splitlines()[1:]
    last_frame = max((n for n, line in enumerate(lines) if line[:1].isspace()), default=-1)
    exception = [line for line in lines[last_frame + 1 :] if line.strip()]
    return "\n".join(exception) or None


def cell(value: Any) -> str:
    """A value as table text, MISSING when there is none (a column of text, never of mixed
    types, which Arrow cannot convert)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    return str(value)


def number(value: float | None, digits: int = 4) -> str:
    """A number in a sentence: `digits` significant digits, MISSING when there is none."""
    text = cell(value)
    return text if text == MISSING else f"{value:.{digits}g}"


def label(run: RunRecord) -> str:
    return f"{run.name} (#{run.id})"


def mode(run: RunRecord) -> str:
    """How the run perturbs its members: `full` (full-rank noise, one member at a time),
    `full batched` (full-rank noise on the linear weights, all members in one call), or
    `lora rR` (a rank-R adapter per member, all evaluated in one call), `+ adapter` when the
    update is kept as a trained adapter rather than merged."""
    config = run.config
    perturbation = config.get("perturbation", "full")
    if perturbation == "full_batched":
        return "full batched"
    if perturbation != "lora":
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


def elapsed(run: RunRecord, now: datetime | None = None) -> float | None:
    """Seconds the run has been running (to its end once it has finished), as of `now` (the
    database's time, in which it started; this host's clock when not given)."""
    if run.started_at is None:
        return None
    end = run.finished_at or now or datetime.now(UTC)
    return max(0.0, (end - run.started_at).total_seconds())


def eta(run: RunRecord, now: datetime | None = None) -> float | None:
    """Seconds left at the pace so far, as of `now` (as `elapsed`); None before the first
    step or after the end."""
    spent = elapsed(run, now)
    if spent is None or not run.step or not run.total_steps or run.status.is_terminal():
        return None
    return spent / run.step * max(0, run.total_steps - run.step)


def utc_time(moment: datetime) -> str:
    """A moment as a page that is not redrawn as time passes says it: `2026-11-29 18:20:31
    UTC`, true however long ago it was."""
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return MISSING
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h {m:02d}m" if h else f"{m}m {s:02d}s"
