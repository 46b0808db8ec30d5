"""tensor_parallel_size 2 against 1 on real vLLM engines: the same perturbation and update.

The default model's 9 attention heads do not split over 2 ranks, so both engines serve a
small random Llama built here with every kind of shard (shards.py): 4 query heads and 1
key-value head (copied to both ranks), biases on q/k/v, o_proj, gate/up and down, an untied
lm_head and a vocabulary that vLLM pads (49,160 rows to 49,216). On the CPU each rank of the
size-2 engine is a process of its own (vLLM's CPU tensor parallelism over gloo).

Weights are compared bit for bit after putting the size-2 engine's shards back together
(`gathered`, which also checks that copies held by both ranks are identical).

A third engine, of size 2 too, keeps its linear weights packed as on an AMX CPU
(ESLAB_CPU_PACKING=emulate: the packed layout on any CPU): it must draw the logical
perturbation of the others bit for bit, apply the same update, serve the same tokens and
agree on the checksum, so engines of a cluster agree whichever of them pack. On an AMX CPU
the other two pack with vLLM's own kernel as well.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from bench.gpu.make_models import build
from engine.backends.vllm import shards
from engine.backends.vllm.cpu import weights as cpu_weights

pytestmark = pytest.mark.heavy

SMALL_LLAMA = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "vocab_size": 49_160,
    "tie_word_embeddings": False,
    "attention_bias": True,
    "mlp_bias": True,
    "max_position_embeddings": 1024,
}
SEEDS = (11, 12, 13)
UPDATE = ([101, 102, 103], [2e-3, -1e-3, 1.5e-3])


@pytest.fixture(scope="module")
def small_model(default_model_dir: Path, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("small-llama") / "model"
    build(default_model_dir, folder, SMALL_LLAMA)
    return folder


def start(model: Path, size: int) -> object:
    from engine.backends.vllm.engine import VLLMEngine

    return VLLMEngine(
        str(model),
        tensor_parallel_size=size,
        max_model_len=256,
        max_num_seqs=4,
        seed=0,
        extra_llm_args={"kv_cache_memory_bytes": 64 << 20},
    )


@pytest.fixture(scope="module")
def engines(small_model: Path, tmp_path_factory) -> Iterator[tuple[object, object, Path]]:
    """(size 1, size 2, the input model's master saved by size 1)."""
    if torch.cuda.is_available() and torch.cuda.device_count() < 2:
        pytest.skip("tensor_parallel_size 2 on CUDA needs 2 GPUs")
    one = start(small_model, 1)
    two = None
    try:
        two = start(small_model, 2)
        initial = tmp_path_factory.mktemp("initial")
        one.save_master(str(initial))
        yield one, two, initial
    finally:
        for engine in (two, one):
            if engine is not None:
                engine.shutdown()


@pytest.fixture(scope="module")
def packed_two(small_model: Path, engines) -> Iterator[object]:
    """A size-2 engine whose linear weights are stored packed (emulated on CPUs without AMX;
    the setting reaches its worker processes, which start with the engine)."""
    if torch.cuda.is_available():
        pytest.skip("weights are packed only by the CPU backend")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(cpu_weights.PACKING_ENV, "emulate")
        engine = start(small_model, 2)
    try:
        yield engine
    finally:
        engine.shutdown()


def greedy(engine) -> list[str]:
    prompts = ["The capital of France is", "1, 2, 3,"]
    return [c[0].text for c in engine.generate(prompts, n=1, temperature=0.0, max_tokens=8)]


def gathered(engine, kind: str) -> dict[str, torch.Tensor]:
    """Every `kind` tensor (live, snapshot, master) of an engine, whole: each rank's shard put
    in its place; a block held by several ranks must be the same on each."""
    out: dict[str, torch.Tensor] = {}
    filled: dict[str, set[shards.Block]] = {}
    for held in engine.check("es_check_shards", kind):
        for name, (shape, blocks, shard_shape, dtype, raw) in held.items():
            where = shards.ShardMap(
                tuple(shape), tuple(shard_shape), tuple(shards.Block(*b) for b in blocks)
            )
            dtype = getattr(torch, dtype.removeprefix("torch."))
            shard = torch.frombuffer(bytearray(raw), dtype=dtype).view(shard_shape)
            whole = out.setdefault(name, torch.empty(shape, dtype=dtype))
            where.put(whole, shard, filled.setdefault(name, set()))
    return out


def assert_bit_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert torch.equal(bits(a[name]), bits(b[name])), name


def read(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


def test_both_ranks_hold_shards_of_the_same_tensors(engines):
    one, two, _ = engines
    assert two.info["tp_size"] == 2 and one.info["tp_size"] == 1
    assert two.info["table_len"] == one.info["table_len"]  # sized by whole tensors
    shapes = {name: tuple(s) for name, s, _, _ in two.check("es_check_info")[1]}
    assert shapes["model.layers.0.self_attn.qkv_proj.weight"] == (128, 128)  # q 64, k 32, v 32
    assert shapes["lm_head.weight"] == (24_608, 128)  # 49,216 padded rows over 2
    assert_bit_equal(gathered(two, "live"), gathered(one, "live"))


def test_size_2_draws_the_perturbation_of_size_1_bit_for_bit(engines):
    one, two, _ = engines
    base = gathered(one, "live")
    try:
        for seed in SEEDS:
            one.perturb(seed, 0.01)
            two.perturb(seed, 0.01)
            perturbed = gathered(one, "live")
            assert all(not torch.equal(perturbed[n], base[n]) for n in base)
            assert_bit_equal(gathered(two, "live"), perturbed)
    finally:
        one.restore()
        two.restore()
    assert_bit_equal(gathered(two, "live"), base)


def test_size_2_applies_the_update_of_size_1_and_resumes_across_sizes(engines, tmp_path):
    one, two, initial = engines
    try:
        one.update(*UPDATE)
        two.update(*UPDATE)
        master = gathered(one, "master")
        assert_bit_equal(gathered(two, "master"), master)
        assert_bit_equal(gathered(two, "live"), gathered(one, "live"))
        assert two.check("es_check_master") == [[], []]

        # the whole model exported from 2 ranks is the one exported from 1
        one.save_hf(str(tmp_path / "hf1"))
        two.save_hf(str(tmp_path / "hf2"))
        assert_bit_equal(read(tmp_path / "hf2"), read(tmp_path / "hf1"))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["hf1", "hf2"]  # masters removed

        # a master saved at size 1 loads at size 2, and one saved at size 2 at size 1
        one.save_master(str(tmp_path / "one"))
        two.load_master(str(initial))
        two.load_master(str(tmp_path / "one"))
        assert_bit_equal(gathered(two, "master"), master)
        two.save_master(str(tmp_path / "two"))
        assert sorted(p.name for p in (tmp_path / "two").iterdir()) == [
            "master-tp0-of-2.safetensors",
            "master-tp1-of-2.safetensors",
        ]
        expected = one.checksum()
        one.load_master(str(initial))
        one.load_master(str(tmp_path / "two"))
        assert one.checksum() == expected
    finally:
        one.load_master(str(initial))
        two.load_master(str(initial))


def test_a_packed_engine_draws_updates_and_serves_what_the_others_do(engines, packed_two, tmp_path):
    one, two, initial = engines
    assert packed_two.info["packed_tensors"] >= 8  # every linear layer of both decoder layers
    assert packed_two.checksum() == two.checksum()  # hashed in the logical layout
    try:
        for seed in SEEDS:
            for engine in (one, two, packed_two):
                engine.perturb(seed, 0.01)
            assert_bit_equal(gathered(packed_two, "live"), gathered(one, "live"))
            assert packed_two.checksum() == two.checksum()
            assert greedy(packed_two) == greedy(two)  # the packed weights are what it computes
        for engine in (one, two, packed_two):
            engine.restore()
            engine.update(*UPDATE)
        assert_bit_equal(gathered(packed_two, "master"), gathered(one, "master"))
        assert_bit_equal(gathered(packed_two, "live"), gathered(one, "live"))
        assert packed_two.checksum() == two.checksum()
        assert packed_two.check("es_check_snapshot") == [[], []]
        packed_two.save_master(str(tmp_path / "packed"))
        one.load_master(str(initial))
        one.load_master(str(tmp_path / "packed"))  # a packed engine's master loads anywhere
        assert_bit_equal(gathered(one, "master"), gathered(packed_two, "master"))
    finally:
        for engine in (one, two, packed_two):
            engine.load_master(str(initial))
