"""Hopper (sm90) attention forward written in Gluon (``triton.experimental.gluon``).

Why a second forward: Triton's own pipeliner waits on every ``tl.dot`` before the softmax that
reads it, so the tensor cores sit idle while a warpgroup computes exp2/max/sum, and all warps of
a program share one instruction stream.  Gluon exposes the asynchronous ``wgmma``, mbarriers and
warp specialisation, which is what FlashAttention-3's schedule needs:

* a producer warpgroup (24 registers) issues the TMA copies of Q, K and V; K and V go through
  rings of ``STAGES`` slots handed over by full/empty mbarriers;
* two consumer warpgroups (240 registers) own 64 query rows each and keep one product in flight
  while the softmax runs (intra-warpgroup overlap):

      issue S[j+1] = Q K[j+1]^T   (async)
      issue O     += P[j] V[j]     (async, P from registers)
      wait S[j+1]                  (the P V product may still run)
      softmax(S[j+1]) -> P[j+1], m, l, alpha
      wait O; O *= alpha

* ``PINGPONG``: the consumers take turns issuing their products (inter-warpgroup overlap), so one
  warpgroup's softmax runs under the other's wgmma;
* ``PERSISTENT``: one program per SM walks over the (query block, batch x head) tiles, so the next
  tile's Q/K/V copies overlap this tile's last products and its output store (a consumer releases
  its Q as soon as its last Q K^T completes, before the last softmax, P V product and epilogue).

Scope (``unsupported_reason`` says what is missing; the launcher falls back to ``fmha_fwd_kernel``):
batch mode, BHSD or BSHD with contiguous Q/K/V/O, fp16/bf16, head dim 64/128 (q and v equal), no
bias/dropout/softcap/window/sinks, causal only with seqlen_q == seqlen_k.  Any lengths: the
descriptors are 3-D (one head's or one batch's rows), so a ragged last query block reads zeros past
seqlen_q and its output store is clipped (its lse store masked), and a ragged last key block reads
zeros past seqlen_k, whose scores are masked to -inf on that block only.
"""
from __future__ import annotations

import functools
import logging

from .configs import GLUON_HDIMS, GLUON_VARIANT_FLAGS, GLUON_WS_WARPS, hopper

log = logging.getLogger(__name__)

try:  # Gluon is experimental; its absence only removes these variants
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
    def _softmax_step(s, m_i, l_i, qk_scale, rows, cols, n_off, MASKED: gl.constexpr, CAUSAL: gl.constexpr = True,
                      kmax=0):
        """Online-softmax update of one score block (raw Q K^T in ``s``, keys ``n_off + cols``).
        ``MASKED``: keys past the row (``CAUSAL``) or at or past ``kmax`` (the ragged last key block;
        TMA filled its missing rows with zeros) score -inf."""
        if MASKED:
            if CAUSAL:
                keep = gl.expand_dims(rows, 1) >= gl.expand_dims(cols + n_off, 0)
            else:
                keep = (gl.expand_dims(rows, 1) * 0) + gl.expand_dims(cols + n_off, 0) < kmax
            s = gl.where(keep, s, -float("inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, 1)
        return p, m_new, l_i, alpha

    @gluon.constexpr_function
    def _acc_layout(n):
        """wgmma accumulator layout of one warpgroup: m64 x ``n`` (instructions m16 n``n`` k16)."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])

    @gluon.constexpr_function
    def _a_layout(n):
        """Register A operand (16-bit) of a product accumulating into ``_acc_layout(n)``."""
        return gl.DotOperandLayout(operand_index=0, parent=_acc_layout(n), k_width=2)

    @gluon.jit
    def _barriers(N: gl.constexpr, COUNT: gl.constexpr):
        """``N`` mbarriers in shared memory, each expecting ``COUNT`` arrivals per phase."""
        bars = gl.allocate_shared_memory(gl.int64, [N, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(N):
            mbarrier.init(bars.index(i), count=COUNT)
        return bars

    @gluon.jit
    def _load_kv3(k_desc, v_desc, k_smem, v_smem, k_full, v_full, k_empty, v_empty, c, k0, row, col,
                  STAGES: gl.constexpr):
        """Producer step ``c`` of a K/V ring: wait until the slot is free (both consumers arrived
        on its empty barrier; the first ``STAGES`` steps find it free), then copy K and V rows
        [row, row + BLOCK_N) of head/batch ``k0`` into it (3-D descriptors [B*HK, SK, D] or
        [B, SK, HK*D]: rows past the last key read zeros, never a neighbouring head's), each
        completing on its full barrier."""
        slot = c % STAGES
        ph = ((c // STAGES) & 1) ^ 1
        BN: gl.constexpr = k_desc.block_type.shape[1]
        D: gl.constexpr = k_desc.block_type.shape[2]
        mbarrier.wait(k_empty.index(slot), ph, pred=c >= STAGES)
        mbarrier.expect(k_full.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [k0, row, col], k_full.index(slot),
                                        k_smem.index(slot).reshape([1, BN, D]))
        mbarrier.wait(v_empty.index(slot), ph, pred=c >= STAGES)
        mbarrier.expect(v_full.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [k0, row, col], v_full.index(slot),
                                        v_smem.index(slot).reshape([1, BN, D]))

    @gluon.constexpr_function
    def _nvmma2(rows, cols, dtype):
        """The 2-D shared layout of a [rows, cols] tile (what wgmma reads; the 3-D TMA block
        [1, rows, cols] is a reshape of it)."""
        return gl.NVMMASharedLayout.get_default_for([rows, cols], dtype)

    @gluon.jit
    def _tile_step(n_tiles, PERSISTENT: gl.constexpr):
        """Stride of a program's walk over the tiles: none (one tile per program), or, ``PERSISTENT``,
        the number of programs (one per SM)."""
        if PERSISTENT:
            return gl.num_programs(0)
        else:
            return n_tiles

    @gluon.jit
    def _tile3(t, n_m, n_tiles, H, HK, GROUP, SEQ_Q, SEQ_K, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
               HEAD_D: gl.constexpr, BSHD: gl.constexpr, CAUSAL: gl.constexpr, PERSISTENT: gl.constexpr):
        """Tile ``t`` -> (b, h, m0, q0, q_col, k0, k_col, n_blocks) for 3-D descriptors (bhsd
        [B*H, S, D], bshd [B, S, H*D]): the Q block starts at [q0, m0, q_col], key block j at
        [k0, j * BLOCK_N, k_col].  Ragged lengths: the last blocks reach past the sequence; their
        missing rows read zeros and their stores are clipped.  Query blocks of one head are
        consecutive tiles (K/V stay in L2), heaviest first under a causal mask.  The persistent
        causal walk (program p takes p, p + P, p + 2P, ...) mirrors every second pass of P tiles, so
        a program that drew a heavy block in one pass draws a light one in the next (a
        longest-first order over all heads instead measured 0.70x at S=4096: K/V no longer stay in
        L2)."""
        if CAUSAL and PERSISTENT:
            nprog = gl.num_programs(0)
            base = (t // nprog) * nprog
            if (t // nprog) % 2 == 1:
                r = gl.minimum(nprog, n_tiles - base)
                t = base + r - 1 - (t - base)
        pid_m = t % n_m
        bh = t // n_m
        if CAUSAL:
            pid_m = n_m - 1 - pid_m
        b = bh // H
        h = bh % H
        hk = h // GROUP
        m0 = pid_m * BLOCK_M
        if BSHD:
            q0 = b
            q_col = h * HEAD_D
            k0 = b
            k_col = hk * HEAD_D
        else:
            q0 = bh
            q_col = h * 0
            k0 = b * HK + hk
            k_col = h * 0
        n_blocks = gl.cdiv(SEQ_K, BLOCK_N)
        if CAUSAL:
            n_blocks = gl.minimum(gl.cdiv(m0 + BLOCK_M, BLOCK_N), n_blocks)
        return b, h, m0, q0, q_col, k0, k_col, n_blocks

    @gluon.jit
    def _ws_producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_full, v_full, k_empty,
                     v_empty, n_m, n_tiles, H, HK, GROUP, SEQ_Q, SEQ_K,
                     SUB_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr,
                     BSHD: gl.constexpr, CAUSAL: gl.constexpr, PERSISTENT: gl.constexpr):
        step = _tile_step(n_tiles, PERSISTENT)
        cnt = 0
        it = 0
        for t in range(gl.program_id(0), n_tiles, step):
            b, h, m0, q0, q_col, k0, k_col, n_blocks = _tile3(
                t, n_m, n_tiles, H, HK, GROUP, SEQ_Q, SEQ_K, 2 * SUB_M, BLOCK_N, HEAD_D, BSHD, CAUSAL, PERSISTENT)
            for i in gl.static_range(2):
                mbarrier.wait(q_empty.index(i), (it & 1) ^ 1, pred=it > 0)
                mbarrier.expect(q_bar.index(i), SUB_M * HEAD_D * 2)
                tma.async_copy_global_to_shared(q_desc, [q0, m0 + i * SUB_M, q_col], q_bar.index(i),
                                                q_smem.index(i).reshape([1, SUB_M, HEAD_D]))
            for j in range(n_blocks):
                _load_kv3(k_desc, v_desc, k_smem, v_smem, k_full, v_full, k_empty, v_empty, cnt + j,
                          k0, j * BLOCK_N, k_col, STAGES)
            cnt += n_blocks
            it += 1

    @gluon.jit
    def _ws_consumer(o_desc, LSE, slb, slh, q_smem, o_smem, k_smem, v_smem, q_bar, q_empty, k_full, v_full,
                     k_empty, v_empty, turn, n_m, n_tiles, H, HK, GROUP, SEQ_Q, SEQ_K, qk_scale,
                     SUB: gl.constexpr, CAUSAL: gl.constexpr, STORE_LSE: gl.constexpr,
                     SUB_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr,
                     BSHD: gl.constexpr, PINGPONG: gl.constexpr, PERSISTENT: gl.constexpr):
        dtype: gl.constexpr = o_desc.dtype
        s_layout: gl.constexpr = _acc_layout(BLOCK_N)
        o_layout: gl.constexpr = _acc_layout(HEAD_D)
        p_layout: gl.constexpr = _a_layout(HEAD_D)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        qs = q_smem.index(SUB)
        os_ = o_smem.index(SUB)
        cols = gl.arange(0, BLOCK_N, layout=col_s)
        s_zero = gl.zeros([SUB_M, BLOCK_N], gl.float32, layout=s_layout)
        step = _tile_step(n_tiles, PERSISTENT)
        if PINGPONG:
            # the warpgroups take turns issuing their two products (FlashAttention-3's
            # inter-warpgroup schedule): one's softmax runs under the other's wgmma
            if SUB == 1:
                mbarrier.arrive(turn.index(0))
        cnt = 0
        it = 0
        tc = 0
        for t in range(gl.program_id(0), n_tiles, step):
            b, h, m0, q0, q_col, k0, k_col, n_blocks = _tile3(
                t, n_m, n_tiles, H, HK, GROUP, SEQ_Q, SEQ_K, 2 * SUB_M, BLOCK_N, HEAD_D, BSHD, CAUSAL, PERSISTENT)
            r0 = m0 + SUB * SUB_M
            # blocks j >= n_full are masked: causal, those reaching this warpgroup's rows (blocks
            # at or past its last row are skipped: fully masked); otherwise the ragged last block
            # (keys past SEQ_K; none when SEQ_K is a multiple of BLOCK_N)
            if CAUSAL:
                n_mine = gl.minimum(gl.cdiv(r0 + SUB_M, BLOCK_N), n_blocks)
                n_full = r0 // BLOCK_N
                n_other = gl.minimum(gl.cdiv(m0 + (1 - SUB) * SUB_M + SUB_M, BLOCK_N), n_blocks)
            else:
                n_mine = n_blocks
                n_full = SEQ_K // BLOCK_N
                n_other = n_blocks
            rows = r0 + gl.arange(0, SUB_M, layout=row_s)
            m_i = gl.full([SUB_M], -float("inf"), gl.float32, layout=row_s)
            l_i = gl.full([SUB_M], 0.0, gl.float32, layout=row_s)
            acc = gl.zeros([SUB_M, HEAD_D], gl.float32, layout=o_layout)

            mbarrier.wait(q_bar.index(SUB), it & 1)
            slot0 = cnt % STAGES
            mbarrier.wait(k_full.index(slot0), (cnt // STAGES) & 1)
            s_tok = warpgroup_mma(qs, k_smem.index(slot0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(0, deps=[s_tok])
            mbarrier.arrive(k_empty.index(slot0))
            if n_mine == 1:   # Q is read by the Q K^T products only: free it for the next tile's copy
                mbarrier.arrive(q_empty.index(SUB))
            if n_full == 0:
                p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, rows, cols, 0, True, CAUSAL, SEQ_K)
            else:
                p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, rows, cols, 0, False)

            for j in range(0, n_mine - 1):
                c = cnt + j
                slot = c % STAGES
                nslot = (c + 1) % STAGES
                mbarrier.wait(k_full.index(nslot), ((c + 1) // STAGES) & 1)
                if PINGPONG:
                    mbarrier.wait(turn.index(SUB), (tc + j) & 1)
                s_tok = warpgroup_mma(qs, k_smem.index(nslot).permute((1, 0)), s_zero, use_acc=False,
                                      is_async=True)
                mbarrier.wait(v_full.index(slot), (c // STAGES) & 1)
                p16 = gl.convert_layout(p.to(dtype), p_layout)
                acc_tok = warpgroup_mma(p16, v_smem.index(slot), acc, is_async=True)
                if PINGPONG:
                    mbarrier.arrive(turn.index(1 - SUB))
                s = warpgroup_mma_wait(1, deps=[s_tok])
                mbarrier.arrive(k_empty.index(nslot))
                if j == n_mine - 2:   # this tile's last Q K^T is done: the next tile's Q may load
                    mbarrier.arrive(q_empty.index(SUB))
                if j + 1 >= n_full:
                    p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, rows, cols, (j + 1) * BLOCK_N,
                                                       True, CAUSAL, SEQ_K)
                else:
                    p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, rows, cols, 0, False)
                acc = warpgroup_mma_wait(0, deps=[acc_tok])
                mbarrier.arrive(v_empty.index(slot))
                acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)

            if PINGPONG:  # turns the other warpgroup still takes (causal: it may have more blocks)
                for j in range(n_mine - 1, n_other - 1):
                    mbarrier.wait(turn.index(SUB), (tc + j) & 1)
                    mbarrier.arrive(turn.index(1 - SUB))
                if n_other > n_mine:
                    tc += n_other - 1
                else:
                    tc += n_mine - 1
            last = cnt + n_mine - 1
            lslot = last % STAGES
            mbarrier.wait(v_full.index(lslot), (last // STAGES) & 1)
            p16 = gl.convert_layout(p.to(dtype), p_layout)
            acc_tok = warpgroup_mma(p16, v_smem.index(lslot), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc_tok])
            mbarrier.arrive(v_empty.index(lslot))
            # blocks this warpgroup skips (causal, past its rows) still release their slots
            for j in range(n_mine, n_blocks):
                c = cnt + j
                slot = c % STAGES
                mbarrier.wait(k_full.index(slot), (c // STAGES) & 1)
                mbarrier.arrive(k_empty.index(slot))
                mbarrier.wait(v_full.index(slot), (c // STAGES) & 1)
                mbarrier.arrive(v_empty.index(slot))
            cnt += n_blocks
            it += 1

            l_o = gl.convert_layout(l_i, row_o)
            out = acc / gl.expand_dims(l_o, 1)
            if STORE_LSE:
                lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
                gl.store(LSE + b.to(gl.int64) * slb + h.to(gl.int64) * slh + rows, lse, mask=rows < SEQ_Q)
            tma.store_wait(pendings=0)   # the previous tile's output has left os_
            os_.store(out.to(dtype))
            fence_async_shared()
            # rows past SEQ_Q (a ragged last query block) are clipped by the 3-D descriptor
            tma.async_copy_shared_to_global(o_desc, [q0, r0, q_col], os_.reshape([1, SUB_M, HEAD_D]))
        tma.store_wait(pendings=0)

    @gluon.jit
    def fmha_fwd_gluon_ws_sm90(
        q_desc, k_desc, v_desc, o_desc, LSE, slb, slh,
        H, HK, GROUP, SEQ_Q, SEQ_K, BH, qk_scale,
        BSHD: gl.constexpr, CAUSAL: gl.constexpr, STORE_LSE: gl.constexpr,
        BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr, PRODUCER_REGS: gl.constexpr,
        CONSUMER_REGS: gl.constexpr, PINGPONG: gl.constexpr, PERSISTENT: gl.constexpr,
    ):
        """Grid: (tiles,) or, ``PERSISTENT``, (min(tiles, SMs),); a tile is 128 query rows of one
        (batch, head); ``num_warps=4`` (the first consumer) + 4 + 4 worker warps.  The descriptors
        are 3-D (:func:`descriptors`) with blocks [1, 64, D] (q, o) and [1, BLOCK_N, D] (k, v)."""
        SUB_M: gl.constexpr = q_desc.block_type.shape[1]   # 64 rows per consumer warpgroup
        dtype: gl.constexpr = q_desc.dtype
        n_m = gl.cdiv(SEQ_Q, 2 * SUB_M)
        n_tiles = n_m * BH
        q_layout: gl.constexpr = _nvmma2(SUB_M, HEAD_D, dtype)
        kv_layout: gl.constexpr = _nvmma2(BLOCK_N, HEAD_D, dtype)
        q_smem = gl.allocate_shared_memory(dtype, [2, SUB_M, HEAD_D], q_layout)
        o_smem = gl.allocate_shared_memory(dtype, [2, SUB_M, HEAD_D], q_layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], kv_layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], kv_layout)
        q_bar = _barriers(2, 1)
        q_empty = _barriers(2, 1)
        turn = _barriers(2, 1)
        k_full = _barriers(STAGES, 1)
        v_full = _barriers(STAGES, 1)
        k_empty = _barriers(STAGES, 2)   # both consumers release a slot
        v_empty = _barriers(STAGES, 2)

        gl.warp_specialize([
            (_ws_consumer, (o_desc, LSE, slb, slh, q_smem, o_smem, k_smem, v_smem, q_bar, q_empty, k_full, v_full,
                            k_empty, v_empty, turn, n_m, n_tiles, H, HK, GROUP, SEQ_Q, SEQ_K, qk_scale, 0, CAUSAL,
                            STORE_LSE, SUB_M, BLOCK_N, HEAD_D, STAGES, BSHD, PINGPONG, PERSISTENT)),
            (_ws_consumer, (o_desc, LSE, slb, slh, q_smem, o_smem, k_smem, v_smem, q_bar, q_empty, k_full, v_full,
                            k_empty, v_empty, turn, n_m, n_tiles, H, HK, GROUP, SEQ_Q, SEQ_K, qk_scale, 1, CAUSAL,
                            STORE_LSE, SUB_M, BLOCK_N, HEAD_D, STAGES, BSHD, PINGPONG, PERSISTENT)),
            (_ws_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_full, v_full,
                            k_empty, v_empty, n_m, n_tiles, H, HK, GROUP, SEQ_Q, SEQ_K, SUB_M, BLOCK_N, HEAD_D,
                            STAGES, BSHD, CAUSAL, PERSISTENT)),
        ], [4, 4], [CONSUMER_REGS, PRODUCER_REGS])

    # sizes are run-time integers (the descriptors carry shapes and strides; masks are per block),
    # LSE strides too: one compiled kernel per (dtype, head dim, tile, causal, layout)
    from ck_core.backends.triton_artifacts import specialisation as _specialisation

    _specialisation(runtime=("slb", "slh", "H", "HK", "GROUP", "SEQ_Q", "SEQ_K", "BH"))(fmha_fwd_gluon_ws_sm90)


# ---------------------------------------------------------------------------
# host side
# ---------------------------------------------------------------------------
DEFAULT_TILES = {128: (128, 128, 12, 2), 64: (128, 128, 12, 3)}   # (BLOCK_M, BLOCK_N, warps, stages)
#: the warp-specialised kernel's warps, its dispatcher variants -> launch flags, its head dims (data: configs.py)
WS_WARPS, GLUON_VARIANTS, HDIMS = GLUON_WS_WARPS, GLUON_VARIANT_FLAGS, GLUON_HDIMS


def _gl_dtype(dtype):
    name = str(dtype).replace("torch.", "")
    return {"bfloat16": gl.bfloat16, "bf16": gl.bfloat16, "float16": gl.float16, "fp16": gl.float16}[name]


def aot_source(dtype: str, hdim: int, block_n: int, stages: int, variant: str = "gluon_ws", *,
               causal: bool = False, bshd: bool = False, lse: bool = True):
    """(GluonASTSource, compile options) of the warp-specialised kernel, for
    ``triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)`` without a GPU."""
    import torch
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import mangle_type

    if variant not in GLUON_VARIANTS:
        raise ValueError(f"unknown Gluon variant {variant!r}; known: {', '.join(GLUON_VARIANTS)}")
    gdt = _gl_dtype(dtype)
    tdt = torch.bfloat16 if gdt == gl.bfloat16 else torch.float16
    x = torch.empty(1, max(block_n, 64), hdim, dtype=tdt)   # host placeholder: only its type is read
    q_t = mangle_type(TensorDescriptor.from_tensor(x[:, :64], [1, 64, hdim],
                                                   gl.NVMMASharedLayout.get_default_for([1, 64, hdim], gdt)))
    kv_t = mangle_type(TensorDescriptor.from_tensor(x[:, :block_n], [1, block_n, hdim],
                                                    gl.NVMMASharedLayout.get_default_for([1, block_n, hdim], gdt)))
    fn = fmha_fwd_gluon_ws_sm90
    sig = dict(q_desc=q_t, k_desc=kv_t, v_desc=kv_t, o_desc=q_t, LSE="*fp32", slb="i32", slh="i32", H="i32",
               HK="i32", GROUP="i32", SEQ_Q="i32", SEQ_K="i32", BH="i32", qk_scale="fp32")
    cx = dict(BSHD=bool(bshd), CAUSAL=bool(causal), STORE_LSE=bool(lse), BLOCK_N=int(block_n), HEAD_D=int(hdim),
              STAGES=int(stages), PRODUCER_REGS=24, CONSUMER_REGS=240,
              PINGPONG=GLUON_VARIANTS[variant]["pingpong"], PERSISTENT=GLUON_VARIANTS[variant]["persistent"])
    for k in cx:
        sig[k] = "constexpr"
    src = GluonASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in cx.items()})
    return src, dict(num_warps=4, num_stages=1)
GLUON_DTYPES = ("float16", "bfloat16")


def unsupported_reason(q, k, v, *, causal=False, layout="bhsd", tile=None, window=(-1, -1), softcap=0.0,
                       bias=None, alibi_slopes=None, dropout_p=0.0, sink=None, sink_tokens=0,
                       out=None) -> str:
    """Why the Gluon kernel cannot take this problem ('' when it can)."""
    import torch
    if not HAVE_GLUON:
        return "triton.experimental.gluon is not importable"
    # meta tensors: ck build tracing a launch for a Hopper target (nothing runs)
    if q.device.type != "meta" and (
            not q.is_cuda or not _on_hopper(q.device.index if q.device.index is not None else torch.cuda.current_device())):
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
    if sq == 0 or sk == 0:
        return "empty seqlen_q or seqlen_k"
    if causal and sq != sk:
        return "causal with seqlen_q != seqlen_k"
    for t in (q, k, v):
        if t.data_ptr() % 16:
            return "q/k/v must be 16-byte aligned"
    return ""


def geometry(q, k, layout: str) -> tuple:
    """(b, hq, sq, hk, sk, rows_q, rows_k, cols_q, cols_k) of q/k in ``layout``: the kernels see
    every tensor as its flattened 2-D view [rows, cols] (bhsd: [B*H*S, D]; bshd: [B*S, H*D])."""
    d = q.shape[-1]
    if layout == "bhsd":
        b, hq, sq, _ = q.shape
        hk, sk = k.shape[1], k.shape[2]
        return b, hq, sq, hk, sk, b * hq * sq, b * hk * sk, d, d
    b, sq, hq, _ = q.shape
    sk, hk = k.shape[1], k.shape[2]
    return b, hq, sq, hk, sk, b * sq, b * sk, hq * d, hk * d


def views3(q, k, layout: str) -> tuple:
    """The 3-D views the forward's descriptors address: bhsd q [B*H, Sq, D], k [B*HK, Sk, D];
    bshd q [B, Sq, H*D], k [B, Sk, HK*D] (a block [1, rows, D] never crosses into another head or
    batch: rows past the sequence read zeros and are not stored)."""
    d = q.shape[-1]
    if layout == "bhsd":
        b, hq, sq, _ = q.shape
        hk, sk = k.shape[1], k.shape[2]
        return (b * hq, sq, d), (b * hk, sk, d)
    b, sq, hq, _ = q.shape
    sk, hk = k.shape[1], k.shape[2]
    return (b, sq, hq * d), (b, sk, hk * d)


def grid_for(tiles: int, persistent: bool, device) -> tuple:
    """One program per tile, or (``persistent``) one per SM at most (a meta device, ck build tracing
    the launch, has no SMs: the grid is not compiled into the kernel)."""
    return (min(tiles, _num_sms(device.index or 0)) if persistent and device.type != "meta" else tiles, )


@functools.lru_cache(maxsize=None)
def _num_sms(index: int) -> int:
    """SMs of GPU ``index``: its ArchSpec's (the arch plugin's facts, not a device query)."""
    import torch
    from ck_core.device import current_arch

    return current_arch(torch.device("cuda", index)).compute_units


@functools.lru_cache(maxsize=None)
def _on_hopper(index: int) -> bool:
    """Whether GPU ``index`` is the Hopper arch of an installed arch plugin (its ArchSpec's target)."""
    import torch

    from ck_core.device import current_arch
    from ck_core.errors import UnsupportedProblem

    try:
        return hopper(current_arch(torch.device("cuda", index)))
    except UnsupportedProblem:   # no arch plugin targets this GPU
        return False


#: recorded launches (ck_core.backends.triton_replay) per problem geometry; a hit skips the
#: descriptor set-up and Triton's argument binding (tens of microseconds of Python per call)
_LAUNCHES: "OrderedDict" = None
LAUNCH_CACHE_SIZE = 64


class _Launch:
    __slots__ = ("replay", "slots", "dummy_lse")


def fwd(q, k, v, *, causal=False, scale=None, return_lse=False, layout="bhsd", tile=None, out=None,
        pingpong=False, persistent=False, _checked=False, _via=None):
    """Gluon forward (``tile`` = (128, BLOCK_N, 12, STAGES)); raises ``UnsupportedProblem`` naming
    what it lacks (see :func:`unsupported_reason`; ``_checked``: the caller already asked it).

    The first call per geometry (shapes, strides, dtype, device, flags, scale) launches through
    ``kernel[grid]`` and records the launch; later ones replay the compiled launcher with the new
    tensors (CUtensorMaps cached per base address), falling back to ``kernel[grid]`` where no
    replay can be recorded.  ``_via``: a Dispatcher launcher's kernel-cache launch
    (``ck_fmha.backends.triton.implement.kernel_via``) in place of ``kernel[grid]``."""
    global _LAUNCHES
    import torch

    from ck_core.errors import UnsupportedProblem
    if not _checked:
        why = unsupported_reason(q, k, v, causal=causal, layout=layout, tile=tile, out=out)
        if why:
            raise UnsupportedProblem(f"gluon sm90 forward: {why}")
    d = q.shape[-1]
    bm, bn, warps, stages = tile or DEFAULT_TILES[d]
    if bm != 128 or warps != WS_WARPS:
        raise UnsupportedProblem(f"gluon sm90 forward: tile {tile}: BLOCK_M must be 128 and warps {WS_WARPS}")
    b, hq, sq = geometry(q, k, layout)[:3]
    o = out if out is not None else torch.empty_like(q)
    lse = torch.empty((b, hq, sq), device=q.device, dtype=torch.float32) if return_lse else None
    key = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), o.stride(), q.dtype, q.device.index,
           layout, bool(causal), bool(return_lse), bm, bn, stages, bool(pingpong), bool(persistent), scale, _via)
    if _LAUNCHES is None:
        from collections import OrderedDict
        _LAUNCHES = OrderedDict()
    rec = _LAUNCHES.get(key)
    if rec is not None and _via is not None:
        from . import warm
        if warm.active():   # the public API records a warm closure: launch through _via so it sees this launch
            rec = None
    if rec is not None:
        args = rec.replay.args.copy()
        sq_, sk_, sv_, so_, sl_ = rec.slots
        args[sq_], args[sk_], args[sv_], args[so_] = q, k, v, o
        args[sl_] = lse if return_lse else rec.dummy_lse
        rec.replay(args)
        return (o, lse) if return_lse else o
    rec = _record(q, k, v, o, lse, causal, scale, layout, bm, bn, stages, pingpong, persistent, _via)
    if rec is not None:
        _LAUNCHES[key] = rec
        if len(_LAUNCHES) > LAUNCH_CACHE_SIZE:
            _LAUNCHES.popitem(last=False)
    return (o, lse) if return_lse else o


def _record(q, k, v, o, lse, causal, scale, layout, bm, bn, stages, pingpong, persistent, via=None):
    """Launch once through ``kernel[grid]`` (or ``via``); return the recorded launch, or None (no replay)."""
    import math

    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from ck_core.backends import triton_replay
    d = q.shape[-1]
    b, hq, sq, hk, sk = geometry(q, k, layout)[:5]
    shape_q, shape_k = views3(q, k, layout)
    gdt = _gl_dtype(q.dtype)
    q_l = gl.NVMMASharedLayout.get_default_for([1, bm // 2, d], gdt)
    kv_l = gl.NVMMASharedLayout.get_default_for([1, bn, d], gdt)
    qd = TensorDescriptor.from_tensor(q.view(shape_q), [1, bm // 2, d], q_l)
    kd = TensorDescriptor.from_tensor(k.view(shape_k), [1, bn, d], kv_l)
    vd = TensorDescriptor.from_tensor(v.view(shape_k), [1, bn, d], kv_l)
    od = TensorDescriptor.from_tensor(o.view(shape_q), [1, bm // 2, d], q_l)
    lse_arg = lse if lse is not None else _dummy_lse(q.device)
    sm_scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    grid = grid_for(-(-sq // bm) * b * hq, persistent, q.device)
    args = [qd, kd, vd, od, lse_arg, hq * sq if lse is not None else 0, sq if lse is not None else 0,
            hq, hk, hq // hk, sq, sk, b * hq, sm_scale * LOG2E]
    kwargs = dict(BSHD=layout == "bshd", CAUSAL=bool(causal), STORE_LSE=lse is not None,
                  BLOCK_N=bn, HEAD_D=d, STAGES=stages, PRODUCER_REGS=24, CONSUMER_REGS=240,
                  PINGPONG=bool(pingpong), PERSISTENT=bool(persistent), num_warps=4)
    replay = triton_replay.record(fmha_fwd_gluon_ws_sm90, grid, args, kwargs, via=via)
    if replay is None:
        log.debug("gluon fwd: no replay recorded; this geometry keeps launching through kernel[grid]")
        return None
    rec = _Launch()
    rec.replay = replay
    rec.slots = tuple(replay.slot(n) for n in ("q_desc", "k_desc", "v_desc", "o_desc", "LSE"))
    if set(rec.slots[:4]) != set(replay.desc_slots):
        log.debug("gluon fwd: descriptor slots %s differ from %s; no replay", rec.slots, replay.desc_slots)
        return None
    rec.dummy_lse = _dummy_lse(q.device)
    # no reference to this call's tensors (o, lse, q/k/v): each replay passes its own in these slots, and
    # a CUDA graph's pool must hold nothing of this call (torch.compile(mode="reduce-overhead"))
    for i in rec.slots:
        replay.args[i] = None
    return rec


_DUMMY: dict = {}


def _dummy_lse(device):
    """The LSE pointer of launches that store none: one fp32 element per device, kept for good (in no
    CUDA graph's pool: :func:`ck_core.memory.persistent`)."""
    t = _DUMMY.get(device)
    if t is None:
        import torch

        from ck_core.memory import persistent

        t = _DUMMY[device] = persistent(lambda: torch.empty(1, device=device, dtype=torch.float32), device)
    return t
