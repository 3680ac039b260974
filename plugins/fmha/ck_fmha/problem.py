"""What an FMHA caller wants computed: :class:`FmhaProblem` and tensor checks.

One frozen value class describes a problem for all nine CK FMHA families
(``fwd``, ``fwd_splitkv``, ``fwd_splitkv_combine``, ``fwd_pagedkv``,
``fwd_appendkv``, ``batch_prefill``, ``bwd_dot_do_o``, ``bwd_dq_dk_dv``,
``bwd_convert_dq``).  Construction validates everything that can be checked
without tensors; :func:`check_tensors` checks the arrays themselves.

Tensor layouts (``H`` = nhead_q, ``Hk`` = nhead_k, ``Dq``/``Dv`` head dims)

=================  ==============================  ==============================
tensor             batch mode (``layout="bhsd"``)  group mode (varlen, packed)
=================  ==============================  ==============================
q                  [B, H, Sq, Dq]                  [Tq, H, Dq]
k                  [B, Hk, Sk, Dq]                 [Tk, Hk, Dq]
v (vlayout "r")    [B, Hk, Sk, Dv]                 [Tk, Hk, Dv]
v (vlayout "c")    [B, Hk, Dv, Sk]                 [Hk, Dv, Tk]
o, do              [B, H, Sq, Dv]                  [Tq, H, Dv]
lse, d             [B, H, Sq]                      [H, Tq]
bias, dbias        [B|1, H|1, Sq, Sk]              [H|1, Tq, max Sk]
randval (uint8)    [B, H, Sq, Sk]                  [H, Tq, max Sk]
alibi_slopes       [H] or [B, H]                   [H] or [B, H]
sink (logits)      [H]                             [H]
=================  ==============================  ==============================

``layout="bshd"`` swaps the head and sequence axes of q/k/v/o/do in batch
mode (CK's ``iperm=0/operm=0``); lse, bias and randval keep the table's
shape.  ``Tq = seqstart_q[-1]``, ``Tk = seqstart_k[-1]``.  Family-specific
tensors (paged caches, block tables, split accumulators, RoPE tables) are
listed in :func:`expected_shapes`.
"""
from __future__ import annotations

import math
from typing import ClassVar, Any, Mapping, Optional

import attrs
import numpy as np

from ck_core.dtypes import numpy_storage
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


def _as_int(name: str, x) -> int:
    """``x`` as an int when it is one (an int, a numpy integer, an integral float such as JSON's
    2.0, or a string of digits); anything else (2.7, True, 'abc') is an error, never truncated."""
    if isinstance(x, (bool, np.bool_)):
        raise InvalidProblem(f"{name}={x!r} must be an integer, not a bool")
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)) and math.isfinite(x) and float(x).is_integer():
        return int(x)
    if isinstance(x, str):
        try:
            return int(x.strip())
        except ValueError:
            pass
    raise InvalidProblem(f"{name}={x!r} must be an integer")


def _int(name: str):
    return lambda x: _as_int(name, x)


def _opt_int(name: str):
    return lambda x: None if x is None else _as_int(name, x)


def _opt_tuple(name: str):
    def conv(x):
        if x is None:
            return None
        if isinstance(x, (str, bytes)):
            raise InvalidProblem(f"{name}={x!r} must be a sequence of integers")
        try:
            flat = np.asarray(x).reshape(-1).tolist()
        except Exception:
            raise InvalidProblem(f"{name}={x!r} must be a sequence of integers") from None
        return tuple(_as_int(f"{name}[{i}]", v) for i, v in enumerate(flat))
    return conv


def _opt_float(x):
    return None if x is None else float(x)


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


@attrs.frozen
class FmhaProblem:
    """One FMHA problem (shapes and features); immutable, JSON-round-trippable.

    Derived defaults are resolved at construction and stored: ``nhead_k``
    (= nhead_q), ``hdim_v`` (= hdim_q), ``seqlen_q``/``seqlen_k`` in group
    mode (= the longest sequence), the window of a causal mask (-1, 0).
    ``scale`` stays ``None`` when not given; :attr:`softmax_scale` resolves it
    to ``1/sqrt(hdim_q)`` so that ``attrs.evolve(p, hdim_q=...)`` keeps it right.

    Mask semantics follow CK (``block_masking.hpp``): with a window
    (left, right), query row i sees key column j when
    ``i + off - left <= j <= i + off + right`` where ``off = 0`` for
    ``top_left``/``generic`` and ``off = seqlen_k - seqlen_q`` (per batch) for
    ``bottom_right``; ``-1`` leaves a side unlimited.  Causal = (-1, 0).
    ``mask`` also accepts CK's spec strings ('t', 'b', 't:l,r', 'b:l,r',
    'xt:w', 'xb:w', 'g:y,x'; see :func:`parse_mask_spec`).

    Fields
    ------
    family, mode            one of FAMILIES; "batch" or "group" (varlen, packed tokens)
    batch, nhead_q, nhead_k number of sequences; query heads; K/V heads (GQA/MQA: nhead_q % nhead_k == 0)
    seqlen_q, seqlen_k      batch mode: per-sequence lengths (seqlen_k = key capacity for caches);
                            group mode: the longest sequence (derived)
    hdim_q, hdim_v          head dims (multiples of 8; asymmetric such as 192/128 allowed)
    dtype                   fp16, bf16, fp32, fp8 (fp8: e4m3 q/k/v with per-tensor descales
                            scale_q/k/v, o written in bf16; forward only, no bias/dropout)
    layout, vlayout         batch-mode q/k/v/o layout "bhsd" | "bshd"; V row- ("r") or column-major ("c")
    seqstart_q, seqstart_k  group mode: batch+1 cumulative offsets into the packed tensors
    runtime_seqstarts,      group mode: the offsets come at run time as the int32 tensors ``cu_seqlens_q``
    packed_q, packed_k      / ``cu_seqlens_k`` [batch+1] (read on the device, never by the host: one plan
                            per shape); seqlen_q/seqlen_k are then their bounds (max_seqlen_q/k) and
                            packed_q/packed_k the rows of the packed q and k tensors
    seqlens_k               per-batch logical key lengths: KV-cache lengths (paged, appendkv: before
                            the append) or shorter-than-physical keys (CK's seqlen_k_ptr)
    runtime_seqlens_k       the key lengths come at run time as the int32 tensor ``seqlens_k`` [batch]
                            (a decode step's lengths change every step: no host copy, no new plan);
                            seqlen_k is then the key capacity (the longest length a step may have)
    scale                   softmax scale (None = 1/sqrt(hdim_q)); see softmax_scale
    mask, window_left/right see above (with mask 'top_left'/'bottom_right'/'causal' an unset
                            window_right is 0: a window looks ahead only when window_right says so);
                            sink_tokens: first keys always visible (StreamingLLM)
    sink_logits             a per-head sink logit joins the softmax denominator (tensor ``sink`` [H])
    bias                    "none" | "elementwise" (tensor ``bias``) | "alibi" (``alibi_slopes``)
    logits_soft_cap         s = cap * tanh(s / cap) when > 0 (excludes bias)
    p_drop, seed, offset    dropout probability and Philox seed/offset (see ck_fmha.philox)
    store_randval           also return the uint8 random values
    lse                     the kernel stores LSE (references always return it)
    skip_min_seqlen_q       group mode: sequences with seqlen_q <= this are skipped (not written)
    paged_kv, page_size     K/V read from pages (power-of-two page size)
    kv_layout, kv_lookup    batch_prefill: "linear" | "vectorized" pages; "vllm" 2-D block table |
                            "sglang" 1-D page table (see ck_fmha.paged)
    seqlen_knew, rope,      fwd_appendkv: new tokens per batch; "none" | "interleaved" |
    rotary_dim              "half_rotated" RoPE over the first rotary_dim channels
    num_splits              split-KV splits
    dbias, deterministic    backward: produce the bias gradient; per-key-tile dq accumulation
    """

    op: ClassVar[str] = "fmha"

    family: str = attrs.field(default="fwd", metadata={
        "help": f"what to compute, one of {', '.join(FAMILIES)} (bwd_dq_dk_dv plans all three backward stages, "
                "fwd_splitkv adds its combine)"})
    mode: str = attrs.field(default="batch", metadata={
        "help": "batch (equal-length sequences) or group (varlen: packed tokens located by seqstart_q/seqstart_k)"})
    batch: int = attrs.field(default=1, converter=_int("batch"), metadata={
        "help": "number of sequences"})
    nhead_q: int = attrs.field(default=1, converter=_int("nhead_q"), metadata={
        "help": "query heads"})
    nhead_k: Optional[int] = attrs.field(default=None, converter=_opt_int("nhead_k"), metadata={
        "help": "key/value heads (default nhead_q; GQA/MQA: nhead_q a multiple of it)"})
    seqlen_q: Optional[int] = attrs.field(default=None, converter=_opt_int("seqlen_q"), metadata={
        "help": "query length of each sequence (batch mode: required; group mode: derived, the longest)"})
    seqlen_k: Optional[int] = attrs.field(default=None, converter=_opt_int("seqlen_k"), metadata={
        "help": "key length of each sequence, the capacity for KV caches (default seqlen_q; group mode: derived)"})
    hdim_q: int = attrs.field(default=64, converter=_int("hdim_q"), metadata={
        "help": "head dim of q and k (a multiple of 8)"})
    hdim_v: Optional[int] = attrs.field(default=None, converter=_opt_int("hdim_v"), metadata={
        "help": "head dim of v and o (default hdim_q; asymmetric such as 192/128 allowed)"})
    dtype: str = attrs.field(default="fp16", metadata={
        "help": f"element dtype: {', '.join(FWD_DTYPES)} (fp8: e4m3 q/k/v with descales scale_q/k/v, bf16 out, "
                "forward only)"})
    layout: str = attrs.field(default="bhsd", metadata={
        "help": "batch-mode q/k/v/o layout: bhsd ([batch, head, seq, dim]) or bshd ([batch, seq, head, dim])"})
    vlayout: str = attrs.field(default="r", metadata={
        "help": "V storage: r (row-major, seq x dim) or c (column-major, key-contiguous)"})
    # varlen / kv-cache lengths
    seqstart_q: Optional[tuple] = attrs.field(default=None, converter=_opt_tuple("seqstart_q"), metadata={
        "help": "group mode: batch+1 cumulative query offsets into the packed q, e.g. 0,5,12"})
    seqstart_k: Optional[tuple] = attrs.field(default=None, converter=_opt_tuple("seqstart_k"), metadata={
        "help": "group mode: batch+1 cumulative key offsets into the packed k and v"})
    seqlens_k: Optional[tuple] = attrs.field(default=None, converter=_opt_tuple("seqlens_k"), metadata={
        "help": "per-sequence logical key lengths: KV-cache lengths (paged, append-KV) or keys shorter than seqlen_k"})
    runtime_seqlens_k: bool = attrs.field(default=False, converter=bool, metadata={
        "help": "the key lengths come at run time as the int32 tensor seqlens_k [batch] (no new plan per decode "
                "step)"})
    runtime_seqstarts: bool = attrs.field(default=False, converter=bool, metadata={
        "help": "group mode: the offsets come at run time as int32 cu_seqlens_q / cu_seqlens_k [batch+1]"})
    packed_q: int = attrs.field(default=0, converter=_int("packed_q"), metadata={
        "help": "with runtime_seqstarts: rows of the packed q tensor (total query tokens)"})
    packed_k: int = attrs.field(default=0, converter=_int("packed_k"), metadata={
        "help": "with runtime_seqstarts: rows of the packed k and v tensors (total key tokens)"})
    # softmax / quantization scales (scale_q/k/v: fp8 descales, the real values are scale_x * x)
    scale: Optional[float] = attrs.field(default=None, converter=_opt_float, metadata={
        "help": "softmax scale (default 1/sqrt(hdim_q))"})
    scale_q: float = attrs.field(default=1.0, converter=float, metadata={
        "help": "fp8: the descale of q (its real values are scale_q * q)"})
    scale_k: float = attrs.field(default=1.0, converter=float, metadata={
        "help": "fp8: the descale of k (its real values are scale_k * k)"})
    scale_v: float = attrs.field(default=1.0, converter=float, metadata={
        "help": "fp8: the descale of v (its real values are scale_v * v)"})
    # mask
    mask: str = attrs.field(default="none", converter=_canon_mask, metadata={
        "help": "none, top_left (= causal), bottom_right, generic, or a CK spec: t, b, t:L,R, b:L,R, xt:W, xb:W, "
                "g:Y,X"})
    window_left: Optional[int] = attrs.field(default=None, converter=_opt_int("window_left"), metadata={
        "help": "keys a query sees left of its diagonal (-1 = unlimited; a causal mask defaults to -1)"})
    window_right: Optional[int] = attrs.field(default=None, converter=_opt_int("window_right"), metadata={
        "help": "keys a query sees right of its diagonal (-1 = unlimited; a causal mask defaults to 0)"})
    sink_tokens: int = attrs.field(default=0, converter=_int("sink_tokens"), metadata={
        "help": "the first N keys stay visible to every query, whatever the window (StreamingLLM)"})
    sink_logits: bool = attrs.field(default=False, converter=bool, metadata={
        "help": "a per-head sink logit (tensor sink [nhead_q]) joins the softmax denominator"})
    # bias / logits
    bias: str = attrs.field(default="none", converter=_canon_bias, metadata={
        "help": "none, elementwise (tensor bias added to the logits) or alibi (per-head alibi_slopes)"})
    logits_soft_cap: float = attrs.field(default=0.0, converter=float, metadata={
        "help": "when > 0 the logits become cap * tanh(s / cap) (soft-capping; not with a bias)"})
    # dropout
    p_drop: float = attrs.field(default=0.0, converter=float, metadata={
        "help": "dropout probability on the attention weights (0 = no dropout)"})
    seed: int = attrs.field(default=0, converter=_int("seed"), metadata={
        "help": "dropout's Philox seed (on the command line --dropout_seed: ck run's --seed seeds the inputs)"})
    offset: int = attrs.field(default=0, converter=_int("offset"), metadata={
        "help": "dropout's Philox offset"})
    store_randval: bool = attrs.field(default=False, converter=bool, metadata={
        "help": "also return the uint8 random values the dropout drew"})
    # outputs / misc
    lse: bool = attrs.field(default=False, converter=bool, metadata={
        "help": "the kernel also stores each query row's log-sum-exp"})
    skip_min_seqlen_q: int = attrs.field(default=0, converter=_int("skip_min_seqlen_q"), metadata={
        "help": "group mode: sequences with seqlen_q <= this are skipped (their rows not written)"})
    # paged KV / batch prefill
    paged_kv: bool = attrs.field(default=False, converter=bool, metadata={
        "help": "K/V are read from pages through a block table (fwd_pagedkv, split-KV decode)"})
    page_size: int = attrs.field(default=0, converter=_int("page_size"), metadata={
        "help": "tokens per K/V page (a power of two; 0 when not paged)"})
    kv_layout: str = attrs.field(default="linear", metadata={
        "help": "batch_prefill page layout: linear or vectorized"})
    kv_lookup: str = attrs.field(default="vllm", metadata={
        "help": "batch_prefill page lookup: vllm (2-D block table) or sglang (1-D page table)"})
    # append-KV
    seqlen_knew: int = attrs.field(default=0, converter=_int("seqlen_knew"), metadata={
        "help": "fwd_appendkv: new key/value tokens appended to each sequence"})
    rope: str = attrs.field(default="none", metadata={
        "help": "fwd_appendkv rotary embedding: none, interleaved or half_rotated"})
    rotary_dim: int = attrs.field(default=0, converter=_int("rotary_dim"), metadata={
        "help": "fwd_appendkv: how many leading channels RoPE rotates"})
    # split-KV
    num_splits: int = attrs.field(default=1, converter=_int("num_splits"), metadata={
        "help": "fwd_splitkv: key splits computed apart, then merged by the combine stage"})
    # backward
    dbias: bool = attrs.field(default=False, converter=bool, metadata={
        "help": "backward with an elementwise bias: also produce its gradient dbias"})
    deterministic: bool = attrs.field(default=False, converter=bool, metadata={
        "help": "backward: dq accumulated per key tile and summed in order (bit-identical runs), not by atomic adds"})

    def __attrs_post_init__(self):
        _resolve_defaults(self)
        _validate(self)

    # ------------------------------------------------------------ derived
    def bucket(self) -> tuple:
        """Tuning-table key: features exactly, lengths and batch x heads by power of two."""
        p2 = lambda x: 1 << max(0, int(x or 1) - 1).bit_length()
        return (self.family, self.mode, self.dtype, self.layout, self.hdim_q, self.hdim_v,
                self.mask, self.window_left, self.window_right, self.bias, self.p_drop > 0,
                self.logits_soft_cap > 0, self.sink_tokens > 0 or self.sink_logits, self.paged_kv,
                self.page_size, self.nhead_q // max(self.nhead_k, 1), p2(self.batch * self.nhead_q),
                p2(self.seqlen_q), p2(self.seqlen_k))

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.hdim_q)

    @property
    def is_group(self) -> bool:
        return self.mode == "group"

    @property
    def nhead_ratio(self) -> int:
        return self.nhead_q // self.nhead_k

    @property
    def has_window(self) -> bool:
        return self.mask != "none"

    @property
    def is_causal(self) -> bool:
        return self.mask in ("top_left", "bottom_right") and self.window_left < 0 and self.window_right == 0

    @property
    def mask_spec(self) -> str:
        """CK's serialized form: ``n``, ``t(l:r)``, ``b(l:r)``, ``g(y:x)``."""
        if self.mask == "none":
            return "n"
        if self.mask == "generic":
            return f"g({self.window_left + 1}:{self.window_right + 1})"
        return f"{self.mask[0]}({self.window_left}:{self.window_right})"

    @property
    def kv_vector(self) -> int:
        """Elements per 16-byte vector of the KV dtype (CK's kVectorSize)."""
        return 16 // numpy_storage_bytes(self.dtype)

    @property
    def total_q(self) -> int:
        if self.runtime_seqstarts:
            return self.packed_q
        return self.seqstart_q[-1] if self.is_group else self.batch * self.seqlen_q

    @property
    def total_k(self) -> int:
        if self.runtime_seqstarts:
            return self.packed_k
        return self.seqstart_k[-1] if (self.is_group and self.seqstart_k is not None) else self.batch * self.seqlen_k

    def seqlens_q_list(self) -> list:
        """Per-batch query lengths (with run-time offsets: their bound, seqlen_q)."""
        if self.is_group and not self.runtime_seqstarts:
            s = self.seqstart_q
            return [s[i + 1] - s[i] for i in range(self.batch)]
        return [self.seqlen_q] * self.batch

    def seqlens_k_list(self) -> list:
        """Per-batch logical key lengths (what masks align to; with run-time offsets: their bound)."""
        if self.seqlens_k is not None:
            return list(self.seqlens_k)
        if self.is_group and self.seqstart_k is not None:
            s = self.seqstart_k
            return [s[i + 1] - s[i] for i in range(self.batch)]
        return [self.seqlen_k] * self.batch

    def skipped_batches(self) -> list:
        """Batches a ``skip_min_seqlen_q`` kernel leaves unwritten (seqlen_q <= threshold)."""
        if self.skip_min_seqlen_q <= 0:
            return []
        return [b for b, s in enumerate(self.seqlens_q_list()) if s <= self.skip_min_seqlen_q]

    @property
    def warnings(self) -> tuple:
        """Advisories that do not make the problem invalid (rule R05)."""
        out = []
        if (self.hdim_q, self.hdim_v) == (192, 128) and (self.bias != "none" or self.p_drop > 0):
            out.append("[R05-hdim-192-128] hdim (192,128) with bias/dropout has limited tile "
                       "support; expect few kernels to match")
        return tuple(out)

    # ------------------------------------------------------------ dict I/O
    def to_dict(self) -> dict:
        """JSON-safe dict (tuples become lists); ``from_dict`` inverts it."""
        d = attrs.asdict(self, recurse=False)
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()}

    #: flags :meth:`expand_cli` understands (``ck run fmha --help`` lists them)
    cli_shorthands: ClassVar[dict] = {
        "window": "LEFT,RIGHT: window_left and window_right at once (-1 = unlimited; mask defaults to top_left)",
        "dropout_seed": "the Philox seed (field seed; ck run's own --seed seeds the random inputs)",
    }

    @classmethod
    def expand_cli(cls, d: dict) -> dict:
        """Command-line shorthands: ``--window L,R`` for window_left/right, a CK mask spec
        split at its comma by the list syntax (``--mask b:8,4``) put back together, and
        ``--dropout_seed`` for ``seed`` (``ck run --seed`` seeds the inputs)."""
        d = dict(d)
        if "dropout_seed" in d:
            d["seed"] = d.pop("dropout_seed")
        if isinstance(d.get("mask"), list):
            d["mask"] = ",".join(str(x) for x in d["mask"])
        if "window" in d:
            w = d.pop("window")
            w = list(w) if isinstance(w, (list, tuple)) else [w]
            if len(w) != 2 or not all(isinstance(x, int) for x in w):
                raise InvalidProblem(f"--window takes LEFT,RIGHT (integers, -1 = unlimited), got {w!r}")
            d["window_left"], d["window_right"] = w
            d.setdefault("mask", "top_left")
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FmhaProblem":
        """Build from a dict; unknown keys are an error; ``mask`` may be a CK spec ('b:3,0')
        (the constructor accepts those too)."""
        d = dict(d)
        names = {f.name for f in attrs.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise InvalidProblem(f"unknown FmhaProblem field(s) {unknown}; known fields: {sorted(names)}")
        return cls(**d)


def numpy_storage_bytes(dtype: str) -> int:
    from ck_core.dtypes import ELEMENT_BYTES

    return ELEMENT_BYTES[dtype]


def combine_problem(p: FmhaProblem) -> FmhaProblem:
    """The combine stage of a split-KV plan.  It merges o_acc/lse_acc and never reads K/V, so a
    paged cache's fields do not carry over (rule R12 refuses them on the combine family); group
    mode keeps the logical key lengths as packed spans."""
    if not p.paged_kv:
        return attrs.evolve(p, family="fwd_splitkv_combine", runtime_seqlens_k=False)
    kw = dict(family="fwd_splitkv_combine", paged_kv=False, page_size=0, seqlens_k=None, runtime_seqlens_k=False)
    if p.is_group and p.seqstart_k is None:
        kw["seqstart_k"] = tuple(int(x) for x in np.cumsum([0, *p.seqlens_k]))
    return attrs.evolve(p, **kw)


# ---------------------------------------------------------------- defaults
def _set(p, name, value):
    object.__setattr__(p, name, value)


def _resolve_defaults(p: FmhaProblem) -> None:
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
def _validate(p: FmhaProblem) -> None:
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


def _check_runtime_seqstarts(p: FmhaProblem) -> None:
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


# ---------------------------------------------------------------- tensors
def _qkv_shape(p: FmhaProblem, heads: int, seq: int, dim: int) -> tuple:
    if p.layout == "bshd":
        return (p.batch, seq, heads, dim)
    return (p.batch, heads, seq, dim)


def _row_shape(p: FmhaProblem) -> tuple:
    return (p.nhead_q, p.total_q) if p.is_group else (p.batch, p.nhead_q, p.seqlen_q)


def expected_shapes(p: FmhaProblem, **given) -> dict:
    """Expected shape of every tensor the problem's family reads or writes.

    ``given`` lets shapes that the problem does not fix (number of pages,
    block-table width, total page-table length) be taken from the arrays.
    Entries are tuples; an entry of ``None`` in a tuple means "any".
    Broadcastable tensors (bias, alibi slopes) give a tuple of alternatives.
    """
    H, Hk, Dq, Dv = p.nhead_q, p.nhead_k, p.hdim_q, p.hdim_v
    sh: dict = {}
    if p.is_group:
        Tq, Tk = p.total_q, (p.seqstart_k[-1] if p.seqstart_k is not None else None)
        if p.runtime_seqstarts:
            Tk = None if p.paged_kv else p.packed_k
            sh["cu_seqlens_q"] = (p.batch + 1,)
            if not p.paged_kv:
                sh["cu_seqlens_k"] = (p.batch + 1,)
        sh["q"] = (Tq, H, Dq)
        sh["o"] = sh["do"] = (Tq, H, Dv)
        sh["dq"] = (Tq, H, Dq)
        if Tk is not None:
            sh["k"] = sh["dk"] = (Tk, Hk, Dq)
            sh["v"] = sh["dv"] = (Tk, Hk, Dv) if p.vlayout == "r" else (Hk, Dv, Tk)
        rows = (H, Tq)
        sh["bias"] = ((H, Tq, p.seqlen_k), (1, Tq, p.seqlen_k))
        sh["randval"] = (H, Tq, p.seqlen_k)
    else:
        sh["q"] = _qkv_shape(p, H, p.seqlen_q, Dq)
        sh["dq"] = sh["q"]
        sh["o"] = sh["do"] = _qkv_shape(p, H, p.seqlen_q, Dv)
        sh["k"] = sh["dk"] = _qkv_shape(p, Hk, p.seqlen_k, Dq)
        if p.vlayout == "r":
            sh["v"] = sh["dv"] = _qkv_shape(p, Hk, p.seqlen_k, Dv)
        else:
            sh["v"] = sh["dv"] = (p.batch, Hk, Dv, p.seqlen_k)
        rows = (p.batch, H, p.seqlen_q)
        sh["bias"] = tuple((b, h, p.seqlen_q, p.seqlen_k) for b in (p.batch, 1) for h in (H, 1))
        sh["randval"] = (p.batch, H, p.seqlen_q, p.seqlen_k)
    sh["dbias"] = sh["bias"]
    sh["lse"] = sh["d"] = rows
    sh["alibi_slopes"] = ((H,), (p.batch, H))
    sh["sink"] = (H,)
    nsplit = p.num_splits
    sh["o_acc"] = (nsplit,) + sh["o"] if p.is_group else (nsplit, p.batch, H, p.seqlen_q, Dv)
    sh["lse_acc"] = (nsplit,) + rows
    # dq accumulator: [nsplits, *q shape]; nsplits is 1 unless deterministic
    sh["dq_acc"] = (None,) + sh["dq"]
    if p.paged_kv:
        npages = np.shape(given["k_cache"])[0] if "k_cache" in given else None
        sh["k_cache"], sh["v_cache"] = _paged_cache_shapes(p, npages)
        if p.family == "batch_prefill" and p.kv_lookup == "sglang":
            sh["kv_indptr"] = (p.batch + 1,)
            sh["kv_page_indices"] = (None,)
            sh["kv_last_page_lens"] = (p.batch,)
        else:
            sh["block_table"] = (p.batch, None)
    elif p.family == "fwd_appendkv":
        sh["k_cache"] = _qkv_shape(p, Hk, p.seqlen_k, Dq)
        sh["v_cache"] = _qkv_shape(p, Hk, p.seqlen_k, Dv)
    if p.family == "fwd_appendkv":
        sh["knew"] = _qkv_shape(p, Hk, p.seqlen_knew, Dq)
        sh["vnew"] = _qkv_shape(p, Hk, p.seqlen_knew, Dv)
        if p.rope != "none":
            sh["rotary_cos"] = sh["rotary_sin"] = (None, p.rotary_dim // 2)
    return sh


def _paged_cache_shapes(p: FmhaProblem, npages) -> tuple:
    Hk, Dq, Dv, P = p.nhead_k, p.hdim_q, p.hdim_v, p.page_size
    if p.family == "batch_prefill":
        if p.kv_layout == "vectorized":
            vec = p.kv_vector
            return ((npages, Hk, Dq // vec, P, vec), (npages, Hk, P // vec, Dv, vec))
        return ((npages, P, Hk, Dq), (npages, P, Hk, Dv))
    if p.layout == "bshd":
        return ((npages, P, Hk, Dq), (npages, P, Hk, Dv))
    return ((npages, Hk, P, Dq), (npages, Hk, P, Dv))


#: largest finite OCP e4m3 value; fp8 problems hold e4m3 values (the reference reads them as given)
FP8_MAX = 448.0
_FP8_DATA = ("q", "k", "v", "k_cache", "v_cache", "knew", "vnew")
_INT_TENSORS = ("block_table", "kv_indptr", "kv_page_indices", "kv_last_page_lens", "cu_seqlens_q", "cu_seqlens_k")
_FP32_TENSORS = ("o_acc", "lse_acc", "dq_acc", "lse", "d", "alibi_slopes", "sink")


def _shape_ok(actual: tuple, expected: tuple) -> bool:
    return len(actual) == len(expected) and all(e is None or a == e for a, e in zip(actual, expected))


def check_tensors(problem: FmhaProblem, **arrays) -> None:
    """Check shapes and dtypes of the given numpy arrays against ``problem``.

    Names are those of :func:`expected_shapes` (q, k, v, o, lse, do, d, dq,
    dk, dv, dq_acc, bias, dbias, alibi_slopes, sink, randval, o_acc, lse_acc,
    k_cache, v_cache, block_table, kv_indptr, kv_page_indices,
    kv_last_page_lens, knew, vnew, rotary_cos, rotary_sin).  ``None`` values
    are skipped.  Raises :class:`InvalidProblem` naming the tensor, the
    expected and the actual shape (or dtype).
    """
    p = problem
    arrays = {k: v for k, v in arrays.items() if v is not None}
    exp = expected_shapes(p, **arrays)
    storage = numpy_storage(p.dtype)
    for name, arr in arrays.items():
        if name not in exp:
            raise InvalidProblem(f"tensor {name!r} is not read or written by a {p.family} problem "
                                 f"(mode={p.mode}, paged_kv={p.paged_kv}); known: {sorted(exp)}")
        a = np.asarray(arr)
        want = exp[name]
        alts = want if (want and isinstance(want[0], tuple)) else (want,)
        if not any(_shape_ok(a.shape, w) for w in alts):
            shown = " or ".join(str(tuple("*" if x is None else x for x in w)) for w in alts)
            raise InvalidProblem(f"tensor {name!r} has shape {a.shape}; expected {shown} "
                                 f"for {p.family} in {p.mode} mode, layout {p.layout}")
        if name in _INT_TENSORS:
            if not np.issubdtype(a.dtype, np.integer):
                raise InvalidProblem(f"tensor {name!r} has dtype {a.dtype}; expected an integer dtype (int32)")
        elif name == "randval":
            if a.dtype != np.uint8:
                raise InvalidProblem(f"tensor 'randval' has dtype {a.dtype}; expected uint8")
        elif name in _FP32_TENSORS:
            if a.dtype not in (np.float32, np.float64):
                raise InvalidProblem(f"tensor {name!r} has dtype {a.dtype}; expected float32 (float64 accepted)")
        elif name in ("rotary_cos", "rotary_sin"):
            if not np.issubdtype(a.dtype, np.floating):
                raise InvalidProblem(f"tensor {name!r} has dtype {a.dtype}; expected a float dtype")
        else:
            if a.dtype not in (storage, np.float64):
                raise InvalidProblem(f"tensor {name!r} has dtype {a.dtype}; expected {storage} "
                                     f"(storage of {p.dtype}) or float64")
            if p.dtype == "fp8" and name in _FP8_DATA and a.size and np.nanmax(np.abs(a), initial=0.0) > FP8_MAX:
                raise InvalidProblem(f"tensor {name!r} holds values outside the fp8 e4m3 range +-{FP8_MAX:g}; "
                                     "quantise it (scale into range, pass the factor as scale_q/k/v)")
    _check_paged_tables(p, arrays)


def _check_paged_tables(p: FmhaProblem, arrays: dict) -> None:
    if not p.paged_kv:
        return
    npages = arrays["k_cache"].shape[0] if "k_cache" in arrays else None
    lens = p.seqlens_k
    need = [-(-l // p.page_size) for l in lens]
    if "block_table" in arrays:
        bt = np.asarray(arrays["block_table"])
        if bt.shape[1] < max(need, default=0):
            raise InvalidProblem(f"tensor 'block_table' has shape {bt.shape}; expected at least "
                                 f"{max(need)} columns to hold seqlens_k={list(lens)} at page_size={p.page_size}")
        if npages is not None:
            for b, n in enumerate(need):
                used = bt[b, :n]
                if used.size and (used.min() < 0 or used.max() >= npages):
                    raise InvalidProblem(f"tensor 'block_table' row {b} indexes pages {used.tolist()} outside "
                                         f"[0, {npages}) of k_cache")
    if "kv_indptr" in arrays:
        ip = np.asarray(arrays["kv_indptr"])
        if ip[0] != 0 or np.any(np.diff(ip) < 0):
            raise InvalidProblem(f"tensor 'kv_indptr' {ip.tolist()} must start at 0 and be non-decreasing")
        if "kv_last_page_lens" in arrays:
            last = np.asarray(arrays["kv_last_page_lens"])
            for b in range(p.batch):
                n = int(ip[b + 1] - ip[b])
                got = 0 if n == 0 else (n - 1) * p.page_size + int(last[b])
                if got != lens[b] or (n and not (1 <= last[b] <= p.page_size)):
                    raise InvalidProblem(f"page table of batch {b} holds {got} keys ({n} pages, last page "
                                         f"{int(last[b])}) but seqlens_k[{b}]={lens[b]}; fix kv_indptr/"
                                         "kv_last_page_lens or seqlens_k")
        if "kv_page_indices" in arrays:
            idx = np.asarray(arrays["kv_page_indices"])
            if idx.shape[0] < ip[-1]:
                raise InvalidProblem(f"tensor 'kv_page_indices' has shape {idx.shape}; expected at least "
                                     f"kv_indptr[-1]={int(ip[-1])} entries")
            if npages is not None and idx.size and (idx.min() < 0 or idx.max() >= npages):
                raise InvalidProblem(f"tensor 'kv_page_indices' indexes pages outside [0, {npages})")
