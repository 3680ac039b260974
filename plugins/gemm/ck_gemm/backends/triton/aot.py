"""Kernel specs: which jit function, with which signature and constexprs, on which grid.

:func:`kernel_for` is the contract between these kernels and anything that
compiles them ahead of time (the core's triton backend)::

    spec = kernel_for(GemmConfig(variant="tma"), dtype="bf16", layout="rcr")
    ck = triton.compile(ASTSource(spec.fn, spec.signature, spec.constexprs, spec.attrs),
                        target=GPUTarget("cuda", 90, 32), options=spec.options)
    # or simply: ck = spec.compile(GPUTarget("cuda", 90, 32))
    grid = spec.grid(M, N, batch)          # launch grid (a 3-tuple)
    spec.arg_names                          # runtime arguments, in order (constexprs left out)
    spec.reduce                             # second-pass KernelSpec for split_k > 1, else None
    spec.workspace_bytes(M, N, batch)       # fp32/int32 partials the split-K pass needs

What the AOT signature assumes (the launcher must respect it, or use JIT):
pointers are 16-byte aligned and the A/B/C strides (batch strides included)
are multiples of 16 elements (``attrs``; a batch stride of 0 qualifies); the layout's unit strides are baked in as constexpr 1; all
other sizes and strides are i32 (batch offsets are widened to int64 inside).
TMA variants take host tensor descriptors (``tensordesc<...>`` arguments):
CUDA launches fill them with ``triton.tools.tensor_descriptor.TensorDescriptor``.
The ``_cs`` variants take C as a descriptor too (``c_desc``, block
``[block_m, block_n // epi_subtile]``, ``[1, ...]`` when batched) instead of
``c_ptr`` and its strides; they need a row-major C.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from ck_core.errors import CompileError, InvalidProblem

from . import kernels as K
from .configs import C_DESC_TWIN, GemmConfig, as_config

#: CK dtype token -> Triton pointer element type
TRITON_DTYPES = {"fp16": "fp16", "bf16": "bf16", "fp8": "fp8e4nv", "bf8": "fp8e5",
                 "int8": "i8", "fp32": "fp32", "int32": "i32"}
#: default output dtype per input dtype
DEFAULT_OUT = {"fp16": "fp16", "bf16": "bf16", "fp8": "bf16", "bf8": "bf16", "int8": "int32", "fp32": "fp32"}
REDUCE_BLOCK = (32, 128)
#: the config variants that read a pre-shuffled B (``kernel_for(preshuffle=True)``)
PRESHUFFLE_CONFIG_VARIANTS = ("plain", "persistent", "tma", "tma_persistent", "tma_cs", "tma_persistent_cs")


def parse_layout(layout: str) -> tuple[bool, bool, bool]:
    """'rcr' -> (a_row_major, b_row_major, c_row_major)."""
    if not isinstance(layout, str) or len(layout) != 3 or set(layout) - {"r", "c"}:
        raise InvalidProblem(f"layout {layout!r}: use three letters of r/c for A, B, C, e.g. 'rcr'")
    return tuple(ch == "r" for ch in layout)


def _unit_strides(layout: str) -> dict:
    a_r, b_r, c_r = parse_layout(layout)
    return {
        ("stride_ak" if a_r else "stride_am"): 1,
        ("stride_bn" if b_r else "stride_bk"): 1,
        ("stride_cn" if c_r else "stride_cm"): 1,
    }


@dataclass(frozen=True)
class KernelSpec:
    """Everything needed to compile and launch one kernel (see module docstring)."""

    name: str
    fn: object
    signature: dict
    constexprs: dict
    attrs: dict
    options: dict
    grid: Callable[..., tuple]
    arg_names: tuple
    reduce: Optional["KernelSpec"] = None
    split_k: int = 1
    acc_dtype: str = "fp32"
    meta: dict = field(default_factory=dict)

    def workspace_bytes(self, M: int, N: int, batch: int = 1) -> int:
        if self.meta.get("streamk"):
            cfg = self.meta["config"]
            return self.grid(M, N, batch)[0] * 2 * cfg.block_m * cfg.block_n * 4
        return 0 if self.split_k == 1 else self.split_k * batch * M * N * 4

    def compile(self, target):
        """triton.compile for ``target`` (a triton GPUTarget); raises CompileError."""
        import triton
        from triton.compiler import ASTSource
        fn = self.fn
        if not isinstance(fn, triton.runtime.jit.JITFunction):
            raise CompileError(f"{self.name}: the kernel is not a JITFunction (TRITON_INTERPRET=1?); "
                               "compile ahead of time in a process without TRITON_INTERPRET")
        try:
            return triton.compile(ASTSource(fn, self.signature, self.constexprs, self.attrs),
                                  target=target, options=dict(self.options))
        except Exception as e:  # noqa: BLE001 - the compiler raises many kinds
            raise CompileError(f"{self.name} for {target}: {type(e).__name__}: {e}".splitlines()[0]) from e


def _sig(fn, types: dict, constexprs: dict) -> tuple[dict, tuple]:
    names = fn.arg_names
    missing = [n for n in names if n not in types and n not in constexprs]
    if missing:
        raise AssertionError(f"kernel_for: no type for {missing} of {fn.__name__}")
    sig = {n: ("constexpr" if n in constexprs else types[n]) for n in names}
    runtime = tuple(n for n in names if n not in constexprs)
    return sig, runtime


def _attrs(fn, names_div16) -> dict:
    return {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in names_div16 if n in fn.arg_names}


def _epilogue_constexprs(num_d, d_op, activation) -> dict:
    if not 0 <= num_d <= K.MAX_D:
        raise InvalidProblem(f"num_d={num_d}: at most {K.MAX_D} D tensors are fused")
    if d_op not in K.D_OPS:
        raise InvalidProblem(f"d_op={d_op!r}: use 'add' or 'mul'")
    if activation not in K.ACTIVATIONS:
        raise InvalidProblem(f"activation={activation!r}: use one of "
                             f"{', '.join(str(a) for a in K.ACTIVATIONS if a)} or None")
    return {"NUM_D": num_d, "D_OP": K.D_OPS[d_op], "ACT": K.ACTIVATIONS[activation]}


def kernel_for(config, *, dtype: str = "fp16", layout: str = "rcr", out_dtype: str | None = None,
               d_dtype: str | None = None, num_d: int = 0, d_op: str = "add", activation=None,
               batched: bool = False, even_k: bool = False, num_sms: int | None = None,
               split_k: int | None = None, k_multiple_of_16: bool = False,
               preshuffle: bool = False, vec: tuple = (0, 0)) -> KernelSpec:
    """The KernelSpec of ``config`` for one problem signature.

    Returns a :class:`KernelSpec` (fn = the ``@triton.jit`` function,
    signature/constexprs/attrs for ``ASTSource``, options = num_warps and
    num_stages, grid(M, N, batch) -> 3-tuple, arg_names = runtime args in
    order, reduce = the split-K second pass or None).

    Where they compile (checked by tests/test_triton_kernels.py on a CPU-only
    machine, triton 3.6): plain, persistent and the split-K reduce compile for
    cuda sm90 and hip gfx90a, gfx942, gfx950, gfx1100, gfx1201; the tensor-
    descriptor variants (tma, tma_ws, tma_persistent, tma_persistent_ws,
    tma_cs, tma_persistent_cs) are CUDA-only: treat them as sm90+ and do not
    enumerate them for AMD archs.  The ``_cs`` variants need a row-major C
    (layout ``??r``) and split_k == 1.
    fp8 (e4m3fn) needs sm89+/gfx950-class hardware.

    ``even_k=True`` drops the K-tail masks (K % block_k == 0 required);
    ``k_multiple_of_16=True`` lets the compiler assume K % 16 == 0, without
    which the masked K loop of plain/persistent cannot be vectorised or
    software-pipelined on sm90 (the JIT launcher gets both facts for free).
    ``vec``: ``(A_VEC, B_VEC)`` of the pointer variants plain and persistent: a power of two
    (elements) known to divide the operand's bound along its contiguous axis (M, N or K), its
    row and batch strides and its base (``launch.vec_elems``), so that masked loads along that
    axis are vectors where the sizes are not multiples of 16 (0: no such fact; the JIT launcher
    gets multiples of 16 for free).
    ``num_sms``: the programs of a persistent grid, the target's SM/CU count
    (``ArchSpec.compute_units``); persistent variants need it.
    ``preshuffle=True``: B is pre-shuffled for the config's N x K tile (``b_ptr`` points at
    ``[N tiles, K tiles, block_n, block_k]``, see ``ck_gemm.problem.pack_b``); variants plain and
    persistent, layout rcr, no batch, no split-K.
    """
    cfg = as_config(config)
    if split_k is not None:
        cfg = cfg.evolve(split_k=split_k)
    if ("persistent" in cfg.variant or cfg.streamk) and not num_sms:
        raise InvalidProblem(f"{cfg.name}: a persistent grid needs num_sms, the target's SM/CU count "
                             f"(ArchSpec.compute_units of its arch plugin)")
    if cfg.c_desc and not parse_layout(layout)[2]:
        raise InvalidProblem(f"{cfg.name}: the C descriptor store needs a row-major C, "
                             f"layout {layout!r} has a column-major one (use variant "
                             f"{C_DESC_TWIN[cfg.variant]!r})")
    if dtype not in TRITON_DTYPES:
        raise InvalidProblem(f"dtype {dtype!r}: use one of {', '.join(TRITON_DTYPES)}")
    out_dtype = out_dtype or DEFAULT_OUT[dtype]
    d_dtype = d_dtype or out_dtype
    a_r, b_r, c_r = parse_layout(layout)
    acc_int = dtype == "int8"
    acc_dtype = "int32" if acc_int else "fp32"
    epi = _epilogue_constexprs(num_d, d_op, activation)
    t_in, t_out, t_d = (TRITON_DTYPES[x] for x in (dtype, out_dtype, d_dtype))
    common = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "GROUP_M": cfg.group_m,
              "ACC_INT": acc_int}
    options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    split = cfg.split_k
    # with split-K the main kernel writes raw partials; the reduce pass owns the epilogue
    main_epi = {"NUM_D": 0, "D_OP": 0, "ACT": 0} if split > 1 else epi
    t_c = TRITON_DTYPES[acc_dtype] if split > 1 else t_out
    units = _unit_strides(layout)
    if split > 1:
        units["stride_cn"] = 1  # the workspace is row-major
        units.pop("stride_cm", None)
    ints = "i32"
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    vec_cx = {"A_ROW": a_r, "B_ROW": b_r, "A_VEC": int(vec[0]), "B_VEC": int(vec[1])}

    def tiles(M, N):
        return -(-M // bm) * -(-N // bn)

    if preshuffle:
        if cfg.variant not in PRESHUFFLE_CONFIG_VARIANTS or layout != "rcr" or batched \
                or (split > 1 and cfg.variant not in ("plain", "tma")):
            raise InvalidProblem(f"{cfg.name}: a pre-shuffled B is read by the variants "
                                 f"{', '.join(PRESHUFFLE_CONFIG_VARIANTS)}, layout rcr, without batch (split-K: "
                                 f"plain and tma only) (got {cfg.variant}, {layout}, batched={batched}, "
                                 f"split_k={split})")
        types = {"a_ptr": f"*{t_in}", "b_ptr": f"*{t_in}", "c_ptr": f"*{t_c}", "d0_ptr": f"*{t_d}",
                 "d1_ptr": f"*{t_d}"}
        if cfg.is_tma:
            # the TMA kernels with B's tile (pid_n, kt) read by one descriptor over the packed rows
            # ([N tiles * K tiles * block_n, block_k], block [block_n, block_k]): A by its own descriptor
            types = {"a_desc": f"tensordesc<{t_in}[{bm}, {bk}]>", "b_desc": f"tensordesc<{t_in}[{bn}, {bk}]>",
                     "c_ptr": f"*{t_c}", "d0_ptr": f"*{t_d}", "d1_ptr": f"*{t_d}"}
            tma_cx = dict(common, A_KMAJOR=True, B_KMAJOR=True, BATCHED=False, PACKED_B=True)
            if cfg.c_desc:   # C stored by descriptor too (row-major C: layout rcr)
                types.pop("c_ptr")
                types["c_desc"] = f"tensordesc<{t_out}{desc_c_block_shape(cfg, False)}>"
                fn = K.gemm_tma_cs_kernel if cfg.variant == "tma_cs" else K.gemm_tma_persistent_cs_kernel
                cx = dict(tma_cx, EPI_SUBTILE=cfg.epi_subtile, **epi)
                if cfg.variant != "tma_cs":
                    cx["NUM_SMS"] = num_sms

                def grid(M, N, batch=1):
                    t = tiles(M, N)
                    return (t, 1, 1) if cfg.variant == "tma_cs" else (max(1, min(num_sms, t)), 1, 1)
            elif cfg.variant == "tma":
                fn = K.gemm_tma_kernel
                cx = dict(tma_cx, SPLIT_K=split, WARP_SPEC=False, **main_epi)

                def grid(M, N, batch=1):
                    return (tiles(M, N), 1, split)
            else:
                fn = K.gemm_tma_persistent_kernel
                cx = dict(tma_cx, NUM_SMS=num_sms, WARP_SPEC=False, **epi)

                def grid(M, N, batch=1):
                    return (max(1, min(num_sms, tiles(M, N))), 1, 1)
        elif cfg.variant == "plain":
            # split-K as the plain kernel does it: raw partials, then the reduce pass's epilogue
            fn = K.gemm_preshuffle_kernel
            cx = dict(common, EVEN_K=even_k, SPLIT_K=split, **main_epi)

            def grid(M, N, batch=1):
                return (tiles(M, N), 1, split)
        else:
            fn = K.gemm_preshuffle_persistent_kernel
            cx = dict(common, NUM_SMS=num_sms, EVEN_K=even_k, **epi)

            def grid(M, N, batch=1):
                return (max(1, min(num_sms, tiles(M, N))), 1, 1)
    elif cfg.c_desc:
        # tensor descriptors for A, B and C; D tensors stay pointers
        tma_cx = dict(common, A_KMAJOR=a_r, B_KMAJOR=not b_r, BATCHED=batched, EPI_SUBTILE=cfg.epi_subtile,
                      PACKED_B=False, **epi)
        types = _desc_types(t_in, cfg, a_r, b_r, batched)
        types.update({"c_desc": f"tensordesc<{t_out}{desc_c_block_shape(cfg, batched)}>",
                      "d0_ptr": f"*{t_d}", "d1_ptr": f"*{t_d}"})
        if cfg.variant == "tma_cs":
            fn = K.gemm_tma_cs_kernel
            cx = tma_cx

            def grid(M, N, batch=1):
                return (tiles(M, N), batch, 1)
        else:
            fn = K.gemm_tma_persistent_cs_kernel
            cx = dict(tma_cx, NUM_SMS=num_sms)

            def grid(M, N, batch=1):
                return (max(1, min(num_sms, tiles(M, N) * batch)), 1, 1)
    elif cfg.streamk:
        # one launch on a grid of #SMs: the fp32/int32 workspace (two partial tiles per program)
        # and the per-tile counters (zero between launches) come from the launcher
        # the fix-up sums partials SUB_M rows at a time: about 32 values a thread
        sub_m = max(1, min(cfg.block_m, 32 * 32 * cfg.num_warps // cfg.block_n))
        if cfg.variant == "streamk":
            fn = K.gemm_streamk_kernel
            cx = dict(common, EVEN_K=even_k, SUB_M=sub_m, **epi)
            types = {"a_ptr": f"*{t_in}", "b_ptr": f"*{t_in}"}
        else:
            fn = K.gemm_tma_streamk_kernel
            cx = dict(common, A_KMAJOR=a_r, B_KMAJOR=not b_r, BATCHED=batched, SUB_M=sub_m, **epi)
            types = _desc_types(t_in, cfg, a_r, b_r, batched)
        types.update({"c_ptr": f"*{t_out}", "d0_ptr": f"*{t_d}", "d1_ptr": f"*{t_d}",
                      "ws_ptr": f"*{TRITON_DTYPES[acc_dtype]}", "lock_ptr": "*i32"})

        def grid(M, N, batch=1):
            return (num_sms, 1, 1)
    elif cfg.variant in ("plain", "tma", "tma_ws"):
        if cfg.variant == "plain":
            fn = K.gemm_plain_kernel
            cx = dict(common, SPLIT_K=split, EVEN_K=even_k, **main_epi, **vec_cx)
            types = {"a_ptr": f"*{t_in}", "b_ptr": f"*{t_in}"}
        else:
            fn = K.gemm_tma_kernel
            cx = dict(common, SPLIT_K=split, A_KMAJOR=a_r, B_KMAJOR=not b_r, BATCHED=batched, PACKED_B=False,
                      WARP_SPEC=cfg.variant == "tma_ws", **main_epi)
            types = _desc_types(t_in, cfg, a_r, b_r, batched)
        types.update({"c_ptr": f"*{t_c}", "d0_ptr": f"*{t_d}", "d1_ptr": f"*{t_d}"})

        def grid(M, N, batch=1):
            return (tiles(M, N), batch, split)
    else:
        if cfg.variant == "persistent":
            fn = K.gemm_persistent_kernel
            cx = dict(common, NUM_SMS=num_sms, EVEN_K=even_k, **main_epi, **vec_cx)
            types = {"a_ptr": f"*{t_in}", "b_ptr": f"*{t_in}"}
        else:
            fn = K.gemm_tma_persistent_kernel
            cx = dict(common, NUM_SMS=num_sms, A_KMAJOR=a_r, B_KMAJOR=not b_r, BATCHED=batched, PACKED_B=False,
                      WARP_SPEC=cfg.variant == "tma_persistent_ws", **main_epi)
            types = _desc_types(t_in, cfg, a_r, b_r, batched)
        types.update({"c_ptr": f"*{t_out}", "d0_ptr": f"*{t_d}", "d1_ptr": f"*{t_d}"})

        def grid(M, N, batch=1):
            return (max(1, min(num_sms, tiles(M, N) * batch)), 1, 1)
    for n in fn.arg_names:
        if n not in types and n not in cx:
            types[n] = ints
    cx.update({n: v for n, v in units.items() if n in fn.arg_names})
    sig, runtime = _sig(fn, types, cx)
    div16 = [n for n in ("a_ptr", "b_ptr", "c_ptr", "d0_ptr", "d1_ptr", "ws_ptr", "lock_ptr") if n in runtime]
    div16 += [n for n in ("stride_ab", "stride_am", "stride_ak", "stride_bb", "stride_bk", "stride_bn",
                          "stride_cb", "stride_cm", "stride_cn", "stride_ck") if n in runtime]
    if k_multiple_of_16:
        div16.append("K")
    attrs = _attrs(fn, div16)
    reduce = None
    if split > 1:
        reduce = _reduce_spec(cfg, acc_dtype, t_out, t_d, epi, c_r)
    name = f"{cfg.name}_{dtype}_{layout}" + ("_preshuffle" if preshuffle else "")
    return KernelSpec(name=name, fn=fn, signature=sig, constexprs=cx, attrs=attrs,
                      options=options, grid=grid, arg_names=runtime, reduce=reduce, split_k=split,
                      acc_dtype=acc_dtype,
                      meta={"config": cfg, "dtype": dtype, "out_dtype": out_dtype, "layout": layout,
                            "batched": batched, "streamk": cfg.streamk, "preshuffle": preshuffle})


def _desc_types(t_in, cfg, a_r, b_r, batched) -> dict:
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    a_blk = [bm, bk] if a_r else [bk, bm]
    b_blk = [bk, bn] if b_r else [bn, bk]
    if batched:
        a_blk, b_blk = [1] + a_blk, [1] + b_blk
    return {"a_desc": f"tensordesc<{t_in}{a_blk}>", "b_desc": f"tensordesc<{t_in}{b_blk}>"}


def desc_block_shapes(cfg: GemmConfig, layout: str, batched: bool):
    """Block shapes of the A and B tensor descriptors (stored orientation)."""
    a_r, b_r, _ = parse_layout(layout)
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    a_blk = [bm, bk] if a_r else [bk, bm]
    b_blk = [bk, bn] if b_r else [bn, bk]
    if batched:
        a_blk, b_blk = [1] + a_blk, [1] + b_blk
    return a_blk, b_blk


def desc_c_block_shape(cfg: GemmConfig, batched: bool) -> list:
    """Block shape of the C tensor descriptor of a ``_cs`` variant: one epilogue slice."""
    blk = [cfg.block_m, cfg.block_n // cfg.epi_subtile]
    return [1] + blk if batched else blk


def _reduce_spec(cfg, acc_dtype, t_out, t_d, epi, c_r) -> KernelSpec:
    fn = K.gemm_splitk_reduce_kernel
    rbm, rbn = REDUCE_BLOCK
    cx = {"BLOCK_M": rbm, "BLOCK_N": rbn, "SPLIT_K": cfg.split_k, "ACC_INT": acc_dtype == "int32", **epi}
    cx["stride_cn" if c_r else "stride_cm"] = 1
    types = {"ws_ptr": f"*{TRITON_DTYPES[acc_dtype]}", "c_ptr": f"*{t_out}", "d0_ptr": f"*{t_d}",
             "d1_ptr": f"*{t_d}"}
    for n in fn.arg_names:
        if n not in types and n not in cx:
            types[n] = "i32"
    sig, runtime = _sig(fn, types, cx)

    def grid(M, N, batch=1):
        return (-(-M // rbm) * -(-N // rbn), batch, 1)
    return KernelSpec(name=f"tri_splitk_reduce_m{rbm}n{rbn}_sk{cfg.split_k}", fn=fn, signature=sig,
                      constexprs=cx, attrs=_attrs(fn, ["ws_ptr", "c_ptr", "stride_wk", "stride_wb", "stride_wm",
                                                        "stride_cb", "stride_cm", "stride_cn"]),
                      options={"num_warps": 4, "num_stages": 1}, grid=grid, arg_names=runtime)
