"""The schema: one frozen dataclass per group of options and RunConfig, their root.

Adding a group (alignment, LoRA, ...) is one frozen dataclass with a TITLE (its heading in
people's words) whose fields use `option` (each with a label and a help text), and one field of
`RunConfig`; `config_fields()`, GROUP_TITLES, YAML, validation and the generated CLI and form
pick it up. Cross-field rules live in engine/config/rules.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from engine.config.errors import ConfigError, FieldError
from engine.config.eval_sets import format_eval_sets, parse_eval_sets
from engine.config.fields import (
    METHODS,
    FieldSpec,
    field_specs,
    group_title,
    option,
    option_groups,
)
from engine.config.yaml_io import read_yaml_file, write_yaml
from engine.fitness import SHAPERS
from engine.lowrank.factors import LORA_KERNELS, NOISE_SCALINGS
from engine.prompts import PROMPT_FORMATS
from engine.reporters.reference_keys import KEY_NAMES
from engine.schedules import SCHEDULES
from engine.scoring.reward_process import TIMEOUT_ACTIONS, RewardLimit

STRATEGIES = ("no", "steps", "epoch")
DTYPES = ("auto", "bfloat16", "float16", "float32")
LOAD_FORMATS = ("auto", "safetensors", "pt", "npcache", "sharded_state", "mistral", "dummy")
"""vLLM's weight loaders that need nothing beyond ES Lab's packages and no settings of their
own (tensorizer needs its config, runai_streamer and fastsafetensors their packages)."""
SCHEDULE_TYPES = tuple(SCHEDULES)
SHAPER_NAMES = tuple(SHAPERS)
LEARNING_RATE_RULES = ("fixed", "es_at_scale")
AUTO = "auto"
"""The word of num_engines and engines_per_gpu that lets the run choose (engine/arrangement.py)."""


@dataclass(frozen=True)
class ModelConfig:
    """The model and the vLLM engines that serve it."""

    TITLE: ClassVar[str] = "Model and engine"

    model: str = option(
        "data/models/smollm2-135m-instruct",
        "Model to fine-tune: a local Hugging Face folder or a hub name. The default is the "
        "small model fetched at setup (`eslab model`), so runs work offline on the CPU.",
        label="Model",
    )
    dtype: str = option(
        "bfloat16",
        "Weight dtype of the engines. Updates accumulate in an fp32 master copy whatever this is.",
        label="Weight dtype",
        choices=DTYPES,
    )
    max_model_len: int | None = option(
        None,
        "Longest prompt + completion in tokens; None takes the model's own limit. "
        "Lower it to shrink the KV cache.",
        label="Context length (tokens)",
        min_value=1,
    )
    tensor_parallel_size: int = option(
        1,
        "GPUs per engine (tensor parallelism); the noise is the same at every size.",
        label="GPUs per engine",
        min_value=1,
    )
    num_engines: int | str = option(
        AUTO,
        "vLLM engines (one Ray actor each) that evaluate population members in parallel; "
        "they never exchange weights, each replays the same update. auto: one card's worth "
        "(tensor_parallel_size GPUs) holding engines_per_gpu engines, and one in-process "
        "engine on a machine without GPUs.",
        label="Engines",
        min_value=1,
        words=(AUTO,),
    )
    engines_per_gpu: int | str = option(
        AUTO,
        "Engines that share one GPU (each a process with its own copy of the weights), so "
        "several members generate at once; they split its memory. auto: with num_engines "
        "auto, as many as the card's memory holds (at most 8) where CUDA MPS runs and 1 "
        "where it does not (the run's events then say how many MPS would allow); with a "
        "number of engines, 1.",
        label="Engines per GPU",
        min_value=1,
        words=(AUTO,),
    )
    gpu_memory_utilization: float | None = option(
        None,
        "Share of memory for weights and KV cache; None means 0.9 on a GPU and 0.3 on "
        "the CPU, where it is the share of RAM given to the KV cache. Engines that auto "
        "puts on one card share this much of it together.",
        label="Memory share",
        min_value=0.0,
        exclusive_min=True,
        max_value=1.0,
    )
    max_num_seqs: int | None = option(
        None,
        "Most sequences an engine decodes at once; None takes vLLM's default.",
        label="Sequences at once",
        min_value=1,
    )
    max_num_batched_tokens: int | None = option(
        None,
        "Most tokens an engine processes in one scheduler step (prompt chunks and decoded "
        "tokens together); None takes vLLM's default (nlp-waseda/lbes's flag).",
        label="Tokens a step",
        min_value=1,
    )
    load_format: str = option(
        "auto",
        "How vLLM reads the model's weights (nlp-waseda/lbes's flag): auto takes "
        "safetensors, else PyTorch .bin files; dummy starts from random weights (for "
        "benchmarks only: the run then trains and saves those).",
        label="Weight loader",
        choices=LOAD_FORMATS,
    )
    enforce_eager: bool = option(
        False,
        "Disable CUDA graphs / compilation: slower decoding, faster start-up.",
        label="Eager mode (no CUDA graphs)",
    )

    def vllm_flags(self) -> dict[str, Any]:
        """The engine flags this group passes to vLLM as they are, where they differ from
        vLLM's defaults."""
        flags: dict[str, Any] = {}
        if self.load_format != "auto":
            flags["load_format"] = self.load_format
        if self.max_num_batched_tokens is not None:
            flags["max_num_batched_tokens"] = self.max_num_batched_tokens
        return flags


@dataclass(frozen=True)
class SamplingConfig:
    """How completions are sampled."""

    TITLE: ClassVar[str] = "Sampling"

    n: int = option(
        1,
        "Completions per prompt. LBES correlates rewards with log-likelihoods within a "
        "prompt, so it needs several (default 8 for lbes).",
        label="Completions per prompt",
        min_value=1,
        method_defaults={"lbes": 8},
    )
    temperature: float = option(
        0.0,
        "Sampling temperature; 0 is greedy (the ES references). LBES samples at 1.0 "
        "by default so that a prompt's n completions differ.",
        label="Temperature",
        min_value=0.0,
        method_defaults={"lbes": 1.0},
    )
    max_tokens: int = option(
        2048,
        "Most tokens generated per completion.",
        label="Completion length (tokens)",
        min_value=1,
    )


@dataclass(frozen=True)
class EsConfig:
    """The evolution strategy: population, noise, step size and their schedules."""

    TITLE: ClassVar[str] = "ES"

    population_size: int = option(
        32,
        "Perturbed models per step (N). More members lower the variance of the update "
        "and cost proportionally more generation.",
        label="Population size (N)",
        min_value=2,
    )
    noise_std: float = option(
        1e-3,
        "Std of the Gaussian perturbation (sigma) at step 0.",
        label="Noise std (sigma)",
        min_value=0.0,
        exclusive_min=True,
    )
    noise_std_scheduler_type: str = option(
        "constant",
        "How noise_std changes over training.",
        label="Noise schedule",
        choices=SCHEDULE_TYPES,
    )
    noise_std_final: float = option(
        0.0,
        "noise_std at the last step (linear, cosine, polynomial schedules).",
        label="Final noise std",
        min_value=0.0,
    )
    noise_std_scheduler_rate: float = option(
        0.95,
        "Per-step factor of the exponential noise_std schedule.",
        label="Noise decay rate",
        min_value=0.0,
        exclusive_min=True,
        max_value=1.0,
    )
    noise_std_scheduler_power: float = option(
        1.0,
        "Power of the polynomial noise_std schedule (1 is linear).",
        label="Noise schedule power",
        min_value=0.0,
        exclusive_min=True,
    )
    learning_rate: float = option(
        5e-7,
        "Step size in theta += lr / (N * sigma) * sum A_i eps_i. The references' 5e-7 "
        "suits 1B+ models; small models need far larger values (around 4e-5 for the "
        "default model) to show learning in minutes. 0 leaves the weights unchanged.",
        label="Learning rate",
        min_value=0.0,
    )
    learning_rate_rule: str = option(
        "fixed",
        "fixed: learning_rate as given. es_at_scale: ES at Scale's default step, alpha = "
        "sigma / 2 in its update theta += alpha / N * sum z_i eps_i, which is learning_rate "
        "= noise_std^2 / 2 here (5e-7 at noise_std 1e-3); lr_scheduler_type starts from it "
        "and learning_rate itself is not read.",
        label="Learning rate rule",
        choices=LEARNING_RATE_RULES,
    )
    lr_scheduler_type: str = option(
        "constant",
        "How learning_rate changes over training.",
        label="Learning rate schedule",
        choices=SCHEDULE_TYPES,
    )
    lr_final: float = option(
        0.0,
        "learning_rate at the last step (linear, cosine, polynomial schedules).",
        label="Final learning rate",
        min_value=0.0,
    )
    lr_scheduler_rate: float = option(
        0.95,
        "Per-step factor of the exponential learning_rate schedule.",
        label="Learning rate decay rate",
        min_value=0.0,
        exclusive_min=True,
        max_value=1.0,
    )
    lr_scheduler_power: float = option(
        1.0,
        "Power of the polynomial learning_rate schedule (1 is linear).",
        label="Learning rate schedule power",
        min_value=0.0,
        exclusive_min=True,
    )
    fitness_shaping: str = option(
        "zscore",
        "Fitness -> advantage: zscore (the references) or centered_rank "
        "(OpenAI-ES, robust to outliers).",
        label="Fitness shaping",
        choices=SHAPER_NAMES,
    )
    antithetic: bool = option(
        False,
        "Mirrored sampling: members come in +eps/-eps pairs sharing a seed, which "
        "lowers the variance of the update; needs an even population_size.",
        label="Antithetic (mirrored) sampling",
    )
    macro_advantage: bool = option(
        False,
        "ES only: shape each (prompt, sample) reward across the population and "
        "average, instead of shaping each member's mean reward.",
        label="Macro advantage",
        methods=("es",),
    )

    @property
    def initial_learning_rate(self) -> float:
        """The learning rate at step 0, where learning_rate_rule says it comes from."""
        return initial_learning_rate(self.learning_rate_rule, self.learning_rate, self.noise_std)


def initial_learning_rate(rule: str, learning_rate: float, noise_std: float) -> float:
    """The learning rate at step 0 under `rule` (learning_rate_rule); for a stored flat
    configuration too (the dashboard's planned schedule)."""
    if rule == "es_at_scale":
        # VsonicV/es-at-scale, es_at_scale/train.py: alpha -1 means sigma / 2, and its step
        # alpha / N equals lr / (N * sigma) of ES Lab's update (docs/algorithms.md).
        return noise_std**2 / 2
    return learning_rate


@dataclass(frozen=True)
class DataConfig:
    """Training data, run length, seed and where results go."""

    TITLE: ClassVar[str] = "Data"

    train_file: str | None = option(
        None,
        "Parquet file of training prompts (columns prompt, reward_func_args).",
        label="Training dataset",
        required=True,
    )
    eval_file: str | None = option(
        None,
        "Parquet file of evaluation prompts; needed when eval_strategy is not 'no', unless "
        "eval_sets is given.",
        label="Evaluation dataset",
    )
    eval_sets: str | None = option(
        None,
        "More evaluation sets, each reported on its own, as ES at Scale's math task does: "
        "name=parquet pairs separated by commas (math500=data/math/math500.parquet,"
        "aime24=data/math/aime24.parquet). Every evaluation runs them with eval_file and logs "
        "eval/<name>/pass@1/mean (the set's mean reward, one greedy completion a prompt) and "
        "their mean eval/avgpass@1/mean; eval/reward/mean and the other eval metrics are "
        "over all the prompts evaluated.",
        label="Evaluation sets",
    )
    prompt_format: str = option(
        "chat",
        "What the datasets' prompt column holds. chat: chat messages, rendered by the "
        "model's chat template. raw: plain text, sent to the model exactly as written (the "
        "references' own prompts, e.g. ES at Scale's countdown prompt ending in <think>). "
        "A dataset of the other kind is refused.",
        label="Prompt format",
        choices=PROMPT_FORMATS,
    )
    data_batch_size: int = option(
        64,
        "Prompts per step; every member generates for the whole batch.",
        label="Prompts per step",
        min_value=1,
    )
    num_train_epochs: int = option(3, "Passes over the training data.", label="Epochs", min_value=1)
    max_steps: int | None = option(
        None,
        "Stop after this many steps; when set it overrides num_train_epochs.",
        label="Steps",
        min_value=1,
    )
    seed: int = option(
        42,
        "Run seed: data order, member seeds and tie-breaks derive from it.",
        label="Seed",
        min_value=0,
    )
    output_dir: str | None = option(
        None,
        "Folder for checkpoints (checkpoint-STEP/) and the final model.",
        label="Output folder",
        required=True,
    )

    def eval_set_files(self) -> dict[str, str]:
        """eval_sets as `{name: file}` (the rules have refused a malformed value)."""
        return parse_eval_sets(self.eval_sets)


@dataclass(frozen=True)
class RewardConfig:
    """The reward function."""

    TITLE: ClassVar[str] = "Reward"

    reward_func_path: str | None = option(
        None,
        "Dotted path of compute_score(completion_text, **reward_func_args) -> dict, "
        "e.g. engine.rewards.countdown.compute_score: a function of a module under "
        "engine.rewards or in a module or folder listed in ESLAB_REWARD_MODULES, called "
        "with the reward_func_args its signature names. Required unless reward_source is "
        "scorer or ensemble.",
        label="Reward function",
    )
    reward_timeout_seconds: float | None = option(
        10.0,
        "Seconds one reward function call may take on one completion (ES at Scale's "
        "default is 10). Reward functions then run in a child process that can be killed; "
        "None runs them in the trainer's own process with no limit.",
        label="Reward time limit (s)",
        min_value=0.0,
        exclusive_min=True,
    )
    reward_timeout_action: str = option(
        "stop",
        "What a completion whose reward runs past reward_timeout_seconds gets: stop (the "
        "run fails with an error naming the function and the sample) or score_zero (its "
        "reward is 0, its other parts unknown, and the run goes on, as in ES at Scale).",
        label="On a reward timeout",
        choices=TIMEOUT_ACTIONS,
    )

    def limit(self) -> RewardLimit | None:
        """The reward functions' time limit; None: no limit (they run in-process)."""
        if self.reward_timeout_seconds is None:
            return None
        return RewardLimit(self.reward_timeout_seconds, self.reward_timeout_action)


_LBES = ("lbes",)


@dataclass(frozen=True)
class LbesConfig:
    """LBES only: which base samples enter the correlation, and how it is computed."""

    TITLE: ClassVar[str] = "LBES filters"

    top_k_prompt_reward_var: int | None = option(
        None,
        "Keep only the k prompts whose rewards vary most over their n samples.",
        label="Prompts kept (most varied rewards)",
        min_value=1,
        methods=_LBES,
    )
    top_k_rewards: int | None = option(
        None,
        "Per prompt, keep the k best samples (together with bottom_k_rewards).",
        label="Best samples kept per prompt",
        min_value=1,
        methods=_LBES,
    )
    bottom_k_rewards: int | None = option(
        None,
        "Per prompt, keep the k worst samples (together with top_k_rewards).",
        label="Worst samples kept per prompt",
        min_value=1,
        methods=_LBES,
    )
    exclude_same_rewards_samples: bool = option(
        False,
        "Drop prompts whose kept samples all have the same reward (no signal).",
        label="Drop prompts with equal rewards",
        methods=_LBES,
    )
    flat_top_k_rewards: int | None = option(
        None,
        "Keep the k best samples over the whole batch.",
        label="Best samples kept per batch",
        min_value=1,
        methods=_LBES,
    )
    flat_bottom_k_rewards: int | None = option(
        None,
        "Keep the k worst samples over the whole batch.",
        label="Worst samples kept per batch",
        min_value=1,
        methods=_LBES,
    )
    flat_corrcoef: bool = option(
        False,
        "Correlate over all kept samples at once instead of per prompt (per prompt needs n >= 2).",
        label="Correlate over the whole batch",
        methods=_LBES,
    )


REWARD_SOURCES = ("function", "scorer", "ensemble")
ENSEMBLE_METHODS = ("mean", "min", "uwo")
_ES = ("es",)


@dataclass(frozen=True)
class AlignmentConfig:
    """Alignment (ES only): fitness mean(R) - lambda * mean(C), adaptive lambda."""

    TITLE: ClassVar[str] = "Alignment"

    # R and C come from a scorer service (engine/scoring); the lambda rule and the objective
    # are engine/alignment/lagrangian.py. The docstring above is one line: to_yaml prints it
    # as a comment.

    reward_source: str = option(
        "function",
        "Where the reward R comes from: reward_func_path, the scorer service's "
        "reward model, or an ensemble (ensemble_members).",
        label="Reward source",
        choices=REWARD_SOURCES,
    )
    scorer_url: str | None = option(
        None,
        "Scorer service (`eslab scorer serve`), e.g. http://127.0.0.1:8000. When set, "
        "its cost model gives C and fitness is mean(R) - lambda * mean(C).",
        label="Scorer address",
        methods=_ES,
    )
    lambda_cost: float = option(
        0.5,
        "lambda at step 0 (the weight of the cost).",
        label="Cost weight (lambda)",
        min_value=0.0,
        methods=_ES,
    )
    lambda_adapt: bool = option(
        False,
        "Adapt lambda after every step from the unperturbed model's costs: "
        "ln(lambda) += lambda_lr * J, J a moving average of mean(C) - cost_threshold_d.",
        label="Adapt lambda",
        methods=_ES,
    )
    lambda_lr: float = option(
        0.01, "Step size of ln(lambda).", label="Lambda step size", min_value=0.0, methods=_ES
    )
    lambda_min: float = option(
        1e-4, "Lower clip of lambda.", label="Lambda minimum", min_value=0.0, methods=_ES
    )
    lambda_max: float = option(
        10.0, "Upper clip of lambda.", label="Lambda maximum", min_value=0.0, methods=_ES
    )
    cost_threshold_d: float = option(
        0.0,
        "Safety threshold d of the constraint mean(C) <= d.",
        label="Cost threshold (d)",
        methods=_ES,
    )
    lambda_pos_cost_only: bool = option(
        False,
        "Use the positive part of J_C, so lambda never falls.",
        label="Lambda never falls",
        methods=_ES,
    )
    jc_ema_beta: float = option(
        0.9,
        "Moving-average factor of J_C: J <- beta * J + (1 - beta) * J_C.",
        label="Cost average factor (beta)",
        min_value=0.0,
        max_value=1.0,
        methods=_ES,
    )
    standardize_within_batch: bool = option(
        False,
        "Divide mean(R) and mean(C) by their batch std (no centering).",
        label="Standardize within batch",
        methods=_ES,
    )
    safe_first: bool = option(
        False,
        "Multiply the reward of unsafe answers (C > 0) by safe_first_factor.",
        label="Safe first",
        methods=_ES,
    )
    safe_first_factor: float = option(
        0.0,
        "Reward multiplier of unsafe answers with safe_first (0 is a hard gate).",
        label="Unsafe reward factor",
        methods=_ES,
    )
    scorer_batch_size: int = option(
        16, "Pairs per scorer request.", label="Pairs per scorer request", min_value=1
    )
    scorer_timeout_s: float = option(
        60.0,
        "Seconds a scorer request may take before it is retried, then fails the run.",
        label="Scorer time limit (s)",
        min_value=0.0,
        exclusive_min=True,
    )
    scorer_retries: int = option(
        8,
        "Further attempts after a scorer timeout, refusal of connection or 5xx, 0.5 s "
        "after the first failure and twice as long after each next one, at most 30 s: 8 "
        "outlast about 90 s of a scorer that restarts.",
        label="Scorer retries",
        min_value=0,
    )


@dataclass(frozen=True)
class EnsembleConfig:
    """Reward ensembles (reward_source: ensemble), as in Coste et al. 2023."""

    TITLE: ClassVar[str] = "Reward ensemble"

    ensemble_members: str | None = option(
        None,
        "Comma-separated members: reward function dotted paths (allowed as for "
        "reward_func_path), `scorer` (the scorer_url reward model) or other scorer URLs "
        "(their reward models).",
        label="Ensemble members",
    )
    ensemble_method: str = option(
        "mean",
        "mean, min (worst case) or uwo (mean - uwo_weight * variance).",
        label="Ensemble method",
        choices=ENSEMBLE_METHODS,
    )
    uwo_weight: float = option(
        0.1, "Variance weight of uwo.", label="Variance weight (uwo)", min_value=0.0
    )


@dataclass(frozen=True)
class EvalConfig:
    """When to evaluate and when to save checkpoints."""

    TITLE: ClassVar[str] = "Evaluation and checkpoints"

    eval_strategy: str = option(
        "no",
        "Evaluate greedily on eval_file every eval_steps steps, every epoch, or never.",
        label="Evaluate",
        choices=STRATEGIES,
    )
    eval_steps: int | None = option(
        None,
        "Steps between evaluations when eval_strategy is 'steps'.",
        label="Steps between evaluations",
        min_value=1,
    )
    eval_before_train: bool = option(
        True,
        "Also evaluate the untrained model, as a baseline (when evaluation is on).",
        label="Evaluate before training",
    )
    save_strategy: str = option(
        "no",
        "Save a checkpoint every save_steps steps, every epoch, or never (the final "
        "model is always saved).",
        label="Save checkpoints",
        choices=STRATEGIES,
    )
    save_steps: int | None = option(
        None,
        "Steps between checkpoints when save_strategy is 'steps'.",
        label="Steps between checkpoints",
        min_value=1,
    )
    save_total_limit: int = option(
        3,
        "Checkpoints kept on disk; the oldest are removed.",
        label="Checkpoints kept",
        min_value=1,
    )
    save_best_model: bool = option(
        False,
        "Save a checkpoint at every evaluation whose mean eval reward beats all earlier ones "
        "(the untrained model's included) and never remove the best one; the final model "
        "is still the last step's (ES at Scale's save_best_models).",
        label="Keep the best checkpoint",
    )


@dataclass(frozen=True)
class LoggingConfig:
    """Reporting."""

    TITLE: ClassVar[str] = "Logging"

    logging_steps: int = option(
        1, "Steps between metric reports.", label="Steps between reports", min_value=1
    )
    run_name: str | None = option(
        None, "Display name of the run; None lets ES Lab pick one.", label="Run name"
    )
    report_to: str | None = option(
        None,
        "Experiment trackers that also get every metric, comma-separated: tensorboard "
        "(event files in output_dir/tensorboard; the `tensorboard` extra) and wandb "
        "(Weights & Biases, files in output_dir/wandb, WANDB_MODE=offline keeps them on "
        "disk; the `wandb` extra). None or none: ES Lab's own store only.",
        label="Also report to",
    )
    report_key_names: str = option(
        "eslab",
        "Key names the trackers get: eslab, or reference, which also writes each metric under "
        "the key the method's reference repository logs it as (ES at Scale for es, the "
        "alignment fork for alignment runs; LBES's names are ES Lab's), so their charts "
        "overlay; an ES Lab key that the reference uses for another quantity goes to the "
        "trackers as eslab/KEY. ES Lab's store keeps its own names.",
        label="Tracker key names",
        choices=KEY_NAMES,
    )


_LORA_DEFAULT_MODULES = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"

PERTURBATIONS = ("full", "full_batched", "lora")


@dataclass(frozen=True)
class LoraConfig:
    """Perturbation mode: full-rank noise (member by member, or batched), or LoRA members."""

    TITLE: ClassVar[str] = "LoRA perturbation"

    perturbation: str = option(
        "full",
        "full: every weight gets seeded Gaussian noise, one member at a time. "
        "full_batched: full-rank noise on the weights of the target modules (below), and "
        "the whole population in one batched engine call: each layer adds every member's "
        "noise product to the unperturbed one, so no member's weights are written "
        "(embedding, norms and LM head stay unperturbed; tensor_parallel_size 1; for GPUs, "
        "slower than full on a CPU). lora: "
        "each member is a seeded rank-r adapter (EGGROLL), also in one call; ES method only.",
        label="Perturbation",
        choices=PERTURBATIONS,
    )
    lora_rank: int = option(
        4,
        "Rank r of each member's perturbation (and of the trained adapter).",
        label="LoRA rank (r)",
        min_value=1,
        max_value=256,
    )
    lora_alpha: float = option(
        8.0,
        "LoRA alpha of saved adapters (delta = alpha / r * B A, the PEFT convention); the "
        "perturbation size is set by noise_std.",
        label="LoRA alpha",
        min_value=0.0,
        exclusive_min=True,
    )
    lora_target_modules: str = option(
        _LORA_DEFAULT_MODULES,
        "Comma-separated linear modules that members perturb (lora and full_batched; "
        "full_batched perturbs a fused layer's weight whole, so name all of q/k/v or "
        "gate/up together).",
        label="Perturbed modules",
    )
    lora_target_layers: str | None = option(
        None,
        "Layers that members perturb (lora and full_batched), e.g. 0-9 or 0,2,4; None "
        "means every layer.",
        label="Perturbed layers",
    )
    lora_noise_scaling: str = option(
        "layer",
        "layer: a layer's noise std is noise_std * mean |W| of its target weights "
        "(the LoRA reference; noise_std around 0.1 then); none: noise_std itself.",
        label="Noise scaling",
        choices=NOISE_SCALINGS,
    )
    lora_update: str = option(
        "merge",
        "merge: the ES update (fp32) is merged into the base weights every step. "
        "adapter: base weights stay frozen and the update is kept as one rank-r adapter, "
        "saved in the PEFT format.",
        label="Update kept as",
        choices=("merge", "adapter"),
    )
    lora_kernels: str = option(
        "deterministic",
        "On CUDA: deterministic makes vLLM's LoRA kernel add its partial sums in a fixed "
        "order, so the same seed gives the same run (generation 7-20% slower on an H100); "
        "fast is vLLM's default, whose order changes from run to run. CPU runs are "
        "deterministic either way.",
        label="LoRA kernels",
        choices=LORA_KERNELS,
    )


@dataclass(frozen=True)
class RunConfig:
    """A complete, validated run configuration (validation runs on construction)."""

    method: str = option(
        "es",
        "es: fitness = mean reward of each perturbed model. lbes: fitness = "
        "correlation between the base model's rewards and each perturbed model's "
        "likelihood of those samples.",
        label="Method",
        choices=METHODS,
    )
    model: ModelConfig = field(default_factory=ModelConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    es: EsConfig = field(default_factory=EsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    lbes: LbesConfig = field(default_factory=LbesConfig)
    alignment: AlignmentConfig = field(default_factory=AlignmentConfig)
    ensemble: EnsembleConfig = field(default_factory=EnsembleConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)

    # Validation reads the specs derived from this class (SPECS below), hence the imports
    # inside the methods.

    def __post_init__(self) -> None:
        from engine.config.validation import problems

        errors = problems(self.to_flat(), coerce_text=False)
        if errors:
            raise ConfigError(errors)

    # -- in

    @classmethod
    def from_flat(cls, mapping: Mapping[str, Any]) -> RunConfig:
        """Build from flat `option: value` pairs, nested {group: {option: value}}, or both.

        String values are converted to the option's type; every problem is reported at once.
        """
        from engine.config.validation import build, flatten, problems

        flat, errors = flatten(mapping)
        errors += problems(flat, coerce_text=True)
        if errors:
            raise ConfigError(errors)
        return build(flat)

    @classmethod
    def from_yaml(cls, path: str | Path) -> RunConfig:
        """Read a YAML file (flat or nested); errors name the file, syntax errors the line."""
        mapping = read_yaml_file(path)
        try:
            return cls.from_flat(mapping)
        except ConfigError as exc:
            raise ConfigError(exc.errors, str(path)) from None

    def with_overrides(self, pairs: list[str]) -> RunConfig:
        """A copy with `option=value` strings applied (CLI `--set`); `group.option` works too.

        Every other option keeps its current value, including method-dependent ones: setting
        method=lbes on an es config keeps n and temperature as they are.
        """
        from engine.config.validation import build, flatten, problems

        parsed: dict[str, str] = {}
        errors: list[FieldError] = []
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep:
                errors.append(
                    FieldError(
                        pair, f"override {pair!r} must look like option=value, e.g. noise_std=1e-3"
                    )
                )
                continue
            parsed[key.strip()] = value.strip()
        overrides, flatten_errors = flatten(parsed)
        merged = {**self.to_flat(), **overrides}
        errors += flatten_errors + problems(merged, coerce_text=True)
        if errors:
            raise ConfigError(errors)
        return build(merged)

    def with_resolved_paths(self) -> RunConfig:
        """A copy whose model folder, datasets and output folder are absolute, as
        engine.paths.resolve_path finds them now (a hub model id stays as it is): what a run
        stores, so that resuming or cloning it reads the same files even where ESLAB_DATA_DIR,
        which `data/...` follows, has changed since."""
        from engine.model_files import local_model
        from engine.paths import resolve_path

        def resolved(path: str | None) -> str | None:
            return None if path is None else str(resolve_path(path))

        local = local_model(self.model.model)
        return dataclasses.replace(
            self,
            model=dataclasses.replace(self.model, model=str(local or self.model.model)),
            data=dataclasses.replace(
                self.data,
                train_file=resolved(self.data.train_file),
                eval_file=resolved(self.data.eval_file),
                eval_sets=format_eval_sets(
                    {n: str(resolve_path(p)) for n, p in self.data.eval_set_files().items()}
                ),
                output_dir=resolved(self.data.output_dir),
            ),
        )

    # -- out

    def to_flat(self) -> dict[str, Any]:
        """`{option: value}` for every option, `method` first; JSON and YAML safe."""
        flat: dict[str, Any] = {"method": self.method}
        for group in GROUPS:
            flat.update(dataclasses.asdict(getattr(self, group)))
        return flat

    def to_dict(self) -> dict[str, Any]:
        """`{"method": ..., group: {option: value}}`; from_flat reads it back."""
        return {
            "method": self.method,
            **{group: dataclasses.asdict(getattr(self, group)) for group in GROUPS},
        }

    def to_yaml(self) -> str:
        """Flat `option: value` YAML, one commented block per group."""
        return write_yaml(self)

    def total_steps(self, steps_per_epoch: int) -> int:
        """Training steps of the run: max_steps when set, else steps_per_epoch * epochs."""
        if self.data.max_steps is not None:
            return self.data.max_steps
        return steps_per_epoch * self.data.num_train_epochs


# Group name -> dataclass, in declaration order (every RunConfig field but `method`).
GROUPS: dict[str, type] = option_groups(RunConfig)
# Group name -> its heading in people's words, "" for RunConfig's own option (`method`).
GROUP_TITLES: dict[str, str] = {
    "": "Method",
    **{name: group_title(cls) for name, cls in GROUPS.items()},
}
# Option name -> spec, `method` first; names are unique across groups (checked here).
SPECS: dict[str, FieldSpec] = field_specs(RunConfig)


def config_fields() -> list[FieldSpec]:
    """Every option, `method` first, then group by group in declaration order."""
    return list(SPECS.values())
