"""What an FMHA caller wants computed: :class:`FmhaProblem` and tensor checks.

One frozen value class describes a problem for all nine CK FMHA families
(``fwd``, ``fwd_splitkv``, ``fwd_splitkv_combine``, ``fwd_pagedkv``,
``fwd_appendkv``, ``batch_prefill``, ``bwd_dot_do_o``, ``bwd_dq_dk_dv``,
``bwd_convert_dq``).  Construction validates everything that can be checked
without tensors (the rules in :mod:`ck_fmha.problem_rules`); :func:`check_tensors`
(:mod:`ck_fmha.problem_tensors`) checks the arrays themselves.

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

from ck_core.errors import InvalidProblem
from .problem_rules import (BIASES, BWD_DTYPES, BWD_FAMILIES, FAMILIES, FWD_DTYPES, FWD_FAMILIES,
                            KV_LAYOUTS, KV_LOOKUPS, LAYOUTS, MASKS, MODES, ROPES, RULES,
                            RUNTIME_SEQLENS_FAMILIES, VLAYOUTS, _canon_bias, _canon_mask, parse_mask_spec,
                            resolve_defaults, validate)
from .problem_tensors import FP8_MAX, check_tensors, expected_shapes

#: the record and its helpers here; the vocabularies, rules and tensor checks re-exported from the
#: modules below (``from ck_fmha.problem import RULES, check_tensors`` is the import path users know)
__all__ = [
    "FmhaProblem", "combine_problem", "numpy_storage_bytes", "RULES", "parse_mask_spec", "expected_shapes",
    "check_tensors", "FP8_MAX", "FAMILIES", "FWD_FAMILIES", "BWD_FAMILIES", "RUNTIME_SEQLENS_FAMILIES", "MODES",
    "LAYOUTS", "VLAYOUTS", "MASKS", "BIASES", "ROPES", "KV_LAYOUTS", "KV_LOOKUPS", "FWD_DTYPES", "BWD_DTYPES",
]


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
        resolve_defaults(self)
        validate(self)

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
