"""A seeded pseudo-random permutation of `range(n)` evaluated at any positions, in memory
proportional to the positions asked for, never to `n`: what the sampler draws each epoch's order
from, so a dataset that claims 10¹² samples costs what the run reads, not a 10¹²-entry
`randperm`.

The permutation is a 4-round Feistel network over the smallest power-of-4 domain that holds n
(each half at most 31 bits, so n may reach 2⁶²), made a permutation of exactly `range(n)` by
cycle-walking: a value that lands outside is encrypted again until it falls inside. The round
keys come from `random.Random(str(seed))` (a string seed is hashed with SHA-512: the same in
every process and on every platform, whatever PYTHONHASHSEED), so every rank computes the same
order alone.
"""

from __future__ import annotations

import random

import torch

__all__ = ["permute"]

_ROUNDS = 4
_M32 = 0xFFFFFFFF


def _round(right: torch.Tensor, key: int, mask: int) -> torch.Tensor:
    """A keyed mix of `right` (< 2³¹) into [0, mask]: multiply-xorshift (murmur3's finaliser
    constants). int64 products may wrap; only their low 32 bits are kept, which wrapping keeps."""
    x = (right * 0x9E3779B1 + key) & _M32
    x = ((x ^ (x >> 16)) * 0x85EBCA6B) & _M32
    x = ((x ^ (x >> 13)) * 0xC2B2AE35) & _M32
    return (x ^ (x >> 16)) & mask


def _encrypt(x: torch.Tensor, keys: list[int], half: int) -> torch.Tensor:
    mask = (1 << half) - 1
    left, right = x >> half, x & mask
    for key in keys:
        left, right = right, left ^ _round(right, key, mask)
    return (left << half) | right


def permute(positions: torch.Tensor, n: int, seed: str | int) -> torch.Tensor:
    """The permutation of range(n) seeded by `seed`, at `positions` (int64 values in [0, n))."""
    if n < 1 or n > 1 << 62:
        raise ValueError(f"a permutation needs 1 <= n <= 2**62; got {n}")
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    rng = random.Random(str(seed))
    keys = [rng.getrandbits(31) for _ in range(_ROUNDS)]
    out = _encrypt(positions.to(torch.int64), keys, half)
    outside = out >= n
    while bool(outside.any()):  # cycle-walking: at most a few passes (the domain is < 4n)
        out[outside] = _encrypt(out[outside], keys, half)
        outside = out >= n
    return out
