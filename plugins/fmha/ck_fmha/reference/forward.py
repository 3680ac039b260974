"""NumPy references of the forward FMHA families (float64 inside).

Every function takes the :class:`~ck_fmha.problem.FmhaProblem` first and the
tensors in the layouts of :mod:`ck_fmha.problem`.  Logits are

    s = scale * (scale_q q) . (scale_k k)          (scale_* = fp8 descales, else 1)
    s = cap * tanh(s / cap)                         (logits_soft_cap > 0)
    s = s + bias  |  s + alibi                      (bias after the scale, as CK)
    s = -inf where the mask hides (i, j)
    lse = log(sum_j exp(s) [+ exp(sink_h)]);  p = exp(s - lse)
    o = (p * keep / (1 - p_drop)) @ (scale_v v)

Rows with no visible key (and no sink logit) give o = 0 and lse = -inf; NaN or
Inf in q/k/v gives NaN (as torch), never that empty-row result.
Outputs o/lse are float64; split-KV accumulators are float32 as in CK.

fp8 (``dtype="fp8"``): q/k/v hold e4m3 values (numpy storage float32) and
``scale_q/k/v`` are per-tensor *descales*: the real tensors are ``scale_x * x``
and everything above is computed exactly on them.  The reference does not model
the kernels' own roundings: they quantise the probabilities to fp8 for the P V
product (``P * fp8_max``, 448 for OCP e4m3fn, 240 for e4m3fnuz, then
``o * scale_v / fp8_max``; ~2**-4 relative per element) and write o in bf16;
:func:`ck_fmha.plan.tolerance` allows for that (fp8: 0.25 rtol/atol).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from ck_core.errors import InvalidProblem

from . import layout as L
from ..masks import alibi_bias, visible
from ..paged import gather_paged_kv
from ..philox import dropout_keep, dropout_randval
from ..problem import FmhaProblem, check_tensors
from .rope import apply_rope


class FwdResult(NamedTuple):
    """o: public o layout; lse: [B,H,Sq] / [H,Tq]; randval: uint8 or None."""

    o: np.ndarray
    lse: np.ndarray
    randval: Optional[np.ndarray] = None


class SplitKvResult(NamedTuple):
    """o_acc: [S,B,H,Sq,Dv] / [S,Tq,H,Dv] float32; lse_acc: [S,B,H,Sq] / [S,H,Tq] float32."""

    o_acc: np.ndarray
    lse_acc: np.ndarray


class AppendKvResult(NamedTuple):
    """q after RoPE, and the caches after the append (float64, caches' layouts)."""

    q: np.ndarray
    k_cache: np.ndarray
    v_cache: np.ndarray


class Logits(NamedTuple):
    """Everything the backward needs to redo one batch's forward."""

    s: np.ndarray        # final logits (masked entries -inf) [H, sq, sk]
    vis: np.ndarray      # bool [sq, sk] or [H, sq, sk]
    tanh: Optional[np.ndarray]  # tanh(s_pre/cap) when soft-capped


def batch_logits(p: FmhaProblem, q, k, b: int, *, bias=None, alibi_slopes=None,
                 col_range=None) -> Logits:
    """Logits of batch ``b``: q [H, sq, Dq], k [Hk, sk, Dq] (float64, already descaled)."""
    H, sq, sk = q.shape[0], q.shape[1], k.shape[1]
    kk = L.expand_kv(k, p.nhead_ratio)
    # a contiguous K^T: OpenBLAS's batched product of a transposed view is ~100x slower on a busy
    # small machine (threads spinning), and `ck demo` spends its time here
    s = p.softmax_scale * (q @ np.ascontiguousarray(kk.swapaxes(-1, -2)))
    th = None
    if p.logits_soft_cap > 0:
        th = np.tanh(s / p.logits_soft_cap)
        s = p.logits_soft_cap * th
    if p.bias == "elementwise":
        s = s + L.bias_for(p, bias, b, sq, sk)
    elif p.bias == "alibi":
        s = s + alibi_bias(p, L.slopes_for(p, alibi_slopes, b), sq, sk)
    vis = visible(p, sq, sk)
    if col_range is not None:
        j = np.arange(sk)
        vis = vis & ((j >= col_range[0]) & (j < col_range[1]))[None, :]
    s = np.where(vis[None], s, -np.inf)
    return Logits(s, vis, th)


def softmax_lse(s: np.ndarray, sink: Optional[np.ndarray] = None):
    """Row softmax with an optional per-head sink logit; returns (p, lse)."""
    m = np.max(s, axis=-1, initial=-np.inf)
    if sink is not None:
        m = np.maximum(m, sink[:, None])
    # only a row with no visible key (m = -inf) is special: o = 0, lse = -inf.  NaN / +inf logits
    # (NaN or Inf in q/k/v) must come out as NaN, as in torch, never as that empty row
    empty = m == -np.inf
    m_safe = np.where(empty, 0.0, m)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(s - m_safe[..., None])
        z = e.sum(-1)
        if sink is not None:
            z = z + np.exp(sink[:, None] - m_safe)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(empty, -np.inf, np.log(z) + m_safe)
        pr = np.where(empty[..., None], 0.0, e / np.where(empty, 1.0, z)[..., None])
    return pr, lse


def dropout_for(p: FmhaProblem, b: int, sq: int, sk: int):
    """(randval uint8 [H, sq, sk], keep bool) of batch b; None when p_drop == 0."""
    if p.p_drop <= 0:
        return None, None
    rv = np.stack([dropout_randval(p.seed, p.offset, b, h, p.nhead_q, sq, sk) for h in range(p.nhead_q)])
    return rv, dropout_keep(rv, p.p_drop)


def _descale(p: FmhaProblem, qs, ks, vs):
    if p.dtype != "fp8":
        return qs, ks, vs
    return ([x * p.scale_q for x in qs], [x * p.scale_k for x in ks], [x * p.scale_v for x in vs])


def _attend_all(p: FmhaProblem, qs, ks, vs, *, bias=None, alibi_slopes=None, sink=None) -> FwdResult:
    qs, ks, vs = _descale(p, qs, ks, vs)
    sink64 = None if not p.sink_logits else L.f64(sink).reshape(-1)
    skipped = set(p.skipped_batches())
    os_, lses, rvs = [], [], []
    for b, (q, k, v) in enumerate(zip(qs, ks, vs)):
        H, sq, sk = p.nhead_q, q.shape[1], k.shape[1]
        if b in skipped:
            os_.append(np.zeros((H, sq, p.hdim_v)))
            lses.append(np.full((H, sq), -np.inf))
            rvs.append(np.zeros((H, sq, sk), np.uint8))
            continue
        lg = batch_logits(p, q, k, b, bias=bias, alibi_slopes=alibi_slopes)
        pr, lse = softmax_lse(lg.s, sink64)
        rv, keep = dropout_for(p, b, sq, sk)
        if keep is not None:
            pr = pr * keep / (1.0 - p.p_drop)
            rvs.append(rv)
        os_.append(pr @ L.expand_kv(v, p.nhead_ratio))
        lses.append(lse)
    o = L.merge_q(p, os_, p.hdim_v)
    lse = L.merge_rows(p, lses, fill=-np.inf)
    randval = L.merge_square(p, rvs, dtype=np.uint8) if p.store_randval else None
    return FwdResult(o, lse, randval)


def _require_sink(p: FmhaProblem, sink):
    if p.sink_logits and sink is None:
        raise InvalidProblem("problem has sink_logits=True; pass sink=<float array [nhead_q]>")


def fwd(p: FmhaProblem, q, k, v, *, bias=None, alibi_slopes=None, sink=None) -> FwdResult:
    """Plain forward (family ``fwd``); also the ground truth for every other forward."""
    check_tensors(p, q=q, k=k, v=v, bias=bias, alibi_slopes=alibi_slopes, sink=sink)
    _require_sink(p, sink)
    qs = L.split_q(p, q)
    ks = L.split_k(p, k)
    vs = L.split_k(p, v, col_major=p.vlayout == "c")
    return _attend_all(p, qs, ks, vs, bias=bias, alibi_slopes=alibi_slopes, sink=sink)


def split_ranges(seqlen_k: int, num_splits: int, tile: int = 1):
    """[start, end) key range of each split: CK hands each split ceil(tiles / splits) tiles."""
    tiles = -(-seqlen_k // tile)
    per = max(1, -(-tiles // num_splits)) * tile
    return [(min(s * per, seqlen_k), min((s + 1) * per, seqlen_k)) for s in range(num_splits)]


def fwd_splitkv(p: FmhaProblem, q, k, v, *, bias=None, alibi_slopes=None, sink=None,
                split_tile: int = 1, **paged_tables) -> SplitKvResult:
    """Split-KV main stage: per split, attention over its key range (float32 accumulators).

    Each split's o_acc is normalized by its own softmax sum and lse_acc is its
    log-sum-exp; an empty split gives o_acc = 0, lse_acc = -inf.  The sink
    logit (if any) joins split 0 only so the combine counts it once.  With
    ``paged_kv`` pass the caches as k/v and ``block_table=``.
    """
    _require_sink(p, sink)
    qs = L.split_q(p, q)
    if p.paged_kv:
        check_tensors(p, q=q, k_cache=k, v_cache=v, bias=bias, alibi_slopes=alibi_slopes, sink=sink,
                      **paged_tables)
        ks, vs = gather_paged_kv(p, k, v, **paged_tables)
    else:
        check_tensors(p, q=q, k=k, v=v, bias=bias, alibi_slopes=alibi_slopes, sink=sink)
        ks, vs = L.split_k(p, k), L.split_k(p, v)
    qs, ks, vs = _descale(p, qs, ks, vs)
    S = p.num_splits
    sink64 = None if not p.sink_logits else L.f64(sink).reshape(-1)
    o_parts = [[] for _ in range(S)]
    l_parts = [[] for _ in range(S)]
    for b, (qb, kb, vb) in enumerate(zip(qs, ks, vs)):
        ranges = split_ranges(kb.shape[1], S, split_tile)
        vv = L.expand_kv(vb, p.nhead_ratio)
        for si, rng_ in enumerate(ranges):
            lg = batch_logits(p, qb, kb, b, bias=bias, alibi_slopes=alibi_slopes, col_range=rng_)
            pr, lse = softmax_lse(lg.s, sink64 if si == 0 else None)
            o_parts[si].append(pr @ vv)
            l_parts[si].append(lse)
    o_acc = np.stack([L.merge_q(attrs_batch_layout(p), o_parts[s], p.hdim_v) for s in range(S)])
    lse_acc = np.stack([L.merge_rows(p, l_parts[s], fill=-np.inf) for s in range(S)])
    return SplitKvResult(o_acc.astype(np.float32), lse_acc.astype(np.float32))


def attrs_batch_layout(p: FmhaProblem) -> FmhaProblem:
    """o_acc is always [B, H, Sq, Dv] in batch mode (CK's accumulator layout)."""
    import attrs

    return p if (p.is_group or p.layout == "bhsd") else attrs.evolve(p, layout="bhsd")


def fwd_splitkv_combine(p: FmhaProblem, o_acc, lse_acc) -> FwdResult:
    """Combine split partials through their LSE: lse = logsumexp_s lse_s, o = sum_s e^(lse_s-lse) o_s."""
    check_tensors(p, o_acc=o_acc, lse_acc=lse_acc)
    oa, la = L.f64(o_acc), L.f64(lse_acc)
    m = np.max(la, axis=0, initial=-np.inf)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    w = np.exp(la - m_safe[None])
    z = w.sum(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(z > 0, np.log(z) + m_safe, -np.inf)
        wn = np.where(z[None] > 0, w / np.where(z > 0, z, 1.0)[None], 0.0)
    if p.is_group:  # o_acc [S, Tq, H, Dv], lse [S, H, Tq]
        o = np.einsum("sht,sthd->thd", wn, oa)
    else:           # o_acc [S, B, H, Sq, Dv], lse [S, B, H, Sq]
        o = np.einsum("sbhq,sbhqd->bhqd", wn, oa)
        if p.layout == "bshd":
            o = o.transpose(0, 2, 1, 3).copy()
    return FwdResult(o, lse)


def fwd_pagedkv(p: FmhaProblem, q, k_cache, v_cache, *, block_table, bias=None, alibi_slopes=None,
                sink=None) -> FwdResult:
    """Forward over a paged KV cache: gather pages through ``block_table``, then attend."""
    check_tensors(p, q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, bias=bias,
                  alibi_slopes=alibi_slopes, sink=sink)
    _require_sink(p, sink)
    ks, vs = gather_paged_kv(p, k_cache, v_cache, block_table=block_table)
    return _attend_all(p, L.split_q(p, q), ks, vs, bias=bias, alibi_slopes=alibi_slopes, sink=sink)


def batch_prefill(p: FmhaProblem, q, k_cache, v_cache, *, block_table=None, kv_indptr=None,
                  kv_page_indices=None, kv_last_page_lens=None, bias=None, alibi_slopes=None,
                  sink=None) -> FwdResult:
    """Group-mode queries over a paged cache (vLLM block table or SGLang page table,
    linear or vectorized pages); see :mod:`ck_fmha.paged` for the layouts."""
    tables = dict(block_table=block_table, kv_indptr=kv_indptr, kv_page_indices=kv_page_indices,
                  kv_last_page_lens=kv_last_page_lens)
    tables = {k: v for k, v in tables.items() if v is not None}
    check_tensors(p, q=q, k_cache=k_cache, v_cache=v_cache, bias=bias, alibi_slopes=alibi_slopes, sink=sink,
                  **tables)
    _require_sink(p, sink)
    ks, vs = gather_paged_kv(p, k_cache, v_cache, **tables)
    return _attend_all(p, L.split_q(p, q), ks, vs, bias=bias, alibi_slopes=alibi_slopes, sink=sink)


def fwd_appendkv(p: FmhaProblem, q, knew, vnew, k_cache, v_cache, *, rotary_cos=None, rotary_sin=None,
                 block_table=None) -> AppendKvResult:
    """Append knew/vnew at positions seqlens_k[b] .. seqlens_k[b]+seqlen_knew-1 of each cache,
    rotating knew (and q, whose rows sit at the same positions) with RoPE when enabled.

    Returns float64 copies of q and of the caches (same layouts as given).
    """
    check_tensors(p, q=q, knew=knew, vnew=vnew, k_cache=k_cache, v_cache=v_cache,
                  rotary_cos=rotary_cos, rotary_sin=rotary_sin, block_table=block_table)
    if p.rope != "none" and (rotary_cos is None or rotary_sin is None):
        raise InvalidProblem(f"rope={p.rope!r} needs rotary_cos and rotary_sin [max_pos, rotary_dim/2]")
    n = p.seqlen_knew
    qs = L.split_seq(p, q)
    kn = L.split_seq(p, knew)
    vn = L.split_seq(p, vnew)
    if p.rope != "none":
        need = max(p.seqlens_k) + max(n, p.seqlen_q)
        if np.shape(rotary_cos)[0] < need:
            raise InvalidProblem(f"rotary tables have {np.shape(rotary_cos)[0]} positions; need at least {need}")
        inter = p.rope == "interleaved"
        for b in range(p.batch):
            base = p.seqlens_k[b]
            kn[b] = apply_rope(kn[b], base + np.arange(n), rotary_cos, rotary_sin, p.rotary_dim, inter)
            qs[b] = apply_rope(qs[b], base + np.arange(p.seqlen_q), rotary_cos, rotary_sin, p.rotary_dim, inter)
    q_out = L.merge_q(p, qs, p.hdim_q)
    kc, vc = L.f64(k_cache).copy(), L.f64(v_cache).copy()
    for b in range(p.batch):
        pos = p.seqlens_k[b] + np.arange(n)
        if p.paged_kv:
            bt = np.asarray(block_table)
            pg, slot = bt[b, pos // p.page_size], pos % p.page_size
            if p.layout == "bshd":  # [np, P, Hk, D]
                kc[pg, slot] = kn[b].transpose(1, 0, 2)
                vc[pg, slot] = vn[b].transpose(1, 0, 2)
            else:                   # [np, Hk, P, D]
                for h in range(p.nhead_k):
                    kc[pg, h, slot] = kn[b][h]
                    vc[pg, h, slot] = vn[b][h]
        elif p.layout == "bshd":
            kc[b, pos] = kn[b].transpose(1, 0, 2)
            vc[b, pos] = vn[b].transpose(1, 0, 2)
        else:
            kc[b][:, pos] = kn[b]
            vc[b][:, pos] = vn[b]
    return AppendKvResult(q_out, kc, vc)
