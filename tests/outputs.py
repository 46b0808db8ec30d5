"""Run outputs of tests go under pytest's temporary folder, outside the data folder, where
validation refuses them unless ESLAB_OUTPUT_ROOTS lists it: the conftest of each test folder
that builds runs imports this fixture."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def allow_temporary_outputs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """ESLAB_OUTPUT_ROOTS = pytest's temporary folder, for the session: set before the session's
    Ray head starts, so its jobs (the workers) inherit it too."""
    patch = pytest.MonkeyPatch()
    patch.setenv("ESLAB_OUTPUT_ROOTS", str(tmp_path_factory.getbasetemp()))
    yield
    patch.undo()
