import pytest

from jobs.store.migrate import upgrade
from jobs.store.store import Store


@pytest.fixture
def db_url(tmp_path):
    return f"sqlite:///{tmp_path / 'eslab.db'}"


@pytest.fixture
def store(db_url):
    upgrade(db_url)
    store = Store(db_url)
    yield store
    store.close()
