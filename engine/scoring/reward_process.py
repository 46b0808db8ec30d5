"""Reward functions run in a child process, so that one that hangs stops the run with a clear
error instead of hanging it (`reward_timeout_seconds`).

Why a process: a Python thread cannot be killed, and `signal.alarm` works only in a process's
main thread (a Ray actor's method may not run there) and cannot interrupt C code that holds
the GIL (a catastrophic regular expression); a child process can always be killed. ES at
Scale (VsonicV/es-at-scale, es_at_scale/trainer/es_trainer.py) runs rewards in a
`multiprocessing.Pool` for the same reason, but scores a timed-out completion 0 and goes on,
with the hung worker still occupying the pool; ES Lab stops the run instead, naming the
function and the sample, as it does for every other reward failure (engine/rewards).

The child is one long-lived `python -m engine.scoring.reward_process` per process that
scores (started at the first batch, restarted after a timeout): a plain subprocess rather
than `multiprocessing`, whose spawn re-imports the parent's `__main__` (a Ray worker's or
`jobs.worker`'s). A batch travels as one pickled frame each way over pipes, so the cost per
step is a round trip per member, not per completion. The child marks the sample it is on and
when it started in a small shared file (16 bytes, mmap), which the parent reads while it
waits: the timeout is per completion, as in the reference, and its message names the sample.
"""

from __future__ import annotations

import atexit
import math
import mmap
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from engine.rewards import RewardError, load_reward_function, score_completion

# (index of the sample being scored, time.monotonic() when it started; 0.0 when idle)
_MARK = struct.Struct("<qd")
_HEADER = struct.Struct("<Q")
_POLL_S = 0.25  # how often the parent looks at the mark while it waits

Item = tuple[str, Mapping[str, Any], str]
"""(completion text, reward_func_args, description of the sample for messages)."""


class RewardTimeout(RewardError):
    """A reward function ran longer than reward_timeout_seconds on one completion."""


class RewardProcess:
    """One child process that scores batches with a per-completion time limit."""

    def __init__(self) -> None:
        self._mark_file = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the child)
        self._mark_file.truncate(_MARK.size)
        self._mark = mmap.mmap(self._mark_file.fileno(), _MARK.size)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "engine.scoring.reward_process", str(self._mark_file.fileno())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            pass_fds=(self._mark_file.fileno(),),
        )

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def score(self, path: str, items: Sequence[Item], timeout_s: float) -> list[dict[str, float]]:
        """The parts of each item as engine.rewards.score_completion returns them.

        Raises RewardError as score_completion does (the child's message), RewardTimeout
        when one completion takes longer than `timeout_s` (the child is then killed), and
        RewardError when the child dies."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        _write_frame(self._proc.stdin, (path, list(items)))
        kind, payload = self._wait(path, items, timeout_s)
        if kind == "error":
            raise RewardError(payload)
        return payload

    def _wait(self, path: str, items: Sequence[Item], timeout_s: float) -> tuple[str, Any]:
        stdout = self._proc.stdout
        assert stdout is not None
        poll_s = min(_POLL_S, timeout_s / 4)
        while True:
            ready, _, _ = select.select([stdout], [], [], poll_s)
            if ready:
                reply = _read_frame(stdout)
                if reply is not None:
                    return reply
            if not self.alive or ready:
                code = self._proc.wait()
                raise RewardError(
                    f"the process running reward function {path} exited with code {code} "
                    f"while scoring {_where(items, self._current())}"
                )
            index, started = _MARK.unpack(self._mark)
            if started and time.monotonic() - started > timeout_s:
                self.close()
                raise RewardTimeout(
                    f"reward function {path} ran longer than reward_timeout_seconds "
                    f"({timeout_s:g} s) on {_where(items, index)}: the run is stopped "
                    "rather than scoring it 0; fix the function or raise reward_timeout_seconds"
                )

    def _current(self) -> int:
        return _MARK.unpack(self._mark)[0]

    def close(self) -> None:
        """Kill the child (a hung reward function ignores anything gentler)."""
        if self.alive:
            self._proc.kill()
        self._proc.wait()
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe is not None:
                pipe.close()
        self._mark.close()
        self._mark_file.close()


def _where(items: Sequence[Item], index: int) -> str:
    if 0 <= index < len(items):
        text, args, description = items[index]
        return f"{description} (completion {text[:200]!r}, reward_func_args {dict(args)!r:.200})"
    return "a batch"


_process: RewardProcess | None = None
_lock = threading.Lock()


def score_in_process(path: str, items: Sequence[Item], timeout_s: float) -> list[dict[str, float]]:
    """Score `items` in this process's reward child (started, or restarted after a timeout
    or a crash, as needed); callers may be on any thread, one batch at a time."""
    global _process
    if not (timeout_s > 0 and math.isfinite(timeout_s)):
        raise ValueError(f"timeout_s must be a finite number above 0, got {timeout_s!r}")
    with _lock:
        if _process is None or not _process.alive:
            if _process is not None:
                _process.close()
            _process = RewardProcess()
        return _process.score(path, items, timeout_s)


@atexit.register
def _close() -> None:
    if _process is not None:
        _process.close()


# -- the frames: an 8-byte length, then a pickle -------------------------------------------------


def _write_frame(stream: IO[bytes], value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read_frame(stream: IO[bytes]) -> Any | None:
    """The next frame, or None at the end of the stream."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    data = stream.read(_HEADER.unpack(header)[0])
    return pickle.loads(data)


# -- the child ------------------------------------------------------------------------------------


def _serve(mark_fd: int) -> None:
    """Answer (path, items) frames with ("scores", [...]) or ("error", message) until stdin
    closes. What reward functions print goes to stderr: stdout carries the frames.

    The child ignores SIGINT and SIGTERM, which reach it with its parent's process group (a
    Ctrl-C of `eslab train`, Ray's stop_job): the parent stops at a step boundary, saving a
    checkpoint, and a child dead mid-batch would fail the run instead. The parent ends it
    (kill, or closing its stdin, also by dying)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    mark = mmap.mmap(mark_fd, _MARK.size)
    while (request := _read_frame(sys.stdin.buffer)) is not None:
        path, items = request
        try:
            func = load_reward_function(path)
            scores = []
            for index, (text, args, description) in enumerate(items):
                _MARK.pack_into(mark, 0, index, time.monotonic())
                scores.append(score_completion(func, text, args, sample_description=description))
            reply: tuple[str, Any] = ("scores", scores)
        except RewardError as exc:
            reply = ("error", str(exc))
        _MARK.pack_into(mark, 0, -1, 0.0)
        _write_frame(replies, reply)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
