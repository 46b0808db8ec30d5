"""On a GPU cluster a run of one engine computes inside its Ray job, so the job itself must
hold that engine's GPUs: otherwise two runs on a machine of two GPUs both compute on the
first. Ray is a recording stand-in (what is asked of it is the point); the end-to-end runs
on real GPUs are bench/product_path.py's."""

from __future__ import annotations

from jobs.scheduler import Scheduler, SchedulerSettings, job_gpus, run_demand
from tests.jobs.helpers import SubmittingRay, queue_run


def test_a_one_engine_job_holds_its_gpus_and_a_several_engine_job_none(sqlite_store, tmp_path):
    queue_run(sqlite_store, tmp_path / "a", name="one", num_engines=1)
    queue_run(sqlite_store, tmp_path / "b", name="split", tensor_parallel_size=2)
    queue_run(sqlite_store, tmp_path / "c", name="actors", num_engines=2)
    ray = SubmittingRay({"CPU": 32.0, "GPU": 8.0})
    Scheduler(sqlite_store, ray, SchedulerSettings(max_concurrent_runs=3)).tick()
    # "split" is auto: an engine of two GPUs gets them to itself, inside its job
    assert ray.job_gpus == {"one": 1.0, "split": 2.0, "actors": 0.0}


def test_an_auto_run_takes_one_card_and_its_engines_ask_for_it(sqlite_store, tmp_path):
    """engines auto (the default) choose their number inside the job, from the card: the
    scheduler counts one card for the run, and the job holds none (its engines are actors
    that ask for their shares of the card), so a second auto run waits for a card."""
    assert run_demand({"num_engines": "auto", "engines_per_gpu": "auto"}, gpus=True) == {"GPU": 1.0}
    assert job_gpus({"num_engines": "auto", "engines_per_gpu": "auto"}, gpus=True) == 0.0
    assert run_demand({"num_engines": "auto"}, gpus=False) == {"CPU": 1.0}
    queue_run(sqlite_store, tmp_path / "a", name="first")
    queue_run(sqlite_store, tmp_path / "b", name="second")
    ray = SubmittingRay({"CPU": 16.0, "GPU": 1.0})
    Scheduler(sqlite_store, ray, SchedulerSettings(max_concurrent_runs=2)).tick()
    assert ray.job_gpus == {"first": 0.0}


def test_a_cpu_cluster_gives_jobs_no_gpus():
    assert job_gpus({"num_engines": 1}, gpus=False) == 0.0
    assert job_gpus({"tensor_parallel_size": 2}, gpus=False) == 0.0


def test_engines_sharing_a_gpu_ask_for_their_share_of_it(sqlite_store, tmp_path):
    """Four engines sharing one card (CUDA MPS's fast arrangement) need one GPU, as their
    actors ask for a quarter each: asking for four left such a run queued for ever on a
    machine of one GPU."""
    assert run_demand({"num_engines": 4, "engines_per_gpu": 4}, gpus=True) == {"GPU": 1.0}
    assert run_demand({"num_engines": 8, "engines_per_gpu": 4}, gpus=True) == {"GPU": 2.0}
    two_ranks = {"num_engines": 2, "engines_per_gpu": 2, "tensor_parallel_size": 2}
    assert run_demand(two_ranks, gpus=True) == {"GPU": 2.0}
    assert run_demand({"num_engines": 1, "engines_per_gpu": 4}, gpus=True) == {"GPU": 1.0}
    assert run_demand({"num_engines": 4, "engines_per_gpu": 4}, gpus=False) == {"CPU": 4.0}
    queue_run(sqlite_store, tmp_path / "a", name="shared", num_engines=4, engines_per_gpu=4)
    ray = SubmittingRay({"CPU": 16.0, "GPU": 1.0})
    Scheduler(sqlite_store, ray, SchedulerSettings(max_concurrent_runs=2)).tick()
    assert ray.job_gpus == {"shared": 0.0}


def test_a_run_too_big_for_the_cluster_is_said_once_and_does_not_block_the_queue(
    sqlite_store, tmp_path
):
    big = queue_run(sqlite_store, tmp_path / "a", name="big", num_engines=4, engines_per_gpu=1)
    queue_run(sqlite_store, tmp_path / "b", name="small", num_engines=1)
    ray = SubmittingRay({"CPU": 16.0, "GPU": 1.0})
    scheduler = Scheduler(sqlite_store, ray, SchedulerSettings(max_concurrent_runs=2))
    scheduler.tick()
    scheduler.tick()
    assert ray.submitted == ["small"]
    warnings = [e.message for e in sqlite_store.events(big.id) if e.level == "warning"]
    assert warnings == [
        "waiting: the run needs 4 GPU but the Ray cluster has 1 GPU in all; lower "
        "num_engines / tensor_parallel_size, or add nodes"
    ]


def test_runs_wait_without_a_warning_while_ray_lists_no_live_node(sqlite_store, tmp_path):
    """A head whose node has not registered yet, or a state API too slow to answer under
    load, lists no node: that is not a cluster of 0 CPUs that the run can never fit."""
    run = queue_run(sqlite_store, tmp_path / "a", name="first")
    ray = SubmittingRay()
    ray.resources = {}
    scheduler = Scheduler(sqlite_store, ray, SchedulerSettings(max_concurrent_runs=1))
    scheduler.tick()
    assert ray.submitted == []
    assert [e for e in sqlite_store.events(run.id) if e.level == "warning"] == []
    ray.resources = {"CPU": 2.0}
    scheduler.tick()
    assert ray.submitted == ["first"]
