"""LBES: reward filters on the base model's samples, and reward/log-likelihood correlation.

Implements nlp-waseda/lbes `src/lbes_trainer.py` (`filter_batch_by_reward`, `calc_corrcoef`;
docs/algorithms.md, "LBES"). One LBES step generates n samples
per prompt with the unperturbed model, giving a reward matrix r[B, n]. The filters run in the
reference's order:

1. top_k_prompt_reward_var: keep the k prompts with the largest reward variance over their
   samples (np.var, ddof 0). Ties are broken by a uniform random draw per prompt, the larger
   draw winning (the reference's `np.lexsort((tie_breaker, variance))[-k:]`).
2. top_k_rewards / bottom_k_rewards: per prompt, keep the union of the k highest and the k
   lowest rewards (all samples when neither is set). Ties: a stable sort by reward, so among
   equal rewards the top-k keeps the LATER sample indices and the bottom-k the EARLIER ones.
   The reference calls `np.argsort` without `kind`; numpy's default sort is stable for short
   rows only on CPUs without AVX-512 (there the two agree); with AVX-512 numpy dispatches to
   a SIMD sort whose tie order is unspecified, so the reference itself varies by machine.
3. exclude_same_rewards_samples: drop a prompt whose kept rewards are all close
   (`np.allclose(kept[1:], kept[0])`); a prompt with a single kept sample stays, as in the
   reference.
4. flat_top_k_rewards / flat_bottom_k_rewards: over all samples still kept (row-major order),
   keep the global top/bottom k (random tie-break as in 1); prompts left empty are dropped.

If nothing survives, the step is skipped: its batch is used up, but the global step and the
schedulers do not advance (engine/trainer/loop.py).

Correlation per member i between r and its mean log-likelihoods l_i over the kept samples:
Pearson over all kept samples (`flat_corrcoef`), or per prompt with within-prompt centering
and then the mean over prompts ignoring NaN (a prompt with zero variance gives NaN).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.config import LbesConfig
from engine.noise import derive_seed


@dataclass(frozen=True)
class TieBreak:
    """The random generators of the two filters that break ties by a random draw."""

    prompt_var: np.random.Generator
    flat: np.random.Generator


def reference_tiebreak(seed: int, global_step: int) -> TieBreak:
    """The generators the reference seeds at each step (its derive_seed keys)."""
    return TieBreak(
        prompt_var=np.random.default_rng(
            derive_seed(seed, global_step, "prompt_reward_var_tiebreak")
        ),
        flat=np.random.default_rng(derive_seed(seed, global_step, "flat_reward_tiebreak")),
    )


@dataclass(frozen=True)
class FilterResult:
    """Which base samples survived the filters, and which filter dropped each of the others."""

    kept: np.ndarray  # bool [B, n]
    dropped_by: np.ndarray  # object [B, n]: a filter name, or None where kept

    @property
    def kept_prompts(self) -> np.ndarray:  # bool [B]
        return self.kept.any(axis=1)

    @property
    def retained_prompt_ratio(self) -> float:
        return float(self.kept_prompts.mean())

    @property
    def retained_reward_ratio(self) -> float:
        return float(self.kept.mean())

    @property
    def is_empty(self) -> bool:
        """Nothing survived: the step must be skipped."""
        return not self.kept.any()


FILTER_STAGES: tuple[tuple[str, ...], ...] = (
    ("top_k_prompt_reward_var",),
    ("top_k_rewards", "bottom_k_rewards"),
    ("exclude_same_rewards_samples",),
    ("flat_top_k_rewards", "flat_bottom_k_rewards"),
)
"""The filters in the order they run, each as the options that configure it. A dropped
sample's dropped_by names its stage's options that are set, joined by '+'."""


def _filter_name(cfg: LbesConfig, *options: str) -> str:
    """The name recorded in dropped_by: the filter options that are set, joined by '+'."""
    return "+".join(o for o in options if getattr(cfg, o) is not None)


def filter_stage(dropped_by: str) -> int | None:
    """The index in FILTER_STAGES of the filter that recorded `dropped_by` (None for a name
    no filter writes), so a reader can count each filter's drops in the order they ran."""
    options = set(dropped_by.split("+"))
    return next((i for i, stage in enumerate(FILTER_STAGES) if options <= set(stage)), None)


def filter_rewards(rewards: np.ndarray, cfg: LbesConfig, tiebreak: TieBreak) -> FilterResult:
    """Apply the LBES filters configured in `cfg` to the reward matrix r[B, n]."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 2 or r.size == 0:
        raise ValueError(f"rewards must be a non-empty [prompts, samples] matrix, got {r.shape}")
    if not np.isfinite(r).all():
        raise ValueError("rewards must be finite numbers; a reward function returned NaN or inf")
    num_prompts, n = r.shape
    kept = np.ones((num_prompts, n), dtype=bool)
    dropped_by = np.full((num_prompts, n), None, dtype=object)

    def drop(mask: np.ndarray, name: str) -> None:
        newly = mask & kept
        dropped_by[newly] = name
        kept[newly] = False

    # 1. The k prompts whose rewards vary most.
    if cfg.top_k_prompt_reward_var is not None:
        k = min(cfg.top_k_prompt_reward_var, num_prompts)
        tie = tiebreak.prompt_var.random(size=num_prompts)
        order = np.lexsort((tie, r.var(axis=1)))  # ascending variance, then ascending draw
        keep_rows = np.zeros(num_prompts, dtype=bool)
        keep_rows[order[num_prompts - k :]] = True
        drop(np.broadcast_to(~keep_rows[:, None], r.shape), _filter_name(cfg, *FILTER_STAGES[0]))

    # 2. Per prompt, the union of its top-k and bottom-k samples.
    if cfg.top_k_rewards is not None or cfg.bottom_k_rewards is not None:
        order = np.argsort(r, axis=1, kind="stable")  # [B, n] sample indices, ascending reward
        selected = np.zeros((num_prompts, n), dtype=bool)
        rows = np.arange(num_prompts)[:, None]
        if cfg.top_k_rewards is not None:
            selected[rows, order[:, n - min(cfg.top_k_rewards, n) :]] = True
        if cfg.bottom_k_rewards is not None:
            selected[rows, order[:, : min(cfg.bottom_k_rewards, n)]] = True
        drop(~selected, _filter_name(cfg, *FILTER_STAGES[1]))

    # 3. Prompts whose kept rewards carry no signal (all the same).
    if cfg.exclude_same_rewards_samples:
        same = np.array(
            [
                values.size > 1 and np.allclose(values[1:], values[0])
                for values in (r[b, kept[b]] for b in range(num_prompts))
            ]
        )
        drop(np.broadcast_to(same[:, None], r.shape), FILTER_STAGES[2][0])

    # 4. The global top-k / bottom-k over everything still kept.
    if (cfg.flat_top_k_rewards is not None or cfg.flat_bottom_k_rewards is not None) and kept.any():
        flat_index = np.flatnonzero(kept)  # row-major, as the reference concatenates
        values = r.ravel()[flat_index]
        tie = tiebreak.flat.random(size=values.size)
        order = np.lexsort((tie, values))  # ascending reward, then ascending draw
        selected = np.zeros(values.size, dtype=bool)
        if cfg.flat_top_k_rewards is not None:
            selected[order[values.size - min(cfg.flat_top_k_rewards, values.size) :]] = True
        if cfg.flat_bottom_k_rewards is not None:
            selected[order[: min(cfg.flat_bottom_k_rewards, values.size)]] = True
        dropped = np.zeros(r.size, dtype=bool)
        dropped[flat_index[~selected]] = True
        drop(dropped.reshape(r.shape), _filter_name(cfg, *FILTER_STAGES[3]))

    return FilterResult(kept=kept, dropped_by=dropped_by)


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation as the reference computes it; NaN when either side is constant.
    Clipped to [-1, 1]: two samples a prompt (top_k 1 + bottom_k 1) correlate exactly +-1,
    which the floating-point quotient can overshoot by an ulp (1.0000000000000002 seen)."""
    if x.size == 0:
        return float("nan")
    xc = x - np.mean(x)
    yc = y - np.mean(y)
    denominator = np.sqrt(np.sum(xc**2)) * np.sqrt(np.sum(yc**2))
    if denominator == 0.0:
        return float("nan")
    return float(np.clip(np.sum(xc * yc) / denominator, -1.0, 1.0))


def correlation(rewards: np.ndarray, loglik: np.ndarray, kept: np.ndarray, flat: bool) -> float:
    """Correlation between rewards r[B, n] and one member's mean log-likelihoods l[B, n].

    Only kept samples count (entries of `loglik` outside `kept` are ignored and may be NaN).
    flat: Pearson over all kept samples. Otherwise: Pearson per prompt over its kept samples,
    then the mean over prompts that are not NaN (NaN if every prompt is NaN).
    """
    r = np.asarray(rewards, dtype=np.float64)
    ll = np.asarray(loglik, dtype=np.float64)
    kept = np.asarray(kept, dtype=bool)
    if not r.shape == ll.shape == kept.shape:
        raise ValueError(f"shapes differ: rewards {r.shape}, loglik {ll.shape}, kept {kept.shape}")
    if flat:
        return _pearson(r[kept], ll[kept])
    per_prompt = np.array(
        [_pearson(r[b, kept[b]], ll[b, kept[b]]) for b in range(r.shape[0]) if kept[b].any()]
    )
    per_prompt = per_prompt[~np.isnan(per_prompt)]
    return float(per_prompt.mean()) if per_prompt.size else float("nan")


def member_correlations(
    rewards: np.ndarray, logliks: np.ndarray, kept: np.ndarray, flat: bool
) -> np.ndarray:
    """`correlation` for every member: logliks[P, B, n] -> correlations [P] (may hold NaN)."""
    return np.array(
        [correlation(rewards, ll, kept, flat) for ll in np.asarray(logliks)], dtype=np.float64
    )
