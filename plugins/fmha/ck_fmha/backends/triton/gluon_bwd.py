"""Hopper (sm90) dQ pass of the attention backward in Gluon.

The deterministic backward computes dQ in its own pass (one program per query block, a loop over
key blocks), which has the forward's shape: per key block S = Q K^T and dP = dO V^T, then
dS = P * (dP - delta) with P = exp2(S * scale2 - lse2), then dQ += dS K.  This kernel runs it with the
forward's structure (:mod:`.gluon_fwd`): a producer warpgroup streams K and V through TMA rings, two
consumer warpgroups own 64 query rows each and keep the dQ product of block j in flight while the
S / dP products of block j+1 finish and dS[j+1] is computed.  ``PERSISTENT``: one program per SM
over the tiles, causal passes mirrored as in the forward.

Scope as the Gluon forward (``gluon_fwd.unsupported_reason``) with seqlen_k % BLOCK_N == 0; dQ is
written in q's dtype and layout; lse (natural log) and delta are [B, H, Sq] fp32.
"""
from __future__ import annotations

import logging

from . import gluon_fwd as GF

log = logging.getLogger(__name__)

if GF.HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

    @gluon.jit
    def _ds_step(s, dp, lse2, di, scale2, rows, cols, n_off, MASKED: gl.constexpr, CAUSAL: gl.constexpr = True,
                 kmax=0):
        """dS of one block; ``MASKED``: P of keys past the row (``CAUSAL``) or at or past ``kmax``
        (the ragged last key block) is 0."""
        p = gl.exp2(s * scale2 - gl.expand_dims(lse2, 1))
        if MASKED:
            if CAUSAL:
                keep = gl.expand_dims(rows, 1) >= gl.expand_dims(cols + n_off, 0)
            else:
                keep = (gl.expand_dims(rows, 1) * 0) + gl.expand_dims(cols + n_off, 0) < kmax
            p = gl.where(keep, p, 0.0)
        return p * (dp - gl.expand_dims(di, 1))

    @gluon.jit
    def _dq_producer(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_bar, q_empty, k_full,
                     v_full, k_empty, v_empty, n_m, n_tiles, H, HK, GROUP, SEQ_Q, SEQ_K,
                     SUB_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr,
                     BSHD: gl.constexpr, CAUSAL: gl.constexpr, PERSISTENT: gl.constexpr):
        step = GF._tile_step(n_tiles, PERSISTENT)
        cnt = 0
        it = 0
        for t in range(gl.program_id(0), n_tiles, step):
            b, h, m0, q0, q_col, k0, k_col, n_blocks = GF._tile3(
                t, n_m, n_tiles, H, HK, GROUP, SEQ_Q, SEQ_K, 2 * SUB_M, BLOCK_N, HEAD_D, BSHD, CAUSAL, PERSISTENT)
            for i in gl.static_range(2):   # Q and dO of each consumer's rows on one barrier
                mbarrier.wait(q_empty.index(i), (it & 1) ^ 1, pred=it > 0)
                mbarrier.expect(q_bar.index(i), 2 * SUB_M * HEAD_D * 2)
                tma.async_copy_global_to_shared(q_desc, [q0, m0 + i * SUB_M, q_col], q_bar.index(i),
                                                q_smem.index(i).reshape([1, SUB_M, HEAD_D]))
                tma.async_copy_global_to_shared(do_desc, [q0, m0 + i * SUB_M, q_col], q_bar.index(i),
                                                do_smem.index(i).reshape([1, SUB_M, HEAD_D]))
            for j in range(n_blocks):
                GF._load_kv3(k_desc, v_desc, k_smem, v_smem, k_full, v_full, k_empty, v_empty, cnt + j,
                             k0, j * BLOCK_N, k_col, STAGES)
            cnt += n_blocks
            it += 1

    @gluon.jit
    def _dq_consumer(dq_desc, LSE, DELTA, q_smem, do_smem, dq_smem, k_smem, v_smem, q_bar, q_empty, k_full, v_full,
                     k_empty, v_empty, n_m, n_tiles, H, HK, GROUP, SEQ_Q, SEQ_K, scale2, sm_scale,
                     SUB: gl.constexpr, CAUSAL: gl.constexpr, SUB_M: gl.constexpr, BLOCK_N: gl.constexpr,
                     HEAD_D: gl.constexpr, STAGES: gl.constexpr, BSHD: gl.constexpr, PERSISTENT: gl.constexpr):
        dtype: gl.constexpr = dq_desc.dtype
        s_layout: gl.constexpr = GF._acc_layout(BLOCK_N)
        o_layout: gl.constexpr = GF._acc_layout(HEAD_D)
        ds_layout: gl.constexpr = GF._a_layout(HEAD_D)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
        qs = q_smem.index(SUB)
        dos = do_smem.index(SUB)
        dqs = dq_smem.index(SUB)
        cols = gl.arange(0, BLOCK_N, layout=col_s)
        s_zero = gl.zeros([SUB_M, BLOCK_N], gl.float32, layout=s_layout)
        step = GF._tile_step(n_tiles, PERSISTENT)
        cnt = 0
        it = 0
        for t in range(gl.program_id(0), n_tiles, step):
            b, h, m0, q0, q_col, k0, k_col, n_blocks = GF._tile3(
                t, n_m, n_tiles, H, HK, GROUP, SEQ_Q, SEQ_K, 2 * SUB_M, BLOCK_N, HEAD_D, BSHD, CAUSAL, PERSISTENT)
            r0 = m0 + SUB * SUB_M
            if CAUSAL:   # blocks j >= n_full are masked (see the forward's consumer)
                n_mine = gl.minimum(gl.cdiv(r0 + SUB_M, BLOCK_N), n_blocks)
                n_full = r0 // BLOCK_N
            else:
                n_mine = n_blocks
                n_full = SEQ_K // BLOCK_N
            rows = r0 + gl.arange(0, SUB_M, layout=row_s)
            base = (b * H + h).to(gl.int64) * SEQ_Q
            # rows past SEQ_Q (a ragged last block: Q and dO read zeros there) are never stored
            lse2 = gl.load(LSE + base + rows, mask=rows < SEQ_Q, other=0.0) * 1.4426950408889634
            di = gl.load(DELTA + base + rows, mask=rows < SEQ_Q, other=0.0)
            acc = gl.zeros([SUB_M, HEAD_D], gl.float32, layout=o_layout)

            mbarrier.wait(q_bar.index(SUB), it & 1)
            slot0 = cnt % STAGES
            mbarrier.wait(k_full.index(slot0), (cnt // STAGES) & 1)
            s_tok = warpgroup_mma(qs, k_smem.index(slot0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            mbarrier.wait(v_full.index(slot0), (cnt // STAGES) & 1)
            dp_tok = warpgroup_mma(dos, v_smem.index(slot0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s, dp = warpgroup_mma_wait(0, deps=[s_tok, dp_tok])
            mbarrier.arrive(v_empty.index(slot0))
            if n_full == 0:
                ds = _ds_step(s, dp, lse2, di, scale2, rows, cols, 0, True, CAUSAL, SEQ_K)
            else:
                ds = _ds_step(s, dp, lse2, di, scale2, rows, cols, 0, False)

            for j in range(0, n_mine - 1):
                c = cnt + j
                slot = c % STAGES
                nslot = (c + 1) % STAGES
                nph = ((c + 1) // STAGES) & 1
                mbarrier.wait(k_full.index(nslot), nph)
                s_tok = warpgroup_mma(qs, k_smem.index(nslot).permute((1, 0)), s_zero, use_acc=False,
                                      is_async=True)
                mbarrier.wait(v_full.index(nslot), nph)
                dp_tok = warpgroup_mma(dos, v_smem.index(nslot).permute((1, 0)), s_zero, use_acc=False,
                                       is_async=True)
                ds16 = gl.convert_layout(ds.to(dtype), ds_layout)
                acc_tok = warpgroup_mma(ds16, k_smem.index(slot), acc, is_async=True)
                s, dp = warpgroup_mma_wait(1, deps=[s_tok, dp_tok])   # dQ += dS[j] K[j] may still run
                mbarrier.arrive(v_empty.index(nslot))
                if j + 1 >= n_full:
                    ds = _ds_step(s, dp, lse2, di, scale2, rows, cols, (j + 1) * BLOCK_N, True, CAUSAL, SEQ_K)
                else:
                    ds = _ds_step(s, dp, lse2, di, scale2, rows, cols, 0, False)
                acc = warpgroup_mma_wait(0, deps=[acc_tok])
                mbarrier.arrive(k_empty.index(slot))

            last = cnt + n_mine - 1
            lslot = last % STAGES
            ds16 = gl.convert_layout(ds.to(dtype), ds_layout)
            acc_tok = warpgroup_mma(ds16, k_smem.index(lslot), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc_tok])
            mbarrier.arrive(k_empty.index(lslot))
            mbarrier.arrive(q_empty.index(SUB))   # Q and dO are read by the products above only
            for j in range(n_mine, n_blocks):     # causal: blocks past this warpgroup's rows
                c = cnt + j
                slot = c % STAGES
                mbarrier.wait(k_full.index(slot), (c // STAGES) & 1)
                mbarrier.arrive(k_empty.index(slot))
                mbarrier.wait(v_full.index(slot), (c // STAGES) & 1)
                mbarrier.arrive(v_empty.index(slot))
            cnt += n_blocks
            it += 1

            tma.store_wait(pendings=0)
            dqs.store((acc * sm_scale).to(dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(dq_desc, [q0, r0, q_col], dqs.reshape([1, SUB_M, HEAD_D]))
        tma.store_wait(pendings=0)

    @gluon.jit
    def fmha_bwd_dq_gluon_ws_sm90(
        q_desc, do_desc, k_desc, v_desc, dq_desc, LSE, DELTA,
        H, HK, GROUP, SEQ_Q, SEQ_K, BH, scale2, sm_scale,
        BSHD: gl.constexpr, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
        STAGES: gl.constexpr, PERSISTENT: gl.constexpr,
    ):
        SUB_M: gl.constexpr = q_desc.block_type.shape[1]   # 3-D descriptors, blocks [1, rows, D]
        dtype: gl.constexpr = q_desc.dtype
        n_m = gl.cdiv(SEQ_Q, 2 * SUB_M)
        n_tiles = n_m * BH
        q_layout: gl.constexpr = GF._nvmma2(SUB_M, HEAD_D, dtype)
        kv_layout: gl.constexpr = GF._nvmma2(BLOCK_N, HEAD_D, dtype)
        q_smem = gl.allocate_shared_memory(dtype, [2, SUB_M, HEAD_D], q_layout)
        do_smem = gl.allocate_shared_memory(dtype, [2, SUB_M, HEAD_D], q_layout)
        dq_smem = gl.allocate_shared_memory(dtype, [2, SUB_M, HEAD_D], q_layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], kv_layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], kv_layout)
        q_bar = GF._barriers(2, 1)
        q_empty = GF._barriers(2, 1)
        k_full = GF._barriers(STAGES, 1)
        v_full = GF._barriers(STAGES, 1)
        k_empty = GF._barriers(STAGES, 2)
        v_empty = GF._barriers(STAGES, 2)
        gl.warp_specialize([
            (_dq_consumer, (dq_desc, LSE, DELTA, q_smem, do_smem, dq_smem, k_smem, v_smem, q_bar, q_empty, k_full,
                            v_full, k_empty, v_empty, n_m, n_tiles, H, HK, GROUP, SEQ_Q, SEQ_K, scale2, sm_scale,
                            0, CAUSAL, SUB_M, BLOCK_N, HEAD_D, STAGES, BSHD, PERSISTENT)),
            (_dq_consumer, (dq_desc, LSE, DELTA, q_smem, do_smem, dq_smem, k_smem, v_smem, q_bar, q_empty, k_full,
                            v_full, k_empty, v_empty, n_m, n_tiles, H, HK, GROUP, SEQ_Q, SEQ_K, scale2, sm_scale,
                            1, CAUSAL, SUB_M, BLOCK_N, HEAD_D, STAGES, BSHD, PERSISTENT)),
            (_dq_producer, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_bar, q_empty, k_full,
                            v_full, k_empty, v_empty, n_m, n_tiles, H, HK, GROUP, SEQ_Q, SEQ_K, SUB_M, BLOCK_N,
                            HEAD_D, STAGES, BSHD, CAUSAL, PERSISTENT)),
        ], [4, 4], [240, 24])


def tiles(kind: str, arch: str) -> dict:
    """Head dim -> the hand-picked tile of ``kind`` ("dq", "dkdv", "fused") in ``arch``'s tuned data."""
    from ...heuristics import gluon_tiles

    return gluon_tiles(kind, arch)


def _device_tiles(kind: str, t) -> dict:
    """:func:`tiles` of the arch of the GPU ``t`` lives on (a call that names no tile)."""
    from ck_core.device import current_arch

    return tiles(kind, current_arch(t).name)


def dq_unsupported_reason(q, k, v, do, lse, delta, *, causal, layout, block_n=64) -> str:
    """Why the Gluon dQ pass cannot run this problem ('' when it can)."""
    why = GF.unsupported_reason(q, k, v, causal=causal, layout=layout, tile=(128, block_n, GF.WS_WARPS, 2))
    if why:
        return why
    sdim = 2 if layout == "bhsd" else 1
    sq, sk = q.shape[sdim], k.shape[sdim]
    if sq == 0 or sk == 0:
        return f"seqlen_q {sq} / seqlen_k {sk}: empty sequences"
    if do.shape != q.shape or do.dtype != q.dtype or not do.is_contiguous() or do.data_ptr() % 16:
        return "do must be a contiguous 16-byte aligned tensor of q's shape and dtype"
    n = q.shape[0] * q.shape[1] * q.shape[2]
    for name, t in (("lse", lse), ("delta", delta)):
        if t.dtype.itemsize != 4 or not t.is_floating_point() or t.numel() != n or not t.is_contiguous():
            return f"{name} must be a contiguous fp32 [B, H, Sq] tensor"
    return ""


def _launch(fn, grid, via):
    """``fn[grid]``, or a Dispatcher launcher's kernel-cache launch (``implement.kernel_via``)."""
    return fn[grid] if via is None else via(fn, grid)


def dq(q, k, v, do, lse, delta, *, causal=False, scale=None, layout="bhsd", tile=None, out=None, _via=None):
    """dQ of the deterministic backward on the Gluon kernel (checks done by the caller, see
    :func:`dq_unsupported_reason`); ``tile`` = (BLOCK_N, STAGES, persistent); ``_via``: see :func:`_launch`."""
    import math

    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    d = q.shape[-1]
    bn, stages, persistent = tile or _device_tiles("dq", q)[d]
    b, hq, sq, hk, sk = GF.geometry(q, k, layout)[:5]
    shape_q, shape_k = GF.views3(q, k, layout)
    o = out if out is not None else torch.empty_like(q)
    gdt = GF._gl_dtype(q.dtype)
    q_l = gl.NVMMASharedLayout.get_default_for([1, 64, d], gdt)
    kv_l = gl.NVMMASharedLayout.get_default_for([1, bn, d], gdt)
    descs = [TensorDescriptor.from_tensor(t.view(shape_q), [1, 64, d], q_l) for t in (q, do)]
    descs += [TensorDescriptor.from_tensor(t.view(shape_k), [1, bn, d], kv_l) for t in (k, v)]
    descs.append(TensorDescriptor.from_tensor(o.view(shape_q), [1, 64, d], q_l))
    sm_scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    grid = GF.grid_for(-(-sq // 128) * b * hq, persistent, q.device)
    _launch(fmha_bwd_dq_gluon_ws_sm90, grid, _via)(
        *descs, lse, delta, hq, hk, hq // hk, sq, sk, b * hq, sm_scale * GF.LOG2E, sm_scale,
        BSHD=layout == "bshd", CAUSAL=bool(causal), BLOCK_N=bn, HEAD_D=d, STAGES=stages,
        PERSISTENT=bool(persistent), num_warps=4)
    return o


# ---------------------------------------------------------------------------------------------
# dK / dV: one tile is 128 keys of one (batch, kv head); two consumer warpgroups own 64 keys each
# and loop over the query blocks of every q head of the GQA group (dK, dV summed over it).
# FUSED_DQ (the non-deterministic backward, FlashAttention-3's five products): each warpgroup
# also forms its share of dQ = dS K for the query block (dS^T goes through shared memory, where it
# is the A operand of both dK += dS^T Q and, transposed, of dQ = dS K) and adds it into the fp32
# accumulator with a TMA reduce-add (cp.reduce.async.bulk.tensor); no separate dQ pass.
# ---------------------------------------------------------------------------------------------
if GF.HAVE_GLUON:
    from triton._C.libtriton import ir as _ir
    from triton.experimental.gluon.language._core import builtin as _builtin

    @gluon.constexpr_function
    def _nvmma_for(rows, cols, dtype):
        return gl.NVMMASharedLayout.get_default_for([rows, cols], dtype)

    @_builtin
    def _tma_reduce_add(desc, coord, src, _semantic=None):
        """``global[coord : coord + block] += src`` (a shared-memory tile) by an asynchronous TMA bulk
        reduction (Gluon 3.6 has no wrapper for it); ``tma.store_wait`` waits for it like a store."""
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(_ir.DESCRIPTOR_REDUCE_KIND.ADD, desc.handle, coord, src.handle)

    @gluon.jit
    def _kv_tile(t, n_n, HK, GROUP, SEQ_Q, SEQ_K, BLOCK_MQ: gl.constexpr, HEAD_D: gl.constexpr,
                 BSHD: gl.constexpr, CAUSAL: gl.constexpr):
        pid_n = t % n_n
        bhk = t // n_n
        b = bhk // HK
        hk = bhk % HK
        n0 = pid_n * 128
        if BSHD:   # 3-D descriptors: [B, SK, HK*D] / [B*HK, SK, D]; the tile starts at [k0, n0, k_col]
            k0 = b
            k_col = hk * HEAD_D
        else:
            k0 = bhk
            k_col = hk * 0
        if CAUSAL:
            j_lo = n0 // BLOCK_MQ
        else:
            j_lo = n0 * 0
        return b, hk, n0, k0, k_col, j_lo

    @gluon.jit
    def _q_coords(b, h, H, SEQ_Q, m, HEAD_D: gl.constexpr, BSHD: gl.constexpr):
        """(q0, q_col) of (batch, head) in the 3-D descriptors [B, SQ, H*D] / [B*H, SQ, D]."""
        if BSHD:
            return b, h * HEAD_D
        else:
            return b * H + h, h * 0

    @gluon.jit
    def _dkdv_producer(k_desc, v_desc, q_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, kv_empty, q_full,
                       q_empty, n_n, n_tiles, H, HK, GROUP, SEQ_Q, SEQ_K,
                       BLOCK_MQ: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr, BSHD: gl.constexpr,
                       CAUSAL: gl.constexpr, PERSISTENT: gl.constexpr):
        step = GF._tile_step(n_tiles, PERSISTENT)
        n_qb = gl.cdiv(SEQ_Q, BLOCK_MQ)
        cnt = 0
        it = 0
        for t in range(gl.program_id(0), n_tiles, step):
            b, hk, n0, k0, k_col, j_lo = _kv_tile(t, n_n, HK, GROUP, SEQ_Q, SEQ_K, BLOCK_MQ, HEAD_D, BSHD, CAUSAL)
            for i in gl.static_range(2):
                mbarrier.wait(kv_empty.index(i), (it & 1) ^ 1, pred=it > 0)
                mbarrier.expect(kv_bar.index(i), 2 * 64 * HEAD_D * 2)
                tma.async_copy_global_to_shared(k_desc, [k0, n0 + i * 64, k_col], kv_bar.index(i),
                                                k_smem.index(i).reshape([1, 64, HEAD_D]))
                tma.async_copy_global_to_shared(v_desc, [k0, n0 + i * 64, k_col], kv_bar.index(i),
                                                v_smem.index(i).reshape([1, 64, HEAD_D]))
            n_j = n_qb - j_lo
            for g in range(GROUP):
                h = hk * GROUP + g
                for jj in range(n_j):
                    c = cnt + g * n_j + jj
                    slot = c % STAGES
                    mbarrier.wait(q_empty.index(slot), ((c // STAGES) & 1) ^ 1, pred=c >= STAGES)
                    mbarrier.expect(q_full.index(slot), 2 * BLOCK_MQ * HEAD_D * 2)
                    q0, q_col = _q_coords(b, h, H, SEQ_Q, (j_lo + jj) * BLOCK_MQ, HEAD_D, BSHD)
                    m = (j_lo + jj) * BLOCK_MQ
                    tma.async_copy_global_to_shared(q_desc, [q0, m, q_col], q_full.index(slot),
                                                    q_smem.index(slot).reshape([1, BLOCK_MQ, HEAD_D]))
                    tma.async_copy_global_to_shared(do_desc, [q0, m, q_col], q_full.index(slot),
                                                    do_smem.index(slot).reshape([1, BLOCK_MQ, HEAD_D]))
            cnt += GROUP * n_j
            it += 1

    @gluon.jit
    def _pt_dst(st, dpt, lse2, di, qrow, keys, scale2, m, r0, SEQ_K, CAUSAL: gl.constexpr):
        """P^T and dS^T of one (64 keys x query block) tile from S^T and dP^T; queries past SEQ_Q
        have lse2 = +inf (P = 0), keys past SEQ_K (a ragged last tile, zeros) are masked."""
        pt = gl.exp2(st * scale2 - gl.expand_dims(lse2, 0))
        if CAUSAL:
            if m < r0 + 64:
                pt = gl.where(gl.expand_dims(qrow, 0) >= gl.expand_dims(keys, 1), pt, 0.0)
        if r0 + 64 > SEQ_K:
            pt = gl.where(gl.expand_dims(keys, 1) + gl.expand_dims(qrow, 0) * 0 < SEQ_K, pt, 0.0)
        return pt, pt * (dpt - gl.expand_dims(di, 0))

    @gluon.jit
    def _dkdv_consumer(dk_desc, dv_desc, dq_desc, LSE, DELTA, k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, kv_bar,
                       kv_empty, q_full, q_empty, n_n, n_tiles, H, HK, GROUP, SEQ_Q, SEQ_K, scale2, sm_scale,
                       SUB: gl.constexpr, BLOCK_MQ: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr,
                       BSHD: gl.constexpr, CAUSAL: gl.constexpr, PERSISTENT: gl.constexpr,
                       FUSED_DQ: gl.constexpr):
        dtype: gl.constexpr = dk_desc.dtype
        s_layout: gl.constexpr = GF._acc_layout(BLOCK_MQ)
        o_layout: gl.constexpr = GF._acc_layout(HEAD_D)
        a_layout: gl.constexpr = GF._a_layout(HEAD_D)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
        ks = k_smem.index(SUB)
        vs = v_smem.index(SUB)
        qcols = gl.arange(0, BLOCK_MQ, layout=col_s)
        s_zero = gl.zeros([64, BLOCK_MQ], gl.float32, layout=s_layout)
        if FUSED_DQ:
            dq_zero = gl.zeros([BLOCK_MQ, HEAD_D], gl.float32, layout=o_layout)
            dq_s = dq_smem.index(SUB)
        step = GF._tile_step(n_tiles, PERSISTENT)
        n_qb = gl.cdiv(SEQ_Q, BLOCK_MQ)
        cnt = 0
        it = 0
        for t in range(gl.program_id(0), n_tiles, step):
            b, hk, n0, k0, k_col, j_lo = _kv_tile(t, n_n, HK, GROUP, SEQ_Q, SEQ_K, BLOCK_MQ, HEAD_D, BSHD, CAUSAL)
            r0 = n0 + SUB * 64
            keys = r0 + gl.arange(0, 64, layout=row_s)
            n_j = n_qb - j_lo
            dk = gl.zeros([64, HEAD_D], gl.float32, layout=o_layout)
            dv = gl.zeros([64, HEAD_D], gl.float32, layout=o_layout)
            mbarrier.wait(kv_bar.index(SUB), it & 1)
            for g in range(GROUP):
                base = (b * H + hk * GROUP + g).to(gl.int64) * SEQ_Q
                for jj in range(n_j):
                    c = cnt + g * n_j + jj
                    slot = c % STAGES
                    m = (j_lo + jj) * BLOCK_MQ
                    qrow = m + qcols
                    mbarrier.wait(q_full.index(slot), (c // STAGES) & 1)
                    if CAUSAL and m + BLOCK_MQ <= r0:   # every query of the block is before these keys
                        mbarrier.arrive(q_empty.index(slot))
                    else:
                        qsl = q_smem.index(slot)
                        dosl = do_smem.index(slot)
                        st_tok = warpgroup_mma(ks, qsl.permute((1, 0)), s_zero, use_acc=False, is_async=True)
                        dpt_tok = warpgroup_mma(vs, dosl.permute((1, 0)), s_zero, use_acc=False, is_async=True)
                        lse2 = gl.load(LSE + base + qrow, mask=qrow < SEQ_Q, other=float("inf")) * 1.4426950408889634
                        di = gl.load(DELTA + base + qrow, mask=qrow < SEQ_Q, other=0.0)
                        st, dpt = warpgroup_mma_wait(0, deps=[st_tok, dpt_tok])
                        pt, dst = _pt_dst(st, dpt, lse2, di, qrow, keys, scale2, m, r0, SEQ_K, CAUSAL)
                        pt16 = gl.convert_layout(pt.to(dtype), a_layout)
                        if FUSED_DQ:
                            ds_s = ds_smem.index(SUB)
                            ds_s.store(dst.to(dtype))
                            fence_async_shared()
                            dv_tok = warpgroup_mma(pt16, dosl, dv, is_async=True)
                            dk_tok = warpgroup_mma(ds_s, qsl, dk, is_async=True)
                            dq_tok = warpgroup_mma(ds_s.permute((1, 0)), ks, dq_zero, use_acc=False,
                                                   is_async=True)
                            dv, dk, dqp = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, dq_tok])
                            mbarrier.arrive(q_empty.index(slot))
                            # the previous block's reduction has read the staging tile by now (it ran
                            # under this block's products): wait for it, restage, add without waiting
                            tma.store_wait(pendings=0)
                            dq_s.store(dqp * sm_scale)
                            fence_async_shared()
                            _tma_reduce_add(dq_desc, [b * H + hk * GROUP + g, m, 0],
                                            dq_s.reshape([1, BLOCK_MQ, HEAD_D]))
                        else:
                            dst16 = gl.convert_layout(dst.to(dtype), a_layout)
                            dv_tok = warpgroup_mma(pt16, dosl, dv, is_async=True)
                            dk_tok = warpgroup_mma(dst16, qsl, dk, is_async=True)
                            dv, dk = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok])
                            mbarrier.arrive(q_empty.index(slot))
            cnt += GROUP * n_j
            it += 1
            # K/V of this tile are no longer read: their shared memory stages dK / dV
            ks.store((dk * sm_scale).to(dtype))
            vs.store(dv.to(dtype))
            fence_async_shared()
            # keys past SEQ_K (a ragged last tile) are clipped by the 3-D descriptors
            tma.async_copy_shared_to_global(dk_desc, [k0, r0, k_col], ks.reshape([1, 64, HEAD_D]))
            tma.async_copy_shared_to_global(dv_desc, [k0, r0, k_col], vs.reshape([1, 64, HEAD_D]))
            tma.store_wait(pendings=0)
            mbarrier.arrive(kv_empty.index(SUB))

    @gluon.jit
    def fmha_bwd_dkdv_gluon_ws_sm90(
        k_desc, v_desc, q_desc, do_desc, dk_desc, dv_desc, dq_desc, LSE, DELTA,
        H, HK, GROUP, SEQ_Q, SEQ_K, BHK, scale2, sm_scale,
        BSHD: gl.constexpr, CAUSAL: gl.constexpr, BLOCK_MQ: gl.constexpr, HEAD_D: gl.constexpr,
        STAGES: gl.constexpr, PERSISTENT: gl.constexpr, FUSED_DQ: gl.constexpr,
    ):
        """``FUSED_DQ``: ``dq_desc`` is the fp32 dQ accumulator [B*H, Sq, D] (zeroed by the caller, in
        blocks of [1, BLOCK_MQ, D]); otherwise it is not read (pass any descriptor).  All descriptors
        are 3-D (see ``gluon_fwd.views3``): ragged tails read zeros and their stores are clipped."""
        dtype: gl.constexpr = q_desc.dtype
        n_n = gl.cdiv(SEQ_K, 128)
        n_tiles = n_n * BHK
        k_layout: gl.constexpr = _nvmma_for(64, HEAD_D, dtype)
        q_layout: gl.constexpr = _nvmma_for(BLOCK_MQ, HEAD_D, dtype)
        k_smem = gl.allocate_shared_memory(dtype, [2, 64, HEAD_D], k_layout)
        v_smem = gl.allocate_shared_memory(dtype, [2, 64, HEAD_D], k_layout)
        q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_MQ, HEAD_D], q_layout)
        do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_MQ, HEAD_D], q_layout)
        kv_bar = GF._barriers(2, 1)
        kv_empty = GF._barriers(2, 1)
        q_full = GF._barriers(STAGES, 1)
        q_empty = GF._barriers(STAGES, 2)
        if FUSED_DQ:   # dS^T of each warpgroup, [64 keys, BLOCK_MQ queries]
            ds_layout: gl.constexpr = _nvmma_for(64, BLOCK_MQ, dtype)
            ds_smem = gl.allocate_shared_memory(dtype, [2, 64, BLOCK_MQ], ds_layout)
            dq_layout: gl.constexpr = _nvmma_for(BLOCK_MQ, HEAD_D, gl.float32)
            dq_smem = gl.allocate_shared_memory(gl.float32, [2, BLOCK_MQ, HEAD_D], dq_layout)
        else:
            ds_smem = k_smem
            dq_smem = k_smem
        gl.warp_specialize([
            (_dkdv_consumer, (dk_desc, dv_desc, dq_desc, LSE, DELTA, k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem,
                              kv_bar, kv_empty, q_full, q_empty, n_n, n_tiles, H, HK, GROUP, SEQ_Q, SEQ_K, scale2,
                              sm_scale, 0, BLOCK_MQ, HEAD_D, STAGES, BSHD, CAUSAL, PERSISTENT, FUSED_DQ)),
            (_dkdv_consumer, (dk_desc, dv_desc, dq_desc, LSE, DELTA, k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem,
                              kv_bar, kv_empty, q_full, q_empty, n_n, n_tiles, H, HK, GROUP, SEQ_Q, SEQ_K, scale2,
                              sm_scale, 1, BLOCK_MQ, HEAD_D, STAGES, BSHD, CAUSAL, PERSISTENT, FUSED_DQ)),
            (_dkdv_producer, (k_desc, v_desc, q_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, kv_empty,
                              q_full, q_empty, n_n, n_tiles, H, HK, GROUP, SEQ_Q, SEQ_K, BLOCK_MQ, HEAD_D, STAGES,
                              BSHD, CAUSAL, PERSISTENT)),
        ], [4, 4], [240, 24])

    # sizes are run-time integers (see gluon_fwd): one compiled kernel per tile, not per shape
    from ck_core.backends.triton_artifacts import specialisation as _specialisation

    _specialisation(runtime=("H", "HK", "GROUP", "SEQ_Q", "SEQ_K", "BH"))(fmha_bwd_dq_gluon_ws_sm90)
    _specialisation(runtime=("H", "HK", "GROUP", "SEQ_Q", "SEQ_K", "BHK"))(fmha_bwd_dkdv_gluon_ws_sm90)




def dkdv_smem_bytes(d: int, block_mq: int, stages: int, fused: bool, itemsize: int = 2) -> int:
    """Shared memory of the dK/dV kernel: K and V (128 keys), the Q/dO ring, and with ``fused`` the dS^T
    tiles and the two fp32 dQ staging tiles of the TMA reduce-add."""
    n = 2 * 128 * d * itemsize + stages * 2 * block_mq * d * itemsize
    if fused:
        n += 2 * 64 * block_mq * itemsize + 2 * block_mq * d * 4
    return n


def dkdv(q, k, v, do, lse, delta, *, causal=False, scale=None, layout="bhsd", tile=None, dq_acc=None, _via=None):
    """dK, dV (GQA: summed over each group) on the Gluon kernel; scope as :func:`dq`, any lengths
    (3-D descriptors: tails read zeros, stores clip, the last key/query blocks are masked).

    ``dq_acc``: a zeroed contiguous fp32 [B, Hq, Sq, D] tensor (any ``layout``): dQ is then added
    into it in the same kernel (TMA reduce-adds from every key tile, so the summation order and the
    last bits are not deterministic); ``ops_bwd.bwd_convert_dq`` rounds it."""
    import math

    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    d = q.shape[-1]
    from ck_core.device import current_arch

    bmq, stages, persistent = tile or _device_tiles("fused" if dq_acc is not None else "dkdv", q)[d]
    # (meta tensors: ck build tracing the launch of a key, whose tile the enumeration sized for its arch)
    smem = current_arch(q).lds_bytes if q.device.type != "meta" else None
    if smem is not None and dkdv_smem_bytes(d, bmq, stages, dq_acc is not None) > smem:
        raise ValueError(f"gluon dK/dV tile {(bmq, stages)} at head dim {d} needs more than "
                         f"{smem} bytes of shared memory (fewer stages)")
    b, hq, sq, hk, sk = GF.geometry(q, k, layout)[:5]
    shape_q, shape_k = GF.views3(q, k, layout)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    gdt = GF._gl_dtype(q.dtype)
    kl = gl.NVMMASharedLayout.get_default_for([1, 64, d], gdt)
    ql = gl.NVMMASharedLayout.get_default_for([1, bmq, d], gdt)
    descs = [TensorDescriptor.from_tensor(t.view(shape_k), [1, 64, d], kl) for t in (k, v)]
    descs += [TensorDescriptor.from_tensor(t.view(shape_q), [1, bmq, d], ql) for t in (q, do)]
    descs += [TensorDescriptor.from_tensor(t.view(shape_k), [1, 64, d], kl) for t in (dk, dv)]
    if dq_acc is not None:
        al = gl.NVMMASharedLayout.get_default_for([1, bmq, d], gl.float32)
        descs.append(TensorDescriptor.from_tensor(dq_acc.view(b * hq, sq, d), [1, bmq, d], al))
    else:
        descs.append(descs[-1])   # not read
    sm_scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    grid = GF.grid_for(-(-sk // 128) * b * hk, persistent, q.device)
    _launch(fmha_bwd_dkdv_gluon_ws_sm90, grid, _via)(
        *descs, lse, delta, hq, hk, hq // hk, sq, sk, b * hk, sm_scale * GF.LOG2E, sm_scale,
        BSHD=layout == "bshd", CAUSAL=bool(causal), BLOCK_MQ=bmq, HEAD_D=d, STAGES=stages,
        PERSISTENT=bool(persistent), FUSED_DQ=dq_acc is not None, num_warps=4)
    return dk, dv
