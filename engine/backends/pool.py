"""EnginePool: population members spread over one or more perturbation engines.

One engine runs in this process. More run one per Ray actor (`num_cpus=1` on the CPU,
`num_gpus=tensor_parallel_size` on GPUs), one per node where the cluster has the room (a
SPREAD placement group), and members are handed out dynamically: whichever engine finishes
first takes the next member (`ray.wait`), as in the ES-at-Scale vLLM version. Engines never
exchange weights: each applies the same (seed, coefficient) update itself, and a checksum
comparison after every update proves they still agree (OpenAI ES, Salimans et al. 2017:
workers share only seeds and scalars). An engine that is lost (its node left the cluster)
fails the call with EngineLostError, which names it and where it ran.

An engine moves from one member to the next without restoring in between, because
`perturb` rewrites every weight from the unperturbed snapshot; it restores once, after its
last member (also when a member fails). That saves one weight copy per member, about a
third of the perturbation overhead on the CPU.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any, TypeVar

from engine.backends.base import (
    Completion,
    EngineError,
    EngineLostError,
    EngineMismatchError,
    EvaluationStopped,
    PerturbationEngine,
    Prompt,
)
from engine.backends.ray_auth import local_cluster

R = TypeVar("R")

Member = tuple[int, float]
"""(seed, scale): the member's perturbation is scale * eps(seed)."""

PLACEMENT_TIMEOUT_S = 300.0
"""How long the engines' placement group may wait for the cluster to hold all of them."""


class _EngineHost:
    """Holds one engine; in a Ray actor when the pool has several."""

    def __init__(self, engine_options: dict[str, Any], env: dict[str, str]) -> None:
        os.environ.update(env)
        from engine.backends.vllm.engine import VLLMEngine

        self.engine = VLLMEngine(**engine_options)

    def info(self) -> dict[str, Any]:
        """The engine's info plus its Ray node and actor: several nodes of one machine share
        a host name, and a lost engine is known by its actor id."""
        import ray

        context = ray.get_runtime_context()
        return {
            **self.engine.info,
            "cuda_mps": cuda_mps_running(),
            "node_id": context.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "actor_id": context.get_actor_id(),
        }

    def run_member(
        self, seed: int, scale: float, work: Callable[[PerturbationEngine], Any]
    ) -> tuple[float, Any]:
        start = time.perf_counter()
        self.engine.perturb(seed, scale)
        perturb_s = time.perf_counter() - start
        return perturb_s, work(self.engine)

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.engine, method)(*args)


class EnginePool:
    """Members over engines; also generation and log-likelihoods of the unperturbed model."""

    def __init__(
        self,
        model: str,
        *,
        num_engines: int = 1,
        engines_per_gpu: int = 1,
        in_actors: bool = False,
        one_node: bool = False,
        **engine_options: Any,
    ) -> None:
        """Start `num_engines` engines of `model`; `engine_options` go to VLLMEngine.

        engines_per_gpu > 1 lets several engines (processes) share each GPU, so that several
        members generate at once (see _start_actors). One engine runs in this process unless
        `in_actors` (a Ray job that holds no GPU of its own: engine/backends/arrangement.py).
        `one_node` keeps the engines on one node (auto's engines of one card) where they
        would otherwise spread over the cluster's nodes.
        """
        if num_engines < 1:
            raise ValueError(f"num_engines must be at least 1, got {num_engines}")
        if engines_per_gpu < 1:
            raise ValueError(f"engines_per_gpu must be at least 1, got {engines_per_gpu}")
        options = {"model": str(model), **engine_options}
        self.last_stats: dict[str, float] = {}
        self._owns_ray = False
        self._actors: list[Any] = []
        self._group: Any = None  # the engines' placement group (Ray)
        self.infos: list[dict[str, Any]] = []
        self.warnings: list[str] = []  # for the run's events: an arrangement that runs slow
        self._local: PerturbationEngine | None = None
        if num_engines == 1 and not in_actors:
            from engine.backends.vllm.engine import VLLMEngine

            self._local = VLLMEngine(**options)
        else:
            self._start_actors(num_engines, options, engines_per_gpu, one_node)

    @classmethod
    def wrap(cls, engine: PerturbationEngine) -> EnginePool:
        """A pool over one engine that already exists (a shared test engine, or a fake)."""
        pool = cls.__new__(cls)
        pool.last_stats = {}
        pool._owns_ray = False
        pool._actors = []
        pool._group = None
        pool.infos = []
        pool.warnings = []
        pool._local = engine
        return pool

    @property
    def num_engines(self) -> int:
        return len(self._actors) if self._actors else 1

    def devices(self) -> list[str]:
        """Where each engine computes, in engine order (see `engine_place`)."""
        infos = self.infos if self._actors else [getattr(self._local, "info", {})]
        return [engine_place(info) for info in infos]

    # ---- population evaluation ----------------------------------------------------------------

    def evaluate(
        self,
        members: Sequence[Member],
        work: Callable[[PerturbationEngine], R],
        stop: Callable[[], bool] | None = None,
    ) -> list[R]:
        """For each member: perturb(seed, scale), then work(engine); results in member order.

        `work` must be picklable (a module-level function or a functools.partial of one) and
        return something small (rewards, texts), never weights. Every engine is restored
        afterwards, also when a member fails. `last_stats` then holds the summed perturb
        and restore seconds. `stop` is asked before each member is handed out: when it says
        yes, no further member starts, the members in flight finish, every engine is
        restored and EvaluationStopped is raised (a cancelled run stops within one member).
        """
        asked = stop or (lambda: False)
        if self._local is not None:
            return self._evaluate_local(members, work, asked)
        return self._evaluate_actors(members, work, asked)

    def _evaluate_local(
        self, members: Sequence[Member], work: Callable[..., R], stop: Callable[[], bool]
    ) -> list[R]:
        engine = self._local
        assert engine is not None
        results: list[R] = []
        perturb_s = 0.0
        try:
            for seed, scale in members:
                if stop():
                    raise EvaluationStopped(f"stopped after {len(results)} members")
                start = time.perf_counter()
                engine.perturb(seed, scale)
                perturb_s += time.perf_counter() - start
                results.append(work(engine))
        finally:
            start = time.perf_counter()
            engine.restore()
            restore_s = time.perf_counter() - start
        self.last_stats = {"perturb_s": perturb_s, "restore_s": restore_s}
        return results

    def _evaluate_actors(
        self, members: Sequence[Member], work: Callable[..., R], stop: Callable[[], bool]
    ) -> list[R]:
        import ray

        work_ref = ray.put(work)
        queue = iter(enumerate(members))
        pending: dict[Any, tuple[int, int]] = {}
        results: dict[int, R] = {}
        perturb_s = 0.0

        def hand_next(actor_index: int) -> None:
            item = None if stop() else next(queue, None)
            if item is not None:
                index, (seed, scale) = item
                actor = self._actors[actor_index]
                ref = actor.run_member.remote(int(seed), float(scale), work_ref)
                pending[ref] = (actor_index, index)

        try:
            for actor_index in range(len(self._actors)):
                hand_next(actor_index)
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                actor_index, index = pending.pop(done[0])
                seconds, results[index] = self._get(done[0])
                perturb_s += seconds
                hand_next(actor_index)
            if len(results) < len(members):
                raise EvaluationStopped(f"stopped after {len(results)} members")
        finally:
            if pending:  # a member failed: let the others finish before restoring
                ray.wait(list(pending), num_returns=len(pending))
            start = time.perf_counter()
            self._get([actor.call.remote("restore") for actor in self._actors])
            restore_s = time.perf_counter() - start
        self.last_stats = {"perturb_s": perturb_s, "restore_s": restore_s}
        return [results[i] for i in range(len(members))]

    # ---- the unperturbed model, split over engines ----------------------------------------------

    def generate(
        self,
        prompts: Sequence[Prompt],
        n: int = 1,
        temperature: float = 0.0,
        max_tokens: int = 256,
        seed: int | None = None,
        adapters: Sequence[int | str | None] | None = None,
    ) -> list[list[Completion]]:
        """Completions of the unperturbed model, prompts split evenly over the engines;
        `adapters` optionally names a LoRA per prompt (multi-LoRA engines): a member slot
        (see set_lora_members) or a PEFT folder."""
        parts = _split(list(prompts), self.num_engines)
        args = [(p, n, temperature, max_tokens, seed) for p in parts]
        if adapters is not None:
            args = [
                (*a, part)
                for a, part in zip(args, _split(list(adapters), self.num_engines), strict=True)
            ]
        outs = self._scatter("generate", args)
        return [c for out in outs for c in out]

    def set_lora_members(
        self,
        members: Mapping[int, tuple[int, float]],
        adapters: Sequence[int],
        spec: dict[str, Any],
    ) -> None:
        """Write members (slot -> (seed, scale)) into the LoRA slots of the engines that
        serve them: `adapters` is the per-prompt slot list that `generate` will get, and
        each engine gets the members of its part of it."""
        parts = _split(list(adapters), self.num_engines)
        self._scatter(
            "set_lora_members",
            [([(slot, *members[slot]) for slot in dict.fromkeys(part)], spec) for part in parts],
        )

    def completion_logprobs(
        self,
        prompts: Sequence[Prompt],
        completions: Sequence[str | Sequence[int]],
        adapters: Sequence[int | str | None] | None = None,
    ) -> list[float]:
        """Mean completion log-probabilities under the unperturbed model, split over engines;
        `adapters` as in generate."""
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        k = self.num_engines
        args: list[tuple[Any, ...]] = list(
            zip(_split(list(prompts), k), _split(list(completions), k), strict=True)
        )
        if adapters is not None:
            args = [(*a, part) for a, part in zip(args, _split(list(adapters), k), strict=True)]
        return [x for out in self._scatter("completion_logprobs", args) for x in out]

    # ---- weights on every engine ----------------------------------------------------------------

    def broadcast(self, method: str, *args: Any) -> list[Any]:
        """Call `method(*args)` on every engine (in parallel); results in engine order."""
        if self._local is not None:
            return [getattr(self._local, method)(*args)]
        return self._get([actor.call.remote(method, *args) for actor in self._actors])

    def call_engine(self, index: int, method: str, *args: Any) -> Any:
        """Call `method(*args)` on engine `index` alone (tests and diagnostics)."""
        if self._local is not None:
            if index != 0:
                raise IndexError(f"engine {index} does not exist; the pool has one engine")
            return getattr(self._local, method)(*args)
        return self._get(self._actors[index].call.remote(method, *args))

    def update(self, seeds: Sequence[int], coefficients: Sequence[float]) -> None:
        """Apply the same update on every engine, then prove they agree."""
        self.broadcast("update", [int(s) for s in seeds], [float(c) for c in coefficients])
        self.verify_in_sync()

    def verify_in_sync(self) -> None:
        """EngineMismatchError when the engines' checksums differ. One engine has nothing to
        agree with, so nothing is hashed (on a GPU machine's CPU that was 0.76 s a step for
        135M parameters, 8.2 s for 1.07B)."""
        if self.num_engines > 1:
            self.checksum()

    def checksum(self) -> str:
        """The engines' common checksum; EngineMismatchError when any differs."""
        checksums = self.broadcast("checksum")
        if len(set(checksums)) != 1:
            raise EngineMismatchError(checksums)
        return checksums[0]

    def save_hf(self, path: str) -> None:
        """Write the unperturbed model from engine 0 (all engines hold the same weights)."""
        self.call_engine(0, "save_hf", str(path))

    def save_master(self, path: str) -> None:
        self.call_engine(0, "save_master", str(path))

    def load_master(self, path: str) -> None:
        self.broadcast("load_master", str(path))
        self.verify_in_sync()

    def shutdown(self) -> None:
        if self._local is not None:
            self._local.shutdown()
            self._local = None
        if self._actors:
            import ray
            from ray.util.placement_group import remove_placement_group

            try:
                ray.get([actor.call.remote("shutdown") for actor in self._actors])
            except ray.exceptions.RayActorError:
                pass  # a lost engine has nothing left to release; the others are killed below
            finally:
                for actor in self._actors:
                    ray.kill(actor)
                self._actors = []
                if self._group is not None:
                    remove_placement_group(self._group)
                    self._group = None
                if self._owns_ray:
                    ray.shutdown()

    # ---- Ray plumbing ------------------------------------------------------------------------

    def _start_actors(
        self,
        num_engines: int,
        options: dict[str, Any],
        engines_per_gpu: int = 1,
        one_node: bool = False,
    ) -> None:
        """One Ray actor per engine. On GPUs each asks for tensor_parallel_size /
        engines_per_gpu GPUs, so engines_per_gpu of them share a card; they then split its
        memory (gpu_memory_utilization None becomes 0.9 / engines_per_gpu) and start one
        after another, since vLLM sizes its KV cache from the memory free while it profiles
        and a neighbour starting at the same moment would skew that. Given a KV cache size
        (kv_cache_memory_bytes in extra_llm_args, as auto gives it), vLLM sizes nothing from
        the free memory, so they start at once.

        Engines of one card or CPU each are placed by a SPREAD placement group (see
        `_engine_group`), or a STRICT_PACK one with `one_node`. An engine of
        tensor_parallel_size > 1 is left to Ray's default placement: its vLLM places its
        ranks with a placement group of its own (one GPU a bundle), and inside a group of
        ours it would take ours instead."""
        import ray

        if not ray.is_initialized():
            # a cluster of this run's own (in a Ray job, RAY_ADDRESS names the job's cluster)
            own = local_cluster() if not os.environ.get("RAY_ADDRESS") else nullcontext()
            with own:
                ray.init(ignore_reinit_error=True, log_to_driver=False, include_dashboard=False)
            self._owns_ray = True
        tp = int(options.get("tensor_parallel_size", 1))
        on_gpu = ray.cluster_resources().get("GPU", 0) > 0
        shared = on_gpu and engines_per_gpu > 1
        serial = shared and "kv_cache_memory_bytes" not in (options.get("extra_llm_args") or {})
        resources = {"num_cpus": 1, "num_gpus": tp / engines_per_gpu if on_gpu else 0}
        if shared and options.get("gpu_memory_utilization") is None:
            options = {**options, "gpu_memory_utilization": 0.9 / engines_per_gpu}
        binds = [] if on_gpu else _cpu_bind_masks(num_engines, sorted(os.sched_getaffinity(0)))
        env_vars = {**actor_env(), **(gpu_engine_threads(num_engines) if on_gpu else {})}
        host_cls = ray.remote(**resources)(_EngineHost)
        strategy = "STRICT_PACK" if one_node else "SPREAD"
        self._group = _engine_group(num_engines, resources, strategy) if tp == 1 else None
        ports = engine_ports(num_engines) if not serial else [None] * num_engines
        for i in range(num_engines):
            env = {"VLLM_CPU_OMP_THREADS_BIND": binds[i]} if binds else {}
            if ports[i] is not None:
                env["VLLM_PORT"] = str(ports[i])
            actor = host_cls.options(
                runtime_env={"env_vars": env_vars}, **_bundle(self._group, i)
            ).remote(options, env)
            self._actors.append(actor)
            if serial:  # wait until it has profiled its memory before the next one starts
                ray.wait([actor.info.remote()], num_returns=1)
        try:
            self.infos = ray.get([actor.info.remote() for actor in self._actors])
        except Exception as exc:
            self.shutdown()
            raise EngineError(f"starting {num_engines} engines on Ray failed: {exc}") from exc
        if shared:
            self.warnings += time_sliced_warnings(self.infos)

    def _scatter(self, method: str, arg_lists: Sequence[tuple[Any, ...]]) -> list[Any]:
        """method(*args_i) on engine i, in parallel, for the non-empty argument lists."""
        if self._local is not None:
            return [getattr(self._local, method)(*arg_lists[0])]
        refs = [
            self._actors[i].call.remote(method, *args)
            for i, args in enumerate(arg_lists)
            if len(args[0]) > 0
        ]
        return self._get(refs)

    def _get(self, refs: Any) -> Any:
        """ray.get, with an engine whose actor died (its node left the cluster, its process
        was killed) named: EngineLostError says which engine it was and where it ran,
        where Ray's own error names an actor id and a node id only."""
        import ray

        try:
            return ray.get(refs)
        except ray.exceptions.RayActorError as exc:
            raise EngineLostError(self._lost_engine(exc)) from exc

    def _lost_engine(self, exc: Any) -> str:
        import ray

        ids = [info.get("actor_id") for info in self.infos]
        cause = _actor_death(exc)
        if exc.actor_id not in ids:
            return f"an engine (Ray actor {exc.actor_id}) was lost: {cause}"
        index = ids.index(exc.actor_id)
        # An unavailable actor is one Ray could not reach and has not yet called dead: a
        # killed node answers "connection refused" until its missed health checks mark it
        # dead. The run fails either way (the engine's perturbed weights are gone with the
        # call); the wait only finds the cause to name.
        if isinstance(exc, ray.exceptions.ActorUnavailableError) and _node_died(
            self.infos[index].get("node_id"), NODE_VERDICT_WAIT_S
        ):
            cause = f"its Ray node has died ({cause})"
        return f"engine {index} of {len(ids)} ({self.devices()[index]}) was lost: {cause}"


def _split(items: list[Any], parts: int) -> list[list[Any]]:
    """Contiguous, nearly equal parts (the first ones one longer), order preserved."""
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        stop = start + size + (1 if i < extra else 0)
        out.append(items[start:stop])
        start = stop
    return out


PORTS_PER_ENGINE = 50
"""Ports each engine may scan from its own VLLM_PORT (vLLM takes a few: its distributed
store, ZMQ sockets)."""


def engine_ports(num_engines: int) -> list[int]:
    """A first port for each of `num_engines` engines that start at the same moment, each
    PORTS_PER_ENGINE apart. Without them every engine asks the OS for a free port, checks it
    and closes it before it binds it again: measured on an H200, the second of two runs of 8
    engines starting at once failed with EADDRINUSE on vLLM's distributed store. The base is
    a port the OS has just called free, so concurrent runs start far apart too."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        base = probe.getsockname()[1]
    span = PORTS_PER_ENGINE * num_engines
    if base + span > 65_535:
        base = 20_000 + base % 10_000
    return [base + PORTS_PER_ENGINE * i for i in range(num_engines)]


def actor_env() -> dict[str, str]:
    """Environment of this project's Ray actors and tasks: PYTHONPATH with the project root
    first, so that they import ES Lab as this process does."""
    project_root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    path = os.pathsep.join(p for p in (project_root, os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path}


GPU_THREADS_VARIABLE = "ESLAB_GPU_ENGINE_THREADS"


def gpu_engine_threads(
    num_engines: int, cores: int | None = None, environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """OMP_NUM_THREADS for engines on GPUs in Ray actors: this machine's cores shared out,
    or ESLAB_GPU_ENGINE_THREADS each where it is set.

    Ray gives an actor of one CPU OMP_NUM_THREADS=1, and a vLLM engine's host side (its
    scheduler, sampling metadata, detokenizing) then slows its generation: on two H100s an
    engine generated a member of a 1.07B model in 0.33 s with 1 thread against 0.27 s with 8,
    and the in-process engine of a pool of one (all the machine's threads) in 0.25 s. On four
    H200s, engines of 16 and 32 threads each generated 10-19% slower than one alone, which
    the variable lets an operator (or bench/gpu/utilization.py) try other counts against."""
    given = environ.get(GPU_THREADS_VARIABLE)
    if given is not None:
        if not given.strip().isdigit() or int(given) < 1:
            raise ValueError(f"{GPU_THREADS_VARIABLE} must be a whole number from 1, got {given!r}")
        return {"OMP_NUM_THREADS": str(int(given))}
    cores = cores or len(os.sched_getaffinity(0))
    return {"OMP_NUM_THREADS": str(max(1, cores // max(1, num_engines)))}


MPS_PIPE_DIRECTORY = "/tmp/nvidia-mps"


def cuda_mps_running() -> bool:
    """Whether a CUDA MPS control daemon runs where this process's CUDA clients look for it
    (CUDA_MPS_PIPE_DIRECTORY, /tmp/nvidia-mps by default): its pid file there names a live
    process. Its `control` socket alone says nothing, as the daemon leaves it behind when it
    quits (seen on an H200). Engines sharing a card run their kernels at once under MPS and
    take turns without it: on one H200, 4 engines of a 1.07B model gave 3.4x one engine's
    members/s under MPS and 1.09x without (docs/benchmarks.md)."""
    pipes = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or MPS_PIPE_DIRECTORY
    try:
        pid = int(Path(pipes, "nvidia-cuda-mps-control.pid").read_text().strip())
        os.kill(pid, 0)
    except PermissionError:
        return True  # alive, another user's daemon
    except (OSError, ValueError):
        return False
    return True


def time_sliced_warnings(infos: Sequence[Mapping[str, Any]]) -> list[str]:
    """One warning per GPU (`engine_place`) whose engines share it without CUDA MPS (they are
    time-sliced: they add start time and memory and little speed), naming the command that
    fixes it."""
    slow = sorted({engine_place(info) for info in infos if not info.get("cuda_mps")})
    return [
        f"engines share {place} without CUDA MPS, so they take turns on it rather than "
        "running at once; start the MPS daemon on that machine (nvidia-cuda-mps-control -d) "
        "before the run, or give each engine a GPU of its own (engines_per_gpu: 1)"
        for place in slow
    ]


def _cpu_bind_masks(num_engines: int, cores: Sequence[int]) -> list[str]:
    """VLLM_CPU_OMP_THREADS_BIND per engine: disjoint core sets while there are enough cores.

    vLLM's automatic binding would put every engine's threads on the same cores.
    """
    cores = list(cores) or [0]
    if len(cores) < num_engines:
        return [str(cores[i % len(cores)]) for i in range(num_engines)]
    return [",".join(str(c) for c in part) for part in _split(cores, num_engines)]


def engine_place(info: Mapping[str, Any]) -> str:
    """Where an engine computes, from its info: host, device and the card's or CPU's name
    (`gpu-a/GPU 2 (NVIDIA H100 80GB HBM3)`, `GPUs 2, 3` for an engine of tensor parallel
    ranks, the machine's own numbering; `node/cpu (Xeon)`), and for an engine in a Ray
    actor its node's short id and address (`, Ray node 3f2a1b9c at 10.0.0.5`): two nodes
    may share a host name (several raylets on one machine, containers)."""
    gpus = [str(g) for g in info.get("gpus") or ()]
    where = f"GPU{'s' if len(gpus) > 1 else ''} {', '.join(gpus)}" if gpus else None
    device = f"{where or info.get('device', '?')} ({info.get('device_name', 'unknown')})"
    place = f"{info.get('host', '?')}/{device}"
    if info.get("node_id"):
        place += f", Ray node {info['node_id'][:8]} at {info.get('node_ip', '?')}"
    return place


def _engine_group(
    num_engines: int, resources: Mapping[str, float], strategy: str = "SPREAD"
) -> Any:
    """A placement group of one bundle per engine. SPREAD (the default): each engine on a
    node of its own while the cluster has nodes with room for one, several on a node only
    when it must (a one-machine cluster keeps running several engines). STRICT_PACK: all on
    one node, where Ray gives fractional GPUs from one card while it has room. All bundles
    are reserved together, so no engine loads its model while another has nowhere to go."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    bundle = {"CPU": float(resources["num_cpus"])}
    if resources.get("num_gpus"):
        bundle["GPU"] = float(resources["num_gpus"])
    group = placement_group([bundle] * num_engines, strategy=strategy)
    try:
        ray.get(group.ready(), timeout=PLACEMENT_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        raise EngineError(
            f"the Ray cluster found no room for {num_engines} engines of {bundle} each within "
            f"{PLACEMENT_TIMEOUT_S:.0f} s (its nodes have {ray.available_resources()} free): "
            "lower num_engines, or add nodes"
        ) from None
    return group


def _bundle(group: Any, index: int) -> dict[str, Any]:
    """The actor options that put engine `index` in its bundle of `group` (none without)."""
    if group is None:
        return {}
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=index
        )
    }


NODE_VERDICT_WAIT_S = 30.0
"""How long a lost engine's call waits for Ray to say whether the engine's node died: Ray's
default health checks (every 3 s, 5 missed) take about 15 s to decide."""


def _node_died(node_id: str | None, wait_s: float) -> bool:
    """Whether Ray's control store marks the node dead (or no longer knows it) within
    wait_s seconds."""
    import ray

    if node_id is None:
        return False
    deadline = time.monotonic() + wait_s
    while True:
        alive = {node["NodeID"]: node["Alive"] for node in ray.nodes()}
        if not alive.get(node_id, False):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)


_ACTOR_DETAILS = re.compile(r"\s*(class_name|actor_id|pid|name|namespace|ip):")


def _actor_death(exc: BaseException) -> str:
    """Ray's account of an actor's death on one line, without the actor's particulars
    (class, ids, pid), which EngineLostError says in its own words."""
    lines = [line.strip() for line in str(exc).splitlines()]
    return " ".join(line for line in lines if line and not _ACTOR_DETAILS.match(line))
