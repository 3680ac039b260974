"""Counter-based dropout RNG: Philox-4x32-10 in numpy uint32 arithmetic.

The dropout decision of element (batch b, query head h, row i, column j) is a
pure function of (seed, offset, b, h, i, j), so any device can reproduce it:

* key     = (seed_lo, seed_hi XOR offset_hi)        (64-bit seed, 64-bit offset)
* counter = (j, i, b * nhead_q + h, offset_lo)      (i, j local to the sequence)
* x = Philox4x32-10(counter, key); randval = x[0] >> 24  (a uint8, as CK stores it)
* keep iff randval <= floor((1 - p) * 255)          (CK's uint8 threshold rule)
* kept values are scaled by 1 / (1 - p)

Philox-4x32-10 is the Salmon et al. (SC'11) generator, the same one behind
cuRAND/rocRAND ``philox4_32_10`` and Random123; the known-answer vectors of
Random123 are checked in the tests.
"""
from __future__ import annotations

import numpy as np

_M0 = np.uint64(0xD2511F53)
_M1 = np.uint64(0xCD9E8D57)
_W0 = np.uint32(0x9E3779B9)
_W1 = np.uint32(0xBB67AE85)
_MASK32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Philox-4x32 with 10 rounds; all arguments broadcastable uint32 arrays.

    Returns a tuple of four uint32 arrays.
    """
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint32) for c in (c0, c1, c2, c3))
    c0, c1, c2, c3 = np.broadcast_arrays(c0, c1, c2, c3)
    k0 = np.uint32(k0)
    k1 = np.uint32(k1)
    with np.errstate(over="ignore"):
        for _ in range(10):
            p0 = _M0 * c0.astype(np.uint64)
            p1 = _M1 * c2.astype(np.uint64)
            hi0 = (p0 >> _S32).astype(np.uint32)
            lo0 = (p0 & _MASK32).astype(np.uint32)
            hi1 = (p1 >> _S32).astype(np.uint32)
            lo1 = (p1 & _MASK32).astype(np.uint32)
            c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
            k0 = np.uint32(k0 + _W0)
            k1 = np.uint32(k1 + _W1)
    return c0, c1, c2, c3


def dropout_randval(seed: int, offset: int, batch: int, head: int, nhead_q: int,
                    rows: int, cols: int) -> np.ndarray:
    """uint8 random values [rows, cols] of one (batch, head) attention matrix."""
    seed, offset = int(seed), int(offset)
    k0 = seed & 0xFFFFFFFF
    k1 = ((seed >> 32) ^ (offset >> 32)) & 0xFFFFFFFF
    i = np.arange(rows, dtype=np.uint32)[:, None]
    j = np.arange(cols, dtype=np.uint32)[None, :]
    bh = np.uint32((batch * nhead_q + head) & 0xFFFFFFFF)
    x0, _, _, _ = philox4x32_10(j, i, bh, np.uint32(offset & 0xFFFFFFFF), k0, k1)
    return (x0 >> np.uint32(24)).astype(np.uint8)


def keep_threshold(p_drop: float) -> int:
    """Largest uint8 random value that keeps an element (CK: floor(p_undrop * 255))."""
    return int(np.floor((1.0 - float(p_drop)) * 255.0))


def dropout_keep(randval: np.ndarray, p_drop: float) -> np.ndarray:
    """Boolean keep mask from uint8 random values."""
    return randval <= keep_threshold(p_drop)
