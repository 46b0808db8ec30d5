"""`eslab bon` on a checkpoint folder of the default model: a real vLLM engine samples N
answers a prompt, the run's ensemble scores them once, and the unbiased estimator gives proxy
and gold scores by n for each member and each ensemble rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.config import RunConfig

pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parents[2]


def gold_length(completion_text: str, target: str) -> dict:
    """A 'gold' reward unrelated to the proxy: longer is better (it names the dataset's
    argument, as every reward function must, and ignores it)."""
    return {"reward": float(len(completion_text))}


def length_penalty(completion_text: str, target: str) -> dict:
    """A second proxy member: shorter is better."""
    return {"reward": -0.1 * len(completion_text)}


def test_bon_on_a_checkpoint(default_model_dir, tmp_path):
    checkpoint = tmp_path / "checkpoint-1"
    checkpoint.mkdir()
    for file in default_model_dir.iterdir():
        (checkpoint / file.name).symlink_to(file)
    config = RunConfig.from_flat(
        {
            "train_file": str(ROOT / "data/conciseness/train.parquet"),
            "eval_file": str(ROOT / "data/conciseness/test.parquet"),
            "reward_func_path": "engine.rewards.conciseness.compute_score",
            "reward_source": "ensemble",
            "ensemble_members": "engine.rewards.conciseness.compute_score,"
            "tests.integration.test_bon.length_penalty",
            "uwo_weight": 0.5,
            "output_dir": str(tmp_path),
            "max_tokens": 16,
            "max_model_len": 512,
        }
    )
    (checkpoint / "trainer_state.json").write_text(json.dumps({"config": config.to_flat()}))
    out = tmp_path / "bon.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.cli",
            "bon",
            str(checkpoint),
            "--n",
            "1,2,4",
            "--gold",
            "tests.integration.test_bon.gold_length",
            "--prompts",
            "4",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    print(result.stdout)
    curves = json.loads(out.read_text())
    # each member alone, then the ensemble's rules, the run's uwo_weight by default
    assert list(curves) == [
        "bon/member/conciseness",
        "bon/member/length_penalty",
        "bon/mean",
        "bon/min",
        "bon/uwo/0.5",
    ]
    for points in curves.values():
        assert [p["n"] for p in points] == [1, 2, 4]
        proxies = [p["proxy_score"] for p in points]
        assert proxies == sorted(proxies)  # the proxy's own pick can only improve with n
    assert curves["bon/member/conciseness"][-1]["proxy_score"] <= 0.0  # minus a distance
    golds = [points[0]["gold_score"] for points in curves.values()]
    assert golds == pytest.approx([golds[0]] * len(golds))  # n = 1: any answer, whoever picks


def test_bon_refuses_a_folder_that_is_not_a_checkpoint(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "bon", str(tmp_path), "--gold", "scorer"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 2
    assert "is not a checkpoint folder" in result.stderr
