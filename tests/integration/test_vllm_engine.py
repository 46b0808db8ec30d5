"""The vLLM perturbation engine on the real default model (vLLM on the CPU here).

Exactness is checked bit for bit: checksums (sha256 of serving weights and fp32 master) and
direct tensor comparisons inside the worker (`es_check_*`). Every test leaves the shared
session engine with the input model's weights.
"""

from __future__ import annotations

import itertools
import json
import operator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open

from engine.backends.base import EngineMismatchError

pytestmark = pytest.mark.heavy

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
]

LOGPROB_TOLERANCE = 0.05
"""Largest accepted |mean log-prob (vLLM, bf16) - mean log-prob (transformers, fp32 compute
on the same bf16 weights)| per completion, in nats per token. Measured on the default model
(vLLM CPU, bf16): at most 0.03 for sampled and greedy 24-token completions."""

UPDATE = ([101, 102, 103, 104], [2e-3, -1e-3, 1.5e-3, -5e-4])


def greedy(engine, prompts=PROMPTS, max_tokens: int = 24) -> list[str]:
    return [
        c[0].text for c in engine.generate(prompts, n=1, temperature=0.0, max_tokens=max_tokens)
    ]


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


def hf_mean_logprobs(model, sequences: list[tuple[list[int], list[int]]]) -> list[float]:
    """Mean log-prob of each completion after its prompt, by teacher forcing in transformers."""
    out = []
    with torch.no_grad():
        for prompt, completion in sequences:
            ids = torch.tensor([prompt + completion])
            logits = model(ids).logits[0].float()
            logp = torch.log_softmax(logits, dim=-1)
            positions = torch.arange(len(prompt) - 1, len(prompt) + len(completion) - 1)
            out.append(logp[positions, torch.tensor(completion)].mean().item())
    return out


def load_hf(path: Path):
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.bfloat16, output_loading_info=True
    )
    return model.float().eval(), info


# ---- perturb and restore ---------------------------------------------------------------------


def test_the_engine_says_where_it_computes(vllm_engine):
    """The run's log says where its engines are (the "engine started" event)."""
    import socket

    import torch

    from engine.backends.pool import EnginePool
    from engine.backends.vllm.cpu.resources import cpu_model

    device = vllm_engine.info["device"]
    expected = torch.cuda.get_device_name(device) if device.startswith("cuda") else cpu_model()
    assert vllm_engine.info["device_name"] == expected != "unknown"
    host = vllm_engine.info["host"]
    assert host == socket.gethostname()
    gpus = vllm_engine.info["gpus"]  # the machine's numbering of the card, one a rank
    assert len(gpus) == (1 if device.startswith("cuda") else 0)
    where = f"GPU {gpus[0]}" if gpus else device
    assert EnginePool.wrap(vllm_engine).devices() == [f"{host}/{where} ({expected})"]


def test_perturb_restore_is_bit_exact_after_many_cycles(vllm_engine):
    engine = vllm_engine
    num_tensors = engine.info["num_tensors"]
    before = engine.checksum()
    engine.check("es_check_store_reference")
    for i in range(25):
        engine.perturb(1000 + i, 0.01 if i % 2 else -0.003)
        if i == 0:
            assert engine.checksum() != before
            assert len(engine.check("es_check_snapshot")[0]) == num_tensors  # all moved
        if i % 5 == 4:
            engine.perturb(2000 + i, 0.02)  # member after member, no restore in between
        engine.restore()
    assert engine.checksum() == before
    assert engine.check("es_check_reference") == [[]]
    assert engine.check("es_check_snapshot") == [[]]
    assert engine.check("es_check_master") == [[]]


def test_same_seed_gives_the_same_perturbation_and_generation(vllm_engine):
    engine = vllm_engine
    base = greedy(engine)
    engine.perturb(77, 0.01)
    first, first_sum = greedy(engine), engine.checksum()
    assert engine.check("es_check_fp32_copies") == [0]  # they saw the perturbation
    engine.perturb(78, 0.01)
    other = greedy(engine)
    engine.perturb(77, 0.01)
    again, again_sum = greedy(engine), engine.checksum()
    engine.restore()
    assert first_sum == again_sum
    assert first == again
    assert first != other
    assert first != base
    assert greedy(engine) == base
    assert engine.check("es_check_fp32_copies") == [0]


def test_completions_carry_the_text_vllm_would_give_them(vllm_engine):
    """ES Lab decodes the completions of a call in one batch (detokenize.py); vLLM's own
    detokenizer, on the same sampled tokens, gives the same text. A perturbed model and
    sampling make byte pieces and stop tokens likely among them (tests/unit/test_detokenize.py
    covers those cases one by one); 16 tokens, as a decode step costs the same at any batch."""
    from vllm import SamplingParams

    engine = vllm_engine
    assert engine._decode is not None  # the default model's decoder is byte-level
    prompts = [*PROMPTS, [{"role": "user", "content": "Écris trois mots en français."}]]
    engine.perturb(5, 0.02)
    try:
        ours = engine.generate(prompts, n=4, temperature=1.0, max_tokens=16, seed=3)
        requests = [
            {"prompt_token_ids": engine.prompt_token_ids(p), "cache_salt": engine._salt}
            for p in prompts
        ]
        params = SamplingParams(n=4, temperature=1.0, max_tokens=16, seed=3)
        theirs = engine.llm.generate(requests, params, use_tqdm=False)
    finally:
        engine.restore()
    pairs = [
        (c, o)
        for cs, out in zip(ours, theirs, strict=True)
        for c, o in zip(cs, out.outputs, strict=True)
    ]
    assert len(pairs) == 12
    assert [c.token_ids for c, _ in pairs] == [tuple(o.token_ids) for _, o in pairs]
    assert [c.text for c, _ in pairs] == [o.text for _, o in pairs]


def test_no_prompt_reuses_kv_blocks_cached_under_other_weights(vllm_engine, monkeypatch):
    """The prefix cache serves a prompt's blocks again while the weights stay, and never
    across a weight change (each change gives the prompts a new cache salt)."""
    engine = vllm_engine
    outputs = []
    generate = engine.llm.generate

    def spy(*args, **kwargs):
        outputs.append(generate(*args, **kwargs))
        return outputs[-1]

    monkeypatch.setattr(engine.llm, "generate", spy)
    # longer than a KV block on either build, so that the cache has a whole block to serve
    prompt = [[{"role": "user", "content": " ".join(["Tell me about the sea."] * 60)}]]

    def cached() -> int:
        engine.generate(prompt, max_tokens=1)
        return outputs[-1][0].num_cached_tokens

    engine.restore()
    cached()
    assert cached() > 0  # the same weights: the prompt's blocks are served from the cache
    engine.perturb(5, 0.01)
    assert cached() == 0
    assert cached() > 0  # the perturbed weights' own blocks are
    engine.update([5], [0.0])
    assert cached() == 0
    engine.restore()
    assert cached() == 0


def test_members_and_tensors_get_independent_noise(vllm_engine):
    engine = vllm_engine
    info = engine.check("es_check_info")[0]
    same_shape = [name for name, *_ in info if name.endswith("o_proj.weight")]
    norms = [name for name, *_ in info if name.endswith("norm.weight")]
    assert len(same_shape) == 30 and len(norms) == 61
    names = same_shape + norms
    eps = engine.check("es_check_noise", 5, names, 256)[0]
    vectors = {tuple(eps[name]) for name in names}
    assert len(vectors) == len(names)  # no two tensors share noise
    for a, b in itertools.combinations(names, 2):
        agree = sum(x == y for x, y in zip(eps[a], eps[b], strict=True)) / 256
        assert agree < 0.1  # position by position, different draws (bf16 ties aside)
    other = engine.check("es_check_noise", 6, names, 256)[0]
    assert all(other[name] != eps[name] for name in names)  # members differ
    flat = torch.tensor([v for name in names for v in eps[name]])
    assert abs(flat.mean().item()) < 0.05 and abs(flat.std().item() - 1) < 0.05

    # the perturbation is scale * eps, rounded once to bf16
    name = "model.embed_tokens.weight"
    eps_embed = torch.tensor(engine.check("es_check_noise", 5, [name], 4096)[0][name])
    engine.perturb(5, 0.01)
    values = engine.check("es_check_values", name, 4096)[0]
    engine.restore()
    snapshot, step = torch.tensor(values["snapshot"]), 0.01 * eps_embed
    expected = snapshot + step
    live = torch.tensor(values["live"])
    # one bf16 rounding of the sum (torch's bf16 kernel may round a tie or the product
    # differently from this fp32 reference: allow one step at the larger operand's scale)
    ulp = torch.finfo(torch.bfloat16).eps * torch.maximum(snapshot.abs(), step.abs())
    assert ((live - expected).abs() <= ulp).all()
    assert (live != snapshot).float().mean() > 0.9


# ---- update and saving ------------------------------------------------------------------------


def test_zero_update_keeps_weights_and_save_hf_equals_the_input(
    vllm_engine, default_model_dir, tmp_path
):
    engine = vllm_engine
    before = engine.checksum()
    engine.update([11, 12, 13], [0.0, 0.0, 0.0])
    assert engine.checksum() == before
    assert engine.check("es_check_master") == [[]]
    engine.save_hf(str(tmp_path / "hf"))
    saved = read_safetensors(tmp_path / "hf" / "model.safetensors")
    source = read_safetensors(default_model_dir / "model.safetensors")
    assert sorted(saved) == sorted(source)  # q/k/v and gate/up split back, same names
    for name, tensor in source.items():
        assert saved[name].dtype == tensor.dtype and saved[name].shape == tensor.shape, name
        assert torch.equal(bits(saved[name]), bits(tensor)), name
    for file in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "hf" / file).read_bytes() == (default_model_dir / file).read_bytes()
    assert not (tmp_path / "hf" / "eslab-manifest.json").exists()


@pytest.fixture(scope="module")
def updated_model(vllm_engine, tmp_path_factory):
    """Apply UPDATE to the session engine, save everything, and give the input model back."""
    engine = vllm_engine
    root = tmp_path_factory.mktemp("updated")
    original = engine.checksum()
    engine.save_master(str(root / "master0"))
    engine.update(*UPDATE)
    state = SimpleNamespace(
        original=original,
        checksum=engine.checksum(),
        texts=greedy(engine),
        completions=[c[0] for c in engine.generate(PROMPTS, temperature=0.0, max_tokens=24)],
        master=root / "master1",
        hf=root / "hf",
        master0=root / "master0",
    )
    state.logprobs = engine.completion_logprobs(PROMPTS, [c.token_ids for c in state.completions])
    state.prompt_ids = [engine.prompt_token_ids(m) for m in PROMPTS]
    engine.save_master(str(state.master))
    engine.save_hf(str(state.hf))
    engine.load_master(str(state.master0))
    assert engine.checksum() == original
    return state


def test_update_changes_weights_and_resume_from_master_is_exact(vllm_engine, updated_model):
    engine = vllm_engine
    assert updated_model.checksum != updated_model.original
    assert updated_model.texts != greedy(engine)
    engine.load_master(str(updated_model.master))
    try:
        assert engine.checksum() == updated_model.checksum
        assert engine.check("es_check_master") == [[]]
        assert greedy(engine) == updated_model.texts
    finally:
        engine.load_master(str(updated_model.master0))
    assert engine.checksum() == updated_model.original


def test_save_hf_loads_in_transformers(updated_model):
    model, info = load_hf(updated_model.hf)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not info["mismatched_keys"]
    saved = read_safetensors(updated_model.hf / "model.safetensors")
    layer = model.model.layers[0]
    assert torch.equal(
        layer.self_attn.k_proj.weight.bfloat16(), saved["model.layers.0.self_attn.k_proj.weight"]
    )
    assert torch.equal(
        layer.mlp.up_proj.weight.bfloat16(), saved["model.layers.0.mlp.up_proj.weight"]
    )
    sequences = [
        (p, list(c.token_ids))
        for p, c in zip(updated_model.prompt_ids, updated_model.completions, strict=True)
    ]
    hf = hf_mean_logprobs(model, sequences)
    for ours, theirs in zip(updated_model.logprobs, hf, strict=True):
        assert abs(ours - theirs) < LOGPROB_TOLERANCE


def test_completion_logprobs_match_transformers(vllm_engine, default_model_dir):
    engine = vllm_engine
    prompts = [*PROMPTS, [{"role": "user", "content": "Count from one to five."}]]
    samples = engine.generate(prompts, n=2, temperature=1.0, max_tokens=24, seed=3)
    pairs = [(p, c) for p, cs in zip(prompts, samples, strict=True) for c in cs]
    by_ids = engine.completion_logprobs([p for p, _ in pairs], [c.token_ids for _, c in pairs])
    by_text = engine.completion_logprobs([p for p, _ in pairs], [c.text for _, c in pairs])
    tokenizer = engine.tokenizer
    model, _ = load_hf(default_model_dir)
    prompt_ids = [engine.prompt_token_ids(p) for p, _ in pairs]
    hf_ids = hf_mean_logprobs(
        model, [(p, list(c.token_ids)) for p, (_, c) in zip(prompt_ids, pairs, strict=True)]
    )
    text_ids = [tokenizer(c.text, add_special_tokens=False)["input_ids"] for _, c in pairs]
    hf_text = hf_mean_logprobs(model, list(zip(prompt_ids, text_ids, strict=True)))
    diffs = [abs(a - b) for a, b in zip(by_ids + by_text, hf_ids + hf_text, strict=True)]
    print(f"max |vLLM - transformers| mean log-prob: {max(diffs):.4f} nats/token")
    assert max(diffs) < LOGPROB_TOLERANCE
    assert all(x < 0 for x in by_ids)


def test_completion_logprobs_reject_empty_completions(vllm_engine):
    with pytest.raises(ValueError, match="no tokens"):
        vllm_engine.completion_logprobs(PROMPTS[:1], [""])


# ---- two engines --------------------------------------------------------------------------------


def test_two_engines_agree_with_one_and_a_mismatch_is_caught(
    vllm_engine, vllm_engine_options, updated_model, tmp_path
):
    """A pool of two Ray-actor engines, started from the save_hf folder of the updated model
    (so this also proves vLLM loads and serves that folder)."""
    from engine.backends.pool import EnginePool

    # engines_per_gpu=2: on a one-GPU machine both engines share the card (no effect on the CPU)
    pool = EnginePool(
        str(updated_model.hf), num_engines=2, engines_per_gpu=2, **vllm_engine_options
    )
    try:
        assert [c[0].text for c in pool.generate(PROMPTS, max_tokens=24)] == updated_model.texts

        members = [(301, 0.01), (302, 0.01), (301, 0.01), (303, -0.01), (302, 0.01)]
        results = pool.evaluate(members, operator.methodcaller("generate", PROMPTS, 1, 0.0, 16))
        texts = [[c[0].text for c in r] for r in results]
        assert texts[0] == texts[2] and texts[1] == texts[4]  # same seed, any engine
        assert texts[0] != texts[1]
        assert len(set(pool.broadcast("checksum"))) == 1  # all restored to the same weights

        # one engine (the session engine, given the pool's state) and two engines agree
        pool.save_master(str(tmp_path / "pool0"))
        vllm_engine.load_master(str(tmp_path / "pool0"))
        assert vllm_engine.checksum() == pool.checksum()
        for seeds, coefficients in ([[401, 402], [1e-3, -1e-3]], [[403], [5e-4]]):
            pool.update(seeds, coefficients)  # checks that its two engines agree
            vllm_engine.update(seeds, coefficients)
            assert vllm_engine.checksum() == pool.checksum()

        pool.call_engine(1, "update", [404], [1e-3])  # a deliberately different update
        with pytest.raises(EngineMismatchError):
            pool.verify_in_sync()
    finally:
        pool.shutdown()
        vllm_engine.load_master(str(updated_model.master0))
    assert vllm_engine.checksum() == updated_model.original


def test_saved_config_is_the_source_config(updated_model, default_model_dir):
    saved = json.loads((updated_model.hf / "config.json").read_text())
    assert saved == json.loads((default_model_dir / "config.json").read_text())


# ---- LBES: the base samples' generated token ids ---------------------------------------------


def non_canonical_ids(tokenizer, text: str) -> list[int]:
    """Token ids of `text` with its first splittable token written as two tokens: ids a model
    may generate, which decode to `text` but which `text` never tokenizes back to."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    vocab = tokenizer.get_vocab()
    for i, token in enumerate(tokenizer.convert_ids_to_tokens(ids)):
        for cut in range(1, len(token)):
            if token[:cut] in vocab and token[cut:] in vocab:
                return [*ids[:i], vocab[token[:cut]], vocab[token[cut:]], *ids[i + 1 :]]
    raise AssertionError(f"no token of {text!r} splits into two tokens")


class ScriptedBasePool:
    """The real pool, whose base generation returns fixed completions: the likelihood pass
    (every member's log-likelihoods) runs on the real engine."""

    def __init__(self, pool, completions) -> None:
        self.pool, self.completions = pool, completions

    def __getattr__(self, name):
        return getattr(self.pool, name)

    def generate(self, prompts, n=1, **sampling):
        return [list(self.completions) for _ in prompts]


def test_lbes_scores_generated_token_ids_like_transformers(pool, vllm_engine, tmp_path):
    from engine.backends.base import Completion
    from engine.config import RunConfig
    from engine.data.datasets import Example, write_dataset
    from engine.paths import default_model_dir
    from engine.trainer.lbes_step import lbes_step

    tokenizer = vllm_engine.tokenizer
    text = " The capital of France is Paris."
    ids = [*non_canonical_ids(tokenizer, text), tokenizer.eos_token_id]
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer(text, add_special_tokens=False)["input_ids"] != ids[:-1]
    samples = [
        Completion(text, len(ids), True, tuple(ids)),
        Completion("", 1, True, (tokenizer.eos_token_id,)),  # the stop token alone
    ]
    examples = [Example(prompt=PROMPTS[0], reward_func_args={"target": "Paris"})]
    config = RunConfig.from_flat(
        {
            "method": "lbes",
            "train_file": str(write_dataset(examples, tmp_path / "train.parquet")),
            "output_dir": str(tmp_path / "out"),
            "reward_func_path": "engine.rewards.conciseness.compute_score",
            "population_size": 2,
            "data_batch_size": 1,
            "n": 2,
            "temperature": 1.0,
        }
    )
    # A noise_std of 1e-6 leaves the bf16 weights (nearly) as they are: each sample's reported
    # mean log-likelihood is the base model's, which transformers computes from the same ids.
    report = lbes_step(config, ScriptedBasePool(pool, samples), examples, 0, 1e-6, 0.0)
    ours = [s.logprob for s in sorted(report.samples, key=lambda s: s.sample_index)]
    model, _ = load_hf(default_model_dir())
    prompt_ids = vllm_engine.prompt_token_ids(PROMPTS[0])
    theirs = hf_mean_logprobs(model, [(prompt_ids, list(c.token_ids)) for c in samples])
    (retokenized,) = hf_mean_logprobs(
        model, [(prompt_ids, [*tokenizer(text, add_special_tokens=False)["input_ids"], ids[-1]])]
    )
    print(f"LBES mean log-probs {ours}, transformers {theirs}, text re-tokenized {retokenized}")
    assert all(s.kept for s in report.samples)
    assert abs(retokenized - theirs[0]) > 2 * LOGPROB_TOLERANCE  # the test tells them apart
    for a, b in zip(ours, theirs, strict=True):
        # The stop token alone is one unlikely token (about -20 nats), not a mean of many:
        # bf16 logits put its error near 1% of its size (0.2 nats measured).
        assert abs(a - b) < LOGPROB_TOLERANCE + 0.02 * abs(b)


def test_a_failed_start_leaves_nothing_frozen(tmp_path):
    """The engine freezes the objects that exist while vLLM starts (its gc passes then skip
    them); vLLM freezes the heap itself once started, but a start that fails must give every
    object back to the collector."""
    import gc

    from engine.backends.vllm.engine import VLLMEngine

    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    frozen_before = gc.get_freeze_count()
    gc.unfreeze()
    try:
        with pytest.raises(Exception):  # noqa: B017 - whatever vLLM raises for a bad folder
            VLLMEngine(str(tmp_path), max_model_len=256)
        assert gc.get_freeze_count() == 0
    finally:
        if frozen_before:
            gc.freeze()  # as the session's engines left it
