"""engines auto: the plan the scheduler places a run by, each engine's memory, the number of
engines a card holds with and without CUDA MPS, and the CPU path left as it was. The card's
probe is faked here (a GPU's memory and MPS are what is tested against); the arrangement on
a real H200 is bench/gpu's."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest

from engine.backends import arrangement as arr
from engine.backends.arrangement import (
    ENGINE_OVERHEAD_BYTES,
    GIB,
    MPS_COMMAND,
    Arrangement,
    Card,
    EngineMemory,
    arrange,
    choose,
    engine_memory,
    plan,
    run_engine_memory,
    weight_counts,
)
from engine.config import RunConfig
from engine.noise import MIN_TABLE_LEN

BASE = {
    "train_file": "train.parquet",
    "output_dir": "data/runs/out",
    "reward_func_path": "engine.rewards.countdown.compute_score",
}
H200 = 143_771 * 2**20  # what nvidia-smi reports for an H200's memory (MiB)


def make(**options: object) -> RunConfig:
    return RunConfig.from_flat({**BASE, **options})


def model_folder(tmp_path: Path, shapes: dict[str, list[int]], **config: object) -> Path:
    """A model folder whose safetensors file holds only its header (the estimate reads no
    tensor) and a Llama config.json."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 2 * math.prod(shape)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    llama = {
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "hidden_size": 576,
        "head_dim": 64,
        "max_position_embeddings": 8192,
        **config,
    }
    (tmp_path / "config.json").write_text(json.dumps(llama))
    return tmp_path


# ---------------------------------------------------------------- the plan (scheduler)


def test_explicit_numbers_occupy_what_they_did_before_auto():
    """The demand and the job's GPUs of explicit settings, as run_demand and job_gpus gave
    them before auto existed."""
    cases = [  # (config, demand on GPUs, job's GPUs)
        ({"num_engines": 1}, {"GPU": 1.0}, 1.0),
        ({"num_engines": 1, "tensor_parallel_size": 2}, {"GPU": 2.0}, 2.0),
        ({"num_engines": 2}, {"GPU": 2.0}, 0.0),
        ({"num_engines": 4, "engines_per_gpu": 4}, {"GPU": 1.0}, 0.0),
        ({"num_engines": 8, "engines_per_gpu": 4}, {"GPU": 2.0}, 0.0),
        ({"num_engines": 1, "engines_per_gpu": 4}, {"GPU": 1.0}, 1.0),
        ({"num_engines": 2, "engines_per_gpu": 2, "tensor_parallel_size": 2}, {"GPU": 2.0}, 0.0),
        ({}, {"GPU": 1.0}, 1.0),  # a configuration stored before auto: one engine
    ]
    for config, demand, job in cases:
        planned = plan(config, gpus=True)
        assert (planned.demand, planned.job_gpus) == (demand, job), config
    assert plan({"num_engines": 4, "engines_per_gpu": 4}, gpus=False).demand == {"CPU": 4.0}


def test_auto_occupies_one_card_and_leaves_the_number_to_the_job():
    planned = plan({"num_engines": "auto", "engines_per_gpu": "auto"}, gpus=True)
    assert (planned.num_engines, planned.in_actors) == (None, True)
    assert (planned.demand, planned.job_gpus) == ({"GPU": 1.0}, 0.0)


def test_auto_with_a_number_on_the_other_side_is_fixed_before_the_start():
    # one card's worth of the engines a GPU given
    four = plan({"num_engines": "auto", "engines_per_gpu": 4}, gpus=True)
    assert (four.num_engines, four.engines_per_gpu, four.demand) == (4, 4, {"GPU": 1.0})
    # a number of engines: one a GPU, as before auto
    spread = plan({"num_engines": 4, "engines_per_gpu": "auto"}, gpus=True)
    assert (spread.num_engines, spread.engines_per_gpu, spread.demand) == (4, 1, {"GPU": 4.0})
    # an engine of two GPUs gets them to itself and computes inside its job
    auto = {"num_engines": "auto", "engines_per_gpu": "auto"}
    ranks = plan({**auto, "tensor_parallel_size": 2}, gpus=True)
    assert (ranks.num_engines, ranks.in_actors, ranks.demand, ranks.job_gpus) == (
        1,
        False,
        {"GPU": 2.0},
        2.0,
    )
    # so does an engine of a population in adapter slots, whose one batched call evaluates
    # the whole population
    for perturbation in ("lora", "full_batched"):
        lora = plan({**auto, "perturbation": perturbation}, gpus=True)
        assert (lora.num_engines, lora.in_actors, lora.job_gpus) == (1, False, 1.0)
    # engines a GPU given still count
    shared = plan({**auto, "engines_per_gpu": 2, "tensor_parallel_size": 2}, gpus=True)
    assert (shared.num_engines, shared.demand) == (2, {"GPU": 2.0})


def test_auto_on_a_cpu_cluster_is_one_engine_in_its_job():
    planned = plan({"num_engines": "auto", "engines_per_gpu": "auto"}, gpus=False)
    assert (planned.num_engines, planned.in_actors) == (1, False)
    assert (planned.demand, planned.job_gpus) == ({"CPU": 1.0}, 0.0)


# ---------------------------------------------------------------- memory of one engine


def smollm_shapes() -> dict[str, list[int]]:
    """SmolLM2-135M's tensors (tied embeddings): 134,515,008 parameters."""
    shapes = {"model.embed_tokens.weight": [49152, 576], "model.norm.weight": [576]}
    for i in range(30):
        for name, shape in {
            "q_proj": [576, 576],
            "k_proj": [192, 576],
            "v_proj": [192, 576],
            "o_proj": [576, 576],
            "gate_proj": [1536, 576],
            "up_proj": [1536, 576],
            "down_proj": [576, 1536],
            "input_layernorm": [576],
            "post_attention_layernorm": [576],
        }.items():
            shapes[f"model.layers.{i}.{name}.weight"] = shape
    return shapes


def test_weight_counts_read_the_safetensors_headers(tmp_path):
    folder = model_folder(tmp_path, smollm_shapes())
    assert weight_counts(folder) == (134_515_008, 49152 * 576)
    assert weight_counts(tmp_path / "nowhere") is None


def test_an_engine_holds_weights_training_state_kv_cache_and_overhead(tmp_path):
    folder = model_folder(tmp_path, smollm_shapes())
    memory = run_engine_memory(make(), folder)
    parameters = 134_515_008
    assert memory.weights == 2 * parameters
    # fp32 master + bf16 snapshot + the bf16 noise table (its 64M-entry minimum here)
    assert memory.training_state == 6 * parameters + 2 * MIN_TABLE_LEN
    # 64 prompts x 1 completion in flight, each 2048 tokens + 512 of prompt; 23,040 bytes a
    # token (2 x 30 layers x 3 key/value heads x 64 x 2 bytes)
    assert memory.kv_cache == 64 * 2560 * 23_040
    assert memory.total == memory.weights + memory.training_state + memory.kv_cache + (
        ENGINE_OVERHEAD_BYTES
    )
    # at least one sequence of the whole context, and max_num_seqs caps the sequences
    short = run_engine_memory(make(data_batch_size=1, max_tokens=16), folder)
    assert short.kv_cache == 8192 * 23_040
    few = run_engine_memory(make(max_num_seqs=8, max_model_len=1024), folder)
    assert few.kv_cache == 8 * 1024 * 23_040
    # a member's sequences are its prompts times n
    lbes = run_engine_memory(make(method="lbes", data_batch_size=4, max_tokens=16), folder)
    assert lbes.kv_cache == 4 * 8 * (16 + 512) * 23_040  # lbes samples n = 8 a prompt
    wide = engine_memory(
        folder,
        dtype="float32",
        max_model_len=None,
        max_num_seqs=None,
        sequences=300,
        max_tokens=100,
    )
    assert wide.weights == 4 * parameters and wide.kv_cache == 256 * 612 * 46_080


def test_a_folder_without_safetensors_is_not_sized(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert run_engine_memory(make(), tmp_path) is None


# ---------------------------------------------------------------- engines a card holds


SMALL = EngineMemory(weights=GIB // 4, training_state=GIB, kv_cache=4 * GIB)  # 7.25 GiB
LARGE = EngineMemory(weights=2 * GIB, training_state=6 * GIB, kv_cache=20 * GIB)  # 30 GiB


def test_under_mps_the_card_holds_as_many_engines_as_its_memory_allows_at_most_8():
    card = Card("NVIDIA H200", H200, mps=True)
    small = choose(card, SMALL, population=32, in_actors=True)
    assert (small.num_engines, small.engines_per_gpu, small.in_actors, small.one_node) == (
        8,
        8,
        True,
        True,
    )
    large = choose(card, LARGE, population=32, in_actors=True)
    assert large.num_engines == int(H200 * 0.9) // LARGE.total == 4
    for chosen, memory in ((small, SMALL), (large, LARGE)):
        share = int(H200 * 0.9) // chosen.num_engines
        # vLLM is given the slice less the training state it never sees, and a KV cache of
        # what the slice leaves after weights and overhead
        assert chosen.gpu_memory_utilization * H200 <= share - memory.training_state
        assert chosen.kv_cache_memory_bytes == (
            share - memory.training_state - memory.weights - memory.overhead
        )
        assert chosen.kv_cache_memory_bytes >= memory.kv_cache
        assert chosen.num_engines * share <= H200 * 0.9
        assert chosen.engine_args() == {"kv_cache_memory_bytes": chosen.kv_cache_memory_bytes}
        assert "under CUDA MPS" in chosen.notes[0] and "start at once" in chosen.notes[0]


def test_the_population_and_a_set_memory_share_bound_the_engines():
    card = Card("NVIDIA H200", H200, mps=True)
    assert choose(card, SMALL, population=3, in_actors=True).num_engines == 3
    half = choose(card, LARGE, population=32, in_actors=True, card_share=0.45)
    assert half.num_engines == int(H200 * 0.45) // LARGE.total == 2


def test_without_mps_one_engine_and_a_note_of_what_mps_would_allow():
    chosen = choose(Card("NVIDIA H200", H200, mps=False), LARGE, population=32, in_actors=True)
    assert (chosen.num_engines, chosen.in_actors, chosen.kv_cache_memory_bytes) == (1, True, None)
    assert chosen.gpu_memory_utilization is None  # the configuration's, as for one engine
    (note,) = chosen.notes
    assert "CUDA MPS does not run" in note and "4 engines" in note and MPS_COMMAND in note


def test_a_card_that_holds_one_engine_runs_one():
    chosen = choose(Card("small card", 40 * GIB, mps=True), LARGE, population=32, in_actors=False)
    assert (chosen.num_engines, chosen.in_actors, chosen.engine_args()) == (1, False, {})
    assert "room for one" in chosen.notes[0]


def test_without_a_kv_cache_size_in_vllm_the_engines_start_one_after_another():
    chosen = choose(
        Card("NVIDIA H200", H200, mps=True),
        SMALL,
        population=32,
        in_actors=True,
        sized_kv_cache=False,
    )
    assert chosen.num_engines == 8 and chosen.kv_cache_memory_bytes is None
    assert chosen.engine_args() == {} and "one after another" in chosen.notes[0]


def test_an_unsized_model_gets_one_engine():
    unsized = choose(Card("NVIDIA H200", H200, mps=True), None, population=32, in_actors=True)
    assert unsized.num_engines == 1 and "safetensors" in unsized.notes[0]


# ---------------------------------------------------------------- in the run's process


def no_probe(*args: object) -> Card:
    raise AssertionError("the card was probed")


def test_on_a_cpu_only_machine_auto_is_one_engine_in_process_without_a_probe(monkeypatch):
    monkeypatch.setattr(arr, "_cuda_platform", lambda: False)
    monkeypatch.setattr(arr, "probe_card", no_probe)
    assert arrange(make(), "unused") == Arrangement(1, 1, False)


def test_explicit_numbers_are_started_as_given_without_a_probe(monkeypatch):
    monkeypatch.setattr(arr, "_cuda_platform", lambda: True)
    monkeypatch.setattr(arr, "probe_card", no_probe)
    assert arrange(make(num_engines=4, engines_per_gpu=4), "unused") == Arrangement(4, 4, True)
    assert arrange(make(num_engines=1), "unused") == Arrangement(1, 1, False)
    assert arrange(make(num_engines=2), "unused") == Arrangement(2, 1, True)
    # auto's LoRA engine, like one of several GPUs, is one engine inside its job
    assert arrange(make(perturbation="lora"), "unused") == Arrangement(1, 1, False)
    assert arrange(make(tensor_parallel_size=2), "unused") == Arrangement(1, 1, False)


@pytest.mark.parametrize(("ray_job", "mps", "engines"), [(True, True, 8), (False, False, 1)])
def test_auto_on_a_gpu_asks_the_probe(tmp_path, monkeypatch, ray_job, mps, engines):
    folder = model_folder(tmp_path, smollm_shapes())
    monkeypatch.setattr(arr, "_cuda_platform", lambda: True)
    monkeypatch.setattr(arr, "vllm_takes_kv_cache_size", lambda: True)
    asked = []
    monkeypatch.setattr(
        arr, "probe_card", lambda in_job: asked.append(in_job) or Card("NVIDIA H200", H200, mps)
    )
    if ray_job:
        monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    else:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    chosen = arrange(make(), folder)
    assert asked == [ray_job]
    # in a Ray job (which holds no GPU) even one engine is an actor; in the foreground it
    # runs in this process as before
    assert (chosen.num_engines, chosen.in_actors) == (engines, ray_job)
    assert chosen.notes and chosen.notes[0].startswith("engines auto:")


def test_the_run_starts_the_arrangement_and_records_what_auto_chose(monkeypatch):
    from engine.backends.pool import EnginePool
    from engine.sink import MemorySink
    from engine.trainer import preflight

    chosen = Arrangement(
        8,
        8,
        True,
        one_node=True,
        gpu_memory_utilization=0.1,
        kv_cache_memory_bytes=GIB,
        notes=("engines auto: 8 engines share NVIDIA H200",),
    )
    seen: dict = {}
    monkeypatch.setattr(preflight, "arrange", lambda config, folder: chosen)
    monkeypatch.setattr(preflight, "model_folder", lambda config: "model")
    monkeypatch.setattr(
        preflight, "EnginePool", lambda *a, **kw: seen.update(kw) or EnginePool.wrap(object())
    )
    sink = MemorySink()
    preflight.start_pool(make(), sink)
    assert (seen["num_engines"], seen["engines_per_gpu"], seen["in_actors"]) == (8, 8, True)
    assert (seen["one_node"], seen["gpu_memory_utilization"]) == (True, 0.1)
    assert seen["extra_llm_args"]["kv_cache_memory_bytes"] == GIB
    assert ("info", chosen.notes[0]) in sink.events


def test_on_the_cpu_a_run_starts_one_engine_in_process_as_before(monkeypatch):
    """The CPU build of vLLM installed here: auto asks no probe and records nothing."""
    from engine.backends.pool import EnginePool
    from engine.sink import MemorySink
    from engine.trainer import preflight

    monkeypatch.setattr(arr, "probe_card", no_probe)
    monkeypatch.setattr(preflight, "model_folder", lambda config: "model")
    seen: dict = {}
    monkeypatch.setattr(
        preflight, "EnginePool", lambda *a, **kw: seen.update(kw) or EnginePool.wrap(object())
    )
    sink = MemorySink()
    preflight.start_pool(make(), sink)
    assert (seen["num_engines"], seen["in_actors"], seen["one_node"]) == (1, False, False)
    assert seen["gpu_memory_utilization"] is None
    assert "kv_cache_memory_bytes" not in seen["extra_llm_args"] and sink.events == []
