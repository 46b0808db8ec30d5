"""Every dashboard page under streamlit's AppTest, on a migrated temporary SQLite database
seeded through the Store; plus the pure helpers (downsampling, EMA, config diff)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from app.charts import downsample, ema
from app.forms import config_diff
from app.views import inert
from engine import metrics as mk
from engine.config import config_fields
from engine.paths import config_path
from jobs.store.status import RunStatus
from tests.app.conftest import clear_streamlit_caches

MAIN = str(Path(__file__).resolve().parents[2] / "app" / "main.py")
TIMEOUT = 60


def page(path: str, **params: str) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    at.run()
    for k, v in params.items():
        at.query_params[k] = v
    at.switch_page(path)
    return at.run()


def text_of(at: AppTest) -> str:
    parts = [e.value for e in (*at.markdown, *at.caption, *at.title, *at.info, *at.error)]
    parts += [c.value for c in at.code]  # prompts and completions
    parts += [str(m.value) for m in at.metric]
    for df in at.dataframe:
        parts.append(df.value.to_string())
    return "\n".join(str(p) for p in parts)


def test_runs_page_lists_runs(store):
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
    assert not at.exception
    table = at.dataframe[0].value
    assert set(table["name"]) == {"alpha-run", "beta-run"}
    assert list(table[table["name"] == "alpha-run"]["best eval reward"]) == [pytest.approx(0.4)]


def test_runs_page_filters_by_method_from_url(store):
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    at.query_params["method"] = "lbes"
    at.run()
    assert not at.exception
    assert list(at.dataframe[0].value["name"]) == ["beta-run"]


def test_run_page_shows_run(store):
    run = store.search_runs(text="alpha")[0][0]
    at = page("app_pages/run.py", run=str(run.id))
    assert not at.exception
    assert at.title[0].value == inert("alpha-run")  # shown as typed: see test_inert.py
    assert "2 / 5" in text_of(at)
    assert "alpha-run says 4" in text_of(at)


def test_run_page_without_run_says_how(store):
    at = page("app_pages/run.py")
    assert not at.exception
    assert "Runs" in at.info[0].value


def test_compare_page_diffs_configs(store):
    ids = [r.id for r in store.search_runs()[0]]
    at = page("app_pages/compare.py", runs=",".join(map(str, ids)))
    assert not at.exception
    diff = at.dataframe[1].value
    assert "noise_std" in set(diff["option"])
    assert "population_size" not in set(diff["option"])  # equal: hidden by default
    completions = [t.value for t in at.text]
    assert "alpha-run says 4" in completions and "beta-run says 4" in completions


def test_samples_page(store):
    run = store.search_runs(text="beta")[0][0]
    at = page("app_pages/samples.py", run=str(run.id), split="eval")
    assert not at.exception
    assert "beta-run says 4" in text_of(at)


def test_new_run_form_is_generated_from_the_schema(store):
    at = page("app_pages/new_run.py")
    assert not at.exception
    labels = {w.label.rstrip(" *") for w in (*at.text_input, *at.selectbox, *at.checkbox)}
    shown = {f"{f.label} `{f.name}`" for f in config_fields() if "es" in f.methods}
    assert shown <= labels


def test_new_run_bad_value_names_the_field(store, dataset, data_folder, tmp_path):
    at = page("app_pages/new_run.py")
    at.selectbox(key="new_train_file").select(config_path(dataset))  # as the form names it
    at.text_input(key="new_output_dir").input(str(tmp_path / "new-out"))
    at.text_input(key="new_reward_func_path").input("engine.rewards.conciseness.compute_score")
    at.text_input(key="new_noise_std").input("-1").run()
    at.button[0].click().run()
    assert not at.exception
    assert any(inert("noise_std") in e.value for e in at.error)
    assert store.count_runs() == 2


def test_new_run_submit_queues_a_run(store, dataset, data_folder, tmp_path):
    at = page("app_pages/new_run.py")
    at.selectbox(key="new_train_file").select(config_path(dataset))  # as the form names it
    at.text_input(key="new_output_dir").input(str(tmp_path / "new-out"))
    at.text_input(key="new_reward_func_path").input("engine.rewards.conciseness.compute_score")
    at.selectbox(key="new_model").select(config_path(data_folder / "models" / "tiny"))
    at.text_input(key="new_max_steps").input("3")
    at.text_input(key="new_run_name").input("from-the-form").run()
    at.text_input(key="new_tags").input(" night, lr ,, night").run()
    queue = next(b for b in at.button if b.label == "Queue run")
    queue.click().run()
    assert not at.exception, at.exception
    runs, total = store.search_runs(text="from-the-form")
    assert total == 1 and runs[0].status is RunStatus.QUEUED and runs[0].total_steps == 3
    assert runs[0].tags == ["night", "lr"]
    # stored resolved: the same files even if ESLAB_DATA_DIR, which data/... follows, changes
    assert runs[0].config["train_file"] == str(dataset)
    assert runs[0].config["model"] == str(data_folder / "models" / "tiny")


def test_new_run_clone_prefills(store):
    run = store.search_runs(text="beta")[0][0]
    at = page("app_pages/new_run.py", clone=str(run.id))
    assert not at.exception
    assert at.selectbox(key="new_method").value == "lbes"
    assert at.text_input(key="new_noise_std").value == "0.002"


def test_store_search_and_sparklines(store):
    runs, total = store.search_runs(tag="smoke", order="name")
    assert total == 2 and [r.name for r in runs] == ["alpha-run", "beta-run"]
    lines = store.sparklines([r.id for r in runs], mk.reward_key(mk.TRAIN), points=2)
    assert all(len(v) == 2 for v in lines.values())
    buckets = store.metric_buckets(runs[0].id, mk.reward_key(mk.TRAIN), points=2)
    assert [b["max"] for b in buckets] == [pytest.approx(0.1), pytest.approx(0.2)]


def test_downsample_keeps_min_and_max():
    values = np.zeros(10_000)
    values[1234], values[8765] = 50.0, -50.0
    df = downsample(
        pd.DataFrame({"step": range(10_000), "value": values}), "step", "value", points=100
    )
    assert len(df) == 100
    assert df["max"].max() == 50.0 and df["min"].min() == -50.0
    assert df["step"].is_monotonic_increasing


def test_downsample_by_group_and_small_input():
    df = pd.DataFrame({"step": [0, 1, 0], "value": [1.0, 2.0, 3.0], "run": ["a", "a", "b"]})
    out = downsample(df, "step", "value", points=10, by="run")
    assert len(out) == 3 and set(out["run"]) == {"a", "b"}


def test_ema():
    assert list(ema([1.0, 2.0], 0.0)) == [1.0, 2.0]
    assert list(ema([0.0, 1.0], 0.5)) == [0.0, 0.5]


def test_config_diff_only_differences():
    a, b = {"x": 1, "y": 2}, {"x": 1, "y": 3, "z": None}
    only = config_diff({"a": a, "b": b})
    assert list(only["option"]) == ["y", "z"]
    assert list(only.loc[only["option"] == "z", "a"]) == ["(missing)"]
    assert list(config_diff({"a": a, "b": b}, only_differences=False)["option"]) == ["x", "y", "z"]


def test_exports_are_full_resolution(store):
    import json

    from app.exports import metrics_csv, run_json

    run = store.search_runs(text="alpha")[0][0]
    data = json.loads(run_json(store, run.id))
    assert data["run"]["name"] == "alpha-run" and len(data["population"]) == 12
    assert metrics_csv(store, run.id).count(mk.reward_key(mk.TRAIN)) == 3


def test_runs_page_paginates_from_url(store):
    for i in range(58):
        store.create_run(name=f"bulk-{i:02d}", method="es", config={}, total_steps=1)
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    at.query_params["page"] = "2"
    at.run()
    assert not at.exception
    assert len(at.dataframe[0].value) == 10
    assert "60 runs · page 2 of 2" in at.caption[0].value


def test_run_page_cancel_button(store):
    run = store.search_runs(text="alpha")[0][0]
    at = page("app_pages/run.py", run=str(run.id))
    at.button(key="run_cancel").click().run()
    assert not at.exception
    assert store.get_run(run.id).status is RunStatus.CANCELLING


def test_delete_run_refuses_live_runs_and_cascades(store):
    from jobs.store.errors import InvalidTransitionError

    run = store.search_runs(text="alpha")[0][0]
    with pytest.raises(InvalidTransitionError, match="cancel it before deleting"):
        store.delete_run(run.id)
    store.set_status(run.id, RunStatus.SUCCEEDED)
    store.delete_run(run.id)
    assert store.count_runs() == 1
    assert store.metric_buckets(store.search_runs()[0][0].id, mk.reward_key(mk.TRAIN))
    from sqlalchemy import text

    with store.engine.connect() as c:
        for table in ("metrics", "latest_metrics", "population", "samples"):
            count = c.execute(
                text(f"SELECT count(*) FROM {table} WHERE run_id = :r"), {"r": run.id}
            ).scalar()
            assert count == 0, table


def test_new_run_parquet_upload_is_validated(store, dataset, tmp_path, monkeypatch):
    import engine.paths

    monkeypatch.setattr(engine.paths, "PROJECT_ROOT", tmp_path)  # uploads land in tmp
    at = page("app_pages/new_run.py")
    at.file_uploader(key="new_parquet").upload("bad.parquet", b"not parquet").run()
    assert not at.exception
    assert any("dataset refused" in e.value for e in at.error)
    assert not list((tmp_path / "data" / "uploads").glob("*"))

    at.file_uploader(key="new_parquet").upload("good.parquet", dataset.read_bytes()).run()
    assert not at.exception
    saved = at.selectbox(key="new_train_file").value
    assert saved.startswith("data/uploads/") and (tmp_path / saved).is_file()


def test_new_run_yaml_import_and_preset(store, tmp_path):
    from engine.presets import preset_names

    at = page("app_pages/new_run.py")
    at.file_uploader(key="new_yaml").upload("run.yaml", b"method: lbes\nnoise_std: 0.0042\n")
    at.run()
    assert not at.exception
    assert at.selectbox(key="new_method").value == "lbes"
    assert at.text_input(key="new_noise_std").value == "0.0042"
    name = preset_names()[0]
    at.selectbox(key="new_preset").select(name).run()
    assert not at.exception
    assert at.text_input(key="new_output_dir").value  # the preset fills it


def test_yaml_export_reads_back_through_the_form_parser():
    from app.forms import parse_yaml
    from engine.config import RunConfig
    from engine.presets import load_preset, preset_names

    for name in preset_names():
        config = load_preset(name)
        assert RunConfig.from_flat(parse_yaml(config.to_yaml())) == config


@pytest.mark.parametrize(
    "path, params",
    [
        ("app_pages/runs.py", {"page": "abc", "sort": "nonsense", "status": "bogus"}),
        ("app_pages/run.py", {"run": "999", "smooth": "xyz"}),
        ("app_pages/run.py", {"run": "1", "smooth": "7", "x": "nope", "step": "-3"}),
        ("app_pages/compare.py", {"runs": "1"}),
        ("app_pages/compare.py", {"runs": "1,999"}),
        ("app_pages/samples.py", {"run": "999"}),
        ("app_pages/new_run.py", {"clone": "999"}),
    ],
)
def test_pages_survive_hand_edited_urls(store, path, params):
    at = page(path, **params)
    assert not at.exception


def test_new_run_reward_picker_fills_the_path(store):
    from engine.rewards import BUILTIN_REWARDS

    at = page("app_pages/new_run.py")
    at.selectbox(key="new_builtin_reward").select("gsm8k").run()
    assert at.text_input(key="new_reward_func_path").value == BUILTIN_REWARDS["gsm8k"]


def test_app_never_imports_vllm(seeded_url):
    """app -> jobs -> engine: rendering every page must not load vLLM (docs/design.md)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from streamlit.testing.v1 import AppTest\n"
        f"at = AppTest.from_file({MAIN!r}, default_timeout=60).run()\n"
        "for p in ('app_pages/run.py', 'app_pages/new_run.py', 'app_pages/compare.py',"
        " 'app_pages/samples.py', 'app_pages/sweeps.py', 'app_pages/sweep.py'):\n"
        "    at.query_params.update(run='1', runs='1,2', sweep='1')\n"
        "    at.switch_page(p).run()\n"
        "    assert not at.exception, (p, at.exception)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'ray', 'torch')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "ESLAB_DATABASE_URL": seeded_url},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_new_run_clone_prefills_again_after_leaving_the_page(store):
    run = store.search_runs(text="beta")[0][0]
    at = page("app_pages/new_run.py", clone=str(run.id))
    at.switch_page("app_pages/runs.py").run()
    at.query_params["clone"] = str(run.id)
    at.switch_page("app_pages/new_run.py").run()
    assert not at.exception
    assert at.selectbox(key="new_method").value == "lbes"


def test_runs_page_watches_for_changes_only_while_a_run_is_live(store):
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
    assert "redrawn when a run changes" in at.caption[0].value  # both seeded runs run
    for run in store.search_runs()[0]:
        store.set_status(run.id, RunStatus.SUCCEEDED)
    clear_streamlit_caches()  # what the pages share is up to live.FRESH_SECONDS old
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
    assert not at.exception
    assert "redrawn" not in at.caption[0].value


def test_runs_run_page_and_compare_show_the_perturbation_mode(store, dataset, tmp_path):
    from tests.app.conftest import make_config

    config = make_config(dataset, tmp_path / "low", perturbation="lora", lora_rank=8)
    low = store.create_run(name="low-rank-run", method="es", config=config.to_flat(), total_steps=5)
    config = make_config(dataset, tmp_path / "batched", perturbation="full_batched")
    store.create_run(name="batched-run", method="es", config=config.to_flat(), total_steps=5)
    table = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run().dataframe[0].value
    assert dict(zip(table["name"], table["mode"], strict=True)) == {
        "alpha-run": "full",
        "beta-run": "full",
        "low-rank-run": "lora r8",
        "batched-run": "full batched",
    }
    assert "· es · lora r8 ·" in page("app_pages/run.py", run=str(low.id)).caption[0].value
    compared = page("app_pages/compare.py", runs=f"1,{low.id}")
    assert "lora r8" in text_of(compared) and "full" in text_of(compared)
