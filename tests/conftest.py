"""Fixtures shared by every test folder.

A real vLLM engine costs about 30 s to start and a few GiB of memory, so the heavy tests share
one per session (`vllm_engine`). Tests that change its weights must give them back (restore,
or save_master before and load_master after), so every test sees the input model.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.rewards import REWARD_MODULES_SETTING

# The tests name reward functions of their own modules (tests.jobs.standin.reward, ...), which
# only the operator's setting allows. Set here, before any test runs, so that the CLI
# subprocesses, the scheduler's Ray jobs and foreground runs of the session all see it.
os.environ[REWARD_MODULES_SETTING] = "tests"

TEST_KV_CACHE_FRACTION = 0.2
"""`gpu_memory_utilization` of test engines: on the CPU, the share of RAM for vLLM (weights
included, about 1 GiB of it for the KV cache) — other test sessions share this machine."""


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
    """VLLMEngine keyword arguments for test engines (small KV cache, short context)."""
    return {
        "max_model_len": 1024,
        "max_num_seqs": 16,
        "gpu_memory_utilization": TEST_KV_CACHE_FRACTION,
        "seed": 0,
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


@pytest.fixture(scope="session")
def vllm_lora_engine(default_model_dir: Path, vllm_engine_options: dict) -> Iterator[object]:
    """One multi-LoRA VLLMEngine (perturbation: lora) on the default model for the session;
    max_lora_rank 8 serves members of rank <= 8 (rank <= 4 in lora_update adapter mode)."""
    from engine.backends.vllm.engine import VLLMEngine
    from engine.backends.vllm.lora_slots import lora_llm_args

    # 8 members x 8 prompts decode together. The KV cache is sized in bytes: vLLM on the CPU
    # takes a RAM share minus this process's resident memory, which other session engines
    # (in this same process) had already grown past the share in a full run.
    options = {**vllm_engine_options, "max_num_seqs": 64}
    extra = {**lora_llm_args(LORA_TEST_MAX_LORAS, 8), "kv_cache_memory_bytes": LORA_TEST_KV_BYTES}
    engine = VLLMEngine(str(default_model_dir), **options, extra_llm_args=extra)
    yield engine
    engine.shutdown()


LAST_MODULE = "tests/integration/test_tensor_parallel.py"
"""Runs after every other test: shutting down its engines (an engine core in this process)
tears down vLLM's process-wide parallel groups, which the session's shared engines then miss
("pipeline model parallel group is not initialized"); keeping them for the whole session
instead left too little memory for the two-engine test."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.nodeid.startswith(LAST_MODULE))  # stable: order kept
