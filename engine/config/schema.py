"""The one run configuration: a validated dataclass tree that YAML, the CLI and the form share.

Options are the flags of nlp-waseda/lbes (`src/es_config.py`, `src/lbes_config.py`; digest in
shared/reference/seed-algorithms.md, section 3) in snake_case, plus ES Lab's own (engines,
antithetic sampling, fitness shaping, schedule rate and power). Every option name is unique
across groups, so a configuration is always expressible as flat `option: value` pairs plus
`method: es | lbes`; the groups only organise the Python side (`cfg.es.noise_std`).

Adding a group (alignment, LoRA, ...) is one frozen dataclass whose fields use `_option`, and
one field of `RunConfig`; `config_fields()`, YAML, validation and the generated CLI and form
pick it up. Cross-field rules live in `_CHECKS`.

Differences from the reference, on purpose:
- learning_rate may be 0 (the reference requires > 0): a run with lr 0 must leave the weights
  untouched, which the engine tests rely on.
- method-dependent defaults: with method lbes, n defaults to 8 and temperature to 1.0, as
  `LBESConfig` overrides them; they apply only to options the input does not give.
- options that only one method reads are refused under the other method instead of being
  silently ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

import yaml

from engine.fitness import SHAPERS
from engine.schedules import SCHEDULES

METHODS = ("es", "lbes")
STRATEGIES = ("no", "steps", "epoch")
DTYPES = ("auto", "bfloat16", "float16", "float32")
SCHEDULE_TYPES = tuple(SCHEDULES)
SHAPER_NAMES = tuple(SHAPERS)
# Strings read as None for options that accept None (CLI `--set eval_file=none`, empty form).
_NONE_WORDS = {"none", "null", "~", ""}
_TRUE_WORDS = {"true", "yes", "on", "1"}
_FALSE_WORDS = {"false", "no", "off", "0"}
_DOTTED_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")


def _option(default: Any, help: str, *, choices: tuple[str, ...] | None = None,
            min_value: float | None = None, max_value: float | None = None,
            exclusive_min: bool = False, required: bool = False,
            method_defaults: Mapping[str, Any] | None = None,
            methods: tuple[str, ...] = METHODS) -> Any:
    """A dataclass field carrying what validation, the CLI and the form need to know."""
    metadata = {"help": help, "choices": choices, "min": min_value, "max": max_value,
                "exclusive_min": exclusive_min, "required": required,
                "method_defaults": dict(method_defaults or {}), "methods": methods}
    return field(default=default, metadata=metadata)


# ---------------------------------------------------------------------------- the schema


@dataclass(frozen=True)
class ModelConfig:
    """The model and the vLLM engines that serve it."""

    model: str = _option(
        "data/models/smollm2-135m-instruct",
        "Model to fine-tune: a local Hugging Face folder or a hub name. The default is the "
        "small model fetched at setup (`eslab model`), so runs work offline on the CPU.")
    dtype: str = _option(
        "bfloat16", "Weight dtype of the engines. Updates accumulate in an fp32 master copy "
        "whatever this is.", choices=DTYPES)
    max_model_len: int | None = _option(
        None, "Longest prompt + completion in tokens; None takes the model's own limit. "
        "Lower it to shrink the KV cache.", min_value=1)
    tensor_parallel_size: int = _option(
        1, "GPUs per engine (tensor parallelism); each rank perturbs its own shard.",
        min_value=1)
    num_engines: int = _option(
        1, "vLLM engines (one Ray actor each) that evaluate population members in parallel; "
        "they never exchange weights, each replays the same update.", min_value=1)
    engines_per_gpu: int = _option(
        1, "Engines that share one GPU (each a process with its own copy of the weights), so "
        "several members generate at once; they split its memory.", min_value=1)
    gpu_memory_utilization: float | None = _option(
        None, "Share of memory for weights and KV cache; None means 0.9 on a GPU and 0.3 on "
        "the CPU, where it is the share of RAM given to the KV cache.",
        min_value=0.0, exclusive_min=True, max_value=1.0)
    max_num_seqs: int | None = _option(
        None, "Most sequences an engine decodes at once; None takes vLLM's default.",
        min_value=1)
    enforce_eager: bool = _option(
        False, "Disable CUDA graphs / compilation: slower decoding, faster start-up.")


@dataclass(frozen=True)
class SamplingConfig:
    """How completions are sampled."""

    n: int = _option(
        1, "Completions per prompt. LBES correlates rewards with log-likelihoods within a "
        "prompt, so it needs several (default 8 for lbes).", min_value=1,
        method_defaults={"lbes": 8})
    temperature: float = _option(
        0.0, "Sampling temperature; 0 is greedy (the ES references). LBES samples at 1.0 "
        "by default so that a prompt's n completions differ.", min_value=0.0,
        method_defaults={"lbes": 1.0})
    max_tokens: int = _option(2048, "Most tokens generated per completion.", min_value=1)


@dataclass(frozen=True)
class EsConfig:
    """The evolution strategy: population, noise, step size and their schedules."""

    population_size: int = _option(
        32, "Perturbed models per step (N). More members lower the variance of the update "
        "and cost proportionally more generation.", min_value=2)
    noise_std: float = _option(
        1e-3, "Std of the Gaussian perturbation (sigma) at step 0.", min_value=0.0,
        exclusive_min=True)
    noise_std_scheduler_type: str = _option(
        "constant", "How noise_std changes over training.", choices=SCHEDULE_TYPES)
    noise_std_final: float = _option(
        0.0, "noise_std at the last step (linear, cosine, polynomial schedules).",
        min_value=0.0)
    noise_std_scheduler_rate: float = _option(
        0.95, "Per-step factor of the exponential noise_std schedule.", min_value=0.0,
        exclusive_min=True, max_value=1.0)
    noise_std_scheduler_power: float = _option(
        1.0, "Power of the polynomial noise_std schedule (1 is linear).", min_value=0.0,
        exclusive_min=True)
    learning_rate: float = _option(
        5e-7, "Step size in theta += lr / (N * sigma) * sum A_i eps_i. The references' 5e-7 "
        "suits 1B+ models; small models need far larger values (around 4e-5 for the "
        "default model) to show learning in minutes. 0 leaves the weights unchanged.",
        min_value=0.0)
    lr_scheduler_type: str = _option(
        "constant", "How learning_rate changes over training.", choices=SCHEDULE_TYPES)
    lr_final: float = _option(
        0.0, "learning_rate at the last step (linear, cosine, polynomial schedules).",
        min_value=0.0)
    lr_scheduler_rate: float = _option(
        0.95, "Per-step factor of the exponential learning_rate schedule.", min_value=0.0,
        exclusive_min=True, max_value=1.0)
    lr_scheduler_power: float = _option(
        1.0, "Power of the polynomial learning_rate schedule (1 is linear).", min_value=0.0,
        exclusive_min=True)
    fitness_shaping: str = _option(
        "zscore", "Fitness -> advantage: zscore (the references) or centered_rank "
        "(OpenAI-ES, robust to outliers).", choices=SHAPER_NAMES)
    antithetic: bool = _option(
        False, "Mirrored sampling: members come in +eps/-eps pairs sharing a seed, which "
        "lowers the variance of the update; needs an even population_size.")
    macro_advantage: bool = _option(
        False, "ES only: shape each (prompt, sample) reward across the population and "
        "average, instead of shaping each member's mean reward.", methods=("es",))


@dataclass(frozen=True)
class DataConfig:
    """Training data, run length, seed and where results go."""

    train_file: str | None = _option(
        None, "Parquet file of training prompts (columns prompt, reward_func_args).",
        required=True)
    eval_file: str | None = _option(
        None, "Parquet file of evaluation prompts; needed when eval_strategy is not 'no'.")
    data_batch_size: int = _option(
        64, "Prompts per step; every member generates for the whole batch.", min_value=1)
    num_train_epochs: int = _option(3, "Passes over the training data.", min_value=1)
    max_steps: int | None = _option(
        None, "Stop after this many steps; when set it overrides num_train_epochs.",
        min_value=1)
    seed: int = _option(
        42, "Run seed: data order, member seeds and tie-breaks derive from it.", min_value=0)
    output_dir: str | None = _option(
        None, "Folder for checkpoints (checkpoint-STEP/) and the final model.", required=True)


@dataclass(frozen=True)
class RewardConfig:
    """The reward function."""

    reward_func_path: str | None = _option(
        None, "Dotted path of compute_score(completion_text, **reward_func_args) -> dict, "
        "e.g. engine.rewards.countdown.compute_score. Required unless reward_source is "
        "scorer or ensemble.")


_LBES = ("lbes",)


@dataclass(frozen=True)
class LbesConfig:
    """LBES only: which base samples enter the correlation, and how it is computed."""

    top_k_prompt_reward_var: int | None = _option(
        None, "Keep only the k prompts whose rewards vary most over their n samples.",
        min_value=1, methods=_LBES)
    top_k_rewards: int | None = _option(
        None, "Per prompt, keep the k best samples (together with bottom_k_rewards).",
        min_value=1, methods=_LBES)
    bottom_k_rewards: int | None = _option(
        None, "Per prompt, keep the k worst samples (together with top_k_rewards).",
        min_value=1, methods=_LBES)
    exclude_same_rewards_samples: bool = _option(
        False, "Drop prompts whose kept samples all have the same reward (no signal).",
        methods=_LBES)
    flat_top_k_rewards: int | None = _option(
        None, "Keep the k best samples over the whole batch.", min_value=1, methods=_LBES)
    flat_bottom_k_rewards: int | None = _option(
        None, "Keep the k worst samples over the whole batch.", min_value=1, methods=_LBES)
    flat_corrcoef: bool = _option(
        False, "Correlate over all kept samples at once instead of per prompt (per prompt "
        "needs n >= 2).", methods=_LBES)


REWARD_SOURCES = ("function", "scorer", "ensemble")
ENSEMBLE_METHODS = ("mean", "min", "uwo")
_ES = ("es",)


@dataclass(frozen=True)
class AlignmentConfig:
    """Alignment (ES only): fitness mean(R) - lambda * mean(C), adaptive lambda."""

    # R and C come from a scorer service (engine/scoring); the lambda rule and the objective
    # are engine/alignment/lagrangian.py. The docstring above is one line: to_yaml prints it
    # as a comment.

    reward_source: str = _option(
        "function", "Where the reward R comes from: reward_func_path, the scorer service's "
        "reward model, or an ensemble (ensemble_members).", choices=REWARD_SOURCES)
    scorer_url: str | None = _option(
        None, "Scorer service (`eslab scorer serve`), e.g. http://127.0.0.1:8000. When set, "
        "its cost model gives C and fitness is mean(R) - lambda * mean(C).", methods=_ES)
    lambda_cost: float = _option(
        0.5, "lambda at step 0 (the weight of the cost).", min_value=0.0, methods=_ES)
    lambda_adapt: bool = _option(
        False, "Adapt lambda after every step from the unperturbed model's costs: "
        "ln(lambda) += lambda_lr * J, J a moving average of mean(C) - cost_threshold_d.",
        methods=_ES)
    lambda_lr: float = _option(0.01, "Step size of ln(lambda).", min_value=0.0, methods=_ES)
    lambda_min: float = _option(1e-4, "Lower clip of lambda.", min_value=0.0, methods=_ES)
    lambda_max: float = _option(10.0, "Upper clip of lambda.", min_value=0.0, methods=_ES)
    cost_threshold_d: float = _option(
        0.0, "Safety threshold d of the constraint mean(C) <= d.", methods=_ES)
    lambda_pos_cost_only: bool = _option(
        False, "Use the positive part of J_C, so lambda never falls.", methods=_ES)
    jc_ema_beta: float = _option(
        0.9, "Moving-average factor of J_C: J <- beta * J + (1 - beta) * J_C.",
        min_value=0.0, max_value=1.0, methods=_ES)
    standardize_within_batch: bool = _option(
        False, "Divide mean(R) and mean(C) by their batch std (no centering).", methods=_ES)
    safe_first: bool = _option(
        False, "Multiply the reward of unsafe answers (C > 0) by safe_first_factor.",
        methods=_ES)
    safe_first_factor: float = _option(
        0.0, "Reward multiplier of unsafe answers with safe_first (0 is a hard gate).",
        methods=_ES)
    scorer_batch_size: int = _option(16, "Pairs per scorer request.", min_value=1)
    scorer_timeout_s: float = _option(
        60.0, "Seconds a scorer request may take before it is retried, then fails the run.",
        min_value=0.0, exclusive_min=True)
    scorer_retries: int = _option(
        2, "Further attempts after a scorer timeout, refusal of connection or 5xx.",
        min_value=0)


@dataclass(frozen=True)
class EnsembleConfig:
    """Reward ensembles (reward_source: ensemble), as in Coste et al. 2023."""


    ensemble_members: str | None = _option(
        None, "Comma-separated members: reward function dotted paths, `scorer` (the "
        "scorer_url reward model) or other scorer URLs (their reward models).")
    ensemble_method: str = _option(
        "mean", "mean, min (worst case) or uwo (mean - uwo_weight * variance).",
        choices=ENSEMBLE_METHODS)
    uwo_weight: float = _option(0.1, "Variance weight of uwo.", min_value=0.0)


@dataclass(frozen=True)
class EvalConfig:
    """When to evaluate and when to save checkpoints."""

    eval_strategy: str = _option(
        "no", "Evaluate greedily on eval_file every eval_steps steps, every epoch, or never.",
        choices=STRATEGIES)
    eval_steps: int | None = _option(
        None, "Steps between evaluations when eval_strategy is 'steps'.", min_value=1)
    eval_before_train: bool = _option(
        True, "Also evaluate the untrained model, as a baseline (when evaluation is on).")
    save_strategy: str = _option(
        "no", "Save a checkpoint every save_steps steps, every epoch, or never (the final "
        "model is always saved).", choices=STRATEGIES)
    save_steps: int | None = _option(
        None, "Steps between checkpoints when save_strategy is 'steps'.", min_value=1)
    save_total_limit: int = _option(
        3, "Checkpoints kept on disk; the oldest are removed.", min_value=1)


@dataclass(frozen=True)
class LoggingConfig:
    """Reporting."""

    logging_steps: int = _option(1, "Steps between metric reports.", min_value=1)
    run_name: str | None = _option(None, "Display name of the run; None lets ES Lab pick one.")


_LORA_DEFAULT_MODULES = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


@dataclass(frozen=True)
class LoraConfig:
    """Perturbation mode: full-rank noise on every weight, or low-rank LoRA members."""

    perturbation: str = _option(
        "full", "full: every weight gets seeded Gaussian noise, one member at a time. lora: "
        "each member is a seeded rank-r adapter (EGGROLL) and the whole population is "
        "evaluated in one batched engine call (vLLM multi-LoRA); ES method only.",
        choices=("full", "lora"))
    lora_rank: int = _option(
        4, "Rank r of each member's perturbation (and of the trained adapter).", min_value=1,
        max_value=256)
    lora_alpha: float = _option(
        8.0, "LoRA alpha of saved adapters (delta = alpha / r * B A, the PEFT convention); the "
        "perturbation size is set by noise_std.", min_value=0.0, exclusive_min=True)
    lora_target_modules: str = _option(
        _LORA_DEFAULT_MODULES, "Comma-separated linear modules that members perturb.")
    lora_target_layers: str | None = _option(
        None, "Layers that members perturb, e.g. 0-9 or 0,2,4; None means every layer.")
    lora_noise_scaling: str = _option(
        "layer", "layer: a layer's noise std is noise_std * mean |W| of its target weights "
        "(the LoRA reference; noise_std around 0.1 then); none: noise_std itself.",
        choices=("layer", "none"))
    lora_update: str = _option(
        "merge", "merge: the ES update (fp32) is merged into the base weights every step. "
        "adapter: base weights stay frozen and the update is kept as one rank-r adapter, "
        "saved in the PEFT format.", choices=("merge", "adapter"))


# ---------------------------------------------------------------------------- field specs


@dataclass(frozen=True)
class FieldSpec:
    """Everything about one option that a CLI, a form or a validator needs."""

    name: str
    group: str  # "" for the root-level `method`
    type: type  # str, int, float or bool
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    min: float | None = None
    max: float | None = None
    exclusive_min: bool = False  # min itself is not allowed (e.g. noise_std > 0)
    required: bool = False
    nullable: bool = False  # None is an accepted value
    method_defaults: Mapping[str, Any] = field(default_factory=dict)
    methods: tuple[str, ...] = METHODS  # the methods that read this option

    @property
    def path(self) -> str:
        """Qualified name used in messages, e.g. es.noise_std."""
        return f"{self.group}.{self.name}" if self.group else self.name

    def default_for(self, method: str) -> Any:
        return self.method_defaults.get(method, self.default)


@dataclass(frozen=True)
class FieldError:
    """One problem: `field` is the flat option name (or 'config' for the file itself)."""

    field: str
    message: str

    def __str__(self) -> str:
        return self.message


class ConfigError(Exception):
    """An invalid configuration; `.errors` lists every problem found, not just the first."""

    def __init__(self, errors: list[FieldError], source: str | None = None) -> None:
        self.errors = list(errors)
        self.source = source
        where = f" in {source}" if source else ""
        count = f"{len(self.errors)} problem" + ("s" if len(self.errors) != 1 else "")
        lines = "\n".join(f"  - {e.message}" for e in self.errors)
        super().__init__(f"invalid configuration{where} ({count}):\n{lines}")


def _base_type(hint: Any) -> tuple[type, bool]:
    """(base type, accepts None) of an annotation such as `int | None`."""
    if isinstance(hint, types.UnionType):
        args = [a for a in hint.__args__ if a is not type(None)]
        return args[0], True
    return hint, False


def _spec(f: dataclasses.Field, hint: Any, group: str) -> FieldSpec:
    base, optional = _base_type(hint)
    m = f.metadata
    return FieldSpec(name=f.name, group=group, type=base, default=f.default, help=m["help"],
                     choices=m["choices"], min=m["min"], max=m["max"],
                     exclusive_min=m["exclusive_min"], required=m["required"],
                     nullable=optional and not m["required"],
                     method_defaults=m["method_defaults"], methods=m["methods"])


# ---------------------------------------------------------------------------- the root


@dataclass(frozen=True)
class RunConfig:
    """A complete, validated run configuration (validation runs on construction)."""

    method: str = _option(
        "es", "es: fitness = mean reward of each perturbed model. lbes: fitness = "
        "correlation between the base model's rewards and each perturbed model's "
        "likelihood of those samples.", choices=METHODS)
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

    def __post_init__(self) -> None:
        errors = _problems(self.to_flat(), coerce=False)
        if errors:
            raise ConfigError(errors)

    # -- in

    @classmethod
    def from_flat(cls, mapping: Mapping[str, Any]) -> RunConfig:
        """Build from flat `option: value` pairs, nested {group: {option: value}}, or both.

        String values are converted to the option's type; every problem is reported at once.
        """
        flat, errors = _flatten(mapping)
        errors += _problems(flat, coerce=True)
        if errors:
            raise ConfigError(errors)
        return _build(flat)

    @classmethod
    def from_yaml(cls, path: str | Path) -> RunConfig:
        """Read a YAML file (flat or nested); errors name the file, syntax errors the line."""
        source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError([FieldError("config", f"cannot read {source}: {exc.strerror}")],
                              source) from None
        try:
            data = yaml.load(text, Loader=_YamlLoader)  # a SafeLoader subclass
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark
            at = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
            raise ConfigError([FieldError("config", f"{at}: YAML syntax error: {exc.problem}")],
                              source) from None
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError([FieldError(
                "config", f"{source} must hold a mapping of option: value pairs, "
                f"got a {type(data).__name__}")], source)
        try:
            return cls.from_flat(data)
        except ConfigError as exc:
            raise ConfigError(exc.errors, source) from None

    def with_overrides(self, pairs: list[str]) -> RunConfig:
        """A copy with `option=value` strings applied (CLI `--set`); `group.option` works too.

        Every other option keeps its current value, including method-dependent ones: setting
        method=lbes on an es config keeps n and temperature as they are.
        """
        parsed: dict[str, str] = {}
        errors: list[FieldError] = []
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep:
                errors.append(FieldError(pair, f"override {pair!r} must look like "
                                               "option=value, e.g. noise_std=1e-3"))
                continue
            parsed[key.strip()] = value.strip()
        overrides, flatten_errors = _flatten(parsed)
        merged = {**self.to_flat(), **overrides}
        errors += flatten_errors + _problems(merged, coerce=True)
        if errors:
            raise ConfigError(errors)
        return _build(merged)

    # -- out

    def to_flat(self) -> dict[str, Any]:
        """`{option: value}` for every option, `method` first; JSON and YAML safe."""
        flat: dict[str, Any] = {"method": self.method}
        for group in _GROUPS:
            flat.update(dataclasses.asdict(getattr(self, group)))
        return flat

    def to_dict(self) -> dict[str, Any]:
        """`{"method": ..., group: {option: value}}`; from_flat reads it back."""
        return {"method": self.method,
                **{group: dataclasses.asdict(getattr(self, group)) for group in _GROUPS}}

    def to_yaml(self) -> str:
        """Flat `option: value` YAML, one commented block per group."""
        blocks = [yaml.safe_dump({"method": self.method}, sort_keys=False)]
        for group, cls in _GROUPS.items():
            title = (cls.__doc__ or "").strip()
            values = dataclasses.asdict(getattr(self, group))
            blocks.append(f"# {group}: {title}\n" + yaml.safe_dump(values, sort_keys=False))
        return "\n".join(blocks)

    def total_steps(self, steps_per_epoch: int) -> int:
        """Training steps of the run: max_steps when set, else steps_per_epoch * epochs."""
        if self.data.max_steps is not None:
            return self.data.max_steps
        return steps_per_epoch * self.data.num_train_epochs


# Group name -> dataclass, in declaration order (every RunConfig field but `method`).
_GROUPS: dict[str, type] = {
    name: hint for name, hint in get_type_hints(RunConfig).items()
    if dataclasses.is_dataclass(hint)
}


def _collect_specs() -> dict[str, FieldSpec]:
    root = {f.name: f for f in dataclasses.fields(RunConfig)}
    specs = {"method": _spec(root["method"], str, "")}
    for group, cls in _GROUPS.items():
        hints = get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name in specs:
                # Flat YAML needs unique names; a clash is a schema bug, caught at import.
                raise TypeError(f"option name {f.name!r} of group {group!r} is not unique")
            specs[f.name] = _spec(f, hints[f.name], group)
    return specs


_SPECS: dict[str, FieldSpec] = _collect_specs()


def config_fields() -> list[FieldSpec]:
    """Every option, `method` first, then group by group in declaration order."""
    return list(_SPECS.values())


# ---------------------------------------------------------------------------- input parsing


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans: only true/false.

    YAML 1.1 also reads yes/no/on/off as booleans, which would turn the natural
    `eval_strategy: no` into False.
    """


_BOOL_TAG = "tag:yaml.org,2002:bool"
_YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_YamlLoader.add_implicit_resolver(
    _BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def _unknown(key: str) -> FieldError:
    names = [*_SPECS, *_GROUPS]
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else "see `eslab train --help` for options"
    return FieldError(key, f"unknown option {key!r}: {hint}")


def _flatten(mapping: Mapping[str, Any]) -> tuple[dict[str, Any], list[FieldError]]:
    """Flat {option: value} from flat, nested ({group: {...}}) or dotted (group.option) keys."""
    flat: dict[str, Any] = {}
    errors: list[FieldError] = []

    def put(group: str | None, name: str, value: Any) -> None:
        spec = _SPECS.get(name)
        if spec is None:
            errors.append(_unknown(f"{group}.{name}" if group else name))
        elif group is not None and spec.group != group:
            errors.append(FieldError(name, f"{group}.{name} is not an option of group "
                                           f"{group!r}: write {spec.path} or just {name}"))
        elif name in flat:
            errors.append(FieldError(name, f"{spec.path} is given twice: keep one"))
        else:
            flat[name] = value

    for raw_key, value in mapping.items():
        key = str(raw_key)
        # `model` is both a group and an option: a mapping value means the group.
        if key in _GROUPS and isinstance(value, Mapping):
            for name, sub_value in value.items():
                put(key, str(name), sub_value)
        elif key not in _SPECS and "." in key and key.split(".", 1)[0] in _GROUPS:
            group, name = key.split(".", 1)
            put(group, name, value)
        elif key in _GROUPS and key not in _SPECS:
            errors.append(FieldError(key, f"{key!r} is a group: give it a mapping of its "
                                          f"options, got {_show(value)}"))
        else:
            put(None, key, value)
    return flat, errors


class _Invalid(Exception):
    """A value breaks its option's rule; the message completes '<es.noise_std> ...'."""


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _coerce(spec: FieldSpec, value: Any) -> Any:
    """The value converted to the option's type, strings parsed (CLI, forms, YAML)."""
    if spec.nullable and (value is None or
                          (isinstance(value, str) and value.strip().lower() in _NONE_WORDS)):
        return None
    if spec.type is bool:
        if isinstance(value, bool):
            return value
        word = str(value).strip().lower() if isinstance(value, str | int) else None
        if word in _TRUE_WORDS | _FALSE_WORDS:
            return word in _TRUE_WORDS
        raise _Invalid(f"must be true or false, got {_show(value)}")
    if spec.type is int:
        number = _number(value)
        if number is None or not number.is_integer():
            raise _Invalid(f"must be an integer, got {_show(value)}")
        return int(number)
    if spec.type is float:
        number = _number(value)
        if number is None:
            raise _Invalid(f"must be a finite number, got {_show(value)}")
        return number
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)  # e.g. `run_name: 2024` in YAML
    if not isinstance(value, str):
        raise _Invalid(f"must be a string, got {_show(value)} ({type(value).__name__})")
    return value


def _number(value: Any) -> float | None:
    """A finite float from a number or a numeric string; None otherwise (bools included)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _check_type(spec: FieldSpec, value: Any) -> Any:
    """For direct construction: the value must already have the option's type."""
    if value is None and spec.nullable:
        return value
    if spec.type is bool:
        ok = isinstance(value, bool)
    elif spec.type is float:
        ok = _number(value) is not None and not isinstance(value, str)
    else:  # bool is an int subclass, but True is no population size
        ok = isinstance(value, spec.type) and not isinstance(value, bool)
    if not ok:
        raise _Invalid(f"must be of type {spec.type.__name__}, got {_show(value)} "
                       f"({type(value).__name__})")
    return value


def _check_value(spec: FieldSpec, value: Any) -> None:
    """Choices and range of an already typed value."""
    if value is None:
        return
    if spec.choices is not None and value not in spec.choices:
        close = difflib.get_close_matches(str(value), spec.choices, n=1)
        hint = f": did you mean {close[0]!r}?" if close else ""
        raise _Invalid(f"must be one of {', '.join(spec.choices)}, got {_show(value)}{hint}")
    if spec.type is str and spec.choices is None and not value.strip():
        raise _Invalid("must not be empty")
    if spec.min is not None and (value <= spec.min if spec.exclusive_min else value < spec.min):
        sign = ">" if spec.exclusive_min else ">="
        raise _Invalid(f"must be {sign} {spec.min:g}, got {_show(value)}")
    if spec.max is not None and value > spec.max:
        raise _Invalid(f"must be <= {spec.max:g}, got {_show(value)}")


def _problems(given: dict[str, Any], coerce: bool) -> list[FieldError]:
    """Every problem of flat `given` (options not given take their defaults).

    Converts `given` in place to typed values (when `coerce`) and fills in defaults, so a
    problem-free `given` is ready for `_build`.
    """
    errors: list[FieldError] = []
    bad: set[str] = set()
    check = _coerce if coerce else _check_type
    method = given.get("method", "es")
    for spec in _SPECS.values():
        if spec.name not in given or (given[spec.name] is None and spec.required):
            if spec.required:
                errors.append(FieldError(spec.name, f"{spec.path} is required: {spec.help}"))
                bad.add(spec.name)
            given[spec.name] = spec.default_for(method if method in METHODS else "es")
            continue
        try:
            value = check(spec, given[spec.name])
            _check_value(spec, value)
            given[spec.name] = value
        except _Invalid as exc:
            errors.append(FieldError(spec.name, f"{spec.path} {exc}"))
            bad.add(spec.name)
    for fields, rule in _CHECKS:
        if not bad.intersection(fields):
            errors += rule(given)
    return errors


def _build(values: dict[str, Any]) -> RunConfig:
    """A RunConfig from complete, typed flat values."""
    groups = {group: cls(**{f.name: values[f.name] for f in dataclasses.fields(cls)})
              for group, cls in _GROUPS.items()}
    return RunConfig(method=values["method"], **groups)


# ---------------------------------------------------------------------------- cross-field rules

Check = Callable[[dict[str, Any]], list[FieldError]]
_CHECKS: list[tuple[tuple[str, ...], Check]] = []


def _rule(*fields: str) -> Callable[[Callable[[dict[str, Any]], Iterator[FieldError]]], Check]:
    """Register a cross-field rule reading `fields`; it is skipped when one of them is invalid."""
    def register(fn: Callable[[dict[str, Any]], Iterator[FieldError]]) -> Check:
        def check(values: dict[str, Any]) -> list[FieldError]:
            return list(fn(values))
        _CHECKS.append((fields, check))
        return check
    return register


@_rule("reward_func_path", "reward_source")
def _reward_path(v: dict[str, Any]) -> Iterator[FieldError]:
    if v["reward_func_path"] is None:
        if v["reward_source"] == "function":
            yield FieldError("reward_func_path", "reward.reward_func_path is required: "
                             f"{_SPECS['reward_func_path'].help}")
    elif not _DOTTED_PATH.match(v["reward_func_path"]):
        yield FieldError("reward_func_path",
                         f"reward.reward_func_path must be a dotted path module.function, got "
                         f"{v['reward_func_path']!r}: e.g. engine.rewards.countdown.compute_score")


@_rule("antithetic", "population_size")
def _antithetic_even(v: dict[str, Any]) -> Iterator[FieldError]:
    if v["antithetic"] and v["population_size"] % 2:
        yield FieldError("population_size",
                         f"es.population_size must be even when es.antithetic is true, got "
                         f"{v['population_size']}: use {v['population_size'] + 1} or set "
                         "antithetic false")


def _every_steps_rule(kind: str) -> None:
    """`<kind>_strategy: steps` needs `<kind>_steps`; the same rule for eval and save."""
    strategy, steps = f"{kind}_strategy", f"{kind}_steps"

    def check(v: dict[str, Any]) -> Iterator[FieldError]:
        if v[strategy] == "steps" and v[steps] is None:
            yield FieldError(steps,
                             f"eval.{steps} must be >= 1 when {strategy} is 'steps', got None: "
                             f"set {steps} or use {strategy} 'epoch' or 'no'")

    _rule(strategy, steps)(check)


_every_steps_rule("eval")
_every_steps_rule("save")


@_rule("eval_strategy", "eval_file")
def _eval_file(v: dict[str, Any]) -> Iterator[FieldError]:
    if v["eval_strategy"] != "no" and v["eval_file"] is None:
        yield FieldError("eval_file",
                         f"data.eval_file is required when eval_strategy is "
                         f"{v['eval_strategy']!r}, got None: give a parquet file or set "
                         "eval_strategy 'no'")


_METHOD_SPECIFIC = tuple(s for s in _SPECS.values() if s.methods != METHODS)


@_rule("method", *(s.name for s in _METHOD_SPECIFIC))
def _method_options(v: dict[str, Any]) -> Iterator[FieldError]:
    # An option the chosen method never reads would be silently ignored: refuse it.
    for spec in _METHOD_SPECIFIC:
        if v["method"] not in spec.methods and v[spec.name] != spec.default:
            only = " or ".join(repr(m) for m in spec.methods)
            yield FieldError(spec.name, f"{spec.path} only applies to method {only}, got "
                                        f"{_show(v[spec.name])} with method {v['method']!r}: "
                                        f"remove it or set method {spec.methods[0]}")


@_rule("method", "flat_corrcoef", "n", "temperature")
def _per_prompt_correlation(v: dict[str, Any]) -> Iterator[FieldError]:
    if v["method"] != "lbes" or v["flat_corrcoef"]:
        return
    if v["n"] < 2:
        yield FieldError("n", f"sampling.n must be >= 2 for lbes per-prompt correlation, got "
                              f"{v['n']}: raise n or set flat_corrcoef true")
    elif v["temperature"] == 0:
        yield FieldError("temperature",
                         "sampling.temperature must be > 0 for lbes per-prompt correlation, got "
                         "0.0: greedy decoding makes a prompt's n samples identical, so every "
                         "correlation is undefined; use e.g. 1.0 or set flat_corrcoef true")


@_rule("method", "data_batch_size", "n")
def _enough_samples(v: dict[str, Any]) -> Iterator[FieldError]:
    if v["method"] == "lbes" and v["data_batch_size"] * v["n"] < 2:
        yield FieldError("data_batch_size",
                         f"data.data_batch_size * sampling.n must be >= 2 for lbes, got "
                         f"{v['data_batch_size']} * {v['n']}: a correlation needs two samples")


@_rule("method", "n", "data_batch_size", "top_k_rewards", "bottom_k_rewards",
       "top_k_prompt_reward_var", "flat_top_k_rewards", "flat_bottom_k_rewards")
def _filter_sizes(v: dict[str, Any]) -> Iterator[FieldError]:
    # A k larger than what it selects from is a mistake the reference hides by clamping k.
    if v["method"] != "lbes":
        return
    limits = {"top_k_rewards": ("sampling.n", v["n"]),
              "bottom_k_rewards": ("sampling.n", v["n"]),
              "top_k_prompt_reward_var": ("data.data_batch_size", v["data_batch_size"]),
              "flat_top_k_rewards": ("data_batch_size * n", v["data_batch_size"] * v["n"]),
              "flat_bottom_k_rewards": ("data_batch_size * n", v["data_batch_size"] * v["n"])}
    for name, (what, limit) in limits.items():
        if v[name] is not None and v[name] > limit:
            yield FieldError(name, f"{_SPECS[name].path} must be <= {what} ({limit}), got "
                                   f"{v[name]}: lower it or raise {what}")


@_rule("method", "flat_corrcoef", "top_k_rewards", "bottom_k_rewards")
def _two_per_prompt(v: dict[str, Any]) -> Iterator[FieldError]:
    top, bottom = v["top_k_rewards"], v["bottom_k_rewards"]
    if v["method"] != "lbes" or v["flat_corrcoef"] or (top is None and bottom is None):
        return
    if (top or 0) + (bottom or 0) < 2:
        name = "top_k_rewards" if top is not None else "bottom_k_rewards"
        yield FieldError(name, f"lbes.{name} keeps 1 sample per prompt, but per-prompt "
                               "correlation needs 2: set top_k_rewards + bottom_k_rewards >= 2 "
                               "or flat_corrcoef true")


_LORA_OPTIONS = ("lora_rank", "lora_alpha", "lora_target_modules", "lora_target_layers",
                 "lora_noise_scaling", "lora_update")


@_rule("method", "perturbation", *_LORA_OPTIONS)
def _lora_options(v: dict[str, Any]) -> Iterator[FieldError]:
    from engine.lowrank.factors import parse_layers, parse_modules

    if v["perturbation"] == "full":
        for name in _LORA_OPTIONS:  # silently ignored otherwise
            if v[name] != _SPECS[name].default:
                yield FieldError(name, f"lora.{name} only applies to perturbation 'lora', got "
                                       f"{_show(v[name])}: remove it or set perturbation lora")
        return
    if v["method"] != "es":
        yield FieldError("perturbation", f"lora.perturbation 'lora' needs method es, got "
                                         f"{v['method']!r}: use perturbation full for lbes")
    for name, parse in (("lora_target_modules", parse_modules),
                        ("lora_target_layers", parse_layers)):
        try:
            parse(v[name])
        except ValueError as exc:
            yield FieldError(name, f"lora.{name} {exc}")


# ---------------------------------------------------------------------------- alignment rules


@_rule("reward_source", "scorer_url", "lambda_adapt", "ensemble_members")
def _reward_sources(v: dict[str, Any]) -> Iterator[FieldError]:
    members = [m.strip() for m in (v["ensemble_members"] or "").split(",") if m.strip()]
    if v["reward_source"] == "scorer" and v["scorer_url"] is None:
        yield FieldError("scorer_url", "alignment.scorer_url is required when reward_source "
                                       "is 'scorer', got None: e.g. http://127.0.0.1:8000")
    if v["lambda_adapt"] and v["scorer_url"] is None:
        yield FieldError("scorer_url", "alignment.scorer_url is required when lambda_adapt is "
                                       "true: lambda adapts to the scorer's costs")
    if v["reward_source"] == "ensemble" and len(members) < 2:
        yield FieldError("ensemble_members",
                         f"ensemble.ensemble_members must name at least 2 members when "
                         f"reward_source is 'ensemble', got {v['ensemble_members']!r}")
    if "scorer" in members and v["scorer_url"] is None:
        yield FieldError("ensemble_members", "ensemble.ensemble_members names `scorer` but "
                                             "alignment.scorer_url is None")
    for member in members:
        if member != "scorer" and not member.startswith(("http://", "https://")) and \
                not _DOTTED_PATH.match(member):
            yield FieldError("ensemble_members",
                             f"ensemble.ensemble_members: {member!r} is neither a dotted path, "
                             "`scorer` nor an http(s) URL")
    if v["reward_source"] != "ensemble" and members:
        yield FieldError("ensemble_members", "ensemble.ensemble_members is only read when "
                                             "reward_source is 'ensemble': remove it or set "
                                             "reward_source ensemble")


@_rule("lambda_min", "lambda_max")
def _lambda_range(v: dict[str, Any]) -> Iterator[FieldError]:
    if v["lambda_min"] > v["lambda_max"]:
        yield FieldError("lambda_min", f"alignment.lambda_min must be <= lambda_max "
                                       f"({v['lambda_max']:g}), got {v['lambda_min']:g}")


@_rule("macro_advantage", "scorer_url")
def _macro_with_cost(v: dict[str, Any]) -> Iterator[FieldError]:
    # macro_advantage shapes per-sample rewards and would ignore the cost term entirely.
    if v["macro_advantage"] and v["scorer_url"] is not None:
        yield FieldError("macro_advantage", "es.macro_advantage cannot be combined with "
                                            "alignment.scorer_url: it shapes rewards per sample "
                                            "and would ignore lambda * cost; set it false")
