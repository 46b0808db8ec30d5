"""Threads and KV cache of CPU engines, chosen from the machine (cpu/resources.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.backends.vllm.cpu import resources

SMOLLM2_135M = {
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "hidden_size": 576,
    "max_position_embeddings": 8192,
}


def test_an_engine_gets_one_thread_per_usable_core_unless_told_otherwise() -> None:
    assert resources.thread_env([0, 1, 2], environ={}) == {"OMP_NUM_THREADS": "3"}
    assert resources.thread_env([0, 1], environ={"ESLAB_CPU_THREADS": "1"}) == {
        "OMP_NUM_THREADS": "1"
    }
    # an operator's OMP_NUM_THREADS is theirs: left alone
    assert resources.thread_env([0, 1], environ={"OMP_NUM_THREADS": "7"}) == {}


def test_runs_that_share_the_cores_divide_them() -> None:
    sharing = {"ESLAB_CPU_RUNS_SHARING": "2"}
    assert resources.thread_env([0, 1, 2, 3], environ=sharing) == {"OMP_NUM_THREADS": "2"}
    assert resources.thread_env([0, 1, 2], environ=sharing) == {"OMP_NUM_THREADS": "1"}
    # more runs than cores: still one thread each
    assert resources.thread_env([0], environ={"ESLAB_CPU_RUNS_SHARING": "4"}) == {
        "OMP_NUM_THREADS": "1"
    }
    # an explicit thread count wins over the share
    assert resources.thread_env([0, 1], environ={**sharing, "ESLAB_CPU_THREADS": "2"}) == {
        "OMP_NUM_THREADS": "2"
    }


@pytest.mark.parametrize("setting", ["ESLAB_CPU_THREADS", "ESLAB_CPU_RUNS_SHARING"])
@pytest.mark.parametrize("bad", ["0", "-2", "two", "1.5"])
def test_a_bad_thread_count_names_the_setting(setting: str, bad: str) -> None:
    with pytest.raises(ValueError, match=setting):
        resources.thread_env([0, 1], environ={setting: bad})


def test_kv_bytes_per_token_counts_the_key_value_heads_of_every_layer() -> None:
    # 30 layers x (K and V) x 3 kv heads x 64 dims x 2 bytes
    assert resources.kv_bytes_per_token(SMOLLM2_135M, "bfloat16") == 30 * 2 * 3 * 64 * 2
    assert resources.kv_bytes_per_token(SMOLLM2_135M, "float32") == 30 * 2 * 3 * 64 * 4
    no_head_dim = {k: v for k, v in SMOLLM2_135M.items() if k != "head_dim"}
    assert resources.kv_bytes_per_token(no_head_dim, "bfloat16") == 30 * 2 * 3 * 64 * 2


def test_the_kv_cache_is_a_fixed_size_raised_to_one_full_length_sequence(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2_135M))
    assert resources.kv_cache_bytes(tmp_path, "bfloat16", 1024, environ={}) == 2 * 2**30
    assert resources.kv_cache_bytes(
        tmp_path, "bfloat16", None, {"ESLAB_CPU_KV_CACHE_GIB": "0.5"}
    ) == (2**29)
    big = {**SMOLLM2_135M, "num_hidden_layers": 3000}  # 2.3 MB a token
    need = int(8192 * resources.kv_bytes_per_token(big, "bfloat16") * 1.1)
    (tmp_path / "config.json").write_text(json.dumps(big))
    assert resources.kv_cache_bytes(tmp_path, "bfloat16", None, environ={}) == need
    # a hub id (no local folder): the setting as it is
    assert resources.kv_cache_bytes("org/model", "bfloat16", None, environ={}) == 2 * 2**30


@pytest.mark.parametrize("bad", ["0", "-1", "lots", "nan", "inf"])
def test_a_bad_kv_cache_size_names_the_setting(bad: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ESLAB_CPU_KV_CACHE_GIB"):
        resources.kv_cache_bytes(tmp_path, "bfloat16", None, {"ESLAB_CPU_KV_CACHE_GIB": bad})
