"""Moving between the public tensor layouts and per-batch [head, seq, dim] float64 views."""
from __future__ import annotations

import numpy as np

from ..problem import FmhaProblem


def f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def q_rows(p: FmhaProblem):
    """Per batch (start, length) of query rows in the packed/group or batch sense."""
    if p.is_group:
        s = p.seqstart_q
        return [(s[b], s[b + 1] - s[b]) for b in range(p.batch)]
    return [(0, p.seqlen_q)] * p.batch


def split_seq(p: FmhaProblem, x, lengths=None, seqstart=None, col_major=False):
    """Public [B,H,S,D] / [B,S,H,D] / packed [T,H,D] -> list of float64 [H, S_b, D].

    ``lengths`` truncates each batch's sequence (logical length <= physical).
    ``col_major`` reads V stored [B,H,D,S] / [H,D,T].
    """
    x = f64(x)
    out = []
    for b in range(p.batch):
        if p.is_group:
            a = seqstart[b]
            e = seqstart[b + 1]
            xb = x[:, :, a:e].transpose(0, 2, 1) if col_major else x[a:e].transpose(1, 0, 2)
        elif col_major:
            xb = x[b].transpose(0, 2, 1)
        elif p.layout == "bshd":
            xb = x[b].transpose(1, 0, 2)
        else:
            xb = x[b]
        if lengths is not None:
            xb = xb[:, : lengths[b]]
        out.append(xb)
    return out


def split_q(p: FmhaProblem, x):
    return split_seq(p, x, seqstart=p.seqstart_q)


def split_k(p: FmhaProblem, x, col_major=False):
    return split_seq(p, x, lengths=p.seqlens_k_list(), seqstart=p.seqstart_k, col_major=col_major)


def merge_q(p: FmhaProblem, parts, dim: int, dtype=np.float64):
    """list of [H, S_b, dim] -> public q/o layout."""
    H = p.nhead_q
    if p.is_group:
        out = np.zeros((p.total_q, H, dim), dtype=dtype)
        for (a, n), part in zip(q_rows(p), parts):
            out[a:a + n] = part.transpose(1, 0, 2)
        return out
    out = np.zeros((p.batch, H, p.seqlen_q, dim), dtype=dtype)
    for b, part in enumerate(parts):
        out[b] = part
    return out.transpose(0, 2, 1, 3).copy() if p.layout == "bshd" else out


def merge_k(p: FmhaProblem, parts, dim: int, heads: int, template_shape=None, dtype=np.float64):
    """list of [Hk, L_b, dim] -> public k layout (positions beyond L_b stay 0)."""
    if p.is_group:
        out = np.zeros((p.seqstart_k[-1], heads, dim), dtype=dtype)
        for b, part in enumerate(parts):
            a = p.seqstart_k[b]
            out[a:a + part.shape[1]] = part.transpose(1, 0, 2)
        return out
    out = np.zeros((p.batch, heads, p.seqlen_k, dim), dtype=dtype)
    for b, part in enumerate(parts):
        out[b, :, : part.shape[1]] = part
    return out.transpose(0, 2, 1, 3).copy() if p.layout == "bshd" else out


def merge_rows(p: FmhaProblem, parts, fill=0.0, dtype=np.float64):
    """list of [H, S_b] -> lse-like [B, H, Sq] or [H, Tq]."""
    if p.is_group:
        out = np.full((p.nhead_q, p.total_q), fill, dtype=dtype)
        for (a, n), part in zip(q_rows(p), parts):
            out[:, a:a + n] = part
        return out
    out = np.full((p.batch, p.nhead_q, p.seqlen_q), fill, dtype=dtype)
    for b, part in enumerate(parts):
        out[b] = part
    return out


def split_rows(p: FmhaProblem, x):
    """lse-like [B, H, Sq] or [H, Tq] -> list of float64 [H, S_b]."""
    x = f64(x)
    if p.is_group:
        return [x[:, a:a + n] for a, n in q_rows(p)]
    return [x[b] for b in range(p.batch)]


def merge_square(p: FmhaProblem, parts, dtype=np.float64):
    """list of [H, S_b, L_b] -> randval-like [B, H, Sq, Sk] or [H, Tq, max Sk]."""
    if p.is_group:
        out = np.zeros((p.nhead_q, p.total_q, p.seqlen_k), dtype=dtype)
        for (a, n), part in zip(q_rows(p), parts):
            out[:, a:a + n, : part.shape[2]] = part
        return out
    out = np.zeros((p.batch, p.nhead_q, p.seqlen_q, p.seqlen_k), dtype=dtype)
    for b, part in enumerate(parts):
        out[b, :, :, : part.shape[2]] = part
    return out


def bias_for(p: FmhaProblem, bias, b: int, sq: int, sk: int):
    """This batch's slice of the elementwise bias: [H|1, sq, sk] float64."""
    bias = np.asarray(bias)
    if p.is_group:
        a = p.seqstart_q[b]
        return f64(bias[:, a:a + sq, :sk])
    return f64(bias[b if bias.shape[0] > 1 else 0][:, :sq, :sk])


def slopes_for(p: FmhaProblem, slopes, b: int):
    s = f64(slopes)
    return s[b] if s.ndim == 2 else s


def expand_kv(x: np.ndarray, ratio: int) -> np.ndarray:
    """[Hk, L, D] -> [Hk*ratio, L, D]: query head h reads K/V head h // ratio."""
    return np.repeat(x, ratio, axis=0) if ratio > 1 else x
