"""Run outputs of tests go under pytest's temporary folder, outside the data folder, where
validation refuses them unless ESLAB_OUTPUT_ROOTS lists it: the conftest of each test folder
that builds runs imports this fixture (the project, where tests name placeholder datasets, is
an input root from tests/conftest.py on). Tests of the confinement itself set or unset both
settings."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine.paths import OUTPUT_ROOTS_SETTING


@pytest.fixture(scope="session", autouse=True)
def allow_temporary_outputs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """ESLAB_OUTPUT_ROOTS = pytest's temporary folder (an input root too), for the session:
    set before the session's Ray head starts (the scheduler hands it to its jobs
    explicitly)."""
    patch = pytest.MonkeyPatch()
    patch.setenv(OUTPUT_ROOTS_SETTING, str(tmp_path_factory.getbasetemp()))
    yield
    patch.undo()
