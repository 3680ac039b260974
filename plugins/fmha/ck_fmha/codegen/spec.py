"""`FmhaKernelSpec`: one FMHA kernel instance, any of the nine families.

Two names per spec:

* ``ck_name``: CK's own kernel name, arch suffix included (``_gfx950``,
  ``_gfx9``, ``_gfx11``, ``_gfx12``; none for batch prefill), exactly as CK's
  ``generate.py`` names the instance file.
* ``name``: our stable, richer name: ``fmha.<family>.<arch>.`` followed by
  ``field-value`` tokens for every field that differs from its default.  It
  parses back with :func:`parse_name`, and within one arch it maps one-to-one
  onto ``ck_name``.

A KernelKey's name body (:meth:`FmhaKernelSpec.name_body`, the project's one grammar, see
docs/plugins.md) is ``fmha_<family>_`` followed by the same ``field-value`` tokens joined by
``_`` (field names without their underscores); it leaves the arch to the key's name tail
(``.<arch>.<backend>``), from which :func:`parse_key_body` takes it back.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Dict, Tuple

import attrs

from ck_core.errors import ConfigError

from .ck_facts import ARCHES, DTYPES, FAMILIES, NO_SUFFIX_FAMILIES, factory

_ALL_MASKS = frozenset({"", "no", "causal", "generic", "s_no", "s_mask"})
_ALL_BIASES = frozenset({"", "no", "bias", "alibi"})


def _in(choices, what):
    choices = frozenset(choices)

    def check(inst, attribute, value):
        if value not in choices:
            raise ConfigError(
                f"FmhaKernelSpec.{attribute.name}={value!r} is not a valid {what}; "
                f"choose one of {sorted(choices)}"
            )

    return check


def _int_tuple(inst, attribute, value):
    if type(value) is not tuple:
        raise ConfigError(
            f"FmhaKernelSpec.{attribute.name} must be a tuple of ints, got {value!r}"
        )


def _nonneg(inst, attribute, value):
    if value < 0:
        raise ConfigError(f"FmhaKernelSpec.{attribute.name} must be >= 0, got {value}")


@attrs.frozen(slots=True, cache_hash=True)
class FmhaKernelSpec:
    """Everything that tells one CK FMHA kernel instance from another.

    Fields that a family does not use keep their defaults (empty string,
    ``False``, ``0``, empty tuple), so each family's specs differ only in the
    fields its CK name encodes.

    Tuple layouts:

    * ``tile``: fwd-like families ``(bm0, bn0, bk0, bn1, bk1, bk0max)``;
      ``bwd_dq_dk_dv`` ``(bm0, bn0, bk0, bk1, bk2, bk3, bk4, bhdq, bhdv)``;
      ``fwd_appendkv`` ``(bs, bsk, bd, bdv)``; ``fwd_splitkv_combine``
      ``(bn1,)``; ``bwd_dot_do_o`` ``(bm0,)``; ``bwd_convert_dq`` ``(bm0, bn0)``.
    * ``warps``: warps per gemm, ``(rm0, rn0, rk0, rm1, rn1, rk1[, rm2, rn2, rk2])``.
    * ``warp_tile``: ``(wm0, wn0, wk0, wm1, wn1, wk1)``.
    """

    family: str = attrs.field(validator=_in(FAMILIES, "family"))
    arch: str = attrs.field(validator=_in(ARCHES, "arch"))
    dtype: str = attrs.field(validator=_in(DTYPES, "dtype"))
    hdim_q: int = attrs.field(validator=_nonneg)
    hdim_v: int = attrs.field(validator=_nonneg)
    mode: str = attrs.field(default="", validator=_in(("", "batch", "group"), "mode"))
    pipeline: str = ""
    tile: Tuple[int, ...] = attrs.field(default=(), validator=_int_tuple)
    warps: Tuple[int, ...] = attrs.field(default=(), validator=_int_tuple)
    warp_tile: Tuple[int, ...] = attrs.field(default=(), validator=_int_tuple)
    occupancy: int = -1
    max_seq_q: int = 0
    vlayout: str = ""
    spad: bool = False
    skpad: bool = False
    dpad: int = 0            # 0 = no pad, 1 = pad, 8 = pad to 8 (bwd)
    dvpad: int = 0
    logits: bool = False
    mask: str = attrs.field(default="", validator=_in(_ALL_MASKS, "mask"))
    bias: str = attrs.field(default="", validator=_in(_ALL_BIASES, "bias"))
    dbias: bool = False
    lse: bool = False
    dropout: bool = False
    dropout_variant: str = ""   # bwd: "wg16", "wg16_storerandval", ...
    qscale: str = ""
    squant: bool = False
    skip: bool = False
    trload: bool = False
    sink: bool = False
    pagedkv: bool = False
    deterministic: bool = False
    rope: str = ""
    page_size: int = 0
    kv_layout: str = ""
    kv_lookup: str = ""
    load_64bit: bool = False

    # -- names ---------------------------------------------------------------

    @property
    def ck_factory(self) -> str:
        """CK's factory (and kernel-name suffix) for this family and arch."""
        return factory(self.family, self.arch)

    @property
    def ck_name(self) -> str:
        """CK's kernel name for this instance, arch suffix included."""
        return _ck_name(self)

    @property
    def name(self) -> str:
        """Our stable name; ``parse_name(spec.name) == spec``."""
        return _our_name(self)

    def name_body(self, alg) -> str:
        """The body of a key's name (``<body>.<arch>.<backend>``; the algorithm, CK's tiles,
        lives in the spec): see :func:`parse_key_body`."""
        return _key_body(self)

    # -- dict round trip -----------------------------------------------------

    def to_dict(self) -> Dict[str, Any]:
        """Plain JSON-able dict (tuples become lists)."""
        out = attrs.asdict(self, recurse=False)
        for key in ("tile", "warps", "warp_tile"):
            out[key] = list(out[key])
        return out

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "FmhaKernelSpec":
        """Inverse of :meth:`to_dict`; unknown keys are an error."""
        unknown = set(data) - _FIELD_NAMES
        if unknown:
            raise ConfigError(
                f"unknown FmhaKernelSpec field(s) {sorted(unknown)}; "
                f"valid fields: {sorted(_FIELD_NAMES)}"
            )
        data = dict(data)
        for key in ("tile", "warps", "warp_tile"):
            if key in data:
                data[key] = tuple(int(v) for v in data[key])
        return cls(**data)

    @classmethod
    def from_name(cls, name: str) -> "FmhaKernelSpec":
        return parse_name(name)


_COMMON = ("family", "arch", "dtype", "hdim_q", "hdim_v", "tile", "occupancy")
_FWD_LIKE = ("mode", "pipeline", "warps", "warp_tile", "vlayout", "spad", "skpad", "dpad",
             "dvpad", "logits", "mask", "bias", "lse", "sink")
# Fields each family's CK name encodes; the others stay at their defaults.
FAMILY_FIELDS: Dict[str, frozenset] = {
    fam: frozenset(_COMMON + extra) for fam, extra in {
        "fwd": _FWD_LIKE + ("dropout", "qscale", "skip", "trload"),
        "fwd_splitkv": _FWD_LIKE + ("squant", "pagedkv"),
        "fwd_splitkv_combine": ("mode", "spad", "dvpad", "lse", "squant"),
        "fwd_pagedkv": _FWD_LIKE + ("skip", "squant", "pagedkv"),
        "fwd_appendkv": ("pipeline", "vlayout", "spad", "skpad", "dpad", "dvpad", "rope", "pagedkv"),
        "batch_prefill": _FWD_LIKE + ("dropout", "qscale", "page_size", "kv_layout",
                                      "kv_lookup", "load_64bit"),
        "bwd_dq_dk_dv": ("mode", "warps", "warp_tile", "max_seq_q", "dpad", "dvpad", "mask",
                         "bias", "dbias", "dropout", "dropout_variant", "deterministic", "trload"),
        "bwd_dot_do_o": ("mode", "spad", "dvpad"),
        "bwd_convert_dq": ("mode", "spad", "dpad", "deterministic"),
    }.items()
}

_FIELDS = attrs.fields(FmhaKernelSpec)
_FIELD_NAMES = frozenset(f.name for f in _FIELDS)
_REQUIRED = frozenset({"dtype", "hdim_q", "hdim_v"})
_NAME_FIELDS = tuple(f for f in _FIELDS if f.name not in ("family", "arch"))
_FIELD_BY_NAME = {f.name: f for f in _FIELDS}
_NAME_KEYS = tuple((f.name, f.default, f.name in _REQUIRED) for f in _NAME_FIELDS)


# Names are pure functions of a frozen record; memoise them (specs hash once).
@lru_cache(maxsize=1 << 17)
def _ck_name(spec: FmhaKernelSpec) -> str:
    base = _CK_NAMERS[spec.family](spec)
    if spec.family in NO_SUFFIX_FAMILIES:
        return base
    return f"{base}_{spec.ck_factory}"


@lru_cache(maxsize=1 << 17)
def _our_name(spec: FmhaKernelSpec) -> str:
    parts = ["fmha", spec.family, spec.arch]
    for key, default, required in _NAME_KEYS:
        value = getattr(spec, key)
        if required or value != default:
            parts.append(f"{key}-{_encode(value)}")
    return ".".join(parts)


#: a key body's field token: the field's name without underscores (``hdimq-128``)
_ALIAS = {f.name: f.name.replace("_", "") for f in _NAME_FIELDS}
_UNALIAS = {a: n for n, a in _ALIAS.items()}
assert len(_UNALIAS) == len(_ALIAS), "two FmhaKernelSpec fields share a key-body alias"
_BODY_HEAD = re.compile(r"^fmha_(?P<family>[a-z_]+?)_(?=dtype-)")
_BODY_SPLIT = re.compile("_(?=(?:" + "|".join(sorted(_UNALIAS, key=len, reverse=True)) + ")-)")


@lru_cache(maxsize=1 << 17)
def _key_body(spec: FmhaKernelSpec) -> str:
    parts = ["fmha", spec.family]
    for key, default, required in _NAME_KEYS:
        value = getattr(spec, key)
        if required or value != default:
            parts.append(f"{_ALIAS[key]}-{_encode(value)}")
    return "_".join(parts)


def parse_key_body(body: str, arch: str) -> FmhaKernelSpec:
    """The spec of a key's name body (:meth:`FmhaKernelSpec.name_body`) on ``arch``."""
    m = _BODY_HEAD.match(body)
    if not m:
        raise ConfigError(f"{body!r} is not an FMHA kernel name body; expected "
                          "'fmha_<family>_dtype-<dtype>_hdimq-<n>_hdimv-<n>[_<field>-<value>...]'")
    kwargs: Dict[str, Any] = {"family": m["family"], "arch": arch}
    for token in _BODY_SPLIT.split(body[m.end():]):
        alias, sep, text = token.partition("-")
        if not sep or alias not in _UNALIAS:
            raise ConfigError(f"bad token {token!r} in FMHA kernel name body {body!r}; tokens are "
                              f"'<field>-<value>' with field in {sorted(_UNALIAS)}")
        key = _UNALIAS[alias]
        if key in kwargs:
            raise ConfigError(f"field {alias!r} appears twice in FMHA kernel name body {body!r}")
        kwargs[key] = _decode(_FIELD_BY_NAME[key], text)
    missing = _REQUIRED - set(kwargs)
    if missing:
        raise ConfigError(f"FMHA kernel name body {body!r} lacks field(s) {sorted(missing)}")
    return FmhaKernelSpec(**kwargs)


def _encode(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, tuple):
        return "x".join(str(v) for v in value) if value else "none"
    return str(value)


def _decode(field: "attrs.Attribute", text: str):
    default = field.default
    try:
        if field.name in ("tile", "warps", "warp_tile"):
            return () if text == "none" else tuple(int(v) for v in text.split("x"))
        if isinstance(default, bool):
            if text not in ("0", "1"):
                raise ValueError(text)
            return text == "1"
        if field.name in ("hdim_q", "hdim_v") or isinstance(default, int):
            return int(text)
    except ValueError:
        raise ConfigError(
            f"bad value {text!r} for field {field.name!r} in an FMHA kernel name"
        ) from None
    return text


def parse_name(name: str) -> FmhaKernelSpec:
    """Parse a name made by :attr:`FmhaKernelSpec.name` back into the spec."""
    parts = name.split(".")
    if len(parts) < 3 or parts[0] != "fmha":
        raise ConfigError(
            f"{name!r} is not an FMHA kernel name; expected 'fmha.<family>.<arch>.<field>-<value>...'"
        )
    kwargs: Dict[str, Any] = {"family": parts[1], "arch": parts[2]}
    for token in parts[3:]:
        key, sep, text = token.partition("-")
        if not sep or key not in _FIELD_BY_NAME or key in ("family", "arch"):
            raise ConfigError(
                f"bad token {token!r} in FMHA kernel name {name!r}; tokens are "
                f"'<field>-<value>' with field in {sorted(_FIELD_NAMES - {'family', 'arch'})}"
            )
        if key in kwargs:
            raise ConfigError(f"field {key!r} appears twice in FMHA kernel name {name!r}")
        kwargs[key] = _decode(_FIELD_BY_NAME[key], text)
    missing = _REQUIRED - set(kwargs)
    if missing:
        raise ConfigError(f"FMHA kernel name {name!r} lacks field(s) {sorted(missing)}")
    return FmhaKernelSpec(**kwargs)


# ---------------------------------------------------------------------------
# CK name builders, one per family.  Token order and spelling are CK's.
# ---------------------------------------------------------------------------


def _pad_tokens(spec: FmhaKernelSpec, flags) -> str:
    n = "".join(tok for on, tok in flags if on)
    return f"_p{n}" if n else "_npad"


def _mask_token(mask: str) -> str:
    if mask.startswith("s_"):
        return "_mask" if mask == "s_mask" else "_nmask"
    return f"_m{mask[0]}" if mask != "no" else "_nmask"


def _fwd_tile_name(s: FmhaKernelSpec) -> str:
    b, r, w = s.tile, s.warps, s.warp_tile
    n = (f"b{b[0]}x{b[1]}x{b[2]}x{b[3]}x{b[4]}x{b[5]}"
         f"_r{r[0]}x{r[1]}x{r[2]}_r{r[3]}x{r[4]}x{r[5]}"
         f"_w{w[0]}x{w[1]}x{w[2]}_w{w[3]}x{w[4]}x{w[5]}")
    return n if s.occupancy == -1 else f"{n}_o{s.occupancy}"


def _fwd_pads(s: FmhaKernelSpec) -> str:
    return _pad_tokens(s, ((s.spad, "s"), (s.skpad, "sk"), (s.dpad, "d"), (s.dvpad, "dv")))


def _yn(flag: bool, token: str) -> str:
    return f"_{token}" if flag else f"_n{token}"


def _bias_token(bias: str) -> str:
    return f"_{bias}" if bias != "no" else "_nbias"


def _ck_fwd(s: FmhaKernelSpec) -> str:
    p = (f"{s.pipeline}_v{s.vlayout[0]}{_fwd_pads(s)}{_yn(s.logits, 'logits')}"
         f"{_bias_token(s.bias)}{_mask_token(s.mask)}{_yn(s.lse, 'lse')}"
         f"{_yn(s.dropout, 'dropout')}{_yn(s.skip, 'skip')}"
         f"{'_' + s.qscale if s.qscale != 'no' else '_nqscale'}"
         f"{_yn(s.trload, 'trload')}{_yn(s.sink, 'sink')}")
    return f"fmha_fwd_d{s.hdim_q}_{s.dtype}_{s.mode}_{_fwd_tile_name(s)}_{p}"


def _ck_splitkv(s: FmhaKernelSpec) -> str:
    p = (f"{s.pipeline}_v{s.vlayout[0]}{_fwd_pads(s)}{_yn(s.logits, 'logits')}"
         f"{_bias_token(s.bias)}{_mask_token(s.mask)}{_yn(s.lse, 'lse')}"
         f"{_yn(s.squant, 'squant')}{_yn(s.pagedkv, 'pagedkv')}{_yn(s.sink, 'sink')}")
    return f"fmha_fwd_splitkv_d{s.hdim_q}_{s.dtype}_{s.mode}_{_fwd_tile_name(s)}_{p}"


def _ck_splitkv_combine(s: FmhaKernelSpec) -> str:
    t = f"b{s.tile[0]}" + ("" if s.occupancy == -1 else f"_o{s.occupancy}")
    p = ("unused" + _pad_tokens(s, ((s.spad, "s"), (s.dvpad, "dv")))
         + _yn(s.lse, "lse") + _yn(s.squant, "squant"))
    return f"fmha_fwd_splitkv_combine_d{s.hdim_q}_{s.dtype}_{s.mode}_{t}_{p}"


def _ck_pagedkv(s: FmhaKernelSpec) -> str:
    p = (f"{s.pipeline}_v{s.vlayout[0]}{_fwd_pads(s)}{_yn(s.logits, 'logits')}"
         f"{_bias_token(s.bias)}{_mask_token(s.mask)}{_yn(s.lse, 'lse')}"
         f"{_yn(s.skip, 'skip')}{_yn(s.squant, 'squant')}{_yn(s.pagedkv, 'pagedkv')}"
         f"{_yn(s.sink, 'sink')}")
    return f"fmha_fwd_pagedkv_d{s.hdim_q}_{s.dtype}_{s.mode}_{_fwd_tile_name(s)}_{p}"


def _ck_appendkv(s: FmhaKernelSpec) -> str:
    b = s.tile
    t = f"b{b[0]}x{b[1]}x{b[2]}x{b[3]}" + ("" if s.occupancy == -1 else f"_o{s.occupancy}")
    p = f"v{s.vlayout[0]}{_fwd_pads(s)}"
    if s.rope != "no":
        p += f"_{s.rope}"
    if s.pagedkv:
        p += "_pagedkv"
    return f"fmha_fwd_appendkv_d{s.hdim_q}_{s.dtype}_{t}_{p}"


def _ck_batch_prefill(s: FmhaKernelSpec) -> str:
    p = (f"{s.pipeline}_v{s.vlayout[0]}{_fwd_pads(s)}{_yn(s.logits, 'logits')}"
         f"{_bias_token(s.bias)}{_mask_token(s.mask)}{_yn(s.lse, 'lse')}"
         f"{_yn(s.dropout, 'dropout')}"
         f"{'_' + s.qscale if s.qscale != 'no' else '_nqscale'}"
         f"{_yn(s.sink, 'sink')}_{s.kv_layout}_{s.kv_lookup}")
    wide = "64bit_" if s.load_64bit else ""
    return (f"fmha_batch_prefill_d{s.hdim_q}_{s.dtype}_{s.mode}_ps{s.page_size}_"
            f"{wide}{_fwd_tile_name(s)}_{p}")


def _ck_bwd_dq_dk_dv(s: FmhaKernelSpec) -> str:
    b, r, w = s.tile, s.warps, s.warp_tile
    t = (f"b{'x'.join(str(v) for v in b)}"
         f"_r{r[0]}x{r[1]}x{r[2]}_r{r[3]}x{r[4]}x{r[5]}_r{r[6]}x{r[7]}x{r[8]}"
         f"_w{w[0]}x{w[1]}x{w[2]}_w{w[3]}x{w[4]}x{w[5]}"
         f"_o{s.occupancy}_maxq{s.max_seq_q}")
    pn = (f"d{s.dpad}" if s.dpad else "") + (f"dv{s.dvpad}" if s.dvpad else "")
    n = f"fmha_bwd_d{s.hdim_q}_{s.dtype}_{s.mode}_{t}" + (f"_p{pn}" if pn else "_npad")
    n += _bias_token(s.bias) + _yn(s.dbias, "dbias") + _mask_token(s.mask)
    n += f"_dropout_{s.dropout_variant}" if s.dropout else "_ndropout"
    return n + _yn(s.deterministic, "deterministic") + _yn(s.trload, "trload")


def _ck_bwd_dot_do_o(s: FmhaKernelSpec) -> str:
    n = f"fmha_bwd_dot_do_o_d{s.hdim_q}_{s.dtype}_b{s.tile[0]}_{s.mode}_o{s.occupancy}"
    return n + _pad_tokens(s, ((s.spad, "s"), (s.dvpad, "dv")))


def _ck_bwd_convert_dq(s: FmhaKernelSpec) -> str:
    n = (f"fmha_bwd_convert_dq_d{s.hdim_q}_{s.dtype}_b{s.tile[0]}x{s.tile[1]}"
         f"_{s.mode}_o{s.occupancy}")
    n += _pad_tokens(s, ((s.spad, "s"), (s.dpad, "d")))
    return n + _yn(s.deterministic, "deterministic")


_CK_NAMERS = {
    "fwd": _ck_fwd,
    "fwd_splitkv": _ck_splitkv,
    "fwd_splitkv_combine": _ck_splitkv_combine,
    "fwd_pagedkv": _ck_pagedkv,
    "fwd_appendkv": _ck_appendkv,
    "batch_prefill": _ck_batch_prefill,
    "bwd_dq_dk_dv": _ck_bwd_dq_dk_dv,
    "bwd_dot_do_o": _ck_bwd_dot_do_o,
    "bwd_convert_dq": _ck_bwd_convert_dq,
}
