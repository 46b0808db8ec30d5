"""Time CUDA engines' weight operations, kernels against the torch path, on a model's shapes.

No engine starts: the model's tensors (names and shapes from its safetensors headers, as the
checkpoint stores them, q/k/v and gate/up unfused) are made on the GPU with random values,
with their snapshot, fp32 master and the noise table an engine builds. Printed, as medians of
--repeats timed calls after one untimed one:
- the yardsticks: one plain copy of all weights tensor by tensor, and as one flat buffer;
- perturb, restore, update of --population members and the agreement fingerprint, by the
  one-launch kernels (engine/backends/vllm/cuda) at each --blocks size, and by the torch
  path of engine.noise (what CUDA engines ran before);
- the update's floor: the members' noise read once, by the same kernel without the master;
- whether the kernels' perturbation and update have the torch path's bits.

    python3 bench/gpu/weight_kernels.py MODEL_DIR [--population 32] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import time
from collections.abc import Callable
from pathlib import Path

import torch

from engine import noise
from engine.backends.vllm.cuda.weights import DeviceWeights


def checkpoint_shapes(model: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, from the headers of the model's safetensors files."""
    shapes = {}
    for path in sorted(model.glob("*.safetensors")):
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        shapes |= {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}
    return shapes


def timed(fn: Callable[[int], None], repeats: int) -> float:
    """Median seconds of fn(i), synchronized with the GPU where there is one, after one
    untimed call (bench/gpu/member_noise_kernel.py runs on a CPU too, in Triton's
    interpreter)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None
    fn(-1)
    sync()
    seconds = []
    for i in range(repeats):
        start = time.perf_counter()
        fn(i)
        sync()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--population", type=int, default=32)
    parser.add_argument("--blocks", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    shapes = checkpoint_shapes(args.model)
    generator = torch.Generator(device="cuda").manual_seed(0)
    names = sorted(shapes)
    live = [
        torch.randn(shapes[n], generator=generator, device="cuda").to(torch.bfloat16) for n in names
    ]
    snapshot = [t.clone() for t in live]
    master = [t.float() for t in live]
    segments = [noise.whole(t.numel()) for t in live]
    specs = [(n, t.numel()) for n, t in zip(names, live, strict=True)]
    table_len = noise.noise_table_len(max(t.numel() for t in live))
    table = noise.build_noise_table(table_len, device="cuda")
    members = [noise.noise_offsets(s, specs, table_len) for s in range(args.population)]
    coefficients = [1e-6 * (-1) ** k for k in range(args.population)]
    spare = [torch.empty_like(t) for t in live]
    flat = torch.empty(sum(t.numel() for t in live), dtype=torch.bfloat16, device="cuda")
    flat_spare = torch.empty_like(flat)

    def torch_perturb(i: int) -> None:
        for t, s, o, seg in zip(live, snapshot, members[i % len(members)], segments, strict=True):
            noise.perturb_(t, s, table, o, 0.002, seg)

    def torch_update(i: int) -> None:
        for k, (m, seg) in enumerate(zip(master, segments, strict=True)):
            noise.accumulate_(m, table, [o[k] for o in members], coefficients, segments=seg)
            snapshot[k].copy_(m)
            live[k].copy_(snapshot[k])

    # the bits first, before any update moves the snapshot
    torch_perturb(0)
    torch_bits = [t.clone() for t in live]
    devices = {
        block: DeviceWeights.build(live, snapshot, master, segments, table, block)
        for block in args.blocks
    }
    results = {
        "card": torch.cuda.get_device_name(0),
        "model": str(args.model),
        "tensors": len(live),
        "parameters": sum(t.numel() for t in live),
        "population": args.population,
    }
    for block, device in devices.items():
        device.perturb(table, members[0], 0.002)
        results[f"kernels {block}: vector loads"] = device.vectorized
        results[f"kernels {block}: perturbation has the torch path's bits"] = all(
            torch.equal(a.view(torch.int16), b.view(torch.int16))
            for a, b in zip(live, torch_bits, strict=True)
        )
    ms = results["ms"] = {
        "copy, tensor by tensor": timed(
            lambda i: [d.copy_(s) for d, s in zip(spare, live, strict=True)], args.repeats
        ),
        "copy, one flat buffer": timed(lambda i: flat_spare.copy_(flat), args.repeats),
        "torch perturb": timed(torch_perturb, args.repeats),
        "torch restore": timed(
            lambda i: [t.copy_(s) for t, s in zip(live, snapshot, strict=True)], args.repeats
        ),
        f"torch update_{args.population}": timed(torch_update, 3),
    }
    for block, device in devices.items():
        ms[f"kernels {block}: perturb"] = timed(
            lambda i, d=device: d.perturb(table, members[i % len(members)], 0.002), args.repeats
        )
        ms[f"kernels {block}: restore"] = timed(lambda i, d=device: d.restore(), args.repeats)
        ms[f"kernels {block}: update_{args.population}"] = timed(
            lambda i, d=device: d.update(table, members, coefficients), args.repeats
        )
        ms[f"kernels {block}: noise_{args.population} (floor)"] = timed(
            lambda i, d=device: d.read_noise(table, members), args.repeats
        )
        ms[f"kernels {block}: fingerprint"] = timed(lambda i, d=device: d.fingerprint(), 5)
    results["ms"] = {k: v * 1e3 for k, v in results["ms"].items()}
    copy = results["ms"]["copy, tensor by tensor"]
    for name, value in results["ms"].items():
        print(f"{name:45s} {value:9.3f} ms  {value / copy:6.2f}x copy")
    for name, value in results.items():
        if name != "ms":
            print(f"{name}: {value}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
