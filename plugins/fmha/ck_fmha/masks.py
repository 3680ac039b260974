"""Attention masks, ALiBi and sink semantics, as CK defines them.

Mask (``ck_tile/ops/fmha/block/block_masking.hpp``): a window (left, right)
is turned into CK's (y, x) coordinates and row i sees column j when
``i - y < j < i + x``.  Top-left alignment puts the diagonal at j = i,
bottom-right at j = i + (seqlen_k - seqlen_q); ``-1`` leaves a side open.

Sink tokens (CK ``kHasSink`` / ``IsOutOfSinkBound``, StreamingLLM): the first
``sink_tokens`` keys stay visible to every row even when the window's left
edge has passed them; the right edge (causality) still applies.

Sink logits (CK ``sink_v``, the gpt-oss style "attention sink"): one value per
query head, in the scaled-logit domain, that joins the softmax denominator as
a virtual key with a zero value vector: ``lse = log(exp(sink) + sum exp(s))``.
A row with no visible key then has o = 0 and lse = sink.

ALiBi (``block_position_encoding.hpp``): bias added to the scaled logits.  For
a causal mask CK uses the VERTICAL form ``+slope * j`` (equal to
``-slope * |i - j|`` up to a per-row constant, so softmax is the same but the
LSE differs); otherwise ``-slope * |i + off - j|`` with ``off`` the
bottom-right shift ``seqlen_k - seqlen_q`` (top-left masks: 0; no mask:
bottom-right, as CK's runner does).
"""
from __future__ import annotations

import math

import numpy as np

from .problem import FmhaProblem


def window_bounds(problem: FmhaProblem, seqlen_q: int, seqlen_k: int):
    """Per-row [lo, hi] (inclusive) visible key columns, as int64 arrays of length seqlen_q.

    Columns outside [0, seqlen_k) are clipped by the caller.
    """
    i = np.arange(seqlen_q, dtype=np.int64)
    big = np.int64(1) << 40
    if problem.mask == "none":
        return np.full_like(i, -big), np.full_like(i, big)
    off = seqlen_k - seqlen_q if problem.mask == "bottom_right" else 0
    left, right = problem.window_left, problem.window_right
    lo = i + off - left if left >= 0 else np.full_like(i, -big)
    hi = i + off + right if right >= 0 else np.full_like(i, big)
    return lo, hi


def visible(problem: FmhaProblem, seqlen_q: int, seqlen_k: int) -> np.ndarray:
    """Boolean [seqlen_q, seqlen_k]: True where row i may attend to column j."""
    lo, hi = window_bounds(problem, seqlen_q, seqlen_k)
    j = np.arange(seqlen_k, dtype=np.int64)[None, :]
    vis = (j >= lo[:, None]) & (j <= hi[:, None])
    if problem.sink_tokens:
        vis |= (j < problem.sink_tokens) & (j <= hi[:, None])
    return vis


def default_alibi_slopes(nhead: int) -> np.ndarray:
    """ALiBi slopes per head (Press et al.; CK's ``get_alibi_slopes``), float32."""
    def pow2(n):
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]

    if nhead & (nhead - 1) == 0:
        s = pow2(nhead)
    else:
        c = 1 << (nhead.bit_length() - 1)
        s = pow2(c) + pow2(2 * c)[0::2][: nhead - c]
    return np.asarray(s, dtype=np.float32)


def alibi_bias(problem: FmhaProblem, slopes: np.ndarray, seqlen_q: int, seqlen_k: int) -> np.ndarray:
    """ALiBi bias [H, seqlen_q, seqlen_k] (float64) for one batch, given slopes [H]."""
    slopes = np.asarray(slopes, dtype=np.float64).reshape(-1, 1, 1)
    i = np.arange(seqlen_q, dtype=np.float64)[:, None]
    j = np.arange(seqlen_k, dtype=np.float64)[None, :]
    if problem.is_causal:
        return slopes * np.broadcast_to(j, (seqlen_q, seqlen_k))[None]
    off = 0 if problem.mask in ("top_left", "generic") else seqlen_k - seqlen_q
    return -slopes * np.abs(i + off - j)[None]
