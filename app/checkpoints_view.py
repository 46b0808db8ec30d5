"""The Run page's Checkpoints tab: the run's recorded checkpoints, each on this machine with a
download link (the route app/checkpoint_route.py, a ticket of this tab's login for that
checkpoint alone in the link), and the `eslab export` command that writes the chosen one
on the server."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import checkpoint_route, exports, tickets
from app.views import MISSING, page_origin, tab_ticket
from engine.paths import resolve_path
from engine.trainer.checkpoints import best_checkpoint
from jobs.store.records import CheckpointRecord, RunRecord
from jobs.store.store import Store

DOWNLOAD = "download"


def checkpoints_tab(store: Store, run: RunRecord) -> None:
    ckpts = store.checkpoints(run.id)
    if not ckpts:
        st.info("No checkpoints yet.")
        return
    output_dir = run.config.get("output_dir")
    best = best_checkpoint(resolve_path(output_dir)) if output_dir else None
    on_disk = [c for c in ckpts if resolve_path(c.path).is_dir()]
    rows = [
        {
            **c.__dict__,
            "best": resolve_path(c.path) == best,
            DOWNLOAD: download_link(run, c) if c in on_disk else None,
        }
        for c in ckpts
    ]
    st.dataframe(
        pd.DataFrame(rows),
        hide_index=True,
        placeholder=MISSING,
        column_config={DOWNLOAD: st.column_config.LinkColumn(display_text="tar")},
    )
    if not on_disk:
        return
    st.caption(
        f"A download link holds a ticket of your login for that checkpoint, valid "
        f"{tickets.TICKET_TTL_S // 60} minutes from this page's last refresh; the tar is "
        "streamed, never held in the server's memory."
    )
    chosen = st.selectbox(
        "Checkpoint",
        on_disk,
        index=len(on_disk) - 1,
        format_func=lambda c: (
            f"step {c.step}: {c.path}" + (" (best)" if resolve_path(c.path) == best else "")
        ),
    )
    st.caption(
        "On the server, this writes it as a tar (without `--out`, to stdout: "
        "`ssh SERVER eslab export ... > FILE.tar`):"
    )
    st.code(exports.checkpoint_command(run, chosen.step), language="bash")
    if not (resolve_path(chosen.path) / "config.json").is_file():
        st.caption(
            "A cancel's checkpoint: the fp32 master weights and the trainer state, what "
            "`eslab resume` needs, without the Hugging Face folder (the final model has it)."
        )


def download_link(run: RunRecord, checkpoint: CheckpointRecord) -> str:
    """The route's address for `checkpoint` of `run`, with a fresh ticket bound to both."""
    ticket = tab_ticket(tickets.DOWNLOAD, checkpoint_route.subject(run.id, checkpoint.step))
    return checkpoint_route.download_link(page_origin(), run.id, checkpoint.step, ticket)
