"""The New run page's Sweep section: the form's configuration becomes the base of a sweep over
options picked from the schema (jobs.sweeps.options says which may be swept), each given
values (comma separated, read by the option's own coercion) or a low/high range, with a
method, an objective, a budget and optional early stopping; or a space file pasted or
uploaded as YAML.

The widgets only collect text: `space_mapping` turns them into a space file's mapping and
jobs.sweeps.parse_space reads and checks it, so the form refuses exactly what `eslab sweep
--space` refuses, with the same message, shown under the widget of the field it names."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

import streamlit as st

from app import actions, forms
from app.views import inert
from engine import metrics as mk
from engine.config import ConfigError, FieldSpec, RunConfig, config_fields, read_yaml
from engine.filenames import safe_file_name
from jobs.store.store import Store
from jobs.sweeps.driver import trial_name, trial_tags
from jobs.sweeps.options import NOT_SWEPT
from jobs.sweeps.spec import (
    METHODS,
    MODES,
    RULES,
    SUMMARIES,
    EarlyStopping,
    Objective,
    SweepSpec,
    SweepSpecError,
    parse_space,
)

PREFIX = "sweep_"
ON = PREFIX + "on"
SOURCE = PREFIX + "source"
SOURCES = ("form", "YAML")
YAML_TEXT = PREFIX + "yaml"
YAML_FILE = PREFIX + "yaml_file"
TRIED = PREFIX + "tried"
"""A launch was refused: from then on the section's errors show as the widgets change."""
NO_STOPPING = "none"
SPACE = "space"
"""The error slot of what has no widget of its own (a space file's problems)."""
_INDEX = re.compile(r"\[\d+\]$")


def key(path: str) -> str:
    """The widget key of a space file's path ("objective.metric" -> "sweep_objective.metric")."""
    return PREFIX + path


def option_key(name: str, part: str) -> str:
    return key(f"parameters.{name}.{part}")


def default(cls: type, name: str) -> Any:
    """A default of spec.py's dataclasses, which hold them once."""
    return next(f.default for f in fields(cls) if f.name == name)


def sweepable(method: str) -> list[FieldSpec]:
    """The options a sweep of a `method` run may vary, in the schema's order."""
    return [s for s in config_fields() if method in s.methods and s.name not in NOT_SWEPT]


def numeric(spec: FieldSpec) -> bool:
    return spec.type in (int, float)


# -- from widgets to a space ------------------------------------------------------------


def space_mapping(state: Mapping[str, Any]) -> dict[str, Any]:
    """The space file's mapping the widgets in `state` describe; empty text leaves a key out
    (its default applies, or parse_space says it is required)."""
    mapping: dict[str, Any] = {"method": state.get(key("method"), METHODS[0])}
    for name in ("budget", "parallel", "seed"):
        _put(mapping, name, state.get(key(name)))
    mapping["objective"] = {
        "metric": state.get(key("objective.metric")),
        "mode": state.get(key("objective.mode")),
        "summary": state.get(key("objective.summary")),
    }
    rule = state.get(key("early_stopping.rule"), NO_STOPPING)
    if rule != NO_STOPPING:
        stopping: dict[str, Any] = {"rule": rule}
        for name in ("metric", "min_step", "min_runs") + (("eta",) if rule == "halving" else ()):
            _put(stopping, name, state.get(key(f"early_stopping.{name}")))
        mapping["early_stopping"] = stopping
    mapping["parameters"] = {
        name: _parameter(state, name) for name in state.get(key("parameters"), [])
    }
    return mapping


def _parameter(state: Mapping[str, Any], name: str) -> dict[str, Any]:
    if state.get(option_key(name, "kind")) == "range":
        entry: dict[str, Any] = {"log": bool(state.get(option_key(name, "log")))}
        for bound in ("low", "high"):
            _put(entry, bound, state.get(option_key(name, bound)))
        return entry
    values = state.get(option_key(name, "values"))
    if isinstance(values, str):  # a text field: comma separated, the option reads each
        values = [v.strip() for v in values.split(",") if v.strip()]
    return {"values": list(values or [])}


def _put(mapping: dict[str, Any], name: str, value: Any) -> None:
    if value is not None and str(value).strip():
        mapping[name] = value.strip() if isinstance(value, str) else value


def read_space(state: Mapping[str, Any]) -> dict[str, Any]:
    """The space the section describes: its widgets', or the YAML pasted or uploaded.
    SweepSpecError (at SPACE) when the YAML cannot be read."""
    if state.get(SOURCE) != "YAML":
        return space_mapping(state)
    try:
        return read_yaml(state.get(YAML_TEXT) or "", "the space YAML")
    except ConfigError as exc:
        raise SweepSpecError(SPACE, "; ".join(e.message for e in exc.errors)) from None


def check(state: Mapping[str, Any], base: RunConfig) -> tuple[SweepSpec | None, dict[str, str]]:
    """The sweep the section describes on `base`, or its problem keyed by the widget that
    shows it (parse_space stops at the first)."""
    try:
        return parse_space(read_space(state), base), {}
    except SweepSpecError as exc:
        return None, {slot(exc.field, state.get(SOURCE) == "YAML"): exc.message}


def slot(field: str, from_yaml: bool) -> str:
    """Which widget shows an error at `field`: a list item's under its list
    ("parameters.lr.values[2]" -> "parameters.lr.values"); everything under the YAML's
    text when the space is YAML."""
    return SPACE if from_yaml else _INDEX.sub("", field)


# -- the widgets ------------------------------------------------------------------------


def ensure_defaults(evaluates: bool) -> None:
    """Start values of the widgets, once: the objective is the eval reward when the form's
    run evaluates, else the train reward."""
    split = mk.EVAL if evaluates else mk.TRAIN
    for path, value in (
        ("method", METHODS[0]),
        ("objective.metric", mk.reward_key(split)),
        ("objective.mode", default(Objective, "mode")),
        ("objective.summary", default(Objective, "summary")),
        ("early_stopping.rule", NO_STOPPING),
        ("parameters", []),
    ):
        st.session_state.setdefault(key(path), value)
    st.session_state.setdefault(SOURCE, SOURCES[0])


def error_under(errors: dict[str, str], path: str) -> None:
    if path in errors:
        st.error(inert(errors.pop(path)), icon=":material/error:")


def render(method: str, errors: dict[str, str]) -> None:
    """The section's widgets, each error under the widget of its field; `errors` loses the
    ones shown, so the caller can show the rest."""
    st.radio("Search space from", SOURCES, key=SOURCE, horizontal=True)
    if st.session_state.get(SOURCE) == "YAML":
        _yaml_source(errors)
        return
    _parameters(method, errors)
    _search(errors)
    _objective(errors)
    _stopping(errors)


def _yaml_source(errors: dict[str, str]) -> None:
    upload = st.file_uploader(
        "Upload a space file",
        type=["yaml", "yml"],
        key=YAML_FILE,
        max_upload_size=forms.YAML_UPLOAD_MB,
    )
    refused = upload is not None and forms.yaml_upload_refusal(upload, "a space file")
    if refused:
        st.error(inert(refused), icon=":material/error:")
    elif upload is not None and st.session_state.get(PREFIX + "yaml_done") != upload.file_id:
        st.session_state[PREFIX + "yaml_done"] = upload.file_id
        st.session_state[YAML_TEXT] = upload.getvalue().decode("utf-8", errors="replace")
    st.text_area(
        "Space (YAML)",
        key=YAML_TEXT,
        height=260,
        placeholder="method: random\nbudget: 12\nobjective: {metric: eval/reward/mean}\n"
        "parameters:\n  noise_std: {low: 0.0005, high: 0.005, log: true}",
        help="The format of `eslab sweep --space` (docs/sweeps.md).",
    )
    error_under(errors, SPACE)


def _parameters(method: str, errors: dict[str, str]) -> None:
    specs = {s.name: s for s in sweepable(method)}
    chosen = st.session_state.get(key("parameters"), [])
    st.session_state[key("parameters")] = [n for n in chosen if n in specs]
    st.multiselect(
        "Options to vary",
        list(specs),
        key=key("parameters"),
        format_func=lambda n: f"{specs[n].label} ({n})",
        help="Any option of the run but " + ", ".join(NOT_SWEPT) + " (docs/sweeps.md says why).",
    )
    error_under(errors, "parameters")
    for name in st.session_state[key("parameters")]:
        _parameter_row(specs[name], errors)


def _parameter_row(spec: FieldSpec, errors: dict[str, str]) -> None:
    name = spec.name
    with st.container(border=True):
        c1, c2, c3 = st.columns([2, 1, 4])
        c1.markdown(forms.label(spec).rstrip(" *"), help=spec.help)
        kind = "values"
        if numeric(spec):
            st.session_state.setdefault(option_key(name, "kind"), "values")
            kind = c2.radio(
                "Give",
                ("values", "range"),
                key=option_key(name, "kind"),
                horizontal=True,
                label_visibility="collapsed",
            )
        with c3:
            if kind == "range":
                low, high, log = st.columns([2, 2, 1], vertical_alignment="bottom")
                low.text_input("low", key=option_key(name, "low"))
                high.text_input("high", key=option_key(name, "high"))
                log.checkbox("log", key=option_key(name, "log"), help="draw on a log scale")
            elif spec.choices or spec.type is bool:
                st.multiselect(
                    "values",
                    list(spec.choices or (True, False)),
                    key=option_key(name, "values"),
                )
            else:
                st.text_input(
                    "values, comma separated", key=option_key(name, "values"), placeholder="a, b, c"
                )
        for part in ("", ".values", ".low", ".high", ".log"):
            error_under(errors, f"parameters.{name}{part}")


def _search(errors: dict[str, str]) -> None:
    c1, c2, c3, c4 = st.columns(4)
    c1.selectbox(
        "Method",
        METHODS,
        key=key("method"),
        help="grid: every combination of the values; random: independent draws; tpe: "
        "Optuna's Tree-structured Parzen Estimator, near the best runs so far",
    )
    c2.text_input(
        "Budget (runs)",
        key=key("budget"),
        placeholder="grid: all its points",
        help="How many runs the sweep makes, failed and stopped ones included.",
    )
    c3.text_input(
        "Parallel",
        key=key("parallel"),
        placeholder=str(default(SweepSpec, "parallel")),
        help="The most runs of the sweep queued or running at once.",
    )
    c4.text_input(
        "Sampler seed",
        key=key("seed"),
        placeholder=str(default(SweepSpec, "seed")),
        help="The seed of the random and tpe samplers (not the runs' own seed option).",
    )
    for path in ("method", "budget", "parallel", "seed"):
        error_under(errors, path)


def metric_keys(current: str | None) -> list[str]:
    """The metric keys offered, and a typed one (a reward part's) that is not among them."""
    known = sorted(mk.fixed_keys())
    return known if current in (None, *known) else [current, *known]


def _objective(errors: dict[str, str]) -> None:
    c1, c2, c3 = st.columns([3, 1, 1])
    c1.selectbox(
        "Objective metric",
        metric_keys(st.session_state.get(key("objective.metric"))),
        key=key("objective.metric"),
        accept_new_options=True,
        help="The metric that ranks the runs (docs/metrics.md); a reward part's statistic, "
        "e.g. eval/accuracy/mean, may be typed.",
    )
    c2.selectbox("Mode", MODES, key=key("objective.mode"), help="max: higher is better")
    c3.selectbox(
        "Summary", SUMMARIES, key=key("objective.summary"), help="a run's last value or its best"
    )
    for path in ("objective", "objective.metric", "objective.mode", "objective.summary"):
        error_under(errors, path)


def _stopping(errors: dict[str, str]) -> None:
    rule = st.selectbox(
        "Early stopping",
        (NO_STOPPING, *RULES),
        key=key("early_stopping.rule"),
        help="median: stop a run worse than the median of the others at its step; halving: "
        "asynchronous successive halving (docs/sweeps.md).",
    )
    if rule != NO_STOPPING:
        c1, c2, c3, c4 = st.columns([3, 1, 1, 1])
        c1.selectbox(
            "Metric compared",
            metric_keys(st.session_state.get(key("early_stopping.metric"))),
            key=key("early_stopping.metric"),
            index=None,
            accept_new_options=True,
            placeholder="the objective's",
        )
        c2.text_input(
            "From step",
            key=key("early_stopping.min_step"),
            placeholder=str(default(EarlyStopping, "min_step")),
            help="No run is stopped before this step.",
        )
        c3.text_input(
            "Min runs",
            key=key("early_stopping.min_runs"),
            placeholder=str(default(EarlyStopping, "min_runs")),
            help="No run is stopped while fewer other runs can be compared with it.",
        )
        if rule == "halving":
            c4.text_input(
                "eta",
                key=key("early_stopping.eta"),
                placeholder=str(default(EarlyStopping, "eta")),
                help="The reduction factor: rungs at min_step * eta**k.",
            )
    for name in ("", ".rule", ".metric", ".min_step", ".min_runs", ".eta"):
        error_under(errors, f"early_stopping{name}")


# -- the section ------------------------------------------------------------------------


def section(
    store: Store,
    config: RunConfig | None,
    problems: dict[str, str],
    editor: bool,
    tags: Sequence[str],
) -> None:
    """The Sweep section under the form: off, a line saying what it does; on, the search
    and a Launch button that starts the sweep as `eslab sweep` does (actions.launch_sweep),
    its runs tagged with the page's `tags`, and opens its page. Once a launch has been
    refused, errors follow every edit."""
    with st.container(border=True):
        if not st.toggle("Sweep: runs of this configuration over a search space", key=ON):
            st.caption(
                "Vary options of this run (values or ranges) over several runs ranked by an "
                "objective: grid, random or tpe search, optional early stopping."
            )
            return
        method = str(st.session_state.get(forms.key("method"), "es"))
        ensure_defaults(st.session_state.get(forms.key("eval_strategy"), "no") != "no")
        spec, errors = check(st.session_state, config) if config is not None else (None, {})
        shown = dict(errors) if st.session_state.get(TRIED) else {}
        render(method, shown)
        for message in shown.values():  # those without a widget of their own
            st.error(inert(message))
        if config is not None and spec is not None:
            _summary(config, spec, tags)
        if st.button(
            "Launch sweep",
            type="primary",
            icon=":material/rocket_launch:",
            disabled=not editor,
            help=None if editor else "Launching a sweep needs an editor.",
        ):
            _launch(store, config, spec, problems, tags)


def _summary(config: RunConfig, spec: SweepSpec, tags: Sequence[str]) -> None:
    name = config.logging.run_name
    st.caption(
        inert(
            f"{spec.method} search, up to {spec.budget} runs, {spec.parallel} at a time. The "
            f"sweep takes the run's name: {name}; its runs are {trial_name(name, 0)}, "
            f"{trial_name(name, 1)}, ... "
            f"each in a folder of its own under {config.data.output_dir}, tagged "
            f"{', '.join(trial_tags(str(name), tags))}."
        )
    )
    st.download_button(
        "Export space YAML",
        spec.to_yaml(),
        safe_file_name(f"{name}-space", ".yaml", "space"),
        "text/yaml",
        icon=":material/download:",
    )


def _launch(
    store: Store,
    config: RunConfig | None,
    spec: SweepSpec | None,
    problems: dict[str, str],
    tags: Sequence[str],
) -> None:
    """Start the sweep and open its page, or say what stops it (the form's own problems
    under their fields, as Queue run does)."""
    if config is None or spec is None:
        st.session_state[TRIED] = True
        if problems:
            st.session_state[forms.ERRORS] = problems
        st.rerun()
    sweep = forms.launched(lambda: actions.launch_sweep(store, config, spec, tags=tags))
    if sweep is not None:
        st.session_state[TRIED] = False
        st.switch_page(actions.SWEEP_PAGE, query_params={"sweep": str(sweep.id)})
