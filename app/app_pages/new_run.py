"""New run: a form generated from the configuration schema, presets, YAML in and out, a
parquet upload checked before it is accepted; submitting queues the run the way
`eslab submit` does and opens its page. `?clone=ID` starts from another run's config."""

import uuid
from pathlib import Path

import streamlit as st

from app import actions, auth, forms
from app.state import get_store
from app.views import id_param
from engine.config import ConfigError, config_fields
from engine.data.datasets import DatasetError, load_dataset
from engine.model_files import ModelError
from engine.paths import resolve_path
from engine.presets import load_preset, preset_names
from engine.rewards import BUILTIN_REWARDS, RewardError
from jobs.store.errors import StoreError

UPLOADS = "data/uploads"  # relative to the project root, like every config path

st.title("New run")
store = get_store()
# Streamlit forgets widget values once their page is left: a fresh form starts over.
fresh = forms.key("method") not in st.session_state
if fresh:
    st.session_state["new_errors"] = {}
clone = id_param("clone")
if clone and (fresh or st.session_state.get("new_cloned") != clone):
    try:
        parent = store.get_run(clone)
    except StoreError as exc:
        st.error(str(exc))
        st.stop()
    suffix = uuid.uuid4().hex[:6]
    forms.load_into_form(
        {
            **parent.config,
            "run_name": f"{parent.name}-clone-{suffix}",
            "output_dir": f"{str(parent.config.get('output_dir')).rstrip('/')}-clone-{suffix}",
        }
    )
    st.session_state["new_cloned"] = clone
    st.session_state["new_errors"] = {}
forms.ensure_defaults()
if clone:
    st.info(f"Cloning run {clone}: change what you need and queue it.")
editor = auth.can_edit()
if not editor:
    st.info(
        "You are a viewer: you can look at the form and export YAML; queueing a run "
        "needs an editor."
    )


def _preset() -> None:
    name = st.session_state["new_preset"]
    if name:
        forms.load_into_form(load_preset(name).to_flat())
        st.session_state["new_errors"] = {}


def _reward() -> None:
    name = st.session_state["new_builtin_reward"]
    if name:
        st.session_state[forms.key("reward_func_path")] = BUILTIN_REWARDS[name]


with st.container(border=True):
    c1, c2, c3 = st.columns(3)
    c1.selectbox(
        "Preset",
        ["", *preset_names()],
        key="new_preset",
        on_change=_preset,
        format_func=lambda n: n or "choose a preset",
    )
    c2.selectbox(
        "Built-in reward",
        ["", *BUILTIN_REWARDS],
        key="new_builtin_reward",
        on_change=_reward,
        format_func=lambda n: n or "choose a reward function",
    )
    imported = c3.file_uploader("Import YAML", type=["yaml", "yml"], key="new_yaml")
    if imported is not None and st.session_state.get("new_yaml_done") != imported.file_id:
        try:
            forms.load_into_form(forms.parse_yaml(imported.getvalue(), imported.name))
            st.session_state["new_errors"] = forms.validate(forms.form_values())[1]
        except ConfigError as exc:
            st.session_state["new_errors"] = {e.field: e.message for e in exc.errors}
        st.session_state["new_yaml_done"] = imported.file_id
    upload = st.file_uploader(
        "Upload a training dataset (parquet: prompt, reward_func_args)",
        type=["parquet"],
        key="new_parquet",
    )
    if upload is not None and st.session_state.get("new_parquet_done") != upload.file_id:
        relative = f"{UPLOADS}/{uuid.uuid4().hex[:8]}-{Path(upload.name).name}"
        target = resolve_path(relative)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(upload.getvalue())
        try:
            rows = len(load_dataset(target))
        except DatasetError as exc:
            target.unlink()
            st.error(f"dataset refused: {exc}")
        else:
            st.session_state[forms.key("train_file")] = relative
            st.success(f"{upload.name}: {rows} prompts, saved as {relative}")
        st.session_state["new_parquet_done"] = upload.file_id

# Validate what the widgets hold now; once a submit has failed, errors follow every edit.
config, problems = forms.validate(forms.form_values())
errors: dict[str, str] = st.session_state.get("new_errors", {})
if errors:
    # Keep what live validation cannot re-check: YAML problems and a busy output_dir.
    schema = {f.name for f in config_fields()} - {"output_dir"}
    errors = {**{k: v for k, v in errors.items() if k not in schema}, **problems}
if "config" in errors:
    st.error(errors["config"])
tags = st.text_input("Tags (comma separated)", key="new_tags")
forms.render_fields(errors)

left, right = st.columns(2)
if config is not None:
    right.download_button(
        "Export YAML", config.to_yaml(), "run.yaml", "text/yaml", icon=":material/download:"
    )
if left.button("Queue run", type="primary", icon=":material/rocket_launch:", disabled=not editor):
    if problems:
        st.session_state["new_errors"] = problems
        st.rerun()
    try:
        run = actions.launch(
            store,
            config,
            parent_id=clone,
            tags=[t.strip() for t in tags.split(",") if t.strip()],
        )
    except ConfigError as exc:
        st.session_state["new_errors"] = {e.field: e.message for e in exc.errors}
        st.rerun()
    except (DatasetError, RewardError, ModelError, StoreError) as exc:
        st.error(str(exc))
    else:
        if run is not None:  # None: refused, and actions.launch said why
            st.session_state["new_errors"] = {}
            st.switch_page(actions.RUN_PAGE, query_params={"run": str(run.id)})
if errors:
    st.error(f"{len(errors)} problem(s): " + "; ".join(f"{k}: {v}" for k, v in errors.items()))
