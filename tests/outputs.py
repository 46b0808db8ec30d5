"""Run outputs of tests go under pytest's temporary folder, outside the data folder, where
validation refuses them unless ESLAB_OUTPUT_ROOTS lists it; and many tests' configurations
name placeholder datasets relative to the project (`train_file: t.parquet`), which
validation refuses unless ESLAB_INPUT_ROOTS lists the project: the conftest of each test
folder that builds runs imports this fixture. Tests of the confinement itself set or unset
both settings."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine.paths import INPUT_ROOTS_SETTING, OUTPUT_ROOTS_SETTING, PROJECT_ROOT


@pytest.fixture(scope="session", autouse=True)
def allow_temporary_outputs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """ESLAB_OUTPUT_ROOTS = pytest's temporary folder (an input root too) and
    ESLAB_INPUT_ROOTS = the project, for the session: set before the session's Ray head
    starts (the scheduler hands both to its jobs explicitly)."""
    patch = pytest.MonkeyPatch()
    patch.setenv(OUTPUT_ROOTS_SETTING, str(tmp_path_factory.getbasetemp()))
    patch.setenv(INPUT_ROOTS_SETTING, str(PROJECT_ROOT))
    yield
    patch.undo()
