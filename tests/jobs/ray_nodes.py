"""Ray nodes that a test starts on this machine: a head (`ray start --head --block`) and nodes
that join it (`ray start --address=HEAD --block`), each with its own temp dir, ports and
resources. Ray runs several raylets on one host, so two such nodes make a two-node cluster.

Each node runs in a session of its own, so that stopping it, or killing it as if its machine
had died, reaches its processes and nothing else: `ray stop` would stop every Ray of the
machine (other test sessions' too)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping

import psutil

from jobs.ray_jobs import RayJobs, RayUnavailableError

START_TIMEOUT_S = 120.0
OBJECT_STORE_BYTES = 100 * 1024 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RayNode:
    """One `ray start --block` process and the Ray processes it starts. `head` None starts
    a head (its job server and dashboard on 127.0.0.1); else the node joins that head."""

    def __init__(
        self,
        *,
        num_cpus: int,
        head: RayNode | None = None,
        resources: Mapping[str, float] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        # Short, in /tmp: Ray's socket paths under it must fit in 107 characters.
        self.temp_dir = tempfile.mkdtemp(prefix="eslab-ray-node-")
        command = [
            sys.executable,
            "-m",
            "ray.scripts.scripts",
            "start",
            "--block",
            f"--temp-dir={self.temp_dir}",
            f"--num-cpus={num_cpus}",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            f"--dashboard-agent-listen-port={free_port()}",
            "--disable-usage-stats",
        ]
        if resources:
            command.append(f"--resources={json.dumps(dict(resources))}")
        if head is None:
            self.gcs_address = f"127.0.0.1:{free_port()}"
            dashboard_port = free_port()
            self.dashboard_url = f"http://127.0.0.1:{dashboard_port}"
            command += [
                "--head",
                f"--port={self.gcs_address.rsplit(':', 1)[1]}",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={dashboard_port}",
                f"--ray-client-server-port={free_port()}",
            ]
        else:
            self.gcs_address, self.dashboard_url = head.gcs_address, head.dashboard_url
            command.append(f"--address={head.gcs_address}")
        self.log_path = os.path.join(self.temp_dir, "ray-start.log")
        environ = {**os.environ, **(env or {})}
        environ.pop("RAY_ADDRESS", None)
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                command,
                env=environ,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_until_up(self, alive_nodes: int) -> None:
        """Until the cluster's job server answers and `alive_nodes` nodes are alive."""
        deadline = time.monotonic() + START_TIMEOUT_S
        jobs = RayJobs(self.dashboard_url)
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ray start exited: {self.log()}")
            try:
                if len(self.alive_node_ids(jobs)) >= alive_nodes:
                    return
            except RayUnavailableError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the Ray node did not come up in {START_TIMEOUT_S:.0f} s: {self.log()}")

    def alive_node_ids(self, jobs: RayJobs | None = None) -> dict[str, dict[str, float]]:
        """Node id -> total resources of each alive node of the cluster."""
        from ray.util.state import list_nodes

        (jobs or RayJobs(self.dashboard_url)).cluster_resources()  # reachable, token set up
        nodes = list_nodes(address=self.dashboard_url, detail=True)
        return {n.node_id: dict(n.resources_total) for n in nodes if n.state == "ALIVE"}

    def log(self) -> str:
        with open(self.log_path) as file:
            return file.read()[-3000:]

    def processes(self) -> list[psutil.Process]:
        """Every process of this node: its session's, and descendants that left it (a job's
        driver runs in a session of its own). None once the node's own process was reaped: its
        pid, and the session id it gave, may then be another process's (pids wrap around)."""
        if self.process.returncode is not None:
            return []
        found: dict[int, psutil.Process] = {}
        try:
            root = psutil.Process(self.process.pid)
            found.update({p.pid: p for p in root.children(recursive=True)})
            found[root.pid] = root
        except psutil.NoSuchProcess:
            pass
        for process in psutil.process_iter():
            try:
                if os.getsid(process.pid) == self.process.pid:
                    found[process.pid] = process
            except (ProcessLookupError, PermissionError):
                continue
        return list(found.values())

    def kill(self) -> None:
        """SIGKILL every process of the node at once, as if its machine had died."""
        for process in self.processes():
            try:
                process.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                continue
        self.process.wait()

    def stop(self) -> None:
        """Stop the node (`ray start --block` stops its processes on SIGTERM), kill what is
        left of it, and remove its temp dir."""
        leftovers = self.processes()  # found while the node's pid is still its own
        if self.process.poll() is None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(30)
        for process in leftovers:
            with contextlib.suppress(psutil.NoSuchProcess):  # psutil refuses a reused pid too
                process.kill()
        self.process.wait()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
