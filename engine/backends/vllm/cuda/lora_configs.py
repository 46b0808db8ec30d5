"""The configuration files of vLLM's multi-LoRA Triton kernels that `lora_kernels:
deterministic` gives vLLM (VLLM_TUNED_CONFIG_FOLDER).

vLLM's LoRA shrink kernel splits its sum over K (`split_k` 64 for batches under 128, else 8)
and adds the parts atomically, in an order that varies from run to run (vLLM 0.26
`vllm/lora/ops/triton_ops/utils.py`, `get_lora_op_configs`). Deterministic runs need every
shrink configuration to have split_k 1. vLLM reads FOLDER/<card>_SHRINK.json and
FOLDER/<card>_EXPAND_<TRUE|FALSE>.json (the card's name with spaces and dashes as _), keyed
max_loras -> num_slices -> m -> k -> n, taking the nearest key of each but num_slices.

Where TUNED_FOLDER holds files for the card (`bench/gpu/lora_kernel_tune.py --out` that
folder, on that card), they are used: configurations timed for the low-rank mode's shapes,
shrink still without split-K (checked here). Elsewhere the shrink file holds vLLM's default
blocks with split_k 1 and expand keeps vLLM's defaults.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TUNED_FOLDER = Path(__file__).resolve().parent / "tuned_lora"
"""Tuned configuration files, per card, as bench/gpu/lora_kernel_tune.py writes them."""

SHRINK_SPLIT_K_1 = {
    # vLLM 0.26's default shrink configuration (vllm/lora/ops/triton_ops/utils.py,
    # get_lora_op_configs) for batches under 128 tokens and from 128 on, with split_k 1
    m: {
        "block_m": 32,
        "block_n": 16,
        "block_k": 256 if m < 128 else 32,
        "split_k": 1,
        "num_warps": 4,
        "num_ctas": 1,
        "group_size_m": 8,
        "num_stages": 2,
        "max_nreg": None,
    }
    for m in (1, 127, 128)
}
"""By batch size m: vLLM picks the nearest m key, so m < 128 gets the first two's blocks
and m >= 128 the last's, as its default does."""


def card_file_name(gpu_name: str) -> str:
    """The card's name as vLLM spells it in its configuration files' names."""
    return gpu_name.replace(" ", "_").replace("-", "_")


def deterministic_lora_configs(
    folder: str | Path, gpu_name: str, tuned: Path = TUNED_FOLDER
) -> str:
    """Write the configuration files that keep vLLM's LoRA kernels deterministic on GPU
    `gpu_name` into `folder` (the tuned ones where `tuned` has them for the card) and return
    the folder for VLLM_TUNED_CONFIG_FOLDER. ValueError where a tuned shrink configuration
    splits K."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name = card_file_name(gpu_name)
    shrink = folder / f"{name}_SHRINK.json"
    tuned_shrink = tuned / shrink.name
    if tuned_shrink.is_file():
        split = [c for c in _leaves(json.loads(tuned_shrink.read_text())) if c["split_k"] != 1]
        if split:
            raise ValueError(
                f"{tuned_shrink}: {len(split)} shrink configurations split K (split_k "
                f"{split[0]['split_k']}), which makes LoRA runs differ from run to run; "
                "tune again with bench/gpu/lora_kernel_tune.py"
            )
        for source in sorted(tuned.glob(f"{name}_*.json")):
            shutil.copyfile(source, folder / source.name)
        return str(folder)
    by_size = {str(m): {"1": {"1": config}} for m, config in SHRINK_SPLIT_K_1.items()}
    table = {"1": {str(slices): by_size for slices in (1, 2, 3)}}
    shrink.write_text(json.dumps(table, indent=1))
    return str(folder)


def _leaves(table: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The configurations of a nested table (a leaf has a block_m)."""
    for value in table.values():
        if isinstance(value, dict) and "block_m" in value:
            yield value
        elif isinstance(value, dict):
            yield from _leaves(value)
