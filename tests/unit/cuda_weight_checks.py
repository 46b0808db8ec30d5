"""Checks of the one-launch weight kernels (engine/backends/vllm/cuda) against the torch path,
run by tests/unit/test_cuda_weights.py.

On a GPU the kernels are compiled and must give the torch path's bits. Without one they run
in Triton's interpreter on the CPU, which must be switched on before Triton is first
imported (so the test runs these in a fresh process there); it checks the indexing (jobs,
tiles, tensor-parallel segments) but rounds fma twice and casts to bf16 its own way, so
values are compared to within one rounding of the dtype there.
"""

from __future__ import annotations

import json
import traceback

import torch

from engine import noise
from engine.backends.vllm.cuda import weights
from engine.noise import Segment

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
BLOCK = 64  # several programs a tensor, and tails, at test sizes
SCALE = 0.5  # noise that shows in bf16: the wrong noise entry would be seen

# (local shape, its segments): whole tensors of sizes a multiple of 8 (vector loads), of
# awkward sizes, and the pieces a tensor-parallel rank holds (rows 2-3 of a 6 x 10 tensor;
# its columns 3-6; rows 1-2 and 4-5, as a fused QKV shard)
ALIGNED = [((48, 40), None), ((40,), None), ((8, 3), None)]
WHOLE = [((48, 40), None), ((40,), None), ((130, 7), None), ((3,), None)]
SHARDED = [
    ((2, 10), (Segment(0, 1, 20, 20, 20),)),
    ((6, 4), (Segment(0, 6, 4, 3, 10),)),
    ((4, 10), (Segment(0, 1, 20, 10, 20), Segment(20, 1, 20, 40, 20))),
    ((9, 16), None),
]
SETS = (ALIGNED, WHOLE, SHARDED)


def _model(shapes, seed=0):
    generator = torch.Generator().manual_seed(seed)
    snapshot = [torch.randn(shape, generator=generator).to(torch.bfloat16) for shape, _ in shapes]
    snapshot = [s.to(DEVICE) for s in snapshot]
    live = [s.clone() for s in snapshot]
    master = [s.float() for s in snapshot]
    segments = [
        segs or noise.whole(s.numel()) for s, (_, segs) in zip(snapshot, shapes, strict=True)
    ]
    table = torch.randn(5000, generator=generator).to(torch.bfloat16).to(DEVICE)
    kernels_of = weights.DeviceWeights.build(live, snapshot, master, segments, table, BLOCK)
    return live, snapshot, master, segments, table, kernels_of


def _eps(table, offset, segments, like):
    """The noise of a tensor's pieces, in float64, shaped like it."""
    pieces = [noise.noise_view(table, offset, s).reshape(-1) for s in segments]
    return torch.cat(pieces).double().view(like.shape)


def _offsets(seed, count):
    generator = torch.Generator().manual_seed(seed)
    return [int(x) for x in torch.randint(0, 3000, (count,), generator=generator)]


def _bits(tensor):
    return tensor.view(torch.int16 if tensor.itemsize == 2 else torch.int32)


def _same(actual, torch_path, exact):
    """On a GPU, the torch path's bits; in the interpreter (fma rounded twice), the exact
    result in float64 to within one rounding of the dtype."""
    if ON_GPU:
        assert torch.equal(_bits(actual), _bits(torch_path))
    else:
        torch.testing.assert_close(actual.double(), exact, rtol=2**-7, atol=1e-6)


def check_vector_loads_only_where_every_tensor_allows_them():
    assert [_model(shapes)[-1].vectorized for shapes in SETS] == [True, False, False]


def check_perturb_and_restore_match_the_torch_path():
    for shapes in SETS:
        _perturb_and_restore(shapes)


def _perturb_and_restore(shapes):
    live, snapshot, _, segments, table, device = _model(shapes)
    offsets = _offsets(1, len(live))
    device.perturb(table, offsets, SCALE)
    for out, snap, offset, segs in zip(live, snapshot, offsets, segments, strict=True):
        expected = torch.empty_like(snap)
        noise.perturb_(expected, snap, table, offset, SCALE, segs)
        _same(out, expected, snap.double() + SCALE * _eps(table, offset, segs, snap))
    device.restore()
    for out, snap in zip(live, snapshot, strict=True):
        assert torch.equal(out.view(torch.int16), snap.view(torch.int16))


def check_update_adds_every_member_in_order_and_serves_the_cast():
    for shapes in SETS:
        _update(shapes)


def _update(shapes):
    live, snapshot, master, segments, table, device = _model(shapes)
    members = [_offsets(10 + k, len(live)) for k in range(5)]
    coefficients = [0.1, -0.2, 0.0, 0.05, -0.01]
    expected = [m.clone() for m in master]
    for i, m in enumerate(expected):
        noise.accumulate_(
            m, table.float() if not ON_GPU else table, [o[i] for o in members], coefficients,
            segments=segments[i],
        )  # fmt: skip
    exact = [m.double() for m in master]
    for i, m in enumerate(exact):
        for k, c in enumerate(coefficients):
            m += c * _eps(table, members[k][i], segments[i], m)
    device.update(table, members, coefficients)
    for i in range(len(master)):
        _same(master[i], expected[i], exact[i])
        cast = master[i].to(torch.bfloat16)
        _same(snapshot[i], cast, cast.double())
        assert torch.equal(_bits(live[i]), _bits(snapshot[i]))


def check_an_all_zero_update_leaves_every_bit_alone():
    live, _, master, _, table, device = _model(WHOLE)
    master[0].view(-1)[0] = -0.0
    before = [m.clone() for m in master]
    device.update(table, [_offsets(3, len(live))], [0.0])
    for m, b in zip(master, before, strict=True):
        assert torch.equal(m.view(torch.int32), b.view(torch.int32))


def check_reading_the_noise_changes_nothing():
    live, _, master, _, table, device = _model(WHOLE)
    before = [t.clone() for t in (*live, *master)]
    device.read_noise(table, [_offsets(k, len(live)) for k in range(3)])
    for t, b in zip((*live, *master), before, strict=True):
        assert torch.equal(t, b)


def check_the_fingerprint_sees_one_entry_of_any_tensor_and_not_where_it_is_stored():
    first = _model(WHOLE)
    second = _model(WHOLE)  # the same values in other memory
    hashes = {first[-1].fingerprint(), second[-1].fingerprint()}
    assert len(hashes) == 1
    live, master = first[0], first[2]
    kept = live[2].view(-1)[5].clone()
    live[2].view(-1)[5] += 1
    changed_live = first[-1].fingerprint()
    live[2].view(-1)[5] = kept
    assert first[-1].fingerprint() in hashes
    master[1].view(-1)[-1] += 2.0**-20
    changed_master = first[-1].fingerprint()
    assert len({*hashes, changed_live, changed_master}) == 3


def check_the_kernels_apply_only_to_one_dtype_on_cuda():
    live, snapshot, master, segments, table, _ = _model(WHOLE)
    if not ON_GPU:
        assert weights.DeviceWeights.for_cuda(live, snapshot, master, segments, table) is None
        return
    assert weights.DeviceWeights.for_cuda(live, snapshot, master, segments, table) is not None
    mixed = [live[0].float(), *live[1:]]
    assert weights.DeviceWeights.for_cuda(mixed, snapshot, master, segments, table) is None


def main() -> None:
    """Run every check; print {name: None, or the failure's traceback} as JSON."""
    outcomes = {}
    for name, check in sorted(globals().items()):
        if name.startswith("check_"):
            try:
                check()
                outcomes[name] = None
            except Exception:  # each check's failure is reported, not raised
                outcomes[name] = traceback.format_exc()
    print(json.dumps(outcomes))


if __name__ == "__main__":
    main()
