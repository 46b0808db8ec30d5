"""Safe-RLHF score models, the alignment fork's reward and cost models (PKU-Alignment's
beaver-7b-v1.0-reward and -cost): `LlamaForScore` and its kin, a transformer whose
`score_head` (a Linear from the hidden size to `score_dim`, with or without a bias) reads the
last hidden state of the last token the attention mask keeps; that is the model's
`end_scores`, which the fork takes as reward and cost. With `do_normalize` the checkpoint
also holds a normalizer's running mean and variance, applied as Safe-RLHF does:
(score - mean) / (sqrt(var) + 1e-8) for its default `affine` function.

Loaded without the safe_rlhf package: the backbone is transformers' AutoModel of the
config's model type (the checkpoint's `model.*` weights, as AutoModel loads a base model out
of any checkpoint with a head), and the head and normalizer are read from the checkpoint's
own `score_head.*` and `normalizer.*` tensors. A sequence-classification checkpoint loaded
as such instead would get a new, untrained head.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

SCORE_ARCHITECTURE = "ForScore"
NORMALIZE_EPS = 1e-8
_NORMALIZE = {
    "affine": lambda x, mean, std: (x - mean) / (std + NORMALIZE_EPS),
    "scale": lambda x, mean, std: x / (std + NORMALIZE_EPS),
    "translate": lambda x, mean, std: x - mean,
    "identity": lambda x, mean, std: x,
}


def is_score_model(folder: str | Path) -> bool:
    """Whether the checkpoint's config names a Safe-RLHF score architecture."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return any(str(a).endswith(SCORE_ARCHITECTURE) for a in config.get("architectures") or [])


class ScoreHead:
    """A score model: `scores(encoded)` gives each row's end score."""

    def __init__(self, folder: str | Path) -> None:
        import torch
        from transformers import AutoModel

        self.folder = str(folder)
        self.backbone = AutoModel.from_pretrained(self.folder).eval()
        self.config = self.backbone.config
        dim = int(getattr(self.config, "score_dim", 1))
        if dim != 1:
            raise ValueError(f"its score_dim is {dim}; a reward or cost model gives one score")
        tensors = extra_tensors(Path(self.folder), ("score_head.", "normalizer."))
        if "score_head.weight" not in tensors:
            raise ValueError("its checkpoint has no score_head.weight")
        self.weight = tensors["score_head.weight"].float()
        self.bias = tensors.get("score_head.bias")
        self.normalize = None
        if getattr(self.config, "do_normalize", False):
            function = getattr(self.config, "normalize_function", "affine")
            if function not in _NORMALIZE or "normalizer.mean" not in tensors:
                raise ValueError(
                    f"it asks to normalize its scores ({function!r}) without a normalizer "
                    "this loader knows (normalizer.mean and normalizer.var, affine, scale, "
                    "translate or identity)"
                )
            mean, var = tensors["normalizer.mean"].float(), tensors["normalizer.var"].float()
            self.normalize = lambda x: _NORMALIZE[function](x, mean, var.sqrt())
        self._torch = torch

    def scores(self, encoded: Any) -> np.ndarray:
        torch = self._torch
        hidden = self.backbone(
            input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"]
        ).last_hidden_state
        mask = encoded["attention_mask"]
        positions = torch.arange(mask.shape[1]).expand_as(mask)
        end = (positions * mask).argmax(dim=1)  # the last token the mask keeps, either padding side
        last = hidden[torch.arange(hidden.shape[0]), end].float()
        scores = last @ self.weight.T + (0 if self.bias is None else self.bias.float())
        if self.normalize is not None:
            scores = self.normalize(scores)
        return scores[:, 0].numpy()


def extra_tensors(folder: Path, prefixes: tuple[str, ...]) -> dict[str, Any]:
    """The checkpoint's tensors whose names start with one of `prefixes` (safetensors files,
    sharded or not, else PyTorch .bin files), without loading the rest."""
    found: dict[str, Any] = {}
    safetensors = sorted(folder.glob("*.safetensors"))
    if safetensors:
        from safetensors import safe_open

        for path in safetensors:
            with safe_open(str(path), framework="pt") as file:
                for key in file.keys():  # noqa: SIM118 - safe_open has no __iter__
                    if key.startswith(prefixes):
                        found[key] = file.get_tensor(key)
        return found
    import torch

    for path in sorted(folder.glob("*.bin")):
        state = torch.load(str(path), map_location="cpu", weights_only=True)
        found.update({k: v for k, v in state.items() if k.startswith(prefixes)})
    return found
