"""Python launchers of the Triton FMHA decode-time kernels on torch tensors: split-KV / paged-KV
(``_splitkv_main`` + ``splitkv_combine``), append-KV with RoPE (``appendkv_launch``) and batch
prefill over a paged cache (``batch_prefill_launch``).  They run the key they are given; the torch
entry points that choose one are ``ck_fmha.decode`` / ``ck_fmha.prefill``.  Split from
:mod:`.launch` by role (issue #30).
"""
from __future__ import annotations

import torch
import triton

from ck_core.errors import InvalidProblem, UnsupportedProblem

from . import kernels as K
from ... import device_errors
from .configs import hdim_args, next_pow2, padded_hdim, page_args
from .launch import FP8_DTYPES, _bhs_strides, _check_gqa, _dims, _kernel, _last_contig, _scales, fwd, mask_params


def _splitkv_main(q, k, v, *, page_size, block_table, seqlens_k, max_seqlen_k, causal, scale, window, softcap,
                  num_splits, layout, config, kv_strides, hk, align, sink=None, sink_tokens=0, _via=None,
                  direct=False):
    """Split-KV main stage: ``num_splits`` partial outputs ``o_acc`` [B, H, Sq, S, Dv] and LSEs ``lse_acc``
    [B, H, Sq, S] (fp32).  The count is the problem's (the Dispatcher's choice): every split covers the
    same whole number of key blocks, and splits past a batch's keys are empty (the combine skips them).
    ``direct`` (one split only): the final ``o`` (q's dtype, in ``layout``) and ``lse`` [B, H, Sq] instead,
    so no combine launch follows."""
    q = _last_contig(q)
    if q.dtype in FP8_DTYPES:
        raise UnsupportedProblem("the Triton split-KV / paged decode has no fp8 path; the fp8 forward is fwd "
                                 "(batch or group mode): ck_fmha.backends.triton.fwd(..., q_descale=, k_descale=, v_descale=)")
    b, hq, sq, dq = _dims(q, layout)
    dv = v.shape[-1]
    group = _check_gqa(hq, hk)
    mode, br, left, right = mask_params(causal, window, align if align is not None else "bottom_right")
    sm_scale, scale2, cap_in, cap_out = _scales(dq, scale, softcap)
    cfg, bm = config, max(16, config.BLOCK_M)
    num_m = triton.cdiv(group * sq, bm)
    num_splits = int(num_splits)
    if num_splits < 1:
        raise InvalidProblem(f"num_splits={num_splits}: a split-KV launch needs at least one split")
    chunk = triton.cdiv(triton.cdiv(max_seqlen_k, num_splits), cfg.BLOCK_N) * cfg.BLOCK_N
    if sink is not None:
        sink = sink.to(device=q.device, dtype=torch.float32).contiguous()
    if direct:
        if num_splits != 1:
            raise InvalidProblem(f"a direct split-KV launch writes the final output: one split, not {num_splits}")
        oacc = torch.empty((b, hq, sq, dv) if layout == "bhsd" else (b, sq, hq, dv), device=q.device, dtype=q.dtype)
        lacc = torch.empty((b, hq, sq), device=q.device, dtype=torch.float32)
        so = _bhs_strides(oacc, layout) + (0,)
    else:
        oacc = torch.empty((b, hq, sq, num_splits, dv), device=q.device, dtype=torch.float32)
        lacc = torch.empty((b, hq, sq, num_splits), device=q.device, dtype=torch.float32)
        so = (oacc.stride(0), oacc.stride(1), oacc.stride(2), oacc.stride(3))
    sqb, sqh, sqs = _bhs_strides(q, layout)
    skb, skh, sks, svb, svh, svs = kv_strides
    bt = block_table if block_table is not None else oacc
    sbt = block_table.stride(0) if block_table is not None else 0
    sl = seqlens_k if seqlens_k is not None else oacc
    # the keys a length may reach: the capacity, and no further than the block table's pages
    cap = int(max_seqlen_k) if block_table is None else min(int(max_seqlen_k), block_table.shape[1] * int(page_size))
    _kernel(_via, K.fmha_fwd_splitkv_kernel, (num_splits, b * hk, num_m))(
        q, k, v, oacc, lacc, bt, sl,
        sqb, sqh, sqs, skb, skh, sks, svb, svh, svs,
        *so,
        lacc.stride(0), lacc.stride(1), lacc.stride(2), sbt,
        hk, group, sq, max_seqlen_k, chunk,
        scale2, cap_in, cap_out, left, right, sink if sink is not None else oacc, int(sink_tokens or 0),
        device_errors.flag(q.device), cap, k.shape[0] if block_table is not None else 0,
        **hdim_args(dq, padded_hdim(dq), dv, padded_hdim(dv)), BLOCK_DQ=padded_hdim(dq), BLOCK_DV=padded_hdim(dv),
        BLOCK_M=bm, BLOCK_N=cfg.BLOCK_N, **page_args(page_size or 0, cfg.BLOCK_N),
        MASK_MODE=mode, BOTTOM_RIGHT=br, HAS_SOFTCAP=bool(softcap and softcap > 0),
        HAS_SEQLENS=seqlens_k is not None, HAS_SINK=bool(sink_tokens) and (mode & 2) != 0,
        HAS_SINK_LOGIT=sink is not None, DIRECT=bool(direct),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return oacc, lacc


def splitkv_combine(oacc, lacc, q, *, layout="bhsd", return_lse=True, _via=None):
    """Split-KV combine stage: merge the partials through their LSEs into o (q's dtype) and lse."""
    b, hq, sq, num_splits, dv = oacc.shape
    shape = (b, hq, sq, dv) if layout == "bhsd" else (b, sq, hq, dv)
    o = torch.empty(shape, device=q.device, dtype=q.dtype)
    sob, soh, sos = _bhs_strides(o, layout)
    lse = torch.empty((b, hq, sq), device=q.device, dtype=torch.float32) if return_lse else lacc
    _kernel(_via, K.fmha_fwd_splitkv_combine_kernel, (b * hq * sq,))(
        oacc, lacc, o, lse,
        oacc.stride(0), oacc.stride(1), oacc.stride(2), oacc.stride(3),
        lacc.stride(0), lacc.stride(1), lacc.stride(2),
        sob, soh, sos, lse.stride(0) if return_lse else 0, lse.stride(1) if return_lse else 0,
        hq, sq, num_splits,
        **hdim_args(d_v=dv, blocks_v=padded_hdim(dv)), BLOCK_DV=padded_hdim(dv), BLOCK_S=max(2, next_pow2(num_splits)),
        STORE_LSE=bool(return_lse), num_warps=4 if padded_hdim(dv) >= 128 else 2)
    return (o, lse) if return_lse else o






# ---------------------------------------------------------------------------
# append-KV (+ RoPE)
# ---------------------------------------------------------------------------

from .configs import ROPE_MODES  # noqa: E402




def appendkv_launch(q, knew, vnew, k_cache, v_cache, seqlens_k, *, rotary_cos=None, rotary_sin=None, rope="none",
                    rotary_dim=0, block_table=None, layout="bhsd", block_m=32, _via=None):
    """The fwd_appendkv kernel (the launcher of a plan's key; ``block_m``: the key's BLOCK_M): write
    ``knew``/``vnew`` ([B, Hk, Sn, D] in ``layout``) into the caches at
    positions ``seqlens_k[b] ..`` (int32 [B], the lengths before the append), rotating knew and q (whose
    rows sit at the same positions) by RoPE (``rope``: 'none' | 'interleaved' | 'half_rotated' over the
    first ``rotary_dim`` channels; ``rotary_cos``/``rotary_sin`` [max_pos, rotary_dim/2]).

    The caches are written IN PLACE (contiguous [B, Hk, Sk, D] in ``layout``, or with ``block_table``
    the page pools [pages, Hk, P, D] ('bhsd') / [pages, P, Hk, D] ('bshd')).  Returns
    ``(q_rot, k_cache, v_cache)``; q_rot is a new tensor (a copy of q when rope='none')."""
    mode = ROPE_MODES.get(rope)
    if mode is None:
        raise InvalidProblem(f"rope={rope!r} is not one of {', '.join(ROPE_MODES)}")
    if mode and (rotary_cos is None or rotary_sin is None):
        raise InvalidProblem(f"rope={rope!r} needs rotary_cos and rotary_sin [max_pos, rotary_dim/2]")
    if mode and (rotary_dim <= 0 or rotary_dim % 2):
        raise InvalidProblem(f"rotary_dim={rotary_dim} must be even and > 0")
    q, knew, vnew = _last_contig(q), _last_contig(knew), _last_contig(vnew)
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise InvalidProblem("the caches are written in place: their last dimension must be contiguous")
    b, hq, sq, dq = _dims(q, layout)
    _, hk, sn, _ = _dims(knew, layout)
    dv = vnew.shape[-1]
    q_rot = torch.empty_like(q)
    sl = seqlens_k.to(torch.int32)
    if block_table is not None:
        if layout == "bhsd":   # [pages, Hk, P, D]
            ps = k_cache.shape[2]
            kcs = (k_cache.stride(0), k_cache.stride(1), k_cache.stride(2))
            vcs = (v_cache.stride(0), v_cache.stride(1), v_cache.stride(2))
        else:                  # [pages, P, Hk, D]
            ps = k_cache.shape[1]
            kcs = (k_cache.stride(0), k_cache.stride(2), k_cache.stride(1))
            vcs = (v_cache.stride(0), v_cache.stride(2), v_cache.stride(1))
        bt = block_table.to(torch.int32)
        sbt = bt.stride(0)
    else:
        ps = 0
        kcs, vcs = _bhs_strides(k_cache, layout), _bhs_strides(v_cache, layout)
        bt, sbt = sl, 0
    if mode:
        cos = rotary_cos if rotary_cos.dtype == torch.float32 else rotary_cos.float()
        sin = rotary_sin if rotary_sin.dtype == torch.float32 else rotary_sin.float()
        cos, sin = cos.contiguous(), sin.contiguous()
        if sin.stride(0) != cos.stride(0):
            raise InvalidProblem("rotary_cos and rotary_sin must have the same shape")
        scs = cos.stride(0)
    else:
        cos = sin = q_rot
        scs = 0
    bm = max(16, min(int(block_m), next_pow2(max(sq, sn))))
    grid = (triton.cdiv(max(sq, sn), bm), b, hq + hk)
    # positions a cache holds: its length, or the block table's pages
    cap = bt.shape[1] * ps if block_table is not None else _dims(k_cache, layout)[2]
    _kernel(_via, K.fmha_fwd_appendkv_kernel, grid)(
        q, knew, vnew, q_rot, k_cache, v_cache, cos, sin, sl, bt,
        *_bhs_strides(q, layout), *_bhs_strides(knew, layout), *_bhs_strides(vnew, layout),
        *_bhs_strides(q_rot, layout), *kcs, *vcs, sbt, scs,
        hq, hk, sq, sn, int(rotary_dim), device_errors.flag(q.device), cap,
        **hdim_args(dq, padded_hdim(dq), dv, padded_hdim(dv)), BLOCK_DQ=padded_hdim(dq), BLOCK_DV=padded_hdim(dv), BLOCK_M=bm,
        **page_args(ps), ROPE=mode, num_warps=4)
    return q_rot, k_cache, v_cache


# ---------------------------------------------------------------------------
# batch prefill: group-mode queries over a paged KV cache
# ---------------------------------------------------------------------------




def batch_prefill_launch(q, k_cache, v_cache, seqlens_k, *, cu_seqlens_q, max_seqlen_q, max_seqlen_k,
                         block_table=None, kv_indptr=None, kv_page_indices=None, kv_layout="linear", **kw):
    """The batch_prefill kernel (the launcher of a plan's key): group-mode queries (``q`` [total_q, H, D],
    ``cu_seqlens_q``) over a paged KV cache with per-batch
    key lengths ``seqlens_k`` (int32 [B]).  Pages: ``kv_layout='linear'`` K/V [pages, P, Hk, D];
    ``'vectorized'`` (CK's layout, vec = 16 bytes / element) K [pages, Hk, D/vec, P, vec],
    V [pages, Hk, P/vec, Dv, vec].  Lookup: ``block_table`` [B, max_pages] (vLLM) or
    ``kv_indptr`` [B+1] + ``kv_page_indices`` (SGLang; kv_last_page_lens is implied by seqlens_k).
    ``max_seqlen_k``: the largest seqlens_k (no host sync).  Other keywords as :func:`fwd`
    (masks, softcap, bias, ALiBi, dropout, sinks, return_lse, config)."""
    kc, vc = k_cache, v_cache
    if kc.stride(-1) != 1 or vc.stride(-1) != 1:
        raise InvalidProblem("the KV page pools need a contiguous last dimension")
    if kv_layout == "linear":
        _, ps, hk, dq = kc.shape
        dv = vc.shape[-1]
        strides = (0, kc.stride(2), kc.stride(1), 0, vc.stride(2), vc.stride(1))
        extra = dict(skp=kc.stride(0), svp=vc.stride(0))
    elif kv_layout == "vectorized":
        _, hk, dchunks, ps, vec = kc.shape
        dq, dv = dchunks * vec, vc.shape[3]
        if vc.shape[4] != vec or vc.shape[2] * vec != ps:
            raise InvalidProblem(f"vectorized V pages {tuple(vc.shape)} do not match K pages {tuple(kc.shape)}")
        if kc.stride(3) != vec or vc.stride(3) != vec:
            raise InvalidProblem("vectorized pages must be contiguous within a page")
        strides = (0, kc.stride(1), vec, 0, vc.stride(1), vc.stride(2))
        extra = dict(skp=kc.stride(0), svp=vc.stride(0), skd=kc.stride(2), kv_vec=vec)
    else:
        raise InvalidProblem(f"kv_layout={kv_layout!r} is not 'linear' or 'vectorized'")
    if (kv_indptr is None) == (block_table is None):
        raise InvalidProblem("pass block_table (vLLM) or kv_indptr + kv_page_indices (SGLang), not both")
    if kv_indptr is not None:
        if kv_page_indices is None:
            raise InvalidProblem("kv_indptr needs kv_page_indices")
        pg = dict(page_table=kv_page_indices.to(torch.int32), kv_indptr=kv_indptr.to(torch.int32))
        cap = int(max_seqlen_k)   # (the kernel also bounds each length by its batch's pages)
    else:
        bt = block_table.to(torch.int32)
        pg = dict(page_table=bt, sbt=bt.stride(0))
        cap = min(int(max_seqlen_k), bt.shape[1] * ps)
    # capacity: the bound of a run-time length that the kernel checks (ck_fmha.device_errors)
    pg.update(extra, hk=hk, dq=dq, dv=dv, max_seqlen_k=int(max_seqlen_k), capacity=cap, kv_strides=strides,
              page_size=ps, seqlens_k=seqlens_k.to(torch.int32))
    return fwd(q, kc, vc, layout="thd", cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
               max_seqlen_k=max_seqlen_k, _paged=pg, **kw)
