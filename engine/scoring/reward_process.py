"""Reward functions run in a child process, so that one that hangs stops the run with a clear
error instead of hanging it (`reward_timeout_seconds`).

Why a process: a Python thread cannot be killed, and `signal.alarm` works only in a process's
main thread (a Ray actor's method may not run there) and cannot interrupt C code that holds
the GIL (a catastrophic regular expression); a child process can always be killed. ES at
Scale (VsonicV/es-at-scale, es_at_scale/trainer/es_trainer.py) runs rewards in a
`multiprocessing.Pool` for the same reason, but scores a timed-out completion 0 and goes on,
with the hung worker still occupying the pool. ES Lab stops the run by default, naming the
function and the sample, as it does for every other reward failure (engine/rewards);
`reward_timeout_action: score_zero` scores it 0 as the reference does, and the child that hung
is killed and replaced, so it never holds a worker.

The child is one long-lived `python -m engine.scoring.reward_process` per process that
scores (started at the first batch, restarted after a timeout): a plain subprocess rather
than `multiprocessing`, whose spawn re-imports the parent's `__main__` (a Ray worker's or
`jobs.worker`'s). A batch travels to the child as one pickled frame and each completion's
scores come back as one as soon as they are computed, so the scores before a completion that
hangs are kept when the child is killed. The child marks the sample it is on and
when it started in a small shared file (16 bytes, mmap), which the parent reads while it
waits: the timeout is per completion, as in the reference, and its message names the sample.
"""

from __future__ import annotations

import atexit
import logging
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
from dataclasses import dataclass
from typing import IO, Any

from engine.rewards import RewardError, load_reward_function, score_completion

# (index of the sample being scored, time.monotonic() when it started; 0.0 when idle)
_MARK = struct.Struct("<qd")
_HEADER = struct.Struct("<Q")
_POLL_S = 0.25  # how often the parent looks at the mark while it waits

Item = tuple[str, Mapping[str, Any], str]
"""(completion text, reward_func_args, description of the sample for messages)."""


TIMEOUT_ACTIONS = ("stop", "score_zero")

log = logging.getLogger(__name__)


class RewardTimeout(RewardError):
    """A reward function ran longer than reward_timeout_seconds on one completion."""


@dataclass(frozen=True)
class RewardLimit:
    """`reward_timeout_seconds` and `reward_timeout_action`: how long one completion's reward
    may take, and whether one that takes longer stops the run or scores 0."""

    seconds: float
    action: str = "stop"

    def __post_init__(self) -> None:
        if not (self.seconds > 0 and math.isfinite(self.seconds)):
            raise ValueError(f"the time limit must be a finite number above 0, got {self.seconds}")
        if self.action not in TIMEOUT_ACTIONS:
            raise ValueError(f"the timeout action must be one of {TIMEOUT_ACTIONS}")


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
            bufsize=0,  # unbuffered replies: select() sees every frame the child has sent
            env=env,
            pass_fds=(self._mark_file.fileno(),),
        )

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def score(
        self, path: str, items: Sequence[Item], timeout_s: float, scores: list[dict[str, float]]
    ) -> None:
        """Append to `scores` the parts of each item as engine.rewards.score_completion
        returns them, as they arrive.

        Raises RewardError as score_completion does (the child's message), RewardTimeout
        when one completion takes longer than `timeout_s` (the child is then killed, and
        `scores` holds those of the items before it), and RewardError when the child dies."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        _write_frame(self._proc.stdin, (path, list(items)))
        stdout = self._proc.stdout
        poll_s = min(_POLL_S, timeout_s / 4)
        while True:
            ready, _, _ = select.select([stdout], [], [], poll_s)
            reply = _read_frame(stdout) if ready else None
            if reply is not None:
                kind, payload = reply
                if kind == "done":
                    return
                if kind == "error":
                    raise RewardError(payload)
                scores.append(payload)
                continue
            if not self.alive or ready:
                code = self._proc.wait()
                raise RewardError(
                    f"the process running reward function {path} exited with code {code} "
                    f"while scoring {_where(items, self._current())}"
                )
            index, started = _MARK.unpack(self._mark)
            if started and time.monotonic() - started > timeout_s:
                self._proc.kill()
                scores.extend(payload for kind, payload in _frames(stdout) if kind == "score")
                self.close()
                raise RewardTimeout(
                    f"reward function {path} ran longer than reward_timeout_seconds "
                    f"({timeout_s:g} s) on {_where(items, index)}: the run is stopped "
                    "rather than scoring it 0; fix the function, raise reward_timeout_seconds, "
                    "or set reward_timeout_action to score_zero as ES at Scale does"
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


def score_in_process(
    path: str, items: Sequence[Item], limit: RewardLimit
) -> list[dict[str, float]]:
    """Score `items` in this process's reward child (started, or restarted after a timeout
    or a crash, as needed); callers may be on any thread, one batch at a time. With
    limit.action score_zero a completion past the limit scores {"reward": 0.0} (its other
    parts unknown) and the rest of the batch goes to a fresh child."""
    scores: list[dict[str, float]] = []
    zeroed = 0
    with _lock:
        while len(scores) < len(items):
            try:
                _running().score(path, items[len(scores) :], limit.seconds, scores)
            except RewardTimeout:
                if limit.action != "score_zero":
                    raise
                scores.append({"reward": 0.0})
                zeroed += 1
    if zeroed:
        log.warning(
            "reward function %s ran longer than reward_timeout_seconds (%g s) on %d of %d "
            "completions, which score 0 (reward_timeout_action score_zero)",
            path,
            limit.seconds,
            zeroed,
            len(items),
        )
    return scores


def _running() -> RewardProcess:
    """This process's reward child, started anew when there is none alive."""
    global _process
    if _process is None or not _process.alive:
        if _process is not None:
            _process.close()
        _process = RewardProcess()
    return _process


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
    """The next frame, or None at the end of the stream (or of a frame cut short)."""
    header = _read_exactly(stream, _HEADER.size)
    if header is None:
        return None
    data = _read_exactly(stream, _HEADER.unpack(header)[0])
    return None if data is None else pickle.loads(data)


def _frames(stream: IO[bytes]) -> list[Any]:
    """The whole frames left in `stream` once its writer has ended."""
    frames = []
    while (frame := _read_frame(stream)) is not None:
        frames.append(frame)
    return frames


def _read_exactly(stream: IO[bytes], size: int) -> bytes | None:
    """`size` bytes: an unbuffered pipe returns what has arrived, which may be less."""
    data = b""
    while len(data) < size:
        chunk = stream.read(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


# -- the child ------------------------------------------------------------------------------------


def _serve(mark_fd: int) -> None:
    """Answer each (path, items) frame with a ("score", parts) frame per item as it is
    scored, then ("done", None), or ("error", message) where the batch stops; until stdin
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
            for index, (text, args, description) in enumerate(items):
                _MARK.pack_into(mark, 0, index, time.monotonic())
                parts = score_completion(func, text, args, sample_description=description)
                _write_frame(replies, ("score", parts))
            reply: tuple[str, Any] = ("done", None)
        except RewardError as exc:
            reply = ("error", str(exc))
        _MARK.pack_into(mark, 0, -1, 0.0)
        _write_frame(replies, reply)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
