"""ES Lab on a Ray cluster of two nodes, on this machine's CPU, with PostgreSQL: a head (4
logical CPUs) and a second node that joins it (`ray start --address`, 1 CPU, its own temp dir
and a resource of its own), `eslab serve` following them through RAY_ADDRESS, and runs of
`num_engines: 2` on the default model.

- The engines' SPREAD placement puts one engine on each node; the run succeeds, which means
  its two engines agreed after every update (EnginePool.update compares their checksums and
  fails the run on a difference); the Run page names both nodes. The worker reads the
  database URL, which has a password, from the private URL file: the job's environment has
  neither the URL nor the password.
- The same run again, with the second node killed after the first checkpoint (every process
  of it, as if its machine died): the run fails with an error naming the lost engine and its
  node. `eslab resume` completes it on the head alone (SPREAD packs both engines there) with
  final weights and metrics identical to the uninterrupted run's: same seed, same number of
  engines, one core each.

Three starts of two vLLM engines on the CPU: a few minutes."""

from __future__ import annotations

import filecmp
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import streamlit as st
from sqlalchemy.engine import make_url

from engine import metrics as mk
from engine.backends.ray_auth import require_token_mode
from jobs.phases import engine_places
from jobs.private_files import PRIVATE_FOLDER
from jobs.ray_jobs import RayJobs
from jobs.store.migrate import upgrade
from jobs.store.status import RunStatus
from jobs.store.store import Store
from tests.jobs.helpers import ended, queue_real_run, wait_for
from tests.jobs.ray_nodes import RayNode, free_port

pytestmark = pytest.mark.heavy

ESLAB = str(Path(sys.executable).with_name("eslab"))
PASSWORD = "cluster-secret-pw"  # the test server trusts every login; the URL carries it anyway
RUN_DEADLINE_S = 300
HEAD_CPUS, NODE_CPUS = 4, 1
"""Logical CPUs. With room for both engines on the head, Ray's default placement puts both
there (it prefers the driver's node while that is under half full): only the placement
group's SPREAD puts one on the second node."""
NODE_RESOURCE = "eslab_second_node"
NODE_ENV = {
    # nodes of a cluster of several machines, whatever a single-machine Ray of this session
    # (engine.backends.ray_auth.local_cluster) left behind
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
    # A node whose raylet is gone counts as dead after 3 missed health checks a second
    # apart, so a lost engine fails its run within seconds.
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}


@dataclass
class Cluster:
    head: RayNode
    node: RayNode
    head_id: str
    node_id: str
    db_url: str
    data_dir: Path
    store: Store


def serve_env(db_url: str, data_dir: Path, ray_address: str) -> dict[str, str]:
    env = {
        **os.environ,
        "RAY_ADDRESS": ray_address,
        "ESLAB_DATABASE_URL": db_url,
        "ESLAB_DATA_DIR": str(data_dir),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "ESLAB_SCHEDULER_TICK_S": "0.5",
        "ESLAB_HEARTBEAT_S": "1",
        "ESLAB_STOP_WAIT_S": "20",
    }
    env.pop("ESLAB_AUTH_FILE", None)
    return env


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def cluster(postgres, tmp_path_factory) -> Iterator[Cluster]:
    """The two nodes, a PostgreSQL database and `eslab serve`; all stopped at the end."""
    if isinstance(postgres, str):
        pytest.skip(f"PostgreSQL unavailable: {postgres}")
    tmp = tmp_path_factory.mktemp("cluster")
    db_url = (
        make_url(postgres.create_database())
        .set(password=PASSWORD)
        .render_as_string(hide_password=False)
    )
    upgrade(db_url)
    # Token authentication on both nodes and in every client, as `eslab serve` requires of
    # a RAY_ADDRESS cluster: the nodes inherit RAY_AUTH_MODE and the session's token.
    require_token_mode()
    started: list[RayNode] = []
    serve = None
    store = Store(db_url)
    try:
        head = RayNode(num_cpus=HEAD_CPUS, env=NODE_ENV)
        started.append(head)
        head.wait_until_up(alive_nodes=1)
        node = RayNode(num_cpus=NODE_CPUS, head=head, resources={NODE_RESOURCE: 1}, env=NODE_ENV)
        started.append(node)
        port = free_port()
        log = (tmp / "serve.log").open("w")
        serve = subprocess.Popen(
            [ESLAB, "serve", "--port", str(port)],
            env=serve_env(db_url, tmp / "data", head.dashboard_url),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        node.wait_until_up(alive_nodes=2)
        nodes = head.alive_node_ids()
        (node_id,) = [i for i, res in nodes.items() if NODE_RESOURCE in res]
        (head_id,) = [i for i in nodes if i != node_id]
        wait_for(
            lambda: answers(f"http://127.0.0.1:{port}/_stcore/health") or serve.poll() is not None,
            120,
            "eslab serve",
            interval=0.5,
        )
        assert serve.poll() is None, (tmp / "serve.log").read_text()
        yield Cluster(head, node, head_id, node_id, db_url, tmp / "data", store)
    finally:
        if serve is not None:
            os.killpg(serve.pid, signal.SIGINT)  # Ctrl-C; runs on a cluster are left alone
            try:
                serve.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(serve.pid, signal.SIGKILL)
                serve.wait()
        for ray_node in reversed(started):
            ray_node.stop()
        store.close()


def queue_cluster_run(cluster: Cluster, folder: Path, name: str, default_model_dir: Path):
    """The same tiny run each time (seed included): two engines, three steps, a checkpoint
    a step; the model named by its absolute path (the data folder here is a fresh one)."""
    return queue_real_run(
        cluster.store,
        folder,
        name=name,
        model=str(default_model_dir),
        num_engines=2,
        max_steps=3,
    )


def untimed_metrics(store: Store, run_id: int) -> dict[tuple[str, int], float]:
    return {
        (key, point.step): point.value
        for key in store.metric_keys(run_id)
        if not mk.depends_on_wall_clock(key)
        for point in store.metric_series(run_id, key)
    }


def short(node_id: str) -> str:
    """How an engine's place names its Ray node (EnginePool.devices)."""
    return f"Ray node {node_id[:8]}"


@pytest.fixture(scope="module")
def first_run(cluster, default_model_dir, tmp_path_factory):
    """The uninterrupted run, succeeded."""
    folder = tmp_path_factory.mktemp("straight")
    run = queue_cluster_run(cluster, folder, "cluster-straight", default_model_dir)
    done = wait_for(lambda: ended(cluster.store, run.id), RUN_DEADLINE_S, "the run", interval=1)
    assert done.status is RunStatus.SUCCEEDED, done.error
    return done, folder / "out"


def test_a_run_puts_one_engine_on_each_node_and_reads_the_url_file(cluster, first_run, monkeypatch):
    run, _ = first_run
    places = engine_places(cluster.store.events(run.id))
    assert run.step == 3 and len(places) == 2
    on_head = [short(cluster.head_id) in place for place in places]
    on_node = [short(cluster.node_id) in place for place in places]
    assert sorted(on_head) == sorted(on_node) == [False, True]  # one engine on each node

    # The worker found the database through the private URL file, not the job's environment.
    job = RayJobs(cluster.head.dashboard_url).client.get_job_info(run.ray_submission_id)
    env = job.runtime_env["env_vars"]
    assert PASSWORD not in json.dumps(job.runtime_env)
    assert env["ESLAB_DATABASE_URL"] == ""
    url_file = Path(env["ESLAB_DATABASE_URL_FILE"])
    assert url_file.parent == cluster.data_dir / PRIVATE_FOLDER
    assert url_file.read_text() == cluster.db_url
    assert oct(url_file.stat().st_mode & 0o777) == "0o600"

    # The Run page names both nodes.
    from tests.app.test_pages import page

    monkeypatch.setenv("ESLAB_DATABASE_URL", cluster.db_url)
    st.cache_resource.clear()
    st.cache_data.clear()
    try:
        at = page("app_pages/run.py", run=str(run.id))
        (caption,) = [c.value for c in at.caption if c.value.startswith("2 engines:")]
    finally:
        st.cache_resource.clear()
    assert short(cluster.head_id) in caption and short(cluster.node_id) in caption


def test_a_lost_node_fails_the_run_naming_the_engine_and_resume_matches(
    cluster, first_run, default_model_dir, tmp_path, monkeypatch, capsys
):
    from app.cli import main

    straight, straight_out = first_run
    store = cluster.store
    run = queue_cluster_run(cluster, tmp_path, "cluster-interrupted", default_model_dir)
    wait_for(lambda: store.checkpoints(run.id), RUN_DEADLINE_S, "the first checkpoint", 0.2)
    places = engine_places(store.events(run.id))
    (lost,) = [i for i, place in enumerate(places) if short(cluster.node_id) in place]
    killed = time.monotonic()
    cluster.node.kill()

    failed = wait_for(lambda: ended(store, run.id), 60, "the run to fail", interval=0.5)
    message = [e.message for e in store.events(run.id)][-1]
    with capsys.disabled():
        print(f"\nfailed {time.monotonic() - killed:.1f} s after the node was killed: {message}")
    assert failed.status is RunStatus.FAILED and failed.step < 3
    assert message.startswith(f"EngineLostError: engine {lost} of 2 ({places[lost]}) was lost")
    assert "node has died" in message
    assert message.splitlines()[0] in failed.error

    monkeypatch.setenv("ESLAB_DATABASE_URL", cluster.db_url)
    assert main(["resume", str(run.id)]) == 0
    assert "queued again as attempt 2" in capsys.readouterr().out
    done = wait_for(lambda: ended(store, run.id), RUN_DEADLINE_S, "the resumed run", interval=1)
    assert done.status is RunStatus.SUCCEEDED, done.error
    assert done.attempt == 2
    # Both engines on the head now: SPREAD packs them where it must.
    resumed_places = engine_places(store.events(run.id))
    assert len(resumed_places) == 2
    assert all(short(cluster.head_id) in place for place in resumed_places)

    assert untimed_metrics(store, run.id) == untimed_metrics(store, straight.id)
    assert filecmp.cmp(
        tmp_path / "out" / "model.safetensors", straight_out / "model.safetensors", shallow=False
    )
