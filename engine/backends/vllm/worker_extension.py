"""The ES perturbation engine inside each vLLM worker.

Passed to vLLM as
`worker_extension_cls="engine.backends.vllm.worker_extension.PerturbationWorkerExtension"`
and driven through `LLM.collective_rpc("es_<method>", args=...)`: vLLM mixes this class into
its worker class, so every tensor-parallel rank runs each method on its own shard. Methods
take and return primitives only; heavy imports happen inside them. Every method is prefixed
`es_` because vLLM refuses an extension attribute that its worker class already has.

State per worker (built by `es_init`, over `model.named_parameters()`, the live tensors the
forward pass reads; see cpu_weights for the CPU backend):
- master: an fp32 copy of every parameter. Updates accumulate here, never in bf16 (a small
  update in bf16 loses a third of its entries, and all of it on norm weights near 1.0).
- snapshot: the serving-dtype weights of the unperturbed model, = cast(master). Restore is
  a copy from it, so it is bit-exact however many members ran.
- master and snapshot are in the logical layout, also where the CPU keeps a live weight
  packed (AMX; cpu/packed.py): noise, update, checksum and saved files are the logical
  tensor's on every machine, and only writes to the live tensor go through the packing.
- the noise table (engine.noise): eps(seed, tensor) is a slice of it, and so are a low-rank
  member's factors (lora_slots, engine/lowrank/factors.py); on the CPU also an fp32 copy of
  the same values for the full-rank update.

Perturb computes weights := snapshot + scale * eps from the snapshot, so each member
overwrites the previous one and nothing accumulates; restoring between two members is not
needed for exactness (the pool restores once per engine after its last member).

With tensor_parallel_size > 1 each rank perturbs and updates its own shard with the entries
of the whole tensor's noise that it holds (shards.py), so every size draws the same
perturbation and applies the same update; masters are saved one file per rank and load at
any size.
"""

from __future__ import annotations

import functools
import hashlib
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from engine.backends.vllm import lora_slots, masters, member_noise, shards
from engine.backends.vllm.cpu import lora_kernels as cpu_lora
from engine.backends.vllm.cpu import packed as cpu_packed
from engine.backends.vllm.cpu import weights as cpu_weights
from engine.backends.vllm.cuda.weights import DeviceWeights
from engine.backends.vllm.fingerprint import hashed_bytes

if TYPE_CHECKING:
    import torch

# vLLM imports this module while it creates the worker, before the model loads: the only
# moment at which the CPU backend's weight packing can be replaced by live weights.
cpu_weights.install_live_cpu_gemm()
# Multi-LoRA (perturbation: lora) on the CPU: grouped kernels instead of per-token copies.
cpu_lora.install_grouped_cpu_lora()
# Full-rank members in LoRA slots (perturbation: full_batched): their noise products instead
# of LoRA's, in the engines started for them (member_noise.py).
member_noise.install()

Method = TypeVar("Method", bound=Callable[..., Any])

KEPT_OFFSETS = 4096
"""Members whose noise offsets a worker keeps between perturbation and update (more than any
population it serves alone)."""


def _writes_weights(method: Method) -> Method:
    """Marks a method that writes the serving weights in place: afterwards (even after a
    failure half-way) the CPU backend's fp32 copies of them are stale (cpu_weights)."""

    @functools.wraps(method)
    def writing(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        finally:
            cpu_weights.weights_written()

    return writing  # type: ignore[return-value]


class PerturbationWorkerExtension:
    """Mixin for vLLM's worker: perturb, restore, update, checksum and save the weights."""

    # ---- set-up -------------------------------------------------------------------------

    def es_init(self, model_dir: str, table_seed: int, min_table_len: int) -> dict[str, Any]:
        """Build master, snapshot and noise table from the current weights; return a summary."""
        import torch

        from engine import noise

        start = time.perf_counter()
        self._es_model_dir = model_dir
        self._es_tp_rank, self._es_tp_size = _tp_rank_and_size()
        model = _model(self)
        with torch.inference_mode():
            params = sorted(
                model.named_parameters(), key=lambda item: lora_slots.logical_name(item[0])
            )
            self._es_names = [lora_slots.logical_name(name) for name, _ in params]
            self._es_live = [p.data for _, p in params]
            self._es_layouts = [cpu_weights.layout_of(p) for _, p in params]
            self._es_rules = [_rule(model, name) for name, _ in params]
            self._es_maps = [
                _shard_map(name, rule, live, self._es_tp_rank, self._es_tp_size)
                for name, rule, live in zip(
                    self._es_names, self._es_rules, self._es_live, strict=True
                )
            ]
            self._es_segments = [m.segments() for m in self._es_maps]
            self._es_snapshot = [
                cpu_packed.to_logical(p.detach(), layout)
                for p, layout in zip(self._es_live, self._es_layouts, strict=True)
            ]
            self._es_master = [s.to(torch.float32, copy=True) for s in self._es_snapshot]
            # where each row of a packed weight finds its noise (the C kernel's index)
            self._es_noise_rows = [
                None if layout is None else cpu_packed.noise_rows(segments, m.shard_shape)
                for layout, segments, m in zip(
                    self._es_layouts, self._es_segments, self._es_maps, strict=True
                )
            ]
            # noise is keyed by the whole tensor, the same at every tensor-parallel size
            self._es_specs = [
                (name, m.numel) for name, m in zip(self._es_names, self._es_maps, strict=True)
            ]
            largest = max(self._es_live, key=lambda t: t.numel())
            table_len = noise.noise_table_len(max(m.numel for m in self._es_maps), min_table_len)
            self._es_table = noise.build_noise_table(
                table_len + noise.TABLE_SLACK,
                seed=table_seed,
                dtype=largest.dtype,
                device=largest.device,
            )[:table_len]
            # The update adds noise to the fp32 master. On the CPU a same-dtype fp32 add is
            # the fast and steady kernel (the bf16 -> fp32 conversion kernels stalled for
            # seconds when another process held a core), so keep the same values in fp32
            # too; on GPUs the mixed-dtype add is fast and memory is dearer.
            self._es_update_table = (
                self._es_table.float() if largest.device.type == "cpu" else self._es_table
            )
            self._es_scratch = torch.empty(noise.UPDATE_CHUNK, dtype=torch.float32)
            self._es_seen_offsets: dict[int, list[int]] = {}
            # on CUDA each weight operation is one kernel over all tensors (cuda/weights.py)
            self._es_kernels = DeviceWeights.for_cuda(
                self._es_live, self._es_snapshot, self._es_master, self._es_segments, self._es_table
            )
        return {
            "num_tensors": len(self._es_names),
            "num_parameters": sum(t.numel() for t in self._es_live),
            "packed_tensors": sum(layout is not None for layout in self._es_layouts),
            "table_len": table_len,
            "table_seed": table_seed,
            "table_dtype": str(self._es_table.dtype),
            "update_table_dtype": str(self._es_update_table.dtype),
            "device": str(largest.device),
            "gpu": _gpu_id(largest.device),
            "device_name": _device_name(largest.device),
            "host": socket.gethostname(),
            "tp_rank": self._es_tp_rank,
            "tp_size": self._es_tp_size,
            "torch_threads": torch.get_num_threads(),
            "weight_kernels": self._es_kernels is not None,
            "seconds": time.perf_counter() - start,
        }

    # ---- the three weight changes ---------------------------------------------------------

    @_writes_weights
    def es_perturb(self, seed: int, scale: float) -> None:
        """weights := snapshot + scale * eps(seed), tensor by tensor (scale 0: a restore)."""
        import torch

        if float(scale) == 0.0:
            self.es_restore()
            return
        offsets = self._es_offsets(int(seed))
        table, scale = self._es_table, float(scale)
        if self._es_kernels is not None:
            self._es_kernels.perturb(table, offsets, scale)
            return
        with torch.inference_mode():
            for i, offset in enumerate(offsets):
                self._es_perturb_tensor(i, offset, scale)

    def _es_perturb_tensor(self, i: int, offset: int, scale: float) -> None:
        """Tensor i := snapshot + scale * eps (its noise at `offset`), by the torch path."""
        from engine import noise

        live, snap, table = self._es_live[i], self._es_snapshot[i], self._es_table
        segments, layout = self._es_segments[i], self._es_layouts[i]
        if layout is None:
            noise.perturb_(live, snap, table, offset, scale, segments)
        else:
            rows = self._es_noise_rows[i]
            cpu_packed.perturb_(live, snap, table, offset, scale, segments, layout, rows)

    @_writes_weights
    def es_check_perturb_tensors(self, seed: int, scale: float, names: list[str]) -> None:
        """es_perturb of the named tensors alone (the others keep their weights), by the
        torch path: the reference that members served from slots (member_noise) are
        compared with."""
        import torch

        offsets = self._es_offsets(int(seed))
        with torch.inference_mode():
            for name in names:
                i = self._es_names.index(name)
                self._es_perturb_tensor(i, offsets[i], float(scale))

    @_writes_weights
    def es_restore(self) -> None:
        """weights := snapshot, bit for bit."""
        import torch

        if self._es_kernels is not None:
            self._es_kernels.restore()
            return
        with torch.inference_mode():
            for live, snap, layout in zip(
                self._es_live, self._es_snapshot, self._es_layouts, strict=True
            ):
                cpu_packed.write_live_(live, snap, layout)

    @_writes_weights
    def es_update(self, seeds: list[int], coefficients: list[float]) -> None:
        """master += sum_i c_i * eps(seed_i) in fp32; weights and snapshot := cast(master).

        Coefficients are final (the trainer folds lr / (N * sigma) and the shaped fitness
        into them). Tensor by tensor, members in the given order, so every engine computes
        the same bits.
        """
        self._es_update_tensors(seeds, coefficients, None)

    def _es_update_tensors(
        self, seeds: list[int], coefficients: list[float], indices: list[int] | None
    ) -> None:
        """es_update of the tensors at `indices` (None: all of them), each with the noise
        offsets of the member's whole perturbation, so a tensor's update is the same whatever
        else is updated."""
        import math

        import torch

        from engine import noise

        if len(seeds) != len(coefficients):
            raise ValueError(f"{len(seeds)} seeds but {len(coefficients)} coefficients")
        bad = [c for c in coefficients if not math.isfinite(c)]
        if bad:
            raise ValueError(f"update coefficients must be finite numbers, got {bad[:4]}")
        per_seed = [self._es_offsets(int(s)) for s in seeds]
        self._es_seen_offsets.clear()
        chosen = list(range(len(self._es_master))) if indices is None else list(indices)
        kernels = self._es_kernels if indices is None else self._es_subset_kernels(chosen)
        if kernels is not None:
            kernels.update(
                self._es_update_table, [[o[i] for i in chosen] for o in per_seed], coefficients
            )
            return
        with torch.inference_mode():
            for i in chosen:
                master = self._es_master[i]
                offsets = [member_offsets[i] for member_offsets in per_seed]
                noise.accumulate_(
                    master,
                    self._es_update_table,
                    offsets,
                    coefficients,
                    self._es_scratch,
                    self._es_segments[i],
                )
                self._es_serve_master(i)

    def _es_subset_kernels(self, indices: list[int]) -> DeviceWeights | None:
        """The CUDA kernels' job list of some tensors (built once per set), or None where the
        kernels do not apply."""
        if self._es_kernels is None:
            return None
        key = tuple(indices)
        cached = getattr(self, "_es_subset", None)
        if cached is None or cached[0] != key:
            pick = [self._es_live, self._es_snapshot, self._es_master, self._es_segments]
            parts = [[tensors[i] for i in indices] for tensors in pick]
            cached = (key, DeviceWeights.for_cuda(*parts, self._es_table))
            self._es_subset = cached
        return cached[1]

    def _es_offsets(self, seed: int) -> list[int]:
        """Member `seed`'s noise offsets, kept from its perturbation until the next update:
        hashing them is about 0.3 ms a member for SmolLM2-135M's 182 tensors, as long as the
        update's kernel takes for 2 members on an H200."""
        from engine import noise

        if seed not in self._es_seen_offsets:
            if len(self._es_seen_offsets) >= KEPT_OFFSETS:  # perturbations with no update
                self._es_seen_offsets.clear()
            table_len = self._es_table.numel()
            self._es_seen_offsets[seed] = noise.noise_offsets(seed, self._es_specs, table_len)
        return self._es_seen_offsets[seed]

    def _es_serve_master(self, i: int) -> None:
        """snapshot := cast(master), and the serving weights := snapshot (packed where the
        live tensor is), after master `i` changed."""
        self._es_snapshot[i].copy_(self._es_master[i])
        cpu_packed.write_live_(self._es_live[i], self._es_snapshot[i], self._es_layouts[i])

    def _es_logical_live(self, i: int) -> torch.Tensor:
        """Serving weights `i` in the logical layout (a copy only where they are packed)."""
        layout = self._es_layouts[i]
        return (
            self._es_live[i] if layout is None else cpu_packed.to_logical(self._es_live[i], layout)
        )

    @_writes_weights
    def es_lora_update(
        self, spec: dict[str, Any], seeds: list[int], coefficients: list[float]
    ) -> None:
        """The update of members served from LoRA slots, into master and serving weights
        (fp32): the low-rank members' merged update, or (a member_noise spec) the full-rank
        update of the tensors the members perturbed."""
        if member_noise.is_noise_spec(spec):
            member_noise.apply_update(self, _model(self), spec, seeds, coefficients)
        else:
            lora_slots.apply_lora_update(self, _model(self), spec, seeds, coefficients)

    def es_lora_members(self, members: list[list[Any]], spec: dict[str, Any]) -> list[int]:
        """Write population members (slot, seed, scale) into their LoRA slots: low-rank
        factors (lora_slots.write_member_slots) or full-rank noise headers
        (member_noise.write_members); returns the slots not registered here."""
        if member_noise.is_noise_spec(spec):
            return member_noise.write_members(self, _model(self), spec, members)
        return lora_slots.write_member_slots(self, _model(self), spec, members)

    # ---- checks -----------------------------------------------------------------------------

    def es_checksum(self) -> str:
        """sha256 over every serving tensor and its fp32 master (names, dtypes, shapes, bytes
        in the logical layout; on a GPU each tensor's bytes are first reduced there, see
        fingerprint).

        Engines that agree on it serve the same weights and will compute the same updates,
        whether or not their CPUs keep weights packed. With the CUDA kernels, one kernel
        hashes all tensors on the card (cuda/kernels.fingerprint), in about the time of
        reading them once.
        """
        digest = hashlib.sha256()
        if self._es_kernels is not None:
            for name, live in zip(self._es_names, self._es_live, strict=True):
                digest.update(f"{name}|{live.dtype}|{tuple(live.shape)}".encode())
            digest.update(self._es_kernels.fingerprint().to_bytes(8, "little"))
            return digest.hexdigest()
        for i, (name, master) in enumerate(zip(self._es_names, self._es_master, strict=True)):
            live = self._es_logical_live(i)
            digest.update(f"{name}|{live.dtype}|{tuple(live.shape)}".encode())
            digest.update(hashed_bytes(live))
            digest.update(hashed_bytes(master))
        return digest.hexdigest()

    def es_check_snapshot(self) -> list[str]:
        """Names of tensors whose serving weights differ (bitwise) from the snapshot."""
        return [
            name
            for i, (name, snap) in enumerate(zip(self._es_names, self._es_snapshot, strict=True))
            if not _bit_equal(self._es_logical_live(i), snap)
        ]

    def es_check_master(self) -> list[str]:
        """Names of tensors whose snapshot is not exactly cast(master)."""
        return [
            name
            for name, master, snap in zip(
                self._es_names, self._es_master, self._es_snapshot, strict=True
            )
            if not _bit_equal(master.to(snap.dtype), snap)
        ]

    def es_check_store_reference(self) -> int:
        """Keep a private copy of the current serving weights (for es_check_reference)."""
        self._es_reference = [t.detach().clone() for t in self._es_live]
        return len(self._es_reference)

    def es_check_reference(self) -> list[str]:
        """Names of tensors whose serving weights differ (bitwise) from the stored copy."""
        return [
            name
            for name, live, ref in zip(
                self._es_names, self._es_live, self._es_reference, strict=True
            )
            if not _bit_equal(live, ref)
        ]

    def es_check_noise(self, seed: int, names: list[str], count: int) -> dict[str, list[float]]:
        """The first `count` noise values of each named tensor (this rank's shard, logical
        layout) for member `seed`."""
        import torch

        from engine import noise

        offsets = noise.noise_offsets(int(seed), self._es_specs, self._es_table.numel())
        out = {}
        for name in names:
            i = self._es_names.index(name)
            views = [noise.noise_view(self._es_table, offsets[i], s) for s in self._es_segments[i]]
            flat = torch.cat([v.reshape(-1) for v in views])[:count]
            out[name] = [float(v) for v in flat.float().tolist()]
        return out

    def es_check_lora_slot(
        self, slot: int, name: str
    ) -> tuple[list[list[float]], list[list[float]]]:
        """The factors member slot `slot` holds for target `name` (lora_slots.slot_factors)."""
        return lora_slots.slot_factors(self, _model(self), slot, name)

    def es_check_member_slots(self, members: list[int]) -> list[int]:
        """The slot each member's adapter holds (lora_slots.active_member_slots)."""
        manager = self.model_runner.lora_manager._adapter_manager
        return lora_slots.active_member_slots(manager, members)[0]

    def es_check_values(self, name: str, count: int) -> dict[str, list[float]]:
        """The first `count` entries of a tensor (logical layout): serving, snapshot and
        master, as floats."""
        i = self._es_names.index(name)
        return {
            kind: tensor.reshape(-1)[:count].float().tolist()
            for kind, tensor in (
                ("live", self._es_logical_live(i)),
                ("snapshot", self._es_snapshot[i]),
                ("master", self._es_master[i]),
            )
        }

    def es_check_shards(self, kind: str) -> dict[str, tuple[Any, ...]]:
        """This rank's `kind` tensors (live, snapshot or master), each with where it lies in
        the whole tensor: name -> (whole shape, blocks, shard shape, dtype, raw bytes in
        logical layout), to put a tensor-parallel engine's weights back together
        (shards.ShardMap.put)."""
        import torch

        tensors = {
            "live": [self._es_logical_live(i) for i in range(len(self._es_names))],
            "snapshot": self._es_snapshot,
            "master": self._es_master,
        }
        out = {}
        for name, t, m in zip(self._es_names, tensors[kind], self._es_maps, strict=True):
            logical = t.to("cpu").contiguous()
            raw = logical.view(-1).view(torch.uint8).numpy().tobytes()
            blocks = [tuple(b) for b in m.blocks]
            out[name] = (list(m.shape), blocks, list(m.shard_shape), str(t.dtype), raw)
        return out

    def es_check_info(self) -> list[tuple[str, list[int], str, bool]]:
        """(name, shape, dtype, stored packed) of every parameter."""
        return [
            (name, list(t.shape), str(t.dtype), layout is not None)
            for name, t, layout in zip(self._es_names, self._es_live, self._es_layouts, strict=True)
        ]

    def es_check_fp32_copies(self) -> int:
        """fp32 weight copies (CPUs without bf16 hardware) that missed a write of their
        weight: 0 unless a method that writes weights lacks @_writes_weights."""
        return cpu_weights.fp32_weights().stale()

    def es_check_synchronize(self) -> None:
        """Wait for the device's queued work (weight changes on a GPU are asynchronous, so a
        timing of perturb or update must end with this); nothing to wait for on the CPU."""
        import torch

        if self._es_live[0].device.type == "cuda":
            torch.cuda.synchronize(self._es_live[0].device)

    def es_time_copy(self, repeats: int) -> list[float]:
        """Seconds of `repeats` plain copies of all serving weights into a spare buffer, after
        one untimed copy that faults its pages in (the yardstick of bench/perturb.py)."""
        import torch

        spare = [torch.empty_like(t) for t in self._es_live]
        seconds = []
        with torch.inference_mode():
            for i in range(max(1, repeats) + 1):
                self.es_check_synchronize()
                start = time.perf_counter()
                for dst, src in zip(spare, self._es_live, strict=True):
                    dst.copy_(src)
                self.es_check_synchronize()
                if i > 0:
                    seconds.append(time.perf_counter() - start)
        return seconds

    def es_time_perturb(self, repeats: int) -> list[float]:
        """Seconds of `repeats` perturbations (a new seed each) timed inside the worker, after
        an untimed one, then a restore: the kernels alone, without the call to the worker
        (bench/perturb.py sets them against es_time_copy)."""
        seconds = self._es_timed(lambda i: self.es_perturb(30_000 + i, 0.002), repeats)
        self.es_restore()
        return seconds

    def es_time_restore(self, repeats: int) -> list[float]:
        """Seconds of `repeats` restores, each of a member perturbed outside the clock, timed
        inside the worker."""
        return self._es_timed(
            lambda _: self.es_restore(),
            repeats,
            before=lambda i: self.es_perturb(31_000 + i, 0.002),
        )

    def es_time_update(self, population: int, repeats: int) -> list[float]:
        """Seconds of `repeats` updates of `population` members, timed inside the worker, each
        with its members' offsets kept beforehand as a step's perturbations keep them. The
        coefficients are 1e-9: the weights move by less than their rounding, so a benchmark
        may time this on the engine it measures."""

        def seeds(i: int) -> list[int]:
            return [32_000 + i * population + k for k in range(population)]

        return self._es_timed(
            lambda i: self.es_update(seeds(i), [1e-9] * population),
            repeats,
            before=lambda i: [self._es_offsets(s) for s in seeds(i)],
        )

    def _es_timed(
        self,
        operation: Callable[[int], None],
        repeats: int,
        before: Callable[[int], object] | None = None,
    ) -> list[float]:
        """Seconds of operation(1..repeats), each synchronized and preceded by before(i) off
        the clock, after an untimed round 0 (the first call pays for lazily built state)."""
        seconds = []
        for i in range(max(1, repeats) + 1):
            if before is not None:
                before(i)
            self.es_check_synchronize()
            start = time.perf_counter()
            operation(i)
            self.es_check_synchronize()
            if i > 0:
                seconds.append(time.perf_counter() - start)
        return seconds

    def es_time_noise_floor(self, population: int, repeats: int) -> list[float]:
        """Seconds of `repeats` reads of `population` members' noise, each member's once, as
        the update reads it and nothing else: the floor the update is measured against
        (bench/gpu/utilization.py). Only the CUDA kernels have it; [] elsewhere."""
        from engine import noise

        if self._es_kernels is None:
            return []
        table_len = self._es_table.numel()
        seconds = []
        for i in range(max(1, repeats) + 1):
            offsets = [
                noise.noise_offsets(40_000 + i * population + k, self._es_specs, table_len)
                for k in range(population)
            ]
            self.es_check_synchronize()
            start = time.perf_counter()
            self._es_kernels.read_noise(self._es_update_table, offsets)
            self.es_check_synchronize()
            if i > 0:
                seconds.append(time.perf_counter() - start)
        return seconds

    # ---- saving and loading --------------------------------------------------------------------

    def es_save_master(self, path: str) -> str:
        """Write this rank's fp32 master (logical layout, vLLM names) for exact resume, at
        this or another tensor-parallel size (masters.py); return the file."""
        tensors = {
            name: master.to("cpu").contiguous()
            for name, master in zip(self._es_names, self._es_master, strict=True)
        }
        return str(masters.write(Path(path), self._es_tp_rank, self._es_tp_size, tensors))

    @_writes_weights
    def es_load_master(self, path: str) -> None:
        """Replace master, snapshot and serving weights by a saved master (exact resume),
        written at any tensor-parallel size."""
        import torch

        with (
            masters.SavedMaster(Path(path), self._es_tp_rank, self._es_tp_size) as saved,
            torch.inference_mode(),
        ):
            saved.check_names(set(self._es_names))
            for i, name in enumerate(self._es_names):
                master = self._es_master[i]
                tensor = saved.read(name, self._es_rules[i])
                if tensor.shape != master.shape or tensor.dtype != torch.float32:
                    raise ValueError(
                        f"{saved.files[0].parent}: {name} is {tensor.dtype} "
                        f"{tuple(tensor.shape)}, expected float32 {tuple(master.shape)}"
                    )
                master.copy_(tensor)
                self._es_serve_master(i)

    def es_save_hf(self, path: str, masters_folder: str | None = None) -> str:
        """Write the unperturbed serving weights as a Hugging Face folder; return it.

        With tensor_parallel_size > 1 no rank holds the whole model: every rank has saved
        its master into `masters_folder` (VLLMEngine.save_hf), and rank 0 puts the whole
        tensors back together from those files and casts them to the serving dtype, which
        gives the serving weights exactly (they are cast(master)); the other ranks write
        nothing and return "".
        """
        from engine.backends.vllm import hf_export

        if self._es_tp_size == 1:
            params = dict(zip(self._es_names, self._es_snapshot, strict=True))
        elif masters_folder is None:
            raise ValueError("save_hf with tensor_parallel_size > 1 needs the ranks' masters")
        elif self._es_tp_rank != 0:
            return ""
        else:
            with masters.SavedMaster(Path(masters_folder), 0, 1) as saved:
                params = {
                    name: saved.read(name, rule).to(snap.dtype)
                    for name, rule, snap in zip(
                        self._es_names, self._es_rules, self._es_snapshot, strict=True
                    )
                }
        tensors = hf_export.unfuse(params, _fused_modules(_model(self)))
        tensors = hf_export.match_source(
            tensors,
            hf_export.source_tensor_specs(self._es_model_dir),
            hf_export.tied_word_embeddings(self._es_model_dir),
        )
        return str(hf_export.write_hf_folder(tensors, self._es_model_dir, path))


def _model(worker: Any) -> torch.nn.Module:
    runner = worker.model_runner
    return runner.get_model() if hasattr(runner, "get_model") else runner.model


def _tp_rank_and_size() -> tuple[int, int]:
    from vllm.distributed import (
        get_tensor_model_parallel_rank,
        get_tensor_model_parallel_world_size,
    )

    return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()


def _gpu_id(device: torch.device) -> str | None:
    """The card as the machine numbers it (nvidia-smi's index, or the UUID where
    CUDA_VISIBLE_DEVICES names cards so), None off CUDA. Ray gives each engine's actor its
    cards in CUDA_VISIBLE_DEVICES, so every engine's own device is cuda:0, which would name
    all four cards of a 4-GPU run alike."""
    if device.type != "cuda":
        return None
    index = device.index or 0
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    visible = [v for v in visible if v]
    return visible[index] if index < len(visible) else str(index)


def _device_name(device: torch.device) -> str:
    """The card's name (NVIDIA H100 80GB HBM3), or the CPU's model, for the run's log."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from engine.backends.vllm.cpu.resources import cpu_model

    return cpu_model()


def _fused_modules(model: Any) -> dict[str, tuple[list[str], list[int]]]:
    """Module path -> (checkpoint part names, their sizes in the whole tensor) for every
    fused module: the parts of its shard rule (a rank's `output_partition_sizes` are its
    shard's, and q/k/v's differ from the whole's even in proportion when key-value heads are
    copied), else, for a layer shards.py does not know, vLLM's sizes (size 1 only)."""
    mapping = getattr(model, "packed_modules_mapping", {}) or {}
    fused = {}
    for path, module in model.named_modules():
        path = path.removesuffix(".base_layer")  # the fused layer inside a LoRA wrapper
        leaf = path.rpartition(".")[2]
        sizes = getattr(module, "output_partition_sizes", None)
        if leaf in mapping and sizes is not None and len(sizes) == len(mapping[leaf]):
            rule = shards.rule_of(getattr(module, "base_layer", module), "weight")
            if rule is not None and len(rule.parts) == len(sizes):
                sizes = [part.size for part in rule.parts]
            fused[path] = (list(mapping[leaf]), [int(s) for s in sizes])
    return fused


def _rule(model: torch.nn.Module, name: str) -> shards.ShardRule | None:
    """The shard rule of parameter `name` (vLLM's name), from the layer that owns it."""
    path, _, attr = name.rpartition(".")
    return shards.rule_of(model.get_submodule(path), attr)


def _shard_map(
    name: str, rule: shards.ShardRule | None, live: torch.Tensor, rank: int, size: int
) -> shards.ShardMap:
    """Where this rank's `live` tensor lies in the whole parameter; refuses, by name, what
    a rank cannot map exactly."""
    if size == 1:
        return shards.shard_map(shards.WHOLE, live.shape, 0, 1)
    if rule is None:
        raise NotImplementedError(
            f"{name}: tensor_parallel_size {size} needs to know how vLLM shards its layer, "
            "and shards.py has no rule for it; run this model with tensor_parallel_size 1"
        )
    found = shards.shard_map(rule, shards.whole_shape(rule, live.shape), rank, size)
    if found.shard_shape != tuple(live.shape):
        raise ValueError(
            f"{name}: rank {rank} of {size} holds {tuple(live.shape)}, but its layer's "
            f"sharding gives {found.shard_shape}"
        )
    return found


def _bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (torch.equal calls -0.0 equal to 0.0 and NaN unequal to itself)."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
