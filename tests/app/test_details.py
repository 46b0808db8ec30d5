"""The dashboard's details: missing values shown as "-", chart titles in one style (words,
the metric key beneath), the Compare page's configuration diff as text only, and the
population chart's dots naming each member's seed, raw and shaped fitness."""

from __future__ import annotations

import altair as alt
import pandas as pd
from streamlit.testing.v1 import AppTest

from app import run_charts
from app.views import MISSING
from engine import metrics as mk
from engine.sink import PopulationRecord, StepReport
from tests.app.test_pages import MAIN, TIMEOUT, page


def test_missing_values_show_as_a_dash(store):
    runs = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
    assert runs.dataframe[0].proto.placeholder == MISSING  # e.g. a run with no eval reward
    run = store.search_runs(text="alpha")[0][0]
    at = page("app_pages/run.py", run=str(run.id))
    assert not at.exception
    config = at.dataframe[0].value
    unset = [o for o, v in run.config.items() if v is None]
    assert unset and set(config[config["option"].isin(unset)]["value"]) == {MISSING}
    assert "None" not in set(config["value"])
    assert at.metric[3].value == MISSING or at.metric[3].value[0].isdigit()  # time left


def test_the_configuration_diff_holds_text_only(store):
    ids = ",".join(str(r.id) for r in store.search_runs()[0])
    at = page("app_pages/compare.py", runs=ids, all="1")
    assert not at.exception
    assert at.dataframe[0].proto.placeholder == MISSING  # the summary
    diff = at.dataframe[1].value
    for column in diff.columns:
        assert {type(v) for v in diff[column]} == {str}, column
    values = set(diff.drop(columns="option").to_numpy().ravel())
    assert MISSING in values and "True" in values and "None" not in values


def chart_titles(chart: alt.TopLevelMixin) -> tuple[str, str | None]:
    title = chart.to_dict()["title"]
    return (title, None) if isinstance(title, str) else (title["text"], title.get("subtitle"))


def test_chart_titles_are_words_with_the_metric_key_beneath(store):
    run = store.search_runs(text="alpha")[0][0]
    keys = set(store.metric_keys(run.id))
    figures = [run_charts.population(store, run), *run_charts.metric_figures(store, run)]
    titles = [chart_titles(f) for f in figures]
    assert len(titles) >= 5
    for text, key in titles:
        assert "/" not in text and "_" not in text and text == text.lower(), text
        assert key is None or key in keys, key
    assert ("train reward mean", "train/reward/mean") in titles
    assert ("train noise std (planned: dashed)", "train/noise_std") in titles


def test_a_members_dot_names_its_seed_and_raw_and_shaped_fitness(store):
    run = store.search_runs(text="alpha")[0][0]
    store.record_step(
        run.id,
        StepReport(
            step=3,
            metrics={},
            population=[
                PopulationRecord(member=m, seed=1000 + m, fitness=m, shaped_fitness=-m)
                for m in range(4)
            ],
        ),
    )
    dots = run_charts.population(store, run).layer[-1]
    tooltip = dots.to_dict()["encoding"]["tooltip"]
    named = {t["field"]: t.get("title", t["field"]) for t in tooltip}
    assert named == {
        "step": "step",
        "member": "member",
        "seed": "seed",
        "fitness": "raw fitness",
        "shaped_fitness": "shaped fitness",
    }
    rows = dots.data[dots.data["step"] == 3]
    assert list(rows["seed"]) == [1000, 1001, 1002, 1003]
    assert list(rows["shaped_fitness"]) == [0, -1, -2, -3]


def test_a_run_with_eval_sets_charts_each_set_and_their_mean(store):
    run = store.search_runs(text="alpha")[0][0]
    assert run_charts.eval_sets_figure(store, run) is None
    for step, (math500, aime24) in enumerate([(0.25, 0.0), (0.5, 0.1)]):
        metrics = {
            mk.eval_set_key("math500"): math500,
            mk.eval_set_key("aime24"): aime24,
            mk.EVAL_SETS_MEAN: (math500 + aime24) / 2,
        }
        store.record_step(run.id, StepReport(step=step, metrics=metrics))
    figures = run_charts.metric_figures(store, run)
    (chart,) = [f for f in figures if chart_titles(f)[0] == "eval pass@1 per set"]
    data = chart.data if isinstance(chart.data, pd.DataFrame) else chart.layer[0].data
    last = data[data["step"] == 1].set_index("set")["value"].to_dict()
    assert last == {"aime24": 0.1, "math500": 0.5, "mean": 0.3}
