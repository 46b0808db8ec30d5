"""Low-rank population mode (perturbation: lora) on the real multi-LoRA engine (vLLM on the
CPU, the default model).

Every test starts from the input model: the `pool` fixture saves the fp32 master of the
shared session engine first and loads it back afterwards.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine import metrics as mk
from engine.backends.pool import EnginePool
from engine.backends.vllm.hf_export import source_tensor_specs
from engine.backends.vllm.lora_slots import lora_update_spec
from engine.config import RunConfig
from engine.lowrank import factors as lora
from engine.lowrank.population import ADAPTER_DIR, FACTORS_FILE, LoraPopulation
from engine.noise import shared_noise_table
from engine.paths import PROJECT_ROOT, default_model_dir
from engine.sink import MemorySink
from engine.trainer import train

pytestmark = pytest.mark.heavy

CONCISENESS = PROJECT_ROOT / "data" / "conciseness"  # shipped with the repository
PROMPTS = [
    [{"role": "user", "content": "Name three colours."}],
    [{"role": "user", "content": "What is the capital of France?"}],
]


class CountingEngine:
    """The real engine, counting generate calls (to prove one call per population)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.generate_calls: list[int] = []

    def generate(self, prompts, *args, **kwargs):
        self.generate_calls.append(len(prompts))
        return self.engine.generate(prompts, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.engine, name)


@pytest.fixture
def counting(vllm_lora_engine, tmp_path_factory):
    initial = tmp_path_factory.mktemp("initial-master")
    vllm_lora_engine.save_master(str(initial))
    yield CountingEngine(vllm_lora_engine)
    vllm_lora_engine.load_master(str(initial))


def lora_config(tmp_path: Path, **options) -> RunConfig:
    base = {
        "method": "es",
        "perturbation": "lora",
        "model": str(default_model_dir()),
        "train_file": str(CONCISENESS / "train.parquet"),
        "output_dir": str(tmp_path / "out"),
        "reward_func_path": "engine.rewards.conciseness.compute_score",
        "population_size": 4,
        "antithetic": True,
        "data_batch_size": 2,
        "max_steps": 1,
        "max_tokens": 16,
        "noise_std": 0.02,
        "learning_rate": 3e-3,
        "seed": 7,
    }
    return RunConfig.from_flat({**base, **options})


def engine_table(engine) -> torch.Tensor:
    """This process's copy of the engine's noise table, as the trainer holds it."""
    return shared_noise_table(*engine.noise_table())


def untimed(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if not mk.depends_on_wall_clock(k)}


def test_lora_same_seed_twice_gives_identical_metrics_in_one_call_per_step(
    counting, vllm_lora_engine, tmp_path
):
    vllm_lora_engine.save_master(str(tmp_path / "input"))
    input_checksum = vllm_lora_engine.checksum()
    runs, checksums = [], []
    for attempt in ("a", "b"):
        vllm_lora_engine.load_master(str(tmp_path / "input"))
        counting.generate_calls.clear()
        sink = MemorySink()
        train(lora_config(tmp_path / attempt, max_steps=2), sink, pool=EnginePool.wrap(counting))
        runs.append([untimed(r.metrics) for r in sink.steps])
        checksums.append(vllm_lora_engine.checksum())
        # the whole population of a step (4 members x 2 prompts) in one engine call
        assert counting.generate_calls == [8, 8]
    assert len(runs[0]) == 2 and runs[0][0][mk.LORA_RANK] == 4.0
    assert runs[0] == runs[1]
    assert checksums[0] == checksums[1] != input_checksum  # the merged update moved weights


@pytest.mark.parametrize("members_written", [False, True])
def test_merged_update_adds_the_dense_low_rank_update(
    vllm_lora_engine, counting, tmp_path, default_model_dir, members_written
):
    """Worker-side merge: fused q/k/v and gate/up rows and the packed CPU layout included;
    from seeds, or (members_written) from the factors the worker drew for the members."""
    specs = source_tensor_specs(default_model_dir)
    targets = lora.find_targets(specs, ("k_proj", "up_proj", "o_proj"), (1,))
    scales = {1: 0.5}
    seeds, coefficients = [11, 12], [0.25, -0.5]
    spec = lora_update_spec(targets, 2, scales)
    if members_written:
        vllm_lora_engine.set_lora_members([(0, 11, 0.1), (1, 11, -0.1), (2, 12, 0.1)], spec)
    vllm_lora_engine.save_master(str(tmp_path / "before"))
    vllm_lora_engine.lora_update(spec, seeds, coefficients)
    vllm_lora_engine.save_master(str(tmp_path / "after"))
    assert vllm_lora_engine.check("es_check_master") == [[]]  # serving == cast(master)
    vllm_lora_engine.generate(PROMPTS, max_tokens=2)
    assert vllm_lora_engine.check("es_check_fp32_copies") == [0]  # what the forward used
    before = load_file(tmp_path / "before" / "master.safetensors")
    after = load_file(tmp_path / "after" / "master.safetensors")
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    prefix = "model.layers.1."
    assert changed == {
        prefix + "self_attn.qkv_proj.weight",
        prefix + "self_attn.o_proj.weight",
        prefix + "mlp.gate_up_proj.weight",
    }
    units = lora.unit_factors(engine_table(vllm_lora_engine), seeds, targets, 2, scales)
    weights = torch.tensor(coefficients)
    expected = {t.module: lora.low_rank_sum(*units[t.name], weights) for t in targets}
    qkv = after[prefix + "self_attn.qkv_proj.weight"] - before[prefix + "self_attn.qkv_proj.weight"]
    q, k = 576, 192  # SmolLM2-135M: 9 query heads and 3 key/value heads of 64
    torch.testing.assert_close(qkv[q : q + k], expected["k_proj"], atol=1e-6, rtol=1e-4)
    assert torch.count_nonzero(qkv[:q]) == 0 and torch.count_nonzero(qkv[q + k :]) == 0
    gate_up = after[prefix + "mlp.gate_up_proj.weight"] - before[prefix + "mlp.gate_up_proj.weight"]
    torch.testing.assert_close(gate_up[1536:], expected["up_proj"], atol=1e-6, rtol=1e-4)
    assert torch.count_nonzero(gate_up[:1536]) == 0
    o = after[prefix + "self_attn.o_proj.weight"] - before[prefix + "self_attn.o_proj.weight"]
    torch.testing.assert_close(o, expected["o_proj"], atol=1e-6, rtol=1e-4)


def lora_layer_names(worker) -> list[str]:
    """In the engine's worker: the modules vLLM wrapped for LoRA."""
    model = worker.get_model()
    return [name for name, m in model.named_modules() if type(m).__name__.endswith("WithLoRA")]


def test_only_the_perturbed_modules_carry_lora(vllm_lora_engine):
    """vLLM wraps just the target modules: the LM head's LoRA logits would run outside the
    CUDA graph on every decode step, for adapters that are zero there."""
    wrapped = vllm_lora_engine.llm.collective_rpc(lora_layer_names)[0]
    assert any(name.endswith("mlp.down_proj") for name in wrapped)
    assert not [n for n in wrapped if "logits" in n or "lm_head" in n or "embed" in n], wrapped


def test_member_slots_serve_exactly_the_members_adapter_folders(
    vllm_lora_engine, tmp_path, default_model_dir
):
    """Members written straight into vLLM's LoRA slots answer token for token as the same
    factors saved as PEFT folders and loaded by vLLM; new members in the same slots replace
    the old ones (no prefix-cache block of the old weights is served)."""
    targets = lora.find_targets(
        source_tensor_specs(default_model_dir), lora.TARGET_MODULES, (0, 1, 2, 3)
    )
    scales = dict.fromkeys(range(4), 1.0)
    spec = lora_update_spec(targets, 4, scales)
    table = engine_table(vllm_lora_engine)

    def folder(seed: int, scale: float) -> str:
        units = lora.unit_factors(table, [seed], targets, 4, scales)
        factors = {name: (a[0], scale * b[0]) for name, (a, b) in units.items()}
        return str(
            lora.write_adapter(
                tmp_path / f"{seed}-{scale}",
                factors,
                rank=4,
                alpha=4.0,
                base_model=str(default_model_dir),
                dtype=torch.bfloat16,
            )
        )

    def tokens(outputs) -> list[tuple[int, ...]]:
        return [c[0].token_ids for c in outputs]

    served = {}
    for seed in (21, 22):
        vllm_lora_engine.set_lora_members([(0, seed, 0.05), (1, seed, -0.05)], spec)
        served[seed] = tokens(
            vllm_lora_engine.generate(PROMPTS * 2, max_tokens=24, adapters=[0, 0, 1, 1])
        )
        folders = [folder(seed, 0.05)] * 2 + [folder(seed, -0.05)] * 2
        assert served[seed] == tokens(
            vllm_lora_engine.generate(PROMPTS * 2, max_tokens=24, adapters=folders)
        )
    plain = tokens(vllm_lora_engine.generate(PROMPTS, max_tokens=24))
    assert served[21] != served[22]
    assert served[21][:2] != served[21][2:]  # the antithetic partner is another model
    assert plain not in (served[21][:2], served[21][2:])


def test_member_slots_hold_the_factors_the_trained_adapter_folds_in(
    vllm_lora_engine, tmp_path, default_model_dir
):
    """Adapter mode draws a member's factors twice: the worker, into the member's slot, and
    the trainer's process, into the trained adapter (from its copy of the engine's table).
    A member at scale 1 over a zero trained adapter then serves what one update of
    coefficient 1 folds in (up to the slots' bf16)."""
    config = lora_config(tmp_path, lora_update="adapter", lora_target_layers="1")
    population = LoraPopulation(config, default_model_dir)
    try:
        vllm_lora_engine.set_lora_members([(0, 11, 1.0), (1, 12, 1.0)], population.member_spec(0))
        population.update(EnginePool.wrap(vllm_lora_engine), [11], [1.0])
    finally:
        population.close()
    assert population.trained is not None and len(population.targets) == 7
    for t in population.targets:
        trained = population.trained.delta(t.name)
        served = {}
        for slot in (0, 1):
            a, b = vllm_lora_engine.check("es_check_lora_slot", slot, t.name)[0]
            served[slot] = torch.tensor(b)[: t.out_features] @ torch.tensor(a)[:, : t.in_features]
        tolerance = 1e-2 * float(trained.abs().max())
        torch.testing.assert_close(served[0], trained, rtol=1e-2, atol=tolerance)
        assert (served[1] - trained).abs().max() > 10 * tolerance  # another seed's draw


LEARNING_NOISE_STD = 0.02
"""With lora_noise_scaling layer: 0.02 * mean |W| (about 0.145) = 0.0029 a weight entry, close
to full mode's 0.002; rank 4 and antithetic pairs."""
LEARNING_RATE = 3e-3
"""The full-mode step of the same size: lr * m / sigma = 4e-5 / 0.002 for m = 0.145."""
LEARNING_SEED = 7
"""The one run of test_lora_on_conciseness_raises_the_mean_reward. Another seed, like another
CPU's arithmetic, changes every member's completions; measured (one run each, from -120.6 at
step 0): 3 steps raised the eval reward by 71.5, 46.6, 38.4, 56.3 and 53.9 characters at seeds
1-5, by the same to the bit with ESLAB_CPU_PACKING=emulate (the packed layout, multiplied
unpacked: on an AVX2 CPU the same arithmetic) at seeds 1 and 2, and by 73.4 at this seed. The
least of them is about four times the asserted 10, so one run suffices."""


def test_lora_on_conciseness_raises_the_mean_reward(counting, tmp_path):
    """A short lora-mode run raises the eval reward by more than 10 characters, as full mode
    does: every measured trajectory (other seeds, which change the completions as another
    CPU's arithmetic does) clears that by far (LEARNING_SEED). The population of a step is
    generated in one engine call."""
    config = lora_config(
        tmp_path,
        population_size=8,
        data_batch_size=8,
        max_steps=3,
        max_tokens=32,  # as the es-conciseness preset: the targets are short answers
        noise_std=LEARNING_NOISE_STD,
        learning_rate=LEARNING_RATE,
        seed=LEARNING_SEED,
        eval_file=str(CONCISENESS / "test.parquet"),
        eval_strategy="steps",
        eval_steps=3,
    )
    sink = MemorySink()
    train(config, sink, pool=EnginePool.wrap(counting))
    evals = dict(sink.series(mk.reward_key(mk.EVAL)))
    print(f"lora eval reward (minus characters off the target): {evals}")
    assert set(evals) == {0, 3}
    assert evals[3] > evals[0] + 10, evals  # at least 10 characters closer on average
    assert counting.generate_calls.count(64) == 3  # 8 members x 8 prompts, once per step


def test_trained_adapter_loads_in_peft_and_in_vllm(
    counting, vllm_lora_engine, tmp_path, default_model_dir
):
    import peft
    from transformers import AutoModelForCausalLM

    checksum = vllm_lora_engine.checksum()
    config = lora_config(
        tmp_path, lora_update="adapter", max_steps=2, learning_rate=0.05, lora_target_layers="0-15"
    )
    output = train(config, MemorySink(), pool=EnginePool.wrap(counting))
    assert vllm_lora_engine.checksum() == checksum  # adapter mode leaves the base untouched
    adapter = output / ADAPTER_DIR
    factors = load_file(adapter / FACTORS_FILE)

    # transformers + PEFT: the merged adapter adds exactly the trained delta B A
    base = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32)
    name = "model.layers.3.mlp.down_proj"
    original = base.get_submodule(name).weight.detach().clone()
    merged = peft.PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    delta = merged.get_submodule(name).weight.detach() - original
    expected = factors[f"{name}.B"] @ factors[f"{name}.A"]
    assert expected.abs().max() > 0
    torch.testing.assert_close(delta, expected, atol=1e-6, rtol=1e-3)

    # vLLM serves it (LoRARequest on the same engine); the base model answers differently
    served = vllm_lora_engine.generate(PROMPTS, max_tokens=24, adapters=[str(adapter)] * 2)
    plain = vllm_lora_engine.generate(PROMPTS, max_tokens=24)
    assert all(c[0].num_tokens > 0 for c in served)
    assert [c[0].text for c in served] != [c[0].text for c in plain]
