"""The samples inspector (the Samples page and the Run page's Samples tab) and the LBES view.

One step's samples, filtered (member, kept or dropped and by which filter, reward range, a
text search), read as cards with the whole prompt and completion wrapped, one prompt's
completions side by side, a completion against the same prompt's at another step or in
another run (a word diff), or as a sortable table. Every choice lives in the URL; the Run
page shows two inspectors, so each has its own URL prefix and widget keys (`Scope`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import pandas as pd
import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from app import inspector as ins
from app.views import MISSING, inert, label, number, param, plain_number, set_param
from engine.sink import SampleRecord
from jobs.store.records import RunRecord
from jobs.store.store import Store

SPLITS = ("train", "eval")
VIEWS = ("cards", "side by side", "compare", "table")
CARDS_PER_PAGE = 10
COLUMNS = 3
"""Completions side by side in one row."""
TABLE_COLUMNS = [
    "prompt_index",
    "sample_index",
    "member",
    "reward",
    "reward_parts",
    "prompt",
    "completion",
    "logprob",
    "kept",
    "dropped_by",
]


@dataclass(frozen=True)
class Scope:
    """Where one inspector keeps its state: a prefix for its widgets' keys and one for its
    URL parameters."""

    key: str
    url: str = ""

    def param(self, name: str) -> str:
        return param(self.url + name)

    def set(self, name: str, value: str, default: str = "") -> None:
        set_param(self.url + name, "" if value == default else value)

    def widget(self, name: str, step: int | None = None) -> str:
        """A widget's key; one whose choices depend on the step gets a key per step (its
        choice comes back from the URL)."""
        return f"{self.key}_{name}" + ("" if step is None else f"_{step}")


def _wanted(text: str, choices: Sequence[int], default: int) -> int:
    """The choice a URL value names when it is one of `choices`, else `default`."""
    number = plain_number(text)
    return number if number is not None and number in choices else default


def _step_picker(steps: list[int], key: str, url: str) -> int:
    wanted = _wanted(param(url), steps, steps[-1])
    if len(steps) == 1:
        st.caption(f"step {steps[0]}")
        return steps[0]
    step = st.select_slider("Step", steps, value=wanted, key=key)
    set_param(url, "" if step == steps[-1] else str(step))
    return step


def _choice(
    column: DeltaGenerator,
    title: str,
    options: Sequence[str],
    scope: Scope,
    name: str,
    step: int,
    names: dict[str, str],
) -> str:
    """A selectbox whose first option ('' = all) is the default, its choice in the URL."""
    options = ["", *options]
    wanted = scope.param(name)
    chosen = column.selectbox(
        title,
        options,
        index=options.index(wanted) if wanted in options else 0,
        format_func=lambda o: names.get(o, o) or "all",
        key=scope.widget(name, step),
    )
    scope.set(name, chosen)
    return chosen


def _reward_range(
    column: DeltaGenerator,
    samples: Sequence[SampleRecord],
    scope: Scope,
    step: int,
) -> tuple[float, float] | None:
    rewards = [s.reward for s in samples if s.reward is not None]
    if not rewards or min(rewards) == max(rewards):
        return None
    low, high = min(rewards), max(rewards)
    raw = scope.param("reward")
    try:
        wanted = tuple(sorted(float(x) for x in raw.split(","))) if raw else (low, high)
        if len(wanted) != 2 or not all(math.isfinite(x) for x in wanted):
            raise ValueError
    except ValueError:
        st.warning(
            f"This page's address has a bad `{scope.url}reward` value: it takes two numbers, "
            "the lowest and the highest reward, e.g. `0.2,0.8`; showing every reward."
        )
        wanted = (low, high)
    value = (min(max(wanted[0], low), high), max(min(wanted[1], high), low))
    chosen = column.slider(
        "Reward between", low, high, value, key=scope.widget(f"reward_{low}_{high}", step)
    )
    full = chosen == (low, high)
    scope.set("reward", "" if full else f"{chosen[0]:g},{chosen[1]:g}")
    return None if full else chosen


def _filters(samples: Sequence[SampleRecord], scope: Scope, step: int) -> ins.SampleFilter:
    """The filter row: member and kept/dropped only where the step's samples differ in them."""
    names, verdicts = ins.members(samples), ins.outcomes(samples)
    columns = iter(st.columns(2 + (len(names) > 1) + bool(verdicts)))
    member, outcome = "", ""
    if len(names) > 1:
        shown = {n: "base (unperturbed)" if n == ins.BASE else f"member {n}" for n in names}
        member = _choice(next(columns), "Member", names, scope, "member", step, shown)
    if verdicts:
        shown = {v: f"dropped by {ins.stage_label(v)}" for v in verdicts[2:]}
        outcome = _choice(next(columns), "Kept or dropped", verdicts, scope, "outcome", step, shown)
    reward = _reward_range(next(columns), samples, scope, step)
    text = next(columns).text_input(
        "Search prompt and completion", scope.param("q"), key=scope.widget("q"), max_chars=200
    )
    scope.set("q", text)
    return ins.SampleFilter(member=member, outcome=outcome, reward=reward, text=text)


def _funnel(stages: Sequence[ins.FunnelStage], step: int) -> None:
    st.markdown(f"**LBES filters at step {step}**")
    for column, stage in zip(st.columns(len(stages)), stages, strict=True):
        column.metric(
            stage.label,
            stage.remaining,
            delta=-stage.dropped if stage.dropped else None,
            delta_color="off",
        )


def _header(sample: SampleRecord, title: str) -> str:
    """A card's first line as Markdown: every value escaped, the verdict in colour."""
    parts = " · ".join(f"{k} {number(v)}" for k, v in sample.reward_parts.items())
    facts = [title, f"reward {number(sample.reward)}"]
    facts += [parts] if parts else []
    facts += [f"logprob {number(sample.logprob)}"] if sample.logprob is not None else []
    text = f"**{inert(facts[0])}** · " + inert(" · ".join(facts[1:]))
    verdict = ins.verdict(sample)
    if verdict:
        text += f" · :{'green' if sample.kept else 'red'}[{inert(verdict)}]"
    return text


def _completion(sample: SampleRecord, title: str) -> None:
    st.markdown(_header(sample, title))
    st.code(sample.completion, language=None, wrap_lines=True)


def _cards(shown: Sequence[SampleRecord], scope: Scope) -> None:
    pages = max(1, -(-len(shown) // CARDS_PER_PAGE))
    first = 0
    if pages > 1:
        wanted = scope.param("card_page")
        number = _wanted(wanted, range(1, pages + 1), 1)
        number = st.number_input(
            f"Page (of {pages})", 1, pages, number, key=scope.widget(f"page_{pages}")
        )
        scope.set("card_page", str(number), "1")
        first = (number - 1) * CARDS_PER_PAGE
    for sample in shown[first : first + CARDS_PER_PAGE]:
        with st.container(border=True):
            st.markdown(_header(sample, ins.sample_title(sample)))
            left, right = st.columns([2, 3])
            left.caption("Prompt")
            left.code(sample.prompt, language=None, wrap_lines=True)
            right.caption("Completion")
            right.code(sample.completion, language=None, wrap_lines=True)


def _prompt_picker(
    column: DeltaGenerator,
    shown: Sequence[SampleRecord],
    scope: Scope,
    step: int,
) -> list[SampleRecord]:
    """One prompt's samples among those shown (the prompt in the URL)."""
    prompts = {s.prompt_index: s.prompt for s in shown}
    options = list(prompts)
    wanted = scope.param("prompt")
    chosen = column.selectbox(
        "Prompt",
        options,
        index=options.index(_wanted(wanted, options, options[0])),
        format_func=lambda i: f"prompt {i}: {prompts[i][:80]}",
        key=scope.widget("prompt", step),
    )
    scope.set("prompt", str(chosen), str(options[0]))
    return [s for s in shown if s.prompt_index == chosen]


def _side_by_side(shown: Sequence[SampleRecord], scope: Scope, step: int) -> None:
    group = _prompt_picker(st.container(), shown, scope, step)
    st.code(group[0].prompt, language=None, wrap_lines=True)
    for row in range(0, len(group), COLUMNS):
        for column, sample in zip(st.columns(COLUMNS), group[row : row + COLUMNS], strict=False):
            with column, st.container(border=True):
                _completion(sample, ins.sample_name(sample))


def _pick(
    column: DeltaGenerator, title: str, group: Sequence[SampleRecord], key: str, wanted: int
) -> int:
    """The position of one of a prompt's samples."""
    return column.selectbox(
        title,
        range(len(group)),
        index=wanted if 0 <= wanted < len(group) else 0,
        format_func=lambda i: ins.sample_name(group[i]),
        key=key,
    )


def _other_run(column: DeltaGenerator, store: Store, run: RunRecord, scope: Scope) -> RunRecord:
    runs = [run, *(r for r in store.list_runs(limit=200) if r.id != run.id)]
    by_id = {r.id: r for r in runs}
    wanted = scope.param("vs_run")
    ids = list(by_id)
    chosen = column.selectbox(
        "Compare with run",
        ids,
        index=ids.index(_wanted(wanted, ids, ids[0])),
        format_func=lambda i: "this run" if i == run.id else label(by_id[i]),
        key=scope.widget("vs_run"),
    )
    scope.set("vs_run", str(chosen), str(run.id))
    return by_id[chosen]


def _counterpart(
    store: Store, run: RunRecord, split: str, step: int, sample: SampleRecord, scope: Scope
) -> tuple[str, SampleRecord] | None:
    """The same prompt's completion that `sample` is compared with, and where it is from: a
    run, a step of it (by default the latest earlier one) and one of that step's samples of
    the prompt (by default the same member and sample number)."""
    c1, c2, c3 = st.columns(3)
    other = _other_run(c1, store, run, scope)
    steps = store.sample_steps(other.id, split, prompt=sample.prompt)
    steps = [s for s in steps if other.id != run.id or s != step]
    if not steps:
        where = "at another step" if other.id == run.id else "in that run"
        st.info(f"This prompt has no {split} samples {where}.")
        return None
    earlier = [s for s in steps if s < step] if other.id == run.id else []
    default = (earlier or steps)[-1]
    wanted = scope.param("vs_step")
    vs_step = c2.selectbox(
        "At step",
        steps,
        index=steps.index(_wanted(wanted, steps, default)),
        key=scope.widget(f"vs_step_{other.id}", step),
    )
    scope.set("vs_step", str(vs_step), str(default))
    group = store.samples(other.id, split=split, step=vs_step, prompt=sample.prompt)
    same = [
        i
        for i, s in enumerate(group)
        if (s.member, s.sample_index) == (sample.member, sample.sample_index)
    ]
    wanted = scope.param("vs_sample")
    position = _wanted(wanted, range(len(group)), (same or [0])[0])
    picked = _pick(c3, "Its sample", group, scope.widget(f"vs_sample_{vs_step}", step), position)
    scope.set("vs_sample", str(picked), str((same or [0])[0]))
    where = f"step {vs_step}" if other.id == run.id else f"{label(other)} step {vs_step}"
    return where, group[picked]


def _compare(
    store: Store,
    run: RunRecord,
    split: str,
    step: int,
    shown: Sequence[SampleRecord],
    scope: Scope,
) -> None:
    c1, c2 = st.columns([3, 1])
    group = _prompt_picker(c1, shown, scope, step)
    wanted = scope.param("sample")
    position = _pick(
        c2,
        "Sample",
        group,
        scope.widget("sample", step),
        _wanted(wanted, range(len(group)), 0),
    )
    scope.set("sample", str(position), "0")
    sample = group[position]
    st.code(sample.prompt, language=None, wrap_lines=True)
    found = _counterpart(store, run, split, step, sample, scope)
    if found is None:
        return
    where, other = found
    left, right = st.columns(2)
    with left, st.container(border=True):
        _completion(other, f"{where} · {ins.sample_name(other)}")
    with right, st.container(border=True):
        _completion(sample, f"step {step} · {ins.sample_name(sample)}")
    st.markdown(f"**Changes from {inert(where)} to step {step}**")
    st.caption("Struck through on red: only in the left one; on green: only in the right one.")
    with st.container(border=True):
        st.markdown(ins.diff_markdown(ins.word_diff(other.completion, sample.completion)))


def _table(shown: Sequence[SampleRecord], scope: Scope) -> None:
    st.dataframe(
        pd.DataFrame([asdict(s) for s in shown], columns=TABLE_COLUMNS),
        hide_index=True,
        placeholder=MISSING,
        key=scope.widget("table"),
        column_config={
            "prompt": st.column_config.TextColumn(width="medium"),
            "completion": st.column_config.TextColumn(width="large"),
        },
    )


def inspect_step(store: Store, run: RunRecord, split: str, step: int, scope: Scope) -> None:
    """Filters, the LBES funnel and the chosen view of one split's samples at one step."""
    samples = store.samples(run.id, split=split, step=step)
    stages = ins.funnel(samples, run.config) if run.method == "lbes" else []
    if stages:
        _funnel(stages, step)
    wanted = _filters(samples, scope, step)
    shown = ins.filter_samples(samples, wanted)
    views = list(VIEWS)
    view = st.radio(
        "View",
        views,
        index=views.index(scope.param("view")) if scope.param("view") in views else 0,
        horizontal=True,
        key=scope.widget("view"),
    )
    scope.set("view", view, VIEWS[0])
    st.caption(f"{len(shown)} of {len(samples)} samples at step {step}")
    if not shown:
        st.info("No sample matches these filters.")
    elif view == "cards":
        _cards(shown, scope)
    elif view == "side by side":
        _side_by_side(shown, scope, step)
    elif view == "compare":
        _compare(store, run, split, step, shown, scope)
    else:
        _table(shown, scope)


def sample_inspector(store: Store, run: RunRecord, scope: Scope) -> None:
    """The split and step pickers, then `inspect_step` (split and step in the URL)."""
    c1, c2 = st.columns([1, 3])
    wanted = scope.param("split")
    split = c1.radio(
        "Split",
        SPLITS,
        index=SPLITS.index(wanted) if wanted in SPLITS else 0,
        key=scope.widget("split"),
        horizontal=True,
    )
    scope.set("split", split, SPLITS[0])
    steps = store.sample_steps(run.id, split)
    if not steps:
        st.info(f"Run {run.id} has no {split} samples yet.")
        return
    with c2:
        step = _step_picker(steps, scope.widget("step"), scope.url + "step")
    inspect_step(store, run, split, step, scope)


def lbes_view(store: Store, run: RunRecord) -> None:
    """Per step: every member's fitness (the correlation under LBES) and, for an LBES run,
    the filters' funnel and the base model's samples, kept or dropped and by which filter."""
    steps = store.population_steps(run.id)
    if not steps:
        st.info("No population rows yet.")
        return
    step = _step_picker(steps, "run_lbes_step", "lbes_step")
    population = pd.DataFrame(store.population(run.id, step))
    what = "correlation" if run.method == "lbes" else "fitness (mean reward)"
    st.markdown(f"**Members at step {step}** — fitness is the {what}")
    st.dataframe(population, hide_index=True, placeholder=MISSING)
    if run.method == "lbes" and step in store.sample_steps(run.id, "train"):
        inspect_step(store, run, "train", step, Scope("run_lbes", "lbes_"))
