"""The New run form, generated from engine.config.config_fields() (no option restated here):
each field labelled in people's words with its option name beside it, its help from the
schema, the model and dataset fields offering what the data folder holds, and the run's own
output folder unless told otherwise; its dataset upload, and the configuration diff of
Compare."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import pandas as pd
import streamlit as st

from app import actions
from app.views import inert, show_error
from engine.config import (
    GROUP_TITLES,
    ConfigError,
    FieldSpec,
    RunConfig,
    config_fields,
    flatten,
    read_yaml,
    scalar_errors,
)
from engine.data.datasets import DatasetError
from engine.data.local import dataset_files, default_output_dir, model_folders
from engine.data.uploads import MIB, keep_upload
from engine.model_files import ModelError
from engine.paths import config_path
from engine.rewards import RewardError
from jobs.store.errors import StoreError
from jobs.store.store import Store
from jobs.uploads import clean_uploads

PREFIX = "new_"
ERRORS = PREFIX + "errors"
"""The problems of the last refused submit, by field; shown until the form is fixed."""
Launched = TypeVar("Launched")
# Fields that offer what the data folder holds (any other value may still be typed).
OFFERS: dict[str, Callable[[], list[str]]] = {
    "model": model_folders,
    "train_file": dataset_files,
    "eval_file": dataset_files,
}
PLACEHOLDERS = {"output_dir": "the run's own folder in the data folder, runs/RUN_NAME"}
# The output_dir the form chose itself; it follows the run name until someone edits it.
AUTO_OUTPUT_DIR = PREFIX + "output_dir_auto"
YAML_UPLOAD_MB = 1
"""The largest YAML file the form and its sweep section read: a run configuration or a search
space is a few KiB (a file uploader takes whole MiB)."""


def key(name: str) -> str:
    return PREFIX + name


def yaml_upload_refusal(upload: Any, what: str) -> str | None:
    """Why uploaded YAML file `upload` (a run configuration, a space file: `what`) is not
    read, or None. A file uploader's max_upload_size binds only the browser: the server takes
    files up to server.maxUploadSize, so the size is checked here, before anything decodes."""
    if upload.size <= YAML_UPLOAD_MB * MIB:
        return None
    return (
        f"{upload.name}: {what} may be at most {YAML_UPLOAD_MB} MiB, got "
        f"{upload.size / MIB:.1f} MiB"
    )


def label(spec: FieldSpec) -> str:
    """The option in people's words with its YAML name beside it, e.g.
    "Noise std (sigma) `noise_std`"; required ones end in " *"."""
    return f"{spec.label} `{spec.name}`" + (" *" if spec.required else "")


def shown(value: Any) -> Any:
    """A config value as its widget holds it (numbers and None as text)."""
    if isinstance(value, bool):
        return value
    return "" if value is None else str(value)


def load_into_form(flat: Mapping[str, Any], method: str | None = None) -> None:
    """Put a configuration (a preset, an imported YAML, a clone's parent) into the widgets;
    options it leaves out get their defaults for its method."""
    method = str(flat.get("method") or method or "es")
    for spec in config_fields():
        value = flat.get(spec.name, spec.default_for(method))
        if isinstance(value, str) and value.strip().lower() in ("null", "~"):
            value = None
        if spec.type is bool:
            value = value if isinstance(value, bool) else str(value).strip().lower() == "true"
        elif spec.choices:
            value = value if value in spec.choices else spec.default_for(method)
        elif spec.name in OFFERS:  # a selectbox: a value or None, never ""
            value = shown(value) or None
        else:
            value = shown(value)
        st.session_state[key(spec.name)] = value
    st.session_state[AUTO_OUTPUT_DIR] = None


def name_the_run(base: str) -> None:
    """Give the form's run a name when it has none (BASE-xxxxxx) and, when output_dir is
    empty, the run's own folder under the data folder (data/runs/RUN_NAME)."""
    if not str(st.session_state.get(key("run_name")) or "").strip():
        st.session_state[key("run_name")] = f"{base}-{uuid.uuid4().hex[:6]}"
    if not str(st.session_state.get(key("output_dir")) or "").strip():
        st.session_state[key("output_dir")] = ""
        st.session_state[AUTO_OUTPUT_DIR] = ""
    follow_run_name()


def follow_run_name() -> None:
    """output_dir follows the run name while it is the folder the form chose itself."""
    name = str(st.session_state.get(key("run_name")) or "").strip()
    chosen = st.session_state.get(AUTO_OUTPUT_DIR)
    if name and chosen is not None and st.session_state.get(key("output_dir")) == chosen:
        st.session_state[key("output_dir")] = st.session_state[AUTO_OUTPUT_DIR] = (
            default_output_dir(name)
        )


def parse_yaml(text: str | bytes, source: str = "the YAML") -> dict[str, Any]:
    """A YAML run configuration (flat, nested by group or dotted) as flat option values, read
    as `eslab train` reads a file; the form converts and checks them when it is validated.
    Options the schema does not know are left out, as the form has no widget for them.
    Raises ConfigError naming `source` (and the line of a syntax error), or naming each option
    given a list or mapping (a widget holds one value)."""
    flat, _unknown = flatten(read_yaml(text, source))
    if errors := scalar_errors(flat):
        raise ConfigError(errors, source)
    return flat


def parse_tags(text: str) -> list[str]:
    """The page's "Tags (comma separated)" as tags, each once in its order: the same list
    labels a run queued from the form and every run of a sweep launched from it."""
    return list(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))


def upload_dataset(store: Store, name: str, data: bytes) -> None:
    """Keep an uploaded parquet dataset (see engine.data.uploads) and make it the form's
    train_file. Editors only, checked here where the file is written, as every action
    checks the role where it acts (the page also disables the uploader for a viewer, and
    Streamlit discards what a browser sends for a disabled widget). Says what happened,
    then removes unused old uploads."""
    if not actions.allowed("upload datasets"):
        return
    try:
        kept = keep_upload(data, name)
    except DatasetError as exc:
        st.error(inert(f"dataset refused: {exc}"))
        return
    st.session_state[key("train_file")] = config_path(kept.path)
    st.success(inert(f"{name}: {kept.rows} prompts, saved as {kept.path}"))
    clean_uploads(store)


def ensure_defaults() -> None:
    if key("method") not in st.session_state:
        load_into_form({})
        name_the_run(str(st.session_state[key("method")]))


def _widget(spec: FieldSpec, errors: dict[str, str]) -> None:
    text, k = label(spec), key(spec.name)
    if spec.type is bool:
        st.checkbox(text, key=k, help=spec.help)
    elif spec.choices:
        st.selectbox(text, spec.choices, key=k, help=spec.help)
    elif spec.name in OFFERS:
        current = st.session_state.get(k)
        offered = OFFERS[spec.name]()
        st.selectbox(
            text,
            offered if current in (None, *offered) else [current, *offered],
            key=k,
            help=spec.help,
            accept_new_options=True,
            placeholder="none: choose or type a path" if spec.nullable else "choose or type",
        )
    else:
        st.text_input(
            text,
            key=k,
            help=spec.help,
            placeholder=PLACEHOLDERS.get(spec.name, "none" if spec.nullable else None),
            on_change=follow_run_name if spec.name == "run_name" else None,
        )
    if spec.name in errors:
        st.error(inert(errors[spec.name]), icon=":material/error:")


def render_fields(errors: dict[str, str]) -> None:
    """Every option, grouped as the schema groups them; errors show under their field."""
    method = st.session_state.get(key("method"), "es")
    specs = config_fields()
    groups: dict[str, list[FieldSpec]] = {}
    for spec in specs:
        groups.setdefault(spec.group, []).append(spec)
    for group, members in groups.items():
        members = [s for s in members if method in s.methods]
        if not members:
            continue
        failing = any(s.name in errors for s in members)
        with st.expander(GROUP_TITLES[group], expanded=group in ("", "data", "reward") or failing):
            cols = st.columns(2)
            for i, spec in enumerate(members):
                with cols[i % 2]:
                    _widget(spec, errors)


def form_values(state: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The flat values the widgets hold (in `state`, the session's by default); empty text
    means 'not set' (the schema default), and for output_dir the run's own folder."""
    state = st.session_state if state is None else state
    method = state.get(key("method"), "es")
    values: dict[str, Any] = {}
    for spec in config_fields():
        if method not in spec.methods:
            continue
        value = state.get(key(spec.name))
        if value is None or (isinstance(value, str) and not value.strip()):
            if spec.nullable:
                values[spec.name] = None
            continue
        values[spec.name] = value
    if "output_dir" not in values and values.get("run_name"):
        values["output_dir"] = default_output_dir(str(values["run_name"]))
    return values


def validate(values: Mapping[str, Any]) -> tuple[RunConfig | None, dict[str, str]]:
    """The configuration, or the problems keyed by field (one message per field)."""
    try:
        return RunConfig.from_flat(values), {}
    except ConfigError as exc:
        errors: dict[str, str] = {}
        for e in exc.errors:
            errors.setdefault(e.field, e.message)
        return None, errors


def config_diff(
    configs: Mapping[str, Mapping[str, Any]], only_differences: bool = True
) -> pd.DataFrame:
    """One row per option, one column per run; with only_differences, the rows whose values
    are not all equal (an option a run lacks counts as different)."""
    names = list(configs)
    options: list[str] = []
    for flat in configs.values():
        options += [k for k in flat if k not in options]
    rows = []
    for option in options:
        values = [configs[n].get(option, "(missing)") for n in names]
        if only_differences and all(v == values[0] for v in values[1:]):
            continue
        rows.append({"option": option, **{n: shown(v) for n, v in zip(names, values, strict=True)}})
    return pd.DataFrame(rows, columns=["option", *names])


def launched(launch: Callable[[], Launched]) -> Launched | None:
    """What `launch` (queue a run, start a sweep) returns, or None when it was refused: a
    ConfigError goes under the fields it names (the page reruns to show it), and what the run
    would read (dataset, reward function, model) or the database refusing is said on the
    page. Both forms refuse the same way, whatever they launch."""
    try:
        return launch()
    except ConfigError as exc:
        st.session_state[ERRORS] = {e.field: e.message for e in exc.errors}
        st.rerun()
    except (DatasetError, RewardError, ModelError, StoreError) as exc:
        show_error(exc)
    return None
