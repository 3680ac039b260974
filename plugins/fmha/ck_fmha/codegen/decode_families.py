"""CK's decode-time FMHA families for one arch and receipt (newest CK): split-KV and its combine
kernel, paged-KV prefill, append-KV, batch prefill.  Each generator walks CK's candidates in CK's
order and keeps those its rules pass (see :mod:`.enumerate`, which runs them).  Split from
:mod:`.enumerate` by family group (issue #30).
"""
from __future__ import annotations

import itertools
from typing import List, Optional, Tuple

from . import ck_facts as F
from .culls import _TF, _Culls, _pads
from .spec import FmhaKernelSpec


# ---------------------------------------------------------------------------
# split-KV and its combine kernel (newest CK)
# ---------------------------------------------------------------------------


def _splitkv_receipt(receipt: int, dtype: str, mode: str, logits: bool, bias: str,
                     squant: bool, sink: bool) -> Optional[str]:
    if receipt == 2:
        if dtype not in ("fp16", "bf16") or bias not in ("no", "alibi") or logits or squant or sink:
            return "receipt: flash needs fp16/bf16, bias no/alibi, no logits/squant/sink"
    elif receipt == 4:
        # CK compares dtype against the single string "fp16, bf16": nothing passes.
        return "receipt: pytorch split-KV filter matches no dtype in CK"
    elif receipt == 200:
        if dtype not in ("fp16", "bf16") or mode != "group" or squant:
            return "receipt: aiter group needs fp16/bf16, group mode, no squant"
    elif receipt == 600:
        if dtype not in ("fp16", "bf16") or squant:
            return "receipt: aiter cpp needs fp16/bf16, no squant"
    if receipt in (800, 801) and dtype != "fp32":
        return "receipt: 800/801 are fp32 only"
    return None


def _gen_splitkv(arch: str, receipt: int, masks: Tuple[str, ...], culls: _Culls, opts) -> List[FmhaKernelSpec]:
    factory = F.factory("fwd_splitkv", arch)
    out: List[FmhaKernelSpec] = []
    if factory is None:
        return out
    for dtype in F.FWD_DTYPE_ORDER:
        table = F.SPLITKV_TILES[factory].get(dtype)
        if not table:
            continue
        squant = dtype == "fp8"
        pipes = []
        if dtype in ("fp16", "bf16"):
            for logits, mask, bias, pagedkv, sink in itertools.product(_TF, masks, F.BIASES, _TF, _TF):
                for tag, pad in (("qr", "ftff"), ("qr", "tfff"), ("qr", "ttff"), ("qr", "tttt"),
                                 ("qr_nwarp_sshuffle", "ttff")):
                    pipes.append((tag, _pads(pad), logits, bias, mask, pagedkv, sink))
        else:  # fp8
            for logits, mask, bias in itertools.product(_TF, masks, F.BIASES):
                for pad in ("ffff", "ttff"):
                    pipes.append(("qr", _pads(pad), logits, bias, mask, False, False))
        for hdim, tiles in table.items():
            for mode in F.MODES:
                for tile, (tag, (sp, skp, dp, dvp), logits, bias, mask, pagedkv, sink) in itertools.product(tiles, pipes):
                    if (tile[7] != 1) != (tag == "qr_nwarp_sshuffle"):
                        why = "qr_nwarp_sshuffle iff the tile has several N warps"
                    elif mode == "group" and not (sp and skp):
                        why = "group mode needs spad and skpad"
                    elif logits and bias != "no":
                        why = "logits soft-cap needs no bias"
                    else:
                        why = _splitkv_receipt(receipt, dtype, mode, logits, bias, squant, sink)
                    if why:
                        culls.cull(why, lambda: f"{dtype} {mode} d{hdim} {tile[:6]} {tag} pads={sp, skp, dp, dvp} "
                                                f"logits={logits} {bias} {mask} paged={pagedkv} sink={sink}")
                        continue
                    out.append(FmhaKernelSpec(
                        family="fwd_splitkv", arch=arch, dtype=dtype, mode=mode, hdim_q=hdim,
                        hdim_v=hdim, pipeline=tag, tile=tile[:6], warps=tile[6:12],
                        warp_tile=tile[12:18], occupancy=tile[18], vlayout="row", spad=sp,
                        skpad=skp, dpad=int(dp), dvpad=int(dvp), logits=logits, mask=mask,
                        bias=bias, lse=True, squant=squant, pagedkv=pagedkv, sink=sink,
                    ))
    return out


def _gen_splitkv_combine(arch: str, receipt: int, masks, culls: _Culls, opts) -> List[FmhaKernelSpec]:
    factory = F.factory("fwd_splitkv_combine", arch)
    out: List[FmhaKernelSpec] = []
    if factory is None:
        return out
    for dtype in F.FWD_DTYPE_ORDER:
        hdims = F.SPLITKV_COMBINE_HDIMS.get(dtype)
        if not hdims:
            continue
        squant = dtype == "fp8"
        if dtype in ("fp16", "bf16"):
            pipes = list(itertools.product(_TF, _TF, _TF))          # spad, dvpad, lse
        else:
            pipes = [(sp, dvp, False) for sp, dvp in itertools.product(_TF, _TF)]
        for hdim, mode in itertools.product(hdims, F.MODES):
            for spad, dvpad, lse in pipes:
                why = None
                if mode == "group" and not spad:
                    why = "group mode needs spad"
                elif receipt == 200 and (dtype not in ("fp16", "bf16") or mode != "group"):
                    why = "receipt: aiter group needs fp16/bf16, group mode"
                elif receipt == 600 and dtype not in ("fp16", "bf16"):
                    why = "receipt: aiter cpp needs fp16/bf16"
                elif receipt in (800, 801) and dtype != "fp32":
                    why = "receipt: 800/801 are fp32 only"
                if why:
                    culls.cull(why, lambda: f"{dtype} {mode} d{hdim} spad={spad} dvpad={dvpad} lse={lse}")
                    continue
                out.append(FmhaKernelSpec(
                    family="fwd_splitkv_combine", arch=arch, dtype=dtype, mode=mode, hdim_q=hdim,
                    hdim_v=hdim, tile=(F.SPLITKV_COMBINE_BN1,), occupancy=-1, spad=spad,
                    dvpad=int(dvpad), lse=lse, squant=squant,
                ))
    return out


# ---------------------------------------------------------------------------
# paged-KV prefill (newest CK)
# ---------------------------------------------------------------------------


def _pagedkv_receipt(receipt: int, dtype: str, mode: str, bias: str, squant: bool,
                     sink: bool) -> Optional[str]:
    fp16 = dtype in ("fp16", "bf16")
    if receipt in (2, 3):
        if not fp16 or bias not in ("no", "alibi") or squant or sink:
            return "receipt: flash needs fp16/bf16, bias no/alibi, no squant/sink"
    elif receipt == 4:
        if not fp16 or bias not in ("no", "bias") or squant or sink:
            return "receipt: pytorch needs fp16/bf16, bias no/bias, no squant/sink"
    elif receipt == 100:
        if not fp16 or mode != "batch" or squant:
            return "receipt: aiter batch needs fp16/bf16, batch mode, no squant"
    elif receipt == 200:
        if not fp16 or mode != "group" or squant:
            return "receipt: aiter group needs fp16/bf16, group mode, no squant"
    elif receipt == 600:
        if not fp16 or squant:
            return "receipt: aiter cpp needs fp16/bf16, no squant"
    if receipt in (800, 801) and dtype != "fp32":
        return "receipt: 800/801 are fp32 only"
    return None


def _gen_pagedkv(arch: str, receipt: int, masks, culls: _Culls, opts) -> List[FmhaKernelSpec]:
    factory = F.factory("fwd_pagedkv", arch)
    out: List[FmhaKernelSpec] = []
    if factory is None:
        return out
    for dtype in F.FWD_DTYPE_ORDER:
        table = F.PAGEDKV_TILES[factory].get(dtype)
        if not table:
            continue
        squant = dtype == "fp8"
        pipes = []
        if dtype in ("fp16", "bf16"):
            for logits, mask, bias, sink in itertools.product(_TF, masks, F.BIASES, _TF):
                for pad in ("tfff", "ttff"):
                    pipes.append((_pads(pad), logits, bias, mask, sink))
        else:
            for logits, mask, bias in itertools.product(_TF, masks, F.BIASES):
                for pad in ("ffff", "ttff"):
                    pipes.append((_pads(pad), logits, bias, mask, False))
        for hdim, tiles in table.items():
            for mode in F.MODES:
                for tile, ((sp, skp, dp, dvp), logits, bias, mask, sink) in itertools.product(tiles, pipes):
                    if mode == "group" and not (sp and skp):
                        why = "group mode needs spad and skpad"
                    elif logits and bias != "no":
                        why = "logits soft-cap needs no bias"
                    else:
                        why = _pagedkv_receipt(receipt, dtype, mode, bias, squant, sink)
                    if why:
                        culls.cull(why, lambda: f"{dtype} {mode} d{hdim} pads={sp, skp} logits={logits} "
                                                f"{bias} {mask} sink={sink}")
                        continue
                    out.append(FmhaKernelSpec(
                        family="fwd_pagedkv", arch=arch, dtype=dtype, mode=mode, hdim_q=hdim,
                        hdim_v=tile[3], pipeline="qr_pagedkv", tile=tile[:6], warps=tile[6:12],
                        warp_tile=tile[12:18], occupancy=tile[18], vlayout="row", spad=sp,
                        skpad=skp, dpad=int(dp), dvpad=int(dvp), logits=logits, mask=mask,
                        bias=bias, squant=squant, pagedkv=True, sink=sink,
                    ))
    return out


# ---------------------------------------------------------------------------
# append-KV
# ---------------------------------------------------------------------------


def _gen_appendkv(arch: str, receipt: int, masks, culls: _Culls, opts) -> List[FmhaKernelSpec]:
    factory = F.factory("fwd_appendkv", arch)
    out: List[FmhaKernelSpec] = []
    if factory is None:
        culls.cull("CK has no append-KV factory for this arch", lambda: arch)
        return out
    for dtype in F.FWD_DTYPE_ORDER:
        table = F.APPENDKV_TILES.get(dtype)
        if not table:
            continue
        if dtype in ("fp16", "bf16"):
            pipes = []
            for pagedkv in _TF:
                for pad, rope in (("ftff", "no"), ("tttt", "no"), ("fttf", "inter"),
                                  ("tttt", "inter"), ("fttf", "half"), ("tttt", "half")):
                    pipes.append((_pads(pad), rope, pagedkv))
        else:
            pipes = [(_pads("tttt"), "no", False)]
        for hdim, tile in table.items():
            for (sp, skp, dp, dvp), rope, pagedkv in pipes:
                why = None
                if receipt in (2, 4) and dtype not in ("fp16", "bf16"):
                    why = "receipt: flash/pytorch need fp16/bf16"
                elif receipt in (800, 801) and dtype != "fp32":
                    why = "receipt: 800/801 are fp32 only"
                if why:
                    culls.cull(why, lambda: f"{dtype} d{hdim} rope={rope} paged={pagedkv}")
                    continue
                out.append(FmhaKernelSpec(
                    family="fwd_appendkv", arch=arch, dtype=dtype, hdim_q=hdim, hdim_v=tile[3],
                    pipeline="appendkv", tile=tile[:4], occupancy=tile[4], vlayout="row",
                    spad=sp, skpad=skp, dpad=int(dp), dvpad=int(dvp), rope=rope, pagedkv=pagedkv,
                ))
    return out


# ---------------------------------------------------------------------------
# batch prefill (newest CK; gfx9 only, group mode only)
# ---------------------------------------------------------------------------


def _batch_prefill_receipt(receipt: int, dtype: str, mode: str, bias: str, qscale: str) -> Optional[str]:
    fp16 = dtype in ("fp16", "bf16")
    if receipt in (2, 3):
        if not fp16 or bias not in ("no", "alibi") or qscale != "no":
            return "receipt: flash needs fp16/bf16, bias no/alibi, no qscale"
    elif receipt == 4:
        if not fp16 or bias not in ("no", "bias") or qscale != "no":
            return "receipt: pytorch needs fp16/bf16, bias no/bias, no qscale"
    elif receipt == 100:
        if not fp16 or mode != "batch" or qscale != "no":
            return "receipt: aiter batch needs fp16/bf16 and batch mode (batch prefill is group-only)"
    elif receipt == 200:
        if dtype not in ("fp16", "bf16", "fp8bf16") or mode != "group":
            return "receipt: aiter group needs fp16/bf16/fp8bf16, group mode"
    elif receipt == 600:
        if dtype not in ("fp16", "bf16", "fp8bf16") or mode != "group" or qscale != "no":
            return "receipt: aiter cpp needs fp16/bf16/fp8bf16, group mode, no qscale"
    if receipt in (800, 801) and dtype != "fp32":
        return "receipt: 800/801 are fp32 only"
    return None


def _gen_batch_prefill(arch: str, receipt: int, masks, culls: _Culls, opts) -> List[FmhaKernelSpec]:
    factory = F.factory("batch_prefill", arch)
    out: List[FmhaKernelSpec] = []
    if factory is None:
        culls.cull("batch prefill is gfx9-only in CK", lambda: arch)
        return out
    with_64bit = opts.get("batch_prefill_64bit", True)
    for dtype in F.FWD_DTYPE_ORDER:
        table = F.BATCH_PREFILL_TILES.get(dtype)
        if not table:
            continue
        pipes = []
        if dtype in ("fp16", "bf16"):
            for logits, mask, bias, lse, dropout, sink, kvl, kvt in itertools.product(
                    _TF, masks, F.BIASES, _TF, _TF, _TF, F.KV_LAYOUTS, F.KV_LOOKUPS):
                pipes.append((logits, bias, lse, dropout, "no", mask, sink, kvl, kvt))
        else:  # fp8bf16: no lse/dropout/sink kernels
            for logits, qscale, mask, bias, kvl, kvt in itertools.product(
                    _TF, F.BATCH_PREFILL_FP8_QSCALES, masks, ("no",), F.KV_LAYOUTS, F.KV_LOOKUPS):
                pipes.append((logits, bias, False, False, qscale, mask, False, kvl, kvt))
        for (hdim, tiles), mode in itertools.product(table.items(), F.MODES):
            if mode != "group":
                culls.cull("batch prefill is group mode only", lambda: f"{dtype} d{hdim} {mode}")
                continue
            for tile, (logits, bias, lse, dropout, qscale, mask, sink, kvl, kvt) in itertools.product(tiles, pipes):
                if logits and bias != "no":
                    culls.cull("logits soft-cap needs no bias", lambda: f"{dtype} d{hdim} {bias}")
                    continue
                bn0 = tile[1]
                for page in F.PAGE_SIZES:
                    if page == 1 and kvl != "linear":
                        why = "page size 1 needs the linear KV layout"
                    elif qscale == "kv_blockscale" and page < bn0:
                        why = "kv_blockscale needs page size >= bn0"
                    else:
                        why = _batch_prefill_receipt(receipt, dtype, mode, bias, qscale)
                    if why:
                        culls.cull(why, lambda: f"{dtype} d{hdim} ps{page} {kvl} {kvt} {qscale} {bias}")
                        continue
                    variants = (False, True) if (with_64bit and page < bn0) else (False,)
                    for wide in variants:
                        out.append(FmhaKernelSpec(
                            family="batch_prefill", arch=arch, dtype=dtype, mode=mode, hdim_q=hdim,
                            hdim_v=tile[3], pipeline="qr_async", tile=tile[:6], warps=tile[6:12],
                            warp_tile=tile[12:18], occupancy=tile[18], vlayout="row", spad=True,
                            skpad=True, dpad=1, dvpad=1, logits=logits, mask=mask, bias=bias,
                            lse=lse, dropout=dropout, qscale=qscale, sink=sink, page_size=page,
                            kv_layout=kvl, kv_lookup=kvt, load_64bit=wide,
                        ))
    return out
