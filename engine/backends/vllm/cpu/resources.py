"""Threads and KV cache memory of an engine on vLLM's CPU backend, chosen from the machine.

Threads. vLLM CPU serves on one torch thread unless OMP_NUM_THREADS is set outside it ("Reducing
Torch threads from N to 1 for serving"), and an in-process engine runs with
VLLM_CPU_OMP_THREADS_BIND=nobind (see engine.py). So each engine is given OMP_NUM_THREADS = the
cores it may use: all the cores of this process's affinity for a single engine, its own core
set in a pool of several (pool.py). Where several runs may share the machine's cores
(`ESLAB_CPU_RUNS_SHARING`, which the scheduler sets to its max_concurrent_runs), a run's engine
takes its share of them: two engines of two OpenMP threads each on two cores spin against each
other, and each stepped twice as slow as with one thread each (docs/benchmarks.md).
`ESLAB_CPU_THREADS` overrides the count, and an OMP_NUM_THREADS that the operator set is left
alone.

KV cache. vLLM CPU's default is a share of all RAM (`gpu_memory_utilization` 0.3 here: about
6 GiB on a 24 GB machine) allocated at start, whatever the run needs; a run of the default
model decodes at most a few dozen sequences of a few hundred tokens (64 x 1,024 tokens is 1.4
GiB). A fixed size (`ESLAB_CPU_KV_CACHE_GIB`, default 2 GiB) keeps two engines and a test
session within the memory of a small machine; it is raised to hold at least one sequence of
the model's full context, which vLLM requires. Setting `gpu_memory_utilization` in a run
restores vLLM's share-of-RAM sizing.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

THREADS_SETTING = "ESLAB_CPU_THREADS"
RUNS_SHARING_SETTING = "ESLAB_CPU_RUNS_SHARING"
KV_CACHE_SETTING = "ESLAB_CPU_KV_CACHE_GIB"
DEFAULT_KV_CACHE_GIB = 2.0

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "auto": 2}


def thread_env(cores: Sequence[int], environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The OpenMP settings for an engine that may run on `cores`: {} where the operator set
    OMP_NUM_THREADS, else OMP_NUM_THREADS = ESLAB_CPU_THREADS or the engine's share of the
    cores."""
    if "OMP_NUM_THREADS" in environ:
        return {}
    return {"OMP_NUM_THREADS": str(threads_for(len(cores), environ))}


def threads_for(cores: int, environ: Mapping[str, str] = os.environ) -> int:
    """ESLAB_CPU_THREADS where set, else `cores` divided among the ESLAB_CPU_RUNS_SHARING runs
    that may use them at once (at least 1 thread). A setting that is not a whole number from
    1 is a ValueError naming it."""
    threads = _whole_number(environ, THREADS_SETTING)
    if threads is not None:
        return threads
    runs = _whole_number(environ, RUNS_SHARING_SETTING) or 1
    return max(1, cores // runs)


def _whole_number(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{name} must be a positive whole number, got {raw!r}")
    return int(raw)


def kv_cache_bytes(
    model_dir: str | Path,
    dtype: str,
    max_model_len: int | None,
    environ: Mapping[str, str] = os.environ,
) -> int:
    """KV cache size for a CPU engine: ESLAB_CPU_KV_CACHE_GIB (default 2 GiB), raised to one
    full-length sequence of this model (`max_model_len`, else the model's own context) plus
    a tenth, so vLLM always has room for the longest request it accepts."""
    raw = environ.get(KV_CACHE_SETTING, "").strip()
    try:
        gib = float(raw) if raw else DEFAULT_KV_CACHE_GIB
    except ValueError:
        raise ValueError(f"{KV_CACHE_SETTING} must be a number of GiB, got {raw!r}") from None
    if not (gib > 0 and math.isfinite(gib)):
        raise ValueError(f"{KV_CACHE_SETTING} must be a finite number of GiB above 0, got {raw!r}")
    wanted = int(gib * 2**30)
    config = model_config(model_dir)
    if config is None:
        return wanted
    length = max_model_len or context_length(config)
    one_sequence = int(length * kv_bytes_per_token(config, dtype) * 1.1)
    return max(wanted, one_sequence)


def context_length(config: Mapping[str, Any]) -> int:
    """The model's own context length from its Hugging Face config (0 where it names none)."""
    text = config.get("text_config") or config
    return int(text.get("max_position_embeddings") or 0)


def kv_bytes_per_token(config: Mapping[str, Any], dtype: str) -> int:
    """Bytes of keys and values a token takes in every layer of a decoder with this Hugging
    Face config (grouped-query attention counted by its key/value heads)."""
    text = config.get("text_config") or config
    heads = int(text.get("num_attention_heads") or 1)
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or int(text.get("hidden_size") or 0) // heads)
    layers = int(text.get("num_hidden_layers") or 0)
    return 2 * layers * kv_heads * head_dim * DTYPE_BYTES.get(dtype, 2)


def model_config(model_dir: str | Path) -> dict[str, Any] | None:
    """The folder's config.json, or None where the model is not a readable local folder
    (a hub id vLLM resolves itself)."""
    try:
        return json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None


def cpu_model() -> str:
    """The processor's model name, as /proc/cpuinfo gives it ("unknown" where it does not)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        return "unknown"
