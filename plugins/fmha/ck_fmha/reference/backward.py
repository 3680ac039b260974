"""NumPy references of the three backward stages (float64 inside).

With P the forward's softmax (rebuilt from the saved lse), Z the dropout keep
mask and r = 1 / (1 - p_drop):

    D   = rowsum(dO * O)                                    bwd_dot_do_o
    dV  = (P * Z * r)^T dO
    dP  = (dO V^T) * Z * r
    dS  = P * (dP - D)          (= dBias for an elementwise bias)
    dS' = dS * (1 - tanh^2(s/cap))  with a logits soft cap, else dS
    dQ  = scale * dS' K,  dK = scale * dS'^T Q              bwd_dq_dk_dv
    dq  = sum over splits of dq_acc, cast to the dtype      bwd_convert_dq

GQA: dK/dV of a K/V head sum over the query heads sharing it.  ``D`` is the
mathematical rowsum; CK's kernel folds an extra (1 - p_drop) into its own D
and undoes it later, which does not change dq/dk/dv.

``deterministic`` changes only how dq is accumulated: non-deterministic
kernels add every key tile into one fp32 ``dq_acc[0]`` (atomics); the
deterministic ones write one slice per key tile of ``kn0`` columns,
``dq_acc[t]``, and ``bwd_convert_dq`` sums them in order.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from ck_core.dtypes import quantize
from ck_core.errors import InvalidProblem

from . import layout as L
from ..problem import FmhaProblem, check_tensors
from .forward import batch_logits, dropout_for


class BwdResult(NamedTuple):
    """dq_acc float32 [S, *q shape] (or dq in the problem dtype), dk/dv float64 in k/v layout,
    dbias float64 in the bias's shape (None without an elementwise bias)."""

    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    dbias: Optional[np.ndarray] = None


def bwd_dot_do_o(p: FmhaProblem, o, do) -> np.ndarray:
    """D = rowsum(dO * O) as float32, shaped like lse ([B,H,Sq] / [H,Tq])."""
    check_tensors(p, o=o, do=do)
    prod = L.f64(o) * L.f64(do)
    if p.is_group:
        d = prod.sum(-1).T
    elif p.layout == "bshd":
        d = prod.sum(-1).transpose(0, 2, 1)
    else:
        d = prod.sum(-1)
    return np.ascontiguousarray(d).astype(np.float32)


def dq_splits(p: FmhaProblem, kn0: int = 128) -> int:
    """Number of dq_acc slices: one per key tile when deterministic, else 1."""
    if not p.deterministic:
        return 1
    return max(1, -(-max(p.seqlens_k_list(), default=0) // kn0))


def bwd_dq_dk_dv(p: FmhaProblem, q, k, v, lse, do, d, *, bias=None, alibi_slopes=None,
                 kn0: int = 128) -> BwdResult:
    """Main backward stage; returns (dq_acc float32, dk, dv, dbias)."""
    check_tensors(p, q=q, k=k, v=v, lse=lse, do=do, d=d, bias=bias, alibi_slopes=alibi_slopes)
    if p.bias == "elementwise" and bias is None:
        raise InvalidProblem("problem has bias='elementwise'; pass bias=")
    qs, ks, vs = L.split_q(p, q), L.split_k(p, k), L.split_k(p, v)
    dos = L.split_seq(p, do, seqstart=p.seqstart_q)
    lses, ds_ = L.split_rows(p, lse), L.split_rows(p, d)
    nsplit = dq_splits(p, kn0)
    ratio, Hk = p.nhead_ratio, p.nhead_k
    dq_parts = [[] for _ in range(nsplit)]
    dk_parts, dv_parts = [], []
    dbias = np.zeros(np.shape(bias)) if (bias is not None and p.bias == "elementwise") else None
    for b in range(p.batch):
        qb, kb, vb, dob = qs[b], ks[b], vs[b], dos[b]
        H, sq, sk = p.nhead_q, qb.shape[1], kb.shape[1]
        lg = batch_logits(p, qb, kb, b, bias=bias, alibi_slopes=alibi_slopes)
        lse_b = lses[b]
        # P = 0 where the mask hides a key or the row sees none (lse = -inf); NaN logits stay NaN
        vis = np.broadcast_to(lg.vis, lg.s.shape) & (lse_b != -np.inf)[..., None]
        with np.errstate(invalid="ignore", over="ignore"):
            P = np.where(vis, np.exp(np.where(vis, lg.s - np.where(lse_b == -np.inf, 0, lse_b)[..., None], 0.0)), 0.0)
        _, keep = dropout_for(p, b, sq, sk)
        zr = 1.0 if keep is None else keep / (1.0 - p.p_drop)
        kk, vv = L.expand_kv(kb, ratio), L.expand_kv(vb, ratio)
        dP = (dob @ np.ascontiguousarray(vv.swapaxes(-1, -2))) * zr   # contiguous: see batch_logits
        dS = P * (dP - ds_[b][..., None])
        if dbias is not None:
            g = dS if dbias.shape[-3] != 1 else dS.sum(0, keepdims=True)
            if p.is_group:
                a = p.seqstart_q[b]
                dbias[:, a:a + sq, :sk] += g
            else:
                dbias[b if dbias.shape[0] > 1 else 0, :, :sq, :sk] += g
        if lg.tanh is not None:
            dS = dS * (1.0 - lg.tanh ** 2)
        dS = dS * p.softmax_scale
        for t in range(nsplit):
            lo, hi = (t * kn0, (t + 1) * kn0) if nsplit > 1 else (0, sk)
            dq_parts[t].append(dS[:, :, lo:hi] @ kk[:, lo:hi])
        dk_full = np.ascontiguousarray(dS.swapaxes(-1, -2)) @ qb
        dv_full = np.ascontiguousarray((P * zr).swapaxes(-1, -2)) @ dob
        dk_parts.append(dk_full.reshape(Hk, ratio, sk, p.hdim_q).sum(1))
        dv_parts.append(dv_full.reshape(Hk, ratio, sk, p.hdim_v).sum(1))
    dq_acc = np.stack([L.merge_q(p, dq_parts[t], p.hdim_q) for t in range(nsplit)]).astype(np.float32)
    dk = L.merge_k(p, dk_parts, p.hdim_q, Hk)
    dv = L.merge_k(p, dv_parts, p.hdim_v, Hk)
    return BwdResult(dq_acc, dk, dv, dbias)


def bwd_convert_dq(p: FmhaProblem, dq_acc) -> np.ndarray:
    """Sum the dq_acc slices in order and round to the problem dtype (numpy storage)."""
    check_tensors(p, dq_acc=dq_acc)
    acc = np.asarray(dq_acc, dtype=np.float32)
    total = acc[0].copy()
    for t in range(1, acc.shape[0]):
        total += acc[t]
    return quantize(total, p.dtype)
