"""The sample inspector under AppTest, on the seeded database plus LBES samples kept and
dropped by the real filters (tests/app/sample_runs.py): filters from and into the URL, the
funnel, whole completions, side by side, compare across steps and runs, the table, and the
Run page's two inspectors, each with its own URL state."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from app.views import MISSING
from engine.sink import SampleRecord, StepReport
from jobs.store.store import Store
from tests.app.sample_runs import CHANGED, END, LONG, PROMPTS, add_lbes_samples
from tests.app.test_inert import EVIL, MORE, assert_inert, markdown_shown
from tests.app.test_pages import page

SAMPLES = "app_pages/samples.py"
FUNNEL = [("generated", "7"), ("prompt-variance filter", "4"), ("top/bottom-k", "3"), ("kept", "3")]


@pytest.fixture
def store(store: Store) -> Store:
    """Run 1 (alpha-run, es) and run 2 (beta-run, lbes) of conftest, run 2 with the LBES
    samples of sample_runs at steps 1 and 2."""
    add_lbes_samples(store, 2)
    return store


def cards(at: AppTest) -> list[str]:
    """The first line of every card (or side-by-side column) on the page."""
    return [m.value for m in at.markdown if m.value.startswith("**prompt ")]


def completions(at: AppTest) -> list[str]:
    """The code blocks on the page that are no prompt."""
    return [c.value for c in at.code if c.value not in {*PROMPTS.values(), "What is 2+2?", EVIL}]


def test_kept_and_dropped_samples_are_found_by_filter_from_the_url(store):
    at = page(SAMPLES, run="2", outcome="top_k_prompt_reward_var")
    assert not at.exception
    assert [(m.label, m.value) for m in at.metric] == FUNNEL
    shown = cards(at)
    assert len(shown) == 3
    assert all(r"prompt\-variance filter \(top\_k\_prompt\_reward\_var\)" in c for c in shown)
    assert all(c.startswith("**prompt 2 ") for c in shown)
    kept = page(SAMPLES, run="2", outcome="kept")
    assert [c.split("**")[1] for c in cards(kept)] == [
        "prompt 0 · base · sample 0",
        "prompt 1 · base · sample 0",
        "prompt 1 · base · sample 2",
    ]


def test_choosing_filters_puts_them_in_the_url(store):
    at = page(SAMPLES, run="2")
    assert len(cards(at)) == 7
    at.selectbox(key="samples_outcome_2").select("dropped").run()
    assert at.query_params["outcome"] == "dropped"
    assert len(cards(at)) == 4
    at.text_input(key="samples_q").input("PRIME").run()
    assert at.query_params["q"] == "PRIME"
    assert len(cards(at)) == 3  # prompt 2 is "Name a prime number."
    at.slider(key="samples_reward_0.0_1.0_2").set_value((0.1, 0.3)).run()
    assert at.query_params["reward"] == "0.1,0.3"
    assert len(cards(at)) == 3
    at.slider(key="samples_reward_0.0_1.0_2").set_value((0.4, 1.0)).run()
    assert cards(at) == [] and "No sample matches these filters." in at.info[0].value


def test_a_long_completion_is_shown_whole(store):
    at = page(SAMPLES, run="2", q=END)
    assert not at.exception
    assert completions(at) == [LONG]
    assert "reward 1 · accuracy 1" in cards(at)[0]


def test_a_bad_reward_range_in_the_url_says_what_it_takes(store):
    at = page(SAMPLES, run="2", reward="low,high")
    assert not at.exception
    assert "bad `reward` value" in at.warning[0].value
    assert len(cards(at)) == 7


def test_members_of_an_es_run_are_filtered(store):
    store.record_step(
        1,
        StepReport(
            step=2,
            metrics={},
            samples=[
                SampleRecord("train", 0, 0, "What is 2+2?", f"member {m} says {m}", 0.1, member=m)
                for m in (0, 3)
            ],
        ),
    )
    at = page(SAMPLES, run="1", member="3")
    assert not at.exception
    assert completions(at) == ["member 3 says 3"]
    assert at.selectbox(key="samples_member_2").options == [
        "all",
        "base (unperturbed)",
        "member 0",
        "member 3",
    ]
    assert not at.metric  # no LBES filter judged ES samples: no funnel
    at = page(SAMPLES, run="1", view="side by side")
    assert completions(at) == ["alpha-run says 4", "member 0 says 0", "member 3 says 3"]


def test_one_prompts_samples_side_by_side(store):
    at = page(SAMPLES, run="2", view="side by side", prompt="1")
    assert not at.exception
    assert completions(at) == [CHANGED[2], "step 2 prompt 1 sample 1 dropped-or-kept text", LONG]
    assert at.code[0].value == PROMPTS[1]


def test_a_completion_against_an_earlier_step_shows_the_changes(store):
    at = page(SAMPLES, run="2", view="compare", prompt="1")
    assert not at.exception
    assert completions(at) == [CHANGED[1], CHANGED[2]]  # the earlier step on the left
    diff = at.markdown[-1].value
    assert diff.startswith("The answer is :red-background[~~7~~] :green-background[12]")
    assert "**Changes from step 1 to step 2**" in [m.value for m in at.markdown]
    at.selectbox(key="samples_vs_run").select(1).run()  # alpha-run: its "What is 2+2?"
    assert at.query_params["vs_run"] == "1"
    assert "This prompt has no train samples in that run." in at.info[0].value
    at.selectbox(key="samples_prompt_2").select(0).run()
    assert completions(at) == ["alpha-run says 4", "beta-run says 4"]
    assert r"**Changes from alpha\-run \(\#1\) step 2 to step 2**" in [m.value for m in at.markdown]
    assert (
        at.markdown[-1].value
        == r":red-background[~~alpha\-run~~] :green-background[beta\-run] says 4"
    )


def test_the_table_stays_for_sorting(store):
    at = page(SAMPLES, run="2", view="table", outcome="dropped")
    assert not at.exception
    table = at.dataframe[0].value
    assert len(table) == 4 and set(table["kept"]) == {False}
    assert {"reward", "dropped_by", "completion", "member"} <= set(table.columns)
    assert at.dataframe[0].proto.placeholder == MISSING  # a base sample has no member


def test_the_run_pages_samples_and_lbes_tabs_keep_their_own_filters(store):
    at = page("app_pages/run.py", run="2", lbes_outcome="kept", outcome="dropped")
    assert not at.exception
    assert at.selectbox(key="run_lbes_outcome_2").value == "kept"
    assert at.selectbox(key="run_samples_outcome_2").value == "dropped"
    assert len(cards(at)) == 3 + 4
    assert [(m.label, m.value) for m in at.metric[-4:]] == FUNNEL  # the LBES tab's funnel


def test_what_a_model_wrote_shows_as_text(store):
    store.record_step(
        2,
        StepReport(
            step=2,
            metrics={},
            samples=[
                SampleRecord(
                    "train",
                    9,
                    0,
                    EVIL,
                    f"{MORE} {EVIL}",
                    0.3,
                    {EVIL: 1.0},
                    kept=False,
                    dropped_by=EVIL,
                ),
                SampleRecord("train", 9, 1, EVIL, f"{EVIL} {MORE}", 0.4, kept=True),
            ],
        ),
    )
    for view in ("cards", "side by side"):
        at = page(SAMPLES, run="2", q="evil", view=view)
        assert not at.exception
        shown = assert_inert(markdown_shown(at))
        assert f"{EVIL} 1" in shown  # the reward part, by its name
        assert f"dropped by other filters ({EVIL})" in shown
        assert completions(at)[:2] == [f"{MORE} {EVIL}", f"{EVIL} {MORE}"]
