"""New run: a form generated from the configuration schema, presets (what each is for and
needs, and a button that generates its missing data), YAML in and out, a parquet upload
(editors only, size-capped, kept only once it loads as a dataset; a larger one through the
upload route, app/upload_route.py, with a ticket minted here);
submitting queues the run the way `eslab submit` does and opens its page. `?clone=ID`
starts from another run's config. Below the form, the Sweep section (app/sweep_form.py)
starts a sweep over the form's configuration instead; `?sweep=1` opens with it on."""

import uuid

import streamlit as st

from app import actions, auth, forms, presets_view, sweep_form, tickets, upload_route
from app.state import get_store
from app.views import id_param, inert, page_origin, param, show_error, tab_ticket
from engine.config import ConfigError, config_fields
from engine.data.uploads import FORM_UPLOAD_MB, max_upload_mb
from engine.filenames import safe_file_name
from engine.presets import load_preset, preset_names
from engine.rewards import BUILTIN_REWARDS
from jobs.store.errors import StoreError

st.title("New run")
store = get_store()
# Streamlit forgets widget values once their page is left: a fresh form starts over.
fresh = forms.key("method") not in st.session_state
if fresh:
    st.session_state[forms.ERRORS] = {}
    st.session_state[sweep_form.ON] = param("sweep") == "1"
    st.session_state[sweep_form.TRIED] = False
clone = id_param("clone")
if clone and (fresh or st.session_state.get("new_cloned") != clone):
    try:
        parent = store.get_run(clone)
    except StoreError as exc:
        show_error(exc)
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
    st.session_state[forms.ERRORS] = {}
forms.ensure_defaults()
if clone:
    st.info(f"Cloning run {inert(clone)}: change what you need and queue it.")
editor = auth.can_edit()
if not editor:
    st.info(
        "You are a viewer: you can look at the form and export YAML; queueing a run "
        "needs an editor."
    )


def _preset() -> None:
    """The preset's options, under a run name and output folder of the run's own (the
    preset's fixed folder would be shared by every run of it)."""
    name = st.session_state["new_preset"]
    if name:
        forms.load_into_form({**load_preset(name).to_flat(), "run_name": None, "output_dir": None})
        forms.name_the_run(name)
        st.session_state[forms.ERRORS] = {}


def _reward() -> None:
    name = st.session_state["new_builtin_reward"]
    if name:
        st.session_state[forms.key("reward_func_path")] = BUILTIN_REWARDS[name]


def _larger_upload() -> None:
    """The upload page's link and a curl command, each with a ticket of this tab's login
    (app/tickets.py): the dataset goes to disk as it arrives, never into memory."""
    page, curl = upload_route.upload_links(page_origin(), tab_ticket(tickets.UPLOAD))
    minutes = tickets.TICKET_TTL_S // 60
    with st.expander(f"Upload a larger dataset (up to {max_upload_mb()} MiB)"):
        st.link_button("Open the upload page", page, icon=":material/upload:")
        st.caption(
            f"Or from a shell (the ticket is yours, valid {minutes} minutes from this page's "
            "last refresh): the reply names the file to choose as the training dataset."
        )
        st.code(curl, language="bash")


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
    imported = c3.file_uploader(
        "Import YAML", type=["yaml", "yml"], key="new_yaml", max_upload_size=forms.YAML_UPLOAD_MB
    )
    if imported is not None and st.session_state.get("new_yaml_done") != imported.file_id:
        st.session_state["new_yaml_done"] = imported.file_id
        refused = forms.yaml_upload_refusal(imported, "a run configuration")
        if refused:
            st.session_state[forms.ERRORS] = {"config": refused}
        else:
            try:
                forms.load_into_form(forms.parse_yaml(imported.getvalue(), imported.name))
                forms.name_the_run(str(st.session_state[forms.key("method")]))
                st.session_state[forms.ERRORS] = forms.validate(forms.form_values())[1]
            except ConfigError as exc:
                st.session_state[forms.ERRORS] = {e.field: e.message for e in exc.errors}
    upload = st.file_uploader(
        "Upload a training dataset (parquet: prompt, reward_func_args)",
        type=["parquet"],
        key="new_parquet",
        max_upload_size=FORM_UPLOAD_MB,
        disabled=not editor,
        help=f"Up to {FORM_UPLOAD_MB} MiB here; a larger one: 'Upload a larger dataset'."
        if editor
        else "Uploading a dataset needs an editor.",
    )
    if upload is not None and st.session_state.get("new_parquet_done") != upload.file_id:
        st.session_state["new_parquet_done"] = upload.file_id
        forms.upload_dataset(store, upload.name, upload.getvalue())
    if editor:
        _larger_upload()
if st.session_state.get("new_preset"):
    presets_view.show_preset(st.session_state["new_preset"])

# Validate what the widgets hold now; once a submit has failed, errors follow every edit.
config, problems = forms.validate(forms.form_values())
errors: dict[str, str] = st.session_state.get(forms.ERRORS, {})
if errors:
    # Keep what live validation cannot re-check: YAML problems and a busy output_dir.
    schema = {f.name for f in config_fields()} - {"output_dir"}
    errors = {**{k: v for k, v in errors.items() if k not in schema}, **problems}
if "config" in errors:
    st.error(inert(errors["config"]))
tags = forms.parse_tags(st.text_input("Tags (comma separated)", key="new_tags"))
forms.render_fields(errors)

left, right = st.columns(2)
if config is not None:
    right.download_button(
        "Export YAML",
        config.to_yaml(),
        safe_file_name(config.logging.run_name or "run", ".yaml", "run"),
        "text/yaml",
        icon=":material/download:",
    )
if left.button("Queue run", type="primary", icon=":material/rocket_launch:", disabled=not editor):
    if problems:
        st.session_state[forms.ERRORS] = problems
        st.rerun()
    run = forms.launched(lambda: actions.launch(store, config, parent_id=clone, tags=tags))
    if run is not None:
        st.session_state[forms.ERRORS] = {}
        st.switch_page(actions.RUN_PAGE, query_params={"run": str(run.id)})
if errors:
    st.error(
        inert(f"{len(errors)} problem(s): " + "; ".join(f"{k}: {v}" for k, v in errors.items()))
    )

sweep_form.section(store, config, problems, editor, tags)
