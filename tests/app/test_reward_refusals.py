"""The form, `eslab train` and `eslab submit` refuse a run whose reward names code outside the
allowed places, in the words of the configuration's validation, which they share."""

from __future__ import annotations

import pytest

from app.cli import main
from app.forms import validate
from engine.rewards import REWARD_MODULES_SETTING

NOT_ALLOWED = (
    "reward.reward_func_path 'os.system' is not in an allowed place: reward functions must be "
    "defined in a module under engine.rewards or in a module or folder that the operator lists "
    "in the ESLAB_REWARD_MODULES setting; to allow this one, add 'os' (or the folder that "
    "holds its file) to ESLAB_REWARD_MODULES"
)


@pytest.fixture(autouse=True)
def no_setting(monkeypatch):
    monkeypatch.delenv(REWARD_MODULES_SETTING, raising=False)


def test_the_form_shows_the_refusal_under_the_field():
    config, errors = validate(
        {"train_file": "t.parquet", "output_dir": "o", "reward_func_path": "os.system"}
    )
    assert config is None
    assert errors == {"reward_func_path": NOT_ALLOWED}


@pytest.mark.parametrize("command", ["train", "submit"])
def test_the_cli_refuses_before_anything_runs(capsys, monkeypatch, tmp_path, command):
    monkeypatch.setenv("ESLAB_DATABASE_URL", f"sqlite:///{tmp_path / 'eslab.db'}")
    run = tmp_path / "run.yaml"
    run.write_text(
        f"train_file: t.parquet\noutput_dir: {tmp_path / 'out'}\nreward_func_path: os.system\n"
    )
    assert main([command, str(run)]) == 2
    err = capsys.readouterr().err
    assert NOT_ALLOWED in err and str(run) in err
    assert not (tmp_path / "out").exists()
