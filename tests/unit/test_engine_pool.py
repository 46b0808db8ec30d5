"""EnginePool logic with a fake engine (no vLLM, no Ray)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from engine.backends import pool as pool_module
from engine.backends.base import (
    Completion,
    EngineLostError,
    EngineMismatchError,
    PerturbationEngine,
)
from engine.backends.pool import (
    EnginePool,
    cuda_mps_running,
    gpu_engine_threads,
    time_sliced_warnings,
)


class FakeEngine:
    """Records calls; its 'weights' are the current perturbation and an update log."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.current: tuple[int, float] | None = None
        self.updates: list[tuple[tuple[int, ...], tuple[float, ...]]] = []

    def generate(self, prompts, n=1, temperature=0.0, max_tokens=256, seed=None):
        self.calls.append(("generate", len(prompts)))
        tag = f"{self.current}"
        return [[Completion(f"{p[0]['content']}|{tag}", 1, True, (1,))] * n for p in prompts]

    def completion_logprobs(self, prompts, completions):
        return [-float(len(c)) for c in completions]

    def perturb(self, seed, scale):
        self.calls.append(("perturb", seed, scale))
        self.current = (seed, scale)

    def restore(self):
        self.calls.append(("restore",))
        self.current = None

    def update(self, seeds, coefficients):
        self.updates.append((tuple(seeds), tuple(coefficients)))

    def checksum(self):
        return str(self.updates)

    def save_hf(self, path):
        self.calls.append(("save_hf", path))

    def save_master(self, path):
        self.calls.append(("save_master", path))

    def load_master(self, path):
        self.calls.append(("load_master", path))

    def shutdown(self):
        self.calls.append(("shutdown",))


def messages(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def member_text(engine: PerturbationEngine) -> str:
    return engine.generate([messages("q")])[0][0].text


def test_fake_engine_satisfies_the_protocol():
    assert isinstance(FakeEngine(), PerturbationEngine)


def test_evaluate_runs_members_in_order_and_restores_once():
    engine = FakeEngine()
    pool = EnginePool.wrap(engine)
    results = pool.evaluate([(1, 0.1), (2, -0.1), (3, 0.1)], member_text)
    assert results == ["q|(1, 0.1)", "q|(2, -0.1)", "q|(3, 0.1)"]
    kinds = [c[0] for c in engine.calls]
    assert kinds == ["perturb", "generate", "perturb", "generate", "perturb", "generate", "restore"]
    assert set(pool.last_stats) == {"perturb_s", "restore_s"}


def test_evaluate_restores_when_a_member_fails():
    engine = FakeEngine()
    pool = EnginePool.wrap(engine)

    def failing(e):
        if e.current == (2, 0.1):
            raise RuntimeError("reward failed")
        return 0.0

    with pytest.raises(RuntimeError, match="reward failed"):
        pool.evaluate([(1, 0.1), (2, 0.1), (3, 0.1)], failing)
    assert engine.calls[-1] == ("restore",)
    assert engine.current is None


def test_one_engine_updates_without_hashing_and_mismatch_is_an_error(monkeypatch):
    engine = FakeEngine()
    pool = EnginePool.wrap(engine)
    monkeypatch.setattr(engine, "checksum", lambda: pytest.fail("one engine hashed"))
    pool.update([5, 6], [0.5, -0.5])
    assert engine.updates == [((5, 6), (0.5, -0.5))]
    error = EngineMismatchError(["aaaa", "bbbb"])
    assert "engine 1: bbbb" in str(error) and error.checksums == ["aaaa", "bbbb"]


def test_verify_in_sync_raises_on_disagreeing_engines(monkeypatch):
    pool = EnginePool.wrap(FakeEngine())
    monkeypatch.setattr(pool, "_actors", ["engine 0", "engine 1"])  # as if two Ray actors
    calls = []
    monkeypatch.setattr(pool, "broadcast", lambda method, *args: calls.append(method) or ["x", "y"])
    with pytest.raises(EngineMismatchError):
        pool.verify_in_sync()
    assert calls == ["checksum"]


def test_unperturbed_generation_and_logprobs_go_through_the_pool():
    engine = FakeEngine()
    pool = EnginePool.wrap(engine)
    out = pool.generate([messages("a"), messages("b")], n=2)
    assert [[c.text for c in cs] for cs in out] == [["a|None"] * 2, ["b|None"] * 2]
    assert pool.completion_logprobs([messages("a")], ["xyz"]) == [-3.0]
    with pytest.raises(ValueError, match="prompts"):
        pool.completion_logprobs([messages("a")], [])


def test_single_engine_pool_rejects_other_indexes():
    pool = EnginePool.wrap(FakeEngine())
    with pytest.raises(IndexError):
        pool.call_engine(1, "checksum")


def test_split_keeps_order_and_balances():
    assert pool_module._split(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert pool_module._split([1], 3) == [[1], [], []]


def test_cpu_bind_masks_give_engines_disjoint_cores():
    assert pool_module._cpu_bind_masks(2, [0, 1]) == ["0", "1"]
    assert pool_module._cpu_bind_masks(2, [0, 1, 2, 3]) == ["0,1", "2,3"]
    assert pool_module._cpu_bind_masks(3, [0, 1]) == ["0", "1", "0"]


def test_num_engines_must_be_positive():
    with pytest.raises(ValueError, match="num_engines"):
        EnginePool("model", num_engines=0)


def test_engines_per_gpu_must_be_positive():
    with pytest.raises(ValueError, match="engines_per_gpu"):
        EnginePool("model", num_engines=2, engines_per_gpu=0)


def engine_info(host: str, node_id: str, actor_id: str) -> dict[str, str]:
    """What an engine in a Ray actor reports (_EngineHost.info)."""
    return {
        "host": host,
        "device": "cpu",
        "device_name": "Intel(R) Xeon(R)",
        "node_id": node_id,
        "node_ip": "10.0.0.5",
        "actor_id": actor_id,
    }


def test_engine_places_tell_two_nodes_of_one_host_apart():
    one = pool_module.engine_place(engine_info("box", "3f2a1b9c" + "0" * 48, "a0"))
    other = pool_module.engine_place(engine_info("box", "77e0c4d1" + "0" * 48, "a1"))
    assert one == "box/cpu (Intel(R) Xeon(R)), Ray node 3f2a1b9c at 10.0.0.5"
    assert other != one and "Ray node 77e0c4d1" in other
    # an engine in this process has no Ray node
    assert pool_module.engine_place({"host": "box", "device": "cpu", "device_name": "x"}) == (
        "box/cpu (x)"
    )


def test_engine_places_name_each_engines_cards_as_the_machine_numbers_them():
    """Every engine in a Ray actor sees its card as cuda:0; the place names the card."""
    card = {"host": "box", "device": "cuda:0", "device_name": "NVIDIA H200"}
    assert pool_module.engine_place({**card, "gpus": ["2"]}) == "box/GPU 2 (NVIDIA H200)"
    assert pool_module.engine_place({**card, "gpus": ["2", "3"]}) == ("box/GPUs 2, 3 (NVIDIA H200)")
    assert pool_module.engine_place(card) == "box/cuda:0 (NVIDIA H200)"  # an older info


def test_a_worker_names_its_card_by_cuda_visible_devices(monkeypatch):
    torch = pytest.importorskip("torch")
    from engine.backends.vllm.worker_extension import _gpu_id

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert _gpu_id(torch.device("cuda:0")) == "2"
    assert _gpu_id(torch.device("cuda:1")) == "3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f3e")
    assert _gpu_id(torch.device("cuda:0")) == "GPU-8f3e"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert _gpu_id(torch.device("cuda:1")) == "1"
    assert _gpu_id(torch.device("cpu")) is None


class FakeActor:
    """A Ray actor handle whose calls return a placeholder reference."""

    def __init__(self) -> None:
        self.call = SimpleNamespace(remote=lambda *args: "ref")


def test_a_dead_actor_is_reported_as_the_lost_engine_and_where_it_ran(monkeypatch):
    import ray

    pool = EnginePool.wrap(FakeEngine())
    pool._local = None
    pool._actors = [FakeActor(), FakeActor()]
    pool.infos = [engine_info("box", "a" * 56, "actor0"), engine_info("box", "b" * 56, "actor1")]
    death = ray.exceptions.RayActorError(
        "actor1",
        "The actor died unexpectedly before finishing this task.\n"
        "\tclass_name: _EngineHost\n\tactor_id: actor1\n\tpid: 4242\n\tip: 10.0.0.5\n"
        "The actor died because its node has died. Node Id: " + "b" * 56 + "\n"
        "\tthe actor's node was terminated unexpectedly: health check failed",
    )

    def get(refs):
        raise death

    monkeypatch.setattr(ray, "get", get)
    with pytest.raises(EngineLostError) as caught:
        pool.broadcast("checksum")
    assert str(caught.value) == (
        "engine 1 of 2 (box/cpu (Intel(R) Xeon(R)), Ray node bbbbbbbb at 10.0.0.5) was lost: "
        "The actor died unexpectedly before finishing this task. The actor died because its "
        f"node has died. Node Id: {'b' * 56} the actor's node was terminated unexpectedly: "
        "health check failed"
    )
    assert caught.value.__cause__ is death


@pytest.mark.parametrize("node_dies", [True, False])
def test_an_unreachable_actor_waits_for_ray_to_say_whether_its_node_died(monkeypatch, node_dies):
    """A killed node answers "connection refused" before its missed health checks mark it
    dead: the lost engine's message names the dead node only once Ray has said so."""
    import ray

    from engine.backends import pool as pool_module

    actor = "01" * 16
    pool = EnginePool.wrap(FakeEngine())
    pool._local = None
    pool._actors = [FakeActor(), FakeActor()]
    pool.infos = [engine_info("box", "a" * 56, "actor0"), engine_info("box", "b" * 56, actor)]
    unreachable = ray.exceptions.ActorUnavailableError(
        "RPC Error message: failed to connect to remote host: Connection refused",
        bytes.fromhex(actor),
    )
    polls = []

    def nodes():
        polls.append(1)
        dead = node_dies and len(polls) > 1  # alive at the first look, dead at the second
        return [{"NodeID": "a" * 56, "Alive": True}, {"NodeID": "b" * 56, "Alive": not dead}]

    def get(refs):
        raise unreachable

    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr(ray, "nodes", nodes)
    monkeypatch.setattr(pool_module.time, "sleep", lambda s: None)
    monkeypatch.setattr(pool_module, "NODE_VERDICT_WAIT_S", 0.0 if not node_dies else 60.0)
    with pytest.raises(EngineLostError) as caught:
        pool.broadcast("checksum")
    message = str(caught.value)
    assert message.startswith(
        "engine 1 of 2 (box/cpu (Intel(R) Xeon(R)), Ray node bbbbbbbb at 10.0.0.5) was lost: "
    )
    assert "Connection refused" in message
    assert ("its Ray node has died" in message) is node_dies
    assert len(polls) == (2 if node_dies else 1)


def test_engines_on_gpus_share_the_machines_cores_out_not_ray_s_one_thread():
    assert gpu_engine_threads(2, cores=32) == {"OMP_NUM_THREADS": "16"}
    assert gpu_engine_threads(8, cores=4) == {"OMP_NUM_THREADS": "1"}
    given = {"ESLAB_GPU_ENGINE_THREADS": "6"}
    assert gpu_engine_threads(2, cores=32, environ=given) == {"OMP_NUM_THREADS": "6"}
    with pytest.raises(ValueError, match="ESLAB_GPU_ENGINE_THREADS must be a whole number"):
        gpu_engine_threads(2, environ={"ESLAB_GPU_ENGINE_THREADS": "half"})


def test_engines_sharing_a_gpu_without_mps_are_named_with_the_fix(tmp_path, monkeypatch):
    """Engines time-sliced on a card give little for their start time and memory: the run's
    events name the card and the command that starts CUDA MPS; a card under MPS is fine."""
    card = {"device": "cuda:0", "device_name": "H200"}
    infos = [{**card, "host": "gpu-a", "cuda_mps": False}] * 2
    infos += [{**card, "host": "gpu-b", "cuda_mps": True}] * 2
    (warning,) = time_sliced_warnings(infos)
    assert "gpu-a/cuda:0 (H200) without CUDA MPS" in warning
    assert "nvidia-cuda-mps-control -d" in warning

    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    (tmp_path / "control").touch()  # a daemon that quit leaves its socket behind
    assert not cuda_mps_running()
    pid_file = tmp_path / "nvidia-cuda-mps-control.pid"
    pid_file.write_text(f"{os.getpid()}\n")  # a live process
    assert cuda_mps_running()
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    pid_file.write_text(str(finished.pid))  # one that ended
    assert not cuda_mps_running()


def test_engines_that_start_at_once_scan_ports_of_their_own(monkeypatch):
    """vLLM picks its distributed store's port by asking the OS for a free one and binding
    it later; eight engines doing that at once collided on an H200 (EADDRINUSE)."""
    ports = pool_module.engine_ports(8)
    assert len(set(ports)) == 8
    gaps = {b - a for a, b in itertools.pairwise(ports)}
    assert gaps == {pool_module.PORTS_PER_ENGINE}
    assert ports[0] > 1024 and ports[-1] + pool_module.PORTS_PER_ENGINE <= 65_535
