"""Hopper (sm90) attention forward written in Gluon (``triton.experimental.gluon``).

Why a second forward: Triton's own pipeliner waits on every ``tl.dot`` before the softmax that
reads it, so the tensor cores sit idle while a warpgroup computes exp2/max/sum.  Gluon exposes
the asynchronous ``wgmma`` and its wait, so this kernel keeps one product in flight while the
softmax runs (FlashAttention-3's intra-warpgroup overlap):

    issue S[j+1] = Q K[j+1]^T      (async)
    issue O     += P[j] V[j]        (async, P from registers)
    wait S[j+1]                     (one group still outstanding: the P V product)
    softmax(S[j+1]) -> P[j+1], m, l, alpha
    wait O; O *= alpha

K and V arrive by TMA into rings of ``STAGES`` slots, each slot with its own mbarrier; a CTA
barrier per iteration makes sure both warpgroups are done with a slot before the copy engine
overwrites it.  The CTA is ``num_warps`` warps (two warpgroups for 8) over a BLOCK_M x HEAD_D
query tile; the output goes back through the Q tile's shared memory with a TMA store.

Scope (the dispatcher falls back to ``fmha_fwd_kernel`` otherwise): batch mode, BHSD or BSHD
with contiguous Q/K/V/O, fp16/bf16, head dim 64/128 (q and v equal), no bias/dropout/softcap/
window/sinks, causal only with seqlen_q == seqlen_k, seqlen_q % BLOCK_M == 0 and
seqlen_k % BLOCK_N == 0 (CK calls these no-padding kernels).
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)

try:  # Gluon is experimental; its absence only removes this variant
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
    HAVE_GLUON = True
except Exception:  # pragma: no cover - depends on the installed triton
    HAVE_GLUON = False

LOG2E = 1.4426950408889634


if HAVE_GLUON:

    @gluon.jit
    def _softmax_step(s, m_i, l_i, qk_scale, rows, cols, n_off, MASKED: gl.constexpr):
        """Online-softmax update of one score block (raw Q K^T in ``s``)."""
        if MASKED:
            keep = gl.expand_dims(rows, 1) >= gl.expand_dims(cols + n_off, 0)
            s = gl.where(keep, s, -float("inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, 1)
        return p, m_new, l_i, alpha

    @gluon.jit
    def fmha_fwd_gluon_sm90(
        q_desc, k_desc, v_desc, o_desc, LSE, slb, slh,
        H, HK, GROUP, SEQ_Q, SEQ_K, qk_scale,
        BSHD: gl.constexpr, CAUSAL: gl.constexpr, STORE_LSE: gl.constexpr,
        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr,
        num_warps: gl.constexpr,
    ):
        dtype: gl.constexpr = q_desc.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_D, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

        pid_m = gl.program_id(0)
        bh = gl.program_id(1)
        if CAUSAL:  # heaviest query blocks first
            pid_m = gl.num_programs(0) - 1 - pid_m
        b = bh // H
        h = bh % H
        hk = h // GROUP
        m0 = pid_m * BLOCK_M
        if BSHD:
            q_row = b * SEQ_Q + m0
            q_col = h * HEAD_D
            k_row = b * SEQ_K
            k_col = hk * HEAD_D
        else:
            q_row = bh * SEQ_Q + m0
            q_col = 0
            k_row = (b * HK + hk) * SEQ_K
            k_col = 0

        if CAUSAL:
            n_full = m0 // BLOCK_N
            n_blocks = gl.cdiv(m0 + BLOCK_M, BLOCK_N)
        else:
            n_full = SEQ_K // BLOCK_N
            n_blocks = n_full

        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_bar.index(i), count=1)
            mbarrier.init(v_bar.index(i), count=1)

        kv_bytes: gl.constexpr = BLOCK_N * HEAD_D * 2
        mbarrier.expect(q_bar, BLOCK_M * HEAD_D * 2)
        tma.async_copy_global_to_shared(q_desc, [q_row, q_col], q_bar, q_smem)
        for i in gl.static_range(STAGES):
            pred = i < n_blocks
            mbarrier.expect(k_bar.index(i), kv_bytes, pred=pred)
            tma.async_copy_global_to_shared(k_desc, [k_row + i * BLOCK_N, k_col], k_bar.index(i),
                                            k_smem.index(i), pred=pred)
            mbarrier.expect(v_bar.index(i), kv_bytes, pred=pred)
            tma.async_copy_global_to_shared(v_desc, [k_row + i * BLOCK_N, k_col], v_bar.index(i),
                                            v_smem.index(i), pred=pred)

        rows = m0 + gl.arange(0, BLOCK_M, layout=row_s)
        cols = gl.arange(0, BLOCK_N, layout=col_s)
        m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, layout=row_s)
        l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=row_s)
        acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, layout=o_layout)
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)

        # block 0: S, softmax
        mbarrier.wait(q_bar, 0)
        mbarrier.wait(k_bar.index(0), 0)
        s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=[s_tok])
        if CAUSAL:
            if n_full == 0:
                p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, rows, cols, 0, True)
            else:
                p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, rows, cols, 0, False)
        else:
            p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, rows, cols, 0, False)

        for j in range(0, n_blocks - 1):
            slot = j % STAGES
            nslot = (j + 1) % STAGES
            # every warpgroup is done with K[j] (S[j] waited) and V[j-1] (O += P[j-1] V[j-1] waited):
            # refill K[j]'s slot with K[j+STAGES] and V[j-1]'s with V[j-1+STAGES]
            gl.thread_barrier()
            pred_k = j + STAGES < n_blocks
            mbarrier.expect(k_bar.index(slot), kv_bytes, pred=pred_k)
            tma.async_copy_global_to_shared(k_desc, [k_row + (j + STAGES) * BLOCK_N, k_col],
                                            k_bar.index(slot), k_smem.index(slot), pred=pred_k)
            pv = (j + STAGES - 1) % STAGES
            pred_v = (j > 0) & (j - 1 + STAGES < n_blocks)
            mbarrier.expect(v_bar.index(pv), kv_bytes, pred=pred_v)
            tma.async_copy_global_to_shared(v_desc, [k_row + (j - 1 + STAGES) * BLOCK_N, k_col],
                                            v_bar.index(pv), v_smem.index(pv), pred=pred_v)

            mbarrier.wait(k_bar.index(nslot), ((j + 1) // STAGES) & 1)
            s_tok = warpgroup_mma(q_smem, k_smem.index(nslot).permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)
            mbarrier.wait(v_bar.index(slot), (j // STAGES) & 1)
            p16 = gl.convert_layout(p.to(dtype), p_layout)
            acc_tok = warpgroup_mma(p16, v_smem.index(slot), acc, is_async=True)
            s = warpgroup_mma_wait(1, deps=[s_tok])
            if CAUSAL:
                if j + 1 >= n_full:
                    p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, rows, cols, (j + 1) * BLOCK_N, True)
                else:
                    p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, rows, cols, 0, False)
            else:
                p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, rows, cols, 0, False)
            acc = warpgroup_mma_wait(0, deps=[acc_tok])
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)

        last = n_blocks - 1
        lslot = last % STAGES
        mbarrier.wait(v_bar.index(lslot), (last // STAGES) & 1)
        p16 = gl.convert_layout(p.to(dtype), p_layout)
        acc_tok = warpgroup_mma(p16, v_smem.index(lslot), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc_tok])

        mbarrier.invalidate(q_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(k_bar.index(i))
            mbarrier.invalidate(v_bar.index(i))

        l_o = gl.convert_layout(l_i, row_o)
        out = acc / gl.expand_dims(l_o, 1)
        if STORE_LSE:
            lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
            gl.store(LSE + b.to(gl.int64) * slb + h.to(gl.int64) * slh + rows, lse)
        gl.thread_barrier()  # both warpgroups are past their last read of Q
        q_smem.store(out.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [q_row, q_col], q_smem)
        tma.store_wait(pendings=0)


    # -----------------------------------------------------------------------
    # warp-specialised variant: a producer warpgroup issues the TMA copies, two consumer
    # warpgroups own 64 query rows each; slots are handed over through full/empty mbarriers,
    # so the consumers never wait on each other (no CTA barrier in the main loop)
    # -----------------------------------------------------------------------
    @gluon.jit
    def _ws_producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_full, v_full, k_empty, v_empty,
                     q_row, q_col, k_row, k_col, n_blocks,
                     SUB_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr):
        kv_bytes: gl.constexpr = BLOCK_N * HEAD_D * 2
        for i in gl.static_range(2):
            mbarrier.expect(q_bar.index(i), SUB_M * HEAD_D * 2)
            tma.async_copy_global_to_shared(q_desc, [q_row + i * SUB_M, q_col], q_bar.index(i), q_smem.index(i))
        for j in range(n_blocks):
            slot = j % STAGES
            ph = ((j // STAGES) & 1) ^ 1
            mbarrier.wait(k_empty.index(slot), ph, pred=j >= STAGES)
            mbarrier.expect(k_full.index(slot), kv_bytes)
            tma.async_copy_global_to_shared(k_desc, [k_row + j * BLOCK_N, k_col], k_full.index(slot),
                                            k_smem.index(slot))
            mbarrier.wait(v_empty.index(slot), ph, pred=j >= STAGES)
            mbarrier.expect(v_full.index(slot), kv_bytes)
            tma.async_copy_global_to_shared(v_desc, [k_row + j * BLOCK_N, k_col], v_full.index(slot),
                                            v_smem.index(slot))

    @gluon.jit
    def _ws_consumer(o_desc, LSE, lse_off, q_smem, k_smem, v_smem, q_bar, k_full, v_full, k_empty, v_empty, turn,
                     q_row, q_col, m0, n_full, n_blocks, qk_scale,
                     SUB: gl.constexpr, CAUSAL: gl.constexpr, STORE_LSE: gl.constexpr,
                     SUB_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr,
                     PINGPONG: gl.constexpr):
        dtype: gl.constexpr = o_desc.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_D, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

        qs = q_smem.index(SUB)
        r0 = m0 + SUB * SUB_M
        rows = r0 + gl.arange(0, SUB_M, layout=row_s)
        cols = gl.arange(0, BLOCK_N, layout=col_s)
        m_i = gl.full([SUB_M], -float("inf"), gl.float32, layout=row_s)
        l_i = gl.full([SUB_M], 0.0, gl.float32, layout=row_s)
        acc = gl.zeros([SUB_M, HEAD_D], gl.float32, layout=o_layout)
        s_zero = gl.zeros([SUB_M, BLOCK_N], gl.float32, layout=s_layout)
        # this warpgroup's rows end at r0 + SUB_M: blocks at or past it are fully masked
        if CAUSAL:
            n_mine = gl.cdiv(r0 + SUB_M, BLOCK_N)
            n_full = r0 // BLOCK_N
            n_other = gl.cdiv(m0 + (1 - SUB) * SUB_M + SUB_M, BLOCK_N)
        else:
            n_mine = n_blocks
            n_other = n_blocks
        if PINGPONG:
            # the two warpgroups take turns issuing their two products (FlashAttention-3's
            # inter-warpgroup schedule): one's softmax runs under the other's wgmma
            if SUB == 1:
                mbarrier.arrive(turn.index(0))

        mbarrier.wait(q_bar.index(SUB), 0)
        mbarrier.wait(k_full.index(0), 0)
        s_tok = warpgroup_mma(qs, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=[s_tok])
        mbarrier.arrive(k_empty.index(0))
        if CAUSAL:
            if n_full == 0:
                p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, rows, cols, 0, True)
            else:
                p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, rows, cols, 0, False)
        else:
            p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, rows, cols, 0, False)

        for j in range(0, n_mine - 1):
            slot = j % STAGES
            nslot = (j + 1) % STAGES
            mbarrier.wait(k_full.index(nslot), ((j + 1) // STAGES) & 1)
            if PINGPONG:
                mbarrier.wait(turn.index(SUB), j & 1)
            s_tok = warpgroup_mma(qs, k_smem.index(nslot).permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)
            mbarrier.wait(v_full.index(slot), (j // STAGES) & 1)
            p16 = gl.convert_layout(p.to(dtype), p_layout)
            acc_tok = warpgroup_mma(p16, v_smem.index(slot), acc, is_async=True)
            if PINGPONG:
                mbarrier.arrive(turn.index(1 - SUB))
            s = warpgroup_mma_wait(1, deps=[s_tok])
            mbarrier.arrive(k_empty.index(nslot))
            if CAUSAL:
                if j + 1 >= n_full:
                    p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, rows, cols, (j + 1) * BLOCK_N, True)
                else:
                    p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, rows, cols, 0, False)
            else:
                p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, rows, cols, 0, False)
            acc = warpgroup_mma_wait(0, deps=[acc_tok])
            mbarrier.arrive(v_empty.index(slot))
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)

        if PINGPONG:  # turns the other warpgroup still takes (causal: it may have more blocks)
            for j in range(n_mine - 1, n_other - 1):
                mbarrier.wait(turn.index(SUB), j & 1)
                mbarrier.arrive(turn.index(1 - SUB))
        last = n_mine - 1
        lslot = last % STAGES
        mbarrier.wait(v_full.index(lslot), (last // STAGES) & 1)
        p16 = gl.convert_layout(p.to(dtype), p_layout)
        acc_tok = warpgroup_mma(p16, v_smem.index(lslot), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc_tok])
        mbarrier.arrive(v_empty.index(lslot))
        # blocks this warpgroup skips (causal, past its rows) still release their slots
        for j in range(n_mine, n_blocks):
            slot = j % STAGES
            mbarrier.wait(k_full.index(slot), (j // STAGES) & 1)
            mbarrier.arrive(k_empty.index(slot))
            mbarrier.wait(v_full.index(slot), (j // STAGES) & 1)
            mbarrier.arrive(v_empty.index(slot))

        l_o = gl.convert_layout(l_i, row_o)
        out = acc / gl.expand_dims(l_o, 1)
        if STORE_LSE:
            lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
            gl.store(LSE + lse_off + rows, lse)
        qs.store(out.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [q_row + SUB * SUB_M, q_col], qs)
        tma.store_wait(pendings=0)

    @gluon.jit
    def fmha_fwd_gluon_ws_sm90(
        q_desc, k_desc, v_desc, o_desc, LSE, slb, slh,
        H, HK, GROUP, SEQ_Q, SEQ_K, qk_scale,
        BSHD: gl.constexpr, CAUSAL: gl.constexpr, STORE_LSE: gl.constexpr,
        BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr, PRODUCER_REGS: gl.constexpr,
        CONSUMER_REGS: gl.constexpr, PINGPONG: gl.constexpr,
    ):
        SUB_M: gl.constexpr = q_desc.block_type.shape[0]   # 64 rows per consumer warpgroup
        BLOCK_M: gl.constexpr = 2 * SUB_M
        dtype: gl.constexpr = q_desc.dtype
        pid_m = gl.program_id(0)
        bh = gl.program_id(1)
        if CAUSAL:
            pid_m = gl.num_programs(0) - 1 - pid_m
        b = bh // H
        h = bh % H
        hk = h // GROUP
        m0 = pid_m * BLOCK_M
        if BSHD:
            q_row = b * SEQ_Q + m0
            q_col = h * HEAD_D
            k_row = b * SEQ_K
            k_col = hk * HEAD_D
        else:
            q_row = bh * SEQ_Q + m0
            q_col = 0
            k_row = (b * HK + hk) * SEQ_K
            k_col = 0
        if CAUSAL:
            n_full = m0 // BLOCK_N
            n_blocks = gl.cdiv(m0 + BLOCK_M, BLOCK_N)
        else:
            n_full = SEQ_K // BLOCK_N
            n_blocks = n_full
        lse_off = b.to(gl.int64) * slb + h.to(gl.int64) * slh

        q_smem = gl.allocate_shared_memory(dtype, [2, SUB_M, HEAD_D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(q_bar.index(i), count=1)
            mbarrier.init(turn.index(i), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_full.index(i), count=1)
            mbarrier.init(v_full.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=2)
            mbarrier.init(v_empty.index(i), count=2)

        gl.warp_specialize([
            (_ws_consumer, (o_desc, LSE, lse_off, q_smem, k_smem, v_smem, q_bar, k_full, v_full, k_empty, v_empty,
                            turn, q_row, q_col, m0, n_full, n_blocks, qk_scale, 0, CAUSAL, STORE_LSE, SUB_M,
                            BLOCK_N, HEAD_D, STAGES, PINGPONG)),
            (_ws_consumer, (o_desc, LSE, lse_off, q_smem, k_smem, v_smem, q_bar, k_full, v_full, k_empty, v_empty,
                            turn, q_row, q_col, m0, n_full, n_blocks, qk_scale, 1, CAUSAL, STORE_LSE, SUB_M,
                            BLOCK_N, HEAD_D, STAGES, PINGPONG)),
            (_ws_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_full, v_full, k_empty, v_empty,
                            q_row, q_col, k_row, k_col, n_blocks, SUB_M, BLOCK_N, HEAD_D, STAGES)),
        ], [4, 4], [CONSUMER_REGS, PRODUCER_REGS])


# ---------------------------------------------------------------------------
# host side
# ---------------------------------------------------------------------------
DEFAULT_TILES = {128: (128, 128, 8, 2), 64: (128, 128, 8, 2)}   # (BLOCK_M, BLOCK_N, warps, stages)
WS_WARPS = 12   # warps=12 in a tile: the warp-specialised kernel (BLOCK_M must be 128)
GLUON_DTYPES = ("float16", "bfloat16")


def unsupported_reason(q, k, v, *, causal=False, layout="bhsd", tile=None, window=(-1, -1), softcap=0.0,
                       bias=None, alibi_slopes=None, dropout_p=0.0, sink=None, sink_tokens=0,
                       out=None) -> str:
    """Why the Gluon kernel cannot take this problem ('' when it can)."""
    import torch
    if not HAVE_GLUON:
        return "triton.experimental.gluon is not importable"
    if not q.is_cuda or torch.version.hip is not None or torch.cuda.get_device_capability(q.device)[0] != 9:
        return "needs an sm90 (Hopper) GPU"
    if layout not in ("bhsd", "bshd"):
        return f"layout {layout!r} (batch mode bhsd/bshd only)"
    if str(q.dtype).split(".")[-1] not in GLUON_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtype {q.dtype} (fp16/bf16 only)"
    if q.shape[-1] not in DEFAULT_TILES or k.shape[-1] != q.shape[-1] or v.shape[-1] != q.shape[-1]:
        return f"head dims q {q.shape[-1]} k {k.shape[-1]} v {v.shape[-1]} (64 or 128, all equal)"
    if tuple(window) != (-1, -1) or softcap or bias is not None or alibi_slopes is not None or dropout_p \
            or sink is not None or sink_tokens:
        return "window/softcap/bias/alibi/dropout/sinks are not in the Gluon kernel"
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()):
        return "q/k/v must be contiguous"
    if out is not None and (not out.is_contiguous() or out.shape != q.shape or out.dtype != q.dtype):
        return "out must be a contiguous tensor of q's shape and dtype"
    sdim = 2 if layout == "bhsd" else 1
    hdim = 1 if layout == "bhsd" else 2
    sq, sk = q.shape[sdim], k.shape[sdim]
    hq, hk = q.shape[hdim], k.shape[hdim]
    if hk == 0 or hq % hk or v.shape[hdim] != hk or q.shape[0] != k.shape[0] or v.shape[sdim] != sk:
        return "q/k/v shapes disagree (batch, heads, kv length)"
    bm, bn, _, _ = tile or DEFAULT_TILES[q.shape[-1]]
    if sq % bm or sk % bn or sq == 0:
        return f"seqlen_q {sq} % {bm} or seqlen_k {sk} % {bn} (no-padding kernel)"
    if causal and sq != sk:
        return "causal with seqlen_q != seqlen_k"
    for t in (q, k, v):
        if t.data_ptr() % 16:
            return "q/k/v must be 16-byte aligned"
    return ""


def fwd(q, k, v, *, causal=False, scale=None, return_lse=False, layout="bhsd", tile=None, out=None,
        pingpong=False):
    """Gluon forward; raises ``UnsupportedProblem`` naming what it lacks (see
    :func:`unsupported_reason`)."""
    import math

    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from ck_core.errors import UnsupportedProblem
    why = unsupported_reason(q, k, v, causal=causal, layout=layout, tile=tile, out=out)
    if why:
        raise UnsupportedProblem(f"gluon sm90 forward: {why}")
    d = q.shape[-1]
    bm, bn, warps, stages = tile or DEFAULT_TILES[d]
    if layout == "bhsd":
        b, hq, sq, _ = q.shape
        hk, sk = k.shape[1], k.shape[2]
        views = (q.view(b * hq * sq, d), k.view(b * hk * sk, d), v.view(b * hk * sk, d))
    else:
        b, sq, hq, _ = q.shape
        sk, hk = k.shape[1], k.shape[2]
        views = (q.view(b * sq, hq * d), k.view(b * sk, hk * d), v.view(b * sk, hk * d))
    o = out if out is not None else torch.empty_like(q)
    ov = o.view(views[0].shape)
    ws = warps == WS_WARPS   # producer warpgroup + two consumer warpgroups of 64 rows
    qm = bm // 2 if ws else bm
    gdt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    q_l = gl.NVMMASharedLayout.get_default_for([qm, d], gdt)
    kv_l = gl.NVMMASharedLayout.get_default_for([bn, d], gdt)
    qd = TensorDescriptor.from_tensor(views[0], [qm, d], q_l)
    kd = TensorDescriptor.from_tensor(views[1], [bn, d], kv_l)
    vd = TensorDescriptor.from_tensor(views[2], [bn, d], kv_l)
    od = TensorDescriptor.from_tensor(ov, [qm, d], q_l)
    if return_lse:
        lse = torch.empty((b, hq, sq), device=q.device, dtype=torch.float32)
    else:
        lse = torch.empty(1, device=q.device, dtype=torch.float32)
    sm_scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    grid = (sq // bm, b * hq)
    common = (qd, kd, vd, od, lse, hq * sq if return_lse else 0, sq if return_lse else 0,
              hq, hk, hq // hk, sq, sk, sm_scale * LOG2E)
    if ws:
        fmha_fwd_gluon_ws_sm90[grid](
            *common, BSHD=layout == "bshd", CAUSAL=bool(causal), STORE_LSE=bool(return_lse),
            BLOCK_N=bn, HEAD_D=d, STAGES=stages, PRODUCER_REGS=24, CONSUMER_REGS=240,
            PINGPONG=bool(pingpong), num_warps=4)
    else:
        fmha_fwd_gluon_sm90[grid](
            *common, BSHD=layout == "bshd", CAUSAL=bool(causal), STORE_LSE=bool(return_lse),
            BLOCK_M=bm, BLOCK_N=bn, HEAD_D=d, STAGES=stages, num_warps=warps)
    return (o, lse) if return_lse else o
