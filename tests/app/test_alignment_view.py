"""The Run page's Alignment tab under AppTest, on a seeded alignment run."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import streamlit as st

from engine import metrics as mk
from engine.sink import PopulationRecord, SampleRecord, StepReport
from jobs.store.status import RunStatus
from jobs.store.store import Store
from tests.app.conftest import make_config
from tests.app.test_pages import page


@pytest.fixture
def aligned(seeded_url, dataset, tmp_path, monkeypatch):
    monkeypatch.setenv("ESLAB_DATABASE_URL", seeded_url)
    st.cache_resource.clear()
    st.cache_data.clear()
    store = Store(seeded_url)
    config = make_config(dataset, tmp_path / "aligned", scorer_url="http://127.0.0.1:9")
    run = store.create_run(
        name="aligned-run",
        method="es",
        config=config.to_flat(),
        total_steps=3,
        status=RunStatus.RUNNING,
    )
    for step in (1, 2):
        store.record_step(
            run.id,
            StepReport(
                step=step,
                metrics={
                    mk.LAMBDA: 1.0 / step,
                    mk.JC_RAW: -1.0,
                    mk.JC_SMOOTHED: -0.5,
                    mk.reward_key(mk.TRAIN): 0.3,
                    mk.reward_key(mk.TRAIN, "cost"): -0.7,
                    mk.SAFE_RATIO: 0.75,
                    "train/member/scorer/mean": 0.2,
                },
                population=[
                    PopulationRecord(
                        member=m,
                        seed=m,
                        fitness=0.1 * m,
                        shaped_fitness=0.0,
                        reward=0.3 + 0.1 * m,
                        cost=-0.2 + 0.05 * m * step,
                        # step 1 as an ES Lab before per-sample scores wrote it
                        **(sample_scores(m) if step == 2 else {}),
                    )
                    for m in range(4)
                ],
                samples=[
                    SampleRecord(
                        split="train",
                        prompt_index=i,
                        sample_index=0,
                        prompt="p",
                        completion=f"answer {i}",
                        reward=0.1 * i,
                        reward_parts={"cost": -0.1 * i},
                        member=None if i else 0,
                    )
                    for i in range(3)
                ],
            ),
        )
    checkpoint = tmp_path / "aligned" / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "bon.json").write_text(
        json.dumps([{"n": n, "proxy_score": 0.1 * n, "gold_score": 0.05 * n} for n in (1, 2, 4)])
    )
    store.add_checkpoint(run.id, 2, str(checkpoint))
    ensemble = tmp_path / "aligned" / "checkpoint-4"  # an ensemble's curves, keyed
    ensemble.mkdir(parents=True)
    points = [{"n": n, "proxy_score": 0.2 * n, "gold_score": 0.1} for n in (1, 2)]
    (ensemble / "bon.json").write_text(json.dumps({"bon/mean": points, "bon/uwo/0.5": points}))
    store.add_checkpoint(run.id, 4, str(ensemble))
    yield store, run
    store.close()
    st.cache_resource.clear()


def test_alignment_tab_draws_lambda_costs_scatter_and_best_of_n(aligned):
    _, run = aligned
    at = page("app_pages/run.py", run=str(run.id))
    assert not at.exception
    charts = [c.proto.spec for c in at.get("vega_lite_chart")]
    text = "\n".join(charts)
    for title in (
        "lambda",
        "J_C = mean(C) - d",
        "mean reward and cost",
        "safe ratio",
        "ensemble members",
        "reward vs cost of the completions logged at step 2",
        "best-of-n: proxy vs gold score",
    ):
        assert title in text, title


def sample_scores(member: int) -> dict[str, list[float]]:
    """Three samples of each member, spread around its mean reward and cost."""
    return {
        "sample_rewards": [0.3 + 0.1 * member + d for d in (-0.2, 0.0, 0.2)],
        "sample_costs": [-0.1 * member + d for d in (0.3, -0.1, -0.2)],
    }


def population_charts(run, **url) -> dict[str, tuple]:
    at = page("app_pages/run.py", run=str(run.id), **url)
    assert not at.exception
    specs = {}
    for chart in at.get("vega_lite_chart"):
        spec = json.loads(chart.proto.spec)
        title = spec.get("title")  # a dict where the metric key is the subtitle
        specs[title["text"] if isinstance(title, dict) else title] = (chart, spec)
    return specs


def test_alignment_tab_draws_every_samples_reward_and_cost(aligned):
    """Histograms of the reward and the cost of every sample of every member, and their
    scatter, as the reference's `helpfulness/dist`, `cost/dist` and reward-vs-cost scatter:
    from the recorded sample scores of the step in the URL (the last step by default)."""
    _, run = aligned
    specs = population_charts(run)
    stored = [(m, r, c) for m in range(4) for r, c in zip(*sample_scores(m).values(), strict=True)]
    for i, field in ((1, "reward"), (2, "cost")):
        chart, spec = specs[f"{field} of every sample at step 2"]
        assert spec["mark"]["type"] == "bar" and spec["encoding"]["x"]["bin"]
        assert spec["encoding"]["y"]["title"] == "samples"
        binned = data_of(chart, spec)[field]
        np.testing.assert_allclose(sorted(binned), sorted(s[i] for s in stored))
    chart, spec = specs["reward vs cost of every sample at step 2"]
    points = data_of(chart, spec)
    drawn = sorted(zip(points["member"], points["reward"], points["cost"], strict=True))
    np.testing.assert_allclose(drawn, sorted(stored))


def test_alignment_tab_falls_back_to_the_members_means_without_sample_scores(aligned):
    """A step recorded without its samples' scores (an older ES Lab) shows what it has: the
    members' mean reward and cost."""
    _, run = aligned
    specs = population_charts(run, population_step="1")
    for field in ("reward", "cost"):
        chart, spec = specs[f"members' mean {field} at step 1"]
        assert spec["encoding"]["y"]["title"] == "members"
    chart, spec = specs["members' reward vs cost at step 1"]
    points = data_of(chart, spec)
    drawn = np.array(sorted(zip(points["reward"], points["cost"], strict=True)))
    stored = [(0.3 + 0.1 * m, -0.2 + 0.05 * m) for m in range(4)]
    np.testing.assert_allclose(drawn, stored)


def data_of(chart, spec) -> pd.DataFrame:
    """The rows a chart draws: the dataset (Arrow) its spec names."""
    name = spec["data"]["name"]
    (dataset,) = [d for d in chart.proto.datasets if d.name == name]
    return pa.ipc.open_stream(dataset.data.data).read_pandas()


def test_alignment_tab_of_a_plain_run_says_so(store_url_plain):
    at = page("app_pages/run.py", run=str(store_url_plain))
    assert not at.exception
    assert any("Not an alignment run" in i.value for i in at.info)


@pytest.fixture
def store_url_plain(store):
    return store.search_runs(text="alpha")[0][0].id
