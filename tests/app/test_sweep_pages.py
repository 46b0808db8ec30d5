"""The sweep pages under AppTest, on the seeded database plus a sweep made in the store
(tests/app/sample_runs.py: six runs in every state, no engine): the Sweep page ranks the
runs best first with the best one a click away, counts them right, keeps its state in the
URL and offers Cancel only to editors; the Sweeps list and the Runs page link to it; the New
run page's Sweep section names the field of a bad space and launches a sweep as `eslab
sweep` does."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from app import auth, live, live_route, sweep_form, tickets
from app.exports import sweep_csv, sweep_json
from app.views import inert
from engine.paths import config_path
from jobs.store.records import RunRecord
from jobs.store.status import RunStatus, SweepStatus
from jobs.store.store import Store
from jobs.sweeps.driver import advance_sweeps
from jobs.sweeps.spec import SweepSpec
from tests.app.conftest import REWARD, make_config
from tests.app.sample_runs import SWEEP_TRIALS, add_sweep
from tests.app.test_pages import MAIN, TIMEOUT, page

RANKED = ["noise-sweep-t001", "noise-sweep-t000"]  # by train reward at the last step: 0.9, 0.3


@pytest.fixture
def sweep(store, dataset, tmp_path):
    return add_sweep(store, make_config(dataset, tmp_path / "sweep-out"))


def named(store: Store, name: str) -> RunRecord:
    [run] = [r for r in store.search_runs(text=name)[0] if r.name == name]
    return run


def links(at: AppTest) -> dict[str, str]:
    """Each page link's label (as written, unescaped) -> its page and query."""
    return {
        e.proto.label.replace("\\", ""): f"{e.proto.page}?{e.proto.query_string}"
        for e in at.get("page_link")
    }


def as_viewer(tmp_path, monkeypatch) -> AppTest:
    users = tmp_path / "users.yaml"
    auth.add_user(users, "vi", "viewer", "viewer-pass")
    monkeypatch.setenv(auth.ENV, str(users))
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    at.session_state[auth.SESSION_KEY] = auth.signed_in(auth.load_users(users)["vi"])
    return at.run()


def test_the_sweep_page_ranks_the_runs_best_first_and_counts_them(store, sweep):
    at = page("app_pages/sweep.py", sweep=str(sweep.id))
    assert not at.exception, at.exception
    assert at.title[0].value == inert("noise-sweep")
    table = at.dataframe[0].value
    assert list(table["run"][:2]) == RANKED
    assert list(table["rank"][:2]) == [1, 2] and table["rank"][2:].isna().all()
    assert list(table["objective"][:2]) == [pytest.approx(0.9), pytest.approx(0.3)]
    assert "stopped early" in set(table["status"])
    metrics = {m.label: m.value for m in at.metric}
    assert metrics == {
        "Status": "active",
        "Runs done": "4 / 6",  # 2 complete, 1 stopped early, 1 failed
        "Queued": "1",
        "Running": "1",
        "Stopped early": "1",
        "Failed": "1",
    }
    best = named(store, "noise-sweep-t001")
    assert links(at)[f"Best run: noise-sweep-t001 (#{best.id}), train/reward/mean 0.9"] == (
        f"run?run={best.id}"
    )
    assert len(at.get("vega_lite_chart")) == 1  # the options against the objective
    yaml = at.code[0].value
    assert SweepSpec.from_dict(sweep.spec).to_yaml().strip() == yaml and "noise_std" in yaml


def test_compare_the_top_k_follows_the_url(store, sweep):
    second = named(store, "noise-sweep-t000").id
    best = named(store, "noise-sweep-t001").id
    at = page("app_pages/sweep.py", sweep=str(sweep.id), top="2")
    assert not at.exception
    assert at.number_input(key="top").value == 2
    assert links(at)["Compare the top 2"] == f"compare?runs={best}%2C{second}"


@pytest.mark.parametrize(
    "params",
    [
        {"sweep": "abc"},
        {"sweep": "999"},
        {"sweep": "1", "top": "xyz", "tab": "nope"},
        {"sweep": "1", "top": "9"},
        {},
    ],
)
def test_the_sweep_page_survives_hand_edited_urls(store, sweep, params):
    at = page("app_pages/sweep.py", **params)
    assert not at.exception, at.exception


def test_an_editor_cancels_the_sweep_and_its_live_runs(store, sweep):
    at = page("app_pages/sweep.py", sweep=str(sweep.id))
    at.button(key="sweep_cancel").click().run()
    assert not at.exception, at.exception
    assert store.get_sweep(sweep.id).status is SweepStatus.CANCELLED
    statuses = {r.name: r.status for r in store.sweep_runs(sweep.id)}
    assert statuses["noise-sweep-t003"] is RunStatus.CANCELLING  # was running
    assert statuses["noise-sweep-t004"] is RunStatus.CANCELLED  # was queued
    assert statuses["noise-sweep-t001"] is RunStatus.SUCCEEDED
    assert not [b for b in at.button if b.key == "sweep_cancel"]  # nothing left to cancel


def test_a_viewer_gets_no_cancel_button(store, sweep, tmp_path, monkeypatch):
    at = as_viewer(tmp_path, monkeypatch)
    at.query_params["sweep"] = str(sweep.id)
    at = at.switch_page("app_pages/sweep.py").run()
    assert not at.exception
    assert list(at.dataframe[0].value["run"][:2]) == RANKED  # a viewer sees the sweep
    assert not [b for b in at.button if b.key == "sweep_cancel"]
    assert any("cancelling a sweep needs an editor" in c.value for c in at.caption)


def test_the_downloads_are_the_sweep_table(store, sweep):
    rows = json.loads(sweep_json(store, sweep.id))
    assert rows["sweep"]["name"] == "noise-sweep" and len(rows["runs"]) == len(SWEEP_TRIALS)
    best = next(r for r in rows["runs"] if r["rank"] == 1)
    assert best["run"] == RANKED[0] and best["population_size"] == 8
    header = sweep_csv(store, sweep.id).splitlines()[0].split(",")
    assert header[:3] == ["trial", "run_id", "run"] and "noise_std" in header


def test_the_sweep_pages_watch_their_version_while_the_sweep_is_active(store, sweep):
    def watches(page_path: str, **params: str) -> list[dict]:
        at = page(page_path, **params)
        assert not at.exception, at.exception
        return [json.loads(w.proto.json) for w in at.get("bidi_component")]

    [one] = watches("app_pages/sweep.py", sweep=str(sweep.id))
    assert one["url"].endswith(live_route.sweep_path(sweep.id))
    assert one["state"] == live.sweep_version(sweep.id).state
    tickets.verify(one["ticket"], tickets.LIVE, live_route.sweep_subject(sweep.id))
    [listing] = watches("app_pages/sweeps.py")
    assert listing["url"].endswith(live_route.SWEEPS_PATH)
    assert any(
        "redrawn when a sweep changes" in c.value for c in page("app_pages/sweeps.py").caption
    )
    store.set_sweep_status(sweep.id, SweepStatus.CANCELLED, expected=[SweepStatus.ACTIVE])
    live.forget_sweep(sweep.id)
    assert watches("app_pages/sweep.py", sweep=str(sweep.id)) == []
    assert watches("app_pages/sweeps.py") == []


def test_the_sweeps_list_and_the_runs_page_link_to_the_sweep(store, sweep):
    listing = page("app_pages/sweeps.py")
    assert not listing.exception
    row = listing.dataframe[0].value.iloc[0]
    assert (row["name"], row["runs done"], row["live"]) == ("noise-sweep", "4 / 6", 2)
    assert row["best"] == pytest.approx(0.9) and row["open"] == f"/sweep?sweep={sweep.id}"

    runs = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run().dataframe[0].value
    by_name = dict(zip(runs["name"], runs["sweep"], strict=True))
    assert by_name["noise-sweep-t000"] == f"/sweep?sweep={sweep.id}"
    assert pd.isna(by_name["alpha-run"])  # the table's placeholder shows MISSING ("-")

    trial = page("app_pages/run.py", run=str(named(store, "noise-sweep-t000").id))
    assert links(trial)["Trial 0 of sweep noise-sweep"] == f"sweep?sweep={sweep.id}"


# -- the New run page's Sweep section ---------------------------------------------------


def filled_form(dataset, data_folder, tmp_path) -> AppTest:
    """The New run page with a valid run in the form and the Sweep section on (`?sweep=1`)."""
    at = page("app_pages/new_run.py", sweep="1")
    at.selectbox(key="new_train_file").select(config_path(dataset))
    at.text_input(key="new_output_dir").input(str(tmp_path / "swept"))
    at.text_input(key="new_reward_func_path").input(REWARD)
    at.selectbox(key="new_model").select(config_path(data_folder / "models" / "tiny"))
    at.text_input(key="new_max_steps").input("3")
    return at.text_input(key="new_run_name").input("form-sweep").run()


def launch(at: AppTest) -> AppTest:
    return next(b for b in at.button if b.label == "Launch sweep").click().run()


def errors(at: AppTest) -> list[str]:
    return [e.value.replace("\\", "") for e in at.error]


def test_a_bad_value_is_refused_under_its_field_and_nothing_is_stored(
    store, dataset, data_folder, tmp_path
):
    at = filled_form(dataset, data_folder, tmp_path)
    assert at.toggle(key=sweep_form.ON).value
    at.multiselect(key=sweep_form.key("parameters")).select("noise_std").run()
    values = sweep_form.option_key("noise_std", "values")
    at.text_input(key=values).input("0.001, lots").run()
    launch(at)
    assert not at.exception, at.exception
    assert any("parameters.noise_std.values[1]" in e and "lots" in e for e in errors(at))
    assert store.list_sweeps() == []

    # a range: low must be > 0 on a log scale; the message names the bound
    at.radio(key=sweep_form.option_key("noise_std", "kind")).set_value("range").run()
    at.text_input(key=sweep_form.option_key("noise_std", "low")).input("0").run()
    at.text_input(key=sweep_form.option_key("noise_std", "high")).input("0.01").run()
    at.checkbox(key=sweep_form.option_key("noise_std", "log")).check().run()
    at.selectbox(key=sweep_form.key("method")).select("random").run()
    at.text_input(key=sweep_form.key("budget")).input("4").run()
    assert any(e.startswith("parameters.noise_std.low must be > 0") for e in errors(at))
    assert store.list_sweeps() == []


def test_launching_from_the_form_starts_the_sweep_and_opens_its_page(
    store, dataset, data_folder, tmp_path
):
    at = filled_form(dataset, data_folder, tmp_path)
    at.multiselect(key=sweep_form.key("parameters")).select("noise_std").select("seed").run()
    at.text_input(key=sweep_form.option_key("noise_std", "values")).input("1e-3, 2e-3").run()
    at.text_input(key=sweep_form.option_key("seed", "values")).input("1,2").run()
    at.selectbox(key=sweep_form.key("objective.metric")).select("train/reward/mean").run()
    at.selectbox(key=sweep_form.key("early_stopping.rule")).select("median").run()
    at.text_input(key=sweep_form.key("early_stopping.min_step")).input("2").run()
    launch(at)
    assert not at.exception, at.exception
    [sweep] = store.list_sweeps()
    assert sweep.name == "form-sweep" and sweep.created_by == "local"
    spec = SweepSpec.from_dict(sweep.spec)
    assert [(p.name, p.values) for p in spec.parameters] == [
        ("noise_std", (0.001, 0.002)),
        ("seed", (1, 2)),
    ]
    assert spec.method == "grid" and spec.budget == 4  # the grid's size
    assert spec.early_stopping.rule == "median" and spec.early_stopping.min_step == 2
    assert sweep.base_config["data"]["max_steps"] == 3  # the form's run is the base
    assert at.title[0].value == inert("form-sweep")  # its page opened
    assert store.count_runs() == 2  # the scheduler queues its runs, not the form


def test_the_pages_tags_label_every_run_of_a_sweep_launched_from_it(
    store, dataset, data_folder, tmp_path
):
    at = filled_form(dataset, data_folder, tmp_path)
    at.text_input(key="new_tags").input("night, lr-search, night").run()
    at.multiselect(key=sweep_form.key("parameters")).select("noise_std").run()
    at.text_input(key=sweep_form.option_key("noise_std", "values")).input("1e-3, 2e-3").run()
    at.selectbox(key=sweep_form.key("objective.metric")).select("train/reward/mean").run()
    tagged = "tagged sweep:form-sweep, night, lr-search."
    assert any(tagged in c.value.replace("\\", "") for c in at.caption)  # said before launch
    launch(at)
    assert not at.exception, at.exception
    [sweep] = store.list_sweeps()
    assert sweep.tags == ["night", "lr-search"]
    assert any("tags night, lr-search" in c.value.replace("\\", "") for c in at.caption)
    advance_sweeps(store)  # the scheduler's tick queues the runs
    runs = store.sweep_runs(sweep.id)
    assert [r.tags for r in runs] == [["sweep:form-sweep", "night", "lr-search"]] * 2


def test_a_pasted_or_uploaded_space_yaml_launches_too_and_its_errors_name_the_field(
    store, dataset, data_folder, tmp_path
):
    at = filled_form(dataset, data_folder, tmp_path)
    at.radio(key=sweep_form.SOURCE).set_value("YAML").run()
    space = (
        "method: random\nobjective: train/reward/mean\n"
        "parameters:\n  learning_rate: {low: 1e-7, high: 1e-6, log: true}\n"
    )
    at.text_area(key=sweep_form.YAML_TEXT).input(space).run()
    launch(at)
    assert any(e.startswith("budget is required with method random") for e in errors(at))
    at.file_uploader(key=sweep_form.YAML_FILE).upload(
        "space.yaml", (space + "budget: 3\n").encode()
    )
    at.run()
    assert at.text_area(key=sweep_form.YAML_TEXT).value == space + "budget: 3\n"  # to edit
    launch(at)
    assert not at.exception, at.exception
    [sweep] = store.list_sweeps()
    assert sweep.method == "random" and sweep.spec["budget"] == 3


def test_a_viewer_cannot_launch_a_sweep(store, sweep, tmp_path, monkeypatch):
    at = as_viewer(tmp_path, monkeypatch)
    at.query_params["sweep"] = "1"
    at = at.switch_page("app_pages/new_run.py").run()
    assert not at.exception
    assert next(b for b in at.button if b.label == "Launch sweep").disabled


def test_the_chart_of_one_option_is_a_scatter_and_of_a_log_range_a_log_axis():
    from app.sweep_view import coordinates, options_chart
    from jobs.sweeps.spec import Objective, Parameter

    table = pd.DataFrame(
        {
            "trial": [0, 1, 2, 3],
            "run_id": [10, 11, 12, 13],
            "run": ["a", "b", "c", "d"],
            "status": ["succeeded", "succeeded", "running", "queued"],
            "state": ["complete", "complete", "running", "running"],
            "noise_std": [1e-4, 1e-2, 1e-3, 1e-3],
            "objective": [0.5, 0.7, 0.6, None],
            "rank": pd.array([2, 1, None, None], dtype="Int64"),
        }
    )
    noise = Parameter("noise_std", low=1e-4, high=1e-2, log=True)
    spec = SweepSpec("random", (noise,), Objective("train/reward/mean"), budget=3)
    chart = options_chart(table, spec).to_dict()
    assert chart["mark"]["type"] == "point"
    assert chart["encoding"]["x"]["scale"]["type"] == "log"
    lines, ticks = coordinates(table, [noise])
    on_axis = lines[lines["axis"] == "noise_std"].set_index("run")["position"]
    # on a log scale 1e-3 lies halfway; d has no objective yet: not drawn
    assert on_axis.to_dict() == {"a (#10)": 0.0, "b (#11)": 1.0, "c (#12)": pytest.approx(0.5)}
    assert list(ticks[ticks["axis"] == "noise_std"]["label"]) == ["0.0001", "0.01"]
    assert options_chart(table.assign(objective=None), spec) is None
