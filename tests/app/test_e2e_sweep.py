"""A sweep as a user runs one: `eslab serve` (Ray head, scheduler, dashboard) on a temporary
database, `eslab sweep` of the es-conciseness preset shrunk to two tiny real runs (vLLM on
the CPU, the default model), run side by side; the sweep's scheduler pass queues them, Ray
runs them, the sweep finishes and ranks them; `eslab sweeps` and `eslab export --sweep`
say so. Two vLLM engines start at once (about 30 s each on a quiet 2-core CPU)."""

from __future__ import annotations

import csv
import io
import subprocess

import pytest

from engine import metrics as mk
from jobs.store.migrate import upgrade
from jobs.store.status import RunStatus, SweepStatus
from jobs.store.store import Store
from jobs.sweeps.driver import sweep_table
from tests.app.serving import ESLAB, eslab_serve, serve_env
from tests.jobs.helpers import wait_for

pytestmark = pytest.mark.heavy

SWEEP_DEADLINE_S = 420  # two tiny runs at once, engine starts included, on a busy 2-core CPU
REWARD = mk.reward_key(mk.TRAIN)
TINY = {
    "population_size": 2,
    "data_batch_size": 2,
    "max_steps": 2,
    "max_tokens": 4,
    "eval_strategy": "no",
    "save_strategy": "no",
    "max_model_len": 1024,
    "max_num_seqs": 16,
}


def eslab(env, *args) -> str:
    result = subprocess.run(
        [ESLAB, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_sweep_of_two_tiny_real_runs_through_serve(tmp_path):
    db_url = f"sqlite:///{tmp_path / 'eslab.db'}"
    upgrade(db_url)
    env = serve_env(db_url, ESLAB_MAX_CONCURRENT_RUNS="2")
    with eslab_serve(env, tmp_path / "serve.log") as base:
        sets = [f"--set={k}={v}" for k, v in {**TINY, "output_dir": tmp_path / "sw"}.items()]
        out = eslab(
            env,
            "sweep",
            "es-conciseness",
            "--grid",
            "noise_std=0.001,0.003",
            "--objective",
            f"{REWARD}:max",
            "--name",
            "e2e-sweep",
            *sets,
        )
        assert out.splitlines()[-1] == f"{base}/sweep?sweep=1"  # the serving dashboard
        store = Store(db_url)
        try:
            sweep = wait_for(
                lambda: (s := store.get_sweep(1)).status is SweepStatus.FINISHED and s,
                SWEEP_DEADLINE_S,
                "the sweep to finish",
                interval=1,
            )
            runs = store.sweep_runs(sweep.id)
            table = sweep_table(store, sweep.id)
            curves = store.metric_curves([r.id for r in runs], REWARD)
        finally:
            store.close()
        listed = eslab(env, "sweeps")
        exported = eslab(env, "export", "--sweep", "e2e-sweep", "--format", "csv")
    log = (tmp_path / "serve.log").read_text()[-3000:]
    assert [(r.name, r.status) for r in runs] == [
        ("e2e-sweep-t000", RunStatus.SUCCEEDED),
        ("e2e-sweep-t001", RunStatus.SUCCEEDED),
    ], ([r.error for r in runs], log)
    assert [r.config["noise_std"] for r in runs] == [0.001, 0.003]
    assert all(r.tags == ["sweep:e2e-sweep"] and r.step == 2 for r in runs)
    assert runs[0].config["output_dir"] == str(tmp_path / "sw" / "e2e-sweep-t000")
    # the runs ran side by side: each started before the other ended
    assert runs[0].started_at < runs[1].finished_at and runs[1].started_at < runs[0].finished_at
    assert all(sorted(curves[r.id]) == [1, 2] for r in runs)  # two steps each
    assert table["state"].tolist() == ["complete", "complete"]
    assert table["objective"].tolist() == [curves[r.id][2] for r in runs]  # the last value
    assert sorted(table["rank"].tolist()) == [1, 2]
    (row,) = [line.split() for line in listed.splitlines() if "e2e-sweep" in line]
    assert row[:5] == ["1", "e2e-sweep", "finished", "grid", "2/2"]
    rows = list(csv.DictReader(io.StringIO(exported)))
    assert [r["run"] for r in rows] == ["e2e-sweep-t000", "e2e-sweep-t001"]
