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
any split; not deterministic).

``SPEC`` is CK's convolution specialisation: 0 default, 1 filter1x1_stride1_pad0
(input pixel = output pixel, no index arithmetic), 2 filter1x1_pad0 (one tap,
never out of bounds).  3x3 filters use the default path.

Depthwise problems (C = K = 1 per group) are not GEMMs; ``dw_*`` kernels do
them directly, vectorised across groups (bwd_weight's is generated per filter
size by :mod:`ck_conv.dw_codegen`).
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
def _tap_bits(id0, ih0, iw0, Di, Hi, Wi, FZ, FY, FX, dd, dh, dw):
    """Bit t = (fz*FY + fy)*FX + fx set where tap t reads inside the image (T <= 31):
    the valid taps form a box, so the mask is a run of x bits repeated at every
    valid y (a geometric series in 2**FX) and that at every valid z."""
    zlo, zc = _tap_range(id0, Di, FZ, dd)
    ylo, yc = _tap_range(ih0, Hi, FY, dh)
    xlo, xc = _tap_range(iw0, Wi, FX, dw)
    one = tl.full(id0.shape, 1, tl.int64)
    xb = ((one << xc) - 1) << xlo
    sy = (((one << (yc * FX)) - 1) // ((1 << FX) - 1)) << (ylo * FX)
    sz = (((one << (zc * (FY * FX))) - 1) // ((1 << (FY * FX)) - 1)) << (zlo * (FY * FX))
    return (xb * sy * sz).to(tl.int32)


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
def conv_fwd_kernel(
    x_ptr, w_ptr, y_ptr, fin_ptr, cnt_ptr,
    M, Di, Hi, Wi, Do, Ho, Wo, C, K, CS, KS,
    sd, sh, sw, pd, ph, pw, dd, dh, dw, FZ, FY, FX, IT_CHUNK, WS_STRIDE,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPEC: tl.constexpr, EVEN_C: tl.constexpr, IEEE: tl.constexpr, ATOMIC: tl.constexpr,
    WS: tl.constexpr, TAPMASK: tl.constexpr,
):
    # CS = G*C (input pixel stride), KS = G*K (output pixel stride); program axis 2
    # splits the reduction into IT_CHUNK (tap, channel-block) steps, summed with
    # fp32 atomics when ATOMIC, through a workspace when WS.  TAPMASK: bit t of
    # vbits[row] says whether tap t reads inside the image, built once before the
    # loop, so that a step's row mask is a shift and an and.
    pid = tl.program_id(0)
    g = tl.program_id(1)
    s = tl.program_id(2)
    num_n = tl.cdiv(K, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < K
    T = FZ * FY * FX
    w_base = w_ptr + g * K * T * C + offs_n[None, :] * (T * C) + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    nkc = tl.cdiv(C, BLOCK_K)
    if SPEC == 1:
        a_base = x_ptr + offs_m[:, None] * CS + g * C + offs_k[None, :]
        for kc in range(s * IT_CHUNK, tl.minimum(s * IT_CHUNK + IT_CHUNK, nkc)):
            c0 = kc * BLOCK_K
            if EVEN_C:
                a = tl.load(a_base + c0, mask=mask_m[:, None], other=0.0)
                b = tl.load(w_base + c0, mask=mask_n[None, :], other=0.0)
            else:
                ck = (c0 + offs_k) < C
                a = tl.load(a_base + c0, mask=mask_m[:, None] & ck[None, :], other=0.0)
                b = tl.load(w_base + c0, mask=ck[:, None] & mask_n[None, :], other=0.0)
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
        pix0 = ((n * Di + id0) * Hi + ih0) * Wi + iw0
        a_base = x_ptr + pix0[:, None] * CS + g * C + offs_k[None, :]
        if TAPMASK:
            # closed form, no loop: a loop-carried tensor would pin a layout that
            # costs a shared-memory round trip per step to convert
            vbits = tl.where(mask_m, _tap_bits(id0, ih0, iw0, Di, Hi, Wi, FZ, FY, FX, dd, dh, dw), 0)
        # (tap, channel block) advance as counters carried through the loop: no
        # division by run-time values inside it
        lo = s * IT_CHUNK
        tap = lo // nkc
        kc = lo - tap * nkc
        fx = tap % FX
        fy = (tap // FX) % FY
        fz = tap // (FX * FY)
        for it in range(lo, tl.minimum(lo + IT_CHUNK, T * nkc)):
            c0 = kc * BLOCK_K
            toff = ((fz * dd) * Hi + fy * dh) * Wi + fx * dw
            if SPEC == 2:
                valid = mask_m
            elif TAPMASK:
                valid = ((vbits >> tap) & 1) != 0
            else:
                valid = mask_m & _inside(id0 + fz * dd, Di) & _inside(ih0 + fy * dh, Hi) & _inside(iw0 + fx * dw, Wi)
            a_ptrs = a_base + (toff * CS + c0)
            b_ptrs = w_base + tap * C + c0
            if EVEN_C:
                a = tl.load(a_ptrs, mask=valid[:, None], other=0.0)
                b = tl.load(b_ptrs, mask=mask_n[None, :], other=0.0)
            else:
                ck = (c0 + offs_k) < C
                a = tl.load(a_ptrs, mask=valid[:, None] & ck[None, :], other=0.0)
                b = tl.load(b_ptrs, mask=ck[:, None] & mask_n[None, :], other=0.0)
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
    _epilogue(y_ptr, fin_ptr, cnt_ptr, offs_m[:, None] * KS + g * K + offs_n[None, :],
              mask_m[:, None] & mask_n[None, :], acc, s, tl.num_programs(2), g * tl.num_programs(0) + pid,
              WS_STRIDE, ATOMIC, WS)


@triton.jit
def conv_bwd_data_kernel(
    dy_ptr, w_ptr, dx_ptr, tab_ptr, ntap_ptr, fin_ptr, cnt_ptr,
    Mr, Rd, Rh, Rw, Di, Hi, Wi, Do, Ho, Wo, C, K, CS, KS, T, TMAX,
    sd, sh, sw, IT_CHUNK, NSPLIT, WS_STRIDE,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPEC: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr, ATOMIC: tl.constexpr,
    WS: tl.constexpr,
):
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
    # weight element (k, tap, c) for this group
    w_base = w_ptr + g * K * T * C + offs_k[:, None] * (T * C) + offs_n[None, :]
    if SPEC == 1:
        pix_in = offs_m
        a_base = dy_ptr + offs_m[:, None] * KS + g * K + offs_k[None, :]
        for kc in range(s * IT_CHUNK, tl.minimum(s * IT_CHUNK + IT_CHUNK, nkc)):
            k0 = kc * BLOCK_K
            if EVEN_K:
                a = tl.load(a_base + k0, mask=mask_m[:, None], other=0.0)
                b = tl.load(w_base + k0 * (T * C), mask=mask_n[None, :], other=0.0)
            else:
                kk = (k0 + offs_k) < K
                a = tl.load(a_base + k0, mask=mask_m[:, None] & kk[None, :], other=0.0)
                b = tl.load(w_base + k0 * (T * C), mask=kk[:, None] & mask_n[None, :], other=0.0)
            acc = _dot_prec(a, b, acc, IEEE)
    else:
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
        ntap = tl.load(ntap_ptr + r)
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
            a_ptrs = a_base + (tl.load(e + 4) * KS + k0)
            b_ptrs = w_base + k0 * (T * C) + tap * C
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
    _epilogue(dx_ptr, fin_ptr, cnt_ptr, pix_in[:, None] * CS + g * C + offs_n[None, :],
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
    TABLE: tl.constexpr, WS: tl.constexpr,
):
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
    for p0 in range(p_start, p_end, BLOCK_K):
        offs_p = p0 + offs_k
        mp = offs_p < p_end
        a = tl.load(a_base + offs_p[None, :] * KS, mask=mask_m[:, None] & mp[None, :], other=0.0)
        pix, valid = _bw_pixels(offs_p, mp, pb_ptr, pc_ptr, toff, tap, fz, fy, fx, Di, Hi, Wi, Do, Ho, Wo,
                                sd, sh, sw, pd, ph, pw, dd, dh, dw, inv_wo, inv_ho, SPEC, TABLE, FAST_DIV)
        b = tl.load(b_base + pix[:, None] * CS, mask=valid[:, None] & mask_n[None, :], other=0.0)
        acc = _dot_prec(a, b, acc, IEEE)
    _epilogue(dw_ptr, fin_ptr, cnt_ptr, g * K * T * C + offs_m[:, None] * (T * C) + tap * C + offs_n[None, :],
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
