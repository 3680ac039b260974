"""Triton GEMM kernels: C[b] = act(op(A[b] @ B[b], D0[b], D1[b])).

All kernels see *logical* operands A (M x K), B (K x N), C (M x N) through
strides, so one source covers every CK layout (rcr, rrr, crr, ccr, ...) and
broadcast D tensors (stride 0).  Accumulation is fp32 (int32 for int8).

Kernels (each takes only constexpr meta-parameters besides tensors, sizes and strides):

* :func:`gemm_plain_kernel`       grid (tiles, batch, split_k), pointer loads
* :func:`gemm_persistent_kernel`  grid (#SMs,), pointer loads, flattened tile loop
* :func:`gemm_tma_kernel`         grid (tiles, batch, split_k), host tensor descriptors
* :func:`gemm_tma_persistent_kernel` grid (#SMs,), tensor descriptors, tile loop
  (WARP_SPEC=True warp-specialises the loop)
* :func:`gemm_tma_cs_kernel`, :func:`gemm_tma_persistent_cs_kernel`: the two above with
  C written through a tensor descriptor too (TMA store), optionally in EPI_SUBTILE
  slices along N (see :func:`_epilogue_desc_store`)
* :func:`gemm_tma_streamk_kernel`, :func:`gemm_streamk_kernel`: grid (#SMs,), whole waves of
  tiles data-parallel, the rest split evenly over the programs by K steps (stream-K), partial
  tiles summed in the same launch (see the comment above them)
* :func:`gemm_splitk_reduce_kernel` second pass of split-K: sums the fp32 partials
  in a fixed order (deterministic) and applies the epilogue.

Epilogue constexprs: NUM_D (0..2 D tensors), D_OP (0 add, 1 mul), ACT
(0 none, 1 relu, 2 gelu(erf), 3 silu, 4 sigmoid, 5 tanh).
"""
from __future__ import annotations

import triton
import triton.language as tl

ACTIVATIONS = {None: 0, "none": 0, "relu": 1, "gelu": 2, "silu": 3, "sigmoid": 4, "tanh": 5}
D_OPS = {"add": 0, "mul": 1}
MAX_D = 2


@triton.jit
def _mma(a, b, acc):
    # fp32 operands multiply in full fp32, as torch.matmul does by default; Triton's own default for an
    # fp32 dot is TF32 (10-bit mantissa), which loses ~3 decimal digits on the GPU
    if a.dtype == tl.float32:
        return tl.dot(a, b, acc, out_dtype=acc.dtype, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, out_dtype=acc.dtype)


@triton.jit
def _tile_ids(tile_id, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    # grouped ordering: GROUP_M row-tiles share B columns while they sit in L2
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((tile_id % num_pid_in_group) % group_size_m)
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _activation(x, ACT: tl.constexpr):
    if ACT == 1:
        x = tl.maximum(x, 0.0)
    elif ACT == 2:
        x = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    elif ACT == 3:
        x = x / (1.0 + tl.exp(-x))
    elif ACT == 4:
        x = 1.0 / (1.0 + tl.exp(-x))
    elif ACT == 5:
        # tanh(x) = 2 sigmoid(2x) - 1: exp-only, portable across backends
        x = 2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0
    return x


@triton.jit
def _epilogue_values(acc, rm, rn, mask, d0_ptr, stride_d0m, stride_d0n, d1_ptr, stride_d1m, stride_d1n,
                     NUM_D: tl.constexpr, D_OP: tl.constexpr, ACT: tl.constexpr):
    # the fused part of the epilogue: acc (+|*) D0 (+|*) D1, then the activation;
    # rm/rn are the tile's int64 row/column indices, mask its in-bounds elements
    if NUM_D > 0 or ACT > 0:
        x = acc.to(tl.float32)
    else:
        x = acc
    if NUM_D >= 1:
        d0 = tl.load(d0_ptr + rm * stride_d0m + rn * stride_d0n, mask=mask, other=0.0).to(tl.float32)
        if D_OP == 0:
            x = x + d0
        else:
            x = x * d0
    if NUM_D >= 2:
        d1 = tl.load(d1_ptr + rm * stride_d1m + rn * stride_d1n, mask=mask, other=0.0).to(tl.float32)
        if D_OP == 0:
            x = x + d1
        else:
            x = x * d1
    if ACT > 0:
        x = _activation(x, ACT)
    return x


@triton.jit
def _epilogue_store(acc, offs_m, offs_n, M, N, c_ptr, stride_cm, stride_cn,
                    d0_ptr, stride_d0m, stride_d0n, d1_ptr, stride_d1m, stride_d1n,
                    NUM_D: tl.constexpr, D_OP: tl.constexpr, ACT: tl.constexpr):
    rm = offs_m.to(tl.int64)[:, None]
    rn = offs_n.to(tl.int64)[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    x = _epilogue_values(acc, rm, rn, mask, d0_ptr, stride_d0m, stride_d0n, d1_ptr, stride_d1m, stride_d1n,
                         NUM_D, D_OP, ACT)
    tl.store(c_ptr + rm * stride_cm + rn * stride_cn, x.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _split_n(x, ROWS: tl.constexpr, COLS: tl.constexpr):
    # (ROWS, COLS) -> its left and right (ROWS, COLS // 2) halves: view the columns as
    # (2, COLS // 2), move the 2 innermost and split it off (no data leaves the registers)
    return x.reshape(ROWS, 2, COLS // 2).permute(0, 2, 1).split()


@triton.jit
def _store_c_slice(x, c_desc, pid_b, off_m, off_n, M, N,
                   d0_ptr, stride_d0m, stride_d0n, d1_ptr, stride_d1m, stride_d1n,
                   BLOCK_M: tl.constexpr, SLICE_N: tl.constexpr, BATCHED: tl.constexpr,
                   NUM_D: tl.constexpr, D_OP: tl.constexpr, ACT: tl.constexpr):
    # one BLOCK_M x SLICE_N piece of the C tile at (off_m, off_n): the D tensors are read
    # through pointers (masked), C leaves through the descriptor, which drops the
    # rows and columns past M and N by itself
    if NUM_D > 0 or ACT > 0:
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, SLICE_N)
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        x = _epilogue_values(x, offs_m.to(tl.int64)[:, None], offs_n.to(tl.int64)[None, :], mask,
                             d0_ptr, stride_d0m, stride_d0n, d1_ptr, stride_d1m, stride_d1n, NUM_D, D_OP, ACT)
    y = x.to(c_desc.dtype)
    if BATCHED:
        c_desc.store([pid_b, off_m, off_n], y.reshape(1, BLOCK_M, SLICE_N))
    else:
        c_desc.store([off_m, off_n], y)


@triton.jit
def _epilogue_desc_store(acc, c_desc, pid_b, off_m, off_n, M, N,
                         d0_ptr, stride_d0m, stride_d0n, d1_ptr, stride_d1m, stride_d1n,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EPI_SUBTILE: tl.constexpr,
                         BATCHED: tl.constexpr, NUM_D: tl.constexpr, D_OP: tl.constexpr, ACT: tl.constexpr):
    # Epilogue through a C tensor descriptor; c_desc's block is BLOCK_M x BLOCK_N // EPI_SUBTILE.
    # EPI_SUBTILE=1 converts and stores the whole tile; 2 (4) cuts it into N-halves
    # (quarters) that are converted and stored one after another.  What that buys
    # (triton 3.6, sm90): the TMA store's shared staging buffer holds one slice, not
    # the tile (128x256 bf16: 32 KiB instead of 64, room for a 4th pipeline stage),
    # and fewer converted values are live at once.  The compiler keeps one buffer
    # for all slices, so a slice waits until the previous one's store has read it;
    # the last store drains while the next tile's K loop (persistent kernel) runs.
    if EPI_SUBTILE == 1:
        _store_c_slice(acc, c_desc, pid_b, off_m, off_n, M, N,
                       d0_ptr, stride_d0m, stride_d0n, d1_ptr, stride_d1m, stride_d1n,
                       BLOCK_M, BLOCK_N, BATCHED, NUM_D, D_OP, ACT)
    elif EPI_SUBTILE == 2:
        h0, h1 = _split_n(acc, BLOCK_M, BLOCK_N)
        _store_c_slice(h0, c_desc, pid_b, off_m, off_n, M, N,
                       d0_ptr, stride_d0m, stride_d0n, d1_ptr, stride_d1m, stride_d1n,
                       BLOCK_M, BLOCK_N // 2, BATCHED, NUM_D, D_OP, ACT)
        _store_c_slice(h1, c_desc, pid_b, off_m, off_n + BLOCK_N // 2, M, N,
                       d0_ptr, stride_d0m, stride_d0n, d1_ptr, stride_d1m, stride_d1n,
                       BLOCK_M, BLOCK_N // 2, BATCHED, NUM_D, D_OP, ACT)
    else:
        tl.static_assert(EPI_SUBTILE == 4, "EPI_SUBTILE must be 1, 2 or 4")
        Q: tl.constexpr = BLOCK_N // 4
        h0, h1 = _split_n(acc, BLOCK_M, BLOCK_N)
        q0, q1 = _split_n(h0, BLOCK_M, BLOCK_N // 2)
        _store_c_slice(q0, c_desc, pid_b, off_m, off_n, M, N,
                       d0_ptr, stride_d0m, stride_d0n, d1_ptr, stride_d1m, stride_d1n,
                       BLOCK_M, Q, BATCHED, NUM_D, D_OP, ACT)
        _store_c_slice(q1, c_desc, pid_b, off_m, off_n + Q, M, N,
                       d0_ptr, stride_d0m, stride_d0n, d1_ptr, stride_d1m, stride_d1n,
                       BLOCK_M, Q, BATCHED, NUM_D, D_OP, ACT)
        q2, q3 = _split_n(h1, BLOCK_M, BLOCK_N // 2)
        _store_c_slice(q2, c_desc, pid_b, off_m, off_n + 2 * Q, M, N,
                       d0_ptr, stride_d0m, stride_d0n, d1_ptr, stride_d1m, stride_d1n,
                       BLOCK_M, Q, BATCHED, NUM_D, D_OP, ACT)
        _store_c_slice(q3, c_desc, pid_b, off_m, off_n + 3 * Q, M, N,
                       d0_ptr, stride_d0m, stride_d0n, d1_ptr, stride_d1m, stride_d1n,
                       BLOCK_M, Q, BATCHED, NUM_D, D_OP, ACT)


@triton.jit
def _vec_hint(x, VEC: tl.constexpr):
    """``x`` (a multiple of ``VEC``: the launcher checked it, see ``launch.vec_elems``) in a form
    the compiler sees as one: ``(x // VEC) * VEC`` (``tl.multiple_of`` cannot mark an argument);
    ``x`` itself where VEC <= 1."""
    if VEC > 1:
        x = (x // VEC) * VEC
    return x


@triton.jit
def _vec_hints(M, N, K, stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn,
               A_ROW: tl.constexpr, B_ROW: tl.constexpr, A_VEC: tl.constexpr, B_VEC: tl.constexpr):
    """The pointer kernels' (plain, persistent) sizes and A / B strides with the launcher's vector
    facts applied: along an operand's contiguous axis whose bound (M, N or K) or row stride is not
    a multiple of 16 elements, A_VEC / B_VEC (a power of two dividing them) lets the loads be
    vectors (cp.async) instead of one element each (masked loads vectorise only when the bound is
    a known multiple of the vector).  Returns ``M, N, K, stride_ab, stride_am, stride_ak,
    stride_bb, stride_bk, stride_bn``."""
    if A_ROW:
        stride_am = _vec_hint(stride_am, A_VEC)
        K = _vec_hint(K, A_VEC)
    else:
        stride_ak = _vec_hint(stride_ak, A_VEC)
        M = _vec_hint(M, A_VEC)
    if B_ROW:
        stride_bk = _vec_hint(stride_bk, B_VEC)
        N = _vec_hint(N, B_VEC)
    else:
        stride_bn = _vec_hint(stride_bn, B_VEC)
        K = _vec_hint(K, B_VEC)
    stride_ab = _vec_hint(stride_ab, A_VEC)
    stride_bb = _vec_hint(stride_bb, B_VEC)
    return M, N, K, stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn


@triton.jit
def _k_range(pid_k, K, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    k_tiles = tl.cdiv(K, BLOCK_K)
    if SPLIT_K == 1:
        k_start = 0
        k_end = k_tiles
    else:
        per = tl.cdiv(k_tiles, SPLIT_K)
        k_start = pid_k * per
        k_end = min(k_start + per, k_tiles)
    return k_start, k_end


@triton.jit
def gemm_plain_kernel(
        a_ptr, b_ptr, c_ptr, d0_ptr, d1_ptr, M, N, K,
        stride_ab, stride_am, stride_ak,
        stride_bb, stride_bk, stride_bn,
        stride_cb, stride_cm, stride_cn, stride_ck,
        stride_d0b, stride_d0m, stride_d0n,
        stride_d1b, stride_d1m, stride_d1n,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
        NUM_D: tl.constexpr, D_OP: tl.constexpr, ACT: tl.constexpr, ACC_INT: tl.constexpr,
        A_ROW: tl.constexpr = True, B_ROW: tl.constexpr = False, A_VEC: tl.constexpr = 0,
        B_VEC: tl.constexpr = 0):
    M, N, K, stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn = _vec_hints(
        M, N, K, stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn, A_ROW, B_ROW, A_VEC, B_VEC)
    pid = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    pid_k = tl.program_id(2)
    pid_m, pid_n = _tile_ids(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    a_ptr += pid_b * stride_ab
    b_ptr += pid_b * stride_bb
    c_ptr += pid_b * stride_cb + pid_k.to(tl.int64) * stride_ck
    d0_ptr += pid_b * stride_d0b
    d1_ptr += pid_b * stride_d1b

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    k_start, k_end = _k_range(pid_k, K, BLOCK_K, SPLIT_K)
    acc = _ptr_k_loop(a_ptr, b_ptr, offs_m, offs_n, offs_k, M, N, K, k_start, k_end,
                      stride_am, stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, ACC_INT)
    _epilogue_store(acc, offs_m, offs_n, M, N, c_ptr, stride_cm, stride_cn,
                    d0_ptr, stride_d0m, stride_d0n, d1_ptr, stride_d1m, stride_d1n, NUM_D, D_OP, ACT)


@triton.jit
def gemm_persistent_kernel(
        a_ptr, b_ptr, c_ptr, d0_ptr, d1_ptr, M, N, K, batch_count,
        stride_ab, stride_am, stride_ak,
        stride_bb, stride_bk, stride_bn,
        stride_cb, stride_cm, stride_cn,
        stride_d0b, stride_d0m, stride_d0n,
        stride_d1b, stride_d1m, stride_d1n,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        NUM_SMS: tl.constexpr, EVEN_K: tl.constexpr,
        NUM_D: tl.constexpr, D_OP: tl.constexpr, ACT: tl.constexpr, ACC_INT: tl.constexpr,
        A_ROW: tl.constexpr = True, B_ROW: tl.constexpr = False, A_VEC: tl.constexpr = 0,
        B_VEC: tl.constexpr = 0):
    M, N, K, stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn = _vec_hints(
        M, N, K, stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn, A_ROW, B_ROW, A_VEC, B_VEC)
    start_pid = tl.program_id(0)
    tiles_per_batch = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    num_tiles = tiles_per_batch * batch_count
    k_tiles = tl.cdiv(K, BLOCK_K)
    offs_k = tl.arange(0, BLOCK_K)
    # a second counter for the epilogue keeps the flattened loop's prologue and
    # epilogue from sharing a value (what the pipeliner wants)
    tile_id_c = start_pid - NUM_SMS
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=True):
        pid_b = (tile_id // tiles_per_batch).to(tl.int64)
        pid_m, pid_n = _tile_ids(tile_id % tiles_per_batch, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_m = offs_m < M
        mask_n = offs_n < N
        a_base = a_ptr + pid_b * stride_ab
        b_base = b_ptr + pid_b * stride_bb
        if ACC_INT:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(k_tiles):
            rk = kt * BLOCK_K + offs_k
            a_ptrs = a_base + offs_m[:, None] * stride_am + rk[None, :] * stride_ak
            b_ptrs = b_base + rk[:, None] * stride_bk + offs_n[None, :] * stride_bn
            if EVEN_K:
                a = tl.load(a_ptrs, mask=mask_m[:, None], other=0.0)
                b = tl.load(b_ptrs, mask=mask_n[None, :], other=0.0)
            else:
                a = tl.load(a_ptrs, mask=mask_m[:, None] & (rk[None, :] < K), other=0.0)
                b = tl.load(b_ptrs, mask=(rk[:, None] < K) & mask_n[None, :], other=0.0)
            acc = _mma(a, b, acc)
        tile_id_c += NUM_SMS
        pid_bc = (tile_id_c // tiles_per_batch).to(tl.int64)
        pid_mc, pid_nc = _tile_ids(tile_id_c % tiles_per_batch, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        offs_cm = pid_mc * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_cn = pid_nc * BLOCK_N + tl.arange(0, BLOCK_N)
        _epilogue_store(acc, offs_cm, offs_cn, M, N, c_ptr + pid_bc * stride_cb, stride_cm, stride_cn,
                        d0_ptr + pid_bc * stride_d0b, stride_d0m, stride_d0n,
                        d1_ptr + pid_bc * stride_d1b, stride_d1m, stride_d1n, NUM_D, D_OP, ACT)


@triton.jit
def _desc_load_a(a_desc, pid_b, off_m, off_k, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                 A_KMAJOR: tl.constexpr, BATCHED: tl.constexpr):
    # A stored M x K (K contiguous, "r") or K x M ("c"); returns the BLOCK_M x BLOCK_K tile
    if A_KMAJOR:
        if BATCHED:
            a = a_desc.load([pid_b, off_m, off_k]).reshape(BLOCK_M, BLOCK_K)
        else:
            a = a_desc.load([off_m, off_k])
    else:
        if BATCHED:
            a = a_desc.load([pid_b, off_k, off_m]).reshape(BLOCK_K, BLOCK_M).T
        else:
            a = a_desc.load([off_k, off_m]).T
    return a


@triton.jit
def _packed_desc_load_b(b_desc, pid_n, kt, k_tiles, BLOCK_N: tl.constexpr):
    # a pre-shuffled B (ck_gemm.problem.pack_b) seen as (N tiles * K tiles * BLOCK_N) x BLOCK_K rows:
    # the BLOCK_N x BLOCK_K tile (pid_n, kt) is BLOCK_N whole rows; returns its BLOCK_K x BLOCK_N view
    return b_desc.load([(pid_n * k_tiles + kt) * BLOCK_N, 0]).T


@triton.jit
def _desc_load_b(b_desc, pid_b, off_k, off_n, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
                 B_KMAJOR: tl.constexpr, BATCHED: tl.constexpr):
    # B stored N x K (K contiguous, "c") or K x N ("r"); returns the BLOCK_K x BLOCK_N tile
    if B_KMAJOR:
        if BATCHED:
            b = b_desc.load([pid_b, off_n, off_k]).reshape(BLOCK_N, BLOCK_K).T
        else:
            b = b_desc.load([off_n, off_k]).T
    else:
        if BATCHED:
            b = b_desc.load([pid_b, off_k, off_n]).reshape(BLOCK_K, BLOCK_N)
        else:
            b = b_desc.load([off_k, off_n])
    return b


@triton.jit
def gemm_tma_kernel(
        a_desc, b_desc, c_ptr, d0_ptr, d1_ptr, M, N, K,
        stride_cb, stride_cm, stride_cn, stride_ck,
        stride_d0b, stride_d0m, stride_d0n,
        stride_d1b, stride_d1m, stride_d1n,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        SPLIT_K: tl.constexpr, A_KMAJOR: tl.constexpr, B_KMAJOR: tl.constexpr, BATCHED: tl.constexpr,
        WARP_SPEC: tl.constexpr,
        NUM_D: tl.constexpr, D_OP: tl.constexpr, ACT: tl.constexpr, ACC_INT: tl.constexpr,
        PACKED_B: tl.constexpr = False):
    pid = tl.program_id(0)
    pid_b = tl.program_id(1)
    pid_k = tl.program_id(2)
    pid_m, pid_n = _tile_ids(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    k_start, k_end = _k_range(pid_k, K, BLOCK_K, SPLIT_K)
    k_tiles = tl.cdiv(K, BLOCK_K)
    if ACC_INT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # the descriptors zero-fill out-of-bounds rows and columns: no masks in the K loop
    for kt in tl.range(k_start, k_end, warp_specialize=WARP_SPEC):
        off_k = kt * BLOCK_K
        a = _desc_load_a(a_desc, pid_b, off_m, off_k, BLOCK_M, BLOCK_K, A_KMAJOR, BATCHED)
        if PACKED_B:
            b = _packed_desc_load_b(b_desc, pid_n, kt, k_tiles, BLOCK_N)
        else:
            b = _desc_load_b(b_desc, pid_b, off_k, off_n, BLOCK_K, BLOCK_N, B_KMAJOR, BATCHED)
        acc = _mma(a, b, acc)
    pb = pid_b.to(tl.int64)
    offs_m = off_m + tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    _epilogue_store(acc, offs_m, offs_n, M, N, c_ptr + pb * stride_cb + pid_k.to(tl.int64) * stride_ck,
                    stride_cm, stride_cn,
                    d0_ptr + pb * stride_d0b, stride_d0m, stride_d0n,
                    d1_ptr + pb * stride_d1b, stride_d1m, stride_d1n, NUM_D, D_OP, ACT)


@triton.jit
def gemm_tma_persistent_kernel(
        a_desc, b_desc, c_ptr, d0_ptr, d1_ptr, M, N, K, batch_count,
        stride_cb, stride_cm, stride_cn,
        stride_d0b, stride_d0m, stride_d0n,
        stride_d1b, stride_d1m, stride_d1n,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        NUM_SMS: tl.constexpr, A_KMAJOR: tl.constexpr, B_KMAJOR: tl.constexpr, BATCHED: tl.constexpr,
        WARP_SPEC: tl.constexpr,
        NUM_D: tl.constexpr, D_OP: tl.constexpr, ACT: tl.constexpr, ACC_INT: tl.constexpr,
        PACKED_B: tl.constexpr = False):
    start_pid = tl.program_id(0)
    tiles_per_batch = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    num_tiles = tiles_per_batch * batch_count
    k_tiles = tl.cdiv(K, BLOCK_K)
    tile_id_c = start_pid - NUM_SMS
    # Hopper's automatic warp specialisation (triton 3.6) handles the innermost
    # loop only: with WARP_SPEC the K loop is specialised and the tile loop stays
    # plain; without it the tile loop is flattened and software-pipelined
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=not WARP_SPEC):
        pid_b = tile_id // tiles_per_batch
        pid_m, pid_n = _tile_ids(tile_id % tiles_per_batch, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        if ACC_INT:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in tl.range(k_tiles, warp_specialize=WARP_SPEC):
            off_k = kt * BLOCK_K
            a = _desc_load_a(a_desc, pid_b, off_m, off_k, BLOCK_M, BLOCK_K, A_KMAJOR, BATCHED)
            if PACKED_B:
                b = _packed_desc_load_b(b_desc, pid_n, kt, k_tiles, BLOCK_N)
            else:
                b = _desc_load_b(b_desc, pid_b, off_k, off_n, BLOCK_K, BLOCK_N, B_KMAJOR, BATCHED)
            acc = _mma(a, b, acc)
        tile_id_c += NUM_SMS
        pb = (tile_id_c // tiles_per_batch).to(tl.int64)
        pid_mc, pid_nc = _tile_ids(tile_id_c % tiles_per_batch, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        offs_cm = pid_mc * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_cn = pid_nc * BLOCK_N + tl.arange(0, BLOCK_N)
        _epilogue_store(acc, offs_cm, offs_cn, M, N, c_ptr + pb * stride_cb, stride_cm, stride_cn,
                        d0_ptr + pb * stride_d0b, stride_d0m, stride_d0n,
                        d1_ptr + pb * stride_d1b, stride_d1m, stride_d1n, NUM_D, D_OP, ACT)


@triton.jit
def gemm_tma_cs_kernel(
        a_desc, b_desc, c_desc, d0_ptr, d1_ptr, M, N, K,
        stride_d0b, stride_d0m, stride_d0n,
        stride_d1b, stride_d1m, stride_d1n,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        A_KMAJOR: tl.constexpr, B_KMAJOR: tl.constexpr, BATCHED: tl.constexpr, EPI_SUBTILE: tl.constexpr,
        NUM_D: tl.constexpr, D_OP: tl.constexpr, ACT: tl.constexpr, ACC_INT: tl.constexpr,
        PACKED_B: tl.constexpr = False):
    # gemm_tma_kernel (without split-K / warp specialisation) storing C by descriptor
    pid = tl.program_id(0)
    pid_b = tl.program_id(1)
    pid_m, pid_n = _tile_ids(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    k_tiles = tl.cdiv(K, BLOCK_K)
    if ACC_INT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in tl.range(0, k_tiles):
        off_k = kt * BLOCK_K
        a = _desc_load_a(a_desc, pid_b, off_m, off_k, BLOCK_M, BLOCK_K, A_KMAJOR, BATCHED)
        if PACKED_B:
            b = _packed_desc_load_b(b_desc, pid_n, kt, k_tiles, BLOCK_N)
        else:
            b = _desc_load_b(b_desc, pid_b, off_k, off_n, BLOCK_K, BLOCK_N, B_KMAJOR, BATCHED)
        acc = _mma(a, b, acc)
    pb = pid_b.to(tl.int64)
    _epilogue_desc_store(acc, c_desc, pid_b, off_m, off_n, M, N,
                         d0_ptr + pb * stride_d0b, stride_d0m, stride_d0n,
                         d1_ptr + pb * stride_d1b, stride_d1m, stride_d1n,
                         BLOCK_M, BLOCK_N, EPI_SUBTILE, BATCHED, NUM_D, D_OP, ACT)


@triton.jit
def gemm_tma_persistent_cs_kernel(
        a_desc, b_desc, c_desc, d0_ptr, d1_ptr, M, N, K, batch_count,
        stride_d0b, stride_d0m, stride_d0n,
        stride_d1b, stride_d1m, stride_d1n,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        NUM_SMS: tl.constexpr, A_KMAJOR: tl.constexpr, B_KMAJOR: tl.constexpr, BATCHED: tl.constexpr,
        EPI_SUBTILE: tl.constexpr,
        NUM_D: tl.constexpr, D_OP: tl.constexpr, ACT: tl.constexpr, ACC_INT: tl.constexpr,
        PACKED_B: tl.constexpr = False):
    # gemm_tma_persistent_kernel (flattened, software-pipelined tile loop, no warp
    # specialisation) storing C by descriptor: the TMA store of one tile is issued
    # asynchronously and drains while the next tile's loads are already in flight
    start_pid = tl.program_id(0)
    tiles_per_batch = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    num_tiles = tiles_per_batch * batch_count
    k_tiles = tl.cdiv(K, BLOCK_K)
    # separate epilogue counter, as in gemm_persistent_kernel
    tile_id_c = start_pid - NUM_SMS
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=True):
        pid_b = tile_id // tiles_per_batch
        pid_m, pid_n = _tile_ids(tile_id % tiles_per_batch, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        if ACC_INT:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in tl.range(k_tiles):
            off_k = kt * BLOCK_K
            a = _desc_load_a(a_desc, pid_b, off_m, off_k, BLOCK_M, BLOCK_K, A_KMAJOR, BATCHED)
            if PACKED_B:
                b = _packed_desc_load_b(b_desc, pid_n, kt, k_tiles, BLOCK_N)
            else:
                b = _desc_load_b(b_desc, pid_b, off_k, off_n, BLOCK_K, BLOCK_N, B_KMAJOR, BATCHED)
            acc = _mma(a, b, acc)
        tile_id_c += NUM_SMS
        pid_bc = tile_id_c // tiles_per_batch
        pb = pid_bc.to(tl.int64)
        pid_mc, pid_nc = _tile_ids(tile_id_c % tiles_per_batch, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        _epilogue_desc_store(acc, c_desc, pid_bc, pid_mc * BLOCK_M, pid_nc * BLOCK_N, M, N,
                             d0_ptr + pb * stride_d0b, stride_d0m, stride_d0n,
                             d1_ptr + pb * stride_d1b, stride_d1m, stride_d1n,
                             BLOCK_M, BLOCK_N, EPI_SUBTILE, BATCHED, NUM_D, D_OP, ACT)


@triton.jit
def gemm_splitk_reduce_kernel(
        ws_ptr, c_ptr, d0_ptr, d1_ptr, M, N,
        stride_wk, stride_wb, stride_wm,
        stride_cb, stride_cm, stride_cn,
        stride_d0b, stride_d0m, stride_d0n,
        stride_d1b, stride_d1m, stride_d1n,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr,
        NUM_D: tl.constexpr, D_OP: tl.constexpr, ACT: tl.constexpr, ACC_INT: tl.constexpr):
    # fixed summation order over the splits: bitwise reproducible, unlike atomics
    pid = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ptrs = ws_ptr + pid_b * stride_wb + offs_m.to(tl.int64)[:, None] * stride_wm + offs_n[None, :]
    if ACC_INT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ptrs + s * stride_wk, mask=mask, other=0)
    _epilogue_store(acc, offs_m, offs_n, M, N, c_ptr + pid_b * stride_cb, stride_cm, stride_cn,
                    d0_ptr + pid_b * stride_d0b, stride_d0m, stride_d0n,
                    d1_ptr + pid_b * stride_d1b, stride_d1m, stride_d1n, NUM_D, D_OP, ACT)


# -- stream-K: a persistent grid that splits the (tile, K-iteration) space evenly ----------------
#
# The work of a GEMM is tiles x k_iters units (one BLOCK_K step of one C tile).  The first
# ``dp_tiles`` tiles (whole waves of the grid, less one) run data-parallel: program p owns tiles
# p, p + G, ...  The rest (the last one to two waves' worth) is cut into G contiguous, equal
# ranges of units, one per program, so every SM gets the same share whatever the tile count: no
# wave quantisation, and a problem with fewer tiles than SMs still fills every SM (split-K
# chosen per problem).  A tile whose units several programs share is "fixed up" in the same
# launch: each contributor stores its fp32 partial into its own workspace slot (a program has at
# most two partial tiles: where its range starts and where it ends), then increments the tile's
# counter; the one that arrives last sums the contributors' partials (its own too, all from
# memory) in program order, a few rows at a time (the same order whoever is last, so the result
# is bitwise reproducible; a first version kept its own tile, the sum and the loaded partial in
# registers at once and spilled: 0.1-0.5x the data-parallel kernels on the H100), applies the
# epilogue, stores C and resets the counter to zero for the next launch.  Nobody waits for
# anybody (no spin), so the kernel cannot deadlock whatever runs beside it.

#: programs that share one stream-K tile, about at most: a tile of many short K ranges (small M
#: and N, long K) would otherwise have its last contributor read dozens of partials in turn
SK_MAX_SPLIT: tl.constexpr = tl.constexpr(8)

@triton.jit
def _sk_first_unit(p, sk_units, G):
    # first unit of program p's stream-K range: floor(p * units / G) (64-bit: no overflow)
    return ((sk_units.to(tl.int64) * p) // G).to(tl.int32)


@triton.jit
def _sk_owner(x, sk_units, G):
    # the program whose range holds unit x: the largest p with floor(p * units / G) <= x
    return (((G.to(tl.int64) * (x + 1)) + sk_units - 1) // sk_units - 1).to(tl.int32)


@triton.jit
def _sk_finish(acc, tile, k0, k1, k_iters, pid, seg_first, dp_units, sk_units, G,
               ws_ptr, lock_ptr, off_m, off_n, M, N, c_ptr, stride_cm, stride_cn,
               d0_ptr, stride_d0m, stride_d0n, d1_ptr, stride_d1m, stride_d1n,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SUB_M: tl.constexpr,
               NUM_D: tl.constexpr, D_OP: tl.constexpr, ACT: tl.constexpr, ACC_INT: tl.constexpr):
    # the end of one segment (units k0..k1 of the tile at off_m, off_n): store the tile, or fix it up
    if k0 == 0 and k1 == k_iters:
        _epilogue_store(acc, off_m + tl.arange(0, BLOCK_M), off_n + tl.arange(0, BLOCK_N), M, N,
                        c_ptr, stride_cm, stride_cn,
                        d0_ptr, stride_d0m, stride_d0n, d1_ptr, stride_d1m, stride_d1n, NUM_D, D_OP, ACT)
    else:
        tile_elems: tl.constexpr = BLOCK_M * BLOCK_N
        offs_t = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        # slot 0: the segment that starts the program's range, slot 1: the one that ends it
        slot = tl.where(seg_first, 0, 1)
        tl.store(ws_ptr + (pid * 2 + slot).to(tl.int64) * tile_elems + offs_t, acc)
        # every thread's partial is written before the counter moves (release, GPU scope)
        tl.debug_barrier()
        first_unit = tile * k_iters - dp_units
        p_lo = _sk_owner(first_unit, sk_units, G)
        p_hi = _sk_owner(first_unit + k_iters - 1, sk_units, G)
        arrived = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == p_hi - p_lo:
            # the last contributor sums every partial (its own too, from memory) in program order,
            # SUB_M rows at a time: one C tile's worth of registers at most, not three
            offs_c = tl.arange(0, SUB_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
            for r in tl.static_range(0, BLOCK_M, SUB_M):
                if ACC_INT:
                    part = tl.zeros((SUB_M, BLOCK_N), dtype=tl.int32)
                else:
                    part = tl.zeros((SUB_M, BLOCK_N), dtype=tl.float32)
                for q in range(p_lo, p_hi + 1):
                    # tile is q's first segment when q's range starts inside it
                    q_slot = tl.where(_sk_first_unit(q, sk_units, G) >= first_unit, 0, 1)
                    part += tl.load(ws_ptr + (q * 2 + q_slot).to(tl.int64) * tile_elems + r * BLOCK_N + offs_c,
                                    cache_modifier=".cg")
                _epilogue_store(part, off_m + r + tl.arange(0, SUB_M), off_n + tl.arange(0, BLOCK_N), M, N,
                                c_ptr, stride_cm, stride_cn,
                                d0_ptr, stride_d0m, stride_d0n, d1_ptr, stride_d1m, stride_d1n, NUM_D, D_OP, ACT)
            tl.atomic_xchg(lock_ptr + tile, 0, sem="relaxed", scope="gpu")


@triton.jit
def _sk_plan(M, N, K, batch_count, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             G):
    # tiles, k_iters, data-parallel tiles (whole waves less one), stream-K units
    tiles_per_batch = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    num_tiles = tiles_per_batch * batch_count
    k_iters = tl.cdiv(K, BLOCK_K)
    full_waves = num_tiles // G
    dp_tiles = tl.where(num_tiles % G == 0, num_tiles, tl.maximum(full_waves - 1, 0) * G)
    sk_units = (num_tiles - dp_tiles) * k_iters
    return tiles_per_batch, num_tiles, k_iters, dp_tiles, sk_units


@triton.jit
def gemm_tma_streamk_kernel(
        a_desc, b_desc, c_ptr, d0_ptr, d1_ptr, ws_ptr, lock_ptr, M, N, K, batch_count,
        stride_cb, stride_cm, stride_cn,
        stride_d0b, stride_d0m, stride_d0n,
        stride_d1b, stride_d1m, stride_d1n,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        A_KMAJOR: tl.constexpr, B_KMAJOR: tl.constexpr, BATCHED: tl.constexpr, SUB_M: tl.constexpr,
        NUM_D: tl.constexpr, D_OP: tl.constexpr, ACT: tl.constexpr, ACC_INT: tl.constexpr):
    # the grid's size (the arch's SM count, from the launcher) is the G of the plan
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    tiles_per_batch, num_tiles, k_iters, dp_tiles, sk_units = _sk_plan(
        M, N, K, batch_count, BLOCK_M, BLOCK_N, BLOCK_K, G)
    dp_units = dp_tiles * k_iters
    # data-parallel part: whole tiles, grid-strided
    for tile in range(pid, dp_tiles, G):
        pid_b = tile // tiles_per_batch
        pid_m, pid_n = _tile_ids(tile % tiles_per_batch, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        if ACC_INT:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(0, k_iters):
            a = _desc_load_a(a_desc, pid_b, pid_m * BLOCK_M, kt * BLOCK_K, BLOCK_M, BLOCK_K, A_KMAJOR, BATCHED)
            b = _desc_load_b(b_desc, pid_b, kt * BLOCK_K, pid_n * BLOCK_N, BLOCK_K, BLOCK_N, B_KMAJOR, BATCHED)
            acc = _mma(a, b, acc)
        pb = pid_b.to(tl.int64)
        _epilogue_store(acc, pid_m * BLOCK_M + tl.arange(0, BLOCK_M), pid_n * BLOCK_N + tl.arange(0, BLOCK_N),
                        M, N, c_ptr + pb * stride_cb, stride_cm, stride_cn,
                        d0_ptr + pb * stride_d0b, stride_d0m, stride_d0n,
                        d1_ptr + pb * stride_d1b, stride_d1m, stride_d1n, NUM_D, D_OP, ACT)
    # stream-K part: this program's equal share of the remaining units
    # at most one program per unit, so that every program of the stream-K part has work (the
    # fix-up counts the programs between a tile's first and last unit), and about SK_MAX_SPLIT
    # programs per tile at most (its last contributor reads the others' partials one by one)
    G_sk = tl.minimum(tl.minimum(G, sk_units), (num_tiles - dp_tiles) * SK_MAX_SPLIT)
    if pid < G_sk:
        u0 = _sk_first_unit(pid, sk_units, G_sk)
        u1 = _sk_first_unit(pid + 1, sk_units, G_sk)
        u = u0
        while u < u1:
            tile = dp_tiles + u // k_iters
            k0 = u % k_iters
            k1 = tl.minimum(k_iters, k0 + (u1 - u))
            pid_b = tile // tiles_per_batch
            pid_m, pid_n = _tile_ids(tile % tiles_per_batch, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            if ACC_INT:
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
            else:
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for kt in range(k0, k1):
                a = _desc_load_a(a_desc, pid_b, pid_m * BLOCK_M, kt * BLOCK_K, BLOCK_M, BLOCK_K, A_KMAJOR,
                                 BATCHED)
                b = _desc_load_b(b_desc, pid_b, kt * BLOCK_K, pid_n * BLOCK_N, BLOCK_K, BLOCK_N, B_KMAJOR,
                                 BATCHED)
                acc = _mma(a, b, acc)
            pb = pid_b.to(tl.int64)
            _sk_finish(acc, tile, k0, k1, k_iters, pid, u == u0, dp_units, sk_units, G_sk,
                       ws_ptr, lock_ptr, pid_m * BLOCK_M, pid_n * BLOCK_N, M, N,
                       c_ptr + pb * stride_cb, stride_cm, stride_cn,
                       d0_ptr + pb * stride_d0b, stride_d0m, stride_d0n,
                       d1_ptr + pb * stride_d1b, stride_d1m, stride_d1n,
                       BLOCK_M, BLOCK_N, SUB_M, NUM_D, D_OP, ACT, ACC_INT)
            u += k1 - k0


@triton.jit
def gemm_streamk_kernel(
        a_ptr, b_ptr, c_ptr, d0_ptr, d1_ptr, ws_ptr, lock_ptr, M, N, K, batch_count,
        stride_ab, stride_am, stride_ak,
        stride_bb, stride_bk, stride_bn,
        stride_cb, stride_cm, stride_cn,
        stride_d0b, stride_d0m, stride_d0n,
        stride_d1b, stride_d1m, stride_d1n,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        EVEN_K: tl.constexpr, SUB_M: tl.constexpr,
        NUM_D: tl.constexpr, D_OP: tl.constexpr, ACT: tl.constexpr, ACC_INT: tl.constexpr):
    # gemm_tma_streamk_kernel with pointer loads (any alignment, AMD targets)
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    tiles_per_batch, num_tiles, k_iters, dp_tiles, sk_units = _sk_plan(
        M, N, K, batch_count, BLOCK_M, BLOCK_N, BLOCK_K, G)
    dp_units = dp_tiles * k_iters
    offs_k = tl.arange(0, BLOCK_K)
    for tile in range(pid, dp_tiles, G):
        pid_b = (tile // tiles_per_batch).to(tl.int64)
        pid_m, pid_n = _tile_ids(tile % tiles_per_batch, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = _ptr_k_loop(a_ptr + pid_b * stride_ab, b_ptr + pid_b * stride_bb, offs_m, offs_n, offs_k, M, N, K,
                          0, k_iters, stride_am, stride_ak, stride_bk, stride_bn,
                          BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, ACC_INT)
        _epilogue_store(acc, offs_m, offs_n, M, N, c_ptr + pid_b * stride_cb, stride_cm, stride_cn,
                        d0_ptr + pid_b * stride_d0b, stride_d0m, stride_d0n,
                        d1_ptr + pid_b * stride_d1b, stride_d1m, stride_d1n, NUM_D, D_OP, ACT)
    # at most one program per unit, so that every program of the stream-K part has work (the
    # fix-up counts the programs between a tile's first and last unit), and about SK_MAX_SPLIT
    # programs per tile at most (its last contributor reads the others' partials one by one)
    G_sk = tl.minimum(tl.minimum(G, sk_units), (num_tiles - dp_tiles) * SK_MAX_SPLIT)
    if pid < G_sk:
        u0 = _sk_first_unit(pid, sk_units, G_sk)
        u1 = _sk_first_unit(pid + 1, sk_units, G_sk)
        u = u0
        while u < u1:
            tile = dp_tiles + u // k_iters
            k0 = u % k_iters
            k1 = tl.minimum(k_iters, k0 + (u1 - u))
            pid_b = (tile // tiles_per_batch).to(tl.int64)
            pid_m, pid_n = _tile_ids(tile % tiles_per_batch, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            acc = _ptr_k_loop(a_ptr + pid_b * stride_ab, b_ptr + pid_b * stride_bb, offs_m, offs_n, offs_k,
                              M, N, K, k0, k1, stride_am, stride_ak, stride_bk, stride_bn,
                              BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, ACC_INT)
            _sk_finish(acc, tile, k0, k1, k_iters, pid, u == u0, dp_units, sk_units, G_sk,
                       ws_ptr, lock_ptr, pid_m * BLOCK_M, pid_n * BLOCK_N, M, N,
                       c_ptr + pid_b * stride_cb, stride_cm, stride_cn,
                       d0_ptr + pid_b * stride_d0b, stride_d0m, stride_d0n,
                       d1_ptr + pid_b * stride_d1b, stride_d1m, stride_d1n,
                       BLOCK_M, BLOCK_N, SUB_M, NUM_D, D_OP, ACT, ACC_INT)
            u += k1 - k0


@triton.jit
def _ptr_k_loop(a_base, b_base, offs_m, offs_n, offs_k, M, N, K, k0, k1,
                stride_am, stride_ak, stride_bk, stride_bn,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                EVEN_K: tl.constexpr, ACC_INT: tl.constexpr):
    # acc of K steps k0..k1 of the tile at offs_m x offs_n, through masked pointer loads
    mask_m = offs_m < M
    mask_n = offs_n < N
    a_ptrs = a_base + offs_m[:, None] * stride_am + (k0 * BLOCK_K + offs_k)[None, :] * stride_ak
    b_ptrs = b_base + (k0 * BLOCK_K + offs_k)[:, None] * stride_bk + offs_n[None, :] * stride_bn
    if ACC_INT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(k0, k1):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=mask_m[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=mask_n[None, :], other=0.0)
        else:
            k_left = K - kt * BLOCK_K
            a = tl.load(a_ptrs, mask=mask_m[:, None] & (offs_k[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & mask_n[None, :], other=0.0)
        acc = _mma(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


# -- pre-shuffled B (CK's preshuffle GEMM) --------------------------------------------------------
#
# B arrives packed once in the kernel's tile order: [N tiles][K tiles][BLOCK_N][BLOCK_K], zero-padded
# (ck_gemm.problem.pack_b).  The B tile of a K step is then one contiguous BLOCK_N x BLOCK_K block:
# unmasked, fully coalesced loads with no stride arithmetic, and the padding makes the N and K tails
# zeros rather than masked loads.  A keeps its masks (M rows, the K tail); C its edge mask.

@triton.jit
def _packed_k_loop(a_base, b_tiles, offs_m, offs_k, M, K, k0, k1, stride_am, stride_ak,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   EVEN_K: tl.constexpr, ACC_INT: tl.constexpr):
    # acc of K tiles k0..k1 of the tile whose packed B tiles start at b_tiles (K tiles one after another)
    mask_m = offs_m < M
    a_ptrs = a_base + offs_m[:, None] * stride_am + (k0 * BLOCK_K + offs_k)[None, :] * stride_ak
    # the BLOCK_K x BLOCK_N view of a tile stored BLOCK_N rows of BLOCK_K (K contiguous)
    b_ptrs = b_tiles + k0 * (BLOCK_N * BLOCK_K) + tl.arange(0, BLOCK_N)[None, :] * BLOCK_K + offs_k[:, None]
    if ACC_INT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(k0, k1):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=mask_m[:, None], other=0.0)
        else:
            a = tl.load(a_ptrs, mask=mask_m[:, None] & (offs_k[None, :] < K - kt * BLOCK_K), other=0.0)
        b = tl.load(b_ptrs)
        acc = _mma(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_N * BLOCK_K
    return acc


@triton.jit
def gemm_preshuffle_kernel(
        a_ptr, b_ptr, c_ptr, d0_ptr, d1_ptr, M, N, K,
        stride_am, stride_ak,
        stride_cm, stride_cn, stride_ck,
        stride_d0m, stride_d0n,
        stride_d1m, stride_d1n,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        EVEN_K: tl.constexpr,
        NUM_D: tl.constexpr, D_OP: tl.constexpr, ACT: tl.constexpr, ACC_INT: tl.constexpr,
        SPLIT_K: tl.constexpr = 1):
    """One program per C tile and K split (grid (tiles, 1, SPLIT_K)); B pre-shuffled for
    BLOCK_N x BLOCK_K.  With SPLIT_K > 1, C is the fp32/int32 workspace (one M x N slice per
    split, ``stride_ck`` apart, no epilogue) that ``gemm_splitk_reduce_kernel`` sums."""
    pid_m, pid_n = _tile_ids(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(2)
    k_tiles = tl.cdiv(K, BLOCK_K)
    k0, k1 = _k_range(pid_k, K, BLOCK_K, SPLIT_K)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    b_tiles = b_ptr + pid_n.to(tl.int64) * k_tiles * (BLOCK_N * BLOCK_K)
    acc = _packed_k_loop(a_ptr, b_tiles, offs_m, offs_k, M, K, k0, k1, stride_am, stride_ak,
                         BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, ACC_INT)
    if SPLIT_K > 1:
        c_ptr += pid_k.to(tl.int64) * stride_ck
    _epilogue_store(acc, offs_m, offs_n, M, N, c_ptr, stride_cm, stride_cn,
                    d0_ptr, stride_d0m, stride_d0n, d1_ptr, stride_d1m, stride_d1n, NUM_D, D_OP, ACT)


@triton.jit
def gemm_preshuffle_persistent_kernel(
        a_ptr, b_ptr, c_ptr, d0_ptr, d1_ptr, M, N, K,
        stride_am, stride_ak,
        stride_cm, stride_cn,
        stride_d0m, stride_d0n,
        stride_d1m, stride_d1n,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        NUM_SMS: tl.constexpr, EVEN_K: tl.constexpr,
        NUM_D: tl.constexpr, D_OP: tl.constexpr, ACT: tl.constexpr, ACC_INT: tl.constexpr):
    """A grid of NUM_SMS programs looping over the C tiles; B pre-shuffled for BLOCK_N x BLOCK_K."""
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    offs_k = tl.arange(0, BLOCK_K)
    for tile_id in tl.range(tl.program_id(0), num_tiles, NUM_SMS):
        pid_m, pid_n = _tile_ids(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        b_tiles = b_ptr + pid_n.to(tl.int64) * k_tiles * (BLOCK_N * BLOCK_K)
        acc = _packed_k_loop(a_ptr, b_tiles, offs_m, offs_k, M, K, 0, k_tiles, stride_am, stride_ak,
                             BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, ACC_INT)
        _epilogue_store(acc, offs_m, offs_n, M, N, c_ptr, stride_cm, stride_cn,
                        d0_ptr, stride_d0m, stride_d0n, d1_ptr, stride_d1m, stride_d1n, NUM_D, D_OP, ACT)


# What the kernels specialise on (ck_core.backends.triton_artifacts.specialisation): tiles, dtypes,
# layout (unit strides: Triton's constant 1, the layout's contiguous dimension) and the epilogue are
# the code; M, N, K are the alignment class only (divisible by 16 or not: the masks along a
# contiguous dimension vectorise on it), never the constant 1 (M = 1 loads the same kernel as any M);
# the batch count and the split-K reduction's sizes are plain run-time integers.
def _apply_policy():
    from ck_core.backends.triton_artifacts import specialisation

    for fn in (gemm_plain_kernel, gemm_persistent_kernel, gemm_tma_kernel, gemm_tma_persistent_kernel,
               gemm_tma_cs_kernel, gemm_tma_persistent_cs_kernel, gemm_splitk_reduce_kernel,
               gemm_tma_streamk_kernel, gemm_streamk_kernel,
               gemm_preshuffle_kernel, gemm_preshuffle_persistent_kernel):
        names = {p.name for p in getattr(fn, "params", ())}
        specialisation(runtime=[n for n in ("batch_count",) if n in names],
                       align_only=[n for n in ("M", "N", "K") if n in names])(fn)


_apply_policy()
