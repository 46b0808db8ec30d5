"""The file that hands a database password to Ray jobs: in the data folder, in a folder of
this user alone, never written through a link or into a file someone else prepared."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from jobs.ray_jobs import SubmitError
from jobs.scheduler import _database_env
from jobs.store.database import database_url

URL = "postgresql+psycopg://eslab:s3cret@db.example:5432/eslab"


@pytest.fixture
def data(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("ESLAB_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def private_file(data: Path) -> Path:
    path = Path(_database_env(make_url(URL))["ESLAB_DATABASE_URL_FILE"])
    assert path.parent == data / "private"
    return path


def test_the_password_file_is_in_a_folder_of_this_user_alone(data, monkeypatch):
    path = private_file(data)
    folder = os.lstat(data / "private")
    assert stat.S_ISDIR(folder.st_mode) and stat.S_IMODE(folder.st_mode) == 0o700
    assert folder.st_uid == os.geteuid()
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    assert os.listdir(data / "private") == [path.name]  # no temporary file left behind
    monkeypatch.setenv("ESLAB_DATABASE_URL", "")
    monkeypatch.setenv("ESLAB_DATABASE_URL_FILE", str(path))
    assert database_url() == URL
    assert private_file(data) == path  # written again in place


def test_a_link_planted_at_the_file_name_is_replaced_not_followed(data):
    victim = data.parent / "victim"
    victim.write_text("untouched")
    path = private_file(data)
    path.unlink()
    path.symlink_to(victim)
    assert private_file(data) == path
    assert victim.read_text() == "untouched"
    assert not path.is_symlink() and path.read_text() == URL


def test_a_private_folder_that_is_a_link_is_refused(data):
    elsewhere = data.parent / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    data.mkdir()
    (data / "private").symlink_to(elsewhere)
    with pytest.raises(SubmitError, match=r"private must be a folder, not a link"):
        private_file(data)
    assert os.listdir(elsewhere) == []


def test_a_private_folder_open_to_others_is_refused(data):
    (data / "private").mkdir(parents=True)
    (data / "private").chmod(0o755)
    with pytest.raises(SubmitError, match=r"open to other users \(mode 755\).*chmod 700"):
        private_file(data)
    assert os.listdir(data / "private") == []


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_private_folder_of_another_user_is_refused(data):
    (data / "private").mkdir(parents=True, mode=0o700)
    os.chown(data / "private", 65534, 65534)
    with pytest.raises(SubmitError, match=r"belongs to user id 65534, not to this user"):
        private_file(data)
    assert os.listdir(data / "private") == []
