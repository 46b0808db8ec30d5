"""The ES and LBES training loop, top to bottom: set up, then for each step perturb and
evaluate every member, shape the fitness, update, and report; evaluate and save by their
strategies; save the final model.

ES (VsonicV/es-at-scale, nlp-waseda/lbes `es_trainer.py`): a member's fitness is its mean
reward over the batch. LBES (nlp-waseda/lbes `lbes_trainer.py`): the unperturbed model
samples n completions per prompt, the filters keep the informative ones, and a member's
fitness is the correlation between those rewards and its log-likelihood of the samples.
Both update theta += lr / (N * sigma) * sum_i A_i * eps_i (shared/reference/seed-algorithms.md).

The trainer reports only through a Sink and touches weights only through an EnginePool.
"""

from __future__ import annotations

import functools
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from engine import metrics as mk
from engine.alignment.aligner import Aligner
from engine.backends.base import EvaluationStopped
from engine.backends.pool import EnginePool
from engine.batches import Batches, Position
from engine.config import RunConfig
from engine.data.datasets import Example, load_dataset
from engine.es import Member, population, update_coefficients, update_terms
from engine.fitness import macro_shape_fitness, shape_fitness
from engine.lbes import filter_rewards, member_correlations, reference_tiebreak
from engine.lowrank.population import LoraPopulation, engine_args
from engine.model_files import check_model_dir
from engine.noise import derive_seed
from engine.paths import resolve_path
from engine.schedules import schedule_value
from engine.scoring.batch import ScoredBatch
from engine.scoring.sources import RewardSources
from engine.sink import PopulationRecord, SampleRecord, Sink, StepReport
from engine.tasks import CompletionLogprobs, GenerateAndScore, SamplingSpec

STATE_FILE = "trainer_state.json"
MASTER_DIR = "master"


class TrainingStopped(Exception):
    """Raised after a stop asked for through `should_stop`, once the checkpoint is saved."""


@dataclass(frozen=True)
class TrainerState:
    """Everything besides the weights that a resumed run needs to continue exactly: all
    randomness derives from (seed, step, position), so no RNG state has to be kept."""

    global_step: int = 0
    epoch: int = 0
    batch: int = 0
    alignment: dict | None = None  # Aligner.snapshot(): lambda and its J_C average

    @property
    def position(self) -> Position:
        return Position(self.epoch, self.batch)


def train(config: RunConfig, sink: Sink, *, pool: EnginePool | None = None,
          resume_from: str | Path | None = None,
          should_stop: Callable[[], bool] | None = None) -> Path:
    """Run `config` to the end; returns the folder of the final model. `should_stop` is
    asked after every step: when it says yes, the step's checkpoint is saved (if the save
    strategy did not just save it) and TrainingStopped is raised (the worker's cancel)."""
    # -- setup
    train_set = load_dataset(resolve_path(config.data.train_file))
    eval_set = load_dataset(resolve_path(config.data.eval_file)) if config.data.eval_file else []
    batches = Batches(len(train_set), config.data.data_batch_size, config.data.seed)
    total_steps = config.total_steps(batches.per_epoch)
    output_dir = resolve_path(config.data.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    owns_pool = pool is None
    pool = pool or start_pool(config)
    lora = None
    try:
        if config.lora.perturbation == "lora":
            lora = LoraPopulation(config, resolve_path(config.model.model))
            sink.log_event("info", f"perturbation lora: rank {config.lora.lora_rank}, "
                           f"{len(lora.targets)} target modules, update {lora.mode}")
        state = TrainerState()
        if resume_from is not None:
            state = load_checkpoint(Path(resume_from), pool, lora)
            sink.log_event("info", f"resumed from {resume_from} at step {state.global_step}")
        aligner = Aligner.for_run(config, state.alignment)
        evaluating = config.eval.eval_strategy != "no"
        if evaluating and config.eval.eval_before_train and state.global_step == 0:
            sink.log_step(evaluate(config, pool, eval_set, step=0))

        # -- the loop
        saved = -1
        steps_without_progress = 0
        while state.global_step < total_steps:
            step_start = time.perf_counter()
            examples = [train_set[i] for i in batches.indices(state.position)]
            position, epoch_ended = batches.advance(state.position)
            noise_std, learning_rate = current_schedules(config, state.global_step, total_steps)
            step_fn = (functools.partial(es_step, lora=lora, aligner=aligner)
                       if config.method == "es" else lbes_step)
            try:
                report = step_fn(config, pool, examples, state.global_step, noise_std,
                                 learning_rate, stop=should_stop)
            except EvaluationStopped:
                # Stopped between members, before this step's update: the weights are still
                # those of the last finished step, which is what the checkpoint records.
                if saved != state.global_step:
                    sink.log_checkpoint(state.global_step, str(save_checkpoint(
                        config, pool, state, output_dir, lora, for_resume_only=True)))
                raise TrainingStopped(f"stopped during step {state.global_step + 1}, "
                                      f"checkpoint of step {state.global_step} saved") from None
            if report is None:
                # LBES found nothing informative: the step and the schedules do not advance.
                state = TrainerState(state.global_step, position.epoch, position.batch)
                steps_without_progress += 1
                sink.log_event("warning", f"step {state.global_step + 1} skipped: no sample "
                               "survived the LBES filters")
                if steps_without_progress >= batches.per_epoch:
                    raise RuntimeError("a whole epoch of batches was skipped by the LBES "
                                       "filters; loosen top_k_* / exclude_same_rewards_samples")
                continue
            steps_without_progress = 0
            state = TrainerState(state.global_step + 1, position.epoch, position.batch,
                                 aligner.snapshot() if aligner is not None else None)
            step = state.global_step
            report.metrics.update({mk.NOISE_STD: noise_std, mk.LEARNING_RATE: learning_rate,
                                   mk.EPOCH: position.epoch + position.batch / batches.per_epoch})
            if evaluating and _due(config.eval.eval_strategy, config.eval.eval_steps, step,
                                   epoch_ended, total_steps):
                evaluation = evaluate(config, pool, eval_set, step=step)
                report.metrics.update(evaluation.metrics)
                report.samples.extend(evaluation.samples)
            report.metrics[mk.time_key("step")] = time.perf_counter() - step_start
            if step % config.logging.logging_steps == 0 or step == total_steps:
                sink.log_step(StepReport(step=step, metrics=report.metrics,
                                         population=report.population, samples=report.samples))
            if config.eval.save_strategy != "no" and _due(
                    config.eval.save_strategy, config.eval.save_steps, step, epoch_ended,
                    total_steps):
                path = save_checkpoint(config, pool, state, output_dir, lora)
                sink.log_checkpoint(step, str(path))
                saved = step
            sink.heartbeat(step)
            if should_stop is not None and step < total_steps and should_stop():
                if saved != step:
                    sink.log_checkpoint(step, str(save_checkpoint(
                        config, pool, state, output_dir, lora, for_resume_only=True)))
                raise TrainingStopped(f"stopped after step {step}, checkpoint saved")

        # -- the final model
        pool.save_hf(str(output_dir))
        if lora is not None and (adapter := lora.save(output_dir)) is not None:
            sink.log_event("info", f"trained adapter saved to {adapter}")
        sink.log_event("info", f"final model saved to {output_dir}")
        return output_dir
    finally:
        if lora is not None:
            lora.close()
        if owns_pool:
            pool.shutdown()


def start_pool(config: RunConfig) -> EnginePool:
    m = config.model
    local = resolve_path(m.model)
    return EnginePool(
        str(local) if local.exists() else m.model, num_engines=m.num_engines,
        engines_per_gpu=m.engines_per_gpu, dtype=m.dtype,
        max_model_len=m.max_model_len, tensor_parallel_size=m.tensor_parallel_size,
        gpu_memory_utilization=m.gpu_memory_utilization, max_num_seqs=m.max_num_seqs,
        # False leaves the platform's choice (eager on the CPU, CUDA graphs on a GPU).
        enforce_eager=True if m.enforce_eager else None, seed=config.data.seed,
        extra_llm_args=engine_args(config) if config.lora.perturbation == "lora" else None)


def phase_timings(pool: EnginePool) -> dict[str, float]:
    """Perturb and restore seconds of the last population evaluation."""
    stats = pool.last_stats
    return {mk.time_key("perturb"): stats.get("perturb_s", 0.0),
            mk.time_key("restore"): stats.get("restore_s", 0.0)}


def current_schedules(config: RunConfig, step: int, total_steps: int) -> tuple[float, float]:
    es = config.es
    noise_std = schedule_value(es.noise_std_scheduler_type, es.noise_std, es.noise_std_final,
                               step, total_steps, rate=es.noise_std_scheduler_rate,
                               power=es.noise_std_scheduler_power)
    learning_rate = schedule_value(es.lr_scheduler_type, es.learning_rate, es.lr_final, step,
                                   total_steps, rate=es.lr_scheduler_rate,
                                   power=es.lr_scheduler_power)
    return noise_std, learning_rate


def _due(strategy: str, every: int | None, step: int, epoch_ended: bool, total: int) -> bool:
    if strategy == "steps":
        return step % (every or 1) == 0 or step == total
    return strategy == "epoch" and (epoch_ended or step == total)


# ---------------------------------------------------------------------------- ES


def es_step(config: RunConfig, pool: EnginePool, examples: list[Example], step: int,
            noise_std: float, learning_rate: float,
            stop: Callable[[], bool] | None = None,
            lora: LoraPopulation | None = None,
            aligner: Aligner | None = None) -> StepReport:
    """One ES step; with `lora` the members are low-rank adapters evaluated in one call."""
    members = population(config.data.seed, step, config.es.population_size,
                         config.es.antithetic)
    task = generate_task(config, examples, step, description=f"step {step + 1}")
    if lora is None:
        results: list[ScoredBatch] = pool.evaluate(
            [(m.seed, m.sign * noise_std) for m in members], task, stop=stop)
    else:
        if stop is not None and stop():
            raise EvaluationStopped("stopped before the population was evaluated")
        results = lora.evaluate(pool, members, noise_std, task, step)

    mean_rewards = np.array([r.fitness for r in results])  # [N]
    fitness = aligner.fitness(results) if aligner is not None else mean_rewards
    alignment_metrics, base_samples = {}, []
    if aligner is not None:
        # The unperturbed model on the same prompts, before the update (as the reference).
        base = task(pool)
        alignment_metrics = {**aligner.adapt(base),
                             **aligner.population_metrics(results, fitness)}
        base_samples = _samples(mk.TRAIN, examples, base, member=None)
    if config.es.macro_advantage:
        shaped = macro_shape_fitness(config.es.fitness_shaping,
                                     np.stack([r.rewards for r in results]))
    else:
        shaped = shape_fitness(config.es.fitness_shaping, fitness)
    update_seconds = apply_update(pool, members, shaped, learning_rate, noise_std, lora)

    metrics = {
        **({mk.LORA_RANK: float(lora.rank)} if lora is not None else {}),
        **_stats(mk.TRAIN, "reward", mean_rewards),
        **alignment_metrics,
        **_part_means(mk.TRAIN, results),
        **_completion_metrics(mk.TRAIN, results),
        **phase_timings(pool),
        mk.time_key("generation"): sum(r.timings["generation"] for r in results),
        mk.time_key("reward"): sum(r.timings["reward"] for r in results),
        mk.time_key("update"): update_seconds,
    }
    best, worst = int(np.argmax(fitness)), int(np.argmin(fitness))
    samples = [s for i in dict.fromkeys((best, worst))
               for s in _samples(mk.TRAIN, examples, results[i], member=i)] + base_samples
    records = _population(members, fitness, shaped)
    if aligner is not None:
        records = aligner.with_scores(records, results)
    return StepReport(step=step + 1, metrics=metrics, population=records, samples=samples)


def generate_task(config: RunConfig, examples: list[Example], step: int, *,
                  description: str) -> GenerateAndScore:
    # Every member samples with the same seed: common random numbers, so fitness differences
    # come from the perturbation and not from the sampling noise.
    sampling = SamplingSpec(n=config.sampling.n, temperature=config.sampling.temperature,
                            max_tokens=config.sampling.max_tokens,
                            seed=derive_seed(config.data.seed, step, "sampling"))
    return GenerateAndScore(prompts=[e.prompt for e in examples],
                            reward_func_args=[e.reward_func_args for e in examples],
                            reward_func_path=config.reward.reward_func_path,
                            sampling=sampling, description=description,
                            sources=RewardSources.from_config(config))


def apply_update(pool: EnginePool, members: list[Member], shaped: np.ndarray,
                 learning_rate: float, noise_std: float,
                 lora: LoraPopulation | None = None) -> float:
    start = time.perf_counter()
    coefficients = update_coefficients(shaped, [m.sign for m in members], learning_rate,
                                       noise_std)
    terms = update_terms(members, coefficients)
    if lora is None:
        pool.update([seed for seed, _ in terms], [c for _, c in terms])
    else:
        lora.update(pool, [seed for seed, _ in terms], [c for _, c in terms])
    return time.perf_counter() - start


# ---------------------------------------------------------------------------- LBES


def lbes_step(config: RunConfig, pool: EnginePool, examples: list[Example], step: int,
              noise_std: float, learning_rate: float,
              stop: Callable[[], bool] | None = None) -> StepReport | None:
    base_start = time.perf_counter()
    base = generate_task(config, examples, step, description=f"step {step + 1} (base model)")(
        pool)
    base_seconds = time.perf_counter() - base_start
    kept = filter_rewards(base.rewards, config.lbes, reference_tiebreak(config.data.seed, step))
    if kept.is_empty:
        return None

    members = population(config.data.seed, step, config.es.population_size,
                         config.es.antithetic)
    rows = np.argwhere(kept.kept)  # [K, 2]: (prompt, sample) of every kept sample
    task = CompletionLogprobs(prompts=[examples[b].prompt for b, _ in rows],
                              completions=[base.texts[b][j] for b, j in rows])
    logprob_start = time.perf_counter()
    per_member = pool.evaluate([(m.seed, m.sign * noise_std) for m in members], task,
                               stop=stop)
    logprob_seconds = time.perf_counter() - logprob_start
    logliks = np.full((len(members), *base.rewards.shape), np.nan)  # [N, B, n]
    for i, values in enumerate(per_member):
        logliks[i, rows[:, 0], rows[:, 1]] = values
    correlations = member_correlations(base.rewards, logliks, kept.kept,
                                       flat=config.lbes.flat_corrcoef)
    shaped = shape_fitness(config.es.fitness_shaping, correlations)
    update_seconds = apply_update(pool, members, shaped, learning_rate, noise_std)

    prompt_std = base.rewards.std(axis=1)  # [B]: "std" is across the n samples in LBES
    metrics = {
        **_stats(mk.TRAIN, "reward", base.rewards.reshape(-1)),
        mk.reward_key(mk.TRAIN, "reward", "std"): float(prompt_std.mean()),
        **_part_means(mk.TRAIN, [base]),
        **_completion_metrics(mk.TRAIN, [base]),
        **phase_timings(pool),
        mk.FRAC_REWARD_ZERO_STD: float(np.mean(prompt_std == 0)),
        mk.RETAINED_PROMPT_RATIO: kept.retained_prompt_ratio,
        mk.RETAINED_REWARD_RATIO: kept.retained_reward_ratio,
        mk.CORRELATION_MEAN: float(np.nanmean(correlations)) if np.isfinite(
            correlations).any() else float("nan"),
        mk.time_key("generation"): base_seconds,
        mk.time_key("reward"): base.timings["reward"],
        mk.time_key("logprobs"): logprob_seconds,
        mk.time_key("update"): update_seconds,
    }
    mean_loglik = np.full(base.rewards.shape, np.nan)  # [B, n]: population mean, kept only
    mean_loglik[kept.kept] = logliks[:, kept.kept].mean(axis=0)
    samples = _samples(mk.TRAIN, examples, base, member=None, kept=kept.kept,
                       dropped_by=kept.dropped_by, logprob=mean_loglik)
    return StepReport(step=step + 1, metrics={k: v for k, v in metrics.items()
                                              if np.isfinite(v)},
                      population=_population(members, correlations, shaped), samples=samples)


# ---------------------------------------------------------------------------- eval and save


def evaluate(config: RunConfig, pool: EnginePool, eval_set: list[Example],
             step: int) -> StepReport:
    """Greedy, one completion per prompt, the unperturbed model, the whole eval set."""
    start = time.perf_counter()
    task = GenerateAndScore(
        prompts=[e.prompt for e in eval_set],
        reward_func_args=[e.reward_func_args for e in eval_set],
        reward_func_path=config.reward.reward_func_path,
        sampling=SamplingSpec(n=1, temperature=0.0, max_tokens=config.sampling.max_tokens,
                              seed=config.data.seed),
        description=f"evaluation at step {step}", sources=RewardSources.from_config(config))
    result = task(pool)
    metrics = {**_stats(mk.EVAL, "reward", result.rewards.reshape(-1)),
               **_part_means(mk.EVAL, [result]),
               **_completion_metrics(mk.EVAL, [result]),
               mk.EVAL_RUNTIME: time.perf_counter() - start}
    return StepReport(step=step, metrics=metrics,
                      samples=_samples(mk.EVAL, eval_set, result, member=None))


def save_checkpoint(config: RunConfig, pool: EnginePool, state: TrainerState,
                    output_dir: Path, lora: LoraPopulation | None = None, *,
                    for_resume_only: bool = False) -> Path:
    """checkpoint-STEP/: the serving weights as a Hugging Face folder, the fp32 master copy
    for an exact resume, and the trainer state; only save_total_limit are kept.

    A stop (cancel) checkpoint is `for_resume_only`: master and state, no Hugging Face
    folder. Writing that folder takes seconds (3.4 s for the 135M model here) that a cancel
    should not wait for, and a resume reads only the master."""
    path = output_dir / f"checkpoint-{state.global_step}"
    partial = output_dir / f".checkpoint-{state.global_step}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    if not for_resume_only:
        pool.save_hf(str(partial))
    pool.save_master(str(partial / MASTER_DIR))
    if lora is not None:
        lora.save(partial)  # adapter mode: the trained adapter
    (partial / STATE_FILE).write_text(json.dumps({**asdict(state),
                                                  "config": config.to_flat()}, indent=2))
    shutil.rmtree(path, ignore_errors=True)
    partial.rename(path)  # a checkpoint folder is complete or absent, never half-written
    for old in list_checkpoints(output_dir)[:-config.eval.save_total_limit]:
        shutil.rmtree(old)
    return path


def list_checkpoints(output_dir: Path) -> list[Path]:
    found = [p for p in output_dir.glob("checkpoint-*") if (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def load_checkpoint(path: Path, pool: EnginePool,
                    lora: LoraPopulation | None = None) -> TrainerState:
    state_file = path / STATE_FILE
    if not state_file.is_file():
        raise FileNotFoundError(f"{path} is not a checkpoint: {STATE_FILE} is missing")
    data = json.loads(state_file.read_text())
    pool.load_master(str(path / MASTER_DIR))
    if lora is not None:
        lora.load(path)
    return TrainerState(global_step=data["global_step"], epoch=data["epoch"],
                        batch=data["batch"], alignment=data.get("alignment"))


# ---------------------------------------------------------------------------- reporting


def _stats(split: str, part: str, values: np.ndarray) -> dict[str, float]:
    values = np.asarray(values, dtype=np.float64)
    return {mk.reward_key(split, part, "mean"): float(values.mean()),
            mk.reward_key(split, part, "std"): float(values.std()),
            mk.reward_key(split, part, "min"): float(values.min()),
            mk.reward_key(split, part, "max"): float(values.max())}


def _part_means(split: str, results: list[ScoredBatch]) -> dict[str, float]:
    names = sorted({name for r in results for name in r.parts})
    return {mk.reward_key(split, name, "mean"): float(np.nanmean(
        np.concatenate([r.parts[name].reshape(-1) for r in results if name in r.parts])))
        for name in names}


def _completion_metrics(split: str, results: list[ScoredBatch]) -> dict[str, float]:
    tokens = np.concatenate([r.num_tokens.reshape(-1) for r in results])
    clipped = np.concatenate([r.clipped.reshape(-1) for r in results])
    return {mk.completion_key(split, "mean_length"): float(tokens.mean()),
            mk.completion_key(split, "min_length"): float(tokens.min()),
            mk.completion_key(split, "max_length"): float(tokens.max()),
            mk.completion_key(split, "clipped_ratio"): float(clipped.mean()),
            f"{split}/num_tokens": float(tokens.sum())}


def _population(members: list[Member], fitness: np.ndarray,
                shaped: np.ndarray) -> list[PopulationRecord]:
    def finite(x: float) -> float | None:
        return float(x) if np.isfinite(x) else None

    return [PopulationRecord(member=m.index, seed=m.seed, fitness=finite(f),
                             shaped_fitness=finite(a))
            for m, f, a in zip(members, fitness, shaped, strict=True)]


def render_prompt(messages: list[dict[str, str]]) -> str:
    return "\n\n".join(f"[{m['role']}] {m['content']}" for m in messages)


def _samples(split: str, examples: list[Example], batch: ScoredBatch, *, member: int | None,
             kept: np.ndarray | None = None, dropped_by: np.ndarray | None = None,
             logprob: np.ndarray | None = None) -> list[SampleRecord]:
    records = []
    for b, example in enumerate(examples):
        prompt = render_prompt(example.prompt)
        for j, text in enumerate(batch.texts[b]):
            parts = {k: float(v[b, j]) for k, v in batch.parts.items() if np.isfinite(v[b, j])}
            records.append(SampleRecord(
                split=split, prompt_index=b, sample_index=j, prompt=prompt, completion=text,
                reward=float(batch.rewards[b, j]), reward_parts=parts, member=member,
                logprob=float(logprob[b, j]) if logprob is not None and np.isfinite(
                    logprob[b, j]) else None,
                kept=bool(kept[b, j]) if kept is not None else None,
                dropped_by=dropped_by[b, j] if dropped_by is not None else None))
    return records


def plan_total_steps(config: RunConfig) -> int:
    """Check the inputs a run needs before it starts (datasets, reward function) and return
    its number of steps, so a bad run is refused before anything is stored or started."""
    from engine.rewards import load_reward_function

    sources = RewardSources.from_config(config)
    for path in [config.reward.reward_func_path, *(sources.members if sources else ())]:
        if path is not None and "." in path and not path.startswith(("http://", "https://")):
            load_reward_function(path)
    model = resolve_path(config.model.model)
    if model.exists() or config.model.model.startswith((".", "/", "data/")):
        check_model_dir(model)
    train_set = load_dataset(resolve_path(config.data.train_file))
    if config.data.eval_file:
        load_dataset(resolve_path(config.data.eval_file))
    return config.total_steps(Batches(len(train_set), config.data.data_batch_size,
                                      config.data.seed).per_epoch)
