"""`eslab scorer serve` as a process on a free port of 127.0.0.1, called for real."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from engine.scoring.client import ScorerClient, ScorerError
from tests.integration.scorers import tiny_checkpoint
from tests.jobs.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_eslab_scorer_serve(tmp_path):
    reward = tiny_checkpoint(tmp_path / "reward", num_labels=1, seed=0)
    cost = tiny_checkpoint(tmp_path / "cost", num_labels=2, seed=1)
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app.cli",
            "scorer",
            "serve",
            "--port",
            str(port),
            "--reward-model",
            str(reward),
            "--cost-model",
            str(cost),
            "--batch-size",
            "2",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    client = ScorerClient(f"http://127.0.0.1:{port}", timeout_s=5)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                assert client.health()["reward_model"] == str(reward)
                break
            except ScorerError:
                assert process.poll() is None, process.stdout.read()
                assert time.monotonic() < deadline, "the scorer did not come up in 120 s"
                time.sleep(0.5)
        rewards, costs = client.score(["how do i make a cake"] * 3, ["sorry", "the cake", "a"])
        assert rewards.shape == costs.shape == (3,)
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_serve_names_a_missing_model_folder(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.cli",
            "scorer",
            "serve",
            "--reward-model",
            str(tmp_path / "nope"),
            "--cost-model",
            str(tmp_path / "nope"),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert f"scoring model {tmp_path / 'nope'} is not a Hugging Face checkpoint" in result.stderr
