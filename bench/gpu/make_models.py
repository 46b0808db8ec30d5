"""Random-weight models of real shapes for the GPU benchmarks (run on the device).

    python3 bench/gpu/make_models.py TOKENIZER_DIR OUT_DIR [NAME ...]

Throughput benchmarks want every member to do the same work, which a random model does (it
generates until max_tokens almost always); the real default model stops early and unevenly.
So the GPU machine builds, with transformers, from TOKENIZER_DIR (the default model's folder:
its config.json, tokenizer and chat template):
- OUT_DIR/smollm2-135m-random: SmolLM2-135M's config (30 layers, 576 wide, tied embeddings);
- OUT_DIR/llama-1b-random: a Llama of 1.07B parameters (16 layers, 2048 wide, 32 query and
  8 key-value heads, MLP 8192, the same tokenizer) — the size of Llama-3.2-1B without its
  large vocabulary;
- only when named, OUT_DIR/smollm2-135m-8heads-random: SmolLM2-135M with 8 query heads of
  72 and 2 key-value heads, which split over 2 tensor-parallel ranks (SmolLM2's 9 heads do
  not): bench/perturb.py's tensor_parallel_size 2 on the CPU.
Weights are transformers' own random initialisation (seeded), saved in bf16.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
)
ONE_B = {
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
}
EIGHT_HEADS = {"num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 72}


def build(source: Path, out: Path, overrides: dict) -> None:
    raw = json.loads((source / "config.json").read_text())
    raw.update(overrides)
    config = LlamaConfig(**{k: v for k, v in raw.items() if not k.startswith("_")})
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    # the engine's exports copy config.json from the source folder: keep the saved one, which
    # describes exactly these weights
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, out / name)
    params = sum(p.numel() for p in model.parameters())
    print(f"{out}: {params / 1e6:.1f}M parameters", flush=True)


MODELS = {
    "smollm2-135m-random": {},
    "llama-1b-random": ONE_B,
    "smollm2-135m-8heads-random": EIGHT_HEADS,
}
DEFAULT = ("smollm2-135m-random", "llama-1b-random")


def main() -> None:
    source, out = Path(sys.argv[1]), Path(sys.argv[2])
    for name in sys.argv[3:] or DEFAULT:
        build(source, out / name, MODELS[name])


if __name__ == "__main__":
    main()
