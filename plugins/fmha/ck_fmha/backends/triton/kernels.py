"""Triton FMHA kernels (forward, backward, split-KV / paged decode).

All kernels are plain ``@triton.jit`` functions whose meta-parameters are
``tl.constexpr`` arguments, so that the core can compile them ahead of time
through ``triton.compile(ASTSource(fn, signature, constexprs), target=...)``.

Conventions shared by every kernel
----------------------------------
* Tensors are addressed by (batch, head, seq) strides; the head dimension is
  contiguous (stride 1).  BHSD and BSHD only differ by strides; group (varlen)
  mode passes batch stride 0 and the per-sequence start from ``cu_seqlens``.
* Scores live in the log2 domain: ``scale2 = softmax_scale * log2(e)`` is folded
  into the QK product so the softmax uses ``exp2``.  Soft capping computes
  ``cap * tanh(s * scale / cap)``: ``cap_in = scale / cap``,
  ``cap_out = cap * log2(e)``.
* Masks (CK's generic window): key ``j`` is visible from query ``i`` when
  ``-left <= j - i - off <= right`` where a negative ``left`` / ``right`` means
  unbounded, and ``off = seqlen_k - seqlen_q`` for bottom-right alignment, 0 for
  top-left.  Causal is ``right = 0``.  ``MASK_MODE`` bit 0: right bound present,
  bit 1: left bound present.
* LSE is stored in natural-log units ([B, H, Sq] fp32, -inf for rows that see
  no key); split-KV partial LSEs are kept in log2 units.
* Optional features are constexpr-guarded (``BIAS_MODE``, ``HAS_DROPOUT``,
  ``STORE_DBIAS``, ``IS_VARLEN`` in the backward); their run-time arguments
  come after the original ones, so with the features off the kernels compile
  to the same code as without them (checked on sm90 PTX / gfx942 AMDGCN, only
  the kernel argument list and hidden-argument offsets differ).  Bias is added
  after the softmax scale (log2 units inside); dropout keeps the pre-dropout
  LSE and scales kept probabilities by 1 / (1 - p).
"""
from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


# ----------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------
#: the dropout seed and offset words and threshold are data, not shapes: Triton would make a value of 1
#: a compile-time constant (that ``.to(bitcast=True)`` cannot take) and compile again per value class
_PHILOX_ARGS = ("seed_lo", "seed_hi", "off_lo", "drop_thresh")


@triton.jit
def _tanh(x):
    # portable tanh (no libdevice, so that the same source compiles for HIP)
    e = tl.exp2(x * 2.8853900817779268)  # exp(2x)
    return 1.0 - 2.0 / (e + 1.0)


@triton.jit
def _visible(rows, cols, off, left, right, MASK_MODE: tl.constexpr):
    rel = cols[None, :] - rows[:, None] - off
    ok = rel < 2147483647
    if MASK_MODE & 1:
        ok = ok & (rel <= right)
    if MASK_MODE & 2:
        ok = ok & (rel >= -left)
    return ok


@triton.jit
def _visible_t(rows, cols, off, left, right, MASK_MODE: tl.constexpr):
    # transposed [cols, rows] version of _visible
    rel = cols[:, None] - rows[None, :] - off
    ok = rel < 2147483647
    if MASK_MODE & 1:
        ok = ok & (rel <= right)
    if MASK_MODE & 2:
        ok = ok & (rel >= -left)
    return ok


@triton.jit
def _philox_x0(c0, c1, c2, c3, k0, k1):
    """First output word of Philox-4x32-10 (Salmon et al.), uint32 arithmetic;
    the same stream as ``ck_fmha.philox.philox4x32_10``."""
    M0: tl.constexpr = 0xD2511F53
    M1: tl.constexpr = 0xCD9E8D57
    W0: tl.constexpr = 0x9E3779B9
    W1: tl.constexpr = 0xBB67AE85
    for _ in tl.static_range(10):
        hi0 = tl.umulhi(c0, M0)
        lo0 = c0 * M0
        hi1 = tl.umulhi(c2, M1)
        lo1 = c2 * M1
        c0 = hi1 ^ c1 ^ k0
        c1 = lo1
        c2 = hi0 ^ c3 ^ k1
        c3 = lo0
        k0 = k0 + W0
        k1 = k1 + W1
    return c0


@triton.jit
def _randval(ri, cj, bh, k0, k1, off_lo):
    """uint8-valued (int32) dropout random values of the elements (row ri, column cj)
    (broadcastable index tensors, local to the sequence) of attention matrix
    ``bh = b * nhead_q + h``: Philox counter (j, i, bh, offset_lo), key (k0, k1)
    (i32 bit patterns), top byte of the first output word."""
    c0 = (cj + ri * 0).to(tl.uint32)
    c1 = (ri + cj * 0).to(tl.uint32)
    z = c0 * 0
    c2 = z + bh.to(tl.uint32)
    c3 = z + off_lo.to(tl.uint32, bitcast=True)
    x0 = _philox_x0(c0, c1, c2, c3, k0.to(tl.uint32, bitcast=True), k1.to(tl.uint32, bitcast=True))
    return (x0 >> 24).to(tl.int32)


@triton.jit
def _dropout_keep(ri, cj, bh, k0, k1, off_lo, thresh):
    """Keep mask: randval <= thresh (CK's uint8 rule, thresh = floor((1 - p) * 255))."""
    return _randval(ri, cj, bh, k0, k1, off_lo) <= thresh


@triton.jit
def _bias_at(ri, cj, biasb, sbq, sbk, slope, aoff, seqlen_q, seqlen_k, BIAS_MODE: tl.constexpr):
    """Bias (log2 units) at rows ri / columns cj (broadcastable).  BIAS_MODE 1: elementwise
    tensor; 2: ALiBi vertical (causal) ``slope * j``; 3: ALiBi ``-slope * |i + aoff - j|``."""
    if BIAS_MODE == 1:
        bt = tl.load(biasb + ri * sbq + cj * sbk, mask=(ri < seqlen_q) & (cj < seqlen_k),
                     other=0.0).to(tl.float32)
    elif BIAS_MODE == 2:
        bt = slope * (cj + ri * 0).to(tl.float32)
    else:
        bt = -slope * tl.abs(ri + aoff - cj).to(tl.float32)
    return bt * 1.4426950408889634


@triton.jit
def _bias_setup(BIAS, ALIBI, b64, h64, q_start, sbb, sbh, sbq, sab, seqlen_q, seqlen_k,
                BIAS_MODE: tl.constexpr):
    """(bias base pointer of (b, h), ALiBi slope, ALiBi row offset) for BIAS_MODE (see fmha_fwd_kernel)."""
    biasb = BIAS
    slope = 0.0
    aoff = seqlen_q * 0
    if BIAS_MODE == 1:
        biasb = BIAS + b64 * sbb + h64 * sbh + q_start.to(tl.int64) * sbq
    if BIAS_MODE >= 2:
        slope = tl.load(ALIBI + b64 * sab + h64).to(tl.float32)
    if BIAS_MODE == 4:
        aoff = seqlen_k - seqlen_q
    return biasb, slope, aoff


@triton.jit
def _kv_range(m0, off, left, right, seqlen_k,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASK_MODE: tl.constexpr):
    """For the query tile [m0, m0+BLOCK_M): the key blocks to visit, split into
    [lo, full_lo) masked, [full_lo, full_hi) unmasked, [full_hi, hi) masked."""
    lo = m0 * 0
    hi = seqlen_k
    full_lo = lo
    full_hi = hi
    if MASK_MODE & 2:
        lo = tl.maximum(m0 + off - left, 0)
        lo = (lo // BLOCK_N) * BLOCK_N
        full_lo = m0 + BLOCK_M - 1 + off - left
        full_lo = tl.maximum(((full_lo + BLOCK_N - 1) // BLOCK_N) * BLOCK_N, 0)
    if MASK_MODE & 1:
        hi = tl.minimum(m0 + BLOCK_M + off + right, seqlen_k)
        hi = tl.maximum(hi, 0)
        full_hi = tl.maximum(((m0 + off + right + 1) // BLOCK_N) * BLOCK_N, 0)
    hi_c = ((hi + BLOCK_N - 1) // BLOCK_N) * BLOCK_N
    lo = tl.minimum(lo, hi_c)
    full_hi = tl.minimum(full_hi, (seqlen_k // BLOCK_N) * BLOCK_N)
    full_lo = tl.maximum(tl.minimum(full_lo, hi_c), lo)
    full_hi = tl.maximum(tl.minimum(full_hi, hi_c), full_lo)
    return lo, full_lo, full_hi, hi_c


@triton.jit
def _q_range(n0, off, left, right, seqlen_q,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASK_MODE: tl.constexpr):
    """For the key tile [n0, n0+BLOCK_N): the query blocks that see it, split
    into masked / unmasked / masked runs (rows past seqlen_q are harmless in
    the backward: their q, dO are zero and their LSE is +inf)."""
    lo = n0 * 0
    hi = seqlen_q
    full_lo = lo
    full_hi = ((seqlen_q + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
    if MASK_MODE & 1:
        lo = tl.maximum(n0 - off - right, 0)
        lo = (lo // BLOCK_M) * BLOCK_M
        full_lo = n0 + BLOCK_N - 1 - off - right
        full_lo = tl.maximum(((full_lo + BLOCK_M - 1) // BLOCK_M) * BLOCK_M, 0)
    if MASK_MODE & 2:
        hi = tl.minimum(n0 + BLOCK_N - off + left, seqlen_q)
        hi = tl.maximum(hi, 0)
        full_hi = tl.maximum(((n0 - off + left + 1) // BLOCK_M) * BLOCK_M, 0)
    hi_c = ((hi + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
    lo = tl.minimum(lo, hi_c)
    full_lo = tl.maximum(tl.minimum(full_lo, hi_c), lo)
    full_hi = tl.maximum(tl.minimum(full_hi, hi_c), full_lo)
    return lo, full_lo, full_hi, hi_c


@triton.jit
def _visible_sink(rows, cols, off, left, right, n_sink, MASK_MODE: tl.constexpr):
    """The window mask plus sink tokens: the first n_sink keys stay visible past the left edge
    (the right edge still applies), as ck_fmha.masks.visible."""
    rel = cols[None, :] - rows[:, None] - off
    ok = rel < 2147483647
    if MASK_MODE & 1:
        ok = ok & (rel <= right)
    win = ok
    if MASK_MODE & 2:
        win = win & (rel >= -left)
    return win | (ok & (cols[None, :] < n_sink))


@triton.jit
def _checked_len(raw, cap, ERR):
    """A run-time key length clamped into [0, cap] (so that no access leaves the cache or the block
    table) and whether it was out of range; a bad one ORs its code into ERR (ck_fmha.device_errors:
    1 past the capacity, 2 negative)."""
    bad = (raw < 0) | (raw > cap)
    if bad:
        tl.atomic_or(ERR, tl.where(raw < 0, 2, 1))
    return tl.maximum(tl.minimum(raw, cap), 0), bad


@triton.jit
def _spans_bad_of(c, prev, ln, first, m, rows, longest, HAS_LENS: tl.constexpr):
    """Per offset c (its predecessor prev; mask m; ``first``: prev is the array's start): the start below
    0, the span negative or longer than ``longest``, or c past ``rows`` (HAS_LENS: the logical length
    ln outside [0, span] or past ``longest`` instead of the span's bound)."""
    c = c.to(tl.int64)
    prev = prev.to(tl.int64)
    span = c - prev
    e = (span < 0) | (c > rows) | (first & (prev < 0))
    if HAS_LENS:
        ln = ln.to(tl.int64)
        e = e | (ln < 0) | (ln > span) | (ln > longest)
    else:
        e = e | (span > longest)
    return m & e


@triton.jit
def _offsets_fetch(n, CU_Q, CU_K, LENS, j0, CHECK_K: tl.constexpr, HAS_LENS: tl.constexpr, BLOCK: tl.constexpr):
    """Offsets j0 .. j0 + BLOCK of both arrays and their predecessors (and the logical lengths), loaded:
    (c_q, prev_q, c_k, prev_k, lens).  Nothing here waits on the loads, so a kernel can issue them,
    then its own first loads, and only then evaluate them (:func:`_offsets_eval`): the check's L2 round
    trip overlaps the program's."""
    j = j0 + tl.arange(0, BLOCK)
    m = j < n
    cq = tl.load(CU_Q + j, mask=m, other=0)
    pq = tl.load(CU_Q + j - 1, mask=m, other=0)
    ck = cq
    pk = pq
    ln = cq
    if CHECK_K:
        ck = tl.load(CU_K + j, mask=m, other=0)
        pk = tl.load(CU_K + j - 1, mask=m, other=0)
        if HAS_LENS:
            ln = tl.load(LENS + j - 1, mask=m, other=0)
    return cq, pq, ck, pk, ln


@triton.jit
def _offsets_eval(cq, pq, ck, pk, ln, n, CU_Q, rows_q, long_q, CU_K, rows_k, long_k, LENS, CHECK_K: tl.constexpr,
                  HAS_LENS: tl.constexpr, BLOCK: tl.constexpr):
    """Whether group-mode offsets (int32 [n]) break the launch's contract, from the first block that
    :func:`_offsets_fetch` loaded (offsets 1 .. BLOCK) and, for more than BLOCK sequences, the rest
    read here: CU_Q starting below 0, a span below 0 or longer than ``long_q`` (the grid's
    max_seqlen_q), an offset past the packed tensor's ``rows_q``; CHECK_K: CU_K likewise against
    ``rows_k`` and ``long_k`` (HAS_LENS: its logical lengths LENS [n - 1] (HAS_SEQLENS) outside
    [0, span] or past ``long_k``, which then bound them instead of the spans).  Every program reads all
    the offsets (from L2 after the first); one bad sequence makes the whole call's outputs NaN, as
    the contract of :mod:`ck_fmha.device_errors` says, with no launch of its own."""
    j = 1 + tl.arange(0, BLOCK)
    m = j < n
    e = _spans_bad_of(cq, pq, ln, j == 1, m, rows_q, long_q, False)
    if CHECK_K:
        e = e | _spans_bad_of(ck, pk, ln, j == 1, m, rows_k, long_k, HAS_LENS)
    bad = tl.max(e.to(tl.int32), axis=0) > 0
    for j0 in range(1 + BLOCK, n, BLOCK):   # (more than BLOCK sequences)
        xq, xpq, xk, xpk, xln = _offsets_fetch(n, CU_Q, CU_K, LENS, j0, CHECK_K, HAS_LENS, BLOCK)
        mx = (j0 + tl.arange(0, BLOCK)) < n
        ex = _spans_bad_of(xq, xpq, xln, mx & False, mx, rows_q, long_q, False)
        if CHECK_K:
            ex = ex | _spans_bad_of(xk, xpk, xln, mx & False, mx, rows_k, long_k, HAS_LENS)
        bad = bad | (tl.max(ex.to(tl.int32), axis=0) > 0)
    return bad


@triton.jit
def _group_offsets_bad(n, CU_Q, rows_q, long_q, CU_K, rows_k, long_k, LENS, CHECK_K: tl.constexpr,
                       HAS_LENS: tl.constexpr, BLOCK: tl.constexpr):
    """:func:`_offsets_eval` of offsets fetched here (a kernel with nothing to overlap the check with)."""
    cq, pq, ck, pk, ln = _offsets_fetch(n, CU_Q, CU_K, LENS, 1, CHECK_K, HAS_LENS, BLOCK)
    return _offsets_eval(cq, pq, ck, pk, ln, n, CU_Q, rows_q, long_q, CU_K, rows_k, long_k, LENS, CHECK_K, HAS_LENS,
                         BLOCK)


@triton.jit
def _fwd_bad_offsets(O, LSE, ERR, ROWS_Q, H, sos, soh, slh, D_V, BLOCK_DV: tl.constexpr,
                     STORE_LSE: tl.constexpr):
    """The forward's bad group-mode offsets: this program's share of NaN over all of O (and LSE), and
    BAD_OFFSETS (4) ORed into ERR."""
    idx = tl.program_id(0) + tl.num_programs(0) * tl.program_id(1)
    count = tl.num_programs(0) * tl.num_programs(1)
    _nan_lines(O, ROWS_Q, H, sos, soh, D_V, idx, count, 16, BLOCK_DV)
    if STORE_LSE:
        _nan_hr(LSE, H, ROWS_Q, slh, idx, count, 256)
    tl.atomic_or(ERR, 4)


@triton.jit
def _nan_lines(X, n_rows, n_heads, s_row, s_head, width, idx, count, BLOCK_R: tl.constexpr,
               BLOCK_C: tl.constexpr):
    """X[r * s_row + h * s_head + c] = NaN for r < n_rows, h < n_heads, c < width (c contiguous): share
    ``idx`` of ``count`` programs (a grid-stride loop over the (r, h) lines), for a group-mode output
    whose offsets are bad: the whole tensor, rows of no sequence too, whatever the offsets say."""
    lines = n_rows.to(tl.int64) * n_heads
    offs = tl.arange(0, BLOCK_R).to(tl.int64)
    cols = tl.arange(0, BLOCK_C)
    nan = tl.full([BLOCK_R, BLOCK_C], float("nan"), X.dtype.element_ty)
    step = count.to(tl.int64) * BLOCK_R
    for i0 in range(idx.to(tl.int64) * BLOCK_R, lines, step):
        i = i0 + offs
        base = X + (i // n_heads) * s_row + (i % n_heads) * s_head
        for c0 in range(0, width, BLOCK_C):
            c = c0 + cols
            tl.store(base[:, None] + c[None, :], nan, mask=(i < lines)[:, None] & (c < width)[None, :])


@triton.jit
def _nan_hr(X, n_heads, rows, s_head, idx, count, BLOCK: tl.constexpr):
    """X[h * s_head + r] = NaN for h < n_heads, r < rows (an LSE / delta [H, Tq]): share ``idx`` of
    ``count`` programs, as :func:`_nan_lines`."""
    n = n_heads.to(tl.int64) * rows
    offs = tl.arange(0, BLOCK).to(tl.int64)
    nan = tl.full([BLOCK], float("nan"), X.dtype.element_ty)
    for i0 in range(idx.to(tl.int64) * BLOCK, n, count.to(tl.int64) * BLOCK):
        i = i0 + offs
        tl.store(X + (i // rows) * s_head + i % rows, nan, mask=i < n)


@triton.jit
def _paged_kv_ptrs(kb, vb, pt, start_n, cols, seqlen_k, skp, svp, sks, svs, skd, offs_n, offs_dq, offs_dv,
                   page_size, page_shift, PAGED: tl.constexpr, BLOCK_N: tl.constexpr, KV_VEC: tl.constexpr):
    """K/V tile pointers of keys ``cols`` in a paged cache: ``pt`` is the batch's row of page ids,
    key t lives in page pt[t // page_size] at slot t % page_size (page_size = 1 << page_shift, run-time; PAGED 1:
    pages hold whole BLOCK_N tiles, 2: smaller pages); kb/vb already hold the head offset.
    KV_VEC == 0: linear pages (slot stride sks/svs, d contiguous).  KV_VEC > 0: CK's vectorized
    layout, K [pages, Hk, D/vec, P, vec] (skd: stride of a D/vec chunk) and V [pages, Hk, P/vec, Dv, vec]
    (svs: stride of a P/vec chunk)."""
    if PAGED == 1:
        page = tl.load(pt + (start_n >> page_shift)).to(tl.int64)
        slot = (start_n & (page_size - 1)) + offs_n
        kpg = kb + page * skp
        vpg = vb + page * svp
    else:
        page = tl.load(pt + (cols >> page_shift), mask=cols < seqlen_k, other=0).to(tl.int64)
        slot = cols & (page_size - 1)
        kpg = kb + page[:, None] * skp
        vpg = vb + page[:, None] * svp
    if KV_VEC > 0:
        kp = kpg + slot[:, None] * KV_VEC + ((offs_dq // KV_VEC) * skd + offs_dq % KV_VEC)[None, :]
        vp = vpg + ((slot // KV_VEC) * svs + slot % KV_VEC)[:, None] + (offs_dv * KV_VEC)[None, :]
    else:
        kp = kpg + slot[:, None] * sks + offs_dq[None, :]
        vp = vpg + slot[:, None] * svs + offs_dv[None, :]
    return kp, vp


# ----------------------------------------------------------------------------
# forward
# ----------------------------------------------------------------------------
@triton.jit
def _fp8_max(dtype):
    """Largest finite value of an fp8 e4m3 type: 240 for e4m3fnuz (fp8e4b8, CDNA3), 448 for OCP e4m3fn."""
    if dtype.is_fp8e4b8():
        return 240.0
    else:
        return 448.0


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, kb, vb, desc_k, desc_v, sks, svs, krow, kcol, vcol,
               start, end, rows, off, left, right, seqlen_k,
               scale2, cap_in, cap_out,
               biasb, sbq, sbk, slope, aoff, seqlen_q, bh_id, k0, k1, off_lo, thresh,
               pt, skp, svp, skd, n_sink,
               D_Q, D_V,
               BLOCK_DQ: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
               MASKED: tl.constexpr, MASK_MODE: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
               USE_TMA: tl.constexpr, WARP_SPEC: tl.constexpr,
               BIAS_MODE: tl.constexpr, HAS_DROPOUT: tl.constexpr,
               PAGED: tl.constexpr, KV_VEC: tl.constexpr, HAS_SINK: tl.constexpr,
               V_TRANS: tl.constexpr = False,
               acc2=0.0, q2=0.0, desc_k2=0, desc_v2=0,
               BLOCK_DQ2: tl.constexpr = 0, BLOCK_DV2: tl.constexpr = 0,
    ALIGN_DQ: tl.constexpr = -1, ALIGN_DV: tl.constexpr = -1, page_size=0, page_shift=0):
    """BLOCK_DQ2 / BLOCK_DV2 > 0: a head dim in two chunks, columns [0, BLOCK_D?) (whole: a power of two
    below D_?) and [BLOCK_D?, BLOCK_D? + BLOCK_D?2) (masked to D_?); q2 / acc2 / desc_?2 hold the second
    chunk: S = q k^T + q2 k2^T, acc += P v, acc2 += P v2 (pointer loads or device descriptors)."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_dq = tl.arange(0, BLOCK_DQ)
    offs_dv = tl.arange(0, BLOCK_DV)
    if BLOCK_DQ2 > 0:
        offs_dq2 = BLOCK_DQ + tl.arange(0, BLOCK_DQ2)
    if BLOCK_DV2 > 0:
        offs_dv2 = BLOCK_DV + tl.arange(0, BLOCK_DV2)
    dtype = q.dtype
    for start_n in tl.range(start, end, BLOCK_N, warp_specialize=WARP_SPEC):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        if USE_TMA != 0:
            k = desc_k.load([krow + start_n, kcol])
            if BLOCK_DQ2 > 0:
                k2 = desc_k2.load([krow + start_n, kcol])
        else:
            if PAGED > 0:
                kp, vp_pg = _paged_kv_ptrs(kb, vb, pt, start_n, cols, seqlen_k, skp, svp, sks, svs, skd,
                                           offs_n, offs_dq, offs_dv, page_size, page_shift, PAGED, BLOCK_N, KV_VEC)
            else:
                kp = kb + cols[:, None] * sks + offs_dq[None, :]
            if MASKED:
                k = tl.load(kp, mask=(cols[:, None] < seqlen_k) & (offs_dq[None, :] < D_Q), other=0.0)
            elif ALIGN_DQ != 0 and BLOCK_DQ2 == 0:
                k = tl.load(kp, mask=offs_dq[None, :] < D_Q, other=0.0)
            else:
                k = tl.load(kp)
            if BLOCK_DQ2 > 0:
                kp2 = kb + cols[:, None] * sks + offs_dq2[None, :]
                if MASKED:
                    k2 = tl.load(kp2, mask=(cols[:, None] < seqlen_k) & (offs_dq2[None, :] < D_Q), other=0.0)
                else:
                    k2 = tl.load(kp2, mask=offs_dq2[None, :] < D_Q, other=0.0)
        qk = tl.dot(q, tl.trans(k))
        if BLOCK_DQ2 > 0:
            qk = tl.dot(q2, tl.trans(k2), qk)
        if MASKED or BIAS_MODE != 0:
            if HAS_SOFTCAP:
                qk = _tanh(qk * cap_in) * cap_out
            else:
                qk = qk * scale2
            if BIAS_MODE != 0:
                qk = qk + _bias_at(rows[:, None], cols[None, :], biasb, sbq, sbk, slope, aoff,
                                   seqlen_q, seqlen_k, BIAS_MODE)
            if MASKED:
                ok = cols[None, :] < seqlen_k
                if HAS_SINK:
                    ok = ok & _visible_sink(rows, cols, off, left, right, n_sink, MASK_MODE)
                elif MASK_MODE != 0:
                    ok = ok & _visible(rows, cols, off, left, right, MASK_MODE)
                qk = tl.where(ok, qk, float("-inf"))
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            m_sub = tl.where(m_ij == float("-inf"), 0.0, m_ij)
            p = tl.math.exp2(qk - m_sub[:, None])
            alpha = tl.math.exp2(m_i - m_sub)
        else:
            if HAS_SOFTCAP:
                qk = _tanh(qk * cap_in) * cap_out
                m_ij = tl.maximum(m_i, tl.max(qk, 1))
                p = tl.math.exp2(qk - m_ij[:, None])
            else:
                m_ij = tl.maximum(m_i, tl.max(qk, 1) * scale2)
                p = tl.math.exp2(qk * scale2 - m_ij[:, None])
            alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if BLOCK_DV2 > 0:
            acc2 = acc2 * alpha[:, None]
        if HAS_DROPOUT:
            p = tl.where(_dropout_keep(rows[:, None], cols[None, :], bh_id, k0, k1, off_lo, thresh), p, 0.0)
        if V_TRANS:
            # key-contiguous V: the [BLOCK_DV, BLOCK_N] tile is read along the keys, so its transpose
            # (the [BLOCK_N, BLOCK_DV] B operand of P @ V) is K-major in shared memory, as Hopper's
            # fp8 wgmma needs (no transposing copy of V per block)
            if USE_TMA == 2:
                vt = desc_v.load([vcol, start_n])
            elif USE_TMA == 1:
                vt = desc_v.load([0, vcol + start_n])
            else:
                vtp = vb + cols[None, :] + offs_dv[:, None] * svs
                if MASKED:
                    vt = tl.load(vtp, mask=(cols[None, :] < seqlen_k) & (offs_dv[:, None] < D_V), other=0.0)
                elif ALIGN_DV != 0:
                    vt = tl.load(vtp, mask=offs_dv[:, None] < D_V, other=0.0)
                else:
                    vt = tl.load(vtp)
            v = tl.trans(vt)
        elif USE_TMA != 0:
            v = desc_v.load([krow + start_n, vcol])
            if BLOCK_DV2 > 0:
                v2 = desc_v2.load([krow + start_n, vcol])
        else:
            if PAGED > 0:
                vp = vp_pg
            else:
                vp = vb + cols[:, None] * svs + offs_dv[None, :]
            if MASKED:
                v = tl.load(vp, mask=(cols[:, None] < seqlen_k) & (offs_dv[None, :] < D_V), other=0.0)
            elif ALIGN_DV != 0 and BLOCK_DV2 == 0:
                v = tl.load(vp, mask=offs_dv[None, :] < D_V, other=0.0)
            else:
                v = tl.load(vp)
            if BLOCK_DV2 > 0:
                vp2 = vb + cols[:, None] * svs + offs_dv2[None, :]
                if MASKED:
                    v2 = tl.load(vp2, mask=(cols[:, None] < seqlen_k) & (offs_dv2[None, :] < D_V), other=0.0)
                else:
                    v2 = tl.load(vp2, mask=offs_dv2[None, :] < D_V, other=0.0)
        if dtype.is_fp8():
            # fp8: P in [0, 1] is scaled onto the fp8 range before the cast (see fmha_fwd_kernel)
            acc = tl.dot((p * _fp8_max(dtype)).to(dtype), v, acc)
        else:
            acc = tl.dot(p.to(dtype), v, acc)
            if BLOCK_DV2 > 0:
                acc2 = tl.dot(p.to(dtype), v2, acc2)
        m_i = m_ij
    return acc, l_i, m_i, acc2


@triton.jit(do_not_specialize=_PHILOX_ARGS)
def fmha_fwd_kernel(
    Q, K, V, O, LSE, CU_Q, CU_K,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos, slb, slh,
    H, GROUP, SEQ_Q, SEQ_K,
    scale2, cap_in, cap_out, left, right,
    BIAS, ALIBI, sbb, sbh, sbq, sbk, sab, seed_lo, seed_hi, off_lo, drop_thresh, drop_scale,
    PT, KV_INDPTR, SEQLENS_K, sbt, skp, svp, skd, SINK, n_sink,
    QDS, KDS, VDS, v_descale, ERR, ROWS_Q, ROWS_K, LONG_K, page_size, page_shift,
    d_q, d_v, ALIGN_DQ: tl.constexpr, ALIGN_DV: tl.constexpr, BLOCK_DQ: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASK_MODE: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    STORE_LSE: tl.constexpr, IS_VARLEN: tl.constexpr, REVERSE_M: tl.constexpr,
    USE_TMA: tl.constexpr, WARP_SPEC: tl.constexpr,
    BIAS_MODE: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    PAGED: tl.constexpr = 0, KV_LOOKUP: tl.constexpr = 0, KV_VEC: tl.constexpr = 0,
    HAS_SINK: tl.constexpr = False, HAS_SINK_LOGIT: tl.constexpr = False,
    DESCALE_PTR: tl.constexpr = False, V_TRANS: tl.constexpr = False, HAS_SEQLENS: tl.constexpr = False,
    BLOCK_DQ2: tl.constexpr = 0, BLOCK_DV2: tl.constexpr = 0,
):
    """BIAS_MODE: 0 none, 1 elementwise BIAS [B|1, H|1, Sq, Sk] (strides sb?, 0 where broadcast;
    group mode: [H|1, Tq, max Sk], sbb = 0), 2 ALiBi vertical (causal), 3 ALiBi top-left,
    4 ALiBi bottom-right (ALIBI: fp32 slopes, batch stride sab, 0 for [H]).  HAS_DROPOUT:
    Philox keep mask (key (seed_lo, seed_hi), counter (j, i, b*H + h, off_lo)), kept
    probabilities scaled by drop_scale; LSE is the pre-dropout one.

    PAGED > 0 (batch_prefill; 1: pages of whole BLOCK_N tiles, 2: smaller; the page size is the run-time
    page_size = 1 << page_shift): K/V are page pools (heads at skh/svh, pages at skp/svp, slots at
    sks/svs; KV_VEC > 0: CK's vectorized pages, see _paged_kv_ptrs), the key length of batch b is
    SEQLENS_K[b] and its page ids are PT[b * sbt + i] (KV_LOOKUP 0, vLLM block table) or
    PT[KV_INDPTR[b] + i] (KV_LOOKUP 1, SGLang kv_indptr / kv_page_indices).  A length outside
    [0, SEQ_K] (SEQ_K: the capacity, max_seqlen_k bounded by the block table; SGLang: also the
    batch's pages) is clamped, sets ERR and makes the batch's O and LSE rows NaN (_checked_len).  HAS_SINK: the first
    n_sink keys stay visible past the window's left edge.  HAS_SINK_LOGIT: SINK [H] (fp32, natural-log
    units) joins the softmax denominator as a key with a zero value.

    fp8 (Q/K/V of an fp8 e4m3 type: fp8e4nv, or fp8e4b8 on CDNA3; decided by the element type, no
    constexpr): per-tensor descales as CK / FlashAttention-3.  The caller folds q_descale * k_descale
    into scale2 / cap_in and passes v_descale; with DESCALE_PTR they are instead read from the fp32
    1-element tensors QDS, KDS, VDS (device scales, no host sync) and multiply the host values.
    S = (Q K^T) * q_descale * k_descale * softmax_scale in fp32; P = exp(S - m) in [0, 1] is cast to
    fp8 as P * FP8_MAX (448 e4m3fn, 240 e4m3fnuz: the row maximum lands on the largest finite fp8
    value, small probabilities stay normal); the softmax sum l uses the unquantised fp32 P; and
    O = (sum_j fp8(P * FP8_MAX) V) / l * v_descale / FP8_MAX, written in O's type (bf16/fp16).
    No bias or dropout with fp8 (the launchers reject them).

    V_TRANS (fp8 on NVIDIA: Hopper's fp8 wgmma reads both operands K-major, and the reduction dim of
    P @ V is the key index): V is key-contiguous.  Key j, channel d of (b, kv head hk) lives at
    ``V + b*svb + hk*svh + k_start + j + d*svs`` (svs is then the channel stride); the kernel loads
    [BLOCK_DV, BLOCK_N] tiles and multiplies their transpose.  tma: a device descriptor over
    [D_V, k_start + seqlen_k] at ``V + b*svb + hk*svh`` (16-byte aligned even when k_start is not;
    keys past the sequence are TMA zero fill); tma_host: V is a descriptor over the [B*Hk*D_V, keys]
    view with block [BLOCK_DV, BLOCK_N] and (svb, svh) its rows per batch / kv head.  Not with pages.

    HAS_SEQLENS (group mode, contiguous K/V): batch b reads SEQLENS_K[b] keys from CU_K[b] on (a
    logical key length within the seqstart_k span; masks align to it).

    IS_VARLEN: every program checks all the offsets (_offsets_fetch / _offsets_eval: CU_Q against ROWS_Q
    packed rows and SEQ_Q = max_seqlen_q; CU_K against ROWS_K and LONG_K = max_seqlen_k, with
    HAS_SEQLENS its lengths; paged: CU_Q only), their loads issued with its own first ones (its batch's
    offsets clamped into the tensors, then its q tile).  Bad ones (any batch's) make the program read
    nothing more, write NaN over its share of the whole O (and LSE) and OR BAD_OFFSETS (4) into ERR: the
    call's outputs are NaN and flagged in this one launch, no guard or poisoning launch of its own.

    BLOCK_DQ2 / BLOCK_DV2 > 0 (a key's ``dchunk``): the head dim in two power-of-two chunks, BLOCK_D? (whole)
    + BLOCK_D?2 (masked to D_?), e.g. 160 = 128 + 32, instead of one tile padded to the next power of two
    (see _fwd_inner); pointer loads or device descriptors (USE_TMA 0 / 1), no pages, no V_TRANS."""
    if ALIGN_DQ == 0:   # the head dim fills its blocks: a compile-time constant
        D_Q: tl.constexpr = BLOCK_DQ + BLOCK_DQ2
    else:   # a run-time head dim (one kernel per padded class), a multiple of ALIGN_DQ
        D_Q = d_q // ALIGN_DQ * ALIGN_DQ
    if ALIGN_DV == 0:   # the head dim fills its blocks: a compile-time constant
        D_V: tl.constexpr = BLOCK_DV + BLOCK_DV2
    else:   # a run-time head dim (one kernel per padded class), a multiple of ALIGN_DV
        D_V = d_v // ALIGN_DV * ALIGN_DV
    if V_TRANS:
        tl.static_assert(PAGED == 0, "V_TRANS (key-contiguous V) is not implemented for paged K/V")
    if BLOCK_DQ2 > 0 or BLOCK_DV2 > 0:
        tl.static_assert(PAGED == 0 and not V_TRANS and USE_TMA != 2,
                         "head-dim chunks: contiguous K/V, row-major V, pointer loads or device descriptors")
    pid_m = tl.program_id(0)
    if REVERSE_M:
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    if IS_VARLEN:
        # the offsets' check: its loads now, evaluated after this program's first loads (which read
        # within the tensors whatever the offsets: this batch's offsets clamped into them)
        n_cu = tl.num_programs(1) // H + 1
        ocq, opq, ock, opk, oln = _offsets_fetch(n_cu, CU_Q, CU_K, SEQLENS_K, 1, PAGED == 0, HAS_SEQLENS, 256)
        q_start = tl.minimum(tl.maximum(tl.load(CU_Q + b), 0), ROWS_Q)
        seqlen_q = tl.minimum(tl.maximum(tl.load(CU_Q + b + 1) - q_start, 0), tl.minimum(SEQ_Q, ROWS_Q - q_start))
        if PAGED > 0:
            k_start = 0
            cap_b = SEQ_K
            if KV_LOOKUP == 1:
                cap_b = tl.minimum(cap_b, (tl.load(KV_INDPTR + b + 1) - tl.load(KV_INDPTR + b)) * page_size)
            seqlen_k, len_bad = _checked_len(tl.load(SEQLENS_K + b), cap_b, ERR)
        else:
            k_start = tl.minimum(tl.maximum(tl.load(CU_K + b), 0), ROWS_K)
            if HAS_SEQLENS:   # logical key length, shorter than the seqstart_k span (CK's seqlen_k_ptr)
                seqlen_k = tl.load(SEQLENS_K + b)
            else:
                seqlen_k = tl.load(CU_K + b + 1) - k_start
            seqlen_k = tl.minimum(tl.maximum(seqlen_k, 0), tl.minimum(LONG_K, ROWS_K - k_start))
    else:
        q_start = 0
        seqlen_q = SEQ_Q
        k_start = 0
        tl.static_assert(PAGED == 0, "paged K/V is group mode (batch_prefill)")
        seqlen_k = SEQ_K
    m0 = pid_m * BLOCK_M
    if m0 >= seqlen_q:
        if IS_VARLEN:   # (no work here: bad offsets still need this program's share of NaN)
            if _offsets_eval(ocq, opq, ock, opk, oln, n_cu, CU_Q, ROWS_Q, SEQ_Q, CU_K, ROWS_K, LONG_K, SEQLENS_K,
                             PAGED == 0, HAS_SEQLENS, 256):
                _fwd_bad_offsets(O, LSE, ERR, ROWS_Q, H, sos, soh, slh, D_V, BLOCK_DV, STORE_LSE)
        return
    if BOTTOM_RIGHT:
        off = seqlen_k - seqlen_q
    else:
        off = 0
    b64 = b.to(tl.int64)
    ob = O + b64 * sob + h.to(tl.int64) * soh + q_start.to(tl.int64) * sos
    rows = m0 + tl.arange(0, BLOCK_M)
    offs_dq = tl.arange(0, BLOCK_DQ)
    offs_dv = tl.arange(0, BLOCK_DV)
    krow = 0
    kcol = 0
    vcol = 0
    if USE_TMA == 2:
        # host-side descriptors over the flattened 2-D view; (s?b, s?h, s?s) are
        # then (rows per batch, rows per head, columns per head) of that view
        kb = 0
        vb = 0
        desc_k = K
        desc_v = V
        q = Q.load([b * sqb + h * sqh + m0, h * sqs])
        krow = b * skb + hk * skh
        kcol = hk * sks
        if V_TRANS:   # first row of (b, hk) in the [B*Hk*D_V, keys] view
            vcol = b * svb + hk * svh
        else:
            vcol = hk * svs
    elif USE_TMA == 1:
        qb = Q + b64 * sqb + h.to(tl.int64) * sqh + q_start.to(tl.int64) * sqs
        kb = K + b64 * skb + hk.to(tl.int64) * skh + k_start.to(tl.int64) * sks
        if V_TRANS:
            vb = V + b64 * svb + hk.to(tl.int64) * svh
        else:
            vb = V + b64 * svb + hk.to(tl.int64) * svh + k_start.to(tl.int64) * svs
        desc_q = tl.make_tensor_descriptor(qb, shape=[seqlen_q, D_Q], strides=[sqs, 1],
                                           block_shape=[BLOCK_M, BLOCK_DQ])
        desc_k = tl.make_tensor_descriptor(kb, shape=[seqlen_k, D_Q], strides=[sks, 1],
                                           block_shape=[BLOCK_N, BLOCK_DQ])
        if BLOCK_DQ2 > 0:   # the second chunk: columns from BLOCK_DQ on (TMA zero-fills past D_Q)
            desc_q2 = tl.make_tensor_descriptor(qb + BLOCK_DQ, shape=[seqlen_q, D_Q - BLOCK_DQ], strides=[sqs, 1],
                                                block_shape=[BLOCK_M, BLOCK_DQ2])
            desc_k2 = tl.make_tensor_descriptor(kb + BLOCK_DQ, shape=[seqlen_k, D_Q - BLOCK_DQ], strides=[sks, 1],
                                                block_shape=[BLOCK_N, BLOCK_DQ2])
            q2 = desc_q2.load([m0, 0])
        if BLOCK_DV2 > 0:
            desc_v2 = tl.make_tensor_descriptor(vb + BLOCK_DV, shape=[seqlen_k, D_V - BLOCK_DV], strides=[svs, 1],
                                                block_shape=[BLOCK_N, BLOCK_DV2])
        if V_TRANS:
            desc_v = tl.make_tensor_descriptor(vb, shape=[D_V, k_start + seqlen_k], strides=[svs, 1],
                                               block_shape=[BLOCK_DV, BLOCK_N])
            vcol = k_start
        else:
            desc_v = tl.make_tensor_descriptor(vb, shape=[seqlen_k, D_V], strides=[svs, 1],
                                               block_shape=[BLOCK_N, BLOCK_DV])
        q = desc_q.load([m0, 0])
    else:
        qb = Q + b64 * sqb + h.to(tl.int64) * sqh + q_start.to(tl.int64) * sqs
        kb = K + b64 * skb + hk.to(tl.int64) * skh + k_start.to(tl.int64) * sks
        if V_TRANS:
            vb = V + b64 * svb + hk.to(tl.int64) * svh + k_start.to(tl.int64)
        else:
            vb = V + b64 * svb + hk.to(tl.int64) * svh + k_start.to(tl.int64) * svs
        desc_k = 0
        desc_v = 0
        q = tl.load(qb + rows[:, None] * sqs + offs_dq[None, :],
                    mask=(rows[:, None] < seqlen_q) & (offs_dq[None, :] < D_Q), other=0.0)
        if BLOCK_DQ2 > 0:
            desc_k2 = 0
            offs_dq2 = BLOCK_DQ + tl.arange(0, BLOCK_DQ2)
            q2 = tl.load(qb + rows[:, None] * sqs + offs_dq2[None, :],
                         mask=(rows[:, None] < seqlen_q) & (offs_dq2[None, :] < D_Q), other=0.0)
    if IS_VARLEN:   # the offsets' check, its loads issued before the q tile's
        if _offsets_eval(ocq, opq, ock, opk, oln, n_cu, CU_Q, ROWS_Q, SEQ_Q, CU_K, ROWS_K, LONG_K, SEQLENS_K,
                         PAGED == 0, HAS_SEQLENS, 256):
            _fwd_bad_offsets(O, LSE, ERR, ROWS_Q, H, sos, soh, slh, D_V, BLOCK_DV, STORE_LSE)
            return
    if HAS_SINK_LOGIT:   # the sink is a key of logit SINK[h] (log2 units inside) and value 0
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + tl.load(SINK + h).to(tl.float32) * 1.4426950408889634
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    else:
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    if BLOCK_DQ2 == 0:
        q2 = 0.0
        desc_k2 = 0
    if BLOCK_DV2 > 0:
        acc2 = tl.zeros([BLOCK_M, BLOCK_DV2], dtype=tl.float32)
        if USE_TMA == 0:
            desc_v2 = 0
    else:
        acc2 = 0.0
        desc_v2 = 0
    biasb, slope, aoff = _bias_setup(BIAS, ALIBI, b64, h.to(tl.int64), q_start, sbb, sbh, sbq, sab,
                                     seqlen_q, seqlen_k, BIAS_MODE)
    bh_id = b * H + h
    o_scale = v_descale
    if DESCALE_PTR:
        qk_descale = tl.load(QDS).to(tl.float32) * tl.load(KDS).to(tl.float32)
        scale2 = scale2 * qk_descale
        cap_in = cap_in * qk_descale
        o_scale = o_scale * tl.load(VDS).to(tl.float32)
    if PAGED > 0:
        if KV_LOOKUP == 1:
            pt = PT + tl.load(KV_INDPTR + b)
        else:
            pt = PT + b64 * sbt
    else:
        pt = PT
    lo, full_lo, full_hi, hi = _kv_range(m0, off, left, right, seqlen_k, BLOCK_M, BLOCK_N, MASK_MODE)
    if HAS_SINK:   # sink-token blocks left of the window: [0, min(lo, sink blocks))
        sink_hi = tl.minimum(((n_sink + BLOCK_N - 1) // BLOCK_N) * BLOCK_N, lo)
        acc, l_i, m_i, acc2 = _fwd_inner(acc, l_i, m_i, q, kb, vb, desc_k, desc_v, sks, svs, krow, kcol, vcol,
                                   0, sink_hi, rows, off, left, right, seqlen_k,
                                   scale2, cap_in, cap_out, biasb, sbq, sbk, slope, aoff, seqlen_q, bh_id,
                                   seed_lo, seed_hi, off_lo, drop_thresh, pt, skp, svp, skd, n_sink,
                                   D_Q, D_V, BLOCK_DQ, BLOCK_DV, BLOCK_N,
                                   True, MASK_MODE, HAS_SOFTCAP, USE_TMA, False, BIAS_MODE, HAS_DROPOUT,
                                   PAGED, KV_VEC, HAS_SINK, V_TRANS,
                                   acc2, q2, desc_k2, desc_v2, BLOCK_DQ2, BLOCK_DV2, ALIGN_DQ=ALIGN_DQ, ALIGN_DV=ALIGN_DV,
                                   page_size=page_size, page_shift=page_shift)
    if MASK_MODE & 2:
        acc, l_i, m_i, acc2 = _fwd_inner(acc, l_i, m_i, q, kb, vb, desc_k, desc_v, sks, svs, krow, kcol, vcol,
                                   lo, full_lo, rows, off, left, right, seqlen_k,
                                   scale2, cap_in, cap_out, biasb, sbq, sbk, slope, aoff, seqlen_q, bh_id,
                                   seed_lo, seed_hi, off_lo, drop_thresh, pt, skp, svp, skd, n_sink,
                                   D_Q, D_V, BLOCK_DQ, BLOCK_DV, BLOCK_N,
                                   True, MASK_MODE, HAS_SOFTCAP, USE_TMA, False, BIAS_MODE, HAS_DROPOUT,
                                   PAGED, KV_VEC, HAS_SINK, V_TRANS,
                                   acc2, q2, desc_k2, desc_v2, BLOCK_DQ2, BLOCK_DV2, ALIGN_DQ=ALIGN_DQ, ALIGN_DV=ALIGN_DV,
                                   page_size=page_size, page_shift=page_shift)
    acc, l_i, m_i, acc2 = _fwd_inner(acc, l_i, m_i, q, kb, vb, desc_k, desc_v, sks, svs, krow, kcol, vcol,
                               full_lo, full_hi, rows, off, left, right, seqlen_k,
                               scale2, cap_in, cap_out, biasb, sbq, sbk, slope, aoff, seqlen_q, bh_id,
                               seed_lo, seed_hi, off_lo, drop_thresh, pt, skp, svp, skd, n_sink,
                               D_Q, D_V, BLOCK_DQ, BLOCK_DV, BLOCK_N,
                               False, MASK_MODE, HAS_SOFTCAP, USE_TMA, WARP_SPEC, BIAS_MODE, HAS_DROPOUT,
                               PAGED, KV_VEC, HAS_SINK, V_TRANS,
                                   acc2, q2, desc_k2, desc_v2, BLOCK_DQ2, BLOCK_DV2, ALIGN_DQ=ALIGN_DQ, ALIGN_DV=ALIGN_DV,
                                   page_size=page_size, page_shift=page_shift)
    acc, l_i, m_i, acc2 = _fwd_inner(acc, l_i, m_i, q, kb, vb, desc_k, desc_v, sks, svs, krow, kcol, vcol,
                               full_hi, hi, rows, off, left, right, seqlen_k,
                               scale2, cap_in, cap_out, biasb, sbq, sbk, slope, aoff, seqlen_q, bh_id,
                               seed_lo, seed_hi, off_lo, drop_thresh, pt, skp, svp, skd, n_sink,
                               D_Q, D_V, BLOCK_DQ, BLOCK_DV, BLOCK_N,
                               True, MASK_MODE, HAS_SOFTCAP, USE_TMA, False, BIAS_MODE, HAS_DROPOUT,
                               PAGED, KV_VEC, HAS_SINK, V_TRANS,
                                   acc2, q2, desc_k2, desc_v2, BLOCK_DQ2, BLOCK_DV2, ALIGN_DQ=ALIGN_DQ, ALIGN_DV=ALIGN_DV,
                                   page_size=page_size, page_shift=page_shift)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    acc = acc / l_safe[:, None]
    if HAS_DROPOUT:
        acc = acc * drop_scale
    if BLOCK_DV2 > 0:
        acc2 = acc2 / l_safe[:, None]
        if HAS_DROPOUT:
            acc2 = acc2 * drop_scale
        offs_dv2 = BLOCK_DV + tl.arange(0, BLOCK_DV2)
        tl.store(ob + rows[:, None] * sos + offs_dv2[None, :], acc2.to(O.dtype.element_ty),
                 mask=(rows[:, None] < seqlen_q) & (offs_dv2[None, :] < D_V))
    if q.dtype.is_fp8():
        acc = acc * (o_scale / _fp8_max(q.dtype))
    if PAGED > 0:
        if len_bad:   # a wrong length must not pass for a result
            acc = acc + float("nan")
            m_i = m_i + float("nan")
    out = acc.to(O.dtype.element_ty)
    tl.store(ob + rows[:, None] * sos + offs_dv[None, :], out,
             mask=(rows[:, None] < seqlen_q) & (offs_dv[None, :] < D_V))
    if STORE_LSE:
        lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
        tl.store(LSE + b64 * slb + h.to(tl.int64) * slh + q_start + rows, lse, mask=rows < seqlen_q)


@triton.jit
def fmha_v_transpose_kernel(V, VT, svb, svh, svs, stb, sth, std, SEQ, H,
                            d_v, ALIGN_DV: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Key-contiguous copy of V for the fp8 forward (V_TRANS): program (s block, b*H + h) moves the
    [BLOCK_S, D_V] tile of V (channel-contiguous; key s at s*svs) to VT + b*stb + h*sth + d*std + s.
    Memory bound: one read and one write of V; the tile transpose goes through registers / shared
    memory inside the program, so both global accesses are coalesced."""
    if ALIGN_DV == 0:   # the head dim fills its blocks: a compile-time constant
        D_V: tl.constexpr = BLOCK_DV
    else:   # a run-time head dim (one kernel per padded class), a multiple of ALIGN_DV
        D_V = d_v // ALIGN_DV * ALIGN_DV
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    s = pid * BLOCK_S + tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_DV)
    m = (s[:, None] < SEQ) & (d[None, :] < D_V)
    x = tl.load(V + b * svb + h * svh + s[:, None].to(tl.int64) * svs + d[None, :], mask=m)
    xt = tl.trans(x)
    tl.store(VT + b * stb + h * sth + d[:, None].to(tl.int64) * std + s[None, :], xt,
             mask=(d[:, None] < D_V) & (s[None, :] < SEQ))


@triton.jit(do_not_specialize=_PHILOX_ARGS)
def fmha_dropout_randval_kernel(RV, CU_Q, CU_K, srb, srh, srq, H, SEQ_Q, SEQ_K, seed_lo, seed_hi, off_lo,
                                SEQLENS_K, ROWS_Q,
                                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_VARLEN: tl.constexpr,
                                HAS_SEQLENS: tl.constexpr = False):
    """The forward's dropout random values (store_randval) as uint8: RV [B, H, Sq, Sk]
    ([H, Tq, max Sk] in group mode, srb = 0); a separate pass so that the attention
    kernels stay free of the extra stores.  Group mode stores only inside RV whatever the offsets
    (rows below ROWS_Q, at most SEQ_Q per sequence, columns below SEQ_K): bad ones are the
    forward's to flag (its outputs NaN)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    bh = tl.program_id(2)
    b = bh // H
    h = bh % H
    if IS_VARLEN:
        q_start = tl.load(CU_Q + b)
        seqlen_q = tl.load(CU_Q + b + 1) - q_start
        if HAS_SEQLENS:
            seqlen_k = tl.load(SEQLENS_K + b)
        else:
            seqlen_k = tl.load(CU_K + b + 1) - tl.load(CU_K + b)
        q_start = tl.minimum(tl.maximum(q_start, 0), ROWS_Q)
        seqlen_q = tl.minimum(seqlen_q, tl.minimum(SEQ_Q, ROWS_Q - q_start))
        seqlen_k = tl.minimum(seqlen_k, SEQ_K)
    else:
        q_start = 0
        seqlen_q = SEQ_Q
        seqlen_k = SEQ_K
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rv = _randval(rows[:, None], cols[None, :], bh, seed_lo, seed_hi, off_lo)
    ptr = RV + b.to(tl.int64) * srb + h.to(tl.int64) * srh + (q_start + rows[:, None]).to(tl.int64) * srq
    tl.store(ptr + cols[None, :], rv.to(tl.uint8), mask=(rows[:, None] < seqlen_q) & (cols[None, :] < seqlen_k))


# ----------------------------------------------------------------------------
# backward
# ----------------------------------------------------------------------------
@triton.jit
def fmha_bwd_dot_do_o_kernel(O, DO, DELTA, sob, soh, sos, sdb, sdh, sds, H, SEQ_Q, CU_Q, sdlh, ROWS_Q,
                             d_v, ALIGN_DV: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr,
                             IS_VARLEN: tl.constexpr):
    """DELTA = rowsum(dO * O): [B, H, Sq] fp32, or [H, Tq] (head stride sdlh) in group mode, where bad
    query offsets (see fmha_fwd_kernel; ROWS_Q packed rows) make DELTA NaN and nothing is read (the
    dK/dV kernel, which checks both offsets, flags them)."""
    if ALIGN_DV == 0:   # the head dim fills its blocks: a compile-time constant
        D_V: tl.constexpr = BLOCK_DV
    else:   # a run-time head dim (one kernel per padded class), a multiple of ALIGN_DV
        D_V = d_v // ALIGN_DV * ALIGN_DV
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_DV)
    if IS_VARLEN:
        if _group_offsets_bad(tl.num_programs(1) // H + 1, CU_Q, ROWS_Q, SEQ_Q, CU_Q, 0, 0, CU_Q, False, False, 256):
            _nan_hr(DELTA, H, ROWS_Q, sdlh, pid_m + tl.num_programs(0) * bh, tl.num_programs(0) * tl.num_programs(1),
                    256)
            return
        q_start = tl.load(CU_Q + b).to(tl.int64)
        seqlen_q = tl.load(CU_Q + b + 1) - q_start
        msk = (rows[:, None] < seqlen_q) & (offs_d[None, :] < D_V)
        o = tl.load(O + q_start * sos + h * soh + rows[:, None] * sos + offs_d[None, :], mask=msk, other=0.0)
        do = tl.load(DO + q_start * sds + h * sdh + rows[:, None] * sds + offs_d[None, :], mask=msk, other=0.0)
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
        tl.store(DELTA + h * sdlh + q_start + rows, delta, mask=rows < seqlen_q)
    else:
        msk = (rows[:, None] < SEQ_Q) & (offs_d[None, :] < D_V)
        o = tl.load(O + b * sob + h * soh + rows[:, None] * sos + offs_d[None, :], mask=msk, other=0.0)
        do = tl.load(DO + b * sdb + h * sdh + rows[:, None] * sds + offs_d[None, :], mask=msk, other=0.0)
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
        tl.store(DELTA + bh.to(tl.int64) * SEQ_Q + rows, delta, mask=rows < SEQ_Q)


@triton.jit
def _bwd_dkdv_inner(dk, dv, k, v, qb, dob, lseb, deltab, dqab, sqs, sdos, sdqs,
                    start, end, cols, off, left, right, seqlen_q,
                    sm_scale, scale2, cap_in, cap_out,
                    biasb, dbiasb, sbq, sbk, sdbq, slope, aoff, seqlen_k, bh_id, k0, k1, off_lo, thresh,
                    drop_scale,
                    D_Q, D_V, BLOCK_DQ: tl.constexpr, BLOCK_DV: tl.constexpr,
                    BLOCK_M: tl.constexpr, MASKED: tl.constexpr, MASK_MODE: tl.constexpr,
                    HAS_SOFTCAP: tl.constexpr, ATOMIC_DQ: tl.constexpr, EVEN_M: tl.constexpr,
                    BIAS_MODE: tl.constexpr, HAS_DROPOUT: tl.constexpr, STORE_DBIAS: tl.constexpr,
                    EVEN_N: tl.constexpr, DO_DK: tl.constexpr = True, DO_DV: tl.constexpr = True,
                    dk2=0.0, dv2=0.0, k2=0.0, v2=0.0, BLOCK_DQ2: tl.constexpr = 0, BLOCK_DV2: tl.constexpr = 0,
    ALIGN_DQ: tl.constexpr = -1, ALIGN_DV: tl.constexpr = -1):
    """DO_DK / DO_DV: which of the two accumulators this program keeps (KV_SPLIT: dV only -- S, P, dV += P^T dO;
    dK only -- S, dP, dK += dS^T Q, and the dQ atomics and dbias, which need dS).  BLOCK_DQ2 / BLOCK_DV2 > 0:
    head-dim chunks (see _fwd_inner): k2 / v2 / dk2 / dv2 hold the columns from BLOCK_DQ / BLOCK_DV on."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_dq = tl.arange(0, BLOCK_DQ)
    offs_dv = tl.arange(0, BLOCK_DV)
    if BLOCK_DQ2 > 0:
        offs_dq2 = BLOCK_DQ + tl.arange(0, BLOCK_DQ2)
    if BLOCK_DV2 > 0:
        offs_dv2 = BLOCK_DV + tl.arange(0, BLOCK_DV2)
    dtype = k.dtype
    for start_m in tl.range(start, end, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        rows = start_m + offs_m
        if EVEN_M and ALIGN_DQ == 0 and BLOCK_DQ2 == 0:
            q = tl.load(qb + rows[:, None] * sqs + offs_dq[None, :])
        else:
            q = tl.load(qb + rows[:, None] * sqs + offs_dq[None, :],
                        mask=(rows[:, None] < seqlen_q) & (offs_dq[None, :] < D_Q), other=0.0)
        if BLOCK_DQ2 > 0:
            q2 = tl.load(qb + rows[:, None] * sqs + offs_dq2[None, :],
                         mask=(rows[:, None] < seqlen_q) & (offs_dq2[None, :] < D_Q), other=0.0)
        if EVEN_M:
            lse2 = tl.load(lseb + rows)
        else:
            lse2 = tl.load(lseb + rows, mask=rows < seqlen_q, other=float("inf"))
        lse2 = lse2 * 1.4426950408889634
        lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2)
        qkT = tl.dot(k, tl.trans(q))
        if BLOCK_DQ2 > 0:
            qkT = tl.dot(k2, tl.trans(q2), qkT)
        if HAS_SOFTCAP:
            t = _tanh(qkT * cap_in)
            pT = tl.math.exp2(t * cap_out - lse2[None, :])
        elif BIAS_MODE != 0:
            bT = _bias_at(rows[None, :], cols[:, None], biasb, sbq, sbk, slope, aoff, seqlen_q, seqlen_k,
                          BIAS_MODE)
            pT = tl.math.exp2(qkT * scale2 + bT - lse2[None, :])
        else:
            pT = tl.math.exp2(qkT * scale2 - lse2[None, :])
        # rows / keys past the sequence end are zeroed explicitly: exp2(0 - lse2) of their zero-filled
        # q / k overflows for rows whose LSE is very negative, and inf * 0 would turn into NaN in dS
        if MASKED:
            pT = tl.where(_visible_t(rows, cols, off, left, right, MASK_MODE), pT, 0.0)
        if not EVEN_M:
            pT = tl.where(rows[None, :] < seqlen_q, pT, 0.0)
        if not EVEN_N:
            pT = tl.where(cols[:, None] < seqlen_k, pT, 0.0)
        if EVEN_M and ALIGN_DV == 0 and BLOCK_DV2 == 0:
            do = tl.load(dob + rows[:, None] * sdos + offs_dv[None, :])
        else:
            do = tl.load(dob + rows[:, None] * sdos + offs_dv[None, :],
                         mask=(rows[:, None] < seqlen_q) & (offs_dv[None, :] < D_V), other=0.0)
        if BLOCK_DV2 > 0:
            do2 = tl.load(dob + rows[:, None] * sdos + offs_dv2[None, :],
                          mask=(rows[:, None] < seqlen_q) & (offs_dv2[None, :] < D_V), other=0.0)
        if HAS_DROPOUT:
            keepT = _dropout_keep(rows[None, :], cols[:, None], bh_id, k0, k1, off_lo, thresh)
        if DO_DV:
            if HAS_DROPOUT:
                pT16 = tl.where(keepT, pT * drop_scale, 0.0).to(dtype)
            else:
                pT16 = pT.to(dtype)
            dv = tl.dot(pT16, do, dv)
            if BLOCK_DV2 > 0:
                dv2 = tl.dot(pT16, do2, dv2)
        if DO_DK:
            if EVEN_M:
                di = tl.load(deltab + rows)
            else:
                di = tl.load(deltab + rows, mask=rows < seqlen_q, other=0.0)
            dpT = tl.dot(v, tl.trans(do))
            if BLOCK_DV2 > 0:
                dpT = tl.dot(v2, tl.trans(do2), dpT)
            if HAS_DROPOUT:
                dpT = tl.where(keepT, dpT * drop_scale, 0.0)
            dsT = pT * (dpT - di[None, :])
            if STORE_DBIAS:
                tl.store(dbiasb + rows[None, :] * sdbq + cols[:, None], dsT,
                         mask=(rows[None, :] < seqlen_q) & (cols[:, None] < seqlen_k))
            if HAS_SOFTCAP:
                dsT = dsT * (1.0 - t * t)
            dsT16 = dsT.to(dtype)
            dk = tl.dot(dsT16, q, dk)
            if BLOCK_DQ2 > 0:
                dk2 = tl.dot(dsT16, q2, dk2)
            if ATOMIC_DQ:
                dq = tl.dot(tl.trans(dsT16), k) * sm_scale
                tl.atomic_add(dqab + rows[:, None] * sdqs + offs_dq[None, :], dq,
                              mask=(rows[:, None] < seqlen_q) & (offs_dq[None, :] < D_Q), sem="relaxed")
                if BLOCK_DQ2 > 0:
                    dq2 = tl.dot(tl.trans(dsT16), k2) * sm_scale
                    tl.atomic_add(dqab + rows[:, None] * sdqs + offs_dq2[None, :], dq2,
                                  mask=(rows[:, None] < seqlen_q) & (offs_dq2[None, :] < D_Q), sem="relaxed")
    return dk, dv, dk2, dv2


@triton.jit
def _bwd_dkdv_tile(
    Q, K, V, DO, LSE, DELTA, DK, DV, DQA,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdob, sdoh, sdos,
    sdkb, sdkh, sdks, sdvb, sdvh, sdvs, sdqb, sdqh, sdqs,
    HK, GROUP, SEQ_Q, sm_scale, scale2, cap_in, cap_out, left, right,
    BIAS, ALIBI, DBIAS, sbb, sbh, sbq, sbk, sab, sdbb, sdbh, sdbq, slh,
    seed_lo, seed_hi, off_lo, drop_thresh, drop_scale,
    b, hk, n0, q_start, k_start, seqlen_q, seqlen_k, off, g_lo, g_hi,
    D_Q, D_V, BLOCK_DQ: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASK_MODE: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    ATOMIC_DQ: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
    IS_VARLEN: tl.constexpr, BIAS_MODE: tl.constexpr, HAS_DROPOUT: tl.constexpr, STORE_DBIAS: tl.constexpr,
    DO_DK: tl.constexpr, DO_DV: tl.constexpr, BLOCK_DQ2: tl.constexpr = 0, BLOCK_DV2: tl.constexpr = 0,
    ALIGN_DQ: tl.constexpr = -1, ALIGN_DV: tl.constexpr = -1,
):
    """One key block's dK and/or dV (DO_DK / DO_DV), summed over the query heads g_lo <= g < g_hi of the kv
    head's GQA group (see fmha_bwd_dq_dk_dv_kernel); DK / DV already point at this program's partial sums."""
    cols = n0 + tl.arange(0, BLOCK_N)
    offs_dq = tl.arange(0, BLOCK_DQ)
    offs_dv = tl.arange(0, BLOCK_DV)
    kmask = (cols[:, None] < seqlen_k) & (offs_dq[None, :] < D_Q)
    vmask = (cols[:, None] < seqlen_k) & (offs_dv[None, :] < D_V)
    if IS_VARLEN:
        kb = K + k_start * sks + hk * skh
        vb = V + k_start * svs + hk * svh
    else:
        kb = K + b * skb + hk * skh
        vb = V + b * svb + hk * svh
    k = tl.load(kb + cols[:, None] * sks + offs_dq[None, :], mask=kmask, other=0.0)
    k2 = 0.0
    v2 = 0.0
    dk2 = 0.0
    dv2 = 0.0
    if BLOCK_DQ2 > 0:   # head-dim chunks: the columns from BLOCK_DQ / BLOCK_DV on
        offs_dq2 = BLOCK_DQ + tl.arange(0, BLOCK_DQ2)
        kmask2 = (cols[:, None] < seqlen_k) & (offs_dq2[None, :] < D_Q)
        k2 = tl.load(kb + cols[:, None] * sks + offs_dq2[None, :], mask=kmask2, other=0.0)
    if BLOCK_DV2 > 0:
        offs_dv2 = BLOCK_DV + tl.arange(0, BLOCK_DV2)
        vmask2 = (cols[:, None] < seqlen_k) & (offs_dv2[None, :] < D_V)
    if DO_DK:   # V is read by dP^T = V dO^T only
        v = tl.load(vb + cols[:, None] * svs + offs_dv[None, :], mask=vmask, other=0.0)
        dk = tl.zeros([BLOCK_N, BLOCK_DQ], dtype=tl.float32)
        if BLOCK_DV2 > 0:
            v2 = tl.load(vb + cols[:, None] * svs + offs_dv2[None, :], mask=vmask2, other=0.0)
        if BLOCK_DQ2 > 0:
            dk2 = tl.zeros([BLOCK_N, BLOCK_DQ2], dtype=tl.float32)
    else:
        v = k
        dk = 0.0
    if DO_DV:
        dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
        if BLOCK_DV2 > 0:
            dv2 = tl.zeros([BLOCK_N, BLOCK_DV2], dtype=tl.float32)
    else:
        dv = 0.0
    lo, full_lo, full_hi, hi = _q_range(n0, off, left, right, seqlen_q, BLOCK_M, BLOCK_N, MASK_MODE)
    for g in range(g_lo, g_hi):
        h = hk * GROUP + g
        if IS_VARLEN:
            qb = Q + q_start * sqs + h * sqh
            dob = DO + q_start * sdos + h * sdoh
            dqab = DQA + q_start * sdqs + h * sdqh
            lseb = LSE + h * slh + q_start
            deltab = DELTA + h * slh + q_start
        else:
            qb = Q + b * sqb + h * sqh
            dob = DO + b * sdob + h * sdoh
            dqab = DQA + b * sdqb + h * sdqh
            lseb = LSE + (b * HK * GROUP + h) * SEQ_Q
            deltab = DELTA + (b * HK * GROUP + h) * SEQ_Q
        biasb, slope, aoff = _bias_setup(BIAS, ALIBI, b, h, q_start, sbb, sbh, sbq, sab,
                                         seqlen_q, seqlen_k, BIAS_MODE)
        dbiasb = DBIAS
        if STORE_DBIAS:
            dbiasb = DBIAS + b * sdbb + h * sdbh + q_start * sdbq
        bh_id = b * HK * GROUP + h
        if MASK_MODE & 1:
            dk, dv, dk2, dv2 = _bwd_dkdv_inner(dk, dv, k, v, qb, dob, lseb, deltab, dqab, sqs, sdos, sdqs,
                                     lo, full_lo, cols, off, left, right, seqlen_q,
                                     sm_scale, scale2, cap_in, cap_out,
                                     biasb, dbiasb, sbq, sbk, sdbq, slope, aoff, seqlen_k, bh_id,
                                     seed_lo, seed_hi, off_lo, drop_thresh, drop_scale,
                                     D_Q, D_V, BLOCK_DQ, BLOCK_DV,
                                     BLOCK_M, True, MASK_MODE, HAS_SOFTCAP, ATOMIC_DQ, EVEN_M,
                                     BIAS_MODE, HAS_DROPOUT, STORE_DBIAS, EVEN_N, DO_DK, DO_DV,
                                     dk2, dv2, k2, v2, BLOCK_DQ2, BLOCK_DV2, ALIGN_DQ=ALIGN_DQ, ALIGN_DV=ALIGN_DV)
        dk, dv, dk2, dv2 = _bwd_dkdv_inner(dk, dv, k, v, qb, dob, lseb, deltab, dqab, sqs, sdos, sdqs,
                                 full_lo, full_hi, cols, off, left, right, seqlen_q,
                                 sm_scale, scale2, cap_in, cap_out,
                                 biasb, dbiasb, sbq, sbk, sdbq, slope, aoff, seqlen_k, bh_id,
                                 seed_lo, seed_hi, off_lo, drop_thresh, drop_scale,
                                 D_Q, D_V, BLOCK_DQ, BLOCK_DV,
                                 BLOCK_M, False, MASK_MODE, HAS_SOFTCAP, ATOMIC_DQ, EVEN_M,
                                 BIAS_MODE, HAS_DROPOUT, STORE_DBIAS, EVEN_N, DO_DK, DO_DV,
                                     dk2, dv2, k2, v2, BLOCK_DQ2, BLOCK_DV2, ALIGN_DQ=ALIGN_DQ, ALIGN_DV=ALIGN_DV)
        if MASK_MODE & 2:
            dk, dv, dk2, dv2 = _bwd_dkdv_inner(dk, dv, k, v, qb, dob, lseb, deltab, dqab, sqs, sdos, sdqs,
                                     full_hi, hi, cols, off, left, right, seqlen_q,
                                     sm_scale, scale2, cap_in, cap_out,
                                     biasb, dbiasb, sbq, sbk, sdbq, slope, aoff, seqlen_k, bh_id,
                                     seed_lo, seed_hi, off_lo, drop_thresh, drop_scale,
                                     D_Q, D_V, BLOCK_DQ, BLOCK_DV,
                                     BLOCK_M, True, MASK_MODE, HAS_SOFTCAP, ATOMIC_DQ, EVEN_M,
                                     BIAS_MODE, HAS_DROPOUT, STORE_DBIAS, EVEN_N, DO_DK, DO_DV,
                                     dk2, dv2, k2, v2, BLOCK_DQ2, BLOCK_DV2, ALIGN_DQ=ALIGN_DQ, ALIGN_DV=ALIGN_DV)
    if IS_VARLEN:
        dkb = DK + k_start * sdks + hk * sdkh
        dvb = DV + k_start * sdvs + hk * sdvh
    else:
        dkb = DK + b * sdkb + hk * sdkh
        dvb = DV + b * sdvb + hk * sdvh
    if DO_DK:
        dk = dk * sm_scale
        tl.store(dkb + cols[:, None] * sdks + offs_dq[None, :], dk.to(DK.dtype.element_ty), mask=kmask)
        if BLOCK_DQ2 > 0:
            dk2 = dk2 * sm_scale
            tl.store(dkb + cols[:, None] * sdks + offs_dq2[None, :], dk2.to(DK.dtype.element_ty), mask=kmask2)
    if DO_DV:
        tl.store(dvb + cols[:, None] * sdvs + offs_dv[None, :], dv.to(DV.dtype.element_ty), mask=vmask)
        if BLOCK_DV2 > 0:
            tl.store(dvb + cols[:, None] * sdvs + offs_dv2[None, :], dv2.to(DV.dtype.element_ty), mask=vmask2)


@triton.jit(do_not_specialize=_PHILOX_ARGS)
def fmha_bwd_dq_dk_dv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, DQA,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdob, sdoh, sdos,
    sdkb, sdkh, sdks, sdvb, sdvh, sdvs, sdqb, sdqh, sdqs,
    HK, GROUP, SEQ_Q, SEQ_K,
    sm_scale, scale2, cap_in, cap_out, left, right,
    CU_Q, CU_K, BIAS, ALIBI, DBIAS, sbb, sbh, sbq, sbk, sab, sdbb, sdbh, sdbq, slh,
    seed_lo, seed_hi, off_lo, drop_thresh, drop_scale, SEQLENS_K, GSPLIT, sdkg, sdvg, ROWS_Q, ROWS_K, ERR,
    d_q, d_v, ALIGN_DQ: tl.constexpr, ALIGN_DV: tl.constexpr, BLOCK_DQ: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASK_MODE: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    ATOMIC_DQ: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
    IS_VARLEN: tl.constexpr, BIAS_MODE: tl.constexpr, HAS_DROPOUT: tl.constexpr, STORE_DBIAS: tl.constexpr,
    HAS_SEQLENS: tl.constexpr = False, KV_SPLIT: tl.constexpr = False,
    BLOCK_DQ2: tl.constexpr = 0, BLOCK_DV2: tl.constexpr = 0,
):
    """dK, dV for one key block (summed over the GQA group); with ATOMIC_DQ
    also accumulates dQ (scaled, fp32) into DQA with atomics.  IS_VARLEN: group
    mode (CU_Q/CU_K offsets, LSE/DELTA [H, Tq] with head stride slh; the grid
    covers max_seqlen_k).  BIAS_MODE / HAS_DROPOUT as in fmha_fwd_kernel;
    STORE_DBIAS writes dS (= dBias of an elementwise bias) into the fp32 DBIAS
    [B, H, Sq, Sk] ([H, Tq, max Sk] in group mode), column stride 1.

    KV_SPLIT (a key's ``kvsplit`` variant): grid axis 2 has two programs per key block, one keeping only
    dV (S, P, dV += P^T dO: two products), one only dK (S, dP, dK += dS^T Q: three, plus the dQ atomics
    and dbias): one fp32 accumulator per program instead of two (head dims >= 160) and twice the
    programs (GQA / MQA with few key blocks), for one more product per block in all.

    GSPLIT > 1 (a key's ``gsplit``): the query heads of a kv head's group are split over GSPLIT programs
    (grid axis 2: split index * (2 if KV_SPLIT else 1) + part), each summing ceil(GROUP / GSPLIT) heads into
    its own fp32 partial dK / dV at DK + i * sdkg / DV + i * sdvg; the launcher sums the partials (fixed
    order: deterministic).  For GQA / MQA problems with few key blocks per kv head.

    IS_VARLEN: bad offsets (see fmha_fwd_kernel: CU_Q against ROWS_Q and SEQ_Q, CU_K against ROWS_K and
    SEQ_K) make every program read nothing and write NaN over its share of DK, DV (all GSPLIT partials),
    DQA (ATOMIC_DQ) and DBIAS, and OR BAD_OFFSETS (4) into ERR."""
    if ALIGN_DQ == 0:   # the head dim fills its blocks: a compile-time constant
        D_Q: tl.constexpr = BLOCK_DQ + BLOCK_DQ2
    else:   # a run-time head dim (one kernel per padded class), a multiple of ALIGN_DQ
        D_Q = d_q // ALIGN_DQ * ALIGN_DQ
    if ALIGN_DV == 0:   # the head dim fills its blocks: a compile-time constant
        D_V: tl.constexpr = BLOCK_DV + BLOCK_DV2
    else:   # a run-time head dim (one kernel per padded class), a multiple of ALIGN_DV
        D_V = d_v // ALIGN_DV * ALIGN_DV
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // HK).to(tl.int64)
    hk = (bh % HK).to(tl.int64)
    n0 = pid_n * BLOCK_N
    if IS_VARLEN:
        n_cu = tl.num_programs(1) // HK + 1
        offsets_bad = _group_offsets_bad(n_cu, CU_Q, ROWS_Q, SEQ_Q, CU_K, ROWS_K, SEQ_K, SEQLENS_K, True, HAS_SEQLENS,
                                         256)
        if offsets_bad:
            idx = pid_n + tl.num_programs(0) * bh
            count = tl.num_programs(0) * tl.num_programs(1)
            pid_z = tl.program_id(2)
            if KV_SPLIT:   # slice gi's part-0 programs fill that slice
                gi_fill = pid_z // 2
                fills = pid_z % 2 == 0
            else:
                gi_fill = pid_z
                fills = pid_z >= 0
            if fills:
                _nan_lines(DK + gi_fill.to(tl.int64) * sdkg, ROWS_K, HK, sdks, sdkh, D_Q, idx, count, 16, BLOCK_DQ)
                _nan_lines(DV + gi_fill.to(tl.int64) * sdvg, ROWS_K, HK, sdvs, sdvh, D_V, idx, count, 16, BLOCK_DV)
            if pid_z == 0:
                if ATOMIC_DQ:
                    _nan_lines(DQA, ROWS_Q, HK * GROUP, sdqs, sdqh, D_Q, idx, count, 16, BLOCK_DQ)
                if STORE_DBIAS:
                    _nan_lines(DBIAS, ROWS_Q, HK * GROUP, sdbq, sdbh, SEQ_K, idx, count, 16, BLOCK_N)
            tl.atomic_or(ERR, 4)
            return
        q_start = tl.load(CU_Q + b).to(tl.int64)
        seqlen_q = (tl.load(CU_Q + b + 1) - q_start).to(tl.int32)
        k_start = tl.load(CU_K + b).to(tl.int64)
        if HAS_SEQLENS:   # logical key length within the seqstart_k span (see fmha_fwd_kernel)
            seqlen_k = tl.load(SEQLENS_K + b).to(tl.int32)
        else:
            seqlen_k = (tl.load(CU_K + b + 1) - k_start).to(tl.int32)
    else:
        q_start = 0
        k_start = 0
        seqlen_q = SEQ_Q
        seqlen_k = SEQ_K
    if IS_VARLEN:
        if n0 >= seqlen_k:
            return
    if BOTTOM_RIGHT:
        off = seqlen_k - seqlen_q
    else:
        off = 0
    pid_z = tl.program_id(2)
    if KV_SPLIT:
        part = pid_z % 2
        gi = pid_z // 2
    else:
        part = 0
        gi = pid_z
    per = (GROUP + GSPLIT - 1) // GSPLIT
    g_lo = gi * per
    g_hi = tl.minimum(g_lo + per, GROUP)
    DK = DK + gi.to(tl.int64) * sdkg
    DV = DV + gi.to(tl.int64) * sdvg
    if KV_SPLIT:
        if part == 0:
            _bwd_dkdv_tile(Q, K, V, DO, LSE, DELTA, DK, DV, DQA,
                           sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdob, sdoh, sdos,
                           sdkb, sdkh, sdks, sdvb, sdvh, sdvs, sdqb, sdqh, sdqs,
                           HK, GROUP, SEQ_Q, sm_scale, scale2, cap_in, cap_out, left, right,
                           BIAS, ALIBI, DBIAS, sbb, sbh, sbq, sbk, sab, sdbb, sdbh, sdbq, slh,
                           seed_lo, seed_hi, off_lo, drop_thresh, drop_scale,
                           b, hk, n0, q_start, k_start, seqlen_q, seqlen_k, off, g_lo, g_hi,
                           D_Q, D_V, BLOCK_DQ, BLOCK_DV, BLOCK_M, BLOCK_N, MASK_MODE, HAS_SOFTCAP,
                           ATOMIC_DQ, EVEN_M, EVEN_N, IS_VARLEN, BIAS_MODE, HAS_DROPOUT, STORE_DBIAS,
                           False, True, BLOCK_DQ2, BLOCK_DV2, ALIGN_DQ=ALIGN_DQ, ALIGN_DV=ALIGN_DV)
        else:
            _bwd_dkdv_tile(Q, K, V, DO, LSE, DELTA, DK, DV, DQA,
                           sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdob, sdoh, sdos,
                           sdkb, sdkh, sdks, sdvb, sdvh, sdvs, sdqb, sdqh, sdqs,
                           HK, GROUP, SEQ_Q, sm_scale, scale2, cap_in, cap_out, left, right,
                           BIAS, ALIBI, DBIAS, sbb, sbh, sbq, sbk, sab, sdbb, sdbh, sdbq, slh,
                           seed_lo, seed_hi, off_lo, drop_thresh, drop_scale,
                           b, hk, n0, q_start, k_start, seqlen_q, seqlen_k, off, g_lo, g_hi,
                           D_Q, D_V, BLOCK_DQ, BLOCK_DV, BLOCK_M, BLOCK_N, MASK_MODE, HAS_SOFTCAP,
                           ATOMIC_DQ, EVEN_M, EVEN_N, IS_VARLEN, BIAS_MODE, HAS_DROPOUT, STORE_DBIAS,
                           True, False, BLOCK_DQ2, BLOCK_DV2, ALIGN_DQ=ALIGN_DQ, ALIGN_DV=ALIGN_DV)
    else:
        _bwd_dkdv_tile(Q, K, V, DO, LSE, DELTA, DK, DV, DQA,
                       sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdob, sdoh, sdos,
                       sdkb, sdkh, sdks, sdvb, sdvh, sdvs, sdqb, sdqh, sdqs,
                       HK, GROUP, SEQ_Q, sm_scale, scale2, cap_in, cap_out, left, right,
                       BIAS, ALIBI, DBIAS, sbb, sbh, sbq, sbk, sab, sdbb, sdbh, sdbq, slh,
                       seed_lo, seed_hi, off_lo, drop_thresh, drop_scale,
                       b, hk, n0, q_start, k_start, seqlen_q, seqlen_k, off, g_lo, g_hi,
                       D_Q, D_V, BLOCK_DQ, BLOCK_DV, BLOCK_M, BLOCK_N, MASK_MODE, HAS_SOFTCAP,
                       ATOMIC_DQ, EVEN_M, EVEN_N, IS_VARLEN, BIAS_MODE, HAS_DROPOUT, STORE_DBIAS,
                       True, True, BLOCK_DQ2, BLOCK_DV2, ALIGN_DQ=ALIGN_DQ, ALIGN_DV=ALIGN_DV)


@triton.jit
def _bwd_dq_inner(dq, q, do, lse2, di, kb, vb, sks, svs, start, end, rows, off, left, right, seqlen_k,
                  scale2, cap_in, cap_out,
                  biasb, sbq, sbk, slope, aoff, seqlen_q, bh_id, k0, k1, off_lo, thresh, drop_scale,
                  D_Q, D_V, BLOCK_DQ: tl.constexpr, BLOCK_DV: tl.constexpr,
                  BLOCK_N: tl.constexpr, MASKED: tl.constexpr, MASK_MODE: tl.constexpr,
                  HAS_SOFTCAP: tl.constexpr, EVEN_N: tl.constexpr,
                  BIAS_MODE: tl.constexpr, HAS_DROPOUT: tl.constexpr, EVEN_M: tl.constexpr,
                  dq2=0.0, q2=0.0, do2=0.0, BLOCK_DQ2: tl.constexpr = 0, BLOCK_DV2: tl.constexpr = 0,
    ALIGN_DQ: tl.constexpr = -1, ALIGN_DV: tl.constexpr = -1):
    """BLOCK_DQ2 / BLOCK_DV2 > 0: head-dim chunks (see _fwd_inner); q2 / do2 / dq2 the second chunk."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_dq = tl.arange(0, BLOCK_DQ)
    offs_dv = tl.arange(0, BLOCK_DV)
    if BLOCK_DQ2 > 0:
        offs_dq2 = BLOCK_DQ + tl.arange(0, BLOCK_DQ2)
    if BLOCK_DV2 > 0:
        offs_dv2 = BLOCK_DV + tl.arange(0, BLOCK_DV2)
    dtype = q.dtype
    for start_n in tl.range(start, end, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        if EVEN_N and ALIGN_DQ == 0 and BLOCK_DQ2 == 0:
            k = tl.load(kb + cols[:, None] * sks + offs_dq[None, :])
        else:
            k = tl.load(kb + cols[:, None] * sks + offs_dq[None, :],
                        mask=(cols[:, None] < seqlen_k) & (offs_dq[None, :] < D_Q), other=0.0)
        if EVEN_N and ALIGN_DV == 0 and BLOCK_DV2 == 0:
            v = tl.load(vb + cols[:, None] * svs + offs_dv[None, :])
        else:
            v = tl.load(vb + cols[:, None] * svs + offs_dv[None, :],
                        mask=(cols[:, None] < seqlen_k) & (offs_dv[None, :] < D_V), other=0.0)
        if BLOCK_DQ2 > 0:
            k2 = tl.load(kb + cols[:, None] * sks + offs_dq2[None, :],
                         mask=(cols[:, None] < seqlen_k) & (offs_dq2[None, :] < D_Q), other=0.0)
        if BLOCK_DV2 > 0:
            v2 = tl.load(vb + cols[:, None] * svs + offs_dv2[None, :],
                         mask=(cols[:, None] < seqlen_k) & (offs_dv2[None, :] < D_V), other=0.0)
        qk = tl.dot(q, tl.trans(k))
        if BLOCK_DQ2 > 0:
            qk = tl.dot(q2, tl.trans(k2), qk)
        if HAS_SOFTCAP:
            t = _tanh(qk * cap_in)
            p = tl.math.exp2(t * cap_out - lse2[:, None])
        elif BIAS_MODE != 0:
            bt = _bias_at(rows[:, None], cols[None, :], biasb, sbq, sbk, slope, aoff, seqlen_q, seqlen_k,
                          BIAS_MODE)
            p = tl.math.exp2(qk * scale2 + bt - lse2[:, None])
        else:
            p = tl.math.exp2(qk * scale2 - lse2[:, None])
        # explicit zeros outside the sequence (see _bwd_dkdv_inner); unmasked blocks lie inside seqlen_k
        if MASKED:
            p = tl.where(_visible(rows, cols, off, left, right, MASK_MODE) & (cols[None, :] < seqlen_k), p, 0.0)
        if not EVEN_M:
            p = tl.where(rows[:, None] < seqlen_q, p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        if BLOCK_DV2 > 0:
            dp = tl.dot(do2, tl.trans(v2), dp)
        if HAS_DROPOUT:
            keep = _dropout_keep(rows[:, None], cols[None, :], bh_id, k0, k1, off_lo, thresh)
            dp = tl.where(keep, dp * drop_scale, 0.0)
        ds = p * (dp - di[:, None])
        if HAS_SOFTCAP:
            ds = ds * (1.0 - t * t)
        ds16 = ds.to(dtype)
        dq = tl.dot(ds16, k, dq)
        if BLOCK_DQ2 > 0:
            dq2 = tl.dot(ds16, k2, dq2)
    return dq, dq2


@triton.jit(do_not_specialize=_PHILOX_ARGS)
def fmha_bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdob, sdoh, sdos, sdqb, sdqh, sdqs,
    H, GROUP, SEQ_Q, SEQ_K,
    sm_scale, scale2, cap_in, cap_out, left, right,
    CU_Q, CU_K, BIAS, ALIBI, sbb, sbh, sbq, sbk, sab, slh,
    seed_lo, seed_hi, off_lo, drop_thresh, drop_scale, SEQLENS_K, ROWS_Q, ROWS_K, ERR,
    d_q, d_v, ALIGN_DQ: tl.constexpr, ALIGN_DV: tl.constexpr, BLOCK_DQ: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASK_MODE: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
    IS_VARLEN: tl.constexpr, BIAS_MODE: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    HAS_SEQLENS: tl.constexpr = False, BLOCK_DQ2: tl.constexpr = 0, BLOCK_DV2: tl.constexpr = 0,
):
    """Deterministic dQ pass: one program per query block, loops over keys.  BLOCK_DQ2 / BLOCK_DV2:
    head-dim chunks (see fmha_fwd_kernel).
    With a causal (right-bounded) mask the heaviest (last) query blocks go first.
    IS_VARLEN / BIAS_MODE / HAS_DROPOUT as in fmha_bwd_dq_dk_dv_kernel (bad offsets: DQ NaN, ERR)."""
    if ALIGN_DQ == 0:   # the head dim fills its blocks: a compile-time constant
        D_Q: tl.constexpr = BLOCK_DQ + BLOCK_DQ2
    else:   # a run-time head dim (one kernel per padded class), a multiple of ALIGN_DQ
        D_Q = d_q // ALIGN_DQ * ALIGN_DQ
    if ALIGN_DV == 0:   # the head dim fills its blocks: a compile-time constant
        D_V: tl.constexpr = BLOCK_DV + BLOCK_DV2
    else:   # a run-time head dim (one kernel per padded class), a multiple of ALIGN_DV
        D_V = d_v // ALIGN_DV * ALIGN_DV
    pid_m = tl.program_id(0)
    if MASK_MODE & 1:
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    hk = h // GROUP
    m0 = pid_m * BLOCK_M
    if IS_VARLEN:
        n_cu = tl.num_programs(1) // H + 1
        offsets_bad = _group_offsets_bad(n_cu, CU_Q, ROWS_Q, SEQ_Q, CU_K, ROWS_K, SEQ_K, SEQLENS_K, True, HAS_SEQLENS,
                                         256)
        if offsets_bad:
            _nan_lines(DQ, ROWS_Q, H, sdqs, sdqh, D_Q, tl.program_id(0) + tl.num_programs(0) * bh,
                       tl.num_programs(0) * tl.num_programs(1), 16, BLOCK_DQ)
            tl.atomic_or(ERR, 4)
            return
        q_start = tl.load(CU_Q + b).to(tl.int64)
        seqlen_q = (tl.load(CU_Q + b + 1) - q_start).to(tl.int32)
        k_start = tl.load(CU_K + b).to(tl.int64)
        if HAS_SEQLENS:   # logical key length within the seqstart_k span (see fmha_fwd_kernel)
            seqlen_k = tl.load(SEQLENS_K + b).to(tl.int32)
        else:
            seqlen_k = (tl.load(CU_K + b + 1) - k_start).to(tl.int32)
    else:
        q_start = 0
        k_start = 0
        seqlen_q = SEQ_Q
        seqlen_k = SEQ_K
    if IS_VARLEN:
        if m0 >= seqlen_q:
            return
    if BOTTOM_RIGHT:
        off = seqlen_k - seqlen_q
    else:
        off = 0
    rows = m0 + tl.arange(0, BLOCK_M)
    offs_dq = tl.arange(0, BLOCK_DQ)
    offs_dv = tl.arange(0, BLOCK_DV)
    qmask = (rows[:, None] < seqlen_q) & (offs_dq[None, :] < D_Q)
    if IS_VARLEN:
        q = tl.load(Q + q_start * sqs + h * sqh + rows[:, None] * sqs + offs_dq[None, :], mask=qmask, other=0.0)
        do = tl.load(DO + q_start * sdos + h * sdoh + rows[:, None] * sdos + offs_dv[None, :],
                     mask=(rows[:, None] < seqlen_q) & (offs_dv[None, :] < D_V), other=0.0)
        lse2 = tl.load(LSE + h * slh + q_start + rows, mask=rows < seqlen_q, other=float("inf"))
    else:
        q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqs + offs_dq[None, :], mask=qmask, other=0.0)
        do = tl.load(DO + b * sdob + h * sdoh + rows[:, None] * sdos + offs_dv[None, :],
                     mask=(rows[:, None] < SEQ_Q) & (offs_dv[None, :] < D_V), other=0.0)
        lse2 = tl.load(LSE + bh.to(tl.int64) * SEQ_Q + rows, mask=rows < SEQ_Q, other=float("inf"))
    lse2 = lse2 * 1.4426950408889634
    lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2)
    if IS_VARLEN:
        qrow = Q + q_start * sqs + h * sqh
        dorow = DO + q_start * sdos + h * sdoh
    else:
        qrow = Q + b * sqb + h * sqh
        dorow = DO + b * sdob + h * sdoh
    q2 = 0.0
    do2 = 0.0
    dq2 = 0.0
    if BLOCK_DQ2 > 0:
        offs_dq2 = BLOCK_DQ + tl.arange(0, BLOCK_DQ2)
        qmask2 = (rows[:, None] < seqlen_q) & (offs_dq2[None, :] < D_Q)
        q2 = tl.load(qrow + rows[:, None] * sqs + offs_dq2[None, :], mask=qmask2, other=0.0)
        dq2 = tl.zeros([BLOCK_M, BLOCK_DQ2], dtype=tl.float32)
    if BLOCK_DV2 > 0:
        offs_dv2 = BLOCK_DV + tl.arange(0, BLOCK_DV2)
        do2 = tl.load(dorow + rows[:, None] * sdos + offs_dv2[None, :],
                      mask=(rows[:, None] < seqlen_q) & (offs_dv2[None, :] < D_V), other=0.0)
    if IS_VARLEN:
        di = tl.load(DELTA + h * slh + q_start + rows, mask=rows < seqlen_q, other=0.0)
        kb = K + k_start * sks + hk * skh
        vb = V + k_start * svs + hk * svh
    else:
        di = tl.load(DELTA + bh.to(tl.int64) * SEQ_Q + rows, mask=rows < SEQ_Q, other=0.0)
        kb = K + b * skb + hk * skh
        vb = V + b * svb + hk * svh
    biasb, slope, aoff = _bias_setup(BIAS, ALIBI, b, h, q_start, sbb, sbh, sbq, sab,
                                     seqlen_q, seqlen_k, BIAS_MODE)
    bh_id = b * H + h
    dq = tl.zeros([BLOCK_M, BLOCK_DQ], dtype=tl.float32)
    lo, full_lo, full_hi, hi = _kv_range(m0, off, left, right, seqlen_k, BLOCK_M, BLOCK_N, MASK_MODE)
    if MASK_MODE & 2:
        dq, dq2 = _bwd_dq_inner(dq, q, do, lse2, di, kb, vb, sks, svs, lo, full_lo, rows, off, left, right, seqlen_k,
                           scale2, cap_in, cap_out,
                           biasb, sbq, sbk, slope, aoff, seqlen_q, bh_id, seed_lo, seed_hi, off_lo, drop_thresh,
                           drop_scale, D_Q, D_V, BLOCK_DQ, BLOCK_DV, BLOCK_N,
                           True, MASK_MODE, HAS_SOFTCAP, EVEN_N, BIAS_MODE, HAS_DROPOUT, EVEN_M,
                           dq2, q2, do2, BLOCK_DQ2, BLOCK_DV2, ALIGN_DQ=ALIGN_DQ, ALIGN_DV=ALIGN_DV)
    dq, dq2 = _bwd_dq_inner(dq, q, do, lse2, di, kb, vb, sks, svs, full_lo, full_hi, rows, off, left, right, seqlen_k,
                       scale2, cap_in, cap_out,
                       biasb, sbq, sbk, slope, aoff, seqlen_q, bh_id, seed_lo, seed_hi, off_lo, drop_thresh,
                       drop_scale, D_Q, D_V, BLOCK_DQ, BLOCK_DV, BLOCK_N,
                       False, MASK_MODE, HAS_SOFTCAP, EVEN_N, BIAS_MODE, HAS_DROPOUT, EVEN_M,
                           dq2, q2, do2, BLOCK_DQ2, BLOCK_DV2, ALIGN_DQ=ALIGN_DQ, ALIGN_DV=ALIGN_DV)
    dq, dq2 = _bwd_dq_inner(dq, q, do, lse2, di, kb, vb, sks, svs, full_hi, hi, rows, off, left, right, seqlen_k,
                       scale2, cap_in, cap_out,
                       biasb, sbq, sbk, slope, aoff, seqlen_q, bh_id, seed_lo, seed_hi, off_lo, drop_thresh,
                       drop_scale, D_Q, D_V, BLOCK_DQ, BLOCK_DV, BLOCK_N,
                       True, MASK_MODE, HAS_SOFTCAP, EVEN_N, BIAS_MODE, HAS_DROPOUT, EVEN_M,
                           dq2, q2, do2, BLOCK_DQ2, BLOCK_DV2, ALIGN_DQ=ALIGN_DQ, ALIGN_DV=ALIGN_DV)
    dq = dq * sm_scale
    if IS_VARLEN:
        dqrow = DQ + q_start * sdqs + h * sdqh
    else:
        dqrow = DQ + b * sdqb + h * sdqh
    tl.store(dqrow + rows[:, None] * sdqs + offs_dq[None, :], dq.to(DQ.dtype.element_ty), mask=qmask)
    if BLOCK_DQ2 > 0:
        dq2 = dq2 * sm_scale
        tl.store(dqrow + rows[:, None] * sdqs + offs_dq2[None, :], dq2.to(DQ.dtype.element_ty), mask=qmask2)


@triton.jit
def fmha_bwd_sum_partials_kernel(P, OUT, N, G, BLOCK: tl.constexpr):
    """OUT[i] = sum over g < G of P[g * N + i] (fp32, in g order: deterministic), cast to OUT's type: the
    GQA group split's partial dK / dV (fmha_bwd_dq_dk_dv_kernel's GSPLIT) summed into the gradient.  P and
    OUT share one dense layout (flat storage index i)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    p = P + offs   # (stepped by N: 64-bit pointer arithmetic, no g * N product to overflow)
    for g in range(0, G):
        acc += tl.load(p, mask=m, other=0.0)
        p += N
    tl.store(OUT + offs, acc.to(OUT.dtype.element_ty), mask=m)


@triton.jit
def fmha_bwd_convert_dq_kernel(DQA, DQ, sab, sah, sas, sdb, sdh, sds, H, SEQ_Q, CU_Q, ROWS_Q, CU_K, ROWS_K, LONG_K,
                               SEQLENS_K,
                               d_q, ALIGN_DQ: tl.constexpr, BLOCK_DQ: tl.constexpr, BLOCK_M: tl.constexpr,
                               IS_VARLEN: tl.constexpr, HAS_SEQLENS: tl.constexpr = False):
    """DQ = DQA in DQ's dtype.  Group mode: bad offsets (see fmha_fwd_kernel; the dK/dV kernel flags
    them) make all of DQ NaN, rows of no sequence too."""
    if ALIGN_DQ == 0:   # the head dim fills its blocks: a compile-time constant
        D_Q: tl.constexpr = BLOCK_DQ
    else:   # a run-time head dim (one kernel per padded class), a multiple of ALIGN_DQ
        D_Q = d_q // ALIGN_DQ * ALIGN_DQ
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_DQ)
    if IS_VARLEN:
        n_cu = tl.num_programs(1) // H + 1
        offsets_bad = _group_offsets_bad(n_cu, CU_Q, ROWS_Q, SEQ_Q, CU_K, ROWS_K, LONG_K, SEQLENS_K, True, HAS_SEQLENS,
                                         256)
        if offsets_bad:
            _nan_lines(DQ, ROWS_Q, H, sds, sdh, D_Q, pid_m + tl.num_programs(0) * bh,
                       tl.num_programs(0) * tl.num_programs(1), 16, BLOCK_DQ)
            return
        q_start = tl.load(CU_Q + b).to(tl.int64)
        seqlen_q = tl.load(CU_Q + b + 1) - q_start
        msk = (rows[:, None] < seqlen_q) & (offs_d[None, :] < D_Q)
        x = tl.load(DQA + q_start * sas + h * sah + rows[:, None] * sas + offs_d[None, :], mask=msk, other=0.0)
        tl.store(DQ + q_start * sds + h * sdh + rows[:, None] * sds + offs_d[None, :],
                 x.to(DQ.dtype.element_ty), mask=msk)
    else:
        msk = (rows[:, None] < SEQ_Q) & (offs_d[None, :] < D_Q)
        x = tl.load(DQA + b * sab + h * sah + rows[:, None] * sas + offs_d[None, :], mask=msk, other=0.0)
        tl.store(DQ + b * sdb + h * sdh + rows[:, None] * sds + offs_d[None, :],
                 x.to(DQ.dtype.element_ty), mask=msk)


# ----------------------------------------------------------------------------
# decode: split-KV (optionally paged) + combine
# ----------------------------------------------------------------------------
@triton.jit
def fmha_fwd_splitkv_kernel(
    Q, K, V, OACC, LACC, BLOCK_TABLE, SEQLENS_K,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs,
    sob, soh, sos, sosp, slb, slh, sls, sbt,
    HKV, GROUP, SEQ_Q, SEQ_K, CHUNK,
    scale2, cap_in, cap_out, left, right, SINK, n_sink, ERR, CAP, n_pages, page_size, page_shift,
    d_q, d_v, ALIGN_DQ: tl.constexpr, ALIGN_DV: tl.constexpr, BLOCK_DQ: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGED: tl.constexpr,
    MASK_MODE: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    HAS_SEQLENS: tl.constexpr, HAS_SINK: tl.constexpr = False, HAS_SINK_LOGIT: tl.constexpr = False,
    DIRECT: tl.constexpr = False,
):
    """One KV chunk [split*CHUNK, (split+1)*CHUNK) of one (batch, kv head).  The
    M rows are the GROUP*SEQ_Q query rows that share the kv head (GQA packed
    into M), so K/V are read once per group.  With PAGED > 0, K/V are the
    page pool [num_pages, page_size, HK, D] (page_size = 1 << page_shift, run-time; PAGED 1: pages of whole
    BLOCK_N tiles, 2: smaller) (skb/svb: page stride, sks/svs:
    slot stride) addressed through BLOCK_TABLE[b, page].  Writes the chunk's
    normalised partial output (fp32) and its log2-domain LSE.  HAS_SINK: the first n_sink
    keys stay visible past the window's left edge; HAS_SINK_LOGIT: SINK [H] joins split 0's
    softmax denominator (once, so the combine counts it once).  HAS_SEQLENS: SEQLENS_K[b] outside
    [0, CAP] (CAP: the keys the cache or the block table holds) is clamped, sets ERR and makes the
    batch's partial outputs NaN (see _checked_len).  DIRECT (one split: the whole key range):
    OACC / LACC are the final o (its dtype; sosp 0) and lse [B, H, Sq] (natural log), so the plan
    needs no combine launch.  With PAGED > 0 every page index the program reads is checked
    against the pool (n_pages): one outside it is not read (page 0 stands in), the program's outputs
    become NaN and BAD_PAGES (8) is ORed into ERR, so a page table needs no guard launch of its own."""
    if ALIGN_DQ == 0:   # the head dim fills its blocks: a compile-time constant
        D_Q: tl.constexpr = BLOCK_DQ
    else:   # a run-time head dim (one kernel per padded class), a multiple of ALIGN_DQ
        D_Q = d_q // ALIGN_DQ * ALIGN_DQ
    if ALIGN_DV == 0:   # the head dim fills its blocks: a compile-time constant
        D_V: tl.constexpr = BLOCK_DV
    else:   # a run-time head dim (one kernel per padded class), a multiple of ALIGN_DV
        D_V = d_v // ALIGN_DV * ALIGN_DV
    split = tl.program_id(0)
    bhk = tl.program_id(1)
    pid_m = tl.program_id(2)
    b = bhk // HKV
    hk = bhk % HKV
    b64 = b.to(tl.int64)
    if HAS_SEQLENS:
        seqlen_k, len_bad = _checked_len(tl.load(SEQLENS_K + b), CAP, ERR)
    else:
        seqlen_k = SEQ_K
        len_bad = False
    if BOTTOM_RIGHT:
        off = seqlen_k - SEQ_Q
    else:
        off = 0
    r = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    g = r // SEQ_Q
    qi = r % SEQ_Q
    h = hk * GROUP + g
    rvalid = r < GROUP * SEQ_Q
    offs_n = tl.arange(0, BLOCK_N)
    offs_dq = tl.arange(0, BLOCK_DQ)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = tl.load(Q + b64 * sqb + h.to(tl.int64)[:, None] * sqh + qi[:, None] * sqs + offs_dq[None, :],
                mask=rvalid[:, None] & (offs_dq[None, :] < D_Q), other=0.0)
    dtype = q.dtype
    n_lo = split * CHUNK
    n_hi = tl.minimum(n_lo + CHUNK, seqlen_k)
    if HAS_SINK_LOGIT:
        sk2 = tl.load(SINK + h, mask=rvalid, other=0.0).to(tl.float32) * 1.4426950408889634
        m_i = tl.where(split == 0, sk2, float("-inf"))
        l_i = tl.where(split == 0, 1.0, 0.0) + tl.zeros([BLOCK_M], dtype=tl.float32)
    else:
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    page_bad = tl.zeros([], dtype=tl.int32)
    for start_n in tl.range(n_lo, n_hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        cmask = cols < n_hi
        if PAGED > 0:
            if PAGED == 1:
                page = tl.load(BLOCK_TABLE + b64 * sbt + (start_n >> page_shift)).to(tl.int64)
                outside = (page < 0) | (page >= n_pages)
                page_bad = page_bad | outside.to(tl.int32)
                page = tl.where(outside, 0, page)
                slot = (start_n & (page_size - 1)) + offs_n
                kp = K + page * skb + hk * skh + slot[:, None] * sks + offs_dq[None, :]
                vp = V + page * svb + hk * svh + slot[:, None] * svs + offs_dv[None, :]
            else:
                page = tl.load(BLOCK_TABLE + b64 * sbt + (cols >> page_shift), mask=cmask, other=0).to(tl.int64)
                outside = cmask & ((page < 0) | (page >= n_pages))
                page_bad = page_bad | tl.max(outside.to(tl.int32), axis=0)
                page = tl.where(outside, 0, page)
                slot = cols & (page_size - 1)
                kp = K + page[:, None] * skb + hk * skh + slot[:, None] * sks + offs_dq[None, :]
                vp = V + page[:, None] * svb + hk * svh + slot[:, None] * svs + offs_dv[None, :]
        else:
            kp = K + b64 * skb + hk * skh + cols[:, None] * sks + offs_dq[None, :]
            vp = V + b64 * svb + hk * svh + cols[:, None] * svs + offs_dv[None, :]
        k = tl.load(kp, mask=cmask[:, None] & (offs_dq[None, :] < D_Q), other=0.0)
        qk = tl.dot(q, tl.trans(k))
        if HAS_SOFTCAP:
            qk = _tanh(qk * cap_in) * cap_out
        else:
            qk = qk * scale2
        ok = cmask[None, :] & rvalid[:, None]
        if HAS_SINK:
            ok = ok & _visible_sink(qi, cols, off, left, right, n_sink, MASK_MODE)
        elif MASK_MODE != 0:
            ok = ok & _visible(qi, cols, off, left, right, MASK_MODE)
        qk = tl.where(ok, qk, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        m_sub = tl.where(m_ij == float("-inf"), 0.0, m_ij)
        p = tl.math.exp2(qk - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = tl.load(vp, mask=cmask[:, None] & (offs_dv[None, :] < D_V), other=0.0)
        acc = tl.dot(p.to(dtype), v, acc)
        m_i = m_ij
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    acc = acc / l_safe[:, None]
    lse2 = m_i + tl.math.log2(l_i)
    if len_bad:   # a wrong length must not pass for a result
        acc = acc + float("nan")
        lse2 = lse2 + float("nan")
    if PAGED > 0:
        if page_bad != 0:   # nor a page outside the pool (none was read)
            tl.atomic_or(ERR, 8)
            acc = acc + float("nan")
            lse2 = lse2 + float("nan")
    hq = h.to(tl.int64)
    if DIRECT:   # the final outputs: o in its dtype, lse in the natural log
        tl.store(OACC + b64 * sob + hq[:, None] * soh + qi[:, None] * sos + offs_dv[None, :],
                 acc.to(OACC.dtype.element_ty), mask=rvalid[:, None] & (offs_dv[None, :] < D_V))
        tl.store(LACC + b64 * slb + hq * slh + qi * sls, lse2 * 0.6931471805599453, mask=rvalid)
    else:
        tl.store(OACC + b64 * sob + hq[:, None] * soh + qi[:, None] * sos + split * sosp + offs_dv[None, :],
                 acc, mask=rvalid[:, None] & (offs_dv[None, :] < D_V))
        tl.store(LACC + b64 * slb + hq * slh + qi * sls + split, lse2, mask=rvalid)


@triton.jit
def fmha_fwd_splitkv_combine_kernel(
    OACC, LACC, O, LSE,
    sob, soh, sos, sosp, slb, slh, sls, s_ob, s_oh, s_os, s_lb, s_lh,
    H, SEQ_Q, NUM_SPLITS,
    d_v, ALIGN_DV: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_S: tl.constexpr, STORE_LSE: tl.constexpr,
):
    """Merge the split partials of one query row through their LSEs."""
    if ALIGN_DV == 0:   # the head dim fills its blocks: a compile-time constant
        D_V: tl.constexpr = BLOCK_DV
    else:   # a run-time head dim (one kernel per padded class), a multiple of ALIGN_DV
        D_V = d_v // ALIGN_DV * ALIGN_DV
    row = tl.program_id(0)
    b = (row // (H * SEQ_Q)).to(tl.int64)
    h = ((row // SEQ_Q) % H).to(tl.int64)
    qi = row % SEQ_Q
    s = tl.arange(0, BLOCK_S)
    smask = s < NUM_SPLITS
    offs_d = tl.arange(0, BLOCK_DV)
    l = tl.load(LACC + b * slb + h * slh + qi * sls + s, mask=smask, other=float("-inf"))
    mx = tl.max(l, 0)
    mx_s = tl.where(mx == float("-inf"), 0.0, mx)
    w = tl.math.exp2(l - mx_s)
    tot = tl.sum(w, 0)
    o = tl.load(OACC + b * sob + h * soh + qi * sos + s[:, None] * sosp + offs_d[None, :],
                mask=smask[:, None] & (offs_d[None, :] < D_V), other=0.0)
    out = tl.sum(w[:, None] * o, 0) / tl.where(tot == 0.0, 1.0, tot)
    tl.store(O + b * s_ob + h * s_oh + qi * s_os + offs_d, out.to(O.dtype.element_ty), mask=offs_d < D_V)
    if STORE_LSE:
        tl.store(LSE + b * s_lb + h * s_lh + qi, (mx + tl.math.log2(tot)) * 0.6931471805599453)


# ----------------------------------------------------------------------------
# append-KV (+ RoPE)
# ----------------------------------------------------------------------------
@triton.jit
def _rope_rows(X, pos, COS, SIN, scs, rotary_dim, dmask, rmask,
               BLOCK_D: tl.constexpr, ROPE: tl.constexpr):
    """Rows ``X + rows * stride`` (already offset) of [BLOCK_M, BLOCK_D] in fp32, rotated by RoPE at
    positions ``pos`` [BLOCK_M] over the first rotary_dim channels.  ROPE: 0 none, 1 interleaved
    (pairs 2i, 2i+1), 2 half-rotated (pairs i, i + rotary_dim/2).  ``X`` is a [BLOCK_M, 1] row pointer."""
    d = tl.arange(0, BLOCK_D)
    m = rmask[:, None] & dmask[None, :]
    x = tl.load(X + d[None, :], mask=m, other=0.0).to(tl.float32)
    if ROPE != 0:
        half = rotary_dim // 2
        rot = d < rotary_dim
        if ROPE == 1:
            partner = d ^ 1
            ang = d // 2
            first = (d % 2) == 0
        else:
            first = d < half
            partner = tl.where(first, d + half, d - half)
            ang = tl.where(first, d, d - half)
        mr = rmask[:, None] & rot[None, :]
        xp = tl.load(X + partner[None, :], mask=mr, other=0.0).to(tl.float32)
        cp = pos.to(tl.int64)[:, None] * scs + ang[None, :]
        c = tl.load(COS + cp, mask=mr, other=1.0).to(tl.float32)
        s = tl.load(SIN + cp, mask=mr, other=0.0).to(tl.float32)
        sgn = tl.where(first, -1.0, 1.0)
        x = tl.where(rot[None, :], x * c + sgn[None, :] * xp * s, x)
    return x


@triton.jit
def fmha_fwd_appendkv_kernel(
    Q, KNEW, VNEW, QR, KC, VC, COS, SIN, SEQLENS_K, BLOCK_TABLE,
    sqb, sqh, sqs, sknb, sknh, skns, svnb, svnh, svns, sqrb, sqrh, sqrs,
    skcb, skch, skcs, svcb, svch, svcs, sbt, scs,
    H, HK, SEQ_Q, SEQ_KNEW, rotary_dim, ERR, CAP, page_size, page_shift,
    d_q, d_v, ALIGN_DQ: tl.constexpr, ALIGN_DV: tl.constexpr, BLOCK_DQ: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, PAGED: tl.constexpr, ROPE: tl.constexpr,
):
    """CK's append-KV: program (m, b, h) with h < H rotates query rows [m*BLOCK_M, ..) of head h into
    QR (rows sit at positions seqlens_k[b] + i); h >= H writes knew/vnew rows of kv head h - H into
    the caches at positions seqlens_k[b] + i (knew rotated).  With PAGED > 0 (page_size = 1 << page_shift, run-time) the caches are the
    page pools (skcb/svcb: page stride, sk?s: slot stride) addressed through BLOCK_TABLE[b, pos // P].
    seqlens_k[b] outside [0, CAP - SEQ_KNEW] (CAP: the positions the cache or block table holds) sets
    ERR, writes nothing to the caches and NaN to the batch's QR rows (see _checked_len)."""
    if ALIGN_DQ == 0:   # the head dim fills its blocks: a compile-time constant
        D_Q: tl.constexpr = BLOCK_DQ
    else:   # a run-time head dim (one kernel per padded class), a multiple of ALIGN_DQ
        D_Q = d_q // ALIGN_DQ * ALIGN_DQ
    if ALIGN_DV == 0:   # the head dim fills its blocks: a compile-time constant
        D_V: tl.constexpr = BLOCK_DV
    else:   # a run-time head dim (one kernel per padded class), a multiple of ALIGN_DV
        D_V = d_v // ALIGN_DV * ALIGN_DV
    pid_m = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    b64 = b.to(tl.int64)
    base, len_bad = _checked_len(tl.load(SEQLENS_K + b), CAP - SEQ_KNEW, ERR)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dq = tl.arange(0, BLOCK_DQ)
    dv = tl.arange(0, BLOCK_DV)
    pos = base + rows
    if h < H:
        rmask = rows < SEQ_Q
        h64 = h.to(tl.int64)
        x = _rope_rows(Q + b64 * sqb + h64 * sqh + rows[:, None].to(tl.int64) * sqs, pos, COS, SIN, scs,
                       rotary_dim, dq < D_Q, rmask, BLOCK_DQ, ROPE)
        if len_bad:
            x = x + float("nan")
        tl.store(QR + b64 * sqrb + h64 * sqrh + rows[:, None].to(tl.int64) * sqrs + dq[None, :],
                 x.to(QR.dtype.element_ty), mask=rmask[:, None] & (dq[None, :] < D_Q))
    else:
        hk = (h - H).to(tl.int64)
        rmask = rows < tl.where(len_bad, 0, SEQ_KNEW)
        r64 = rows[:, None].to(tl.int64)
        k = _rope_rows(KNEW + b64 * sknb + hk * sknh + r64 * skns, pos, COS, SIN, scs,
                       rotary_dim, dq < D_Q, rmask, BLOCK_DQ, ROPE)
        v = tl.load(VNEW + b64 * svnb + hk * svnh + r64 * svns + dv[None, :],
                    mask=rmask[:, None] & (dv[None, :] < D_V), other=0.0)
        if PAGED > 0:
            page = tl.load(BLOCK_TABLE + b64 * sbt + (pos >> page_shift), mask=rmask, other=0).to(tl.int64)
            slot = (pos & (page_size - 1)).to(tl.int64)
            kdst = KC + page[:, None] * skcb + hk * skch + slot[:, None] * skcs
            vdst = VC + page[:, None] * svcb + hk * svch + slot[:, None] * svcs
        else:
            p64 = pos[:, None].to(tl.int64)
            kdst = KC + b64 * skcb + hk * skch + p64 * skcs
            vdst = VC + b64 * svcb + hk * svch + p64 * svcs
        tl.store(kdst + dq[None, :], k.to(KC.dtype.element_ty), mask=rmask[:, None] & (dq[None, :] < D_Q))
        tl.store(vdst + dv[None, :], v.to(VC.dtype.element_ty), mask=rmask[:, None] & (dv[None, :] < D_V))


# What the kernels specialise on (ck_core.backends.triton_artifacts.specialisation): padded head
# dims (BLOCK_D?, BLOCK_D?2), tiles, masks and features are constexprs; the head dims d_q / d_v are
# run-time integers with a constexpr class ALIGN_D? (configs.hdim_align: 0 when the head dim fills its
# blocks -- it is then the constant BLOCK_D? + BLOCK_D?2 and the masks fold, the code of a fixed head
# dim -- else the power of two up to 16 dividing it, which keeps the masked loads as wide), so 40 and
# 56, or 59 and 61, run one kernel; sizes (batch, heads, GQA group, sequence lengths, window edges,
# split counts) are run-time integers: none of them feeds a vectorised access (rows are masked
# whole), so one compiled kernel serves every shape.  The strides of Q, K, V, O and their gradients are the alignment class, one per tensor
# (all divisible by 16 or not: 16-byte rows), never the constant 1 (no kernel here reads a unit
# stride: the head dim is contiguous by contract).  Strides of per-row and per-element tensors
# (LSE, delta, bias, dbias, ALiBi slopes, random values, block tables, rotary tables) are
# run-time: their accesses are masked by run-time lengths and do not vectorise either way.
_RUNTIME = ("d_q", "d_v", "page_size", "page_shift", "H", "HK", "HKV", "GROUP", "GSPLIT", "SEQ", "SEQ_Q", "SEQ_K", "SEQ_KNEW", "CHUNK", "CAP",
            "NUM_SPLITS", "left", "right", "n_sink", "rotary_dim", "N", "G",
            "slb", "slh", "sls", "sdlh", "s_lb", "s_lh", "sab", "sbb", "sbh", "sbq", "sbk", "sdbb", "sdbh",
            "sdbq", "srb", "srh", "srq", "sbt", "scs", "ROWS_Q", "ROWS_K", "LONG_K")
_SCALARS = ("scale2", "cap_in", "cap_out", "drop_scale", "sm_scale", "v_descale")


def _apply_policy():
    from ck_core.backends.triton_artifacts import specialisation

    for fn in (fmha_fwd_kernel, fmha_v_transpose_kernel, fmha_dropout_randval_kernel, fmha_bwd_dot_do_o_kernel,
               fmha_bwd_dq_dk_dv_kernel, fmha_bwd_dq_kernel, fmha_bwd_sum_partials_kernel,
               fmha_bwd_convert_dq_kernel, fmha_fwd_splitkv_kernel, fmha_fwd_splitkv_combine_kernel,
               fmha_fwd_appendkv_kernel):
        names = [p.name for p in getattr(fn, "params", ()) if not p.is_constexpr and p.name not in _PHILOX_ARGS]
        runtime = [n for n in names if n in _RUNTIME and not (fn is fmha_bwd_convert_dq_kernel and n == "sab")]
        strides = [n for n in names if n[0] == "s" and n not in runtime and n not in _SCALARS]
        groups: dict = {}
        for n in strides:   # one tensor's strides: sq{b,h,s}, sk{b,h,s,p,d}, sdo{b,h,s}, s_o{b,h,s}, ...
            groups.setdefault(n[:-1], []).append(n)
        specialisation(runtime=runtime, groups=list(groups.values()))(fn)


_apply_policy()
