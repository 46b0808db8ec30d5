"""The fp32 linear layers of CPUs without bf16 matmul hardware (cpu/linear_bf16.c) in a real
engine, on whatever CPU runs the suite: ESLAB_CPU_NO_BF16=1 takes an AMX or AVX-512 BF16 CPU
for one without, so CI exercises the path of AVX2 machines wherever it runs (the kernel's own
arithmetic is held to the logical product in tests/unit/test_cpu_weights.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.backends.vllm.cpu import features as cpu_features
from engine.backends.vllm.cpu import weights as cpu_weights

pytestmark = pytest.mark.heavy

PROMPTS = [
    "The capital of France is",
    "Write one word that rhymes with cat:",
    "1, 2, 3, 4,",
    "Name a colour of the sky at noon.",
]


def test_an_engine_without_bf16_hardware_answers_alone_as_in_a_batch(
    default_model_dir: Path, monkeypatch
):
    if torch.cuda.is_available():
        pytest.skip("the CPU's linear layers only")
    from engine.backends.vllm.engine import VLLMEngine

    monkeypatch.setenv(cpu_features.NO_BF16_ENV, "1")
    engine = VLLMEngine(
        str(default_model_dir),
        max_model_len=256,
        max_num_seqs=len(PROMPTS),
        seed=0,
        extra_llm_args={"kv_cache_memory_bytes": 128 << 20},
    )
    try:
        assert engine.info["packed_tensors"] == 0  # no AMX packing on this path

        def greedy(prompts: list[str]) -> list[str]:
            out = engine.generate(prompts, n=1, temperature=0.0, max_tokens=6)
            return [c[0].text for c in out]

        together = greedy(PROMPTS)
        assert all(together)
        assert [greedy([p])[0] for p in PROMPTS[:2]] == together[:2]
        # the kernel computed them where it builds, else F.linear on fp32 copies (the engine
        # core runs in this process, so its copies are counted here)
        kernel_here = cpu_weights._bf16_linear_kernel() is not None
        assert (cpu_weights.fp32_weights().bytes == 0) == kernel_here
    finally:
        engine.shutdown()
