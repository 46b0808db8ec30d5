"""The New run form's preset panel: what the chosen preset is for and what it needs, and,
when its datasets are missing, a button that writes them with the engine functions the
`eslab data` command named in the preset calls (in this process, not a subprocess)."""

from __future__ import annotations

import streamlit as st

from app import actions
from app.cli.data import generate
from app.views import inert
from engine.data.datasets import DatasetError
from engine.presets import load_preset, missing_files, preset_info


def show_preset(name: str) -> None:
    """What preset `name` is for, what it needs and whether its model and data are there."""
    info = preset_info(name)
    with st.container(border=True):
        st.markdown(f"**{inert(name)}**: {inert(info.purpose)}")
        for need in info.needs:
            st.warning(inert(f"Needs {need}"), icon=":material/warning:")
        missing = []
        for m in missing_files(load_preset(name)):
            if m.option != "model":
                missing.append(m.named)
                continue
            st.warning(
                inert(f"Its model folder {m.named} is missing (looked for at {m.where})"),
                icon=":material/warning:",
            )
        if not missing:
            return
        listed = ", ".join(missing)
        if info.data_command is None:
            st.error(inert(f"Its datasets are missing: {listed}"))
            return
        st.warning(
            inert(f"Generate its data first ({listed} missing); this command writes it:"),
            icon=":material/database:",
        )
        st.code(info.data_command, language="bash")
        if st.button("Generate the data", key="new_generate_data", icon=":material/build:"):
            _generate(info.data_command)


def _generate(command: str) -> None:
    """Editors only: it writes files on the server, as an upload does."""
    if not actions.allowed("generate datasets"):
        return
    with st.status(inert(f"Running {command}"), expanded=True) as status:
        try:
            result = generate(command)
        except DatasetError as exc:
            status.update(label="The data could not be generated", state="error")
            st.error(inert(exc))
            return
        status.update(label="Data generated", state="complete")
        st.success(inert(result.summary))
