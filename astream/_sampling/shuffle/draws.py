"""Draws made without their results: PCG64 stepped by arithmetic instead of by sampling.

A rank computes only its own canonical nodes' part of a shuffle, yet every node before
them must still consume its random draws in order (the next node starts where the last
one left the generator). For py1e most of those draws are ``uniform(lo, hi, size)`` jitters
(one 64-bit output each, whatever the bounds) interleaved with one bounded ``integers``
per span. Their values are unwanted, so the generator's 128-bit LCG is jumped over the
uniforms (``s -> a^d s + c (a^d - 1) / (a - 1)``, O(log d) multiplications, tables kept
per jump length) and only the bounded integers' 32-bit draws are computed, to replay the
Lemire rejections that decide how many draws they take. That is O(spans) Python
arithmetic in place of O(samples) sampling (~9 ns a sample here).

This reproduces NumPy's ``PCG64`` (XSL-RR output, the buffered ``next_uint32``) and its
``buffered_bounded_lemire_uint32``. :func:`supported` checks the arithmetic against the
real generator once per process, on spans that force rejections; where it disagrees (a
NumPy that changed either) the callers make the real draws, so a different NumPy is slower,
never wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache, lru_cache

import numpy as np

__all__ = ["jitter_draws", "supported"]

_MULT = 0x2360ED051FC65DA44385DF649FCCF645  # NumPy's PCG_DEFAULT_MULTIPLIER_128
_M32, _M64, _M128 = (1 << 32) - 1, (1 << 64) - 1, (1 << 128) - 1


class _Pcg64:
    """The state of a NumPy ``PCG64`` as Python integers: LCG state, increment and the
    buffered upper half of the last 64-bit output ``next_uint32`` split."""

    def __init__(self, bit_generator: np.random.BitGenerator) -> None:
        state = bit_generator.state
        self.state, self.inc = int(state["state"]["state"]), int(state["state"]["inc"])
        self.has32, self.u32 = int(state["has_uint32"]), int(state["uinteger"])

    def store(self, bit_generator: np.random.BitGenerator) -> None:
        bit_generator.state = {"bit_generator": "PCG64", "state": {"state": self.state, "inc": self.inc},
                               "has_uint32": self.has32, "uinteger": self.u32}

    def next64(self) -> int:
        s = self.state = (self.state * _MULT + self.inc) & _M128
        x = ((s >> 64) ^ s) & _M64
        rot = s >> 122
        return ((x >> rot) | (x << ((64 - rot) & 63))) & _M64

    def next32(self) -> int:
        if self.has32:
            self.has32 = 0
            return self.u32
        x = self.next64()
        self.has32, self.u32 = 1, x >> 32
        return x & _M32

    def advance(self, steps: int) -> None:
        """Skip ``steps`` 64-bit outputs (the buffered half stays: 64-bit draws never use it)."""
        if steps <= 0:
            return
        mult, plus = _jump(steps, self.inc)
        self.state = (mult * self.state + plus) & _M128

    def bounded(self, rng: int) -> None:
        """One ``integers(low, low + rng + 1)`` draw for ``1 <= rng < 2**32 - 1``, its value unused."""
        excl = rng + 1
        leftover = (self.next32() * excl) & _M32
        if leftover < excl:
            threshold = (_M32 - rng) % excl
            while leftover < threshold:
                leftover = (self.next32() * excl) & _M32


@cache
def _powers(inc: int) -> tuple[tuple[int, int], ...]:
    """``(a^(2^k), c (a^(2^k) - 1) / (a - 1))`` for k < 64: the LCG's jumps of 2^k steps."""
    out = []
    mult, plus = _MULT, inc
    for _ in range(64):
        out.append((mult, plus))
        plus = (plus * (mult + 1)) & _M128
        mult = (mult * mult) & _M128
    return tuple(out)


@lru_cache(maxsize=1 << 16)  # jump lengths are span sizes: a dataset has few distinct ones
def _jump(steps: int, inc: int) -> tuple[int, int]:
    """The affine map of ``steps`` LCG steps, composed from the power-of-two jumps."""
    mult, plus = 1, 0
    powers = _powers(inc)
    k = 0
    while steps:
        if steps & 1:
            m, p = powers[k]
            mult, plus = (mult * m) & _M128, (plus * m + p) & _M128
        steps >>= 1
        k += 1
    return mult, plus


def jitter_draws(rng: np.random.Generator, span_sizes: Sequence[int], low: int, high: int) -> bool:
    """Consume what py1e draws after a node's span shuffles, without computing it: per span
    ``integers(low, high)`` then ``uniform(lo, hi, size)``. Returns False (nothing drawn)
    where this cannot be done exactly: the caller then makes the real draws."""
    width = high - low - 1  # the inclusive range NumPy bounds by
    if not (1 <= width < _M32) or type(rng.bit_generator) is not np.random.PCG64 or not supported():
        return False
    pcg = _Pcg64(rng.bit_generator)
    for size in span_sizes:
        pcg.bounded(width)
        pcg.advance(size)
    pcg.store(rng.bit_generator)
    return True


@cache
def supported() -> bool:
    """Whether this NumPy's generator draws as modelled: the arithmetic replayed against
    real draws, on bounds that reject about half of the first draws (once per process)."""
    sizes = [0, 1, 7, 300, 2, 0, 5, 1 << 20]
    for low, high in ((375, 625), (0, (1 << 31) + 2), (10, 12)):
        for seed in range(4):
            real, modelled = np.random.default_rng(seed), np.random.default_rng(seed)
            real.integers(0, 3)  # leave half a 64-bit draw buffered, as a shuffle can
            modelled.integers(0, 3)
            for size in sizes:
                real.integers(low, high)
                real.uniform(-1.5, 2.5, size)
            pcg = _Pcg64(modelled.bit_generator)
            for size in sizes:
                pcg.bounded(high - low - 1)
                pcg.advance(size)
            pcg.store(modelled.bit_generator)
            if real.bit_generator.state != modelled.bit_generator.state:
                return False
    return True
