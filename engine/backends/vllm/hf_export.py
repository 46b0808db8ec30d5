"""vLLM parameters -> a Hugging Face model folder that transformers and vLLM both load.

vLLM fuses some checkpoint tensors into one parameter (`qkv_proj` = q_proj, k_proj, v_proj;
`gate_up_proj` = gate_proj, up_proj, stacked along the output dimension) and may pad the
vocabulary. The worker extension reads, from the model itself, which modules are fused
(`packed_modules_mapping`) and how wide each part is in the whole tensor (the layer's shard
rule, shards.py; for a layer it has none for, `output_partition_sizes`); this module
splits the tensors back, checks the result against the source checkpoint's names, shapes
and dtypes, and writes it next to the source's config and tokenizer files.

The check against the source is what makes this safe for architectures beyond the Llama
family: anything it cannot map gives an error naming the tensors, never a folder that
loads with missing or random weights.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
SKIP_FILES = {"model.safetensors.index.json", "pytorch_model.bin.index.json", "eslab-manifest.json"}
"""Not copied: weights (rewritten), shard indexes (stale) and ES Lab's manifest of the
source (its checksums describe the source weights, and a folder with a manifest that does
not match is treated as corrupt)."""

WEIGHTS_FILE = "model.safetensors"


class ExportError(RuntimeError):
    """The parameters cannot be written as a checkpoint of the source model's layout."""


def unfuse(
    params: Mapping[str, torch.Tensor],
    fused: Mapping[str, tuple[Sequence[str], Sequence[int]]],
) -> dict[str, torch.Tensor]:
    """Split fused parameters into their checkpoint parts.

    `fused` maps a module path (`model.layers.0.self_attn.qkv_proj`) to the part names
    (`q_proj`, `k_proj`, `v_proj`) and their sizes along dimension 0.
    """
    out: dict[str, torch.Tensor] = {}
    for name, tensor in params.items():
        module, _, leaf = name.rpartition(".")
        if module not in fused:
            out[name] = tensor
            continue
        parts, sizes = fused[module]
        if sum(sizes) != tensor.shape[0]:
            raise ExportError(
                f"{name}: parts {list(parts)} have sizes {list(sizes)} summing to {sum(sizes)}, "
                f"but the tensor has {tensor.shape[0]} rows"
            )
        parent = module.rpartition(".")[0]
        for part, piece in zip(parts, tensor.split(list(sizes), dim=0), strict=True):
            out[f"{parent}.{part}.{leaf}" if parent else f"{part}.{leaf}"] = piece.contiguous()
    return out


def source_tensor_specs(model_dir: str | Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape, safetensors dtype string) of the source checkpoint; {} without one."""
    from safetensors import safe_open

    specs: dict[str, tuple[tuple[int, ...], str]] = {}
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118  (safe_open is not a mapping)
                piece = f.get_slice(key)
                specs[key] = (tuple(piece.get_shape()), piece.get_dtype())
    return specs


_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}


def match_source(
    tensors: dict[str, torch.Tensor],
    specs: Mapping[str, tuple[tuple[int, ...], str]],
    tied_embeddings: bool,
) -> dict[str, torch.Tensor]:
    """Make `tensors` match the source checkpoint: same names, shapes and dtypes.

    Allowed differences, repaired: vocabulary padding (extra rows are dropped), a tied
    lm_head present in the source but deduplicated by vLLM (copied from the embedding), and
    dtype (cast to the source's: vLLM's CPU kernels keep some biases in fp32). Anything else
    raises ExportError naming the tensors.
    """
    import torch

    if not specs:
        return tensors
    out = dict(tensors)
    missing = sorted(set(specs) - set(out))
    if tied_embeddings and missing == ["lm_head.weight"] and "model.embed_tokens.weight" in out:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
        missing = []
    extra = sorted(set(out) - set(specs))
    if missing or extra:
        raise ExportError(
            f"cannot map vLLM parameters onto the source checkpoint: missing {missing[:8]}, "
            f"unexpected {extra[:8]} (only Llama-family fused names are mapped)"
        )
    for name, (shape, dtype_name) in specs.items():
        tensor = out[name]
        if tuple(tensor.shape) != shape:
            padded = (
                tensor.ndim == len(shape)
                and tensor.shape[0] > shape[0]
                and tuple(tensor.shape[1:]) == shape[1:]
            )
            if not padded:
                raise ExportError(f"{name}: shape {tuple(tensor.shape)}, source has {shape}")
            tensor = tensor[: shape[0]]
        dtype = getattr(torch, _DTYPES.get(dtype_name, ""), None)
        if dtype is not None and tensor.dtype != dtype:
            tensor = tensor.to(dtype)
        out[name] = tensor.contiguous()
    return out


def copy_model_files(source: str | Path, target: str | Path) -> list[str]:
    """Copy config, generation config, tokenizer and chat template files (not weights)."""
    copied = []
    for file in sorted(Path(source).iterdir()):
        if not file.is_file() or file.name in SKIP_FILES or file.name.endswith(WEIGHT_SUFFIXES):
            continue
        shutil.copy2(file, Path(target) / file.name)
        copied.append(file.name)
    return copied


def write_hf_folder(
    tensors: Mapping[str, torch.Tensor], source: str | Path, target: str | Path
) -> Path:
    """Write `tensors` as `model.safetensors` plus the source's non-weight files.

    The weights file is written under a temporary name and renamed, so a reader never sees
    half of it.
    """
    from safetensors.torch import save_file

    folder = Path(target)
    folder.mkdir(parents=True, exist_ok=True)
    copy_model_files(source, folder)
    tmp = folder / (WEIGHTS_FILE + ".tmp")
    cpu = {k: v.detach().to("cpu").contiguous() for k, v in sorted(tensors.items())}
    save_file(cpu, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, folder / WEIGHTS_FILE)
    return folder


def tied_word_embeddings(model_dir: str | Path) -> bool:
    """Whether the source config ties the lm_head to the input embedding."""
    config = Path(model_dir) / "config.json"
    if not config.is_file():
        return False
    return bool(json.loads(config.read_text()).get("tie_word_embeddings", False))
