"""`eslab submit / runs / cancel / resume / clone / export` against a real SQLite file."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import urllib.request
import uuid

from app.cli import main
from app.cli.common import dashboard_url, load_run_config
from engine.paths import PROJECT_ROOT
from engine.sink import PopulationRecord, SampleRecord, StepReport
from jobs import phases
from jobs.service import dashboard_address, recorded_dashboard
from jobs.store.status import RunStatus
from tests.jobs.conftest import free_port
from tests.jobs.helpers import wait_for


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_submit_validates_queues_and_prints_the_run_and_its_url(db, config_file, capsys):
    code, out, _ = run_cli(
        capsys, "submit", str(config_file), "--set", "noise_std=0.01", "--tag", "baseline"
    )
    assert code == 0
    (run,) = db.list_runs()
    assert run.status is RunStatus.QUEUED and run.total_steps == 4  # 8 prompts / 4 x 2 epochs
    assert run.config["noise_std"] == 0.01 and run.tags == ["baseline"]
    assert out.splitlines() == [
        f"run {run.id} ({run.uuid}) '{run.name}' queued: 4 steps",
        f"http://127.0.0.1:8501/run?run={run.id}",
    ]


def submitted_url(capsys, config_file) -> str:
    """The link `eslab submit` prints for a new run (each in an output_dir of its own)."""
    output_dir = config_file.parent / f"out-{uuid.uuid4().hex[:8]}"
    code, out, err = run_cli(
        capsys, "submit", str(config_file), "--set", f"output_dir={output_dir}"
    )
    assert code == 0, err
    return out.splitlines()[-1]


def test_submit_prints_the_address_of_the_dashboard_that_serves(db, config_file, capsys):
    """The dashboard of `eslab serve` (jobs.service.run_dashboard, which serve runs with or
    without the scheduler) on a port of its own: submit links to it while it serves, and to
    the default address once it has stopped."""
    port = free_port()
    serve = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from jobs.service import run_dashboard; run_dashboard('127.0.0.1', {port})",
        ],
        cwd=PROJECT_ROOT,
        stdout=subprocess.DEVNULL,
        # as in a terminal, whatever started the tests: a suite run in the background of a
        # shell inherits SIGINT ignored, and Python then never raises KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: _answers(f"{base}/_stcore/health"), 60, "the dashboard to serve")
        assert submitted_url(capsys, config_file) == f"{base}/run?run=1"
    finally:
        serve.send_signal(signal.SIGINT)  # Ctrl-C, as in serve's terminal
        assert serve.wait(30) == 0
    assert submitted_url(capsys, config_file) == "http://127.0.0.1:8501/run?run=2"


def test_a_dashboard_on_every_address_is_linked_at_loopback():
    assert dashboard_address("0.0.0.0", 8502) == "http://127.0.0.1:8502"
    assert dashboard_address("::", 8502) == "http://127.0.0.1:8502"
    assert dashboard_address("::1", 8502) == "http://[::1]:8502"
    assert dashboard_address("lab.example", 80) == "http://lab.example:80"


def test_the_dashboard_address_setting_wins_and_a_foreign_record_is_ignored(
    db, monkeypatch, tmp_path
):
    with recorded_dashboard("http://127.0.0.1:8642"):
        with recorded_dashboard("http://127.0.0.1:8643"):
            assert dashboard_url(7) == "http://127.0.0.1:8643/run?run=7"
        # the second serve stopped: the first one's address again
        assert dashboard_url(7) == "http://127.0.0.1:8642/run?run=7"
        monkeypatch.setenv("ESLAB_DASHBOARD_URL", "https://lab.example/eslab")
        assert dashboard_url(7) == "https://lab.example/eslab/run?run=7"
        monkeypatch.delenv("ESLAB_DASHBOARD_URL")
        os.chmod(tmp_path / "data" / "private", 0o777)  # others could have written the record
        assert dashboard_url(7) == "http://127.0.0.1:8501/run?run=7"
        os.chmod(tmp_path / "data" / "private", 0o700)
    assert dashboard_url(7) == "http://127.0.0.1:8501/run?run=7"
    assert os.listdir(tmp_path / "data" / "private") == []


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def test_submit_refuses_bad_input_and_stores_nothing(db, config_file, capsys, tmp_path):
    code, _, err = run_cli(
        capsys, "submit", str(config_file), "--set", f"train_file={tmp_path / 'missing.parquet'}"
    )
    assert code == 2 and "missing.parquet" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(capsys, "submit", str(config_file), "--set", "population_size=0")
    assert code == 2 and "population_size" in err
    assert db.list_runs() == []


def test_submit_refuses_an_output_dir_a_live_run_writes_to(db, config_file, capsys):
    assert run_cli(capsys, "submit", str(config_file))[0] == 0
    code, _, err = run_cli(capsys, "submit", str(config_file))
    assert code == 2 and "is in use by run 1 (queued)" in err
    assert db.count_runs() == 1


def test_each_submit_of_a_preset_gets_a_folder_of_its_own(db, capsys, tmp_path):
    """As the New run form does: data/runs/RUN_NAME, not the preset's one output_dir."""
    for _ in range(2):
        code, _, err = run_cli(capsys, "submit", "es-conciseness", "--set", "max_steps=2")
        assert code == 0, err
    second, first = db.list_runs()
    for run in (first, second):
        assert run.name.startswith("es-conciseness-") and run.config["run_name"] == run.name
        assert run.config["output_dir"] == str(tmp_path / "data" / "runs" / run.name)
    assert first.name != second.name
    named = ["--set", "run_name=mine"]
    assert run_cli(capsys, "submit", "es-conciseness", *named)[0] == 0
    assert db.list_runs()[0].config["output_dir"] == str(tmp_path / "data" / "runs" / "mine")


def test_an_output_dir_given_for_a_preset_is_kept_and_checked(db, capsys, tmp_path):
    given = ["--set", f"output_dir={tmp_path / 'data' / 'runs' / 'given'}"]
    assert run_cli(capsys, "submit", "es-conciseness", *given)[0] == 0
    assert db.list_runs()[0].config["output_dir"] == str(tmp_path / "data" / "runs" / "given")
    code, _, err = run_cli(capsys, "submit", "es-conciseness", *given)
    assert code == 2 and "data.output_dir" in err and "is in use by run 1 (queued)" in err
    # `eslab train` reads a preset the same way
    own = load_run_config("es-conciseness", [])
    assert own.data.output_dir == f"data/runs/{own.logging.run_name}"


def test_runs_lists_status_and_progress(db, config_file, capsys):
    run_cli(capsys, "submit", str(config_file))
    run = db.list_runs()[0]
    db.start_run(run.id)
    db.heartbeat(run.id, step=3)
    code, out, _ = run_cli(capsys, "runs")
    assert code == 0
    header, row = out.splitlines()
    assert header.split() == ["ID", "NAME", "METHOD", "STATUS", "STEP", "CREATED"]
    assert row.split()[:5] == [str(run.id), run.name, "es", "running", "3/4"]


def test_runs_says_when_a_runs_engine_is_starting(db, config_file, capsys):
    run_cli(capsys, "submit", str(config_file))
    run = db.list_runs()[0]
    db.start_run(run.id)
    db.add_event(run.id, "info", phases.STARTING_ENGINE)  # as the worker notes it
    _, out, _ = run_cli(capsys, "runs")
    assert "  running: starting engine (0 s)  0/4  " in out.splitlines()[1]
    db.add_event(run.id, "info", phases.engine_started(30.0))
    _, out, _ = run_cli(capsys, "runs")
    assert "  running  0/4  " in out.splitlines()[1]


def test_cancel_a_queued_run_then_a_running_one(db, config_file, capsys, tmp_path):
    run_cli(capsys, "submit", str(config_file))
    run_cli(capsys, "submit", str(config_file), "--set", f"output_dir={tmp_path / 'b'}")
    first, second = sorted(db.list_runs(), key=lambda r: r.id)
    assert run_cli(capsys, "cancel", str(first.id))[1].startswith(f"run {first.id} cancelled")
    db.start_run(second.id)
    _, out, _ = run_cli(capsys, "cancel", second.uuid[:8])
    assert "cancelling" in out and db.get_run(second.id).status is RunStatus.CANCELLING
    code, _, err = run_cli(capsys, "cancel", str(first.id))
    assert code == 2 and "already cancelled" in err


def test_resume_queues_the_same_run_from_its_latest_checkpoint(db, config_file, capsys, tmp_path):
    run_cli(capsys, "submit", str(config_file))
    run = db.list_runs()[0]
    db.start_run(run.id)
    for step in (1, 2, 3):
        db.record_step(run.id, StepReport(step=step, metrics={"train/reward/mean": step}))
    for step in (1, 2):
        (tmp_path / "out" / f"checkpoint-{step}").mkdir(parents=True)
        db.add_checkpoint(run.id, step, str(tmp_path / "out" / f"checkpoint-{step}"))
    db.finish_run(run.id, RunStatus.FAILED, error="killed")

    code, out, _ = run_cli(capsys, "resume", str(run.id))
    assert code == 0 and "attempt 2: resumes from" in out and "(step 2)" in out
    resumed = db.get_run(run.id)
    assert (resumed.status, resumed.attempt, resumed.step) == (RunStatus.QUEUED, 2, 2)
    assert [p.step for p in db.metric_series(run.id, "train/reward/mean")] == [1, 2]
    code, _, err = run_cli(capsys, "resume", str(run.id))
    assert code == 2 and "only a failed or cancelled run" in err


def test_clone_changes_options_and_links_the_parent(db, config_file, capsys):
    run_cli(capsys, "submit", str(config_file))
    parent = db.list_runs()[0]
    code, out, _ = run_cli(capsys, "clone", str(parent.id), "--set", "learning_rate=0.5")
    clone = db.list_runs()[0]
    assert code == 0 and f"run {clone.id} " in out
    assert clone.id != parent.id and clone.parent_id == parent.id
    assert clone.config["learning_rate"] == 0.5
    assert clone.config["noise_std"] == parent.config["noise_std"]
    assert clone.config["output_dir"].startswith(parent.config["output_dir"] + "-clone-")
    assert clone.name.startswith(parent.name + "-clone-") and clone.status is RunStatus.QUEUED
    code, _, err = run_cli(capsys, "clone", str(parent.id), "--set", "learning_rate=-1")
    assert code == 2 and "learning_rate" in err


def exported_run(db):
    run = db.create_run(name="exp", method="es", config={"method": "es"}, total_steps=3)
    for step in (1, 2, 3):
        db.record_step(
            run.id,
            StepReport(
                step=step,
                metrics={"train/reward/mean": step / 10, "train/noise_std": 0.1},
                population=[
                    PopulationRecord(member=m, seed=m, fitness=m, shaped_fitness=-m)
                    for m in range(3)
                ],
                samples=[
                    SampleRecord(
                        split="train",
                        prompt_index=0,
                        sample_index=0,
                        prompt="p,q",
                        completion=f'say "{step}"',
                        reward=1.0,
                        reward_parts={"format": 0.5},
                    )
                ],
                wall_time=50.0 + step,
            ),
        )
    return run


def test_export_json_has_every_row(db, capsys, tmp_path):
    run = exported_run(db)
    code, _, _ = run_cli(
        capsys, "export", str(run.id), "--format", "json", "--out", str(tmp_path / "run.json")
    )
    assert code == 0
    document = json.loads((tmp_path / "run.json").read_text())
    assert document["run"]["name"] == "exp" and document["run"]["status"] == "queued"
    assert len(document["metrics"]) == 6 and len(document["population"]) == 9
    assert document["metrics"][0] == {
        "key": "train/noise_std",
        "step": 1,
        "value": 0.1,
        "wall_time": 51.0,
    }
    assert document["samples"][2]["completion"] == 'say "3"'
    assert document["samples"][0]["reward_parts"] == {"format": 0.5}


def test_export_csv_writes_one_file_per_table(db, capsys, tmp_path):
    run = exported_run(db)
    code, _, err = run_cli(
        capsys, "export", run.uuid, "--format", "csv", "--out", str(tmp_path / "x")
    )
    assert code == 0 and "6 metrics rows, 9 population rows, 3 samples rows" in err
    with (tmp_path / "x" / "metrics.csv").open() as f:
        metrics = list(csv.DictReader(f))
    assert [(m["key"], m["step"], m["value"]) for m in metrics][:2] == [
        ("train/noise_std", "1", "0.1"),
        ("train/noise_std", "2", "0.1"),
    ]
    with (tmp_path / "x" / "samples.csv").open() as f:
        samples = list(csv.DictReader(f))
    assert samples[0]["prompt"] == "p,q" and json.loads(samples[0]["reward_parts"]) == {
        "format": 0.5
    }
    assert len(list(csv.DictReader((tmp_path / "x" / "population.csv").open()))) == 9
    assert json.loads((tmp_path / "x" / "run.json").read_text())["id"] == run.id
