"""A worker's tensors as one job list, so each weight operation is one kernel launch.

The worker (worker_extension.py) keeps, per parameter, the live tensor vLLM serves from,
its snapshot in the serving dtype and its fp32 master, and where each piece of it finds its
noise (`engine.noise.Segment`s). `DeviceWeights.build` turns that into the int64 arrays
that cuda/kernels.py reads, once per engine: the addresses stay valid for the engine's life
(vLLM never reallocates parameters, and its CUDA graphs hold the same addresses). It
returns None where the kernels do not apply (not CUDA, no Triton, mixed dtypes), and the
worker then takes the tensor-by-tensor torch path of engine.noise, which computes the same
bits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import torch

    from engine.noise import Segment

BLOCK = 1024
"""Entries per program. bench/gpu/weight_kernels.py on an H200 (1.07B model): 1024 gave the
fastest update (23 ms for 32 members against 35 at 2048 and 55 at 4096: each program keeps
one fp32 accumulator an entry across the members) and perturbations within 10% of the best."""

NUM_WARPS = 8

ALIGNMENT = 16
"""Bytes: where every tensor starts on such a boundary and every size is a multiple of 8
entries, the kernels may load the weights as vectors."""


class _Jobs(NamedTuple):
    """The kernels' job arrays (int64, on the weights' device), in their argument order."""

    tile_job: torch.Tensor
    tile_first: torch.Tensor
    start: torch.Tensor
    cols: torch.Tensor
    stride: torch.Tensor
    skip: torch.Tensor
    numel: torch.Tensor
    tensor: torch.Tensor


class DeviceWeights:
    """Perturb, restore, update and fingerprint all of a worker's weights, one launch each."""

    def __init__(
        self,
        jobs: _Jobs,
        addresses: dict[str, torch.Tensor],
        tensors: int,
        dtype: torch.dtype,
        flags: dict[str, Any],
    ):
        from engine.backends.vllm.cuda import kernels

        self._kernels = kernels
        self._jobs = jobs
        self._live, self._snapshot, self._master = (
            addresses["live"],
            addresses["snapshot"],
            addresses["master"],
        )
        self._tensors = tensors
        self._dtype = dtype
        self._flags = flags
        self._grid = (jobs.tile_job.numel(),)
        self._sums = jobs.tile_job.new_empty(jobs.tile_job.numel())

    @classmethod
    def for_cuda(
        cls,
        live: Sequence[torch.Tensor],
        snapshot: Sequence[torch.Tensor],
        master: Sequence[torch.Tensor],
        segments: Sequence[Sequence[Segment]],
        table: torch.Tensor,
    ) -> DeviceWeights | None:
        """The job list of a CUDA worker's tensors, or None where the kernels do not apply
        (another device, no Triton, mixed dtypes) and the torch path must run."""
        import torch

        if not live or table.device.type != "cuda":
            return None
        try:
            import triton  # noqa: F401  (vLLM's CUDA build brings it)
        except ImportError:
            return None
        tensors = (*live, *snapshot, *master)
        if any(t.dtype != table.dtype for t in (*live, *snapshot)) or any(
            m.dtype != torch.float32 for m in master
        ):
            return None
        if any(not t.is_contiguous() or t.device != table.device for t in tensors):
            return None
        return cls.build(live, snapshot, master, segments, table)

    @classmethod
    def build(
        cls,
        live: Sequence[torch.Tensor],
        snapshot: Sequence[torch.Tensor],
        master: Sequence[torch.Tensor],
        segments: Sequence[Sequence[Segment]],
        table: torch.Tensor,
        block: int = BLOCK,
    ) -> DeviceWeights:
        """The job list of these tensors (tensor i's pieces are segments[i]), on any device
        Triton runs on (its interpreter runs on the CPU, for the tests)."""
        import torch

        dtype = table.dtype
        pieces = [(i, s) for i, parts in enumerate(segments) for s in parts]
        numels = [s.rows * s.cols for _, s in pieces]
        whole = all(s.rows == 1 and s.start == 0 and s.skip == 0 for _, s in pieces)
        addresses = {
            kind: [tensors[i].data_ptr() for i, _ in pieces]
            for kind, tensors in (("live", live), ("snapshot", snapshot), ("master", master))
        }
        aligned = whole and all(
            address % ALIGNMENT == 0 for column in addresses.values() for address in column
        )
        aligned = aligned and all(n % 8 == 0 for n in numels)
        tiles = torch.tensor([-(-n // block) for n in numels], dtype=torch.int64)
        tile_job = torch.repeat_interleave(torch.arange(len(pieces)), tiles)
        firsts = torch.arange(int(tiles.sum())) - torch.repeat_interleave(
            torch.cumsum(tiles, 0) - tiles, tiles
        )

        def column(values: Sequence[int] | torch.Tensor) -> torch.Tensor:
            return _int64(values, table.device)

        jobs = _Jobs(
            tile_job=column(tile_job),
            tile_first=column(firsts * block),
            start=column([s.start for _, s in pieces]),
            cols=column([s.cols for _, s in pieces]),
            stride=column([s.stride for _, s in pieces]),
            skip=column([s.skip for _, s in pieces]),
            numel=column(numels),
            tensor=column([i for i, _ in pieces]),
        )
        flags = {"BLOCK": block, "WHOLE": whole, "ALIGNED": aligned, "DTYPE": _tl(dtype)}
        return cls(
            jobs,
            {kind: column(values) for kind, values in addresses.items()},
            len(live),
            dtype,
            flags,
        )

    @property
    def vectorized(self) -> bool:
        """Whether the kernels may load and store the weights as vectors (ALIGNMENT)."""
        return bool(self._flags["ALIGNED"])

    def perturb(self, table: torch.Tensor, offsets: Sequence[int], scale: float) -> None:
        """live := snapshot + scale * eps, tensor i's noise at table[offsets[i]:]."""
        self._kernels.perturb[self._grid](
            *self._jobs,
            self._live,
            self._snapshot,
            self._column(offsets),
            table,
            float(scale),
            **self._flags,
            num_warps=NUM_WARPS,
        )

    def restore(self) -> None:
        """live := snapshot, bit for bit."""
        self._kernels.copy[self._grid](
            *self._jobs[:7], self._live, self._snapshot, **self._flags, num_warps=NUM_WARPS
        )

    def update(
        self, table: torch.Tensor, offsets: Sequence[Sequence[int]], coefficients: Sequence[float]
    ) -> None:
        """master += sum_k coefficients[k] * eps_k (member k's offsets[k]), members in order,
        then snapshot and live := cast(master). A coefficient of exactly 0 is skipped, as in
        engine.noise.accumulate_ (adding 0 * eps would turn a -0.0 weight into +0.0)."""
        terms = [(o, float(c)) for o, c in zip(offsets, coefficients, strict=True) if c != 0.0]
        if terms:
            self._update(table, terms, apply=True)

    def read_noise(self, table: torch.Tensor, offsets: Sequence[Sequence[int]]) -> None:
        """Read every member's noise once, as the update does, and nothing else: the update's
        floor (bench/gpu/utilization.py prints both)."""
        self._update(table, [(o, 1.0) for o in offsets], apply=False)

    def fingerprint(self) -> int:
        """A 64-bit hash of every serving weight and master (kernels.fingerprint)."""
        word = self._tl_word()
        self._kernels.fingerprint[self._grid](
            *self._jobs,
            self._live,
            self._master,
            self._sums,
            **self._flags,
            WORD=word,
            num_warps=NUM_WARPS,
        )
        return int(self._sums.sum()) % (1 << 64)  # int64 sums wrap: the hash is mod 2^64

    def _update(
        self, table: torch.Tensor, terms: Sequence[tuple[Sequence[int], float]], apply: bool
    ) -> None:
        import torch

        offsets = [offset for member_offsets, _ in terms for offset in member_offsets]
        coefficients = torch.tensor([c for _, c in terms], dtype=torch.float32)
        self._kernels.update[self._grid](
            *self._jobs,
            self._master,
            self._snapshot,
            self._live,
            self._column(offsets),
            coefficients.to(self._live.device),
            len(terms),
            self._tensors,
            table,
            self._sums.view(torch.float64),
            **self._flags,
            APPLY=apply,
            num_warps=NUM_WARPS,
        )

    def _column(self, values: Sequence[int]) -> torch.Tensor:
        return _int64(values, self._live.device)

    def _tl_word(self) -> Any:
        import triton.language as tl

        return {1: tl.int8, 2: tl.int16, 4: tl.int32}[self._dtype.itemsize]


def _int64(values: Sequence[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
    """An int64 array of the kernels' (job arrays, offsets) on the weights' device."""
    import torch

    return torch.as_tensor(values, dtype=torch.int64).to(device)


def _tl(dtype: torch.dtype) -> Any:
    """Triton's name for a torch dtype."""
    import triton.language as tl

    return getattr(tl, str(dtype).removeprefix("torch."))
