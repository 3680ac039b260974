"""FMHA kernel keys: CK-rule instances (``FmhaKernelSpec``) and what each supports.

A CK-style key's signature is the codegen's :class:`FmhaKernelSpec` (CK's
name maps one-to-one onto ours); its algorithm is empty because CK's tile
table is part of the instance.  ``supports`` answers whether an instance
computes a problem: family, dtype, head dims (larger with d-padding), mode,
mask, bias, LSE, dropout, soft cap, sinks, paging, RoPE, padding of lengths.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Optional

import attrs

from ck_core.errors import ConfigError
from ck_core.key import KernelKey, RecordSchema

from . import seqtune
from .codegen import ck_facts as F
from .codegen import enumerate_kernels
from .codegen.spec import parse_key_body
from .codegen.spec import FAMILY_FIELDS, FmhaKernelSpec


@attrs.frozen
class CkInstance:
    """The algorithm half of a CK FMHA key: CK's tiles live in the spec itself."""


CK_INSTANCE = CkInstance()
_BIAS = {"none": "no", "elementwise": "bias", "alibi": "alibi"}
_ROPE = {"none": "no", "interleaved": "inter", "half_rotated": "half"}
ENUM_OPTIONS = ("receipt", "family", "families", "mask_impl", "batch_prefill_64bit", "config")


def ck_keys(arch, backend: str, options: dict) -> list:
    unknown = sorted(set(options) - set(ENUM_OPTIONS))
    if unknown:
        raise ConfigError(f"unknown fmha enumeration option(s) {', '.join(unknown)}; "
                          f"known: {', '.join(ENUM_OPTIONS)}")
    fams = options.get("families") or options.get("family")
    if isinstance(fams, str):
        fams = [fams]
    kw = {k: options[k] for k in ("mask_impl", "batch_prefill_64bit") if k in options}
    specs = enumerate_kernels(arch.name, options.get("receipt", 0), fams, **kw)
    if options.get("config"):  # a tile-engine sweep config (JSON or TOML allow-lists)
        from .codegen import load_sweep

        specs = load_sweep(options["config"]).apply(specs)
    return [KernelKey("fmha", s, CK_INSTANCE, arch.name, backend) for s in specs]


def dtype_ok(spec_dtype: str, dtype: str) -> bool:
    """Whether a CK kernel of ``spec_dtype`` computes a problem of ``dtype``."""
    return spec_dtype == dtype or (dtype == "fp8" and spec_dtype.startswith("fp8"))


_dtype_ok = dtype_ok


def hdims_ok(s: FmhaKernelSpec, hdim_q: int, hdim_v: int) -> bool:
    """Whether a CK kernel's head dims hold (``hdim_q``, ``hdim_v``): equal, or padded up to.  CK's
    bwd_dot_do_o kernels read only O/dO (head dim v: dvpad), bwd_convert_dq only dQ (head dim q:
    dpad)."""
    q_ok = s.hdim_q >= hdim_q and (s.hdim_q == hdim_q or bool(s.dpad))
    v_ok = s.hdim_v >= hdim_v and (s.hdim_v == hdim_v or bool(s.dvpad))
    if s.family == "bwd_dot_do_o":
        return v_ok
    if s.family == "bwd_convert_dq":
        return q_ok
    return q_ok and v_ok


def ck_supports(s: FmhaKernelSpec, p) -> Optional[str]:
    fam = p.family
    if s.family != fam:
        return f"kernel family {s.family}, problem {fam}"
    if not _dtype_ok(s.dtype, p.dtype):
        return f"kernel dtype {s.dtype}, problem {p.dtype}"
    if not hdims_ok(s, p.hdim_q, p.hdim_v):
        if s.hdim_q < p.hdim_q or s.hdim_v < p.hdim_v:
            return f"kernel head dims {s.hdim_q}/{s.hdim_v} < problem {p.hdim_q}/{p.hdim_v}"
        return "head dim differs from the kernel's and the kernel does not pad it"
    if s.mode and s.mode != p.mode:
        return f"kernel is {s.mode} mode, problem {p.mode}"
    if s.mask:
        if p.mask == "none" and s.mask != "no":
            return "kernel applies a mask; problem has none"
        if p.mask != "none" and s.mask == "no":
            return "problem needs a mask"
        if p.mask != "none" and s.mask == "causal" and not p.is_causal:
            return "kernel handles causal masks only; problem has a window"
    if s.bias and s.bias != _BIAS[p.bias]:
        return f"kernel bias {s.bias}, problem {p.bias}"
    if fam in ("fwd", "batch_prefill") and p.lse and not s.lse:
        return "problem wants LSE stored"
    if fam in ("fwd", "batch_prefill", "bwd_dq_dk_dv") and (p.p_drop > 0) != s.dropout:
        return "dropout differs"
    if fam in ("fwd", "fwd_splitkv", "fwd_pagedkv", "batch_prefill") and (p.logits_soft_cap > 0) != s.logits:
        return "logits soft cap differs"
    if fam in ("fwd", "fwd_splitkv", "fwd_pagedkv", "batch_prefill") and \
            (p.sink_tokens > 0 or p.sink_logits) != s.sink:
        return "sink tokens differ"
    if fam == "fwd" and p.skip_min_seqlen_q > 0 and not s.skip:
        return "problem skips short sequences (skip_min_seqlen_q)"
    if fam in ("fwd_splitkv", "fwd_appendkv") and p.paged_kv != s.pagedkv:
        return "paged KV differs"
    if fam == "fwd_appendkv" and _ROPE[p.rope] != (s.rope or "no"):
        return f"kernel RoPE {s.rope or 'no'}, problem {p.rope}"
    if fam == "batch_prefill":
        if (s.page_size, s.kv_layout, s.kv_lookup) != (p.page_size, p.kv_layout, p.kv_lookup):
            return "page size / KV layout / lookup table differ"
    if fam in ("bwd_dq_dk_dv",) and s.dbias != p.dbias:
        return "dbias differs"
    if fam in ("bwd_dq_dk_dv", "bwd_convert_dq") and s.deterministic != p.deterministic:
        return "deterministic mode differs"
    if fam in ("fwd", "fwd_splitkv", "fwd_pagedkv") and s.tile and not s.spad:
        if p.is_group or (p.seqlen_q or 0) % s.tile[0]:
            return "query length needs a padded (spad) kernel"
    if fam in ("fwd", "fwd_splitkv", "fwd_pagedkv") and len(s.tile) > 1 and not s.skpad:
        if p.is_group or (p.seqlen_k or 0) % s.tile[1]:
            return "key length needs a padded (skpad) kernel"
    if p.dtype == "fp8" and fam == "fwd" and s.qscale not in ("pertensor",):
        return "fp8 needs a per-tensor qscale kernel"
    return seqtune.max_seq_q_reason(s.max_seq_q, p)


def ck_rank(problem, keys: list) -> list:
    """Exact head dims first, then short-query specialisations that fit and the tiles that pad
    the actual lengths least (:mod:`ck_fmha.seqtune`), then fewest padding switches, then the
    largest tile."""
    def cost(k):
        s = k.signature
        pads = int(s.spad) + int(s.skpad) + int(bool(s.dpad)) + int(bool(s.dvpad))
        fits, maxq, padded = seqtune.ck_cost(problem, s)
        return (s.hdim_q - problem.hdim_q + s.hdim_v - problem.hdim_v, fits, maxq, padded, pads,
                -(s.tile[0] if s.tile else 0))
    return sorted(keys, key=cost)


def parse_ck(body: str, arch: str):
    """(spec, instance) of a CK-rule key's name body on ``arch`` (the name's tail)."""
    return check_layout(check_spec(parse_key_body(body, arch)), names=False), CK_INSTANCE


#: the vocabulary of CK FMHA spec fields; string fields not listed are one token
SPEC_CHOICES = {"family": F.FAMILIES, "arch": F.ARCHES, "dtype": F.DTYPES, "mode": ("", *F.MODES),
                "mask": ("", *(m for ms in F.MASKS.values() for m in ms)), "bias": ("", *F.BIASES)}
SPEC_BOUNDS = {"occupancy": (-1, 64), "dpad": (0, 64), "dvpad": (0, 64), "tile": (0, 1 << 16),
               "warps": (0, 1 << 10), "warp_tile": (0, 1 << 10)}


_SPEC = RecordSchema(FmhaKernelSpec, what="CK FMHA kernel spec", choices=SPEC_CHOICES, bounds=SPEC_BOUNDS)


def check_spec(spec: FmhaKernelSpec) -> FmhaKernelSpec:
    """``spec`` when every field has the right type and vocabulary (ConfigError naming it)."""
    _SPEC(spec.to_dict())
    return spec


#: (tile, warps, warp_tile) lengths of each family's specs: CK's codegen layouts (codegen/spec.py)
SPEC_LENGTHS = {"fwd": (6, 6, 6), "fwd_splitkv": (6, 6, 6), "fwd_pagedkv": (6, 6, 6), "batch_prefill": (6, 6, 6),
                "fwd_splitkv_combine": (1, 0, 0), "fwd_appendkv": (4, 0, 0), "bwd_dq_dk_dv": (9, 9, 6),
                "bwd_dot_do_o": (1, 0, 0), "bwd_convert_dq": (2, 0, 0)}
#: string fields a family's CK name spells out (one letter or more of each)
_NAMED_STRINGS = ("mode", "pipeline", "vlayout", "mask", "bias")


def check_layout(spec: FmhaKernelSpec, names: bool = True) -> FmhaKernelSpec:
    """``spec`` when its tuples have the lengths of its family and the strings its CK name spells
    are not empty (ConfigError naming the field); a record's fields are otherwise only typed.
    ``names``: also build its names (a record's; a parsed name has passed through them)."""
    fam = spec.family
    fields = FAMILY_FIELDS.get(fam, frozenset())
    for name, want in zip(("tile", "warps", "warp_tile"), SPEC_LENGTHS.get(fam, ())):
        got = len(getattr(spec, name))
        if got != want:
            raise ConfigError(f"CK FMHA kernel spec ({fam}): field {name!r} must hold {want} integers, got {got}"
                              if want else f"CK FMHA kernel spec ({fam}): field {name!r} is not used by {fam}; "
                              f"leave it empty")
    for name in _NAMED_STRINGS:
        if name in fields and not getattr(spec, name) and not (name == "mode" and fam == "fwd_appendkv"):
            raise ConfigError(f"CK FMHA kernel spec ({fam}): field {name!r} must not be empty")
    if not names:
        return spec
    try:
        spec.ck_name, spec.name   # the names are built from every field: a record that cannot be named is refused
    except (IndexError, KeyError, ValueError, TypeError) as exc:
        raise ConfigError(f"CK FMHA kernel spec ({fam}): its fields do not make a CK kernel name "
                          f"({type(exc).__name__}: {str(exc)[:120]}); export the record again with `ck export`") from None
    return spec


def ck_from_fields(sig: dict, alg: dict):
    """A CK FMHA key's (spec, instance) of untrusted JSON fields, every field checked."""
    spec = check_layout(_SPEC(sig))
    if alg not in ({}, None):
        raise ConfigError(f"a CK FMHA key's algorithm is empty (its tiles live in the spec), got {str(alg)[:80]}")
    return spec, CK_INSTANCE


@lru_cache(maxsize=256)
def _ck_space(arch: str, family: str, receipt: int, mask_impl: str, wide: bool) -> frozenset:
    return frozenset(enumerate_kernels(arch, receipt, [family], mask_impl=mask_impl, batch_prefill_64bit=wide))


def ck_legal(spec: FmhaKernelSpec, arch) -> Optional[str]:
    """Why CK's codegen generates ``spec`` for ``arch`` under no receipt (or None)."""
    if spec.arch != arch.name:
        return f"the spec is for {spec.arch}, not {arch.name}"
    for receipt in F.RECEIPTS:
        for mask_impl in F.MASK_IMPLS:
            for wide in (True, False):
                if spec in _ck_space(arch.name, spec.family, receipt, mask_impl, wide):
                    return None
    return f"CK's {spec.family} codegen makes no such instance for {arch.name} under any receipt"
