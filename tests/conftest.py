"""Fixtures shared by every test folder, and how a session shares the machine.

A real vLLM engine costs about 10-30 s to start and a few GiB of memory, so the heavy tests
share one per session (`vllm_engine`). Tests that change its weights must give them back
(restore, or save_master before and load_master after), so every test sees the input model.

`make test` runs the suite on pytest-xdist workers, one per core (`--dist loadfile`: a file's
tests run in one worker, with its module fixtures). Each worker is then a session of its own,
so the settings below keep several of them within the machine: the cores are divided among
the workers, and every engine a session starts gets a small KV cache.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.backends.vllm.cpu.resources import KV_CACHE_SETTING
from engine.paths import INPUT_ROOTS_SETTING, PROJECT_ROOT
from engine.rewards import REWARD_MODULES_SETTING

# The tests name reward functions of their own modules (tests.jobs.standin.reward, ...), which
# only the operator's setting allows. Set here, before any test runs, so that the CLI
# subprocesses, the scheduler's Ray jobs and foreground runs of the session all see it.
os.environ[REWARD_MODULES_SETTING] = "tests"

# Many tests name placeholder datasets relative to the project (`train_file: t.parquet`), some
# in configurations built while their module is collected, before any fixture runs: the project
# is an input root (ESLAB_INPUT_ROOTS) for the whole session, its subprocesses and Ray jobs.
os.environ[INPUT_ROOTS_SETTING] = str(PROJECT_ROOT)

TEST_KV_CACHE_GIB = 0.25
"""The KV cache of every engine a session starts (in this process, in `eslab` commands and in
Ray jobs; ESLAB_CPU_KV_CACHE_GIB): 10,000 tokens of the default model, where a test decodes a
few hundred. The default 2 GiB, or vLLM's share of RAM (3.7 GiB at 0.2 of this machine's 24
GB), would not let two workers' engines fit in its memory."""
os.environ.setdefault(KV_CACHE_SETTING, str(TEST_KV_CACHE_GIB))


def _divide_the_cores_among_workers() -> None:
    """OMP_NUM_THREADS = this worker's share of the cores, for its engines and its torch alike:
    two OpenMP teams of all the cores spin against each other and each runs several times
    slower (docs/benchmarks.md, "Two runs at once on the same cores"). An OMP_NUM_THREADS set
    outside is left alone, as the engines leave it."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    if workers > 1:
        share = max(1, len(os.sched_getaffinity(0)) // workers)
        os.environ.setdefault("OMP_NUM_THREADS", str(share))


_divide_the_cores_among_workers()


def _a_home_of_its_own() -> None:
    """An empty HOME for the session, as a fresh service account has: what the tests and the
    processes they start (`eslab`, Ray, its jobs) keep in a home, Ray's token above all, stays
    out of the user's, and a token that the user's home holds cannot hide a path that has to
    make one. The caches stay the user's (XDG_CACHE_HOME: the model, vLLM's and ES Lab's
    compiled kernels), so that nothing is built twice."""
    os.environ.setdefault("XDG_CACHE_HOME", str(Path.home() / ".cache"))
    home = tempfile.mkdtemp(prefix="eslab-test-home-")
    os.environ["HOME"] = home
    atexit.register(shutil.rmtree, home, ignore_errors=True)


_a_home_of_its_own()


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The default model folder (SmolLM2-135M-Instruct, bf16 Hugging Face layout)."""
    from engine.paths import default_model_dir as model_dir

    path = model_dir()
    if not (path / "config.json").is_file():
        pytest.fail(f"the default model is missing at {path}: run `eslab model fetch-default`")
    return path


@pytest.fixture(scope="session")
def vllm_engine_options() -> dict[str, object]:
    """VLLMEngine keyword arguments for test engines (small KV cache, short context). The KV
    cache is also given in bytes here: on the CPU the engine takes the same size from
    ESLAB_CPU_KV_CACHE_GIB, but on a GPU it would otherwise take 0.9 of the card, and the
    session's second engine would not fit."""
    return {
        "max_model_len": 1024,
        "max_num_seqs": 16,
        "seed": 0,
        "extra_llm_args": {"kv_cache_memory_bytes": int(TEST_KV_CACHE_GIB * 2**30)},
    }


@pytest.fixture(scope="session")
def vllm_engine(default_model_dir: Path, vllm_engine_options: dict) -> Iterator[object]:
    """One VLLMEngine on the default model for the whole session."""
    from engine.backends.vllm.engine import VLLMEngine

    engine = VLLMEngine(str(default_model_dir), **vllm_engine_options)
    yield engine
    engine.shutdown()


LORA_TEST_MAX_LORAS = 8
"""Adapters the multi-LoRA test engine serves at once: a test population of 8 in one batch."""


LORA_TEST_KV_BYTES = 1 << 30
"""1 GiB of KV cache: about 45k tokens of the default model, 64 sequences x 700 tokens."""


def _slot_engine(model_dir: Path, options: dict, slot_args: dict) -> object:
    """A multi-LoRA VLLMEngine for a population of LORA_TEST_MAX_LORAS members in adapter
    slots: 8 members x 8 prompts decode together. The KV cache is sized in bytes: vLLM on the
    CPU takes a RAM share minus this process's resident memory, which other session engines
    (in this same process) had already grown past the share in a full run."""
    from engine.backends.vllm.engine import VLLMEngine

    extra = {**slot_args, "kv_cache_memory_bytes": LORA_TEST_KV_BYTES}
    return VLLMEngine(str(model_dir), **{**options, "max_num_seqs": 64, "extra_llm_args": extra})


@pytest.fixture(scope="session")
def vllm_lora_engine(default_model_dir: Path, vllm_engine_options: dict) -> Iterator[object]:
    """One multi-LoRA VLLMEngine (perturbation: lora) on the default model for the session;
    max_lora_rank 8 serves members of rank <= 8 (rank <= 4 in lora_update adapter mode)."""
    from engine.backends.vllm.lora_slots import lora_llm_args
    from engine.config.schema import LoraConfig
    from engine.lowrank.factors import parse_modules

    targets = parse_modules(LoraConfig().lora_target_modules)  # every test's are among these
    args = lora_llm_args(LORA_TEST_MAX_LORAS, 8, targets)
    engine = _slot_engine(default_model_dir, vllm_engine_options, args)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def vllm_noise_engine(default_model_dir: Path, vllm_engine_options: dict) -> Iterator[object]:
    """One VLLMEngine of full-rank members in LoRA slots (perturbation: full_batched) on the
    default model for the session, on every linear module."""
    from engine.backends.vllm.member_noise import noise_llm_args
    from engine.lowrank.factors import TARGET_MODULES

    args = noise_llm_args(LORA_TEST_MAX_LORAS, TARGET_MODULES)
    engine = _slot_engine(default_model_dir, vllm_engine_options, args)
    yield engine
    engine.shutdown()


LAST_ENGINE_MODULE = "tests/integration/test_tensor_parallel.py"
"""Runs after every other heavy test of its session: shutting down its engines (an engine core
in this process) tears down vLLM's process-wide parallel groups, which the session's shared
engines then miss ("pipeline model parallel group is not initialized"); keeping them for the
whole session instead left too little memory for the two-engine test."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with heavy tests first, the tensor-parallel one last of them, then the quick ones.
    Workers take files in this order (`--no-loadscope-reorder`): the minutes-long ones start
    at once and the quick ones fill in at the end, and no heavy test follows the tensor-parallel
    file in a worker."""
    heavy_files = {item.path for item in items if item.get_closest_marker("heavy")}

    def rank(item: pytest.Item) -> int:
        if item.nodeid.startswith(LAST_ENGINE_MODULE):
            return 1
        return 0 if item.path in heavy_files else 2

    items.sort(key=rank)  # stable: the order within each rank is kept
