"""The fp32 master on disk: one safetensors file per tensor-parallel rank, read at any size.

Each rank writes its own shard of every parameter (logical layout: unpacked, vLLM's names)
to `master.safetensors` (tensor_parallel_size 1) or `master-tp{rank}-of-{size}.safetensors`,
so saving needs no communication between ranks. An engine of the size that wrote a folder
reads its own file; one of another size rebuilds each whole tensor from all of the folder's
files (shards.py's map of every rank that wrote one, which checks that copies on several
ranks agree) and takes its own shard, one tensor at a time. The noise of a seed is the
whole tensor's at every size (engine/noise.py), so a run resumed at another size continues
the same run.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import TYPE_CHECKING

from engine.backends.vllm import shards

if TYPE_CHECKING:
    import torch

MASTER_FILE = "master.safetensors"
_SHARD_FILE = re.compile(r"master-tp(\d+)-of-(\d+)\.safetensors")


def master_file(rank: int, size: int) -> str:
    """The file name of rank `rank`'s master at tensor-parallel size `size`."""
    return MASTER_FILE if size == 1 else f"master-tp{rank}-of-{size}.safetensors"


def write(folder: Path, rank: int, size: int, tensors: dict[str, torch.Tensor]) -> Path:
    """Write one rank's master into `folder` (through a temporary file, so a file under the
    final name is always complete)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    file = folder / master_file(rank, size)
    meta = {
        "format": "pt",
        "eslab": "fp32-master",
        "tp_rank": str(rank),
        "tp_size": str(size),
    }
    tmp = file.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.replace(file)
    return file


def saved_size(folder: Path, preferred: int) -> int:
    """The tensor-parallel size whose masters `folder` holds (`preferred` where it holds
    that size's files among others)."""
    sizes = {1} if (folder / MASTER_FILE).is_file() else set()
    for file in folder.glob("master-tp*-of-*.safetensors"):
        match = _SHARD_FILE.fullmatch(file.name)
        if match:
            sizes.add(int(match.group(2)))
    if preferred in sizes:
        return preferred
    if len(sizes) == 1:
        return sizes.pop()
    if not sizes:
        raise FileNotFoundError(f"no saved master in {folder}")
    raise ValueError(f"{folder} holds masters of several tensor-parallel sizes: {sorted(sizes)}")


class SavedMaster(contextlib.AbstractContextManager["SavedMaster"]):
    """A folder of master files, open for reading one tensor at a time at a given size."""

    def __init__(self, folder: Path, rank: int, size: int) -> None:
        from safetensors import safe_open

        self.rank, self.size = rank, size
        self.saved_size = saved_size(folder, size)
        files = [folder / master_file(r, self.saved_size) for r in range(self.saved_size)]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"incomplete saved master: {', '.join(missing)} missing")
        self.files = files
        self._stack = contextlib.ExitStack()
        self._readers = [self._stack.enter_context(safe_open(str(f), "pt")) for f in files]

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def check_names(self, names: set[str]) -> None:
        """Every file holds exactly `names` (the model's parameters)."""
        for file, reader in zip(self.files, self._readers, strict=True):
            saved = set(reader.keys())
            if saved != names:
                raise ValueError(
                    f"{file} does not match this model: missing {sorted(names - saved)[:5]}, "
                    f"unexpected {sorted(saved - names)[:5]}"
                )

    def read(self, name: str, rule: shards.ShardRule | None) -> torch.Tensor:
        """This rank's shard of tensor `name` (sharded by `rule`), in logical layout."""
        if self.saved_size == self.size:
            return self._readers[self.rank if self.size > 1 else 0].get_tensor(name)
        if rule is None:
            raise ValueError(
                f"{self.files[0].parent} was saved at tensor_parallel_size {self.saved_size}; "
                f"{name} belongs to a layer whose sharding is not known (shards.py), so it "
                f"loads only at that size, not at {self.size}"
            )
        whole = self._whole(name, rule)
        return shards.shard_map(rule, whole.shape, self.rank, self.size).take(whole)

    def _whole(self, name: str, rule: shards.ShardRule) -> torch.Tensor:
        """Tensor `name` whole, from the shards of every saved rank."""
        import torch

        first = self._readers[0].get_tensor(name)
        whole = torch.empty(shards.whole_shape(rule, first.shape), dtype=first.dtype)
        filled: set[shards.Block] = set()
        for rank, reader in enumerate(self._readers):
            shard = first if rank == 0 else reader.get_tensor(name)
            piece = shards.shard_map(rule, whole.shape, rank, self.saved_size)
            try:
                piece.put(whole, shard, filled)
            except ValueError as error:
                raise ValueError(f"{self.files[rank]}: {name}: {error}") from None
        return whole
