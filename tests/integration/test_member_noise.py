"""Full-rank members served from LoRA slots (perturbation: full_batched) on the real engine
(vLLM on the CPU, the default model): each member's tokens get its noise product in every
targeted layer, the update changes only the targeted weights, and a run repeats itself.

Every test starts from the input model: `counting` saves the fp32 master of the shared
session engine first and loads it back afterwards.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine import metrics as mk
from engine.backends.pool import EnginePool
from engine.backends.vllm.hf_export import source_tensor_specs
from engine.backends.vllm.member_noise import noise_spec
from engine.config import RunConfig
from engine.lowrank.factors import TARGET_MODULES, find_targets
from engine.noise import noise_offsets, shared_noise_table
from engine.paths import default_model_dir
from engine.sink import MemorySink
from engine.trainer import train
from tests.integration.test_lora import CountingEngine, lora_config, untimed

pytestmark = pytest.mark.heavy

PROMPT = [{"role": "user", "content": "Name three colours."}]
LINEAR = ("qkv_proj.weight", "o_proj.weight", "gate_up_proj.weight", "down_proj.weight")


@pytest.fixture
def counting(vllm_noise_engine, tmp_path_factory):
    initial = tmp_path_factory.mktemp("initial-master")
    vllm_noise_engine.save_master(str(initial))
    yield CountingEngine(vllm_noise_engine)
    vllm_noise_engine.load_master(str(initial))


def spec_of(model_dir: Path, modules=TARGET_MODULES, layers=None) -> dict:
    targets = find_targets(source_tensor_specs(model_dir), modules, layers)
    return noise_spec([[t.name, t.layer, t.module, t.in_features, t.out_features] for t in targets])


def test_members_in_slots_score_as_their_perturbed_weights(counting, vllm_noise_engine):
    """A member's log-likelihood of a fixed completion, served from its slot, is the one of
    the engine's own weights perturbed by the same seed and scale on the same tensors (up to
    the bf16 rounding of perturbed weights, which the slot way skips), far from the base
    model's; a prompt without a member and a member of scale 0 in the same call score alike,
    bit for bit, as the base model (bit for bit on the CPU; a GPU's products may depend on
    the batch's size)."""
    engine = vllm_noise_engine
    completion = engine.generate([PROMPT], max_tokens=12)[0][0].token_ids
    base = engine.completion_logprobs([PROMPT], [completion])[0]
    members = [(0, 111, 0.02), (1, 111, -0.02), (2, 222, 0.02), (3, 333, 0.0)]
    engine.set_lora_members(members, spec_of(default_model_dir()))
    served = engine.completion_logprobs([PROMPT] * 5, [completion] * 5, adapters=[0, 1, 2, 3, None])
    assert served[3] == served[4]
    assert abs(served[4] - base) < 1e-3
    names = [n for n, *_ in engine.check("es_check_info")[0] if n.endswith(LINEAR)]
    assert len(names) == 4 * 30  # every linear weight of the 30 decoder layers
    for slot, seed, scale in members[:3]:
        engine.check("es_check_perturb_tensors", seed, scale, names)
        reference = engine.completion_logprobs([PROMPT], [completion])[0]
        engine.restore()
        moved = abs(reference - base)
        assert moved > 0.1, (slot, reference, base)
        assert abs(served[slot] - reference) < 0.25 * moved, (slot, served[slot], reference)


def test_the_update_changes_only_the_perturbed_weights(counting, vllm_noise_engine, tmp_path):
    """Layers 1 and 2's attention projections: their weights move by sum_i c_i eps_i (the
    members' own noise blocks), every other tensor (the other layers, the MLPs, norms and
    the embedding) keeps its bits."""
    engine = vllm_noise_engine
    spec = spec_of(default_model_dir(), ("q_proj", "k_proj", "v_proj", "o_proj"), (1, 2))
    seeds, coefficients = [31, 32, 31], [0.25, -0.5, 0.125]
    engine.save_master(str(tmp_path / "before"))
    engine.lora_update(spec, seeds, coefficients)
    engine.save_master(str(tmp_path / "after"))
    assert engine.check("es_check_master") == [[]]  # serving == cast(master)
    before = load_file(tmp_path / "before" / "master.safetensors")
    after = load_file(tmp_path / "after" / "master.safetensors")
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    expected_names = {
        f"model.layers.{layer}.self_attn.{module}.weight"
        for layer in (1, 2)
        for module in ("qkv_proj", "o_proj")
    }
    assert changed == expected_names
    info = engine.check("es_check_info")[0]
    tensors = [(name, math.prod(shape)) for name, shape, *_ in info]
    table = shared_noise_table(*engine.noise_table()).float()
    for name in expected_names:
        i = [n for n, _ in tensors].index(name)
        delta = torch.zeros(before[name].numel())
        for seed, c in zip(seeds, coefficients, strict=True):
            offset = noise_offsets(seed, tensors, table.numel())[i]
            delta += c * table[offset : offset + delta.numel()]
        torch.testing.assert_close(
            after[name] - before[name], delta.view_as(before[name]), atol=1e-6, rtol=1e-4
        )


def test_a_fused_layer_named_in_part_is_refused(vllm_noise_engine):
    with pytest.raises(Exception, match=r"lora_target_modules: .*qkv_proj.* name all of them"):
        vllm_noise_engine.set_lora_members(
            [(0, 5, 0.01)], spec_of(default_model_dir(), ("q_proj", "k_proj"))
        )


def batched_config(tmp_path: Path, **options) -> RunConfig:
    """test_lora's run (4 antithetic members, 2 prompts, conciseness) in full_batched, two
    short steps without evaluation."""
    return lora_config(
        tmp_path,
        **{
            "perturbation": "full_batched",
            "max_steps": 2,
            "max_tokens": 8,
            "noise_std": 0.01,
            "learning_rate": 1e-3,
            "eval_strategy": "no",
            **options,
        },
    )


def test_a_full_batched_run_takes_one_call_a_step_and_repeats_itself(
    counting, vllm_noise_engine, tmp_path
):
    """Two runs of the same seed: the whole population of a step (4 members x 2 prompts) in
    one engine call, the same metrics and the same weights after, which moved; the members
    generated different completions (their noise reached the text). Each antithetic pair
    sits in neighbouring slots, where the CUDA kernel reads its noise block once for both."""
    vllm_noise_engine.save_master(str(tmp_path / "input"))
    input_checksum = vllm_noise_engine.checksum()
    runs, checksums = [], []
    for attempt in ("a", "b"):
        vllm_noise_engine.load_master(str(tmp_path / "input"))
        counting.generate_calls.clear()
        sink = MemorySink()
        train(batched_config(tmp_path / attempt), sink, pool=EnginePool.wrap(counting))
        runs.append([untimed(r.metrics) for r in sink.steps])
        checksums.append(vllm_noise_engine.checksum())
        assert counting.generate_calls == [8, 8]
        assert mk.LORA_RANK not in sink.steps[0].metrics
        assert sink.steps[0].metrics[mk.time_key("update")] > 0
        rewards = [row.fitness for row in sink.steps[0].population]
        assert len(set(rewards)) > 1, rewards
    assert runs[0] == runs[1]
    assert checksums[0] == checksums[1] != input_checksum
    slots = vllm_noise_engine.check("es_check_member_slots", [0, 1, 2, 3])[0]
    assert slots[1] == slots[0] + 1 and slots[3] == slots[2] + 1, slots


class ScoringCounter(CountingEngine):
    """The real engine, counting the rows of every log-likelihood call too."""

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.scoring_calls: list[int] = []

    def completion_logprobs(self, prompts, *args, **kwargs):
        self.scoring_calls.append(len(prompts))
        return self.engine.completion_logprobs(prompts, *args, **kwargs)


def test_an_lbes_run_scores_the_whole_population_in_one_call(counting, tmp_path):
    """LBES over members in slots: the base model samples, and every member's log-likelihood
    of the kept samples comes from one call of members x kept rows; the members' fitness
    (the correlation of rewards and log-likelihoods over all kept samples) differ, and the
    update moves the weights."""
    engine = ScoringCounter(counting.engine)
    before = engine.checksum()
    config = batched_config(
        tmp_path,
        method="lbes",
        n=4,
        temperature=1.0,
        top_k_rewards=1,
        bottom_k_rewards=1,
        flat_corrcoef=True,
        max_steps=1,
        antithetic=False,
    )
    sink = MemorySink()
    train(config, sink, pool=EnginePool.wrap(engine))
    (report,) = sink.steps
    kept = [s for s in report.samples if s.kept]
    assert len(kept) == 2 * 2
    assert engine.scoring_calls == [4 * len(kept)]
    fitness = [p.fitness for p in report.population]
    assert all(f is not None and -1 <= f <= 1 for f in fitness) and len(set(fitness)) > 1
    assert engine.checksum() != before
