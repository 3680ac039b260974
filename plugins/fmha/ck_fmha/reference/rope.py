"""Rotary position embedding as CK's append-KV kernel applies it.

``cos``/``sin`` tables are [max_position, rotary_dim / 2]; position p uses
row p.  Only the first ``rotary_dim`` channels rotate; the rest pass through.

* interleaved (GPT-J): pairs (x[2i], x[2i+1]) rotate by angle i
* half_rotated (GPT-NeoX): pairs (x[i], x[i + rotary_dim/2]) rotate by angle i

rotation: (a, b) -> (a cos - b sin, b cos + a sin)
"""
from __future__ import annotations

import numpy as np


def make_rotary_tables(max_position: int, rotary_dim: int, base: float = 10000.0):
    """Standard RoPE tables cos/sin [max_position, rotary_dim/2] (float64)."""
    inv = base ** (-np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    ang = np.arange(max_position, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(ang), np.sin(ang)


def apply_rope(x: np.ndarray, positions: np.ndarray, cos: np.ndarray, sin: np.ndarray,
               rotary_dim: int, interleaved: bool) -> np.ndarray:
    """Rotate ``x[..., seq, dim]`` whose rows sit at ``positions`` [seq]; float64 result."""
    x = np.asarray(x, dtype=np.float64)
    out = x.copy()
    c = np.asarray(cos, dtype=np.float64)[positions]  # [seq, r/2]
    s = np.asarray(sin, dtype=np.float64)[positions]
    half = rotary_dim // 2
    if interleaved:
        a, b = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
        out[..., 0:rotary_dim:2] = a * c - b * s
        out[..., 1:rotary_dim:2] = b * c + a * s
    else:
        a, b = x[..., :half], x[..., half:rotary_dim]
        out[..., :half] = a * c - b * s
        out[..., half:rotary_dim] = b * c + a * s
    return out
