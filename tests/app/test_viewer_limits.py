"""What one viewer's request may cost the dashboard: Compare takes a bounded number of runs,
each once; the exports load only what they serve (metrics alone for the CSV, a run's JSON
only up to MAX_RUN_JSON_MB); a checkpoint is never served from memory but streamed (by
`eslab export --checkpoint` here, by the download route in test_checkpoint_route.py); an
uploaded space file is refused over its cap before it is decoded; a step in the address that
is not plain ASCII digits shows the latest step, and a search for one finds no id."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

from app import actions, exports
from app.cli import main
from engine import metrics as mk
from jobs.store.store import Store
from tests.app.test_pages import page, text_of
from tests.app.test_sweep_pages import filled_form

# -- the address ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "params", "slider"),
    [
        ("app_pages/samples.py", {"run": "1", "step": "²"}, "samples_step"),
        ("app_pages/samples.py", {"run": "1", "step": "١"}, "samples_step"),  # Arabic 1
        ("app_pages/run.py", {"run": "2", "lbes_step": "²"}, "run_lbes_step"),
    ],
)
def test_a_step_that_is_no_plain_number_shows_the_latest_step(store, path, params, slider):
    at = page(path, **params)
    assert not at.exception, at.exception
    assert at.select_slider(key=slider).value == 2  # the seeded runs' steps are 0, 1, 2


@pytest.mark.parametrize("text", ["²", "9" * 30])
def test_a_search_that_is_no_plain_id_searches_names_only(store, text):
    at = page("app_pages/runs.py", q=text)
    assert not at.exception, at.exception
    assert at.info[0].value.startswith("No runs match.")


def test_compare_shows_a_repeated_run_once(store):
    at = page("app_pages/compare.py", runs="1,2,1")
    assert not at.exception, at.exception
    assert list(at.dataframe[0].value["run"]) == ["alpha-run (#1)", "beta-run (#2)"]


def test_compare_refuses_more_runs_than_its_cap_before_reading_them(store, monkeypatch):
    def no_reads(*_args, **_kwargs):
        raise AssertionError("Compare read a run it was going to refuse")

    monkeypatch.setattr(Store, "get_run", no_reads)
    ids = ",".join(str(i) for i in range(1, actions.MAX_COMPARE_RUNS + 2))
    at = page("app_pages/compare.py", runs=ids)
    assert not at.exception, at.exception
    [error] = at.error
    assert f"at most {actions.MAX_COMPARE_RUNS}" in error.value
    assert f"names {actions.MAX_COMPARE_RUNS + 1} runs" in error.value


# -- the exports ---------------------------------------------------------------------------


def test_the_metrics_csv_reads_metrics_only(store, monkeypatch):
    def everything(*_args, **_kwargs):
        raise AssertionError("the metrics CSV loaded the population and samples too")

    monkeypatch.setattr(Store, "export_run", everything)
    text = exports.metrics_csv(store, 1)
    assert text.splitlines()[0] == "key,step,value,wall_time"
    assert text.count(mk.reward_key(mk.TRAIN)) == 3


def test_the_export_size_grows_with_the_samples_text(store):
    before = store.export_size(1)
    assert 0 < before < exports.MAX_RUN_JSON_MB * 2**20
    with store._session() as s:  # one long completion, as a chatty model writes
        from jobs.store import models

        s.query(models.Sample).filter_by(run_id=1, step=0, split="train").update(
            {"completion": "x" * 100_000}
        )
    assert store.export_size(1) >= before + 100_000 - len("alpha-run says 4")


def test_a_run_json_over_the_cap_is_not_built_by_the_dashboard(store, monkeypatch):
    monkeypatch.setattr(exports, "MAX_RUN_JSON_MB", store.export_size(1) / 2**20 / 2)
    at = page("app_pages/run.py", run="1")
    assert not at.exception, at.exception
    labels = [b.proto.label for b in at.get("download_button")]
    assert "Run as JSON (everything)" not in labels and "Metrics as CSV" in labels
    assert any("eslab export 1 --out FILE.json" in w.value for w in at.warning)


# -- checkpoints ---------------------------------------------------------------------------


def checkpoint(store: Store, tmp_path: Path) -> Path:
    folder = tmp_path / "ckpt" / "step-2"
    folder.mkdir(parents=True)
    (folder / "weights.bin").write_bytes(os.urandom(2**19))
    (folder / "link").symlink_to("/etc/passwd")
    store.add_checkpoint(1, 2, str(folder))
    return folder


def test_the_run_page_serves_no_checkpoint_through_a_download_button(store, tmp_path):
    checkpoint(store, tmp_path)
    at = page("app_pages/run.py", run="1")
    assert not at.exception, at.exception
    assert not [b for b in at.get("download_button") if ".tar" in b.proto.label]
    assert "eslab export 1 --checkpoint 2 --out run-1-alpha-run-step-2.tar" in text_of(at)


def test_eslab_export_streams_a_checkpoint_as_a_tar(store, tmp_path):
    checkpoint(store, tmp_path)
    out = tmp_path / "step-2.tar"
    assert main(["export", "1", "--checkpoint", "2", "--out", str(out)]) == 0
    with tarfile.open(out) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["step-2/weights.bin"].size == 2**19
    assert members["step-2/link"].issym()  # a link stays a link: /etc/passwd not read
    assert main(["export", "1", "--checkpoint", "7", "--out", str(out)]) == 1


# -- the space file ------------------------------------------------------------------------


def test_a_space_file_over_the_cap_is_refused_before_it_is_decoded(
    store, dataset, data_folder, tmp_path
):
    from app import sweep_form

    at = filled_form(dataset, data_folder, tmp_path)
    at.radio(key=sweep_form.SOURCE).set_value("YAML").run()
    text = b"method: grid\n" + b"# padding\n" * 120_000  # 1.1 MiB
    at.file_uploader(key=sweep_form.YAML_FILE).upload("big.yaml", text).run()
    assert not at.exception, at.exception
    assert not at.text_area(key=sweep_form.YAML_TEXT).value
    assert any("a space file may be at most 1 MiB" in e.value for e in at.error)
