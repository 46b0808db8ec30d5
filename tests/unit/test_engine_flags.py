"""lbes's engine flags `load_format` and `max_num_batched_tokens`: the run's pool hands them
to vLLM as they are, and the vLLM installed here takes them (its own engine configuration is
built from them, without starting an engine)."""

from __future__ import annotations

import pytest

from engine.backends.pool import EnginePool
from engine.config import ConfigError, RunConfig
from engine.config.schema import LOAD_FORMATS
from engine.sink import MemorySink
from engine.trainer import preflight

BASE = {
    "train_file": "data/conciseness/train.parquet",
    "output_dir": "data/runs/flags",
    "reward_func_path": "engine.rewards.conciseness.compute_score",
}


def test_defaults_pass_nothing_and_set_flags_pass_through(monkeypatch):
    assert RunConfig.from_flat(BASE).model.vllm_flags() == {}
    config = RunConfig.from_flat(
        {**BASE, "load_format": "safetensors", "max_num_batched_tokens": 2048}
    )
    assert config.model.vllm_flags() == {
        "load_format": "safetensors",
        "max_num_batched_tokens": 2048,
    }
    seen = {}

    def recording_pool(*args, **kwargs):
        seen.update(kwargs)
        return EnginePool.wrap(object())

    monkeypatch.setattr(preflight, "EnginePool", recording_pool)
    monkeypatch.setattr(preflight, "model_folder", lambda config: "model")
    preflight.start_pool(config, MemorySink())
    assert seen["extra_llm_args"] == config.model.vllm_flags()


def test_bad_values_name_the_field():
    with pytest.raises(ConfigError, match=r"model\.load_format must be one of auto, safetensors"):
        RunConfig.from_flat({**BASE, "load_format": "tensorizer"})
    with pytest.raises(ConfigError, match=r"model\.max_num_batched_tokens"):
        RunConfig.from_flat({**BASE, "max_num_batched_tokens": 0})


def test_vllm_takes_every_offered_flag(default_model_dir):
    from vllm import EngineArgs
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader

    for load_format in LOAD_FORMATS:
        get_model_loader(LoadConfig(load_format=load_format))  # raises for an unknown format
    flags = RunConfig.from_flat(
        {**BASE, "load_format": "safetensors", "max_num_batched_tokens": 4096}
    ).model.vllm_flags()
    built = EngineArgs(model=str(default_model_dir), **flags).create_engine_config()
    assert built.load_config.load_format == "safetensors"
    assert built.scheduler_config.max_num_batched_tokens == 4096
