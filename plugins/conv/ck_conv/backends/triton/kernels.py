"""Triton implicit-GEMM kernels for grouped convolution (channels-last, NDHWGC).

Every problem is seen as 3D: a 1D problem has D = H = 1, a 2D one D = 1, so one
kernel per direction serves all three spatial ranks.  Tensors are contiguous:

* input  ``x``  (N, Di, Hi, Wi, G, C)   -- C, K are per group here
* weight ``w``  (G, K, Z, Y, X, C)
* output ``y``  (N, Do, Ho, Wo, G, K)

GEMM views (per group, CK's mapping):

* forward:    M = N*Do*Ho*Wo, N = K, reduction = taps x C
* bwd_data:   M = N*Di*Hi*Wi (split into stride residue classes), N = C,
              reduction = (taps valid for the class) x K
* bwd_weight: M = K, N = C (one filter tap per program column), reduction =
              N*Do*Ho*Wo, split over ``SPLIT_K`` programs that add into an fp32
              workspace

Split reductions (program axis 2, or part of it for bwd_data) combine their
partial sums as ``ATOMIC`` (fp32 atomics into a zeroed workspace of the
output's shape; ``ATOMIC == 2`` relaxed, else Triton's default acq_rel) or as
``WS`` says: 1 and 2 write each split's partial with plain stores into a
``[split, *output]`` fp32 workspace (``WS_STRIDE`` elements per split), then
1 leaves the sum to :func:`splitk_reduce_kernel` (two-stage) and 2 lets the
last program to finish each output tile sum the partials in split order and
write the result (a per-tile arrival counter in ``cnt_ptr``, reset by that
program); both are deterministic.  3 adds relaxed atomics into a persistent
zeroed fp32 buffer of the output's size, and the last program of each tile
casts the sum out and zeroes the buffer and its counter again (one launch for
any split; not deterministic).  ``STREAMK`` (forward, bwd_data): a 1-D grid of
persistent programs, each walking IT_CHUNK steps of the flattened (tile, step)
space; a tile cut between programs is finished like WS == 2.

bwd_data has two kernels: ``conv_bwd_data_kernel`` reads each step's tap and dy
offset from a residue table, ``conv_bwd_data_tm_kernel`` (tap bits, stream-K,
merged groups) carries them as counters from a per-class table of arithmetic
runs, with the forward kernel's closed-form tap bits.  ``GM`` (forward,
bwd_data tm) computes GM groups as one GEMM with a block-diagonal weight tile.

``SPEC`` is CK's convolution specialisation: 0 default, 1 filter1x1_stride1_pad0
(input pixel = output pixel, no index arithmetic), 2 filter1x1_pad0 (one tap,
never out of bounds).  3x3 filters use the default path.

Depthwise problems (C = K = 1 per group) are not GEMMs; ``dw_*`` kernels do
them directly, vectorised across groups (bwd_weight's is generated per filter
size by :mod:`ck_conv.backends.triton.dw_codegen`); ``dw_flat_kernel`` tiles rows x a flat
(W, G) span instead, for contiguous 16-byte loads whatever G is.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _dot_prec(a, b, acc, IEEE: tl.constexpr):
    # IEEE: 0 tensor cores at the input precision, 1 fp32 operands in full fp32,
    # 2 upcast first (the CPU interpreter's dot misreads bf16 operands)
    if IEEE == 2:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    elif IEEE == 1:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _inside(i, n):
    return (i >= 0) & (i < n)


@triton.jit
def _divmod(x, d, inv, FAST: tl.constexpr):
    # x // d, x % d for 0 <= x < 2**24 through an fp32 reciprocal and one correction
    # (several times cheaper than integer division by a run-time value)
    if FAST:
        q = (x.to(tl.float32) * inv).to(tl.int32)
        r = x - q * d
        q = tl.where(r >= d, q + 1, q)
        r = tl.where(r >= d, r - d, r)
        q = tl.where(r < 0, q - 1, q)
        r = tl.where(r < 0, r + d, r)
        return q, r
    else:
        return x // d, x % d


@triton.jit
def _tap_range(i0, n, f, dl):
    """(first, count) of the taps t in [0, f) with 0 <= i0 + t*dl < n (dl >= 1)."""
    lo = tl.minimum(tl.where(i0 >= 0, 0, (dl - 1 - i0) // dl), f)
    hi = tl.where(n - 1 - i0 >= 0, tl.minimum(f - 1, (n - 1 - i0) // dl), -1)
    return lo, tl.maximum(hi - lo + 1, 0)


@triton.jit
def _box_bits(zlo, zc, ylo, yc, xlo, xc, NY, NX):
    """Bits of the box [zlo, zlo+zc) x [ylo, ylo+yc) x [xlo, xlo+xc) of taps numbered
    t = (z*NY + y)*NX + x (NY*NZ*NX <= 31): a run of x bits repeated at every y of the
    box (a geometric series in 2**NX) and that at every z (in 2**(NY*NX))."""
    one = tl.full(zlo.shape, 1, tl.int64)
    nx = tl.maximum(NX, 1)
    nyx = tl.maximum(NY * NX, 1)
    xb = ((one << xc) - 1) << xlo
    sy = (((one << (yc * nx)) - 1) // ((1 << nx) - 1)) << (ylo * nx)
    sz = (((one << (zc * nyx)) - 1) // ((1 << nyx) - 1)) << (zlo * nyx)
    return (xb * sy * sz).to(tl.int32)


@triton.jit
def _tap_bits(id0, ih0, iw0, Di, Hi, Wi, FZ, FY, FX, dd, dh, dw):
    """Bit t = (fz*FY + fy)*FX + fx set where tap t reads inside the image (T <= 31):
    the valid taps form a box, so the mask is a run of x bits repeated at every
    valid y (a geometric series in 2**FX) and that at every valid z."""
    zlo, zc = _tap_range(id0, Di, FZ, dd)
    ylo, yc = _tap_range(ih0, Hi, FY, dh)
    xlo, xc = _tap_range(iw0, Wi, FX, dw)
    return _box_bits(zlo, zc, ylo, yc, xlo, xc, FY, FX)


@triton.jit
def _epilogue(out_ptr, fin_ptr, cnt_ptr, offs, msk, acc, s, nspl, tile, WS_STRIDE,
              ATOMIC: tl.constexpr, WS: tl.constexpr):
    """Write one program's accumulator: directly, by atomics, or as split ``s``'s
    partial (WS == 2, 3: and finish the tile if this program arrived last)."""
    if WS == 0:
        if ATOMIC == 2:
            # no ordering needed: the sum is read after the kernel ends
            tl.atomic_add(out_ptr + offs, acc, mask=msk, sem="relaxed")
        elif ATOMIC:
            tl.atomic_add(out_ptr + offs, acc, mask=msk)  # tl's default: acq_rel
        else:
            tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=msk)
    elif WS == 3:
        # relaxed atomics into a persistent zeroed fp32 buffer; the tile's last
        # program casts the sum out and zeroes the buffer again (one launch, any split)
        tl.atomic_add(out_ptr + offs, acc, mask=msk, sem="relaxed")
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == nspl - 1:
            tot = tl.load(out_ptr + offs, mask=msk, other=0.0, cache_modifier=".cg")
            tl.store(fin_ptr + offs, tot.to(fin_ptr.dtype.element_ty), mask=msk)
            tl.store(out_ptr + offs, tl.zeros_like(tot), mask=msk)
            tl.atomic_xchg(cnt_ptr + tile, 0)
    else:
        tl.store(out_ptr + s * WS_STRIDE + offs, acc, mask=msk)
        if WS == 2:
            # every thread's partial is stored before one thread's acq_rel arrival
            # (bar.sync + release at gpu scope, as a grid barrier does)
            tl.debug_barrier()
            arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if arrived == nspl - 1:
                tot = tl.zeros_like(acc)
                for j in range(0, nspl):
                    # .cg: read at L2, where the other programs' stores are
                    tot += tl.load(out_ptr + j * WS_STRIDE + offs, mask=msk, other=0.0, cache_modifier=".cg")
                tl.store(fin_ptr + offs, tot.to(fin_ptr.dtype.element_ty), mask=msk)
                tl.atomic_xchg(cnt_ptr + tile, 0)  # ready for the next launch


@triton.jit
def splitk_reduce_kernel(ws_ptr, out_ptr, NUMEL, NSPL, BLOCK: tl.constexpr):
    """Second stage of a two-stage split reduction: out = sum over splits of ws, cast."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < NUMEL
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in range(0, NSPL):
        acc += tl.load(ws_ptr + j * NUMEL + offs, mask=m, other=0.0)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _fwd_tile(x_ptr, w_ptr, pid, g, lo, hi,
              M, Di, Hi, Wi, Do, Ho, Wo, C, K, CS,
              sd, sh, sw, pd, ph, pw, dd, dh, dw, FZ, FY, FX,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              SPEC: tl.constexpr, EVEN_C: tl.constexpr, IEEE: tl.constexpr, TAPMASK: tl.constexpr,
              GM: tl.constexpr, NCHW: tl.constexpr):
    """Output tile ``pid`` of group block ``g`` summed over the reduction steps [lo, hi)
    (a step = one (tap, channel block)); returns (acc, offs_m, offs_n, mask_m, mask_n).

    NCHW: x is NGC(D)HW and w GKC(ZYX) (torch's default memory format, read in place): a pixel
    moves by 1 and a channel by the image's D*H*W (a weight's channel by its taps) instead of
    the channels-last strides (a pixel by CS, a channel by 1).

    GM > 1 merges GM groups into one dense GEMM of GM*C inputs and GM*K outputs
    whose weight tile is block diagonal (off-diagonal blocks masked to zero): a
    pixel's GM*C channels load as one contiguous row (BLOCK_K a multiple of C)."""
    CV = C * GM
    KV = K * GM
    num_n = tl.cdiv(KV, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < KV
    T = FZ * FY * FX
    if NCHW:   # weight channel stride T, tap stride 1; image channel stride D*H*W, pixel stride 1
        WC = T
        WT = 1
        XC = Di * Hi * Wi
        XP = 1
    else:      # weight channel stride 1, tap stride C; image channel stride 1, pixel stride CS
        WC = 1
        WT = C
        XC = 1
        XP = CS
    if GM == 1:
        w_base = w_ptr + g * K * T * C + offs_n[None, :] * (T * C) + offs_k[:, None] * WC
    else:
        # w[g*GM + n//K, n%K, tap, c%C] = w_flat[(g*KV + n)*T*C + tap*C + c%C] where c//C == n//K
        w_base = w_ptr + (g * KV + offs_n)[None, :] * (T * C) + (offs_k % C)[:, None] * WC
        k_grp = offs_k // C
        n_grp = offs_n // K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    nkc = tl.cdiv(CV, BLOCK_K)
    if SPEC == 1:
        if NCHW:   # 1x1, stride 1, no padding: input pixel = output pixel
            a_base = x_ptr + ((offs_m // XC) * (CS * XC) + offs_m % XC)[:, None] + ((g * CV + offs_k) * XC)[None, :]
        else:
            a_base = x_ptr + offs_m[:, None] * CS + g * CV + offs_k[None, :]
        for kc in range(lo, hi):
            c0 = kc * BLOCK_K
            if GM == 1:
                b_ptrs = w_base + c0 * WC
                b_msk = mask_n[None, :]
            else:
                b_ptrs = w_base
                b_msk = mask_n[None, :] & ((kc * (BLOCK_K // C) + k_grp)[:, None] == n_grp[None, :])
            if EVEN_C:
                a = tl.load(a_base + c0 * XC, mask=mask_m[:, None], other=0.0)
                b = tl.load(b_ptrs, mask=b_msk, other=0.0)
            else:
                ck = (c0 + offs_k) < CV
                a = tl.load(a_base + c0 * XC, mask=mask_m[:, None] & ck[None, :], other=0.0)
                b = tl.load(b_ptrs, mask=ck[:, None] & b_msk, other=0.0)
            acc = _dot_prec(a, b, acc, IEEE)
    else:
        ow = offs_m % Wo
        t = offs_m // Wo
        oh = t % Ho
        t = t // Ho
        od = t % Do
        n = t // Do
        id0 = od * sd - pd
        ih0 = oh * sh - ph
        iw0 = ow * sw - pw
        # a tap moves every input pixel by the same linear offset, so the pointer
        # tensor is built once and each step adds a scalar; only the bounds mask is
        # per row
        if NCHW:
            a_base = (x_ptr + (n * (CS * XC) + (id0 * Hi + ih0) * Wi + iw0)[:, None]
                      + ((g * CV + offs_k) * XC)[None, :])
        else:
            pix0 = ((n * Di + id0) * Hi + ih0) * Wi + iw0
            a_base = x_ptr + pix0[:, None] * CS + g * CV + offs_k[None, :]
        if TAPMASK:
            # closed form, no loop: a loop-carried tensor would pin a layout that
            # costs a shared-memory round trip per step to convert
            vbits = tl.where(mask_m, _tap_bits(id0, ih0, iw0, Di, Hi, Wi, FZ, FY, FX, dd, dh, dw), 0)
        # (tap, channel block) advance as counters carried through the loop: no
        # division by run-time values inside it
        tap = lo // nkc
        kc = lo - tap * nkc
        fx = tap % FX
        fy = (tap // FX) % FY
        fz = tap // (FX * FY)
        for it in range(lo, hi):
            c0 = kc * BLOCK_K
            toff = ((fz * dd) * Hi + fy * dh) * Wi + fx * dw
            if SPEC == 2:
                valid = mask_m
            elif TAPMASK:
                valid = ((vbits >> tap) & 1) != 0
            else:
                valid = mask_m & _inside(id0 + fz * dd, Di) & _inside(ih0 + fy * dh, Hi) & _inside(iw0 + fx * dw, Wi)
            a_ptrs = a_base + (toff * XP + c0 * XC)
            if GM == 1:
                b_ptrs = w_base + tap * WT + c0 * WC
                b_msk = mask_n[None, :]
            else:
                b_ptrs = w_base + tap * WT
                b_msk = mask_n[None, :] & ((kc * (BLOCK_K // C) + k_grp)[:, None] == n_grp[None, :])
            if EVEN_C:
                a = tl.load(a_ptrs, mask=valid[:, None], other=0.0)
                b = tl.load(b_ptrs, mask=b_msk, other=0.0)
            else:
                ck = (c0 + offs_k) < CV
                a = tl.load(a_ptrs, mask=valid[:, None] & ck[None, :], other=0.0)
                b = tl.load(b_ptrs, mask=ck[:, None] & b_msk, other=0.0)
            acc = _dot_prec(a, b, acc, IEEE)
            kc += 1
            wrap = kc == nkc
            kc = tl.where(wrap, 0, kc)
            tap = tl.where(wrap, tap + 1, tap)
            fx = tl.where(wrap, fx + 1, fx)
            wrap = fx == FX
            fx = tl.where(wrap, 0, fx)
            fy = tl.where(wrap, fy + 1, fy)
            wrap = fy == FY
            fy = tl.where(wrap, 0, fy)
            fz = tl.where(wrap, fz + 1, fz)
    return acc, offs_m, offs_n, mask_m, mask_n


@triton.jit
def _y_offs(offs_m, offs_n, k0, KS, P, NCHW: tl.constexpr):
    """Offsets of output rows ``offs_m`` (image-major pixels, P per image) x channels ``k0 + offs_n``:
    NGK(D)HW when NCHW (a channel moves by P), else N(D)HWGK (a pixel moves by KS)."""
    if NCHW:
        return ((offs_m // P) * (KS * P) + offs_m % P)[:, None] + ((k0 + offs_n) * P)[None, :]
    return offs_m[:, None] * KS + k0 + offs_n[None, :]


@triton.jit
def _streamk_epilogue(ws_ptr, fin_ptr, cnt_ptr, offs, msk, acc, p, tile, steps, CHUNK, WS_STRIDE):
    """Write a stream-K program's share of ``tile``: directly when the program
    covered the whole tile, else as partial number p - first of the programs that
    share it, the last of which to arrive sums them in order (``fixup``)."""
    first = (tile * steps) // CHUNK
    nspl = ((tile + 1) * steps - 1) // CHUNK - first + 1
    if nspl == 1:
        tl.store(fin_ptr + offs, acc.to(fin_ptr.dtype.element_ty), mask=msk)
    else:
        _epilogue(ws_ptr, fin_ptr, cnt_ptr, offs, msk, acc, p - first, nspl, tile, WS_STRIDE, 0, 2)


@triton.jit
def conv_fwd_kernel(
    x_ptr, w_ptr, y_ptr, fin_ptr, cnt_ptr,
    M, Di, Hi, Wi, Do, Ho, Wo, C, K, CS, KS,
    sd, sh, sw, pd, ph, pw, dd, dh, dw, FZ, FY, FX, IT_CHUNK, WS_STRIDE,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPEC: tl.constexpr, EVEN_C: tl.constexpr, IEEE: tl.constexpr, ATOMIC: tl.constexpr,
    WS: tl.constexpr, TAPMASK: tl.constexpr, STREAMK: tl.constexpr, GM: tl.constexpr, NCHW: tl.constexpr,
):
    # NCHW: x, w and y in torch's default memory format, read and written in place (see _fwd_tile)
    # CS = G*C (input pixel stride), KS = G*K (output pixel stride); program axis 2
    # splits the reduction into IT_CHUNK (tap, channel-block) steps, summed with
    # fp32 atomics when ATOMIC, through a workspace when WS.  TAPMASK: bit t of
    # vbits[row] says whether tap t reads inside the image, built once before the
    # loop, so that a step's row mask is a shift and an and.  STREAMK: a 1-D grid of
    # persistent programs, program p walks steps [p*IT_CHUNK, (p+1)*IT_CHUNK) of the
    # flattened (group, tile, step) space (y_ptr: the [split, *y] fp32 partials).
    # GM > 1: program axis 1 (stream-K: the group index) walks blocks of GM groups
    # computed as one block-diagonal GEMM (see _fwd_tile).
    nkc = tl.cdiv(C * GM, BLOCK_K)
    if SPEC == 1:
        steps = nkc
    else:
        steps = FZ * FY * FX * nkc
    if STREAMK:
        p = tl.program_id(0)
        ntile = tl.cdiv(M, BLOCK_M) * tl.cdiv(K * GM, BLOCK_N)
        total = ntile * (CS // (C * GM)) * steps
        it0 = p * IT_CHUNK
        it1 = tl.minimum(it0 + IT_CHUNK, total)
        for tile in range(it0 // steps, (it1 - 1) // steps + 1):
            base = tile * steps
            g = tile // ntile
            acc, offs_m, offs_n, mask_m, mask_n = _fwd_tile(
                x_ptr, w_ptr, tile - g * ntile, g, tl.maximum(it0 - base, 0), tl.minimum(it1 - base, steps),
                M, Di, Hi, Wi, Do, Ho, Wo, C, K, CS, sd, sh, sw, pd, ph, pw, dd, dh, dw, FZ, FY, FX,
                BLOCK_M, BLOCK_N, BLOCK_K, SPEC, EVEN_C, IEEE, TAPMASK, GM, NCHW)
            _streamk_epilogue(y_ptr, fin_ptr, cnt_ptr, _y_offs(offs_m, offs_n, g * (K * GM), KS, Do * Ho * Wo, NCHW),
                              mask_m[:, None] & mask_n[None, :], acc, p, tile, steps, IT_CHUNK, WS_STRIDE)
    else:
        pid = tl.program_id(0)
        g = tl.program_id(1)
        s = tl.program_id(2)
        lo = s * IT_CHUNK
        acc, offs_m, offs_n, mask_m, mask_n = _fwd_tile(
            x_ptr, w_ptr, pid, g, lo, tl.minimum(lo + IT_CHUNK, steps),
            M, Di, Hi, Wi, Do, Ho, Wo, C, K, CS, sd, sh, sw, pd, ph, pw, dd, dh, dw, FZ, FY, FX,
            BLOCK_M, BLOCK_N, BLOCK_K, SPEC, EVEN_C, IEEE, TAPMASK, GM, NCHW)
        _epilogue(y_ptr, fin_ptr, cnt_ptr, _y_offs(offs_m, offs_n, g * (K * GM), KS, Do * Ho * Wo, NCHW),
                  mask_m[:, None] & mask_n[None, :], acc, s, tl.num_programs(2), g * tl.num_programs(0) + pid,
                  WS_STRIDE, ATOMIC, WS)


@triton.jit
def _class_pixels(offs_m, mask_m, r, Rd, Rh, Rw, Di, Hi, Wi, sd, sh, sw):
    """Rows ``offs_m`` of stride residue class r = ((rd * sh) + rh) * sw + rw (class grid Rd x Rh x Rw
    per image): (n, ld, lj, li) with dx pixel (rd + ld*sd, rh + lj*sh, rw + li*sw), the row mask
    narrowed to pixels inside dx, and the linear dx pixel."""
    rw = r % sw
    rh = (r // sw) % sh
    rd = r // (sw * sh)
    li = offs_m % Rw
    t = offs_m // Rw
    lj = t % Rh
    t = t // Rh
    ld = t % Rd
    n = t // Rd
    xd = rd + ld * sd
    xh = rh + lj * sh
    xw = rw + li * sw
    mask_m = mask_m & (xd < Di) & (xh < Hi) & (xw < Wi)
    pix_in = ((n * Di + xd) * Hi + xh) * Wi + xw
    return n, ld, lj, li, mask_m, pix_in


@triton.jit
def conv_bwd_data_kernel(
    dy_ptr, w_ptr, dx_ptr, tab_ptr, ntap_ptr, fin_ptr, cnt_ptr,
    Mr, Rd, Rh, Rw, Di, Hi, Wi, Do, Ho, Wo, C, K, CS, KS, T, TMAX,
    sd, sh, sw, IT_CHUNK, NSPLIT, WS_STRIDE,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPEC: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr, ATOMIC: tl.constexpr,
    WS: tl.constexpr, NCHW: tl.constexpr,
):
    # NCHW: dy NGK(D)HW, w GKC(ZYX), dx NGC(D)HW, read and written in place (strides as in _fwd_tile)
    # program axis 2 = stride residue class r = ((rd * sh) + rh) * sw + rw; its dx
    # pixels are (rd + i*sd, rh + j*sh, rw + l*sw).  tab[r, j] = (tap, od_off, oh_off,
    # ow_off, linear pixel offset) lists the taps that reach this class and the output
    # offset each reads.
    pid = tl.program_id(0)
    g = tl.program_id(1)
    r = tl.program_id(2) // NSPLIT
    s = tl.program_id(2) % NSPLIT
    num_n = tl.cdiv(C, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < Mr
    mask_n = offs_n < C
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    nkc = tl.cdiv(K, BLOCK_K)
    if NCHW:   # weight channel stride T, tap stride 1; dy channel stride Do*Ho*Wo, pixel stride 1
        WC = T
        WT = 1
        YC = Do * Ho * Wo
        YP = 1
    else:
        WC = 1
        WT = C
        YC = 1
        YP = KS
    # weight element (k, tap, c) for this group
    w_base = w_ptr + g * K * T * C + offs_k[:, None] * (T * C) + offs_n[None, :] * WC
    if SPEC == 1:
        pix_in = offs_m
        if NCHW:
            a_base = dy_ptr + ((offs_m // YC) * (KS * YC) + offs_m % YC)[:, None] + ((g * K + offs_k) * YC)[None, :]
        else:
            a_base = dy_ptr + offs_m[:, None] * KS + g * K + offs_k[None, :]
        for kc in range(s * IT_CHUNK, tl.minimum(s * IT_CHUNK + IT_CHUNK, nkc)):
            k0 = kc * BLOCK_K
            if EVEN_K:
                a = tl.load(a_base + k0 * YC, mask=mask_m[:, None], other=0.0)
                b = tl.load(w_base + k0 * (T * C), mask=mask_n[None, :], other=0.0)
            else:
                kk = (k0 + offs_k) < K
                a = tl.load(a_base + k0 * YC, mask=mask_m[:, None] & kk[None, :], other=0.0)
                b = tl.load(w_base + k0 * (T * C), mask=kk[:, None] & mask_n[None, :], other=0.0)
            acc = _dot_prec(a, b, acc, IEEE)
    else:
        n, ld, lj, li, mask_m, pix_in = _class_pixels(offs_m, mask_m, r, Rd, Rh, Rw, Di, Hi, Wi, sd, sh, sw)
        ntap = tl.load(ntap_ptr + r)
        if NCHW:
            a_base = (dy_ptr + (n * (KS * YC) + (ld * Ho + lj) * Wo + li)[:, None]
                      + ((g * K + offs_k) * YC)[None, :])
        else:
            a_base = dy_ptr + (((n * Do + ld) * Ho + lj) * Wo + li)[:, None] * KS + g * K + offs_k[None, :]
        lo = s * IT_CHUNK
        j = lo // nkc
        kc = lo - j * nkc
        for it in range(lo, tl.minimum(lo + IT_CHUNK, ntap * nkc)):
            k0 = kc * BLOCK_K
            e = tab_ptr + (r * TMAX + j) * 5
            tap = tl.load(e)
            valid = mask_m & _inside(ld + tl.load(e + 1), Do) & _inside(lj + tl.load(e + 2), Ho) \
                & _inside(li + tl.load(e + 3), Wo)
            a_ptrs = a_base + (tl.load(e + 4) * YP + k0 * YC)
            b_ptrs = w_base + k0 * (T * C) + tap * WT
            if EVEN_K:
                a = tl.load(a_ptrs, mask=valid[:, None], other=0.0)
                b = tl.load(b_ptrs, mask=mask_n[None, :], other=0.0)
            else:
                kk = (k0 + offs_k) < K
                a = tl.load(a_ptrs, mask=valid[:, None] & kk[None, :], other=0.0)
                b = tl.load(b_ptrs, mask=kk[:, None] & mask_n[None, :], other=0.0)
            acc = _dot_prec(a, b, acc, IEEE)
            kc += 1
            wrap = kc == nkc
            kc = tl.where(wrap, 0, kc)
            j = tl.where(wrap, j + 1, j)
    tile = (r * tl.num_programs(1) + g) * tl.num_programs(0) + pid
    _epilogue(dx_ptr, fin_ptr, cnt_ptr, _y_offs(pix_in, offs_n, g * C, CS, Di * Hi * Wi, NCHW),
              mask_m[:, None] & mask_n[None, :], acc, s, NSPLIT, tile, WS_STRIDE, ATOMIC, WS)


#: int32 fields per stride residue class of ``conv_bwd_data_tm_kernel``'s class table
CLASS_FIELDS = 17


@triton.jit
def _bwd_data_tile(dy_ptr, w_ptr, ctab_ptr, pid, g, r, lo, hi,
                   Mr, Rd, Rh, Rw, Di, Hi, Wi, Do, Ho, Wo, C, K, KS, T, sd, sh, sw,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   SPEC: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr, GM: tl.constexpr,
                   NCHW: tl.constexpr):
    """dx tile ``pid`` of group ``g``, residue class ``r``, over the reduction steps
    [lo, hi) (clipped to the class's own count); returns (acc, pix_in, offs_n, mask_m, mask_n).

    The class's taps form a product of one arithmetic run per dimension (row r of
    ``ctab``: counts nz, ny, nx, first output offsets o0z/y/x, their decrements dlz/y/x,
    first tap and tap increments, first linear dy offset and its increments), so the
    step loop advances (tap, dy offset) as counters, like the forward kernel, and a
    row's valid taps are a box of bits built once.  GM > 1: GM groups as one
    block-diagonal GEMM, as in _fwd_tile (BLOCK_K a multiple of K)."""
    CV = C * GM
    KV = K * GM
    num_n = tl.cdiv(CV, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < Mr
    mask_n = offs_n < CV
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    nkc = tl.cdiv(KV, BLOCK_K)
    if NCHW:   # as conv_bwd_data_kernel
        WC = T
        WT = 1
        YC = Do * Ho * Wo
        YP = 1
    else:
        WC = 1
        WT = C
        YC = 1
        YP = KS
    # weight element (k, tap, c) for this group
    if GM == 1:
        w_base = w_ptr + g * K * T * C + offs_k[:, None] * (T * C) + offs_n[None, :] * WC
    else:
        w_base = w_ptr + (g * KV + offs_k)[:, None] * (T * C) + (offs_n % C)[None, :] * WC
        k_grp = offs_k // K
        n_grp = offs_n // C
    if SPEC == 1:
        pix_in = offs_m
        if NCHW:
            a_base = dy_ptr + ((offs_m // YC) * (KS * YC) + offs_m % YC)[:, None] + ((g * KV + offs_k) * YC)[None, :]
        else:
            a_base = dy_ptr + offs_m[:, None] * KS + g * KV + offs_k[None, :]
        for kc in range(lo, tl.minimum(hi, nkc)):
            k0 = kc * BLOCK_K
            b_msk = mask_n[None, :]
            if GM > 1:
                b_msk = b_msk & ((kc * (BLOCK_K // K) + k_grp)[:, None] == n_grp[None, :])
            if EVEN_K:
                a = tl.load(a_base + k0 * YC, mask=mask_m[:, None], other=0.0)
                b = tl.load(w_base + k0 * (T * C), mask=b_msk, other=0.0)
            else:
                kk = (k0 + offs_k) < KV
                a = tl.load(a_base + k0 * YC, mask=mask_m[:, None] & kk[None, :], other=0.0)
                b = tl.load(w_base + k0 * (T * C), mask=kk[:, None] & b_msk, other=0.0)
            acc = _dot_prec(a, b, acc, IEEE)
    else:
        n, ld, lj, li, mask_m, pix_in = _class_pixels(offs_m, mask_m, r, Rd, Rh, Rw, Di, Hi, Wi, sd, sh, sw)
        e = ctab_ptr + r * 17  # CLASS_FIELDS
        nz = tl.load(e)
        ny = tl.load(e + 1)
        nx = tl.load(e + 2)
        # dy row ld + o0 - j*dl must lie in [0, Do): _tap_range on the mirrored index
        zlo, zc = _tap_range(Do - 1 - ld - tl.load(e + 3), Do, nz, tl.load(e + 6))
        ylo, yc = _tap_range(Ho - 1 - lj - tl.load(e + 4), Ho, ny, tl.load(e + 7))
        xlo, xc = _tap_range(Wo - 1 - li - tl.load(e + 5), Wo, nx, tl.load(e + 8))
        vbits = tl.where(mask_m, _box_bits(zlo, zc, ylo, yc, xlo, xc, ny, nx), 0)
        tz = tl.load(e + 10)
        ty = tl.load(e + 11)
        tx = tl.load(e + 12)
        lz = tl.load(e + 14)
        ly = tl.load(e + 15)
        lx = tl.load(e + 16)
        if NCHW:
            a_base = (dy_ptr + (n * (KS * YC) + (ld * Ho + lj) * Wo + li)[:, None]
                      + ((g * KV + offs_k) * YC)[None, :])
        else:
            a_base = dy_ptr + (((n * Do + ld) * Ho + lj) * Wo + li)[:, None] * KS + g * KV + offs_k[None, :]
        j = lo // nkc
        kc = lo - j * nkc
        nx1 = tl.maximum(nx, 1)
        jx = j % nx1
        jy = (j // nx1) % tl.maximum(ny, 1)
        jz = j // (nx1 * tl.maximum(ny, 1))
        tap = tl.load(e + 9) + jz * tz + jy * ty + jx * tx
        lin = tl.load(e + 13) + jz * lz + jy * ly + jx * lx
        for it in range(lo, tl.minimum(hi, nz * ny * nx * nkc)):
            k0 = kc * BLOCK_K
            valid = ((vbits >> j) & 1) != 0
            a_ptrs = a_base + (lin * YP + k0 * YC)
            b_ptrs = w_base + k0 * (T * C) + tap * WT
            b_msk = mask_n[None, :]
            if GM > 1:
                b_msk = b_msk & ((kc * (BLOCK_K // K) + k_grp)[:, None] == n_grp[None, :])
            if EVEN_K:
                a = tl.load(a_ptrs, mask=valid[:, None], other=0.0)
                b = tl.load(b_ptrs, mask=b_msk, other=0.0)
            else:
                kk = (k0 + offs_k) < KV
                a = tl.load(a_ptrs, mask=valid[:, None] & kk[None, :], other=0.0)
                b = tl.load(b_ptrs, mask=kk[:, None] & b_msk, other=0.0)
            acc = _dot_prec(a, b, acc, IEEE)
            kc += 1
            wrap = kc == nkc
            kc = tl.where(wrap, 0, kc)
            j = tl.where(wrap, j + 1, j)
            jx = tl.where(wrap, jx + 1, jx)
            tap = tl.where(wrap, tap + tx, tap)
            lin = tl.where(wrap, lin + lx, lin)
            wrap = jx == nx
            jx = tl.where(wrap, 0, jx)
            jy = tl.where(wrap, jy + 1, jy)
            tap = tl.where(wrap, tap + ty - nx * tx, tap)
            lin = tl.where(wrap, lin + ly - nx * lx, lin)
            wrap = jy == ny
            jy = tl.where(wrap, 0, jy)
            tap = tl.where(wrap, tap + tz - ny * ty, tap)
            lin = tl.where(wrap, lin + lz - ny * ly, lin)
    return acc, pix_in, offs_n, mask_m, mask_n


@triton.jit
def conv_bwd_data_tm_kernel(
    dy_ptr, w_ptr, dx_ptr, ctab_ptr, fin_ptr, cnt_ptr,
    Mr, Rd, Rh, Rw, Di, Hi, Wi, Do, Ho, Wo, C, K, CS, KS, T, TMAX,
    sd, sh, sw, IT_CHUNK, NSPLIT, WS_STRIDE,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPEC: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr, ATOMIC: tl.constexpr,
    WS: tl.constexpr, STREAMK: tl.constexpr, GM: tl.constexpr, NCHW: tl.constexpr,
):
    # bwd_data without per-step table loads (see _bwd_data_tile): the tap bits of the
    # forward kernel on the flipped filter.  Grid as conv_bwd_data_kernel's (axis 2 =
    # residue class * NSPLIT + split), or STREAMK: a 1-D grid of persistent programs
    # over the flattened (class, group, tile, step) space, every tile counted with
    # TMAX taps (a class with fewer has idle steps).
    nkc = tl.cdiv(K * GM, BLOCK_K)
    if SPEC == 1:
        steps = nkc
    else:
        steps = TMAX * nkc
    if STREAMK:
        p = tl.program_id(0)
        ntile = tl.cdiv(Mr, BLOCK_M) * tl.cdiv(C * GM, BLOCK_N)
        G = CS // (C * GM)
        total = ntile * G * (sd * sh * sw) * steps
        it0 = p * IT_CHUNK
        it1 = tl.minimum(it0 + IT_CHUNK, total)
        for tile in range(it0 // steps, (it1 - 1) // steps + 1):
            base = tile * steps
            rg = tile // ntile
            g = rg % G
            acc, pix_in, offs_n, mask_m, mask_n = _bwd_data_tile(
                dy_ptr, w_ptr, ctab_ptr, tile - rg * ntile, g, rg // G, tl.maximum(it0 - base, 0),
                tl.minimum(it1 - base, steps), Mr, Rd, Rh, Rw, Di, Hi, Wi, Do, Ho, Wo, C, K, KS, T, sd, sh, sw,
                BLOCK_M, BLOCK_N, BLOCK_K, SPEC, EVEN_K, IEEE, GM, NCHW)
            _streamk_epilogue(dx_ptr, fin_ptr, cnt_ptr, _y_offs(pix_in, offs_n, g * (C * GM), CS, Di * Hi * Wi, NCHW),
                              mask_m[:, None] & mask_n[None, :], acc, p, tile, steps, IT_CHUNK, WS_STRIDE)
    else:
        pid = tl.program_id(0)
        g = tl.program_id(1)
        r = tl.program_id(2) // NSPLIT
        s = tl.program_id(2) % NSPLIT
        lo = s * IT_CHUNK
        acc, pix_in, offs_n, mask_m, mask_n = _bwd_data_tile(
            dy_ptr, w_ptr, ctab_ptr, pid, g, r, lo, lo + IT_CHUNK, Mr, Rd, Rh, Rw, Di, Hi, Wi, Do, Ho, Wo,
            C, K, KS, T, sd, sh, sw, BLOCK_M, BLOCK_N, BLOCK_K, SPEC, EVEN_K, IEEE, GM, NCHW)
        tile = (r * tl.num_programs(1) + g) * tl.num_programs(0) + pid
        _epilogue(dx_ptr, fin_ptr, cnt_ptr, _y_offs(pix_in, offs_n, g * (C * GM), CS, Di * Hi * Wi, NCHW),
                  mask_m[:, None] & mask_n[None, :], acc, s, NSPLIT, tile, WS_STRIDE, ATOMIC, WS)


@triton.jit
def _bw_pixels(offs_p, mp, pb_ptr, pc_ptr, toff, tap, fz, fy, fx, Di, Hi, Wi, Do, Ho, Wo,
               sd, sh, sw, pd, ph, pw, dd, dh, dw, inv_wo, inv_ho,
               SPEC: tl.constexpr, TABLE: tl.constexpr, FAST_DIV: tl.constexpr):
    """(input pixel, valid) of output pixels ``offs_p`` at tap (fz, fy, fx)."""
    if SPEC == 1:
        pix = offs_p
        valid = mp
    elif TABLE:
        pb = tl.load(pb_ptr + offs_p, mask=mp, other=0)
        pc = tl.load(pc_ptr + offs_p, mask=mp, other=0)
        pix = pb + toff
        if SPEC == 2:
            valid = mp
        elif TABLE == 2:
            valid = ((pc >> tap) & 1) != 0  # pc: tap bits, 0 past the end
        else:
            idd = ((pc >> 20) & 1023) - 512 + fz * dd
            ihh = ((pc >> 10) & 1023) - 512 + fy * dh
            iww = (pc & 1023) - 512 + fx * dw
            valid = mp & _inside(idd, Di) & _inside(ihh, Hi) & _inside(iww, Wi)
    else:
        t, ow = _divmod(offs_p, Wo, inv_wo, FAST_DIV)
        t, oh = _divmod(t, Ho, inv_ho, FAST_DIV)
        od = t % Do
        n = t // Do
        idd = od * sd - pd + fz * dd
        ihh = oh * sh - ph + fy * dh
        iww = ow * sw - pw + fx * dw
        if SPEC == 2:
            valid = mp
        else:
            valid = mp & (idd >= 0) & (idd < Di) & (ihh >= 0) & (ihh < Hi) & (iww >= 0) & (iww < Wi)
        pix = ((n * Di + idd) * Hi + ihh) * Wi + iww
    return pix, valid


@triton.jit
def conv_bwd_weight_kernel(
    x_ptr, dy_ptr, dw_ptr, pb_ptr, pc_ptr, fin_ptr, cnt_ptr,
    P, CHUNK, Di, Hi, Wi, Do, Ho, Wo, C, K, CS, KS,
    sd, sh, sw, pd, ph, pw, dd, dh, dw, FZ, FY, FX, WS_STRIDE,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPEC: tl.constexpr, ATOMIC: tl.constexpr, IEEE: tl.constexpr, FAST_DIV: tl.constexpr,
    TABLE: tl.constexpr, WS: tl.constexpr, NCHW: tl.constexpr,
):
    # NCHW: x NGC(D)HW, dy NGK(D)HW and dw GKC(ZYX), read and written in place (a channel moves by
    # the image's pixels; a pixel's image n = p // (Do*Ho*Wo) places it).
    # TABLE: pb[p] is output pixel p's input pixel at tap 0 (may be out of the
    # image), pc[p] packs its (d, h, w) input coordinates + 512 in 10 bits each,
    # so the reduction loop does no division (cf. CK's precomputed im2col offsets);
    # TABLE == 2: pc[p] has bit t set where tap t reads inside the image.
    # dw[g, k, tap, c] = sum_p dy[p, g, k] * x[in(p, tap), g, c]; program axis 0 walks
    # (tap, k tile, c tile), axis 2 the split of the pixel reduction into CHUNKs.
    pid = tl.program_id(0)
    g = tl.program_id(1)
    s = tl.program_id(2)
    num_m = tl.cdiv(K, BLOCK_M)
    num_n = tl.cdiv(C, BLOCK_N)
    tap = pid // (num_m * num_n)
    rem = pid % (num_m * num_n)
    pid_m = rem // num_n
    pid_n = rem % num_n
    T = FZ * FY * FX
    fx = tap % FX
    fy = (tap // FX) % FY
    fz = tap // (FX * FY)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < K
    mask_n = offs_n < C
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    p_start = s * CHUNK
    p_end = tl.minimum(p_start + CHUNK, P)
    a_base = dy_ptr + g * K + offs_m[:, None]
    b_base = x_ptr + g * C + offs_n[None, :]
    # (x * 1.0, not .to(): a size equal to 1 arrives as a compile-time constant)
    inv_wo = 1.0 / (Wo * 1.0)
    inv_ho = 1.0 / (Ho * 1.0)
    toff = ((fz * dd) * Hi + fy * dh) * Wi + fx * dw
    if NCHW:
        PO = Do * Ho * Wo
        PI = Di * Hi * Wi
        a_base = dy_ptr + ((g * K + offs_m) * PO)[:, None]
        b_base = x_ptr + ((g * C + offs_n) * PI)[None, :]
    for p0 in range(p_start, p_end, BLOCK_K):
        offs_p = p0 + offs_k
        mp = offs_p < p_end
        pix, valid = _bw_pixels(offs_p, mp, pb_ptr, pc_ptr, toff, tap, fz, fy, fx, Di, Hi, Wi, Do, Ho, Wo,
                                sd, sh, sw, pd, ph, pw, dd, dh, dw, inv_wo, inv_ho, SPEC, TABLE, FAST_DIV)
        if NCHW:   # pix = n*PI + the (possibly padded) in-image offset
            n_img = offs_p // PO
            a = tl.load(a_base + (n_img * (KS * PO) + offs_p - n_img * PO)[None, :],
                        mask=mask_m[:, None] & mp[None, :], other=0.0)
            b = tl.load(b_base + (pix + n_img * (PI * (CS - 1)))[:, None], mask=valid[:, None] & mask_n[None, :],
                        other=0.0)
        else:
            a = tl.load(a_base + offs_p[None, :] * KS, mask=mask_m[:, None] & mp[None, :], other=0.0)
            b = tl.load(b_base + pix[:, None] * CS, mask=valid[:, None] & mask_n[None, :], other=0.0)
        acc = _dot_prec(a, b, acc, IEEE)
    if NCHW:
        w_offs = g * K * T * C + offs_m[:, None] * (T * C) + offs_n[None, :] * T + tap
    else:
        w_offs = g * K * T * C + offs_m[:, None] * (T * C) + tap * C + offs_n[None, :]
    _epilogue(dw_ptr, fin_ptr, cnt_ptr, w_offs,
              mask_m[:, None] & mask_n[None, :], acc, s, tl.num_programs(2), g * tl.num_programs(0) + pid,
              WS_STRIDE, ATOMIC, WS)


@triton.jit
def conv_bwd_weight_gm_kernel(
    x_ptr, dy_ptr, dw_ptr, pb_ptr, pc_ptr, fin_ptr, cnt_ptr,
    P, CHUNK, G, Di, Hi, Wi, Do, Ho, Wo, C, K, CS, KS,
    sd, sh, sw, pd, ph, pw, dd, dh, dw, FZ, FY, FX, WS_STRIDE,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GM: tl.constexpr,
    SPEC: tl.constexpr, ATOMIC: tl.constexpr, IEEE: tl.constexpr, FAST_DIV: tl.constexpr,
    TABLE: tl.constexpr, WS: tl.constexpr,
):
    # bwd_weight of grouped convolutions with few channels per group: one program
    # computes GM groups at once as a batched (GM, BLOCK_M, BLOCK_N) dot, so a
    # pixel's GM*K (dy) and GM*C (x) channels load as one contiguous row instead of
    # GM short ones.  Program axis 1 walks blocks of GM groups; the rest is
    # conv_bwd_weight_kernel's.
    pid = tl.program_id(0)
    gb = tl.program_id(1)
    s = tl.program_id(2)
    num_m = tl.cdiv(K, BLOCK_M)
    num_n = tl.cdiv(C, BLOCK_N)
    tap = pid // (num_m * num_n)
    rem = pid % (num_m * num_n)
    pid_m = rem // num_n
    pid_n = rem % num_n
    T = FZ * FY * FX
    fx = tap % FX
    fy = (tap // FX) % FY
    fz = tap // (FX * FY)
    offs_g = gb * GM + tl.arange(0, GM)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_g = offs_g < G
    mask_m = offs_m < K
    mask_n = offs_n < C
    acc = tl.zeros((GM, BLOCK_M, BLOCK_N), dtype=tl.float32)
    p_start = s * CHUNK
    p_end = tl.minimum(p_start + CHUNK, P)
    a_base = dy_ptr + (offs_g * K)[:, None, None] + offs_m[None, :, None]
    b_base = x_ptr + (offs_g * C)[:, None, None] + offs_n[None, None, :]
    a_msk = mask_g[:, None, None] & mask_m[None, :, None]
    b_msk = mask_g[:, None, None] & mask_n[None, None, :]
    inv_wo = 1.0 / (Wo * 1.0)
    inv_ho = 1.0 / (Ho * 1.0)
    toff = ((fz * dd) * Hi + fy * dh) * Wi + fx * dw
    for p0 in range(p_start, p_end, BLOCK_K):
        offs_p = p0 + offs_k
        mp = offs_p < p_end
        a = tl.load(a_base + (offs_p * KS)[None, None, :], mask=a_msk & mp[None, None, :], other=0.0)
        pix, valid = _bw_pixels(offs_p, mp, pb_ptr, pc_ptr, toff, tap, fz, fy, fx, Di, Hi, Wi, Do, Ho, Wo,
                                sd, sh, sw, pd, ph, pw, dd, dh, dw, inv_wo, inv_ho, SPEC, TABLE, FAST_DIV)
        b = tl.load(b_base + (pix * CS)[None, :, None], mask=b_msk & valid[None, :, None], other=0.0)
        acc = _dot_prec(a, b, acc, IEEE)
    offs = (offs_g * (K * T * C))[:, None, None] + (offs_m * (T * C))[None, :, None] + tap * C \
        + offs_n[None, None, :]
    msk = mask_g[:, None, None] & mask_m[None, :, None] & mask_n[None, None, :]
    _epilogue(dw_ptr, fin_ptr, cnt_ptr, offs, msk, acc, s, tl.num_programs(2), gb * tl.num_programs(0) + pid,
              WS_STRIDE, ATOMIC, WS)


# ---------------------------------------------------------------------------
# depthwise (C = K = 1 per group): direct, vectorised over the G channels; the
# filter size is compile-time so the tap loop unrolls and all loads issue at once
# ---------------------------------------------------------------------------

@triton.jit
def dw_fwd_kernel(
    x_ptr, w_ptr, y_ptr,
    M, G, Di, Hi, Wi, Do, Ho, Wo,
    sd, sh, sw, pd, ph, pw, dd, dh, dw,
    FZ: tl.constexpr, FY: tl.constexpr, FX: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_G: tl.constexpr,
):
    offs_p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_g = tl.program_id(1) * BLOCK_G + tl.arange(0, BLOCK_G)
    mp = offs_p < M
    mg = offs_g < G
    ow = offs_p % Wo
    t = offs_p // Wo
    oh = t % Ho
    t = t // Ho
    od = t % Do
    n = t // Do
    T: tl.constexpr = FZ * FY * FX
    acc = tl.zeros((BLOCK_P, BLOCK_G), dtype=tl.float32)
    for tap in tl.static_range(T):
        fx = tap % FX
        fy = (tap // FX) % FY
        fz = tap // (FX * FY)
        idd = od * sd - pd + fz * dd
        ihh = oh * sh - ph + fy * dh
        iww = ow * sw - pw + fx * dw
        valid = mp & (idd >= 0) & (idd < Di) & (ihh >= 0) & (ihh < Hi) & (iww >= 0) & (iww < Wi)
        pix = ((n * Di + idd) * Hi + ihh) * Wi + iww
        xv = tl.load(x_ptr + pix[:, None] * G + offs_g[None, :], mask=valid[:, None] & mg[None, :], other=0.0)
        wv = tl.load(w_ptr + offs_g * T + tap, mask=mg, other=0.0)
        acc += xv.to(tl.float32) * wv.to(tl.float32)[None, :]
    tl.store(y_ptr + offs_p[:, None] * G + offs_g[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=mp[:, None] & mg[None, :])


@triton.jit
def dw_bwd_data_kernel(
    dy_ptr, w_ptr, dx_ptr,
    M, G, Di, Hi, Wi, Do, Ho, Wo,
    sd, sh, sw, pd, ph, pw, dd, dh, dw,
    FZ: tl.constexpr, FY: tl.constexpr, FX: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_G: tl.constexpr,
):
    # gather form: dx pixel x reads output o where o*s - p + f*d = x, if s divides
    offs_p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_g = tl.program_id(1) * BLOCK_G + tl.arange(0, BLOCK_G)
    mp = offs_p < M
    mg = offs_g < G
    xw = offs_p % Wi
    t = offs_p // Wi
    xh = t % Hi
    t = t // Hi
    xd = t % Di
    n = t // Di
    T: tl.constexpr = FZ * FY * FX
    acc = tl.zeros((BLOCK_P, BLOCK_G), dtype=tl.float32)
    for tap in tl.static_range(T):
        fx = tap % FX
        fy = (tap // FX) % FY
        fz = tap // (FX * FY)
        nd = xd + pd - fz * dd
        nh = xh + ph - fy * dh
        nw = xw + pw - fx * dw
        od = nd // sd
        oh = nh // sh
        ow = nw // sw
        valid = mp & (nd >= 0) & (nh >= 0) & (nw >= 0) & (od * sd == nd) & (oh * sh == nh) & (ow * sw == nw)
        valid = valid & (od < Do) & (oh < Ho) & (ow < Wo)
        pix = ((n * Do + od) * Ho + oh) * Wo + ow
        gv = tl.load(dy_ptr + pix[:, None] * G + offs_g[None, :], mask=valid[:, None] & mg[None, :], other=0.0)
        wv = tl.load(w_ptr + offs_g * T + tap, mask=mg, other=0.0)
        acc += gv.to(tl.float32) * wv.to(tl.float32)[None, :]
    tl.store(dx_ptr + offs_p[:, None] * G + offs_g[None, :], acc.to(dx_ptr.dtype.element_ty),
             mask=mp[:, None] & mg[None, :])


# ---------------------------------------------------------------------------
# depthwise, flat rows: a program takes BLOCK_R output rows (n, d, h) times a span
# of BLOCK_F elements of the flattened (W, G) row, so every load and store is a
# wide contiguous run (16-byte vectors when G is a multiple of 8) whatever G is,
# with no lanes lost to padding G up to a power of two; a tap's weights are loaded
# once per program and reused over its rows
# ---------------------------------------------------------------------------

@triton.jit
def _dw_src(o, a, b, c, f, s, n, BWD: tl.constexpr):
    """Source coordinate of destination coordinate ``o`` at filter position ``f``
    and whether it exists: forward o*a + b + f*c (a = stride, b = -pad, c =
    dilation); bwd_data that number (a = 1, b = pad, c = -dilation) over the stride
    ``s``, when the stride divides it."""
    num = o * a + b + f * c
    if BWD:
        q = num // s
        ok = (num >= 0) & (q * s == num) & (q < n)
    else:
        q = num
        ok = (num >= 0) & (num < n)
    return q, ok


@triton.jit
def dw_flat_kernel(
    src_ptr, w_ptr, dst_ptr,
    R, G, Dd, Hd, Wd, Ds, Hs, Ws, NSRC,
    ad, ah, aw, bd, bh, bw, cd, ch, cw, s_d, s_h, s_w,
    FZ: tl.constexpr, FY: tl.constexpr, FX: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr, UNIT_W: tl.constexpr, BWD: tl.constexpr,
):
    # dst (N, Dd, Hd, Wd, G) = sum over taps of w[g, tap] * src (N, Ds, Hs, Ws, G) at the
    # tap's source pixel (_dw_src); R = N*Dd*Hd destination rows.  UNIT_W (source
    # column = destination column + a constant, stride 1 along W): a tap's source
    # span is the destination span shifted by whole pixels, loaded contiguously; the
    # columns that fall outside the image are zeroed after the load.
    WG = Wd * G
    nf = tl.cdiv(WG, BLOCK_F)
    pid = tl.program_id(0)
    offs_f = (pid % nf) * BLOCK_F + tl.arange(0, BLOCK_F)
    rows = (pid // nf) * BLOCK_R + tl.arange(0, BLOCK_R)
    mf = offs_f < WG
    mr = rows < R
    ow = offs_f // G
    gch = offs_f - ow * G
    oh = rows % Hd
    t = rows // Hd
    od = t % Dd
    n = t // Dd
    T: tl.constexpr = FZ * FY * FX
    SWG = Ws * G
    acc = tl.zeros((BLOCK_R, BLOCK_F), dtype=tl.float32)
    for tap in tl.static_range(T):
        fx = tap % FX
        fy = (tap // FX) % FY
        fz = tap // (FX * FY)
        idd, okd = _dw_src(od, ad, bd, cd, fz, s_d, Ds, BWD)
        ihh, okh = _dw_src(oh, ah, bh, ch, fy, s_h, Hs, BWD)
        row_ok = mr & okd & okh
        srow = ((n * Ds + idd) * Hs + ihh) * SWG
        wv = tl.load(w_ptr + gch * T + tap, mask=mf, other=0.0).to(tl.float32)
        if UNIT_W:
            shift = bw + fx * cw
            iw = ow + shift
            col_ok = (iw >= 0) & (iw < Ws)
            gi = srow[:, None] + (offs_f + shift * G)[None, :]
            # the bounds test keeps the neighbours' reads inside the tensor; the row
            # and span masks are constant over each 16-byte vector
            xv = tl.load(src_ptr + gi, mask=row_ok[:, None] & mf[None, :] & (gi >= 0) & (gi < NSRC), other=0.0)
            xv = tl.where(col_ok[None, :], xv, 0.0)
        else:
            iw, col_ok = _dw_src(ow, aw, bw, cw, fx, s_w, Ws, BWD)
            xv = tl.load(src_ptr + srow[:, None] + (iw * G + gch)[None, :],
                         mask=row_ok[:, None] & (mf & col_ok)[None, :], other=0.0)
        acc += xv.to(tl.float32) * wv[None, :]
    tl.store(dst_ptr + rows[:, None] * WG + offs_f[None, :], acc.to(dst_ptr.dtype.element_ty),
             mask=mr[:, None] & mf[None, :])


# ---------------------------------------------------------------------------
# im2col over the flattened (tap, channel) axis (``_flat`` forward / bwd_weight keys):
# for few channels per group (RGB stems, C = 1..4) a per-tap GEMM pads C to the
# 16-wide MMA (3 of 16 useful) and re-reads dy or x once per tap; flattening
# j = tap*C + c (the weight layout's own order: w[g, k, j]) gives one GEMM with a
# reduction (forward) or an output width (bwd_weight) of T*C
# ---------------------------------------------------------------------------

@triton.jit
def _flat_cols(offs_j, C, FY, FX, dd, dh, dw, Hi, Wi, CS):
    """Per flattened column j = tap*C + c: the tap's (z, y, x) input offsets and the
    linear element offset of (tap, c) from a pixel's channel 0."""
    tap = offs_j // C
    c = offs_j - tap * C
    fx = tap % FX
    t2 = tap // FX
    fy = t2 % FY
    fz = t2 // FY
    zd = fz * dd
    yd = fy * dh
    xd = fx * dw
    return zd, yd, xd, ((zd * Hi + yd) * Wi + xd) * CS + c


@triton.jit
def _flat_pixels(offs_p, Di, Hi, Wi, Do, Ho, Wo, sd, sh, sw, pd, ph, pw):
    """(first input coordinates, linear input pixel) of output pixels ``offs_p`` at tap 0."""
    ow = offs_p % Wo
    t = offs_p // Wo
    oh = t % Ho
    t = t // Ho
    od = t % Do
    n = t // Do
    i0 = od * sd - pd
    i1 = oh * sh - ph
    i2 = ow * sw - pw
    return i0, i1, i2, ((n * Di + i0) * Hi + i1) * Wi + i2


@triton.jit
def conv_bwd_weight_flat_kernel(
    x_ptr, dy_ptr, dw_ptr, fin_ptr, cnt_ptr,
    P, NBLK, Di, Hi, Wi, Do, Ho, Wo, C, K, CS, KS,
    sd, sh, sw, pd, ph, pw, dd, dh, dw, FZ, FY, FX, WS_STRIDE,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ATOMIC: tl.constexpr, IEEE: tl.constexpr, WS: tl.constexpr,
):
    # dw[g, k, j] = sum_p dy[p, g, k] * x[in(p, tap(j)), g, c(j)], j = tap*C + c over
    # the T*C columns; program axis 0 walks (k tile, j tile), axis 2 the pixel split
    pid = tl.program_id(0)
    g = tl.program_id(1)
    s = tl.program_id(2)
    TC = FZ * FY * FX * C
    num_n = tl.cdiv(TC, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < K
    mask_n = offs_n < TC
    zd, yd, xd, coff = _flat_cols(offs_n, C, FY, FX, dd, dh, dw, Hi, Wi, CS)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # split s of nspl takes the BLOCK_K-pixel blocks [s*NBLK//nspl, (s+1)*NBLK//nspl): any split
    # up to NBLK has no empty part
    nspl = tl.num_programs(2)
    s64 = s.to(tl.int64)
    p_start = ((s64 * NBLK) // nspl).to(tl.int32) * BLOCK_K
    p_end = tl.minimum((((s64 + 1) * NBLK) // nspl).to(tl.int32) * BLOCK_K, P)
    a_base = dy_ptr + g * K + offs_m[:, None]
    b_base = x_ptr + g * C + coff[None, :]
    for p0 in range(p_start, p_end, BLOCK_K):
        offs_p = p0 + offs_k
        mp = offs_p < p_end
        a = tl.load(a_base + offs_p[None, :] * KS, mask=mask_m[:, None] & mp[None, :], other=0.0)
        i0, i1, i2, pix = _flat_pixels(offs_p, Di, Hi, Wi, Do, Ho, Wo, sd, sh, sw, pd, ph, pw)
        valid = (mp[:, None] & mask_n[None, :] & _inside(i0[:, None] + zd[None, :], Di)
                 & _inside(i1[:, None] + yd[None, :], Hi) & _inside(i2[:, None] + xd[None, :], Wi))
        b = tl.load(b_base + pix[:, None] * CS, mask=valid, other=0.0)
        acc = _dot_prec(a, b, acc, IEEE)
    _epilogue(dw_ptr, fin_ptr, cnt_ptr, g * K * TC + offs_m[:, None] * TC + offs_n[None, :],
              mask_m[:, None] & mask_n[None, :], acc, s, tl.num_programs(2), g * tl.num_programs(0) + pid,
              WS_STRIDE, ATOMIC, WS)


@triton.jit
def conv_fwd_flat_kernel(
    x_ptr, w_ptr, y_ptr,
    M, Di, Hi, Wi, Do, Ho, Wo, C, K, CS, KS,
    sd, sh, sw, pd, ph, pw, dd, dh, dw, FZ, FY, FX,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
    NCHW: tl.constexpr,
):
    # y[p, g, k] = sum_j x[in(p, tap(j)), g, c(j)] * w[g, k, j], j = tap*C + c: the
    # reduction runs over T*C in BLOCK_K steps (no per-tap padding of C).  NCHW: x NGC(D)HW,
    # w GKC(ZYX), y NGK(D)HW read and written in place (a channel moves by the image's pixels)
    pid = tl.program_id(0)
    g = tl.program_id(1)
    TC = FZ * FY * FX * C
    num_n = tl.cdiv(K, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < K
    i0, i1, i2, pix = _flat_pixels(offs_m, Di, Hi, Wi, Do, Ho, Wo, sd, sh, sw, pd, ph, pw)
    PI = Di * Hi * Wi
    if NCHW:   # pix = n*PI + the (possibly padded, negative) in-image offset
        a_base = x_ptr + (pix + (offs_m // (Do * Ho * Wo)) * (PI * (CS - 1)) + g * C * PI)[:, None]
    else:
        a_base = x_ptr + (pix * CS + g * C)[:, None]
    w_base = w_ptr + (g * K + offs_n)[None, :] * TC
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for j0 in range(0, TC, BLOCK_K):
        offs_j = j0 + offs_k
        mj = offs_j < TC
        zd, yd, xd, coff = _flat_cols(offs_j, C, FY, FX, dd, dh, dw, Hi, Wi, CS)
        if NCHW:   # column j = tap*C + c: x at tap offset + c*PI, w at c*T + tap
            tap = offs_j // C
            cc = offs_j - tap * C
            coff = (zd * Hi + yd) * Wi + xd + cc * PI
            woff = cc * (FZ * FY * FX) + tap
        else:
            woff = offs_j
        valid = (mask_m[:, None] & mj[None, :] & _inside(i0[:, None] + zd[None, :], Di)
                 & _inside(i1[:, None] + yd[None, :], Hi) & _inside(i2[:, None] + xd[None, :], Wi))
        a = tl.load(a_base + coff[None, :], mask=valid, other=0.0)
        b = tl.load(w_base + woff[:, None], mask=mj[:, None] & mask_n[None, :], other=0.0)
        acc = _dot_prec(a, b, acc, IEEE)
    tl.store(y_ptr + _y_offs(offs_m, offs_n, g * K, KS, Do * Ho * Wo, NCHW), acc.to(y_ptr.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


# ---------------------------------------------------------------------------
# bwd_weight through tensor descriptors (``_tma`` keys, stride 1): a pixel block is BLOCK_K
# consecutive output columns of one output row (n, od, oh); the dy block and, for each tap,
# the x block at the tap's shifted coordinates load as TMA boxes, whose out-of-bounds parts
# (padding, the row's tail) arrive as zeros: no index tables, no masks, no gathers, and the
# operands go straight from shared memory to the tensor cores.  LINEAR (1x1, stride 1, pad 0):
# the pixels are one axis of x and dy viewed as [pixels, channels] matrices.
# ---------------------------------------------------------------------------

@triton.jit
def conv_bwd_weight_tma_kernel(
    x_desc, dy_desc, dw_ptr, fin_ptr, cnt_ptr,
    NBLK, NWB, Do, Ho, pd, ph, pw, dd, dh, dw, FY, FX, C, K, T, WS_STRIDE,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    LINEAR: tl.constexpr, ATOMIC: tl.constexpr, WS: tl.constexpr, IEEE: tl.constexpr,
):
    # dw[g, k, tap, c] = sum_p dy[p, g, k] * x[in(p, tap), g, c]; axis 0 walks (tap, k tile,
    # c tile), axis 2 splits the pixel blocks (balanced: any split up to NBLK runs as named)
    pid = tl.program_id(0)
    g = tl.program_id(1)
    s = tl.program_id(2).to(tl.int64)
    nspl = tl.num_programs(2)
    num_m = tl.cdiv(K, BLOCK_M)
    num_n = tl.cdiv(C, BLOCK_N)
    tap = pid // (num_m * num_n)
    rem = pid % (num_m * num_n)
    pid_m = rem // num_n
    pid_n = rem % num_n
    fx = tap % FX
    fy = (tap // FX) % FY
    fz = tap // (FX * FY)
    k0 = g * K + pid_m * BLOCK_M
    c0 = g * C + pid_n * BLOCK_N
    b_lo = ((s * NBLK) // nspl).to(tl.int32)
    b_hi = (((s + 1) * NBLK) // nspl).to(tl.int32)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for b in range(b_lo, b_hi):
        if LINEAR:
            a = dy_desc.load([b * BLOCK_K, k0])
            bx = x_desc.load([b * BLOCK_K, c0])
        else:
            r = b // NWB
            w0 = (b - r * NWB) * BLOCK_K
            oh = r % Ho
            t = r // Ho
            od = t % Do
            n = t // Do
            a = dy_desc.load([n, od, oh, w0, k0]).reshape(BLOCK_K, BLOCK_M)
            bx = x_desc.load([n, od - pd + fz * dd, oh - ph + fy * dh, w0 - pw + fx * dw, c0]
                             ).reshape(BLOCK_K, BLOCK_N)
        acc = _dot_prec(a.T, bx, acc, IEEE)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    _epilogue(dw_ptr, fin_ptr, cnt_ptr, g * K * T * C + offs_m[:, None] * (T * C) + tap * C + offs_n[None, :],
              (offs_m < K)[:, None] & (offs_n < C)[None, :], acc, s, nspl, g * tl.num_programs(0) + pid,
              WS_STRIDE, ATOMIC, WS)


# What the kernels specialise on (ck_core.backends.triton_artifacts.specialisation): tiles, dtypes,
# the key's convolution specialisation (SPEC, UNIT_W, tap tables) and the other constexprs are the
# code.  Channel counts and channel strides (C, K, CS, KS; G where groups are the contiguous
# dimension) and the per-split workspace stride are the alignment class (divisible by 16 or not:
# 16-byte vector loads along the channels), never the constant 1.  Batch and spatial sizes, GEMM
# rows, chunk and split counts and the geometry (conv strides, pads, dilations, filter sizes; SPEC
# carries the 1x1 cases) are plain run-time integers: one compiled kernel per key serves every layer
# shape of that alignment.
_ALIGN = ("C", "K", "CS", "KS", "G", "WS_STRIDE")


def _apply_policy():
    from ck_core.backends.triton_artifacts import specialisation

    for fn in (splitk_reduce_kernel, conv_fwd_kernel, conv_bwd_data_kernel, conv_bwd_data_tm_kernel,
               conv_bwd_weight_kernel, conv_bwd_weight_gm_kernel, dw_fwd_kernel, dw_bwd_data_kernel,
               dw_flat_kernel, conv_bwd_weight_flat_kernel, conv_fwd_flat_kernel, conv_bwd_weight_tma_kernel):
        names = [p.name for p in getattr(fn, "params", ()) if not p.is_constexpr and not p.name.endswith(("_ptr", "_desc"))]
        specialisation(runtime=[n for n in names if n not in _ALIGN],
                       align_only=[n for n in names if n in _ALIGN])(fn)


_apply_policy()
