"""The rules an :class:`~ck_fmha.problem.FmhaProblem` obeys: its vocabularies, the R-numbered
checks (:data:`RULES`), CK's mask specs, and the defaults resolved at construction.

``FmhaProblem.__attrs_post_init__`` runs :func:`resolve_defaults` then :func:`validate`; both take
the record by its fields (this module sits below ``problem.py`` and does not import it).  Every
error message starts with ``[<rule id>]``; the group-mode offset checks (R14) are here too.
"""
from __future__ import annotations

import math
from typing import Mapping

from ck_core.errors import InvalidProblem, UnsupportedProblem

FAMILIES = (
    "fwd", "fwd_splitkv", "fwd_splitkv_combine", "fwd_pagedkv", "fwd_appendkv",
    "batch_prefill", "bwd_dot_do_o", "bwd_dq_dk_dv", "bwd_convert_dq",
)
FWD_FAMILIES = FAMILIES[:6]
#: families whose key lengths may come at run time (``runtime_seqlens_k``)
RUNTIME_SEQLENS_FAMILIES = ("fwd_splitkv", "fwd_splitkv_combine", "fwd_pagedkv", "fwd_appendkv", "batch_prefill")
BWD_FAMILIES = FAMILIES[6:]
MODES = ("batch", "group")
LAYOUTS = ("bhsd", "bshd")
VLAYOUTS = ("r", "c")
MASKS = ("none", "top_left", "bottom_right", "generic")
BIASES = ("none", "elementwise", "alibi")
ROPES = ("none", "interleaved", "half_rotated")
KV_LAYOUTS = ("linear", "vectorized")
KV_LOOKUPS = ("vllm", "sglang")
FWD_DTYPES = ("fp16", "bf16", "fp32", "fp8")
BWD_DTYPES = ("fp16", "bf16", "fp32")

#: CK's mask-spec shorthands (``-mask=`` of tile_example_fmha_fwd)
_MASK_ALIASES = {"0": "none", "n": "none", "none": "none", "no": "none",
                 "1": "top_left", "t": "top_left", "top_left": "top_left", "causal": "top_left",
                 "2": "bottom_right", "b": "bottom_right", "bottom_right": "bottom_right",
                 "g": "generic", "generic": "generic"}
_BIAS_ALIASES = {"0": "none", "n": "none", "no": "none", "none": "none",
                 "1": "elementwise", "e": "elementwise", "bias": "elementwise",
                 "elementwise": "elementwise", "2": "alibi", "a": "alibi", "alibi": "alibi"}

#: The problem-level validation rules.  The first fifteen are the rules of CK's
#: dispatcher (``fmha validate_config``) that concern a problem rather than a
#: kernel's tiles; the rest are shape/range sanity rules.  Every error message
#: starts with ``[<rule id>]``.
RULES: Mapping[str, str] = {
    "R01-family": "family is one of the nine FMHA families",
    "R02-fwd-dtype": "forward families take fp16, bf16, fp32 or fp8",
    "R03-bwd-dtype": "backward families take fp16, bf16 or fp32",
    "R04-hdim-div8": "hdim_q and hdim_v are multiples of 8",
    "R05-hdim-192-128": "hdim (192,128) with bias or dropout has limited kernel support (warning)",
    "R06-softcap-no-bias": "logits soft cap cannot be combined with a bias (elementwise or alibi)",
    "R07-prefill-paged": "batch_prefill reads a paged KV cache (paged_kv=True)",
    "R08-page-pow2": "page size is a positive power of two",
    "R09-prefill-group": "batch_prefill runs in group mode",
    "R10-appendkv-batch": "fwd_appendkv runs in batch mode",
    "R11-vlayout-row": "only fwd accepts column-major V; the other families need vlayout='r'",
    "R12-pagedkv-paged": "fwd_pagedkv reads a paged KV cache (paged_kv=True)",
    "R13-combine-splits": "split-KV families need num_splits >= 1 and no dropout",
    "R14-group-seqstart": "group mode needs seqstart_q/seqstart_k: batch+1 entries, start 0, non-decreasing",
    "R15-gqa": "nhead_q is a positive multiple of nhead_k",
    "R16-mask-window": "window sizes are >= -1 and only set with a mask; generic windows are explicit",
    "R17-dropout": "dropout probability in [0, 1); seed and offset fit in uint64",
    "R18-sizes": "batch, heads, hdims and sequence lengths are positive (seqlens may be 0 in group mode)",
    "R19-qscale": "per-tensor scale_q/k/v apply to fp8 only and are positive",
    "R20-rope": "RoPE needs fwd_appendkv, an even rotary_dim <= hdim_q",
    "R21-seqlens-k": "seqlens_k has batch entries, each within the key capacity",
    "R22-prefill-layout": "vectorized KV layout needs page_size and hdim divisible by 16 bytes / element",
    "R23-skip-min-seqlen": "skip_min_seqlen_q is a group-mode feature and must be >= 0",
    "R24-softcap": "logits_soft_cap is >= 0 (0 disables it)",
    "R25-sink": "sink_tokens >= 0 and used with a mask; sink logits are forward-only",
    "R26-dbias": "dbias needs an elementwise bias and a backward family",
    "R27-fp8": "fp8 (e4m3 q/k/v, per-tensor descales scale_q/k/v, bf16 o) has no bias or dropout",
}


def _err(rule: str, msg: str, cls=InvalidProblem):
    return cls(f"[{rule}] {msg}")


def _is_pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


def _canon_mask(x):
    key = str(x).strip().lower()
    if ":" in key:
        parse_mask_spec(key)  # fail early on a malformed spec; resolved after init
        return key
    if key not in _MASK_ALIASES:
        raise InvalidProblem(f"[R16-mask-window] unknown mask {x!r}; use one of {', '.join(MASKS)} "
                             "or a CK spec such as 't', 'b', 't:3,0', 'b:-1,0', 'xt:8', 'g:4,2'")
    return _MASK_ALIASES[key]


def _canon_bias(x):
    key = str(x).strip().lower()
    if key not in _BIAS_ALIASES:
        raise InvalidProblem(f"[R06-softcap-no-bias] unknown bias {x!r}; use one of {', '.join(BIASES)}")
    return _BIAS_ALIASES[key]


def parse_mask_spec(spec: str) -> dict:
    """CK's ``-mask=`` string -> FmhaProblem fields (mask, window_left, window_right).

    ``0``/``n`` none; ``1``/``t`` causal top-left; ``2``/``b`` causal bottom-right;
    ``t:l,r`` / ``b:l,r`` FA-style sliding window (``-1`` = unlimited side);
    ``xt:w`` / ``xb:w`` xformers window of total size w; ``g:y,x`` CK's generic
    (y, x) coordinates, which equal a top-left window (y-1, x-1).
    """
    s = str(spec).strip()
    if ":" not in s:
        m = _canon_mask(s)
        if m in ("top_left", "bottom_right"):
            return {"mask": m, "window_left": -1, "window_right": 0}
        if m == "generic":
            raise InvalidProblem("[R16-mask-window] a generic mask needs coordinates: 'g:y,x'")
        return {"mask": "none"}
    t, v = s.split(":", 1)
    t = t.strip().lower()
    try:
        if t in ("xt", "xb"):
            w = int(v)
            left, right = (-1, 0) if w <= 0 else (w // 2, w - 1 - w // 2)
            return {"mask": "top_left" if t == "xt" else "bottom_right",
                    "window_left": left, "window_right": right}
        a, b = (int(p) for p in v.split(","))
    except ValueError:
        raise InvalidProblem(f"[R16-mask-window] cannot parse mask spec {spec!r}; "
                             "write e.g. 't:3,0', 'b:-1,0', 'xt:8' or 'g:4,2'") from None
    if t == "t":
        return {"mask": "top_left", "window_left": a, "window_right": b}
    if t == "b":
        return {"mask": "bottom_right", "window_left": a, "window_right": b}
    if t == "g":
        return {"mask": "generic", "window_left": a - 1, "window_right": b - 1}
    raise InvalidProblem(f"[R16-mask-window] unknown mask kind {t!r} in {spec!r}; use t, b, xt, xb or g")


# ---------------------------------------------------------------- defaults
def _set(p, name, value):
    object.__setattr__(p, name, value)


def resolve_defaults(p) -> None:
    """Store the derived defaults on the FmhaProblem ``p`` being built: a mask spec's window,
    nhead_k, hdim_v, group mode's longest lengths, seqlen_k, a causal or absent mask's window."""
    if ":" in p.mask:
        spec = parse_mask_spec(p.mask)
        if p.window_left is not None or p.window_right is not None:
            raise _err("R16-mask-window", f"mask spec {p.mask!r} already fixes the window; "
                       "drop window_left/window_right or use mask='top_left'/'bottom_right'")
        for k, v in spec.items():
            _set(p, k, v)
    if p.nhead_k is None:
        _set(p, "nhead_k", p.nhead_q)
    if p.hdim_v is None:
        _set(p, "hdim_v", p.hdim_q)
    if p.mode == "group":
        if p.seqlen_q is None and p.seqstart_q is not None and len(p.seqstart_q) > 1:
            _set(p, "seqlen_q", max(b - a for a, b in zip(p.seqstart_q, p.seqstart_q[1:])))
        if p.seqlen_k is None:
            if p.seqlens_k is not None and len(p.seqlens_k):
                _set(p, "seqlen_k", max(p.seqlens_k))
            elif p.seqstart_k is not None and len(p.seqstart_k) > 1:
                _set(p, "seqlen_k", max(b - a for a, b in zip(p.seqstart_k, p.seqstart_k[1:])))
    if p.seqlen_k is None and p.seqlens_k is not None and len(p.seqlens_k):
        extra = p.seqlen_knew if p.family == "fwd_appendkv" else 0
        _set(p, "seqlen_k", max(p.seqlens_k) + extra)
    if p.seqlen_q is None and p.family == "fwd_appendkv":
        _set(p, "seqlen_q", p.seqlen_knew)
    if p.seqlen_k is None and p.seqlen_q is not None:
        _set(p, "seqlen_k", p.seqlen_q)
    if p.mask in ("top_left", "bottom_right"):
        # a causal mask keeps its right edge: a window that also looks ahead states window_right
        if p.window_left is None:
            _set(p, "window_left", -1)
        if p.window_right is None:
            _set(p, "window_right", 0)
    elif p.mask == "none":
        if p.window_left is None:
            _set(p, "window_left", -1)
        if p.window_right is None:
            _set(p, "window_right", -1)


# ---------------------------------------------------------------- validation
def validate(p) -> None:
    """Check the FmhaProblem ``p`` (its defaults resolved) against the rules of :data:`RULES`; the
    first broken rule raises InvalidProblem (UnsupportedProblem where the op could but no kernel does)."""
    # R01
    if p.family not in FAMILIES:
        raise _err("R01-family", f"unknown family {p.family!r}; use one of {', '.join(FAMILIES)}")
    if p.mode not in MODES:
        raise _err("R14-group-seqstart", f"unknown mode {p.mode!r}; use 'batch' or 'group' (varlen)")
    if p.layout not in LAYOUTS:
        raise _err("R18-sizes", f"unknown layout {p.layout!r}; use 'bhsd' or 'bshd'")
    if p.vlayout not in VLAYOUTS:
        raise _err("R11-vlayout-row", f"unknown vlayout {p.vlayout!r}; use 'r' (row-major) or 'c'")
    # R02 / R03
    if p.family in BWD_FAMILIES:
        if p.dtype not in BWD_DTYPES:
            raise _err("R03-bwd-dtype", f"backward family {p.family} does not take dtype {p.dtype!r}; "
                       f"use one of {', '.join(BWD_DTYPES)}",
                       UnsupportedProblem if p.dtype in FWD_DTYPES else InvalidProblem)
    elif p.dtype not in FWD_DTYPES:
        raise _err("R02-fwd-dtype", f"forward family {p.family} does not take dtype {p.dtype!r}; "
                   f"use one of {', '.join(FWD_DTYPES)}")
    # R18 sizes
    for name in ("batch", "nhead_q", "nhead_k", "hdim_q", "hdim_v"):
        if getattr(p, name) < 1:
            raise _err("R18-sizes", f"{name}={getattr(p, name)} must be >= 1")
    # R15
    if p.nhead_q % p.nhead_k:
        lo = p.nhead_q - p.nhead_q % p.nhead_k
        raise _err("R15-gqa", f"nhead_q={p.nhead_q} is not a multiple of nhead_k={p.nhead_k} (GQA/MQA "
                   f"shares each K/V head among nhead_q/nhead_k query heads); use nhead_q={lo or p.nhead_k} "
                   f"or {lo + p.nhead_k}, or an nhead_k dividing {p.nhead_q}")
    # R04
    for name in ("hdim_q", "hdim_v"):
        h = getattr(p, name)
        if h % 8:
            raise _err("R04-hdim-div8", f"{name}={h} is not a multiple of 8; pad the head dim to "
                       f"{(h + 7) // 8 * 8} (zero-pad q/k, or v and slice o)")
    # R14 group mode
    if p.runtime_seqstarts:
        _check_runtime_seqstarts(p)
    elif p.packed_q or p.packed_k:
        raise _err("R14-group-seqstart", "packed_q/packed_k are the packed rows of a problem whose offsets come "
                   "at run time; set runtime_seqstarts=True or drop them")
    if p.is_group and not p.runtime_seqstarts:
        if p.seqstart_q is None:
            raise _err("R14-group-seqstart", "group mode needs seqstart_q (batch+1 cumulative query "
                       "offsets starting at 0), e.g. seqstart_q=[0, 5, 12]")
        _check_seqstart("seqstart_q", p.seqstart_q, p.batch)
        if p.family == "batch_prefill":
            if p.seqstart_k is not None:
                raise _err("R14-group-seqstart", "batch_prefill takes key lengths from seqlens_k and the "
                           "page table, not seqstart_k; drop seqstart_k")
        elif p.seqstart_k is None and not p.paged_kv and p.family not in ("bwd_convert_dq",):
            raise _err("R14-group-seqstart", "group mode needs seqstart_k (batch+1 cumulative key "
                       "offsets starting at 0), e.g. seqstart_k=[0, 7, 20]")
        if p.seqstart_k is not None:
            _check_seqstart("seqstart_k", p.seqstart_k, p.batch)
    elif not p.is_group:
        for name in ("seqstart_q", "seqstart_k"):
            if getattr(p, name) is not None:
                raise _err("R14-group-seqstart", f"{name} is a group-mode field; set mode='group' or drop it")
        if p.seqlen_q is None or p.seqlen_q < 1:
            raise _err("R18-sizes", f"batch mode needs seqlen_q >= 1 (got {p.seqlen_q})")
        if p.seqlen_k is None or p.seqlen_k < 1:
            raise _err("R18-sizes", f"batch mode needs seqlen_k >= 1 (got {p.seqlen_k})")
    # R21 seqlens_k
    if p.runtime_seqlens_k:
        if p.seqlens_k is not None:
            raise _err("R21-seqlens-k", "runtime_seqlens_k=True takes the lengths as the tensor seqlens_k at run "
                       "time; drop the problem's seqlens_k (or set runtime_seqlens_k=False)")
        if p.family not in RUNTIME_SEQLENS_FAMILIES or p.is_group != (p.family == "batch_prefill"):
            raise _err("R21-seqlens-k", f"run-time seqlens_k is a feature of {'/'.join(RUNTIME_SEQLENS_FAMILIES)} "
                       f"(batch_prefill in group mode, the others in batch mode), not {p.mode}-mode {p.family}; "
                       "give seqlens_k on the problem")
    if p.seqlens_k is not None:
        if len(p.seqlens_k) != p.batch:
            raise _err("R21-seqlens-k", f"seqlens_k has {len(p.seqlens_k)} entries; give one per batch ({p.batch})")
        if min(p.seqlens_k, default=0) < 0:
            raise _err("R21-seqlens-k", f"seqlens_k {list(p.seqlens_k)} has a negative entry")
        if p.is_group and p.seqstart_k is not None:
            phys = [b - a for a, b in zip(p.seqstart_k, p.seqstart_k[1:])]
            bad = [i for i, (l, c) in enumerate(zip(p.seqlens_k, phys)) if l > c]
            if bad:
                raise _err("R21-seqlens-k", f"seqlens_k exceeds the seqstart_k span for batch(es) {bad}; "
                           "a logical key length cannot exceed its physical span")
        elif not p.is_group and not p.paged_kv:
            cap = p.seqlen_k - (p.seqlen_knew if p.family == "fwd_appendkv" else 0)
            if max(p.seqlens_k) > cap:
                raise _err("R21-seqlens-k", f"seqlens_k max {max(p.seqlens_k)} exceeds the key capacity {cap}; "
                           f"raise seqlen_k to at least {max(p.seqlens_k) + p.seqlen_k - cap}")
    # R18: in group mode seqlen_q / seqlen_k are the longest sequences (kernels size their grids by them)
    if p.is_group:
        for name, longest in (("seqlen_q", max(p.seqlens_q_list(), default=0)),
                              ("seqlen_k", max(p.seqlens_k_list(), default=0))):
            v = getattr(p, name)
            if v is not None and v < longest:
                raise _err("R18-sizes", f"{name}={v} is shorter than the longest sequence ({longest}) of this "
                           f"group-mode problem; leave {name} unset (it is derived) or raise it")
    # R16 mask window
    if p.mask == "none":
        if p.window_left != -1 or p.window_right != -1:
            raise _err("R16-mask-window", f"window ({p.window_left}, {p.window_right}) given with mask='none'; "
                       "set mask='top_left' or 'bottom_right' to use a sliding window")
    elif p.mask == "generic":
        if p.window_left is None or p.window_right is None:
            raise _err("R16-mask-window", "mask='generic' needs explicit window_left and window_right "
                       "(or a spec 'g:y,x' = window (y-1, x-1))")
        if p.window_left < 0 or p.window_right < 0 or p.window_left + p.window_right < 0:
            raise _err("R16-mask-window", f"generic window ({p.window_left}, {p.window_right}) needs both sides "
                       ">= 0 (CK: x + y >= 2); use mask='top_left' for an unlimited side")
    for name in ("window_left", "window_right"):
        v = getattr(p, name)
        if v is not None and v < -1:
            raise _err("R16-mask-window", f"{name}={v} is invalid; use -1 (unlimited) or a size >= 0")
    # R17 dropout
    if not (0.0 <= p.p_drop < 1.0):
        raise _err("R17-dropout", f"dropout p_drop={p.p_drop} must be in [0, 1); p=1 drops everything")
    for name in ("seed", "offset"):
        if not (0 <= getattr(p, name) < 2**64):
            raise _err("R17-dropout", f"{name}={getattr(p, name)} must fit in uint64")
    if p.store_randval and p.p_drop == 0:
        raise _err("R17-dropout", "store_randval needs dropout (p_drop > 0)")
    # R19 qscale
    for name in ("scale_q", "scale_k", "scale_v"):
        v = getattr(p, name)
        if not (v > 0 and math.isfinite(v)):
            raise _err("R19-qscale", f"{name}={v} must be a positive finite number")
        if p.dtype != "fp8" and v != 1.0:
            raise _err("R19-qscale", f"{name}={v} is a per-tensor fp8 descale; it needs dtype='fp8' "
                       "(fold the factor into your data or into scale)")
    # R27 fp8
    if p.dtype == "fp8" and (p.bias != "none" or p.p_drop > 0):
        what = f"bias={p.bias!r}" if p.bias != "none" else f"p_drop={p.p_drop}"
        raise _err("R27-fp8", f"fp8 attention with {what}: neither CK's fp8 pipelines nor the Triton fp8 "
                   "forward have bias or dropout; use dtype='bf16'/'fp16' (dequantised q/k/v) or drop the "
                   "bias/dropout", UnsupportedProblem)
    if p.scale is not None and not (p.scale > 0 and math.isfinite(p.scale)):
        raise _err("R18-sizes", f"softmax scale={p.scale} must be positive and finite (None = 1/sqrt(hdim_q))")
    # R24 / R06
    if not (p.logits_soft_cap >= 0 and math.isfinite(p.logits_soft_cap)):
        raise _err("R24-softcap", f"logits_soft_cap={p.logits_soft_cap} must be >= 0 (0 disables it)")
    if p.logits_soft_cap > 0 and p.bias != "none":
        raise _err("R06-softcap-no-bias", f"logits soft cap cannot be combined with bias={p.bias!r}; "
                   "drop the bias or set logits_soft_cap=0", UnsupportedProblem)
    # R25 sink
    if p.sink_tokens < 0:
        raise _err("R25-sink", f"sink_tokens={p.sink_tokens} must be >= 0")
    if p.sink_tokens and p.mask == "none":
        raise _err("R25-sink", "sink_tokens only matter with a sliding-window mask; set mask='top_left' "
                   "or 'bottom_right' with a window, or sink_tokens=0")
    if p.sink_logits and p.family in BWD_FAMILIES:
        raise _err("R25-sink", "sink logits are forward-only here; drop sink_logits for backward",
                   UnsupportedProblem)
    # R23
    if p.skip_min_seqlen_q < 0:
        raise _err("R23-skip-min-seqlen", f"skip_min_seqlen_q={p.skip_min_seqlen_q} must be >= 0")
    if p.skip_min_seqlen_q and not p.is_group:
        raise _err("R23-skip-min-seqlen", "skip_min_seqlen_q is a group-mode (varlen) feature; "
                   "use mode='group' or skip_min_seqlen_q=0", UnsupportedProblem)
    # R11 vlayout
    if p.vlayout != "r" and p.family != "fwd":
        raise _err("R11-vlayout-row", f"{p.family} supports only row-major V; set vlayout='r'", UnsupportedProblem)
    # paged KV: R07 R08 R09 R12 R22
    if p.family == "batch_prefill":
        if not p.paged_kv:
            raise _err("R07-prefill-paged", "batch_prefill reads a paged KV cache; set paged_kv=True and page_size")
        if not p.is_group:
            raise _err("R09-prefill-group", "batch_prefill runs in group mode; set mode='group' with seqstart_q")
    if p.family == "fwd_pagedkv" and not p.paged_kv:
        raise _err("R12-pagedkv-paged", "fwd_pagedkv reads a paged KV cache; set paged_kv=True and page_size")
    if p.paged_kv:
        if p.family not in ("fwd_pagedkv", "batch_prefill", "fwd_splitkv", "fwd_appendkv"):
            raise _err("R12-pagedkv-paged", f"{p.family} does not read a paged KV cache; use fwd_pagedkv, "
                       "fwd_splitkv, fwd_appendkv or batch_prefill, or paged_kv=False", UnsupportedProblem)
        if not _is_pow2(p.page_size):
            lo = 1 << max(0, p.page_size.bit_length() - 1)
            raise _err("R08-page-pow2", f"page_size={p.page_size} is not a positive power of two; "
                       f"use {lo} or {lo * 2}")
        if p.seqlens_k is None and not p.runtime_seqlens_k:
            raise _err("R21-seqlens-k", "a paged KV cache needs seqlens_k (the per-batch cache lengths)")
    elif p.page_size:
        raise _err("R08-page-pow2", "page_size is set but paged_kv=False; set paged_kv=True or page_size=0")
    if p.kv_layout not in KV_LAYOUTS:
        raise _err("R22-prefill-layout", f"unknown kv_layout {p.kv_layout!r}; use 'linear' or 'vectorized'")
    if p.kv_lookup not in KV_LOOKUPS:
        raise _err("R22-prefill-layout", f"unknown kv_lookup {p.kv_lookup!r}; use 'vllm' (2-D block table) "
                   "or 'sglang' (1-D page table)")
    if p.family != "batch_prefill" and (p.kv_layout != "linear" or p.kv_lookup != "vllm"):
        raise _err("R22-prefill-layout", "kv_layout/kv_lookup choices are batch_prefill features; "
                   "leave them at 'linear'/'vllm' for other families")
    if p.family == "batch_prefill" and p.kv_layout == "vectorized":
        vec = p.kv_vector
        if p.page_size % vec or p.hdim_q % vec or p.hdim_v % vec:
            raise _err("R22-prefill-layout", f"the vectorized KV layout packs {vec} {p.dtype} elements per "
                       f"16 bytes; page_size={p.page_size}, hdim_q={p.hdim_q} and hdim_v={p.hdim_v} must be "
                       f"multiples of {vec}; use kv_layout='linear' or page_size >= {vec}")
    # R10 appendkv + R20 rope
    if p.family == "fwd_appendkv":
        if p.is_group:
            raise _err("R10-appendkv-batch", "fwd_appendkv runs in batch mode; set mode='batch'")
        if p.seqlen_knew < 1:
            raise _err("R18-sizes", "fwd_appendkv needs seqlen_knew >= 1 (new tokens per batch)")
        if p.seqlens_k is None and not p.runtime_seqlens_k:
            raise _err("R21-seqlens-k", "fwd_appendkv needs seqlens_k (cache lengths before the append)")
        if p.seqlens_k is not None and not p.paged_kv and max(p.seqlens_k) + p.seqlen_knew > p.seqlen_k:
            raise _err("R21-seqlens-k", f"appending {p.seqlen_knew} tokens to cache length {max(p.seqlens_k)} "
                       f"overflows the cache capacity seqlen_k={p.seqlen_k}; raise seqlen_k")
    elif p.seqlen_knew:
        raise _err("R10-appendkv-batch", "seqlen_knew is an fwd_appendkv field; set it to 0")
    if p.rope not in ROPES:
        raise _err("R20-rope", f"unknown rope {p.rope!r}; use one of {', '.join(ROPES)}")
    if p.rope != "none":
        if p.family != "fwd_appendkv":
            raise _err("R20-rope", "RoPE is applied by fwd_appendkv; set family='fwd_appendkv' or rope='none'")
        if p.rotary_dim <= 0 or p.rotary_dim % 2 or p.rotary_dim > p.hdim_q:
            raise _err("R20-rope", f"rotary_dim={p.rotary_dim} must be even, > 0 and <= hdim_q={p.hdim_q}")
    elif p.rotary_dim:
        raise _err("R20-rope", "rotary_dim is set but rope='none'; pick 'interleaved' or 'half_rotated'")
    # R13 split-KV
    if p.num_splits < 1:
        raise _err("R13-combine-splits", f"num_splits={p.num_splits} must be >= 1")
    if p.num_splits > 1 and p.family not in ("fwd_splitkv", "fwd_splitkv_combine"):
        raise _err("R13-combine-splits", f"num_splits={p.num_splits} needs family fwd_splitkv/fwd_splitkv_combine")
    if p.family in ("fwd_splitkv", "fwd_splitkv_combine") and p.p_drop > 0:
        raise _err("R13-combine-splits", "split-KV kernels do not do dropout; use family='fwd' or p_drop=0",
                   UnsupportedProblem)
    # R26 dbias
    if p.dbias:
        if p.bias != "elementwise":
            raise _err("R26-dbias", "dbias is the gradient of an elementwise bias; set bias='elementwise' "
                       "(alibi has no gradient)")
        if p.family not in BWD_FAMILIES:
            raise _err("R26-dbias", f"dbias is a backward output; {p.family} cannot produce it")


def _check_runtime_seqstarts(p) -> None:
    """Group mode with the offsets on the device: the bounds the kernels size their grids by (the
    offsets themselves are checked on the device, see ck_fmha.device_errors)."""
    if not p.is_group:
        raise _err("R14-group-seqstart", "runtime_seqstarts is a group-mode field; set mode='group' or drop it")
    if p.seqstart_q is not None or p.seqstart_k is not None:
        raise _err("R14-group-seqstart", "runtime_seqstarts=True takes the offsets as the tensors cu_seqlens_q/"
                   "cu_seqlens_k at run time; drop seqstart_q/seqstart_k (or set runtime_seqstarts=False)")
    if p.seqlens_k is not None:
        raise _err("R14-group-seqstart", "runtime_seqstarts=True takes no seqlens_k on the problem")
    for name, bound in (("seqlen_q", "max_seqlen_q"), ("seqlen_k", "max_seqlen_k")):
        v = getattr(p, name)
        if v is None or v < 1:
            raise _err("R18-sizes", f"group mode with run-time offsets needs {name} >= 1 (the caller's {bound}: "
                       f"the longest sequence), got {v}")
    if p.packed_q < 0 or p.packed_k < 0:
        raise _err("R18-sizes", f"packed_q={p.packed_q}, packed_k={p.packed_k} must be >= 0")


def _check_seqstart(name: str, s: tuple, batch: int) -> None:
    if len(s) != batch + 1:
        raise _err("R14-group-seqstart", f"{name} has {len(s)} entries; group mode with batch={batch} needs "
                   f"batch+1={batch + 1} (cumulative offsets starting at 0)")
    if s[0] != 0:
        raise _err("R14-group-seqstart", f"{name}[0]={s[0]}; offsets must start at 0 (prepend 0)")
    bad = [i for i in range(batch) if s[i + 1] < s[i]]
    if bad:
        raise _err("R14-group-seqstart", f"{name}={list(s)} decreases at index {bad[0] + 1}; offsets must be "
                   "non-decreasing (they are a cumulative sum of lengths: np.cumsum([0, *lens]))")
