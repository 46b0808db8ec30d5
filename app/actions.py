"""Run actions shared by the Runs and Run pages; the work happens in jobs/ (the same calls
as `eslab cancel` / `eslab resume`), the page only shows the outcome."""

from __future__ import annotations

import streamlit as st

from jobs.store.errors import StoreError
from jobs.store.records import RunRecord
from jobs.store.status import RunStatus
from jobs.store.store import Store

RUN_PAGE = "app_pages/run.py"
NEW_PAGE = "app_pages/new_run.py"
COMPARE_PAGE = "app_pages/compare.py"


def cancel(store: Store, run_id: int) -> None:
    try:
        run = store.request_cancel(run_id)
    except StoreError as exc:
        st.error(str(exc))
        return
    st.toast(f"run {run.id} is {run.status.value}")


def resume(store: Store, run_id: int) -> None:
    from jobs.worker import latest_checkpoint

    try:
        checkpoint = latest_checkpoint(store, run_id)
        run = store.resume_run(run_id, checkpoint.step if checkpoint else 0)
    except StoreError as exc:
        st.error(str(exc))
        return
    st.toast(f"run {run.id} queued again (attempt {run.attempt})")


@st.dialog("Delete runs?")
def confirm_delete(store: Store, runs: list[RunRecord]) -> None:
    """Ask first; deleting removes every metric, sample and event of the runs."""
    st.write("This removes everything these runs recorded from the database "
             "(their output folders stay on disk):")
    st.markdown("\n".join(f"- {r.name} (#{r.id})" for r in runs))
    if st.button("Delete", type="primary", key="delete_confirm"):
        for r in runs:
            try:
                store.delete_run(r.id)
            except StoreError as exc:
                st.error(str(exc))
                return
        st.rerun()


def can_delete(run: RunRecord) -> bool:
    return run.status.is_terminal()


def can_cancel(run: RunRecord) -> bool:
    return run.status in (RunStatus.QUEUED, RunStatus.RUNNING)


def can_resume(run: RunRecord) -> bool:
    return run.status in (RunStatus.FAILED, RunStatus.CANCELLED)


def buttons(store: Store, run: RunRecord, prefix: str) -> None:
    """Cancel / clone / resume for one run, each enabled only where its status allows."""
    a, b, c = st.columns(3)
    if a.button("Cancel", key=f"{prefix}_cancel", disabled=not can_cancel(run),
                icon=":material/stop:"):
        cancel(store, run.id)
        st.rerun()
    if b.button("Clone", key=f"{prefix}_clone", icon=":material/content_copy:"):
        st.switch_page(NEW_PAGE, query_params={"clone": str(run.id)})
    if c.button("Resume", key=f"{prefix}_resume", disabled=not can_resume(run),
                icon=":material/play_arrow:"):
        resume(store, run.id)
        st.rerun()
