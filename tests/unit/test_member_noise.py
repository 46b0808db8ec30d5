"""`perturbation: full_batched`'s pieces without an engine: the noise products of a layer
(the CUDA kernel and the torch path, engine/backends/vllm/member_noise.py) against float64,
and the configuration's rules. The engine itself: tests/integration/test_member_noise.py."""

from __future__ import annotations

import pytest

from engine.config import ConfigError, RunConfig
from tests.unit.fresh_process import checked_in_fresh_process

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

ON_GPU = torch.cuda.is_available()


def test_each_token_gets_its_members_noise_product_and_no_other():
    """Compiled on a GPU (bf16); on a CPU in Triton's interpreter (fp32), in a fresh process
    (the interpreter must be on before Triton is imported). Decode-like passes (5 tokens a
    slot, 16-token blocks) and prefill-like ones (70, 64-token blocks), tokens shuffled over
    6 slots, tokens without a member and a slot of scale 0 among them, and an output wider
    than the layer (vLLM pads some): both ways match float64, and what they must not touch
    keeps its bits. Then the hook as vLLM's compiled model calls it."""
    got = checked_in_fresh_process(["tests/unit/member_noise_checks.py"], interpret=not ON_GPU)
    tolerance = 2e-2 if ON_GPU else 1e-5
    for phase in ("decode", "prefill"):
        for way in ("kernel", "torch"):
            assert got[f"{phase}_{way}_error"] < tolerance, (phase, way, got)
            assert got[f"{phase}_{way}_untouched_changed"] == 0.0
            assert got[f"{phase}_{way}_padding_changed"] == 0.0
    assert (got["decode_block_m"], got["prefill_block_m"]) == (16.0, 64.0)
    # antithetic pairs side by side: one tile set reads their block for both
    for case in ("both", "alone", "shifted"):
        assert got[f"pairs_{case}_error"] < tolerance, (case, got)
        assert got[f"pairs_{case}_untouched_changed"] == 0.0
        assert got[f"pairs_{case}_tiles_as_expected"] == 1.0, case
    # vLLM's compiled model traces the routed hook whole (torch.compile fullgraph): the
    # punica wrapper's configuration and token mapping, the registered op, the kernel
    assert got["traced_error"] < tolerance
    assert got["other_lora_calls"] == 1.0  # an engine of other LoRA keeps its own path


SM90_TYPES = {
    "staged": "*bf16", "y": "*bf16", "words": "*i64", "floats": "*fp32", "token_slots": "*i32",
    "sorted_tokens": "*i32", "tokens_per_lora": "*i32", "token_start": "*i32",
    "lora_ids": "*i32",
}  # fmt: skip
"""member_noise_kernel's pointer arguments (the rest are i32 or constexpr)."""
ALIGNED_16 = {*SM90_TYPES, "N", "K", "staged_stride", "y_stride"}
"""The arguments a launch on a model's layers passes divisible by 16, on which Triton's
launcher specializes."""


def test_the_kernels_loop_streams_both_of_its_loads_on_an_h100():
    """Compiled for sm_90 here (no GPU needed): the noise tile and the input tile of every K
    step are asynchronous copies, which Triton issues stages ahead of the products. An
    unaligned load is not one of them: the inputs read shifted in the loop were a plain load
    that every K step waited on."""
    triton = pytest.importorskip("triton")
    from triton.backends import backends
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if "nvidia" not in backends:
        pytest.skip("this Triton has no NVIDIA back end")

    from engine.backends.vllm.cuda import member_noise as cuda_noise

    kernel = cuda_noise.member_noise_kernel
    tiles = {"BLOCK_M": 16, "BLOCK_N": cuda_noise.BLOCK_N, "BLOCK_K": cuda_noise.BLOCK_K}
    signature = {name: SM90_TYPES.get(name, "i32") for name in kernel.arg_names}
    source = ASTSource(
        fn=kernel,
        signature={**signature, **dict.fromkeys([*tiles, "GROUPS"], "constexpr")},
        constexprs={**tiles, "GROUPS": 64},
        attrs={(i,): [["tt.divisibility", 16]] for i, n in enumerate(signature) if n in ALIGNED_16},
    )
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_stages": 3})
    code = compiled.asm["ttgir"].splitlines()
    noise = f"tensor<{tiles['BLOCK_N']}x{tiles['BLOCK_K']}x!tt.ptr<bf16>"
    inputs = f"tensor<{tiles['BLOCK_K']}x{tiles['BLOCK_M']}x!tt.ptr<bf16>"
    for tile in (noise, inputs):
        assert any("async_copy_global_to_local" in line and tile in line for line in code), tile
        assert not any("tt.load" in line and tile in line for line in code), tile


def test_a_header_round_trips_through_a_slot_buffer():
    from engine.backends.vllm.member_noise import HEADER, header_views

    buffers = torch.zeros(3, 1, 1, 12, dtype=torch.bfloat16)
    words, floats = header_views(buffers)
    words[1, :2] = torch.tensor([2**40 + 5, 123])
    floats[1, 4] = -0.015625
    assert words.shape == (3, 3) and HEADER == 3
    assert int(words[1, 0]) == 2**40 + 5 and float(floats[1, 4]) == -0.015625
    assert bool((buffers[0] == 0).all()) and bool((buffers[2] == 0).all())
    with pytest.raises(ValueError, match="cannot hold a member header"):
        header_views(torch.zeros(3, 1, 1, 4, dtype=torch.bfloat16))


def test_the_engine_arguments_mark_a_member_noise_engine():
    from engine.backends.vllm.member_noise import (
        MEMBER_NOISE_TARGET,
        noise_llm_args,
        serves_member_noise,
    )

    args = noise_llm_args(32, ("q_proj", "k_proj"))
    assert args["max_loras"] == args["max_cpu_loras"] == 32 and args["max_lora_rank"] == 1
    assert args["lora_target_modules"] == ["q_proj", "k_proj", MEMBER_NOISE_TARGET]

    class Config:
        target_modules = args["lora_target_modules"]

    class Wrapper:
        lora_config = Config()

    assert serves_member_noise(Wrapper())
    Config.target_modules = ["q_proj"]
    assert not serves_member_noise(Wrapper()) and not serves_member_noise(object())


def batched(**options) -> dict:
    return {
        "method": "es",
        "perturbation": "full_batched",
        "model": "org/model",
        "train_file": "t.parquet",
        "output_dir": "data/runs/batched",
        "reward_func_path": "engine.rewards.conciseness.compute_score",
        **options,
    }


def test_full_batched_runs_es_and_lbes_and_lora_es_alone():
    assert RunConfig.from_flat(batched(method="lbes")).method == "lbes"
    with pytest.raises(ConfigError, match="'lora' needs method es"):
        RunConfig.from_flat(batched(method="lbes", perturbation="lora"))


def test_full_batched_takes_the_target_options_and_refuses_the_low_rank_ones():
    config = RunConfig.from_flat(batched(lora_target_modules="q_proj,k_proj,v_proj"))
    assert config.lora.perturbation == "full_batched"
    with pytest.raises(ConfigError) as refused:
        RunConfig.from_flat(batched(lora_rank=8))
    assert "lora_rank" in str(refused.value) and "only applies to perturbation 'lora'" in str(
        refused.value
    )
    with pytest.raises(ConfigError) as refused:
        RunConfig.from_flat({**batched(lora_target_layers="0-1"), "perturbation": "full"})
    assert "only applies to perturbation 'lora' or 'full_batched'" in str(refused.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tensor_parallel_size": 2}, "needs tensor_parallel_size 1"),
        ({"lora_target_layers": "3-1"}, "runs backwards"),
    ],
)
def test_full_batched_refuses_what_it_cannot_run(options, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig.from_flat(batched(**options))
