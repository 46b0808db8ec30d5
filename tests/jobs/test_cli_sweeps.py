"""`eslab sweep / sweeps / cancel --sweep / export --sweep` against a real SQLite file; the
scheduler's part (advance_sweeps) is called here as its tick would."""

from __future__ import annotations

import csv
import io
import json

import yaml

from app.report import summary_rows, sweep_report
from engine.sink import StepReport
from jobs.store.status import RunStatus, SweepStatus
from jobs.sweeps.driver import advance_sweeps
from tests.jobs.test_cli_runs import run_cli

REWARD = "train/reward/mean"


def start(capsys, config_file, *extra):
    return run_cli(
        capsys,
        "sweep",
        str(config_file),
        "--grid",
        "noise_std=0.001,0.002",
        "--objective",
        f"{REWARD}:max",
        "--name",
        "sw",
        *extra,
    )


def succeed(db, run, value):
    db.start_run(run.id)
    db.record_step(run.id, StepReport(step=1, metrics={REWARD: value}))
    db.finish_run(run.id, RunStatus.SUCCEEDED)


def test_sweep_starts_a_grid_and_sweeps_lists_it(db, config_file, capsys):
    code, out, err = start(capsys, config_file, "--set", "population_size=2")
    assert code == 0, err
    (sweep,) = db.list_sweeps()
    assert out.splitlines() == [
        f"sweep {sweep.id} 'sw' started: grid over noise_std; 2 runs, 2 at a time; "
        f"objective {REWARD} (max, last)",
        "the scheduler of `eslab serve` queues its runs",
        f"http://127.0.0.1:8501/sweep?sweep={sweep.id}",
    ]
    assert sweep.spec["parameters"] == {"noise_std": {"values": [0.001, 0.002]}}
    assert sweep.base_config["es"]["population_size"] == 2  # --set changes the base

    advance_sweeps(db)
    first, _ = db.sweep_runs(sweep.id)
    succeed(db, first, 0.25)
    code, out, _ = run_cli(capsys, "sweeps")
    header, row = out.splitlines()
    assert header.split() == ["ID", "NAME", "STATUS", "METHOD", "RUNS", "LIVE", "BEST", "CREATED"]
    assert row.split()[:8] == [str(sweep.id), "sw", "active", "grid", "2/2", "1", "0.25", "(run"]
    code, out, _ = run_cli(capsys, "runs")
    assert "sw-t000" in out and "sw-t001" in out  # its runs are runs


def test_sweep_tag_labels_every_run_of_the_sweep(db, config_file, capsys):
    code, out, err = start(capsys, config_file, "--tag", "night", "--tag", "lr-search")
    assert code == 0, err
    assert "its runs are tagged sweep:sw, night, lr-search" in out.splitlines()
    (sweep,) = db.list_sweeps()
    assert sweep.tags == ["night", "lr-search"]
    advance_sweeps(db)
    runs = db.sweep_runs(sweep.id)
    assert len(runs) == 2
    assert all(r.tags == ["sweep:sw", "night", "lr-search"] for r in runs)
    assert "<th>tags</th><td>night, lr-search</td>" in sweep_report(db, sweep.id)


def test_a_space_file_with_options_that_override_it(db, config_file, capsys, tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(
        yaml.safe_dump(
            {
                "method": "random",
                "budget": 5,
                "objective": {"metric": REWARD, "mode": "min"},
                "parameters": {
                    "noise_std": {"low": 0.0005, "high": 0.005, "log": True},
                    "learning_rate": {"values": [0.001, 0.002]},
                },
            }
        )
    )
    code, _, err = run_cli(
        capsys,
        "sweep",
        str(config_file),
        "--space",
        str(space),
        "--grid",
        "learning_rate=0.003,0.004",
        "--budget",
        "3",
        "--parallel",
        "1",
    )
    assert code == 0, err
    spec = db.list_sweeps()[0].spec
    assert (spec["method"], spec["budget"], spec["parallel"]) == ("random", 3, 1)
    assert spec["objective"]["mode"] == "min"  # the file's, as no --objective was given
    assert spec["parameters"]["learning_rate"] == {"values": [0.003, 0.004]}  # --grid's
    assert spec["parameters"]["noise_std"]["log"] is True


def test_bad_input_is_one_line_naming_the_field_and_stores_nothing(db, config_file, capsys):
    cases = [
        (["--grid", "noise_std=0.001,abc"], "parameters.noise_std.values[1]"),
        (["--grid", "noise_sd=0.1", "--objective", REWARD], "did you mean 'noise_std'"),
        (["--grid", "noise_std=0.001"], "a sweep needs an objective: --objective"),
        (["--grid", "noise_std=0.001", "--objective", "train/reward/avg"], "objective.metric"),
        (["--grid", "output_dir=/tmp/x", "--objective", REWARD], "output_dir cannot be swept"),
        ([], "give the search: --space SPACE.yaml and/or --grid"),
    ]
    for extra, message in cases:
        code, _, err = run_cli(capsys, "sweep", str(config_file), *extra)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert db.list_sweeps() == [] and db.list_runs() == []
    assert start(capsys, config_file)[0] == 0
    code, _, err = start(capsys, config_file)
    assert code == 2 and "a sweep named 'sw' exists already" in err


def test_cancel_a_sweep_and_its_runs(db, config_file, capsys):
    start(capsys, config_file)
    advance_sweeps(db)
    first, second = db.sweep_runs("sw")
    db.start_run(first.id)
    code, out, _ = run_cli(capsys, "cancel", "--sweep", "sw")
    assert code == 0
    assert out.strip() == (
        "sweep 1 'sw' cancelled: it queues no more runs; its runs: "
        f"{first.id} (cancelling), {second.id} (cancelled)"
    )
    assert db.get_sweep("sw").status is SweepStatus.CANCELLED
    code, _, err = run_cli(capsys, "cancel", "--sweep", "sw")
    assert code == 2 and "sweep 1 is already cancelled" in err
    code, _, err = run_cli(capsys, "cancel")
    assert code == 2 and "give a run to cancel, or --sweep ID" in err


def test_export_a_sweep_as_csv_json_and_a_ranked_report(db, config_file, capsys, tmp_path):
    start(capsys, config_file)
    advance_sweeps(db)
    first, second = db.sweep_runs("sw")
    succeed(db, first, 0.25)
    succeed(db, second, 0.75)

    code, out, _ = run_cli(capsys, "export", "--sweep", "sw", "--format", "csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["run"], r["noise_std"], r["objective"], r["rank"]) for r in rows] == [
        ("sw-t000", "0.001", "0.25", "2"),
        ("sw-t001", "0.002", "0.75", "1"),
    ]

    out_file = tmp_path / "sweep.json"
    code, _, err = run_cli(
        capsys, "export", "--sweep", "1", "--format", "json", "--out", str(out_file)
    )
    assert code == 0 and f"wrote 2 runs of sweep 1 to {out_file}" in err
    document = json.loads(out_file.read_text())
    assert document["sweep"]["name"] == "sw" and document["sweep"]["status"] == "active"
    assert document["sweep"]["spec"]["objective"]["metric"] == REWARD
    assert [(r["trial"], r["state"], r["rank"]) for r in document["runs"]] == [
        (0, "complete", 2),
        (1, "complete", 1),
    ]

    report = tmp_path / "sweep.html"
    code, _, _ = run_cli(
        capsys, "export", "--sweep", "sw", "--format", "html", "--out", str(report)
    )
    assert code == 0
    html = report.read_text()
    assert "<script" not in html.lower() and "Runs, best first" in html
    assert html.index("sw-t001") < html.index("sw-t000")  # ranked by the objective
    # and a run's own report names its sweep and trial
    assert ("sweep", "sw (sweep 1, active), trial 1") in summary_rows(db, db.get_run(second.id))


def test_a_preset_is_swept_by_the_shipped_space_named_after_it_and_by_seeds(db, capsys):
    for space in ("es-conciseness", "seeds"):
        code, _, err = run_cli(capsys, "sweep", "es-conciseness", "--space", space, "--name", space)
        assert code == 0, err
    tuning, seeds = (db.get_sweep(name).spec for name in ("es-conciseness", "seeds"))
    assert (tuning["method"], tuning["budget"], tuning["parallel"]) == ("tpe", 6, 1)
    assert tuning["parameters"]["learning_rate"]["log"] is True
    assert (seeds["method"], seeds["parameters"]) == ("grid", {"seed": {"values": [1, 2, 3]}})
