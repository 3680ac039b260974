"""Python launchers of the Triton FMHA backward (CK's three stages: ``bwd_dot_do_o``,
``bwd_dq_dk_dv``, ``bwd_convert_dq``; ``bwd`` runs them in order) on torch tensors.  They run the
kernels they are given (the plan's keys, or explicit configs); the shared argument handling is
:mod:`.launch`'s.  Split from :mod:`.launch` by role (issue #30).
"""
from __future__ import annotations

import torch
import triton

from ck_core.errors import InvalidProblem, UnsupportedProblem
from ck_core.knobs import interpreting as _interpret

from . import kernels as K
from . import gluon_bwd, warm
from ... import device_errors
from .configs import hdim_args, hdim_blocks, padded_hdim, valid_dchunk
from .launch import (_bhs_strides, _even, _kernel_br, _check_gqa, _dense, _dims, _kernel, _last_contig, _lens_arg, _scales,
                     _varlen_check, bias_params, dropout_params, mask_params, varlen_limits)


def _gluon_dq_reason(q, k, v, do, lse, delta, tile, *, layout, mode, right, has_sc, bias, alibi_slopes, dropout_p,
                     dv_) -> str:
    """Why the Gluon dQ pass cannot take this backward ('' when it can)."""
    if _interpret() and q.device.type != "meta":   # (meta: ck build tracing, nothing runs)
        return "TRITON_INTERPRET=1 runs the Triton kernel"
    if layout == "thd":
        return "group mode"
    if mode not in (0, 1) or (mode == 1 and right != 0) or has_sc or bias is not None or alibi_slopes is not None \
            or dropout_p:
        return "window/softcap/bias/ALiBi/dropout"
    if q.shape[-1] != dv_ or q.numel() == 0 or k.numel() == 0:
        return "hdim_q != hdim_v or empty tensors"
    return gluon_bwd.dq_unsupported_reason(q, k, v, do, lse, delta, causal=mode == 1, layout=layout,
                                           block_n=tile[0])


def bwd_dot_do_o(o, do, *, layout="bhsd", cu_seqlens_q=None, max_seqlen_q=None, _trusted_varlen=False,
                 _via=None):
    """Backward stage 1: D = rowsum(dO * O), fp32 [B, H, Sq] ([H, total_q] in group mode 'thd',
    which needs ``cu_seqlens_q`` and ``max_seqlen_q``)."""
    o, do = _last_contig(o), _last_contig(do)
    varlen = layout == "thd"
    b, hq, sq, dv_ = _dims(o, layout)
    if varlen:
        if cu_seqlens_q is None or max_seqlen_q is None:
            raise InvalidProblem("layout 'thd' needs cu_seqlens_q and max_seqlen_q")
        b, sq = cu_seqlens_q.numel() - 1, int(max_seqlen_q)
        cu_seqlens_q, _, _ = _varlen_check(o, cu_seqlens_q, None, sq, None, None, trusted=_trusted_varlen)
        delta = torch.empty((hq, o.shape[0]), device=o.device, dtype=torch.float32)
    else:
        delta = torch.empty((b, hq, sq), device=o.device, dtype=torch.float32)
    sob, soh, sos = _bhs_strides(o, layout)
    sdob, sdoh, sdos = _bhs_strides(do, layout)
    bm0 = 64
    _kernel(_via, K.fmha_bwd_dot_do_o_kernel, (triton.cdiv(sq, bm0), b * hq))(
        o, do, delta, sob, soh, sos, sdob, sdoh, sdos, hq, sq,
        cu_seqlens_q if varlen else delta, delta.stride(0) if varlen else 0, o.shape[0] if varlen else 0,
        **hdim_args(d_v=dv_, blocks_v=padded_hdim(dv_)), BLOCK_DV=padded_hdim(dv_), BLOCK_M=bm0, IS_VARLEN=varlen, num_warps=4)
    return delta


def bwd_dq_dk_dv(q, k, v, do, lse, delta, *, causal=False, scale=None, window=(-1, -1), softcap=0.0,
                 layout="bhsd", deterministic=True, config=None, align=None, cu_seqlens_q=None,
                 cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, bias=None, alibi_slopes=None,
                 dropout_p=0.0, seed=0, offset=0, return_dbias=False, alibi_align=None, seqlens_k=None,
                 choice=None, _trusted_varlen=False, _via=None):
    """Backward stage 2: dK, dV (summed over the GQA group) and dQ.

    ``choice`` = (dK/dV, dQ): what runs, exactly (the Dispatcher's key: ``triton_keys`` dq field and
    variant): dK/dV ``("triton", TritonFmhaConfig)`` | ``("gluon", (BLOCK_MQ, STAGES, persistent))``;
    dQ ``("atomic",)`` (fp32 atomics in the dK/dV kernel, not deterministic) | ``("triton", config)`` |
    ``("gluon", (BLOCK_N, STAGES, persistent))`` | ``("none",)`` (no dQ).  A choice that cannot run the
    problem raises UnsupportedProblem.  ``config`` = (dK/dV, dQ) Triton configs instead of a choice runs
    the Triton kernels (dQ by atomics with ``deterministic=False``).  The launcher chooses nothing:
    ``ck_fmha.heuristics.bwd_want`` makes the tables' choice for the Dispatcher.

    Returns ``(dq, dq_acc, dk, dv)`` (``(dq, dq_acc, dk, dv, dbias)`` with
    ``return_dbias``): deterministic mode computes dQ in its own pass (``dq``
    set, ``dq_acc`` None); otherwise dQ accumulates with fp32 atomics into
    ``dq_acc`` and stage 3 (:func:`bwd_convert_dq`) rounds it.  Group mode
    (``layout='thd'``) takes ``cu_seqlens_q/k`` (device int32) and the caller's
    ``max_seqlen_q/k`` (grid size, no host sync); lse/delta are then [H, total_q].
    ``bias`` / ``alibi_slopes`` / ``dropout_p, seed, offset`` must be the forward's;
    ``dbias`` has the bias's shape and dtype (summed over its broadcast dims).  ``seqlens_k``: the
    forward's logical key lengths (group mode, see :func:`fwd`); keys past them get dK = dV = 0.
    """
    q, k, v, do = (_last_contig(t) for t in (q, k, v, do))
    varlen = layout == "thd"
    b, hq, sq, dq_ = _dims(q, layout)
    _, hk, sk, _ = _dims(k, layout)
    _, _, _, dv_ = _dims(v, layout)
    if varlen:
        if cu_seqlens_q is None or cu_seqlens_k is None or max_seqlen_q is None or max_seqlen_k is None:
            raise InvalidProblem("layout 'thd' needs cu_seqlens_q, cu_seqlens_k, max_seqlen_q and max_seqlen_k")
        b, sq, sk = cu_seqlens_q.numel() - 1, int(max_seqlen_q), int(max_seqlen_k)
    if seqlens_k is not None:
        if not varlen:
            raise InvalidProblem("seqlens_k (logical key lengths) is a group-mode ('thd') argument of the backward")
        seqlens_k = _lens_arg(seqlens_k, b)
    if varlen:
        cu_seqlens_q, cu_seqlens_k, seqlens_k = _varlen_check(
            q, cu_seqlens_q, cu_seqlens_k, sq, sk, k.shape[0], seqlens_k, trusted=_trusted_varlen)
    rows_q, rows_k, _ = varlen_limits(varlen, q.shape[0], k.shape[0], sk)
    group = _check_gqa(hq, hk)
    lse = lse.contiguous().float()
    mode, br, left, right = mask_params(causal, window, align)
    sm_scale, scale2, cap_in, cap_out = _scales(dq_, scale, softcap)
    has_sc = bool(softcap and softcap > 0)
    bdq, bdv = padded_hdim(dq_), padded_hdim(dv_)
    if choice is None:
        if config is None:
            raise InvalidProblem("bwd_dq_dk_dv: choice (or config) is required: the launcher runs the (dK/dV, dQ) "
                                 "kernels it is given (ck_fmha.heuristics.default_bwd_configs gives the tuned "
                                 "tables' Triton configs; ck_fmha.attention's backward chooses through the "
                                 "Dispatcher)")
        cfg_kv, cfg_q = config
        choice = (("triton", cfg_kv), ("triton", cfg_q) if deterministic else ("atomic",))
    (kv_kind, kv), dq_choice = choice
    atomic = dq_choice[0] == "atomic"
    if kv_kind == "gluon" or dq_choice[0] == "gluon":   # the Gluon kernels read dense 16-byte aligned tensors
        q, k, v, do = (_dense(t) for t in (q, k, v, do))
    # keys past a logical length are no program's: their gradient is 0
    dk = torch.empty_like(k) if seqlens_k is None else torch.zeros_like(k)
    dv = torch.empty_like(v) if seqlens_k is None else torch.zeros_like(v)
    lens_arg = seqlens_k if seqlens_k is not None else delta
    if atomic:
        if varlen:
            dqa = torch.zeros((q.shape[0], hq, dq_), device=q.device, dtype=torch.float32)
            sab, sah, sas = 0, dqa.stride(1), dqa.stride(0)
        else:
            dqa = torch.zeros((b, hq, sq, dq_), device=q.device, dtype=torch.float32)
            sab, sah, sas = dqa.stride(0), dqa.stride(1), dqa.stride(2)
        warm.zeroed(dqa)   # (an accumulator: a recorded replay zeroes it too)
    else:
        dqa, sab, sah, sas = delta, 0, 0, 0
    ba, aa, (sbb, sbh, sbq, sbk), salb, bmode = bias_params(bias, alibi_slopes, varlen, mode, br, right, delta,
                                                            alibi_align)
    if return_dbias and bmode != 1:
        raise InvalidProblem("dbias needs an elementwise bias")
    if return_dbias:
        dshape = (hq, q.shape[0], sk) if varlen else (b, hq, sq, sk)
        dbias_full = torch.zeros(dshape, device=q.device, dtype=torch.float32)
        if varlen:
            sdbb, sdbh, sdbq = 0, dbias_full.stride(0), dbias_full.stride(1)
        else:
            sdbb, sdbh, sdbq = dbias_full.stride(0), dbias_full.stride(1), dbias_full.stride(2)
    else:
        dbias_full, sdbb, sdbh, sdbq = delta, 0, 0, 0
    has_do, k0, k1, off_lo, thresh, dscale = dropout_params(dropout_p, seed, offset)
    cu_q = cu_seqlens_q if varlen else delta
    cu_k = cu_seqlens_k if varlen else delta
    slh = lse.stride(0) if varlen else 0
    if varlen and delta.stride(0) != slh:
        raise InvalidProblem("lse and delta must both be contiguous [H, total_q] in group mode")
    sqb, sqh, sqs = _bhs_strides(q, layout)
    skb, skh, sks = _bhs_strides(k, layout)
    svb, svh, svs = _bhs_strides(v, layout)
    sdob, sdoh, sdos = _bhs_strides(do, layout)
    sdkb, sdkh, sdks = _bhs_strides(dk, layout)
    sdvb, sdvh, sdvs = _bhs_strides(dv, layout)
    if kv_kind == "gluon":
        why = "dbias" if return_dbias else _gluon_dq_reason(
            q, k, v, do, lse, delta, (64, 2, True), layout=layout, mode=mode, right=right, has_sc=has_sc, bias=bias,
            alibi_slopes=alibi_slopes, dropout_p=dropout_p, dv_=dv_)
        if why:
            raise UnsupportedProblem(f"the Gluon dK/dV kernel {kv} cannot run this backward: {why}")
        dk, dv = gluon_bwd.dkdv(q, k, v, do, lse, delta, causal=mode == 1, scale=scale, layout=layout, tile=kv,
                                dq_acc=dqa if atomic else None, _via=_via)
    else:
        cfg_kv = kv
        if cfg_kv.variant not in ("ptr", "kvsplit"):
            raise UnsupportedProblem(f"dK/dV config {cfg_kv}: the Triton dK/dV kernel's variants are 'ptr' and "
                                     "'kvsplit' (dK and dV in separate programs)")
        split = cfg_kv.variant == "kvsplit"
        gsplit = max(1, min(int(cfg_kv.GSPLIT or 1), group))
        (kbdq, kbdq2), (kbdv, kbdv2) = _chunks(cfg_kv, dq_, dv_)
        if gsplit > 1:   # fp32 partial sums per split of the group, added up below (fixed order)
            dk_out, dv_out = dk, dv
            # every program writes its keys' partials (zeros for an empty share of the group); keys past a
            # logical length (seqlens_k) are no program's and stay zero.  The partials share the outputs'
            # dense layout (empty_like / zeros_like of k, v), so one flat sum kernel adds them up
            alloc = torch.zeros if seqlens_k is not None else torch.empty
            dk, dv = (alloc(gsplit * t.numel(), device=t.device, dtype=torch.float32).as_strided(
                (gsplit,) + tuple(t.shape), (t.numel(),) + t.stride()) for t in (dk_out, dv_out))
            if seqlens_k is not None:   # (a recorded replay zeroes them too)
                warm.zeroed(dk)
                warm.zeroed(dv)
            sdkb, sdkh, sdks = _bhs_strides(dk[0], layout)
            sdvb, sdvh, sdvs = _bhs_strides(dv[0], layout)
            sdkg, sdvg = dk.stride(0), dv.stride(0)
        else:
            sdkg = sdvg = 0
        _kernel(_via, K.fmha_bwd_dq_dk_dv_kernel,
                (triton.cdiv(sk, cfg_kv.BLOCK_N), b * hk, (2 if split else 1) * gsplit))(
            q, k, v, do, lse, delta, dk, dv, dqa,
            sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdob, sdoh, sdos,
            sdkb, sdkh, sdks, sdvb, sdvh, sdvs, sab, sah, sas,
            hk, group, sq, sk, sm_scale, scale2, cap_in, cap_out, left, right,
            cu_q, cu_k, ba, aa, dbias_full, sbb, sbh, sbq, sbk, salb, sdbb, sdbh, sdbq, slh,
            k0, k1, off_lo, thresh, dscale, lens_arg, gsplit, sdkg, sdvg, rows_q, rows_k, device_errors.flag(q.device),
            **hdim_args(dq_, kbdq + kbdq2, dv_, kbdv + kbdv2), BLOCK_DQ=kbdq, BLOCK_DV=kbdv, BLOCK_M=cfg_kv.BLOCK_M, BLOCK_N=cfg_kv.BLOCK_N,
            MASK_MODE=mode, BOTTOM_RIGHT=_kernel_br(br, mode, varlen, sq, sk, seqlens_k is not None),
            HAS_SOFTCAP=has_sc, ATOMIC_DQ=atomic,
            # one class for both edges (whole tiles or not): two compiles per key, not four
            EVEN_M=_even(varlen, sq, sk, cfg_kv), EVEN_N=_even(varlen, sq, sk, cfg_kv),
            IS_VARLEN=varlen, BIAS_MODE=bmode, HAS_DROPOUT=has_do, STORE_DBIAS=bool(return_dbias),
            HAS_SEQLENS=seqlens_k is not None, KV_SPLIT=split, BLOCK_DQ2=kbdq2, BLOCK_DV2=kbdv2,
            num_warps=cfg_kv.num_warps, num_stages=cfg_kv.num_stages)
        if gsplit > 1:   # a launch (not a torch op), so that warm calls replay it
            for part, out_ in ((dk, dk_out), (dv, dv_out)):
                n = out_.numel()
                _kernel(_via, K.fmha_bwd_sum_partials_kernel, (triton.cdiv(n, 1024),))(
                    part, out_, n, gsplit, BLOCK=1024, num_warps=4)
            dk, dv = dk_out, dv_out
    dbias = None
    if return_dbias:
        dbias = dbias_full
        if varlen:
            if bias.shape[0] == 1:
                dbias = dbias.sum(0, keepdim=True)
        else:
            dims = tuple(i for i in (0, 1) if bias.shape[i] == 1)
            if dims:
                dbias = dbias.sum(dims, keepdim=True)
        dbias = dbias.to(bias.dtype)
    if atomic:
        return (None, dqa, dk, dv, dbias) if return_dbias else (None, dqa, dk, dv)
    if dq_choice[0] == "none":
        return (None, None, dk, dv, dbias) if return_dbias else (None, None, dk, dv)
    if dq_choice[0] == "gluon":
        why = _gluon_dq_reason(q, k, v, do, lse, delta, dq_choice[1], layout=layout, mode=mode, right=right,
                               has_sc=has_sc, bias=bias, alibi_slopes=alibi_slopes, dropout_p=dropout_p, dv_=dv_)
        if why:
            raise UnsupportedProblem(f"the Gluon dQ pass {dq_choice[1]} cannot run this backward: {why}")
        dq = gluon_bwd.dq(q, k, v, do, lse, delta, causal=mode == 1, scale=scale, layout=layout, tile=dq_choice[1],
                          _via=_via)
        return (dq, None, dk, dv, dbias) if return_dbias else (dq, None, dk, dv)
    cfg_q = dq_choice[1]
    (bdq, bdq2), (bdv, bdv2) = _chunks(cfg_q, dq_, dv_)
    dq = torch.empty_like(q)
    sdqb, sdqh, sdqs = _bhs_strides(dq, layout)
    _kernel(_via, K.fmha_bwd_dq_kernel, (triton.cdiv(sq, cfg_q.BLOCK_M), b * hq))(
        q, k, v, do, lse, delta, dq,
        sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdob, sdoh, sdos, sdqb, sdqh, sdqs,
        hq, group, sq, sk, sm_scale, scale2, cap_in, cap_out, left, right,
        cu_q, cu_k, ba, aa, sbb, sbh, sbq, sbk, salb, slh,
        k0, k1, off_lo, thresh, dscale, lens_arg, rows_q, rows_k, device_errors.flag(q.device),
        **hdim_args(dq_, bdq + bdq2, dv_, bdv + bdv2), BLOCK_DQ=bdq, BLOCK_DV=bdv, BLOCK_M=cfg_q.BLOCK_M, BLOCK_N=cfg_q.BLOCK_N,
        MASK_MODE=mode, BOTTOM_RIGHT=_kernel_br(br, mode, varlen, sq, sk, seqlens_k is not None),
        HAS_SOFTCAP=has_sc,
        EVEN_M=_even(varlen, sq, sk, cfg_q), EVEN_N=_even(varlen, sq, sk, cfg_q),
        IS_VARLEN=varlen, BIAS_MODE=bmode, HAS_DROPOUT=has_do, HAS_SEQLENS=seqlens_k is not None,
        BLOCK_DQ2=bdq2, BLOCK_DV2=bdv2, num_warps=cfg_q.num_warps, num_stages=cfg_q.num_stages)
    return (dq, None, dk, dv, dbias) if return_dbias else (dq, None, dk, dv)


def _chunks(cfg, dq: int, dv: int):
    """((BLOCK_DQ, BLOCK_DQ2), (BLOCK_DV, BLOCK_DV2)) of a Triton config's head-dim chunk (``DCHUNK``)."""
    if cfg.DCHUNK and not valid_dchunk(cfg.DCHUNK):
        raise InvalidProblem(f"config {cfg}: DCHUNK {cfg.DCHUNK} is not 0 or a power of two in 16..256")
    return hdim_blocks(dq, cfg.DCHUNK), hdim_blocks(dv, cfg.DCHUNK)


def bwd_convert_dq(dqa, q_like, *, layout="bhsd", cu_seqlens_q=None, max_seqlen_q=None, cu_seqlens_k=None,
                   max_seqlen_k=None, total_k=None, seqlens_k=None, _trusted_varlen=False, _via=None):
    """Backward stage 3: the fp32 dQ accumulator [B, H, Sq, D] ([total_q, H, D] in group
    mode) -> dQ in q's dtype and layout.  Group mode also checks the key offsets where given
    (``cu_seqlens_k``, ``max_seqlen_k``, ``total_k`` packed key rows, ``seqlens_k``): bad ones make
    all of dQ NaN (the accumulator holds NaN only in sequence rows)."""
    dq = torch.empty_like(q_like)
    sdqb, sdqh, sdqs = _bhs_strides(dq, layout)
    if layout == "thd":
        if cu_seqlens_q is None or max_seqlen_q is None:
            raise InvalidProblem("layout 'thd' needs cu_seqlens_q and max_seqlen_q")
        _, hq, dq_ = dqa.shape
        b, sq = cu_seqlens_q.numel() - 1, int(max_seqlen_q)
        if seqlens_k is not None:
            seqlens_k = _lens_arg(seqlens_k, b)
        cu, cu_k, seqlens_k = _varlen_check(dqa, cu_seqlens_q, cu_seqlens_k, sq, max_seqlen_k, total_k, seqlens_k,
                                            trusted=_trusted_varlen)
        if cu_k is None:   # (only the query offsets: checked twice)
            cu_k, total_k, max_seqlen_k = cu, dqa.shape[0], sq
        rows_q, rows_k, long_k = varlen_limits(True, dqa.shape[0], total_k, max_seqlen_k)
        sab, sah, sas = 0, dqa.stride(1), dqa.stride(0)
    else:
        cu_k, rows_q, rows_k, long_k = dqa, 0, 0, 0
        b, hq, sq, dq_ = dqa.shape
        sab, sah, sas = dqa.stride(0), dqa.stride(1), dqa.stride(2)
        cu = dqa
    _kernel(_via, K.fmha_bwd_convert_dq_kernel, (triton.cdiv(sq, 64), b * hq))(
        dqa, dq, sab, sah, sas, sdqb, sdqh, sdqs, hq, sq, cu, rows_q, cu_k, rows_k, long_k,
        seqlens_k if seqlens_k is not None else cu_k,
        **hdim_args(d_q=dq_, blocks_q=padded_hdim(dq_)), BLOCK_DQ=padded_hdim(dq_), BLOCK_M=64, IS_VARLEN=layout == "thd", HAS_SEQLENS=seqlens_k is not None,
        num_warps=4)
    return dq


def bwd(q, k, v, o, lse, do, *, causal=False, scale=None, window=(-1, -1), softcap=0.0, layout="bhsd",
        deterministic=True, config=None, align=None, cu_seqlens_q=None, cu_seqlens_k=None,
        max_seqlen_q=None, max_seqlen_k=None, bias=None, alibi_slopes=None, dropout_p=0.0, seed=0,
        offset=0, return_dbias=False, alibi_align=None, seqlens_k=None, _trusted_varlen=False):
    """dq, dk, dv (and dbias with ``return_dbias``) of attention; ``lse`` is fwd's natural-log
    LSE [B, H, Sq] ([H, total_q] in group mode).

    The three CK stages: :func:`bwd_dot_do_o`, :func:`bwd_dq_dk_dv`, and (with
    ``deterministic=False``, fp32 dQ atomics) :func:`bwd_convert_dq`; the
    default runs a separate deterministic dQ pass.  ``config``: optional
    ``(dkdv_config, dq_config)``.  Bias / ALiBi / dropout arguments must be the forward's."""
    if layout == "thd" and cu_seqlens_q is not None and cu_seqlens_k is not None and max_seqlen_q is not None:
        if seqlens_k is not None:
            seqlens_k = _lens_arg(seqlens_k, cu_seqlens_q.numel() - 1)
        cu_seqlens_q, cu_seqlens_k, seqlens_k = _varlen_check(
            q, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), None if max_seqlen_k is None else int(max_seqlen_k),
            k.shape[0], seqlens_k, trusted=_trusted_varlen)
        _trusted_varlen = True
    delta = bwd_dot_do_o(o, do, layout=layout, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
                         _trusted_varlen=_trusted_varlen)
    res = bwd_dq_dk_dv(q, k, v, do, lse, delta, causal=causal, scale=scale, window=window,
                       softcap=softcap, layout=layout, deterministic=deterministic,
                       config=config, align=align, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                       max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, bias=bias,
                       alibi_slopes=alibi_slopes, dropout_p=dropout_p, seed=seed, offset=offset,
                       return_dbias=return_dbias, alibi_align=alibi_align, seqlens_k=seqlens_k,
                       _trusted_varlen=_trusted_varlen)
    dq, dqa, dk, dv = res[:4]
    if dq is None:
        dq = bwd_convert_dq(dqa, _last_contig(q), layout=layout, cu_seqlens_q=cu_seqlens_q,
                            max_seqlen_q=max_seqlen_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_k=max_seqlen_k,
                            total_k=k.shape[0], seqlens_k=seqlens_k, _trusted_varlen=_trusted_varlen)
    return (dq, dk, dv, res[4]) if return_dbias else (dq, dk, dv)


