"""The `eslab` command as a user meets it: help, and one clear line for bad input."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main
from engine.model_files import MANIFEST_NAME
from jobs.store.migrate import upgrade

ESLAB = str(Path(sys.executable).with_name("eslab"))


def run_eslab(*args, env=None):
    return subprocess.run([ESLAB, *args], capture_output=True, text=True, env=env, timeout=120)


def test_help_lists_the_commands():
    result = run_eslab("--help")
    assert result.returncode == 0
    for command in ("serve", "model", "db"):
        assert command in result.stdout


def one_line_error(capsys, argv, monkeypatch=None):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    return err


def test_a_missing_model_folder_is_one_line(capsys, tmp_path):
    err = one_line_error(capsys, ["model", "check", str(tmp_path / "nope")])
    assert "does not exist" in err


def test_a_corrupt_model_folder_is_one_line(capsys, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{ not json")
    err = one_line_error(capsys, ["model", "check", str(folder)])
    assert "config.json is not valid JSON" in err


def test_a_model_whose_weights_changed_is_reported_corrupt(capsys, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "tokenizer.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"truncated")
    (folder / MANIFEST_NAME).write_text(json.dumps({"files": {"model.safetensors": "0" * 64}}))
    err = one_line_error(capsys, ["model", "check", str(folder)])
    assert "model.safetensors does not match its checksum" in err


def test_an_unreachable_database_is_one_line(capsys, monkeypatch):
    monkeypatch.setenv("ESLAB_DATABASE_URL", "postgresql+psycopg://nobody@127.0.0.1:1/none")
    err = one_line_error(capsys, ["db", "current"])
    assert "cannot reach the database" in err and "ESLAB_DATABASE_URL" in err


def test_an_outdated_database_names_the_upgrade_command(capsys, monkeypatch, tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(url, "0001")
    monkeypatch.setenv("ESLAB_DATABASE_URL", url)
    err = one_line_error(capsys, ["serve", "--port", "1"])
    assert "eslab db upgrade" in err


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_default_model_folder_is_ignored_by_git():
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        ["git", "check-ignore", "data/models/smollm2-135m-instruct/x"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0


def test_serve_binds_localhost_unless_told():
    from app.cli import build_parser

    assert build_parser().parse_args(["serve"]).host == "127.0.0.1"
    assert build_parser().parse_args(["serve", "--host", "0.0.0.0"]).host == "0.0.0.0"
    from jobs.service import dashboard_command

    command = dashboard_command("0.0.0.0", 8600)
    assert command[command.index("--server.address") + 1] == "0.0.0.0"
    # the toolbar without Streamlit's developer items such as "Deploy"
    assert command[command.index("--client.toolbarMode") + 1] == "viewer"
    # no full garbage collection after each of the live pages' reruns, no source watcher
    assert command[command.index("--runner.postScriptGC") + 1] == "false"
    assert command[command.index("--server.fileWatcherType") + 1] == "none"


ROOT = Path(__file__).resolve().parents[2]


def test_python_dash_m_is_the_same_command():
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0
    for command in (
        "serve",
        "submit",
        "runs",
        "cancel",
        "resume",
        "clone",
        "export",
        "train",
        "data",
        "model",
        "db",
        "users",
        "scorer",
        "bon",
    ):
        assert command in result.stdout


def test_help_loads_no_heavy_library():
    """Handlers import engine/ and jobs/ internals when they run, so `eslab --help` is quick."""
    heavy = ("torch", "vllm", "ray", "sqlalchemy", "streamlit", "transformers")
    script = (
        "import sys; from app.cli import build_parser; build_parser(); "
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
