"""Meta-parameters of the Triton FMHA kernels as plain data, the default
choices per head dim, and the ``kernel_for`` contract used by the core for
ahead-of-time compilation.

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

from dataclasses import asdict, dataclass, replace
from typing import Any, Dict, Mapping, Tuple

from . import kernels as K
from .gluon_fwd import GLUON_VARIANTS as _GLUON_FLAGS, HDIMS as GLUON_HDIMS, WS_WARPS

FAMILIES = (
    "fwd",
    "fwd_splitkv",
    "fwd_splitkv_combine",
    "fwd_pagedkv",  # fwd_splitkv with page_size > 0
    "bwd_dot_do_o",
    "bwd_dq_dk_dv",
    "bwd_dq",
    "bwd_convert_dq",
    "dropout_randval",  # store_randval: the forward's uint8 dropout random values
    "fwd_appendkv",     # knew/vnew into the KV cache (+ RoPE on knew and q)
    "batch_prefill",    # fwd with a paged KV cache (page_size > 0), group mode
    "v_transpose",      # the key-contiguous copy of V that the fp8 forward reads on NVIDIA (v_trans)
)

#: the forward of gluon_fwd.py (sm90, fp16/bf16, head dim 64/128, no-padding problems):
#: ``gluon_fwd.GLUON_VARIANTS[variant]`` holds its launch flags
GLUON_VARIANTS = tuple(_GLUON_FLAGS)
VARIANTS = ("ptr", "tma", "tma_ws", "tma_host") + GLUON_VARIANTS
# variants that need NVIDIA Hopper+ (device-side TMA descriptors / warp specialisation / Gluon)
CUDA_ONLY_VARIANTS = ("tma", "tma_ws", "tma_host") + GLUON_VARIANTS
# tma_host: host-side TensorDescriptor arguments over the flattened 2-D view
# (its Q/K/V arguments are descriptors; signature_for gives their tensordesc<> types)


@dataclass(frozen=True)
class TritonFmhaConfig:
    """Meta-parameters of one kernel instance (plain data)."""

    BLOCK_M: int = 128
    BLOCK_N: int = 64
    num_warps: int = 4
    num_stages: int = 3
    variant: str = "ptr"

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def with_(self, **kw) -> "TritonFmhaConfig":
        return replace(self, **kw)


def next_pow2(x: int) -> int:
    return 1 << max(0, int(x - 1).bit_length())


def padded_hdim(d: int) -> int:
    return max(16, next_pow2(d))


# ---------------------------------------------------------------------------
# defaults (tuned on an H100 SXM, triton 3.6; see benchmarks/results/)
# keyed by padded head dim
# ---------------------------------------------------------------------------
FWD_DEFAULTS_SM90 = {
    16: TritonFmhaConfig(128, 64, 4, 3, "tma"),
    32: TritonFmhaConfig(128, 64, 4, 3, "tma"),
    64: TritonFmhaConfig(128, 128, 4, 3, "ptr"),
    128: TritonFmhaConfig(128, 64, 4, 2, "tma_host"),
    256: TritonFmhaConfig(128, 64, 8, 2, "tma"),
}
FWD_DEFAULTS_GENERIC = {
    16: TritonFmhaConfig(64, 64, 4, 2, "ptr"),
    32: TritonFmhaConfig(64, 64, 4, 2, "ptr"),
    64: TritonFmhaConfig(128, 64, 4, 2, "ptr"),
    128: TritonFmhaConfig(128, 64, 8, 2, "ptr"),
    256: TritonFmhaConfig(64, 32, 4, 1, "ptr"),
}
# measured winners per (padded hdim, causal, seqlen bucket), filled from the
# H100 sweep of benchmarks/fmha_triton_bench.py --sweep
# (H100 SXM, triton 3.6, bf16, 2026-11-22; benchmarks/results/fmha_triton_raw.json "best_configs")
_H = "tma_host"
FWD_TUNED_SM90: Dict[Tuple[int, bool, int], TritonFmhaConfig] = {
    (64, False, 512): TritonFmhaConfig(64, 64, 4, 3, _H),
    (64, False, 1024): TritonFmhaConfig(64, 64, 4, 3, _H),
    (64, False, 4096): TritonFmhaConfig(128, 128, 4, 3, _H),
    (64, False, 16384): TritonFmhaConfig(128, 128, 4, 3, "ptr"),
    (64, True, 512): TritonFmhaConfig(64, 64, 4, 3, _H),
    (64, True, 1024): TritonFmhaConfig(128, 64, 4, 3, "tma"),
    (64, True, 4096): TritonFmhaConfig(64, 64, 4, 3, _H),
    (64, True, 16384): TritonFmhaConfig(128, 128, 4, 3, _H),
    **{(128, c, b): TritonFmhaConfig(128, 64, 4, 2, _H) for c in (False, True) for b in (512, 1024, 4096, 16384)},
}


#: the Gluon forward where it beat FWD_TUNED_SM90 (benchmarks/gluon_fa_probe.py, H100, bf16, CUDA-graph
#: TFLOPS ratio to cuDNN SDPA).  Session 4 (2026-11-22), after consumers release Q at their last Q K^T:
#: D=128 persistent 128x128, 2 stages, no ping-pong except non-causal S=4k: non-causal 1.04 / 1.03 / 1.00 /
#: 1.00 at S 512 / 1k / 4k / 16k, causal 0.97 / 1.02 / 1.07 / 1.06 (128x64 tiles, 4 stages, up to 1k: the
#: diagonal key block wastes half as much; 128x128: 0.84 / 0.99).  D=64: persistent 128x128, 3 stages,
#: ping-pong without a mask at S 512 and 16k (1.00 / 1.00 / 0.99 / 0.96), 128x64x4 stages under a causal
#: mask to 1k (0.96 / 0.95), 128x128x3 from 4k (0.97 / 0.98).  The persistent causal walk mirrors every
#: second pass (gluon_fwd._tile).
_P = WS_WARPS
FWD_GLUON_SM90: Dict[Tuple[int, bool, int], TritonFmhaConfig] = {
    **{(128, False, b): TritonFmhaConfig(128, 128, _P, 2, "gluon_ws_pers") for b in (512, 1024, 16384)},
    (128, False, 4096): TritonFmhaConfig(128, 128, _P, 2, "gluon_wspp_pers"),
    **{(128, True, b): TritonFmhaConfig(128, 64, _P, 4, "gluon_ws_pers") for b in (512, 1024)},
    **{(128, True, b): TritonFmhaConfig(128, 128, _P, 2, "gluon_ws_pers") for b in (4096, 16384)},
    (64, False, 512): TritonFmhaConfig(128, 128, _P, 3, "gluon_wspp_pers"),
    **{(64, False, b): TritonFmhaConfig(128, 128, _P, 3, "gluon_ws_pers") for b in (1024, 4096)},
    (64, False, 16384): TritonFmhaConfig(128, 128, _P, 3, "gluon_wspp_pers"),
    **{(64, True, b): TritonFmhaConfig(128, 64, _P, 4, "gluon_ws_pers") for b in (512, 1024)},
    **{(64, True, b): TritonFmhaConfig(128, 128, _P, 3, "gluon_ws_pers") for b in (4096, 16384)},
}


def gluon_fwd_configs(hdim: int):
    """The distinct Gluon configurations of :data:`FWD_GLUON_SM90` for one head dim."""
    out = []
    for (d, _, _), c in FWD_GLUON_SM90.items():
        if d == hdim and c not in out:
            out.append(c)
    return out


def _seq_bucket(s: int) -> int:
    for b in (512, 1024, 4096):
        if s <= b:
            return b
    return 16384


# backward: (dkdv config, dq config)
BWD_DEFAULTS_SM90 = {
    16: (TritonFmhaConfig(64, 128, 8, 3), TritonFmhaConfig(128, 64, 8, 3)),
    32: (TritonFmhaConfig(64, 128, 8, 3), TritonFmhaConfig(128, 64, 8, 3)),
    64: (TritonFmhaConfig(32, 128, 4, 3), TritonFmhaConfig(64, 64, 4, 3)),
    128: (TritonFmhaConfig(64, 64, 4, 3), TritonFmhaConfig(128, 64, 8, 2)),
    256: (TritonFmhaConfig(32, 64, 4, 1), TritonFmhaConfig(64, 32, 4, 1)),
}
SPLITKV_DEFAULTS = {
    16: TritonFmhaConfig(16, 128, 4, 3),
    32: TritonFmhaConfig(16, 128, 4, 3),
    64: TritonFmhaConfig(16, 128, 4, 3),
    128: TritonFmhaConfig(16, 64, 4, 2),
    256: TritonFmhaConfig(16, 32, 4, 2),
}
# measured winners (H100, bf16, S=4096) per (hdim, causal); the fp32-atomic dQ
# variant lost to the separate dQ pass in every pairing tried
BWD_TUNED_SM90 = {  # (dK/dV config, dQ config); benchmarks/fmha_bwd_probe.py on the H100, 2026-11-22 session 2
    (64, False): (TritonFmhaConfig(32, 128, 4, 3), TritonFmhaConfig(64, 64, 4, 3)),
    (64, True): (TritonFmhaConfig(128, 128, 8, 2), TritonFmhaConfig(64, 64, 4, 3)),     # +3% over (32, 64, 4, 3)
    (128, False): (TritonFmhaConfig(64, 64, 4, 2), TritonFmhaConfig(128, 128, 8, 2)),   # +5%: dQ 128x128 w8
    (128, True): (TritonFmhaConfig(64, 128, 8, 3), TritonFmhaConfig(128, 64, 8, 3)),    # +10%
}
BWD_ATOMIC_DQ_DEFAULT = False
#: head dim -> (BLOCK_N, STAGES, persistent) of the Gluon dQ pass (gluon_bwd.py) where it beat the Triton
#: dQ kernel on the H100 (benchmarks/gluon_fa_probe.py --bwd, bf16, 2026-11-22 session 3): D=128 dQ pass
#: 18-31% faster (S=4k: 2.30 vs 2.79 ms; S=16k: 8.87 vs 11.77 ms), i.e. dQ+dK/dV 7-14% faster.  D=64 stays on
#: the Triton dQ kernel (Gluon -4% to +9%, mixed).
BWD_GLUON_DQ_SM90: Dict[int, Tuple[int, int, bool]] = {128: (64, 4, True)}
#: (head dim, causal) -> (BLOCK_MQ, STAGES, persistent) of the Gluon dK/dV kernel (gluon_bwd.py) where it beat
#: the Triton one (benchmarks/gluon_fa_probe.py --bwd, H100, bf16, session 3; dK/dV pass alone, Triton -> Gluon):
#: D=128 S=4k 4.08 -> 3.64 ms, causal 2.58 -> 2.03 ms (one program per tile: the persistent walk has no mirrored
#: passes here and lost under the mask), S=16k causal 9.21 -> 7.17 ms; D=64 causal S=4k 1.51 -> 1.24 ms.  D=64
#: without a mask stays on Triton (Gluon 0-13% slower).
#: Session 4 (same probe, --fused, S=4k / 16k): D=64 without a mask Gluon 2.26 / 9.11 ms vs Triton 2.34 / 9.20;
#: D=64 causal one program per tile 1.17 / 4.51 ms vs persistent 1.24 / 4.68 (Triton 1.48 / 5.26).
BWD_GLUON_DKDV_SM90: Dict[Tuple[int, bool], Tuple[int, int, bool]] = {
    (128, False): (64, 3, True), (128, True): (64, 2, False), (64, False): (64, 3, True), (64, True): (64, 3, False)}
#: (head dim, causal) -> (BLOCK_MQ, STAGES, persistent) of the Gluon dK/dV kernel with dQ fused in (the
#: non-deterministic backward, ``deterministic=False``: fp32 TMA reduce-adds into a dQ accumulator, then the
#: convert stage), from seqlen_k >= BWD_GLUON_FUSED_MIN_SEQLEN.  H100, bf16, benchmarks/gluon_fa_probe.py
#: --fused, session 4 (CUDA-graph ms, fused kernel vs the whole deterministic backward): D=64 S=16k 14.5 vs
#: 16.2; D=64 S=4k 3.88 vs 3.88 (even); D=64 causal S=16k 7.66 vs 7.93 (even once the accumulator is zeroed
#: and rounded); D=128 slower (S=16k 26.3 vs 23.4, causal 16.0 vs 12.7: the dQ product and its fp32 staging
#: cost more than the separate pass at this head dim) -> D=64 only; a second run: D=64 S=16k 4 stages one
#: program per tile 14.3 ms (3 stages persistent 15.1), causal 7.38 (det. backward 7.97).
BWD_GLUON_FUSED_SM90: Dict[Tuple[int, bool], Tuple[int, int, bool]] = {(64, False): (64, 4, False),
                                                                        (64, True): (64, 3, False)}
BWD_GLUON_FUSED_MIN_SEQLEN = 8192


#: fp8 forward on sm90 with key-contiguous V (benchmarks/fmha_fp8_probe.py, H100, 2026-11-22):
#: 64x128 tiles, 4 warps, 3 stages, host descriptors: 721 TFLOPS at B=8 H=16 S=4096 D=128
FWD_FP8_TUNED_SM90: Dict[int, TritonFmhaConfig] = {128: TritonFmhaConfig(64, 128, 4, 3, _H)}


def default_fwd_config(hdim_q: int, hdim_v: int, arch: str = "sm90", causal: bool = False,
                       seqlen: int = 4096, fp8: bool = False, gluon: bool = True) -> TritonFmhaConfig:
    """The tuned forward configuration.  ``gluon``: on sm90, fp16/bf16 with head dims 64/64 or
    128/128, take :data:`FWD_GLUON_SM90` first (``ops.fwd`` falls back to ``gluon=False`` for
    problems the Gluon kernel cannot run); False: the Triton kernel's choice only."""
    d = padded_hdim(max(hdim_q, hdim_v))
    if arch == "sm90" and fp8 and d in FWD_FP8_TUNED_SM90:
        return FWD_FP8_TUNED_SM90[d]
    if arch == "sm90" and gluon and not fp8 and hdim_q == hdim_v and hdim_q in GLUON_HDIMS:
        cfg = FWD_GLUON_SM90.get((d, bool(causal), _seq_bucket(seqlen)))
        if cfg is not None:
            return cfg
    if arch == "sm90":
        cfg = FWD_TUNED_SM90.get((min(d, 256), bool(causal), _seq_bucket(seqlen)))
        if cfg is not None:
            return cfg
    table = FWD_DEFAULTS_SM90 if arch == "sm90" else FWD_DEFAULTS_GENERIC
    cfg = table[min(d, 256)]
    if arch != "sm90" and cfg.variant != "ptr":
        cfg = cfg.with_(variant="ptr")
    return cfg


def default_bwd_configs(hdim_q: int, hdim_v: int, arch: str = "sm90", causal: bool = False):
    d = padded_hdim(max(hdim_q, hdim_v))
    tuned = BWD_TUNED_SM90.get((d, bool(causal)))
    return tuned if tuned is not None else BWD_DEFAULTS_SM90[min(d, 256)]


def default_splitkv_config(hdim_q: int, hdim_v: int, rows: int) -> TritonFmhaConfig:
    d = padded_hdim(max(hdim_q, hdim_v))
    cfg = SPLITKV_DEFAULTS[min(d, 256)]
    bm = max(16, next_pow2(rows))
    if bm > 16:
        bm = min(bm, 64)
        cfg = cfg.with_(BLOCK_M=bm, BLOCK_N=min(cfg.BLOCK_N, 64))
    return cfg


def num_splits_heuristic(batch_heads: int, seqlen_k: int, num_m_blocks: int = 1,
                         num_sms: int = 132, block_n: int = 64, min_chunk: int = 256,
                         max_splits: int = 128) -> int:
    """Split the KV sequence until about two waves of programs cover the
    machine, keeping at least ``min_chunk`` keys per split."""
    programs = max(1, batch_heads * num_m_blocks)
    want = max(1, -(-2 * num_sms // programs))
    cap = max(1, seqlen_k // min_chunk)
    n = max(1, min(want, cap, max_splits))
    chunk = -(-seqlen_k // n)
    chunk = -(-chunk // block_n) * block_n
    return max(1, -(-seqlen_k // chunk))


# ---------------------------------------------------------------------------
# kernel_for / signatures / AOT
# ---------------------------------------------------------------------------
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

ROPE_MODES = {"none": 0, "interleaved": 1, "half_rotated": 2}


def _get(cfg: Mapping, key, default):
    v = cfg.get(key, default)
    return default if v is None else v


BIAS_MODES = {"none": 0, "elementwise": 1, "alibi_vertical": 2, "alibi_top_left": 3, "alibi_bottom_right": 4,
              "alibi": 4}


def bias_mode_of(x) -> int:
    """Kernel BIAS_MODE from a config value: an int 0..4 or a name of :data:`BIAS_MODES`."""
    if isinstance(x, str):
        if x not in BIAS_MODES:
            raise ValueError(f"bias mode {x!r} is not one of {', '.join(BIAS_MODES)}")
        return BIAS_MODES[x]
    x = int(x)
    if not 0 <= x <= 4:
        raise ValueError(f"bias mode {x} is not in 0..4")
    return x


def constexprs_for(family: str, config: Mapping) -> Dict[str, Any]:
    """Every constexpr argument of the family's kernel, from ``config``."""
    if family not in _FN:
        from ck_core.errors import MissingKernel  # noqa: WPS433

        raise MissingKernel(f"unknown Triton FMHA family {family!r}; known: {', '.join(FAMILIES)}")
    if _get(config, "variant", "ptr") in GLUON_VARIANTS:
        from ck_core.errors import UnsupportedProblem  # noqa: WPS433

        raise UnsupportedProblem(
            f"variant {config['variant']!r} is the Gluon sm90 forward (ck_fmha.triton.gluon_fwd), not a Triton "
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
        return dict(D_Q=dq, D_V=dv, BLOCK_DQ=bdq, BLOCK_DV=bdv, BLOCK_M=bm, BLOCK_N=bn,
                    MASK_MODE=mm, BOTTOM_RIGHT=br, HAS_SOFTCAP=sc,
                    STORE_LSE=bool(_get(config, "lse", True)),
                    IS_VARLEN=bool(_get(config, "varlen", prefill)),
                    REVERSE_M=bool(_get(config, "reverse_m", mm & 1 == 1)),
                    USE_TMA={"ptr": 0, "tma": 1, "tma_ws": 1, "tma_host": 2}[variant],
                    WARP_SPEC=variant == "tma_ws", BIAS_MODE=bmode, HAS_DROPOUT=drop,
                    PAGE_SIZE=ps, KV_LOOKUP=lookup if ps else 0, KV_VEC=int(_get(config, "kv_vec", 0)) if ps else 0,
                    HAS_SINK=bool(_get(config, "sink_tokens", False)),
                    HAS_SINK_LOGIT=bool(_get(config, "sink_logits", False)),
                    DESCALE_PTR=bool(_get(config, "descale_ptr", False)), V_TRANS=vt,
                    HAS_SEQLENS=bool(_get(config, "seqlens", False)) and varlen and not ps)
    if family in ("fwd_splitkv", "fwd_pagedkv"):
        ps = int(_get(config, "page_size", 16 if family == "fwd_pagedkv" else 0))
        return dict(D_Q=dq, D_V=dv, BLOCK_DQ=bdq, BLOCK_DV=bdv, BLOCK_M=max(16, bm), BLOCK_N=bn,
                    PAGE_SIZE=ps, MASK_MODE=mm, BOTTOM_RIGHT=bool(_get(config, "bottom_right", True)),
                    HAS_SOFTCAP=sc, HAS_SEQLENS=bool(_get(config, "seqlens", ps > 0)),
                    HAS_SINK=bool(_get(config, "sink_tokens", False)),
                    HAS_SINK_LOGIT=bool(_get(config, "sink_logits", False)))
    if family == "fwd_splitkv_combine":
        return dict(D_V=dv, BLOCK_DV=bdv, BLOCK_S=max(2, next_pow2(int(_get(config, "num_splits", 16)))),
                    STORE_LSE=bool(_get(config, "lse", True)))
    even_m = bool(_get(config, "even_m", False)) and not varlen
    even_n = bool(_get(config, "even_n", False)) and not varlen
    if family == "bwd_dot_do_o":
        return dict(D_V=dv, BLOCK_DV=bdv, BLOCK_M=bm, IS_VARLEN=varlen)
    if family == "bwd_dq_dk_dv":
        return dict(D_Q=dq, D_V=dv, BLOCK_DQ=bdq, BLOCK_DV=bdv, BLOCK_M=bm, BLOCK_N=bn,
                    MASK_MODE=mm, BOTTOM_RIGHT=br, HAS_SOFTCAP=sc,
                    ATOMIC_DQ=bool(_get(config, "atomic_dq", BWD_ATOMIC_DQ_DEFAULT)),
                    EVEN_M=even_m, EVEN_N=even_n, IS_VARLEN=varlen, BIAS_MODE=bmode, HAS_DROPOUT=drop,
                    STORE_DBIAS=bool(_get(config, "dbias", False)) and bmode == 1,
                    HAS_SEQLENS=bool(_get(config, "seqlens", False)) and varlen)
    if family == "bwd_dq":
        return dict(D_Q=dq, D_V=dv, BLOCK_DQ=bdq, BLOCK_DV=bdv, BLOCK_M=bm, BLOCK_N=bn,
                    MASK_MODE=mm, BOTTOM_RIGHT=br, HAS_SOFTCAP=sc,
                    EVEN_M=even_m, EVEN_N=even_n, IS_VARLEN=varlen, BIAS_MODE=bmode, HAS_DROPOUT=drop,
                    HAS_SEQLENS=bool(_get(config, "seqlens", False)) and varlen)
    if family == "bwd_convert_dq":
        return dict(D_Q=dq, BLOCK_DQ=bdq, BLOCK_M=bm, IS_VARLEN=varlen)
    if family == "dropout_randval":
        return dict(BLOCK_M=bm, BLOCK_N=bn, IS_VARLEN=varlen,
                    HAS_SEQLENS=bool(_get(config, "seqlens", False)) and varlen)
    if family == "v_transpose":
        return dict(D_V=dv, BLOCK_S=bm, BLOCK_DV=bdv)
    if family == "fwd_appendkv":
        rope = _get(config, "rope", 0)
        rope = ROPE_MODES[rope] if isinstance(rope, str) else int(rope)
        return dict(D_Q=dq, D_V=dv, BLOCK_DQ=bdq, BLOCK_DV=bdv, BLOCK_M=bm,
                    PAGE_SIZE=int(_get(config, "page_size", 0)), ROPE=rope)
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
    "PT": "i32", "KV_INDPTR": "i32", "SINK": "fp32", "QDS": "fp32", "KDS": "fp32", "VDS": "fp32",
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


def fp8_triton_type(target) -> str:
    """Triton's e4m3 element type for a ``GPUTarget`` when only "fp8" is known: ``fp8e4b8``
    (e4m3fnuz) on CDNA3 (gfx94x), whose MFMA reads that format (Triton 3.6 would upcast fp8e4nv to
    fp16 there), else ``fp8e4nv`` (OCP e4m3fn: sm89+, gfx950, gfx12).  The dispatcher decides from
    the arch spec instead (``ck_fmha.triton_keys.fp8_format``)."""
    if getattr(target, "backend", "") == "hip" and str(getattr(target, "arch", "")).startswith("gfx94"):
        return "fp8e4b8"
    return "fp8e4nv"


def aot_compile(family: str, dtype: str, config: Mapping | TritonFmhaConfig, target):
    """Compile one kernel instance for ``target`` (a ``triton.backends.compiler.GPUTarget``)
    without a GPU.  Returns the ``CompiledKernel`` (``.asm`` holds ptx/cubin or amdgcn/hsaco).

    A Gluon variant compiles the warp-specialised kernel of :mod:`.gluon_fwd` (fwd family, CUDA
    targets of arch >= 90); its compile-time layout is ``config["bshd"]`` (default False), causal
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

    v = cfgd["variant"]
    if getattr(target, "backend", None) != "cuda" or int(getattr(target, "arch", 0) or 0) < 90:
        raise UnsupportedProblem(f"variant {v!r} is a Hopper (sm90) Gluon kernel; target {target} is not a CUDA "
                                 "target of arch >= 90 (AMD and older NVIDIA archs run the Triton variants)")
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
