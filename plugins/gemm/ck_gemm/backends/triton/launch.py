"""Plain-Python launcher for the Triton GEMM kernels on torch tensors.

Operands are passed in their *stored* form, CK style (letters for A, B, C):

=======  ====================  ====================  ====================
layout   A stored as           B stored as           C stored as
=======  ====================  ====================  ====================
``r``    (M, K) row-major      (K, N) row-major      (M, N) row-major
``c``    (K, M) = MxK col-maj  (N, K) = KxN col-maj  (N, M) = MxN col-maj
=======  ====================  ====================  ====================

so ``rcr`` is ``C = A @ B.T`` with ``B`` stored N x K.  A leading batch dim
is allowed on any operand (a 2-D operand is broadcast over the batch).  D
tensors are given in C's stored orientation and broadcast against it (a
bias of shape (N,) for row-major C).
"""
from __future__ import annotations

import functools
import logging

from ck_core.errors import InvalidProblem, UnsupportedProblem
from ck_core.memory import persistent

from .aot import DEFAULT_OUT, desc_block_shapes, desc_c_block_shape, kernel_for, parse_layout
from .configs import as_config

log = logging.getLogger(__name__)

def _dtype_token(t) -> str:
    import torch
    m = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.int8: "int8",
         torch.int32: "int32"}
    for name in ("float8_e4m3fn",):
        if hasattr(torch, name):
            m[getattr(torch, name)] = "fp8"
    if hasattr(torch, "float8_e5m2"):
        m[torch.float8_e5m2] = "bf8"
    try:
        return m[t]
    except KeyError:
        raise InvalidProblem(f"dtype {t}: the Triton GEMM takes fp16, bf16, fp32, fp8 (e4m3fn) or int8") from None


from ck_core.dtypes import torch_dtype as _torch_dtype  # noqa: E402


@functools.lru_cache(maxsize=512)
def _spec(cfg, dtype, layout, out_dtype, d_dtype, num_d, d_op, activation, batched, even_k, num_sms,
          preshuffle=False, vec=(0, 0)):
    return kernel_for(cfg, dtype=dtype, layout=layout, out_dtype=out_dtype, d_dtype=d_dtype, num_d=num_d,
                      d_op=d_op, activation=activation, batched=batched, even_k=even_k, num_sms=num_sms,
                      preshuffle=preshuffle, vec=vec)


#: the pointer variants whose kernels take the A_VEC / B_VEC facts (``kernel_for``'s ``vec``)
VEC_VARIANTS = ("plain", "persistent")


def vec_elems(t, extent: int) -> int:
    """The vector (elements) the loads of stored operand ``t`` along its contiguous (last) axis
    can use where Triton's own specialisation does not see one: the largest power of two, at
    most 16 bytes, dividing ``extent`` (the problem's size along that axis: its mask bound), the
    other strides of ``t`` the kernel reads (row, and batch where the batch is above 1) and its
    base offset; 0 where that is 1
    (nothing to say) or where all of them are multiples of 16 elements (Triton specialises those
    itself: the kernel stays the one ``ck build`` compiled).

    Why it matters: a masked load along the contiguous axis is a vector only where the compiler
    knows the mask bound is a multiple of the vector, so a column-major A with M = 404 (or a
    row-major B with N = 4100, a row-major A with K % 16 != 0) was read one element a load,
    without cp.async (sm90 PTX of the plain kernel, ccr 128x128x64: 32 ld.global.b16 a thread
    per K step; with A_VEC = 4, 8-byte cp.async)."""
    eb = t.element_size()
    cap = max(1, 16 // eb)
    # the strides the kernel is given: the row stride, and the batch stride of a batch above 1
    # (else 0, see ``gemm``'s bstride)
    vals = [int(extent), int(t.stride(-2))] + ([int(t.stride(0))] if t.dim() == 3 and t.shape[0] > 1 else [])
    ptr = t.data_ptr()
    if ptr % eb:
        return 0
    vals.append(ptr // eb)
    if all(v % 16 == 0 for v in vals[:-1]) and ptr % 16 == 0:
        return 0
    v = cap
    while v > 1 and any(x % v for x in vals):
        v //= 2
    return v if v > 1 else 0


@functools.lru_cache(maxsize=16)
def _device_info(index: int):
    """(SMs / CUs from the device's ArchSpec, compute capability, whether on ROCm)."""
    import torch
    from ck_core.device import current_arch

    sms = current_arch(torch.device("cuda", index)).compute_units
    return sms, torch.cuda.get_device_capability(index), bool(getattr(torch.version, "hip", None))


def _tma_ok(t, layout_row_major: bool) -> bool:
    """Tensor descriptors need a unit last stride, 16-byte aligned base and other strides."""
    eb = t.element_size()
    if t.stride(-1) != 1 or t.data_ptr() % 16:
        return False
    return all(s > 0 and (s * eb) % 16 == 0 for s in t.stride()[:-1])


def _descriptor_violation(cfg, a, b, c, a_r, b_r, c_r, batched_io, no_tma) -> str | None:
    """Why the tensor descriptors of a TMA ``cfg`` cannot describe these tensors (None: they can)."""
    if cfg.is_tma:
        if no_tma:
            return "tensor descriptors need sm90+"
        if batched_io and (a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0]):
            return "a broadcast batch operand"
        if not (_tma_ok(a, a_r) and _tma_ok(b, b_r)):
            return "operand strides or base not 16-byte aligned / not contiguous"
    if cfg.c_desc:
        if not c_r:
            return "column-major C cannot be stored through a descriptor"
        if not _tma_ok(c, True):
            return "C strides or base not 16-byte aligned / not contiguous"
    return None


def gemm(a, b, *, layout: str = "rcr", config, c=None, d_tensors=(), d_op: str = "add",
         activation=None, out_dtype=None, num_sms: int | None = None, kernel_name: str | None = None,
         launch=None, packed_n: int | None = None):
    """C = activation(A @ B  (+|*) D0 (+|*) D1), batched, on CUDA (or CPU under TRITON_INTERPRET=1).

    ``config``: a GemmConfig, its dict or name -- exactly the kernel that runs
    (``ck_gemm.matmul`` and the Dispatcher choose one; this function never does).
    ``out_dtype``: torch dtype of C (default: input dtype; bf16 for fp8; int32 for int8).
    Returns C in its stored layout (``c`` if given, which is written in place).
    ``kernel_name``: the kernel key's name: the cache entry its kernels are loaded from
    (``ck build`` writes it) and the name in error messages (default: the config's).
    ``launch``: called as ``launch(spec, vals, M, N, batch, name)`` for each kernel
    launch instead of launching (recording a launch, or ``ck build``'s representative call).
    A TMA variant whose tensors a descriptor cannot describe (misaligned strides,
    a broadcast batch operand, no Hopper), or a C-descriptor variant (tma_cs,
    tma_persistent_cs) with a column-major or misaligned C, raises
    UnsupportedProblem: the Dispatcher's ``supports()`` keeps such problems on
    pointer keys, so only tensors the problem does not describe get here.
    ``packed_n``: B is pre-shuffled for the config's N x K tile (``ck_gemm.problem.pack_b``:
    ``[ceil(N/block_n), ceil(K/block_k), block_n, block_k]``) and N is this; layout rcr, 2-D A.
    """
    import torch

    if packed_n is not None:
        return _gemm_packed(a, b, int(packed_n), layout=layout, config=config, c=c, d_tensors=d_tensors,
                            d_op=d_op, activation=activation, out_dtype=out_dtype, num_sms=num_sms,
                            kernel_name=kernel_name, launch=launch)

    a_r, b_r, c_r = parse_layout(layout)
    for name, t in (("A", a), ("B", b), ("c", c)) + tuple((f"D{i}", d) for i, d in enumerate(d_tensors)):
        if not isinstance(t, torch.Tensor) and (t is not None or name != "c"):
            raise InvalidProblem(f"gemm: {name} is a {type(t).__name__}; the Triton GEMM takes torch tensors "
                                 f"(torch.as_tensor(x, device=...))")
    if a.dim() not in (2, 3) or b.dim() not in (2, 3):
        raise InvalidProblem(f"gemm: A and B must be 2-D or 3-D (batch first), got {a.dim()}-D and {b.dim()}-D")
    dt = _dtype_token(a.dtype)
    if _dtype_token(b.dtype) != dt:
        raise InvalidProblem(f"gemm: A is {a.dtype} but B is {b.dtype}; cast one of them")
    if a.device != b.device:
        raise InvalidProblem(f"gemm: A on {a.device} but B on {b.device}")
    al = a if a_r else a.transpose(-1, -2)   # logical (.., M, K)
    bl = b if b_r else b.transpose(-1, -2)   # logical (.., K, N)
    M, K = al.shape[-2:]
    K2, N = bl.shape[-2:]
    if K != K2:
        raise InvalidProblem(f"gemm[{layout}]: A is {M}x{K} but B is {K2}x{N} (logical); K must match")
    batch = max(a.shape[0] if a.dim() == 3 else 1, b.shape[0] if b.dim() == 3 else 1)
    for name, t in (("A", a), ("B", b)):
        if t.dim() == 3 and t.shape[0] not in (1, batch):
            raise InvalidProblem(f"gemm: {name} has batch {t.shape[0]}, expected 1 or {batch}")
    batched_io = a.dim() == 3 or b.dim() == 3
    if min(M, N, K) < 1:
        raise InvalidProblem(f"gemm: empty problem M={M} N={N} K={K}")

    out_token = _dtype_token(out_dtype) if out_dtype is not None else DEFAULT_OUT[dt]
    c_stored_shape = (M, N) if c_r else (N, M)
    if batched_io:
        c_stored_shape = (batch,) + c_stored_shape
    if c is None:
        c = torch.empty(c_stored_shape, device=a.device, dtype=_torch_dtype(out_token))
    else:
        if tuple(c.shape) != c_stored_shape:
            raise InvalidProblem(f"gemm: c has shape {tuple(c.shape)}, expected {c_stored_shape} for {layout}")
        out_token = _dtype_token(c.dtype)
    cl = c if c_r else c.transpose(-1, -2)

    d_tensors = tuple(d_tensors)
    if len(d_tensors) > 2:
        raise InvalidProblem(f"gemm: {len(d_tensors)} D tensors given; at most 2 are fused")
    d_logical = []
    for i, d in enumerate(d_tensors):
        try:
            de = d.expand(c_stored_shape)
        except RuntimeError:
            raise InvalidProblem(f"gemm: D{i} of shape {tuple(d.shape)} does not broadcast to C's "
                                 f"stored shape {c_stored_shape}") from None
        d_logical.append(de if c_r else de.transpose(-1, -2))
    d_token = _dtype_token(d_tensors[0].dtype) if d_tensors else None
    if len(d_tensors) == 2 and _dtype_token(d_tensors[1].dtype) != d_token:
        raise InvalidProblem("gemm: both D tensors must have the same dtype")

    on_gpu = a.is_cuda
    if on_gpu:
        sms, cap, is_hip = _device_info(a.device.index if a.device.index is not None else torch.cuda.current_device())
    else:
        # the interpreter runs the programs one after another: any count is correct
        sms, cap, is_hip = 4, (0, 0), False
    num_sms = num_sms or sms
    if config is None:
        raise InvalidProblem("gemm: config is required (a GemmConfig, its dict or name); "
                             "ck_gemm.matmul chooses one through the Dispatcher")
    cfg = as_config(config)
    why = _descriptor_violation(cfg, a, b, c, a_r, b_r, c_r, batched_io, on_gpu and (is_hip or cap[0] < 9))
    if why:
        raise UnsupportedProblem(f"kernel {kernel_name or cfg.name} cannot run these tensors: {why}; pass contiguous "
                                 f"16-byte aligned tensors or choose a pointer variant (plain, persistent)")

    even_k = K % cfg.block_k == 0
    vec = (0, 0)
    if cfg.variant in VEC_VARIANTS:
        vec = (vec_elems(a, K if a_r else M), vec_elems(b, N if b_r else K))
    spec = _spec(cfg, dt, layout, out_token, d_token, len(d_tensors), d_op, activation,
                 batched_io and cfg.is_tma, even_k, num_sms, False, vec)

    def bstride(t):
        return t.stride(0) if (t.dim() == 3 and t.shape[0] > 1) else 0

    d0 = d_logical[0] if d_logical else cl
    d1 = d_logical[1] if len(d_logical) > 1 else d0
    vals = {"M": M, "N": N, "K": K, "batch_count": batch, "d0_ptr": d0, "d1_ptr": d1}
    for key, t in (("d0", d0), ("d1", d1)):
        vals[f"stride_{key}b"] = bstride(t)
        vals[f"stride_{key}m"], vals[f"stride_{key}n"] = t.stride(-2), t.stride(-1)
    if cfg.is_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor
        a_blk, b_blk = desc_block_shapes(cfg, layout, batched_io)
        vals["a_desc"] = TensorDescriptor(a, list(a.shape), list(a.stride()), a_blk)
        vals["b_desc"] = TensorDescriptor(b, list(b.shape), list(b.stride()), b_blk)
        if cfg.c_desc:
            # c is row-major here (checked above): its stored form is the logical one
            vals["c_desc"] = TensorDescriptor(c, list(c.shape), list(c.stride()),
                                              desc_c_block_shape(cfg, batched_io))
    else:
        vals["a_ptr"], vals["b_ptr"] = al, bl
        vals["stride_ab"], vals["stride_am"], vals["stride_ak"] = bstride(al), al.stride(-2), al.stride(-1)
        vals["stride_bb"], vals["stride_bk"], vals["stride_bn"] = bstride(bl), bl.stride(-2), bl.stride(-1)

    if cfg.streamk:
        vals["ws_ptr"], vals["lock_ptr"] = streamk_scratch(a.device, spec.grid(M, N, batch)[0] * 2
                                                           * cfg.block_m * cfg.block_n,
                                                           batch * -(-M // cfg.block_m) * -(-N // cfg.block_n),
                                                           spec.acc_dtype == "int32")
    if spec.split_k > 1:
        ws = scratch(a.device, "i32" if spec.acc_dtype == "int32" else "f32",
                     spec.split_k * batch * M * N)[:spec.split_k * batch * M * N].view(spec.split_k, batch, M, N)
        vals.update({"c_ptr": ws, "stride_ck": ws.stride(0), "stride_cb": ws.stride(1),
                     "stride_cm": ws.stride(2), "stride_cn": 1})
    else:
        vals.update({"c_ptr": cl, "stride_ck": 0, "stride_cb": bstride(cl),
                     "stride_cm": cl.stride(-2), "stride_cn": cl.stride(-1)})
    launch = launch or _launch
    name = kernel_name or spec.name
    launch(spec, vals, M, N, batch, name)
    if spec.split_k > 1:
        r = spec.reduce
        rv = {"ws_ptr": ws, "c_ptr": cl, "d0_ptr": d0, "d1_ptr": d1, "M": M, "N": N,
              "stride_wk": ws.stride(0), "stride_wb": ws.stride(1), "stride_wm": ws.stride(2),
              "stride_cb": bstride(cl), "stride_cm": cl.stride(-2), "stride_cn": cl.stride(-1)}
        for key in ("d0", "d1"):
            for ax in ("b", "m", "n"):
                rv[f"stride_{key}{ax}"] = vals[f"stride_{key}{ax}"]
        launch(r, rv, M, N, batch, name + "/reduce")
    return c


def _gemm_packed(a, b, N, *, layout, config, c, d_tensors, d_op, activation, out_dtype, num_sms, kernel_name,
                 launch):
    """:func:`gemm` of a pre-shuffled B (``packed_n``): one launch of the preshuffle kernels."""
    import torch

    if config is None:
        raise InvalidProblem("gemm: config is required (the key's); ck_gemm.linear chooses one through the Dispatcher")
    cfg = as_config(config)
    if layout != "rcr":
        raise InvalidProblem(f"gemm: a pre-shuffled B is a linear weight (layout rcr), not {layout!r}")
    for name, t in (("A", a), ("B", b)) + tuple((f"D{i}", d) for i, d in enumerate(d_tensors)):
        if not isinstance(t, torch.Tensor):
            raise InvalidProblem(f"gemm: {name} is a {type(t).__name__}; the Triton GEMM takes torch tensors")
    if a.dim() != 2:
        raise InvalidProblem(f"gemm: with a pre-shuffled B, A must be 2-D (M x K), got {a.dim()}-D")
    dt = _dtype_token(a.dtype)
    if _dtype_token(b.dtype) != dt:
        raise InvalidProblem(f"gemm: A is {a.dtype} but B is {b.dtype}; cast one of them")
    if a.device != b.device:
        raise InvalidProblem(f"gemm: A on {a.device} but B on {b.device}")
    M, K = a.shape
    want = (-(-N // cfg.block_n), -(-K // cfg.block_k), cfg.block_n, cfg.block_k)
    if min(M, N, K) < 1:
        raise InvalidProblem(f"gemm: empty problem M={M} N={N} K={K}")
    if tuple(b.shape) != want or not b.is_contiguous():
        raise InvalidProblem(f"gemm: B of shape {tuple(b.shape)} (contiguous: {b.is_contiguous()}) is not B "
                             f"pre-shuffled for {cfg.name}'s tile of N={N}, K={K}: expected a contiguous {want}")
    if a.stride(-1) != 1:
        raise InvalidProblem("gemm: with a pre-shuffled B, A must be row-major (its last stride 1)")
    out_token = _dtype_token(out_dtype) if out_dtype is not None else DEFAULT_OUT[dt]
    if c is None:
        c = torch.empty((M, N), device=a.device, dtype=_torch_dtype(out_token))
    elif tuple(c.shape) != (M, N):
        raise InvalidProblem(f"gemm: c has shape {tuple(c.shape)}, expected {(M, N)}")
    else:
        out_token = _dtype_token(c.dtype)
    d_tensors = tuple(d_tensors)
    if len(d_tensors) > 2:
        raise InvalidProblem(f"gemm: {len(d_tensors)} D tensors given; at most 2 are fused")
    ds = []
    for i, d in enumerate(d_tensors):
        try:
            ds.append(d.expand(M, N))
        except RuntimeError:
            raise InvalidProblem(f"gemm: D{i} of shape {tuple(d.shape)} does not broadcast to C's {(M, N)}") from None
    d_token = _dtype_token(d_tensors[0].dtype) if d_tensors else None
    if len(ds) == 2 and _dtype_token(d_tensors[1].dtype) != d_token:
        raise InvalidProblem("gemm: both D tensors must have the same dtype")
    if a.is_cuda:
        sms = _device_info(a.device.index if a.device.index is not None else torch.cuda.current_device())[0]
    else:
        sms = 4   # the interpreter runs the programs one after another: any count is correct
    spec = _spec(cfg, dt, "rcr", out_token, d_token, len(ds), d_op, activation, False, K % cfg.block_k == 0,
                 num_sms or sms, True)
    d0 = ds[0] if ds else c
    d1 = ds[1] if len(ds) > 1 else d0
    vals = {"a_ptr": a, "b_ptr": b, "c_ptr": c, "d0_ptr": d0, "d1_ptr": d1, "M": M, "N": N, "K": K,
            "stride_am": a.stride(0), "stride_ak": a.stride(1), "stride_cm": c.stride(0), "stride_cn": c.stride(1),
            "stride_d0m": d0.stride(0), "stride_d0n": d0.stride(1), "stride_d1m": d1.stride(0),
            "stride_d1n": d1.stride(1), "stride_ck": 0, "stride_cb": 0, "stride_d0b": 0, "stride_d1b": 0,
            "batch_count": 1}
    if cfg.is_tma:
        if a.is_cuda:
            _, cap, is_hip = _device_info(a.device.index if a.device.index is not None
                                          else torch.cuda.current_device())
            if is_hip or cap[0] < 9:
                raise UnsupportedProblem(f"kernel {kernel_name or cfg.name}: tensor descriptors need sm90+")
        if not _tma_ok(a, True):
            raise UnsupportedProblem(f"kernel {kernel_name or cfg.name} cannot run these tensors: A's rows "
                                     f"({a.stride(0)} x {a.element_size()} B) or base are not 16-byte aligned; "
                                     f"choose a pointer variant (plain, persistent)")
        from triton.tools.tensor_descriptor import TensorDescriptor
        rows = b.view(-1, cfg.block_k)   # the packed tiles, block_n rows of block_k each
        vals["a_desc"] = TensorDescriptor(a, [M, K], [a.stride(0), 1], [cfg.block_m, cfg.block_k])
        vals["b_desc"] = TensorDescriptor(rows, list(rows.shape), list(rows.stride()), [cfg.block_n, cfg.block_k])
        if cfg.c_desc:
            if not _tma_ok(c, True):
                raise UnsupportedProblem(f"kernel {kernel_name or cfg.name} cannot store this C by descriptor: its "
                                         f"rows or base are not 16-byte aligned; choose a pointer-stored variant")
            vals["c_desc"] = TensorDescriptor(c, [M, N], [c.stride(0), 1], desc_c_block_shape(cfg, False))
    launch = launch or _launch
    name = kernel_name or spec.name
    if spec.split_k == 1:
        launch(spec, vals, M, N, 1, name)
        return c
    # split-K: raw partials into the device's workspace, then the reduce pass's epilogue (as gemm does)
    ws = scratch(a.device, "i32" if spec.acc_dtype == "int32" else "f32",
                 spec.split_k * M * N)[:spec.split_k * M * N].view(spec.split_k, 1, M, N)
    vals.update({"c_ptr": ws, "stride_ck": ws.stride(0), "stride_cm": ws.stride(2), "stride_cn": 1})
    launch(spec, vals, M, N, 1, name)
    rv = {"ws_ptr": ws, "c_ptr": c, "d0_ptr": d0, "d1_ptr": d1, "M": M, "N": N,
          "stride_wk": ws.stride(0), "stride_wb": ws.stride(1), "stride_wm": ws.stride(2),
          "stride_cb": 0, "stride_cm": c.stride(0), "stride_cn": c.stride(1),
          "stride_d0b": 0, "stride_d0m": d0.stride(0), "stride_d0n": d0.stride(1),
          "stride_d1b": 0, "stride_d1m": d1.stride(0), "stride_d1n": d1.stride(1)}
    launch(spec.reduce, rv, M, N, 1, name + "/reduce")
    return c


#: per (device, kind): one buffer, grown on demand (at least doubling); replaced buffers are
#: kept, since a recorded launch or a captured CUDA graph may still point at them
_SCRATCH: dict = {}
_RETIRED: list = []


def scratch(device, kind: str, numel: int):
    """A per-device buffer of at least ``numel`` elements: ``"f32"`` / ``"i32"`` partial sums
    (split-K, stream-K) or ``"locks"`` (stream-K tile counters, int32, zero between launches:
    each launch's last contributor to a tile resets its counter).

    Every GEMM launch on the device shares these in stream order, and recorded launches keep
    the buffer they were recorded with, so no call allocates (and many problem shapes do not
    each hold their own partials).  Launches that use them on two streams of one device at the
    same time would share them: run split-K / stream-K GEMMs of one device on one stream.
    """
    import torch

    dtype = torch.float32 if kind == "f32" else torch.int32
    if device.type == "meta":  # ck build's representative launch: nothing runs
        return torch.empty(numel, device=device, dtype=dtype)
    key = (device.type, device.index, kind)
    buf = _SCRATCH.get(key)
    if buf is None or buf.numel() < numel:
        if buf is not None:
            _RETIRED.append(buf)
        size = max(numel, 2 * buf.numel() if buf is not None else 0, 1 << 16)
        make = torch.zeros if kind == "locks" else torch.empty
        # kept for good: outside any CUDA graph's pool (a first call may run in a graph's warm-up)
        buf = _SCRATCH[key] = persistent(lambda: make(size, device=device, dtype=dtype), device)
    return buf


def is_scratch(t) -> bool:
    """Whether tensor ``t`` lies in one of the scratch buffers (current or replaced)."""
    p = t.data_ptr()
    for buf in list(_SCRATCH.values()) + _RETIRED:
        if buf.device == t.device and buf.data_ptr() <= p < buf.data_ptr() + buf.numel() * buf.element_size():
            return True
    return False


def streamk_scratch(device, ws_elems: int, tiles: int, int_acc: bool = False):
    """The stream-K kernels' workspace (``ws_elems`` fp32 or int32 partial values) and ``tiles``
    tile counters on ``device`` (see :func:`scratch`)."""
    return scratch(device, "i32" if int_acc else "f32", ws_elems), scratch(device, "locks", tiles)


@functools.lru_cache(maxsize=None)
def _constexpr_names(fn) -> frozenset:
    import inspect
    f = getattr(fn, "fn", fn)
    return frozenset(n for n, p in inspect.signature(f).parameters.items() if "constexpr" in str(p.annotation))


def call_of(spec, vals) -> tuple:
    """``(fn, args, kwargs)`` of one launch: runtime arguments by position, the
    kernel's declared constexprs and the compile options by keyword (unit strides are
    left to the specialisation, as the JIT does)."""
    fn = spec.fn
    cxn = _constexpr_names(fn)
    args = [vals[n] for n in fn.arg_names if n not in cxn]
    cx = {k: v for k, v in spec.constexprs.items() if k in cxn}
    return fn, args, dict(cx, **spec.options)


def _launch(spec, vals, M, N, batch, name, extra=None):
    from ck_core.backends import triton_artifacts

    fn, args, kwargs = call_of(spec, vals)
    triton_artifacts.launch(name, fn, spec.grid(M, N, batch), args, kwargs, extra=extra)
