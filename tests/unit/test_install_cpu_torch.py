"""tools/install_cpu_torch.py: the CPU torch comes from where pip already looks, and only when
it is not there from PyTorch's CPU wheel index. pip itself is replaced by a recorder: whether
the index answers cannot be tried from a machine that reaches only PyPI."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_tool():
    spec = importlib.util.spec_from_file_location(
        "install_cpu_torch", ROOT / "tools" / "install_cpu_torch.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tool = load_tool()


class Pip:
    """Records pip commands and answers them with the given exit codes, in order."""

    def __init__(self, *codes: int) -> None:
        self.codes = list(codes)
        self.commands: list[list[str]] = []

    def __call__(self, command: list[str]) -> int:
        self.commands.append(command)
        return self.codes.pop(0)


def test_the_pin_is_the_cpu_extras_torch():
    assert tool.pinned_cpu_torch() == "torch==2.13.0+cpu"


def test_torch_found_where_pip_looks_is_installed_without_the_index():
    pip = Pip(0)
    assert tool.install("torch==2.13.0+cpu", ["--quiet"], run=pip) == 0
    assert pip.commands == [
        [sys.executable, "-m", "pip", "install", "--quiet", "torch==2.13.0+cpu"]
    ]


def test_torch_not_found_is_retried_with_the_cpu_index(capsys):
    pip = Pip(1, 0)
    assert tool.install("torch==2.13.0+cpu", run=pip) == 0
    assert pip.commands == [
        [sys.executable, "-m", "pip", "install", "torch==2.13.0+cpu"],
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "torch==2.13.0+cpu",
            "--extra-index-url",
            tool.TORCH_CPU_INDEX,
        ],
    ]
    assert "retrying with PyTorch's CPU wheel index" in capsys.readouterr().err


def test_a_failed_retry_is_pips_failure():
    assert tool.install("torch==2.13.0+cpu", run=Pip(1, 1)) == 1
