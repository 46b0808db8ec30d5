"""What the engines' agreement check hashes of one tensor.

On the CPU, the tensor's bytes go to sha256 as they are. On a GPU, copying every weight and
its fp32 master to the host for sha256 took 8.2 s of a 16 s ES step for a 1.07B model (H200,
measured), so the bits are first reduced on the device to a 64-bit universal hash: the sum of
the tensor's 32-bit (or 16-bit) words times fixed pseudo-random odd multipliers, mod 2^64.
Integer sums wrap and do not depend on the order of addition, so the value is exact and the
same on every run and card. A change of one word always changes it (an odd multiplier times a
nonzero word difference smaller than 2^32 is never 0 mod 2^64); several changes cancel out
with probability about 2^-64. The check is there to catch engines drifting apart, not an
adversary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

CHUNK = 1 << 24
"""Words hashed at once: 128 MiB of int64 temporaries on the device."""

_MULTIPLIERS: dict[str, torch.Tensor] = {}


def hashed_bytes(tensor: torch.Tensor) -> bytes | memoryview:
    """The bytes to feed to sha256 for `tensor`: its own bytes on the CPU, its 8-byte device
    hash on a GPU (together with dtype and shape, which the caller hashes)."""
    import torch

    flat = tensor.detach().reshape(-1).contiguous()
    if not flat.is_cuda:
        return memoryview(flat.view(torch.uint8).numpy())
    return device_hash(flat).to_bytes(8, "little")


def device_hash(flat: torch.Tensor) -> int:
    """sum_i word_i * m_i mod 2^64 over the words of a contiguous 1-D tensor (see above)."""
    import torch

    if flat.storage_offset():  # a view may start off the word alignment that view() needs
        flat = flat.clone()
    raw = flat.view(torch.uint8)
    words = next(
        raw.view(dtype)
        for dtype, size in ((torch.int32, 4), (torch.int16, 2), (torch.uint8, 1))
        if raw.numel() % size == 0
    )
    multipliers = _multipliers(flat.device)
    total = 0
    for start in range(0, words.numel(), CHUNK):
        chunk = words[start : start + CHUNK].to(torch.int64)
        part = int((chunk * multipliers[: chunk.numel()]).sum())  # wraps mod 2^64
        total = (total * 0x9E3779B97F4A7C15 + part) % (1 << 64)  # chunk order matters
    return total


def _multipliers(device: torch.device) -> torch.Tensor:
    import torch

    key = str(device)
    if key not in _MULTIPLIERS:
        generator = torch.Generator(device="cpu").manual_seed(0x5EED)
        values = torch.randint(
            -(1 << 62), 1 << 62, (CHUNK,), generator=generator, dtype=torch.int64
        )
        _MULTIPLIERS[key] = (values | 1).to(device)
    return _MULTIPLIERS[key]
