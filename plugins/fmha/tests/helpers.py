"""Random problem/tensor factories and comparisons shared by the reference tests."""
from __future__ import annotations

import numpy as np

from ck_core.dtypes import numpy_storage, quantize
from ck_fmha.problem import FmhaProblem


def seqstart(lens):
    return [0, *np.cumsum(lens).tolist()]


def rand(rng, shape, dtype="fp32", scale=1.0):
    x = rng.standard_normal(shape) * scale
    return quantize(x, dtype) if dtype in ("fp8", "bf16") else x.astype(numpy_storage(dtype))


def make_qkv(rng, p: FmhaProblem, scale=1.0):
    """Random q, k, v (and do) in the problem's public layouts and storage dtype."""
    from ck_fmha.problem import expected_shapes

    sh = expected_shapes(p)
    q = rand(rng, sh["q"], p.dtype, scale)
    k = rand(rng, sh["k"], p.dtype, scale)
    v = rand(rng, sh["v"], p.dtype, scale)
    return q, k, v


def make_extras(rng, p: FmhaProblem, bias_heads=None, bias_batch=None, slopes_2d=False):
    out = {}
    if p.bias == "elementwise":
        if p.is_group:
            shape = (bias_heads or p.nhead_q, p.total_q, p.seqlen_k)
        else:
            shape = (bias_batch or p.batch, bias_heads or p.nhead_q, p.seqlen_q, p.seqlen_k)
        out["bias"] = rng.standard_normal(shape).astype(numpy_storage(p.dtype))
    if p.bias == "alibi":
        shape = (p.batch, p.nhead_q) if slopes_2d else (p.nhead_q,)
        out["alibi_slopes"] = (rng.uniform(0.05, 0.9, shape)).astype(np.float32)
    if p.sink_logits:
        out["sink"] = rng.uniform(-1, 3, (p.nhead_q,)).astype(np.float32)
    return out


def relerr(a, b):
    """max |a - b| / max |b| over finite entries; -inf positions must agree."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    fa, fb = np.isfinite(a), np.isfinite(b)
    assert np.array_equal(fa, fb), "non-finite positions differ"
    assert np.array_equal(a[~fa], b[~fb]), "infinities differ"
    if not fb.any():
        return 0.0
    den = max(np.max(np.abs(b[fb])), 1e-300)
    return float(np.max(np.abs(a[fa] - b[fb])) / den)
