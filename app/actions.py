"""Run and sweep actions shared by the pages; the work happens in jobs/ (the same calls as
`eslab submit` / `eslab cancel` / `eslab resume` / `eslab sweep`), the page only shows the
outcome.

Each action checks the user's role here, where it runs (app.auth.require_editor), so a
viewer is refused even if a button were shown; the pages also hide or disable them."""

from __future__ import annotations

from collections.abc import Sequence

import streamlit as st

from app import auth, live
from app.views import inert
from engine.config import RunConfig
from jobs.launch import queue_run
from jobs.store.errors import StoreError
from jobs.store.records import RunRecord, SweepRecord
from jobs.store.status import RunStatus
from jobs.store.store import Store
from jobs.sweeps import driver
from jobs.sweeps.spec import SweepSpec

RUN_PAGE = "app_pages/run.py"
NEW_PAGE = "app_pages/new_run.py"
COMPARE_PAGE = "app_pages/compare.py"
MAX_COMPARE_RUNS = 12
"""The most runs Compare shows at once: each costs the page a chart line, queries and a
column of completions."""
SWEEP_PAGE = "app_pages/sweep.py"


def allowed(action: str) -> bool:
    """True when the user may `action`; otherwise shows why (st.error) and returns False."""
    try:
        auth.require_editor(action)
    except auth.PermissionDenied as exc:
        st.error(str(exc))
        return False
    return True


def launch(
    store: Store, config: RunConfig, *, parent_id: int | None = None, tags: Sequence[str] = ()
) -> RunRecord | None:
    """Queue a run as `eslab submit` does; None when the user may not. Errors of the run's
    configuration (ConfigError, DatasetError, ...) reach the caller, which shows them."""
    if not allowed("launch runs"):
        return None
    return queue_run(store, config, parent_id=parent_id, tags=tags)


def launch_sweep(
    store: Store,
    base: RunConfig,
    spec: SweepSpec,
    *,
    name: str | None = None,
    tags: Sequence[str] = (),
) -> SweepRecord | None:
    """Start a sweep as `eslab sweep` does (its runs tagged `tags` besides `sweep:NAME`),
    recording who started it; None when the user may not. Errors of the base configuration
    or the name reach the caller, which shows them."""
    if not allowed("start sweeps"):
        return None
    user = auth.current_user()
    by = user.name if user else None
    return driver.start_sweep(store, base, spec, name=name, created_by=by, tags=tags)


def cancel_sweep(store: Store, sweep_id: int) -> None:
    """Cancel a sweep and its queued and running runs, as `eslab cancel --sweep` does."""
    if not allowed("cancel sweeps"):
        return
    try:
        runs = driver.cancel_sweep(store, sweep_id)
    except StoreError as exc:
        st.error(str(exc))
        return
    live.forget_sweep(sweep_id)
    live.forget([r.id for r in runs])
    st.toast(f"sweep {sweep_id} cancelled, and {len(runs)} of its runs")


def cancel(store: Store, run_id: int) -> None:
    if not allowed("cancel runs"):
        return
    try:
        run = store.request_cancel(run_id)
    except StoreError as exc:
        st.error(str(exc))
        return
    live.forget([run_id])
    st.toast(f"run {run.id} is {run.status.value}")


def resume(store: Store, run_id: int) -> None:
    from jobs.worker import latest_checkpoint

    if not allowed("resume runs"):
        return
    try:
        checkpoint = latest_checkpoint(store, run_id)
        run = store.resume_run(run_id, checkpoint.step if checkpoint else 0)
    except StoreError as exc:
        st.error(str(exc))
        return
    live.forget([run_id])
    st.toast(f"run {run.id} queued again (attempt {run.attempt})")


def clone(run_id: int) -> None:
    """Open New run prefilled with the run's configuration."""
    if allowed("clone runs"):
        st.switch_page(NEW_PAGE, query_params={"clone": str(run_id)})


def delete(store: Store, runs: Sequence[RunRecord]) -> bool:
    """Delete `runs` and everything they recorded; False (with the reason shown) if not."""
    if not allowed("delete runs"):
        return False
    try:
        for r in runs:
            try:
                store.delete_run(r.id)
            except StoreError as exc:
                st.error(str(exc))
                return False
    finally:
        live.forget([r.id for r in runs])
    return True


@st.dialog("Delete runs?")
def confirm_delete(store: Store, runs: list[RunRecord]) -> None:
    """Ask first; deleting removes every metric, sample and event of the runs."""
    st.write(
        "This removes everything these runs recorded from the database "
        "(their output folders stay on disk):"
    )
    st.markdown("\n".join(f"- {inert(r.name)} (#{r.id})" for r in runs))
    if st.button("Delete", type="primary", key="delete_confirm") and delete(store, runs):
        st.rerun()


def can_delete(run: RunRecord) -> bool:
    return run.status.is_terminal()


def can_cancel(run: RunRecord) -> bool:
    return run.status in (RunStatus.QUEUED, RunStatus.RUNNING)


def can_resume(run: RunRecord) -> bool:
    return run.status in (RunStatus.FAILED, RunStatus.CANCELLED)


def buttons(store: Store, run: RunRecord, prefix: str) -> None:
    """Cancel / clone / resume for one run, each enabled only where its status allows;
    none for a viewer, who gets a line saying why."""
    if not auth.can_edit():
        st.caption("You are a viewer: cancelling, cloning and resuming runs needs an editor.")
        return
    a, b, c = st.columns(3)
    if a.button(
        "Cancel", key=f"{prefix}_cancel", disabled=not can_cancel(run), icon=":material/stop:"
    ):
        cancel(store, run.id)
        st.rerun()
    if b.button("Clone", key=f"{prefix}_clone", icon=":material/content_copy:"):
        clone(run.id)
    if c.button(
        "Resume", key=f"{prefix}_resume", disabled=not can_resume(run), icon=":material/play_arrow:"
    ):
        resume(store, run.id)
        st.rerun()
