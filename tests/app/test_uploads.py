"""What a shared dashboard accepts and serves (under AppTest, on a migrated SQLite database):
the parquet upload needs an editor, is capped (ESLAB_MAX_UPLOAD_MB), is kept only once it
loads and leaves nothing behind otherwise; unused uploads are removed; the YAML import is
capped; download file names hold only safe characters (checkpoints: test_viewer_limits)."""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app import auth, exports
from app.cli import main
from engine.data.datasets import DatasetError, write_dataset
from engine.data.uploads import keep_upload, uploads_dir
from jobs.uploads import clean_uploads
from tests.app.conftest import make_config

MAIN = str(Path(__file__).resolve().parents[2] / "app" / "main.py")
TIMEOUT = 60
EDITOR = "ed"
VIEWER = "vi"


def session(name: str) -> auth.Session:
    """What a login of `name` (a user of the store fixture's auth file) leaves in the tab."""
    return auth.signed_in(auth.load_users(auth.auth_path())[name])


@pytest.fixture
def store(store, editor_and_viewer, monkeypatch, tmp_path):
    """The seeded database, a data folder of its own, and an auth file with one editor
    and one viewer."""
    monkeypatch.setenv("ESLAB_DATA_DIR", str(tmp_path / "data"))
    return store


def new_run_page(user: str) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    at.session_state[auth.SESSION_KEY] = session(user)
    at.run()
    return at.switch_page("app_pages/new_run.py").run()


def upload(at: AppTest, name: str, data: bytes) -> AppTest:
    return at.file_uploader(key="new_parquet").upload(name, data).run()


def kept_files() -> list[Path]:
    folder = uploads_dir()
    return sorted(folder.iterdir()) if folder.is_dir() else []  # hidden files included


def big_dataset(folder: Path, mib: float) -> bytes:
    """A valid dataset of about `mib` MiB that does not compress (random text)."""
    text = secrets.token_urlsafe(int(mib * 2**20 * 3 / 4))
    rows = [{"prompt": [{"role": "user", "content": text}], "reward_func_args": {}}]
    return write_dataset(rows, folder / "big.parquet").read_bytes()


# -- the parquet upload -------------------------------------------------------------------


def test_a_viewer_cannot_upload_a_dataset(store, dataset):
    at = new_run_page(VIEWER)
    widget = at.file_uploader(key="new_parquet")
    assert widget.disabled
    before = at.selectbox(key="new_train_file").value
    widget.proto.disabled = False  # a forged request: the server must not trust the browser
    upload(at, "good.parquet", dataset.read_bytes())
    assert not at.exception
    assert kept_files() == []
    assert at.selectbox(key="new_train_file").value == before


def test_an_editor_is_offered_the_route_for_larger_datasets(store):
    """The form's uploader takes what Streamlit may hold (1 MiB); a larger dataset goes
    through the upload route with a ticket of this editor's, as a link and a curl command."""
    from app import tickets, upload_route

    at = new_run_page(EDITOR)
    assert at.file_uploader(key="new_parquet").max_upload_size_mb == 1
    [command] = [c.value for c in at.code if upload_route.DATASETS_ROUTE in c.value]
    ticket = command.split("Bearer ")[1].split("'")[0]
    assert tickets.verify(ticket, tickets.UPLOAD).name == EDITOR
    viewer = new_run_page(VIEWER)
    assert not [c for c in viewer.code if upload_route.DATASETS_ROUTE in c.value]


def keep_as_page_would(data: bytes) -> None:
    from app import forms
    from app.state import get_store

    forms.upload_dataset(get_store(), "good.parquet", data)


def test_the_upload_function_refuses_a_viewer(store, dataset):
    """The check where the file is written, not only the disabled widget."""
    at = AppTest.from_function(
        keep_as_page_would, args=(dataset.read_bytes(),), default_timeout=TIMEOUT
    )
    at.session_state[auth.SESSION_KEY] = session(VIEWER)
    at.run()
    assert not at.exception
    assert [e.value for e in at.error] == ["vi is a viewer: only editors may upload datasets"]
    assert kept_files() == []
    at.session_state[auth.SESSION_KEY] = session(EDITOR)
    at.run()
    assert len(kept_files()) == 1


def test_an_editor_upload_is_kept_under_a_safe_name(store, dataset):
    at = upload(new_run_page(EDITOR), "../../etc/my data;rm -rf.parquet", dataset.read_bytes())
    assert not at.exception, at.exception
    [kept] = kept_files()
    assert kept.name.endswith("-my-data-rm--rf.parquet") and kept.parent == uploads_dir()
    assert at.selectbox(key="new_train_file").value == f"data/uploads/{kept.name}"
    assert any("4 prompts" in s.value for s in at.success)


def test_an_upload_over_the_size_cap_is_refused(store, tmp_path, monkeypatch):
    monkeypatch.setenv("ESLAB_MAX_UPLOAD_MB", "1")
    data = big_dataset(tmp_path, 1.5)
    assert len(data) > 2**20
    at = new_run_page(EDITOR)
    assert at.file_uploader(key="new_parquet").max_upload_size_mb == 1
    upload(at, "big.parquet", data)
    assert not at.exception
    assert any("ESLAB\\_MAX\\_UPLOAD\\_MB" in e.value for e in at.error)
    assert kept_files() == []


@pytest.mark.parametrize(
    "data, message",
    [
        (b"not parquet", "bad.parquet: not a readable parquet file"),
        ("no-columns", "bad.parquet: missing column 'prompt'"),
        ("empty-prompt", "bad.parquet: row 0, column 'prompt'"),
    ],
)
def test_a_bad_dataset_is_refused_and_nothing_is_left(store, tmp_path, data, message):
    import pyarrow as pa
    import pyarrow.parquet as pq

    if data == "no-columns":
        pq.write_table(pa.table({"text": ["hi"]}), tmp_path / "x.parquet")
        data = (tmp_path / "x.parquet").read_bytes()
    elif data == "empty-prompt":
        pq.write_table(pa.table({"prompt": [[]], "reward_func_args": ["{}"]}), tmp_path / "x.pq")
        data = (tmp_path / "x.pq").read_bytes()
    with pytest.raises(DatasetError) as info:
        keep_upload(data, "bad.parquet")
    assert message in str(info.value) and ".partial" not in str(info.value)
    assert kept_files() == []


def test_a_decompression_bomb_is_refused(store, tmp_path, monkeypatch):
    monkeypatch.setenv("ESLAB_MAX_UPLOAD_MB", "1")
    rows = [{"prompt": [{"role": "user", "content": "a" * 12 * 2**20}], "reward_func_args": {}}]
    data = write_dataset(rows, tmp_path / "bomb.parquet").read_bytes()
    assert len(data) < 2**20
    with pytest.raises(DatasetError, match="decompresses to 12 MiB, more than 10 x 1 MiB"):
        keep_upload(data, "bomb.parquet")
    assert kept_files() == []


def test_an_interrupted_upload_leaves_nothing(store, dataset, monkeypatch):
    import engine.data.uploads

    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(engine.data.uploads, "load_dataset", interrupted)
    with pytest.raises(KeyboardInterrupt):
        keep_upload(dataset.read_bytes(), "good.parquet")
    assert kept_files() == []


@pytest.mark.parametrize("value", ["lots", "0", "-5", "inf", "nan"])
def test_a_malformed_size_setting_is_refused_not_ignored(store, dataset, monkeypatch, value):
    monkeypatch.setenv("ESLAB_MAX_UPLOAD_MB", value)
    with pytest.raises(ValueError, match="ESLAB_MAX_UPLOAD_MB must be a positive number"):
        keep_upload(dataset.read_bytes(), "good.parquet")


# -- removing unused uploads --------------------------------------------------------------


def test_unused_old_uploads_are_removed(store, dataset, tmp_path, capsys):
    used = keep_upload(dataset.read_bytes(), "used.parquet").path
    unused = keep_upload(dataset.read_bytes(), "unused.parquet").path
    fresh = keep_upload(dataset.read_bytes(), "fresh.parquet").path
    crashed = uploads_dir() / ".deadbeef.partial"  # a dashboard killed mid-write
    crashed.write_bytes(b"half")
    config = make_config(used, tmp_path / "out").to_flat()
    store.create_run(name="uses-an-upload", method="es", config=config)
    day_ago = time.time() - 25 * 3600
    for path in (used, unused, crashed):
        os.utime(path, (day_ago, day_ago))

    assert main(["data", "clean-uploads", "--dry-run"]) == 0
    assert "would remove 2 unused upload(s)" in capsys.readouterr().out
    assert len(kept_files()) == 4
    assert main(["data", "clean-uploads"]) == 0
    assert kept_files() == sorted([used, fresh])
    assert clean_uploads(store) == []


def test_an_upload_named_in_eval_sets_is_used(store, dataset, tmp_path):
    used = keep_upload(dataset.read_bytes(), "math500.parquet").path
    day_ago = time.time() - 25 * 3600
    os.utime(used, (day_ago, day_ago))
    config = make_config(dataset, tmp_path / "out").to_flat()
    config["eval_sets"] = f"math500={used},aime={dataset}"
    store.create_run(name="uses-an-upload-as-an-eval-set", method="es", config=config)
    assert clean_uploads(store) == []
    assert kept_files() == [used]


def test_a_kept_upload_removes_unused_old_ones(store, dataset):
    old = keep_upload(dataset.read_bytes(), "old.parquet").path
    day_ago = time.time() - 25 * 3600
    os.utime(old, (day_ago, day_ago))
    at = upload(new_run_page(EDITOR), "new.parquet", dataset.read_bytes())
    assert not at.exception
    assert [p.name.split("-", 1)[1] for p in kept_files()] == ["new.parquet"]


# -- the YAML import ----------------------------------------------------------------------


def test_a_yaml_import_over_the_cap_is_refused(store):
    at = new_run_page(VIEWER)  # importing YAML only fills the form: viewers may
    assert at.file_uploader(key="new_yaml").max_upload_size_mb == 1
    text = b"noise_std: 0.0042\n" + b"# padding\n" * 120_000
    at.file_uploader(key="new_yaml").upload("big.yaml", text).run()
    assert not at.exception
    assert at.text_input(key="new_noise_std").value != "0.0042"
    assert any("at most 1 MiB" in e.value for e in at.error)


def test_download_file_names_hold_only_safe_characters(store):
    run = store.create_run(name='../../x "y"\r\nz;$(id)', method="es", config={})
    name = exports.file_name(run, ".tar", "step-3")
    assert name == f"run-{run.id}-..-..-x-y-z-id--step-3.tar"  # no "/", quote, newline
    other = store.create_run(name="日本語", method="es", config={})
    assert exports.file_name(other, ".json") == f"run-{other.id}.json"


def test_eslab_export_names_its_default_output_safely(store, tmp_path, monkeypatch):
    run = store.create_run(name="../../escaped", method="es", config={})
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    assert main(["export", str(run.id), "--format", "csv"]) == 0
    assert (work / "escaped-export" / "run.json").is_file()
    assert not (tmp_path / "escaped-export").exists()
