"""A migrated temporary SQLite database seeded through the Store with two runs (metrics,
population rows, samples), shared by the AppTest and browser tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import streamlit as st

from app import auth
from engine import metrics as mk
from engine.config import RunConfig
from engine.data.datasets import write_dataset
from engine.sink import PopulationRecord, SampleRecord, StepReport
from jobs.store.migrate import upgrade
from jobs.store.status import RunStatus
from jobs.store.store import Store
from tests.model_folders import placeholder_model
from tests.outputs import allow_temporary_outputs  # noqa: F401 (an autouse fixture)

REWARD = "engine.rewards.conciseness.compute_score"
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # a hub name: queueing does not check it


def write_task(folder: Path) -> Path:
    return write_dataset(
        [
            {
                "prompt": [{"role": "user", "content": f"say {i}"}],
                "reward_func_args": {"target": "ok"},
            }
            for i in range(4)
        ],
        folder / "task" / "train.parquet",
    )


@pytest.fixture
def dataset(tmp_path) -> Path:
    return write_task(tmp_path)


@pytest.fixture
def data_folder(tmp_path, monkeypatch, dataset) -> Path:
    """ESLAB_DATA_DIR = `tmp_path`, holding the `dataset` fixture (task/train.parquet) and a
    model folder, models/tiny, with the files queueing checks (config.json with a
    model_type, weights, tokenizer) but no real weights: the New run form offers both."""
    placeholder_model(tmp_path / "models" / "tiny")
    monkeypatch.setenv("ESLAB_DATA_DIR", str(tmp_path))
    return tmp_path


def make_config(dataset: Path, output_dir: Path, **options) -> RunConfig:
    return RunConfig.from_flat(
        {
            "method": "es",
            "model": MODEL,
            "train_file": str(dataset),
            "output_dir": str(output_dir),
            "reward_func_path": REWARD,
            "max_steps": 5,
            "population_size": 4,
            **options,
        }
    )


@pytest.fixture
def seeded_url(tmp_path, dataset) -> str:
    return seed(tmp_path, dataset)


def seed(tmp_path: Path, dataset: Path) -> str:
    """A migrated database in `tmp_path` with alpha-run (es) and beta-run (lbes), both
    running at step 2 of 5; returns its URL."""
    url = f"sqlite:///{tmp_path / 'eslab.db'}"
    upgrade(url)
    store = Store(url)
    try:
        for name, method, noise in (("alpha-run", "es", 1e-3), ("beta-run", "lbes", 2e-3)):
            config = make_config(dataset, tmp_path / name, method=method, noise_std=noise)
            run = store.create_run(
                name=name,
                method=method,
                config=config.to_flat(),
                total_steps=5,
                tags=["smoke"],
                status=RunStatus.RUNNING,
            )
            for step in range(3):
                store.record_step(
                    run.id,
                    StepReport(
                        step=step,
                        metrics={
                            mk.reward_key(mk.TRAIN): 0.1 * step,
                            mk.reward_key(mk.EVAL): 0.2 * step,
                            mk.NOISE_STD: noise,
                            mk.LEARNING_RATE: 5e-7,
                            mk.time_key("generation"): 1.0,
                        },
                        population=[
                            PopulationRecord(
                                member=m, seed=m, fitness=0.1 * m + step, shaped_fitness=0.0
                            )
                            for m in range(4)
                        ],
                        samples=[
                            SampleRecord(
                                split=split,
                                prompt_index=0,
                                sample_index=0,
                                prompt="What is 2+2?",
                                completion=f"{name} says 4",
                                reward=0.5,
                                kept=True,
                            )
                            for split in ("train", "eval")
                        ],
                        wall_time=1000.0 + step,
                    ),
                )
    finally:
        store.close()
    return url


@pytest.fixture
def store(seeded_url, monkeypatch) -> Iterator[Store]:
    """The seeded database, the one the pages open (ESLAB_DATABASE_URL). Streamlit's caches
    are cleared on both sides of the test: a cached store or query of another test would
    show that test's database."""
    monkeypatch.setenv("ESLAB_DATABASE_URL", seeded_url)
    clear_streamlit_caches()
    store = Store(seeded_url)
    yield store
    store.close()
    clear_streamlit_caches()


@pytest.fixture
def editor_and_viewer(tmp_path, monkeypatch) -> Path:
    """An auth file (ESLAB_AUTH_FILE) with the editor `ed` and the viewer `vi`, whose
    passwords are `editor-pass` and `viewer-pass`."""
    path = tmp_path / "users.yaml"
    auth.add_user(path, "ed", "editor", "editor-pass")
    auth.add_user(path, "vi", "viewer", "viewer-pass")
    monkeypatch.setenv(auth.ENV, str(path))
    return path


def clear_streamlit_caches() -> None:
    st.cache_resource.clear()
    st.cache_data.clear()


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    """Debian's Chromium under Playwright, one per test module (skips without them)."""
    from tests.app.browser import CHROMIUM, CHROMIUM_ARGS, WAIT_MS, playwright_or_skip

    api = playwright_or_skip()
    api.expect.set_options(timeout=WAIT_MS)
    with api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def browser(chromium) -> Iterator[object]:
    """The module's Chromium, whose pages wait WAIT_MS for anything (a click, a navigation,
    an expectation); the pages and contexts a test opens are closed when it ends."""
    from tests.app.browser import PatientBrowser

    patient = PatientBrowser(chromium)
    yield patient
    patient.close_opened()
