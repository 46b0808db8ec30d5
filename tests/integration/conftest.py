"""Fixtures of the integration tests that train on the shared session engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.backends.pool import EnginePool
from tests.outputs import allow_temporary_outputs  # noqa: F401 (an autouse fixture)


@pytest.fixture(scope="session")
def initial_master(vllm_engine, tmp_path_factory) -> Path:
    """The input model's fp32 master, saved once (514 MB) for every test to go back to."""
    initial = tmp_path_factory.mktemp("initial-master")
    vllm_engine.save_master(str(initial))
    return initial


@pytest.fixture
def pool(vllm_engine, initial_master) -> Iterator[EnginePool]:
    """The session engine as a pool; its input weights are loaded back after the test."""
    yield EnginePool.wrap(vllm_engine)
    vllm_engine.load_master(str(initial_master))
