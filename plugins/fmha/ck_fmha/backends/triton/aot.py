"""The ``kernel_for`` contract used by the core for ahead-of-time compilation of the Triton
FMHA kernels (the Gluon forward through :func:`aot_compile`).

``kernel_for(family, config) -> (jit_fn, constexprs)``
    ``family``: one of :data:`FAMILIES`.  ``config``: a mapping holding the
    meta-parameters (``BLOCK_M``, ``BLOCK_N``, ``num_warps``, ``num_stages``,
    ``variant``) and the problem features that are compile-time constants
    (``hdim_q``, ``hdim_v``, ``mask_mode``, ``bottom_right``, ``softcap``,
    ``lse``, ``varlen``, ``bias_mode`` (0..4 or a name of :data:`BIAS_MODES`),
    ``dropout``, ``dbias``, ``page_size``, ``kv_lookup`` ('vllm' | 'sglang'), ``kv_vec``
    (vectorized pages), ``sink_tokens``, ``sink_logits`` (bools), ``rope`` (appendkv),
    ``descale_ptr`` (fp8: descales read from device tensors), ``v_trans`` (fp8: key-contiguous V,
    see ``kernels.fmha_fwd_kernel``), ...; see :func:`constexprs_for`;
    ``out_dtype`` (fp8 forward: bf16 | fp16) only changes the signature).  The feature
    keys default to off, which compiles the kernels as without the features.  ``constexprs`` maps every
    ``tl.constexpr`` argument name of ``jit_fn`` to its value.

The Gluon variants (:data:`GLUON_VARIANTS`, the warp-specialised sm90 forward of
:mod:`.gluon_fwd`) are a separate kernel: :func:`aot_compile` builds them through
``gluon_fwd.aot_source`` (NVIDIA sm90 targets only), ``kernel_for`` / ``signature_for``
refuse them.

``signature_for(family, dtype, config)`` gives the full ``ASTSource``
signature (pointer / scalar types, ``"constexpr"`` for the constants; fp8 forward:
``dtype`` "fp8" / "fp8e4nv" (OCP e4m3fn) or "fp8e4b8" (e4m3fnuz, CDNA3); the
fp8 path is chosen by the element type, not a constexpr), and
:func:`aot_compile` puts the three together for a ``GPUTarget``.
``num_warps`` / ``num_stages`` are compile options, not constexprs.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

from . import kernels as K
from .configs import GLUON_VARIANTS, TritonFmhaConfig, bias_mode_of, hdim_align, hdim_blocks, next_pow2, padded_hdim
from .configs import page_args
from .configs import BWD_ATOMIC_DQ_DEFAULT, FAMILIES, ROPE_MODES, GLUON_HDIMS, fp8_format, hopper
from .configs import GLUON_WS_WARPS as WS_WARPS

_FN = {
    "fwd": K.fmha_fwd_kernel,
    "fwd_splitkv": K.fmha_fwd_splitkv_kernel,
    "fwd_pagedkv": K.fmha_fwd_splitkv_kernel,
    "fwd_splitkv_combine": K.fmha_fwd_splitkv_combine_kernel,
    "bwd_dot_do_o": K.fmha_bwd_dot_do_o_kernel,
    "bwd_dq_dk_dv": K.fmha_bwd_dq_dk_dv_kernel,
    "bwd_dq": K.fmha_bwd_dq_kernel,
    "bwd_convert_dq": K.fmha_bwd_convert_dq_kernel,
    "dropout_randval": K.fmha_dropout_randval_kernel,
    "fwd_appendkv": K.fmha_fwd_appendkv_kernel,
    "batch_prefill": K.fmha_fwd_kernel,
    "v_transpose": K.fmha_v_transpose_kernel,
}


def _get(cfg: Mapping, key, default):
    v = cfg.get(key, default)
    return default if v is None else v



def _aligns(dq, bq, dv, bv) -> Dict[str, int]:
    """The head dims' constexpr classes (``ALIGN_DQ`` / ``ALIGN_DV``, :func:`configs.hdim_align`); the head
    dims themselves (``d_q`` / ``d_v``) are run-time integers of the signature."""
    out = {}
    if dq is not None:
        out["ALIGN_DQ"] = hdim_align(dq, bq)
    if dv is not None:
        out["ALIGN_DV"] = hdim_align(dv, bv)
    return out


def constexprs_for(family: str, config: Mapping) -> Dict[str, Any]:
    """Every constexpr argument of the family's kernel, from ``config``."""
    if family not in _FN:
        from ck_core.errors import MissingKernel  # noqa: WPS433

        raise MissingKernel(f"unknown Triton FMHA family {family!r}; known: {', '.join(FAMILIES)}")
    if _get(config, "variant", "ptr") in GLUON_VARIANTS:
        from ck_core.errors import UnsupportedProblem  # noqa: WPS433

        raise UnsupportedProblem(
            f"variant {config['variant']!r} is the Gluon sm90 forward (ck_fmha.backends.triton.gluon_fwd), not a Triton "
            "FMHA kernel: it has no kernel_for/signature_for form; compile it with aot_compile(), which "
            "builds it from gluon_fwd.aot_source")
    dq = int(_get(config, "hdim_q", 128))
    dv = int(_get(config, "hdim_v", dq))
    bdq, bdv = padded_hdim(dq), padded_hdim(dv)
    bm = int(_get(config, "BLOCK_M", 128))
    bn = int(_get(config, "BLOCK_N", 64))
    variant = _get(config, "variant", "ptr")
    mm = int(_get(config, "mask_mode", 0))
    br = bool(_get(config, "bottom_right", False))
    sc = bool(_get(config, "softcap", False))
    # features off by default: the kernels then compile exactly as without them
    bmode = bias_mode_of(_get(config, "bias_mode", 0))
    drop = bool(_get(config, "dropout", False))
    varlen = bool(_get(config, "varlen", False))
    if family in ("fwd", "batch_prefill"):
        prefill = family == "batch_prefill"
        ps = int(_get(config, "page_size", 16 if prefill else 0))
        if ps and variant != "ptr":
            raise ValueError(f"a paged forward (page_size={ps}) takes the 'ptr' variant, not {variant!r}")
        lookup = _get(config, "kv_lookup", 0)
        lookup = {"vllm": 0, "sglang": 1}[lookup] if isinstance(lookup, str) else int(lookup)
        vt = bool(_get(config, "v_trans", False))
        if vt and ps:
            raise ValueError("v_trans (key-contiguous V) is not implemented for paged K/V")
        chunk = int(_get(config, "DCHUNK", 0))
        if chunk and (ps or vt or variant not in ("ptr", "tma")):
            raise ValueError(f"head-dim chunks (DCHUNK={chunk}) take contiguous K/V, row-major V and the 'ptr' "
                             f"or 'tma' variant")
        (bdq, bdq2), (bdv, bdv2) = hdim_blocks(dq, chunk), hdim_blocks(dv, chunk)
        extra = dict(BLOCK_DQ2=bdq2, BLOCK_DV2=bdv2)   # (0: no chunks; every constexpr is named here)
        return dict(**_aligns(dq, bdq + bdq2, dv, bdv + bdv2), BLOCK_DQ=bdq, BLOCK_DV=bdv, BLOCK_M=bm, BLOCK_N=bn,
                    **extra, MASK_MODE=mm, BOTTOM_RIGHT=br, HAS_SOFTCAP=sc,
                    STORE_LSE=bool(_get(config, "lse", True)),
                    IS_VARLEN=bool(_get(config, "varlen", prefill)),
                    REVERSE_M=bool(_get(config, "reverse_m", mm & 1 == 1)),
                    USE_TMA={"ptr": 0, "tma": 1, "tma_ws": 1, "tma_host": 2}[variant],
                    WARP_SPEC=variant == "tma_ws", BIAS_MODE=bmode, HAS_DROPOUT=drop,
                    PAGED=page_args(ps, bn)["PAGED"], KV_LOOKUP=lookup if ps else 0, KV_VEC=int(_get(config, "kv_vec", 0)) if ps else 0,
                    HAS_SINK=bool(_get(config, "sink_tokens", False)),
                    HAS_SINK_LOGIT=bool(_get(config, "sink_logits", False)),
                    DESCALE_PTR=bool(_get(config, "descale_ptr", False)), V_TRANS=vt,
                    HAS_SEQLENS=bool(_get(config, "seqlens", False)) and varlen and not ps)
    if family in ("fwd_splitkv", "fwd_pagedkv"):
        ps = int(_get(config, "page_size", 16 if family == "fwd_pagedkv" else 0))
        return dict(**_aligns(dq, bdq, dv, bdv), BLOCK_DQ=bdq, BLOCK_DV=bdv, BLOCK_M=max(16, bm), BLOCK_N=bn,
                    PAGED=page_args(ps, bn)["PAGED"], MASK_MODE=mm, BOTTOM_RIGHT=bool(_get(config, "bottom_right", True)),
                    HAS_SOFTCAP=sc, HAS_SEQLENS=bool(_get(config, "seqlens", ps > 0)),
                    HAS_SINK=bool(_get(config, "sink_tokens", False)),
                    HAS_SINK_LOGIT=bool(_get(config, "sink_logits", False)))
    if family == "fwd_splitkv_combine":
        return dict(**_aligns(None, 0, dv, bdv), BLOCK_DV=bdv, BLOCK_S=max(2, next_pow2(int(_get(config, "num_splits", 16)))),
                    STORE_LSE=bool(_get(config, "lse", True)))
    even_m = bool(_get(config, "even_m", False)) and not varlen
    even_n = bool(_get(config, "even_n", False)) and not varlen
    if family == "bwd_dot_do_o":
        return dict(**_aligns(None, 0, dv, bdv), BLOCK_DV=bdv, BLOCK_M=bm, IS_VARLEN=varlen)
    if family in ("bwd_dq_dk_dv", "bwd_dq"):   # head-dim chunks (see configs.hdim_blocks); 0: none
        chunk = int(_get(config, "DCHUNK", 0))
        (bdq, bdq2), (bdv, bdv2) = hdim_blocks(dq, chunk), hdim_blocks(dv, chunk)
        extra = dict(BLOCK_DQ2=bdq2, BLOCK_DV2=bdv2)
    if family == "bwd_dq_dk_dv":
        return dict(**_aligns(dq, bdq + bdq2, dv, bdv + bdv2), BLOCK_DQ=bdq, BLOCK_DV=bdv, BLOCK_M=bm, BLOCK_N=bn,
                    **extra, MASK_MODE=mm, BOTTOM_RIGHT=br, HAS_SOFTCAP=sc,
                    ATOMIC_DQ=bool(_get(config, "atomic_dq", BWD_ATOMIC_DQ_DEFAULT)),
                    EVEN_M=even_m, EVEN_N=even_n, IS_VARLEN=varlen, BIAS_MODE=bmode, HAS_DROPOUT=drop,
                    STORE_DBIAS=bool(_get(config, "dbias", False)) and bmode == 1,
                    HAS_SEQLENS=bool(_get(config, "seqlens", False)) and varlen,
                    KV_SPLIT=variant == "kvsplit")
    if family == "bwd_dq":
        return dict(**_aligns(dq, bdq + bdq2, dv, bdv + bdv2), BLOCK_DQ=bdq, BLOCK_DV=bdv, BLOCK_M=bm, BLOCK_N=bn,
                    **extra, MASK_MODE=mm, BOTTOM_RIGHT=br, HAS_SOFTCAP=sc,
                    EVEN_M=even_m, EVEN_N=even_n, IS_VARLEN=varlen, BIAS_MODE=bmode, HAS_DROPOUT=drop,
                    HAS_SEQLENS=bool(_get(config, "seqlens", False)) and varlen)
    if family == "bwd_convert_dq":
        return dict(**_aligns(dq, bdq, None, 0), BLOCK_DQ=bdq, BLOCK_M=bm, IS_VARLEN=varlen)
    if family == "dropout_randval":
        return dict(BLOCK_M=bm, BLOCK_N=bn, IS_VARLEN=varlen,
                    HAS_SEQLENS=bool(_get(config, "seqlens", False)) and varlen)
    if family == "v_transpose":
        return dict(**_aligns(None, 0, dv, bdv), BLOCK_S=bm, BLOCK_DV=bdv)
    if family == "fwd_appendkv":
        rope = _get(config, "rope", 0)
        rope = ROPE_MODES[rope] if isinstance(rope, str) else int(rope)
        return dict(**_aligns(dq, bdq, dv, bdv), BLOCK_DQ=bdq, BLOCK_DV=bdv, BLOCK_M=bm,
                    PAGED=page_args(int(_get(config, "page_size", 0)))["PAGED"], ROPE=rope)
    raise AssertionError(family)


def kernel_for(family: str, config: Mapping | TritonFmhaConfig) -> Tuple[Any, Dict[str, Any]]:
    """(jit function, constexpr dict) for ``family`` under ``config``."""
    if isinstance(config, TritonFmhaConfig):
        config = config.as_dict()
    return _FN[family], constexprs_for(family, config)


_TORCH_TO_TT = {"fp16": "fp16", "float16": "fp16", "bf16": "bf16", "bfloat16": "bf16", "fp32": "fp32",
                "float32": "fp32",
                # fp8 e4m3: "fp8" is OCP e4m3fn (ck_core.dtypes); CDNA3 (gfx942) multiplies e4m3fnuz natively
                "fp8": "fp8e4nv", "fp8e4nv": "fp8e4nv", "float8_e4m3fn": "fp8e4nv",
                "fp8e4b8": "fp8e4b8", "float8_e4m3fnuz": "fp8e4b8"}
#: fp8 e4m3 flavour -> Triton element type
FP8_TRITON = {"e4m3fn": "fp8e4nv", "e4m3fnuz": "fp8e4b8"}
#: families with an fp8 path (the forward kernel; descales, P scaled onto the fp8 range) and the
#: dtype-agnostic copy of V into the key-contiguous layout that the fp8 forward reads on NVIDIA
FP8_FAMILIES = ("fwd", "v_transpose")
_PTR_ARGS = {  # argument name -> element type key ('x' = the data dtype)
    "Q": "x", "K": "x", "V": "x", "O": "x", "DO": "x", "DK": "x", "DV": "x", "DQ": "x",
    "LSE": "fp32", "DELTA": "fp32", "DQA": "fp32", "OACC": "fp32", "LACC": "fp32",
    "CU_Q": "i32", "CU_K": "i32", "BLOCK_TABLE": "i32", "SEQLENS_K": "i32",
    "BIAS": "x", "ALIBI": "fp32", "DBIAS": "fp32", "RV": "u8",
    "PT": "i32", "KV_INDPTR": "i32", "SINK": "fp32", "QDS": "fp32", "KDS": "fp32", "VDS": "fp32", "ERR": "i32",
    "KNEW": "x", "VNEW": "x", "QR": "x", "KC": "x", "VC": "x", "COS": "fp32", "SIN": "fp32", "VT": "x",
}
_FLOAT_ARGS = {"scale2", "cap_in", "cap_out", "sm_scale", "drop_scale", "v_descale"}


def signature_for(family: str, dtype: str, config: Mapping | TritonFmhaConfig) -> Tuple[Dict[str, str], Dict[str, Any]]:
    """(ASTSource signature, constexprs) for ``family`` with data type ``dtype``.

    fp8 (``"fp8"`` = OCP e4m3fn -> ``fp8e4nv``; ``"fp8e4b8"`` / ``"float8_e4m3fnuz"`` for CDNA3) is a
    forward-only input type: O is then ``config["out_dtype"]`` (bf16 default, or fp16)."""
    fn, cx = kernel_for(family, config)
    x = _TORCH_TO_TT.get(str(dtype).replace("torch.", ""))
    if x is None:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(_TORCH_TO_TT)}")
    o_t = x
    if x.startswith("fp8"):
        if family not in FP8_FAMILIES:
            raise ValueError(f"fp8 is an input type of the {'/'.join(FP8_FAMILIES)} kernel only, not {family}")
        cfgd = config.as_dict() if isinstance(config, TritonFmhaConfig) else config
        o_t = _TORCH_TO_TT[str(_get(cfgd, "out_dtype", "bf16")).replace("torch.", "")]
        if o_t not in ("bf16", "fp16"):
            raise ValueError(f"the fp8 forward writes bf16 or fp16, not {o_t}")
    sig = {}
    for name in fn.arg_names:
        if name in cx:
            sig[name] = "constexpr"
        elif name in _PTR_ARGS:
            t = _PTR_ARGS[name]
            if family == "bwd_convert_dq" and name == "DQA":
                t = "fp32"
            if t == "x" and name in ("O", "BIAS"):
                t = o_t
            sig[name] = "*" + (x if t == "x" else t)
        elif name in _FLOAT_ARGS:
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    if family in ("fwd", "batch_prefill") and cx.get("USE_TMA") == 2:
        # host-side descriptors: block shapes are part of the type
        sig["Q"] = f"tensordesc<{x}[{cx['BLOCK_M']},{cx['BLOCK_DQ']}]>"
        sig["K"] = f"tensordesc<{x}[{cx['BLOCK_N']},{cx['BLOCK_DQ']}]>"
        if cx.get("V_TRANS"):   # descriptor over the key-contiguous [B*Hk*D_V, keys] view
            sig["V"] = f"tensordesc<{x}[{cx['BLOCK_DV']},{cx['BLOCK_N']}]>"
        else:
            sig["V"] = f"tensordesc<{x}[{cx['BLOCK_N']},{cx['BLOCK_DV']}]>"
    return sig, cx


def _target_arch(target):
    """The installed arch plugin whose Triton target ``target`` (a ``GPUTarget``) is, or None."""
    from ck_core.device import arch_for_target
    from ck_core.errors import UnsupportedProblem

    try:
        return arch_for_target((getattr(target, "backend", None), getattr(target, "arch", None)))
    except UnsupportedProblem:
        return None


def fp8_triton_type(target) -> str:
    """Triton's e4m3 element type for a ``GPUTarget`` when only "fp8" is known: the encoding the
    target's arch plugin reads (``keys.fp8_format``: ``fp8e4b8``, e4m3fnuz, on CDNA3, whose MFMA reads
    that format -- Triton 3.6 would upcast fp8e4nv to fp16 there; else ``fp8e4nv``, OCP e4m3fn)."""

    return FP8_TRITON[fp8_format(_target_arch(target))]


def aot_compile(family: str, dtype: str, config: Mapping | TritonFmhaConfig, target):
    """Compile one kernel instance for ``target`` (a ``triton.backends.compiler.GPUTarget``)
    without a GPU.  Returns the ``CompiledKernel`` (``.asm`` holds ptx/cubin or amdgcn/hsaco).

    A Gluon variant compiles the warp-specialised kernel of :mod:`.gluon_fwd` (fwd family, the
    target of a Hopper arch plugin); its compile-time layout is ``config["bshd"]`` (default False), causal
    is ``mask_mode`` 1, ``lse`` as for the Triton forward; other features are refused."""
    import triton
    from triton.compiler import ASTSource

    cfgd = config.as_dict() if isinstance(config, TritonFmhaConfig) else dict(config)
    if cfgd.get("variant") in GLUON_VARIANTS:
        return _aot_compile_gluon(family, dtype, cfgd, target)
    if dtype == "fp8":
        dtype = fp8_triton_type(target)
    fn, cx = kernel_for(family, cfgd)
    sig, _ = signature_for(family, dtype, cfgd)
    opts = {"num_warps": int(cfgd.get("num_warps", 4)), "num_stages": int(cfgd.get("num_stages", 2))}
    return triton.compile(ASTSource(fn, sig, constexprs=cx), target=target, options=opts)


#: Triton forward features (config keys) that the Gluon kernel does not have
_GLUON_NO = ("softcap", "dropout", "varlen", "page_size", "sink_tokens", "sink_logits", "descale_ptr", "v_trans")


def _aot_compile_gluon(family: str, dtype: str, cfgd: dict, target):
    """:func:`aot_compile` of a Gluon variant: checks the config, then ``gluon_fwd.aot_source``."""
    import triton

    from ck_core.errors import ToolchainMissing, UnsupportedProblem  # noqa: WPS433

    from . import gluon_fwd

    _hopper = hopper

    v = cfgd["variant"]
    arch = _target_arch(target)
    if arch is None or not _hopper(arch):
        raise UnsupportedProblem(f"variant {v!r} is a Hopper (sm90) Gluon kernel; target {target} is not the "
                                 "target of an installed Hopper arch plugin (other archs run the Triton variants)")
    if not gluon_fwd.HAVE_GLUON:
        raise ToolchainMissing(f"variant {v!r}: triton.experimental.gluon is not importable (triton==3.6.0 has it)")
    if family != "fwd":
        raise UnsupportedProblem(f"variant {v!r} is a forward kernel; family {family!r} has no Gluon form")
    dt = _TORCH_TO_TT.get(str(dtype).replace("torch.", ""))
    if dt not in ("fp16", "bf16"):
        raise UnsupportedProblem(f"variant {v!r} takes fp16/bf16, not {dtype!r}")
    dq = int(_get(cfgd, "hdim_q", 128))
    dv = int(_get(cfgd, "hdim_v", dq))
    if dq != dv or dq not in GLUON_HDIMS:
        raise UnsupportedProblem(f"variant {v!r} takes head dims {'/'.join(map(str, GLUON_HDIMS))} (q = v), "
                                 f"not {dq}/{dv}")
    bm, warps = int(_get(cfgd, "BLOCK_M", 128)), int(_get(cfgd, "num_warps", WS_WARPS))
    if bm != 128 or warps != WS_WARPS:
        raise UnsupportedProblem(f"variant {v!r} runs BLOCK_M=128 with num_warps={WS_WARPS} (a producer and two "
                                 f"consumer warpgroups), not BLOCK_M={bm}, num_warps={warps}")
    mm = int(_get(cfgd, "mask_mode", 0))
    bad = [k for k in _GLUON_NO if _get(cfgd, k, False)]
    if bias_mode_of(_get(cfgd, "bias_mode", 0)):
        bad.append("bias_mode")
    if mm not in (0, 1):
        bad.append(f"mask_mode={mm}")
    if bad:
        raise UnsupportedProblem(f"variant {v!r} computes plain or causal attention only; the config sets "
                                 f"{', '.join(bad)}: use a Triton variant")
    src, opts = gluon_fwd.aot_source(dt, dq, int(_get(cfgd, "BLOCK_N", 128)), int(_get(cfgd, "num_stages", 2)), v,
                                     causal=mm == 1, bshd=bool(_get(cfgd, "bshd", False)),
                                     lse=bool(_get(cfgd, "lse", True)))
    return triton.compile(src, target=target, options=opts)
