"""Enumerate the FMHA kernels CK generates for one arch and receipt.

One generator per family walks CK's candidates in CK's order (tiles x
feature products) and keeps those that pass CK's rules: the compatibility
rules of the arch's factory and the receipt's filter.  At debug level each
culled candidate is logged with its reason, and a per-reason summary closes
each family.

Results are cached per ``(arch, receipt, family, options)``; the cache holds
immutable tuples of frozen specs, callers get fresh lists.
"""
from __future__ import annotations

import gc
import itertools
import logging
from functools import lru_cache
from typing import Dict, Iterable, List, NamedTuple, Optional, Tuple

import attrs

from ck_core.errors import ConfigError

from . import ck_facts as F
from .culls import _FT, _TF, _Culls, _pads
from .decode_families import (_gen_appendkv, _gen_batch_prefill, _gen_pagedkv, _gen_splitkv,
                              _gen_splitkv_combine)
from .spec import FmhaKernelSpec

logger = logging.getLogger(__name__)

__all__ = ["enumerate_kernels", "count_kernels", "spec_from_ck_name"]


# ---------------------------------------------------------------------------
# fwd (CK 494d7a63)
# ---------------------------------------------------------------------------


class _FwdPipe(NamedTuple):
    tag: str
    spad: bool
    skpad: bool
    dpad: bool
    dvpad: bool
    logits: bool
    bias: str
    lse: bool
    dropout: bool
    qscale: str
    mask: str
    skip: bool
    trload: bool
    sink: bool




def _fwd_pipelines(factory: str, dtype: str, hq: int, hv: int, receipt: int,
                   masks: Tuple[str, ...]) -> List[_FwdPipe]:
    """CK's get_pipelines() for the fwd family; order matters to CK only for dispatch."""
    out: List[_FwdPipe] = []
    P = _FwdPipe
    gfx9 = factory in ("gfx9", "gfx950")
    if dtype == "fp32" and gfx9:
        for logits, mask, bias, lse, dropout, skip, sink in itertools.product(
                _TF, masks, F.BIASES, _TF, _TF, _TF, _TF):
            for pad in ("ffff", "ftff", "tttt"):
                out.append(P("qr", *_pads(pad), logits, bias, lse, dropout, "no", mask, skip, False, sink))
    elif dtype in ("fp16", "bf16") and gfx9:
        for logits, mask, bias, lse, dropout, skip, sink in itertools.product(
                _TF, masks, F.BIASES, _TF, _TF, _TF, _TF):
            feat = (logits, bias, lse, dropout, "no", mask, skip, False, sink)
            if (hq, hv) == (256, 256):
                for pad in ("ffff", "ttff", "tttt"):
                    out.append(P("qr", *_pads(pad), *feat))
            else:
                if bias == "bias":  # CK: ROCm 6.2 compiler issue with qr_async + bias
                    for pad in ("ffff", "tttt"):
                        out.append(P("qr", *_pads(pad), *feat))
                else:
                    for pad in ("tftt", "tttt"):
                        out.append(P("qr_async", *_pads(pad), *feat))
                if receipt == 1 and bias != "bias":
                    out.append(P("qr", *_pads("tttt"), *feat))
    elif dtype in ("fp8bf16", "fp8fp32") and gfx9:
        for logits, qscale, mask, bias, sink in itertools.product(
                _TF, F.FWD_FP8_QSCALES, masks, ("no",), _FT):
            tag = "qr" if hq == 64 else "qr_async"
            for pad in ("tftt", "tttt"):
                out.append(P(tag, *_pads(pad), logits, bias, False, False, qscale, mask, False, False, sink))
    if factory == "gfx950" and dtype in ("fp16", "bf16"):
        for logits, mask, bias, lse, dropout, skip, sink in itertools.product(
                _TF, masks, F.BIASES, _TF, _TF, _TF, _TF):
            if ((hq, hv) in F.FWD_TRLOAD_HDIMS and not logits and bias == "no"
                    and not dropout and not skip):
                for pad in ("ffff", "fftt"):
                    out.append(P("qr_async_trload", *_pads(pad), logits, bias, lse, dropout,
                                 "no", mask, skip, True, sink))
        if (hq, hv) in F.FWD_V3_HDIMS:
            for logits, mask in itertools.product(_TF, F.FWD_V3_MASKS):
                out.append(P("qr_async_trload_v3", *_pads("ttff"), logits, "no", False, False,
                             "no", mask, False, True, False))
    if factory in ("gfx11", "gfx12") and dtype in ("fp16", "bf16"):
        for logits, mask, bias, lse, dropout, skip, sink in itertools.product(
                _TF, masks, F.BIASES, _TF, _TF, _TF, _TF):
            for pad in ("ffff", "ttff", "tttt"):
                out.append(P("qr", *_pads(pad), logits, bias, lse, dropout, "no", mask, skip, False, sink))
    if factory == "gfx12" and dtype in ("fp8", "fp8bf16", "fp8fp32"):
        for logits, qscale, mask, bias in itertools.product(
                (False,), F.FWD_FP8_QSCALES, masks, ("no",)):
            for pad in ("ffff", "ttff", "tttt"):
                out.append(P("qr", *_pads(pad), logits, bias, False, False, qscale, mask, False, False, False))
    # gfx9 "fp8" (and fp8fp16/bf8) have tile tables but no pipelines in CK
    return out


def _fwd_receipt(receipt: int, dtype: str, mode: str, hq: int, p: _FwdPipe) -> Optional[str]:
    """CK fmha_fwd.py get_product(); returns why the receipt rejects, or None."""
    if receipt in (2, 3):
        if dtype not in ("fp16", "bf16"):
            return "receipt: flash needs fp16/bf16"
        if p.bias not in ("no", "alibi"):
            return "receipt: flash needs bias no/alibi"
        if p.qscale != "no" or p.skip or p.sink:
            return "receipt: flash excludes qscale/skip/sink"
        return None
    if receipt == 4:
        if dtype not in ("fp16", "bf16"):
            return "receipt: pytorch needs fp16/bf16"
        if p.bias not in ("no", "bias"):
            return "receipt: pytorch needs bias no/bias"
        if p.qscale != "no" or p.skip or p.logits:
            return "receipt: pytorch excludes qscale/skip/logits"
        return None
    if receipt in (100, 200, 600):
        if dtype not in ("fp16", "bf16", "fp8bf16"):
            return "receipt: aiter needs fp16/bf16/fp8bf16"
        if receipt == 100 and mode != "batch":
            return "receipt: aiter batch needs batch mode"
        if receipt == 200 and mode != "group":
            return "receipt: aiter group needs group mode"
        if dtype == "fp8bf16" and hq not in (128, 192):
            return "receipt: aiter fp8bf16 needs hdim 128/192"
        return None
    if receipt == 888:
        if dtype not in ("fp8bf16", "fp8fp32"):
            return "receipt: 888 needs fp8bf16/fp8fp32"
        if hq not in (128, 192):
            return "receipt: 888 needs hdim 128/192"
        return None
    if receipt == 800:
        if dtype != "fp32":
            return "receipt: 800 is fp32 only"
        if p.skip or p.logits:
            return "receipt: 800 excludes skip/logits"
        return None
    if receipt == 801:
        if dtype != "fp32":
            return "receipt: 801 is fp32 only"
        if hq not in (48, 128) or mode != "batch":
            return "receipt: 801 needs batch mode, hdim 48/128"
        if p.bias != "no" or p.lse or p.dropout or p.skip or p.logits or p.mask != "s_no":
            return "receipt: 801 needs the minimal feature set (simplified mask s_no)"
        return None
    if dtype == "fp32":
        return "receipt: fp32 is built only for receipts 800/801"
    return None


def _fwd_rules(factory: str, dtype: str, hq: int, hv: int, mode: str,
               tile: tuple, p: _FwdPipe) -> Optional[str]:
    if mode == "group" and not (p.spad and p.skpad):
        return "group mode needs spad and skpad"
    if p.logits and p.bias != "no":
        return "logits soft-cap needs no bias"
    bm0, bn0, bk0 = tile[0], tile[1], tile[2]
    if factory in ("gfx9", "gfx950") and dtype != "fp32" and p.tag in F.FWD_GFX9_RULE_PIPELINES:
        if (hq, hv) == (128, 128):
            if bn0 != 128:
                return "gfx9: hdim 128 needs bn0 == 128"
            if p.tag != "qr_async" and bk0 == 64:
                return "gfx9: hdim 128 non-async needs bk0 != 64"
        elif bm0 != 128:
            return "gfx9: hdim != 128 needs bm0 == 128"
    if factory == "gfx950":
        if p.tag == "qr_async_trload":
            if (hq, hv) == (128, 128) and bn0 == 128:
                return "gfx950: trload at hdim 128 needs bn0 != 128"
            if (hq, hv) not in F.FWD_TRLOAD_HDIMS:
                return "gfx950: trload needs hdim 64/128"
        v3_tile = bm0 == 256 and tile[6] * tile[7] * tile[8] == 8 and tile[9] * tile[10] * tile[11] == 8
        if v3_tile != (p.tag == "qr_async_trload_v3"):
            return "gfx950: the 256x8-warp tile is for qr_async_trload_v3 only (and vice versa)"
    return None


def _gen_fwd(arch: str, receipt: int, masks: Tuple[str, ...], culls: _Culls, opts) -> List[FmhaKernelSpec]:
    factory = F.factory("fwd", arch)
    out: List[FmhaKernelSpec] = []
    if factory is None:
        return out
    for dtype in F.FWD_DTYPES[factory]:
        table = F.FWD_TILES[factory].get(dtype)
        if not table:
            continue
        for (hq, hv), tiles in table.items():
            pipes = _fwd_pipelines(factory, dtype, hq, hv, receipt, masks)
            if not pipes:
                culls.cull("no pipelines for this dtype on this arch", lambda: f"{dtype} d{hq}x{hv}")
                continue
            for mode in F.MODES:
                for tile, p in itertools.product(tiles, pipes):
                    why = (_fwd_rules(factory, dtype, hq, hv, mode, tile, p)
                           or _fwd_receipt(receipt, dtype, mode, hq, p))
                    if why:
                        culls.cull(why, lambda: f"{dtype} {mode} d{hq}x{hv} {tile[:6]} {p}")
                        continue
                    out.append(FmhaKernelSpec(
                        family="fwd", arch=arch, dtype=dtype, mode=mode, hdim_q=hq, hdim_v=hv,
                        pipeline=p.tag, tile=tile[:6], warps=tile[6:12], warp_tile=tile[12:18],
                        occupancy=tile[18], vlayout="row", spad=p.spad, skpad=p.skpad,
                        dpad=int(p.dpad), dvpad=int(p.dvpad), logits=p.logits, mask=p.mask,
                        bias=p.bias, lse=p.lse, dropout=p.dropout, qscale=p.qscale, skip=p.skip,
                        trload=p.trload, sink=p.sink,
                    ))
    return out


# ---------------------------------------------------------------------------
# bwd (CK 494d7a63): one walk yields dot_do_o, dq_dk_dv and convert_dq
# ---------------------------------------------------------------------------


def _bwd_receipt(receipt: int, dtype: str, mode: str, hdim: int, mask: str, bias: str,
                 dropout: str, dpad: int, dvpad: int, det: bool) -> Optional[str]:
    plain_dropout = dropout in ("no", "dropout_wg32", "dropout_wg16")
    if receipt == 2:
        if dtype not in ("fp16", "bf16") or bias not in ("no", "alibi") or not plain_dropout or dpad != dvpad:
            return "receipt: flash fwd (2) needs fp16/bf16, bias no/alibi, no randval store, dpad == dvpad"
    elif receipt == 3:
        if dtype not in ("fp16", "bf16") or bias not in ("no", "alibi") or dpad != dvpad or det:
            return "receipt: flash bwd (3) needs fp16/bf16, bias no/alibi, dpad == dvpad, non-deterministic"
    elif receipt == 4:
        if (dtype not in ("fp16", "bf16") or bias not in ("no", "bias") or not plain_dropout
                or dpad != dvpad or det):
            return "receipt: pytorch needs fp16/bf16, bias no/bias, no randval store, dpad == dvpad, non-deterministic"
    elif receipt == 300:
        if dtype not in ("fp16", "bf16") or mode != "batch" or not plain_dropout:
            return "receipt: aiter bwd batch needs fp16/bf16, batch mode, no randval store"
    elif receipt == 400:
        if dtype not in ("fp16", "bf16") or mode != "group" or not plain_dropout:
            return "receipt: aiter bwd group needs fp16/bf16, group mode, no randval store"
    elif receipt == 600:
        if dtype not in ("fp16", "bf16"):
            return "receipt: aiter cpp needs fp16/bf16"
    if receipt == 800:
        if dtype != "fp32" or dpad != dvpad:
            return "receipt: 800 needs fp32 and dpad == dvpad"
    elif receipt == 801:
        if (dtype != "fp32" or hdim not in (64, 128) or dpad != dvpad or mode != "batch"
                or bias != "no" or dropout != "no" or mask != "s_no" or det):
            return "receipt: 801 needs the minimal fp32 set (simplified mask s_no)"
    elif dtype == "fp32":
        return "receipt: fp32 is built only for receipts 800/801"
    return None


def _bwd_dtype_receipt(receipt: int, dtype: str) -> Optional[str]:
    """The dtype-only part of the bwd receipt filter (lets whole dtypes be skipped)."""
    if receipt in (2, 3, 4, 300, 400, 600) and dtype not in ("fp16", "bf16"):
        return f"receipt {receipt}: fp16/bf16 only"
    if receipt in (800, 801):
        return None if dtype == "fp32" else f"receipt {receipt}: fp32 only"
    if dtype == "fp32":
        return "receipt: fp32 is built only for receipts 800/801"
    return None


def _gen_bwd(arch: str, receipt: int, masks: Tuple[str, ...], culls: _Culls, opts):
    """CK's get_bwd_blobs(): one walk over dq/dk/dv candidates; the 1-D kernels
    (dot_do_o, convert_dq) each candidate needs are collected alongside."""
    factory = F.factory("bwd_dq_dk_dv", arch)
    if factory is None:
        return [], [], []
    dot: Dict[tuple, None] = {}
    dq: Dict[tuple, None] = {}
    conv: Dict[tuple, None] = {}
    m0 = F.BWD_M0_1D
    pad_pairs = tuple(itertools.product(F.BWD_PAD_VALUES, F.BWD_PAD_VALUES))
    n_leaf = 2 * len(pad_pairs) * 2                      # spad1d x (dpad, dvpad) x det
    n_inner = len(F.BIASES) * 2 * len(F.BWD_DROPOUTS) * n_leaf
    for dtype, trload in itertools.product(F.BWD_DTYPE_ORDER, (True, False)):
        tiles = F.BWD_TILES[factory].get(dtype, {}).get(trload, [])
        if not tiles:
            continue
        why = _bwd_dtype_receipt(receipt, dtype)
        if why:
            culls.cull_many(why, len(tiles) * len(F.MODES) * len(masks) * n_inner,
                            lambda: f"all {dtype} trload={trload} candidates")
            continue
        for tile, mode, mask in itertools.product(tiles, F.MODES, masks):
            maxq = tile[25]
            hdim = tile[7]
            if (mode == "group" or "no" not in mask) and maxq != 0:
                culls.cull_many("max_seq_q tiles are batch-mode, mask-free only", n_inner,
                                lambda: f"{dtype} {mode} {mask} {tile[:9]}")
                continue
            for bias, dbias, dropout in itertools.product(F.BIASES, _TF, F.BWD_DROPOUTS):
                if bias in ("no", "alibi") and dbias:
                    why = "dbias needs elementwise bias"
                elif "wg32" in dropout:
                    why = "wg32 dropout is not generated"
                else:
                    why = None
                if why:
                    culls.cull_many(why, n_leaf, lambda: f"{dtype} {mode} {mask} {tile[:9]} {bias} "
                                                         f"dbias={dbias} {dropout}")
                    continue
                for spad1d, (dpad, dvpad), det in itertools.product(_FT, pad_pairs, _TF):
                    if mode == "group" and not spad1d:
                        why = "group mode needs spad (1-D kernels)"
                    elif not spad1d and maxq != 0 and maxq < m0:
                        why = "max_seq_q < 64 needs spad"
                    elif trload and (dpad != dvpad or dpad == 1):
                        why = "trload needs dpad == dvpad in {0, 8}"
                    elif not trload and dpad != dvpad and dpad == 8:
                        why = "non-trload: dpad 8 only with dvpad 8"
                    else:
                        why = _bwd_receipt(receipt, dtype, mode, hdim, mask, bias, dropout, dpad, dvpad, det)
                    if why:
                        culls.cull(why, lambda: f"{dtype} {mode} d{hdim} trload={trload} {tile[:9]} {mask} "
                                                f"{bias} dbias={dbias} {dropout} spad={spad1d} "
                                                f"pad={dpad}/{dvpad} det={det}")
                        continue
                    dq[(dtype, mode, tile, dpad, dvpad, mask, bias, dbias, dropout, det, trload)] = None
                    dot[(dtype, mode, hdim, spad1d, bool(dvpad))] = None
                    if maxq == 0:  # CK disables convert_dq for max_seq_q tiles
                        conv[(dtype, mode, hdim, tile[1] if det else 0, spad1d, bool(dpad), det)] = None

    def mk_dq(dtype, mode, tile, dpad, dvpad, mask, bias, dbias, dropout, det, trload):
        has_drop = dropout != "no"
        return FmhaKernelSpec(
            family="bwd_dq_dk_dv", arch=arch, dtype=dtype, mode=mode, hdim_q=tile[7],
            hdim_v=tile[8], tile=tile[:9], warps=tile[9:18], warp_tile=tile[18:24],
            occupancy=tile[24], max_seq_q=tile[25], dpad=dpad, dvpad=dvpad, mask=mask,
            bias=bias, dbias=dbias, dropout=has_drop,
            dropout_variant=dropout[len("dropout_"):] if has_drop else "",
            deterministic=det, trload=trload,
        )

    def mk_dot(dtype, mode, hdim, spad, dvpad):
        return FmhaKernelSpec(
            family="bwd_dot_do_o", arch=arch, dtype=dtype, mode=mode, hdim_q=hdim, hdim_v=hdim,
            tile=(m0,), occupancy=F.BWD_1D_OCCUPANCY, spad=spad, dvpad=int(dvpad),
        )

    def mk_conv(dtype, mode, hdim, bn0, spad, dpad, det):
        return FmhaKernelSpec(
            family="bwd_convert_dq", arch=arch, dtype=dtype, mode=mode, hdim_q=hdim, hdim_v=hdim,
            tile=(m0, bn0), occupancy=F.BWD_1D_OCCUPANCY, spad=spad, dpad=int(dpad),
            deterministic=det,
        )

    return ([mk_dot(*k) for k in dot], [mk_dq(*k) for k in dq], [mk_conv(*k) for k in conv])


# ---------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------

_GENERATORS = {
    "fwd": _gen_fwd,
    "fwd_splitkv": _gen_splitkv,
    "fwd_splitkv_combine": _gen_splitkv_combine,
    "fwd_pagedkv": _gen_pagedkv,
    "fwd_appendkv": _gen_appendkv,
    "batch_prefill": _gen_batch_prefill,
}
_BWD_FAMILIES = ("bwd_dot_do_o", "bwd_dq_dk_dv", "bwd_convert_dq")


class _BulkBuild:
    """Context for building tens of thousands of specs from CK's tables.

    Pauses the cyclic GC (specs are acyclic; generation-2 passes otherwise
    dominate and jitter the timing) and skips attrs validators: every value
    comes from :mod:`.ck_facts`, and the tests push every enumerated spec
    through ``parse_name``, which does validate.
    """

    def __enter__(self):
        self.was_gc = gc.isenabled()
        gc.disable()
        self.validators = attrs.validators.disabled()
        self.validators.__enter__()

    def __exit__(self, *exc):
        self.validators.__exit__(*exc)
        if self.was_gc:
            gc.enable()


def _run_bwd(arch: str, receipt: int, mask_impl: str, opts: Tuple):
    culls = _Culls("bwd", arch)
    with _BulkBuild():
        dot, dq, conv = _gen_bwd(arch, receipt, F.MASKS[mask_impl], culls, dict(opts))
    culls.summary(len(dot) + len(dq) + len(conv))
    return dict(zip(_BWD_FAMILIES, (tuple(dot), tuple(dq), tuple(conv))))


def _run_family(arch: str, receipt: int, family: str, mask_impl: str, opts: Tuple) -> Tuple[FmhaKernelSpec, ...]:
    culls = _Culls(family, arch)
    with _BulkBuild():
        result = _GENERATORS[family](arch, receipt, F.MASKS[mask_impl], culls, dict(opts))
    culls.summary(len(result))
    return tuple(result)


_run_bwd_cached = lru_cache(maxsize=None)(_run_bwd)
_run_family_cached = lru_cache(maxsize=None)(_run_family)


def _check_choice(value, valid, what: str):
    if value not in valid:
        raise ConfigError(
            f"unknown FMHA {what} {value!r}; valid choices: {', '.join(str(v) for v in valid)}"
        )


def receipt_number(receipt) -> int:
    """A receipt by number (``4``, ``"4"``) or by profile name (``"pytorch"``); ConfigError otherwise."""
    valid = ", ".join(f"{k} ({v})" for k, v in F.RECEIPTS.items())
    if isinstance(receipt, str):
        by_name = {v: k for k, v in F.RECEIPTS.items()}
        text = receipt.strip()
        if text in by_name:
            return by_name[text]
        if not text.isdigit():
            raise ConfigError(f"unknown FMHA receipt {receipt!r}; valid receipts: {valid}")
        receipt = int(text)
    if isinstance(receipt, bool) or not isinstance(receipt, int):
        raise ConfigError(f"FMHA receipt must be a number or a name, got {receipt!r}; valid receipts: {valid}")
    if receipt not in F.RECEIPTS:
        raise ConfigError(f"unknown FMHA receipt {receipt}; valid receipts: {valid}")
    return receipt


def enumerate_kernels(
    arch: str,
    receipt: int = 0,
    families: Optional[Iterable[str]] = None,
    *,
    mask_impl: str = "generic",
    batch_prefill_64bit: bool = True,
) -> List[FmhaKernelSpec]:
    """All FMHA kernels CK generates for ``arch`` under ``receipt``.

    ``families`` picks some of :data:`FAMILIES` (default: all nine, in that
    order).  ``mask_impl`` is CK's ``--mask`` switch (the oracle lists use
    ``generic``).  ``batch_prefill_64bit=False`` leaves out the newest CK's
    64-bit-load batch-prefill variants.

    Raises :class:`ck_core.errors.ConfigError` for an unknown arch, receipt,
    family or mask implementation; the message lists the valid choices.
    """
    _check_choice(arch, F.ARCHES, "arch")
    receipt = receipt_number(receipt)
    _check_choice(mask_impl, F.MASK_IMPLS, "mask implementation")
    if families is None:
        fams = list(F.FAMILIES)
    else:
        if isinstance(families, str):
            families = [families]
        fams = list(dict.fromkeys(families))
        for fam in fams:
            _check_choice(fam, F.FAMILIES, "family")
    opts = (("batch_prefill_64bit", bool(batch_prefill_64bit)),)
    # at debug level skip the cache so the cull log is written again
    debug = logger.isEnabledFor(logging.DEBUG)
    run = _run_family if debug else _run_family_cached
    run_bwd = _run_bwd if debug else _run_bwd_cached
    out: List[FmhaKernelSpec] = []
    bwd = None
    for fam in fams:
        if fam in _BWD_FAMILIES:
            if bwd is None:
                bwd = run_bwd(arch, receipt, mask_impl, opts)
            out.extend(bwd[fam])
        else:
            out.extend(run(arch, receipt, fam, mask_impl, opts))
    return out


def count_kernels(arch: str, receipt: int = 0, families: Optional[Iterable[str]] = None,
                  **kwargs) -> Dict[str, int]:
    """``{family: count}`` for :func:`enumerate_kernels` with the same arguments."""
    fams = list(F.FAMILIES) if families is None else list(families)
    return {fam: len(enumerate_kernels(arch, receipt, [fam], **kwargs)) for fam in fams}


@lru_cache(maxsize=None)
def _ck_index(arch: str, receipt: int, mask_impl: str) -> Dict[str, FmhaKernelSpec]:
    return {s.ck_name: s for s in enumerate_kernels(arch, receipt, mask_impl=mask_impl)}


def spec_from_ck_name(ck_name: str, arch: str, receipt: int = 0, *,
                      mask_impl: str = "generic") -> FmhaKernelSpec:
    """The spec whose :attr:`~FmhaKernelSpec.ck_name` is ``ck_name`` on ``arch``.

    CK names do not say which gfx9 target they are for (``_gfx9``), so the
    arch is an argument.  Unknown names raise ``ConfigError``.
    """
    _check_choice(arch, F.ARCHES, "arch")
    spec = _ck_index(arch, receipt, mask_impl).get(ck_name)
    if spec is None:
        raise ConfigError(
            f"{ck_name!r} is not a CK FMHA kernel for {arch} receipt {receipt}; "
            "list them with enumerate_kernels()"
        )
    return spec
