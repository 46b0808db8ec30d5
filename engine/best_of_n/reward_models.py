"""An ensemble of per-seed reward models, as tlc4418/llm_optimization names them: one folder
pattern with a `{seed}` placeholder and the seeds that fill it (its `proxy_rm_path` and
`--seeds`, e.g. `models/rm-pythia-44m_seed{seed}` with 1,2,3,4,5), or the folders themselves,
comma-separated. Every folder is checked before any model loads, so a typo in the fifth seed
does not cost four models' scoring.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from engine.model_files import ModelError

SEED = "{seed}"


def parse_seeds(text: str | None) -> list[int] | None:
    """`--seeds 1,2,3` as integers (None when not given)."""
    if text is None:
        return None
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ModelError(f"--seeds must be comma-separated integers, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ModelError(f"--seeds must list distinct integers, got {text!r}")
    return seeds


def reward_model_folders(spec: str, seeds: Sequence[int] | None = None) -> dict[str, Path]:
    """Member name -> folder: `seed<s>` for each seed of a `{seed}` pattern (the reference's
    run names), else each folder's own name; ModelError naming what is wrong otherwise."""
    if SEED in spec:
        if not seeds:
            raise ModelError(f"--proxy-models {spec!r} has a {SEED} placeholder: pass --seeds")
        folders = {f"seed{s}": Path(spec.replace(SEED, str(s))) for s in seeds}
    else:
        if seeds:
            raise ModelError(f"--seeds needs a {SEED} placeholder in --proxy-models, got {spec!r}")
        paths = [Path(p.strip()) for p in spec.split(",") if p.strip()]
        if not paths:
            raise ModelError("--proxy-models names no reward model folder")
        folders = {p.name: p for p in paths}
        if len(folders) != len(paths):
            raise ModelError(
                f"--proxy-models names two folders of one name ({spec!r}); members are "
                "named by their folder, so give each reward model its own name"
            )
    for name, folder in folders.items():
        if not (folder / "config.json").is_file():
            why = "no such folder" if not folder.is_dir() else "no config.json in it"
            raise ModelError(
                f"reward model {name}: {folder} is not a Hugging Face checkpoint folder ({why})"
            )
    return folders
