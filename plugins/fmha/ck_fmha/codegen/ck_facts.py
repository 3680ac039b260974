"""CK's FMHA code-generation facts, as plain data.

Everything here is a fact taken from CK Tile's ``example/ck_tile/01_fmha/codegen``
(tile tables, dtype lists, feature axes, receipt numbers, name tokens).  The
rules that combine these facts live in :mod:`.enumerate`; this module holds no
logic beyond small lookups, so a reader can check a table against CK line by
line.

Which CK revision each family follows:

* ``fwd``, ``bwd_*``: composable_kernel commit 494d7a63 (the oracle list).
* ``fwd_splitkv``, ``fwd_splitkv_combine``, ``fwd_pagedkv``, ``batch_prefill``:
  the newest CK (``projects/composablekernel`` in ROCm/rocm-libraries):
  sink switch on split-KV / paged-KV, ``qr_nwarp_sshuffle`` on multi-N-warp
  tiles, page sizes 1/16/1024, vectorized/linear KV layouts, vLLM/SGLang lookup
  tables, group mode only, 64-bit-load variants.
* ``fwd_appendkv``: unchanged since the oracle's CK.

Tile tuples
-----------
* fwd-like (fwd, split-KV, paged-KV, batch prefill), 19 ints:
  ``bm0, bn0, bk0, bn1, bk1, bk0max, rm0, rn0, rk0, rm1, rn1, rk1,
  wm0, wn0, wk0, wm1, wn1, wk1, occupancy``
* bwd dq/dk/dv, 26 ints: ``bm0, bn0, bk0, bk1, bk2, bk3, bk4, bhdq, bhdv,
  rm0, rn0, rk0, rm1, rn1, rk1, rm2, rn2, rk2, wm0, wn0, wk0, wm1, wn1, wk1,
  occupancy, max_seq_q``
* append-KV, 5 ints: ``bs, bsk, bd, bdv, occupancy``
"""
from __future__ import annotations

from typing import Dict, List, Tuple

# ---------------------------------------------------------------------------
# Public vocabularies
# ---------------------------------------------------------------------------

ARCHES: Tuple[str, ...] = ("gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1201")

FAMILIES: Tuple[str, ...] = (
    "fwd",
    "fwd_splitkv",
    "fwd_splitkv_combine",
    "fwd_pagedkv",
    "fwd_appendkv",
    "batch_prefill",
    "bwd_dot_do_o",
    "bwd_dq_dk_dv",
    "bwd_convert_dq",
)

# Receipt number -> profile name (CK's receipts; names follow the dispatcher's).
RECEIPTS: Dict[int, str] = {
    0: "ck_default",
    1: "ck_extended",
    2: "flash_fwd",
    3: "flash_bwd",
    4: "pytorch",
    100: "aiter_batch",
    200: "aiter_group",
    300: "aiter_bwd_batch",
    400: "aiter_bwd_group",
    600: "aiter_cpp",
    800: "fp32_all",
    801: "fp32_min",
    888: "fp8_test",
}

MASK_IMPLS: Tuple[str, ...] = ("generic", "simplified")
MASKS: Dict[str, Tuple[str, ...]] = {
    "generic": ("no", "causal", "generic"),
    "simplified": ("s_no", "s_mask"),
}
BIASES: Tuple[str, ...] = ("no", "bias", "alibi")
MODES: Tuple[str, ...] = ("batch", "group")

# Every dtype token that appears in a kernel name.
DTYPES: Tuple[str, ...] = ("fp32", "fp16", "bf16", "fp8", "fp8bf16", "fp8fp32", "bf8")

# CK's FWD_DTYPE_MAP key order (split-KV / paged-KV / append-KV walk it).
FWD_DTYPE_ORDER: Tuple[str, ...] = (
    "fp32", "fp16", "bf16", "fp8", "fp8fp16", "fp8bf16", "fp8fp32",
)
# CK's BWD_DTYPE_MAP key order.
BWD_DTYPE_ORDER: Tuple[str, ...] = ("fp32", "fp16", "bf16")

# ---------------------------------------------------------------------------
# Factory selection: CK picks a "kernel component factory" per target; its
# name is also the kernel-name suffix (``_gfx9`` covers gfx90a and gfx942).
# The tables below are keyed by factory, not by arch.
# ---------------------------------------------------------------------------

# Which factory each family uses on an arch, and which pipelines CK instantiates there, are the
# arch's facts: ``ArchSpec.extras["fmha"]["ck_codegen"]`` of its arch plugin (``factories``:
# family -> factory, a missing family has no CK kernels there; ``pipelines``).  An arch whose
# plugin is not installed has no CK kernels.


def arch_codegen(arch: str) -> Dict[str, object]:
    """``extras["fmha"]["ck_codegen"]`` of the installed arch plugin ``arch`` (empty: none)."""
    got = _CODEGEN.get(arch)
    if got is None:
        from ck_core.plugins import get_manager

        spec = get_manager().archs().get(arch)
        got = _CODEGEN[arch] = dict(((spec.extras or {}).get("fmha") or {}).get("ck_codegen") or {}) \
            if spec is not None else {}
    return got


_CODEGEN: Dict[str, Dict[str, object]] = {}


def factory(family: str, arch: str):
    """CK's kernel-component factory (the kernel-name suffix) of ``family`` on ``arch``; None: CK
    has no factory for that target (the family yields nothing there)."""
    return arch_codegen(arch).get("factories", {}).get(family)


def arch_pipelines(arch: str) -> Tuple[str, ...]:
    """The pipelines CK instantiates on ``arch`` (any family)."""
    return tuple(arch_codegen(arch).get("pipelines", ()))


NO_SUFFIX_FAMILIES = frozenset({"batch_prefill"})

# ---------------------------------------------------------------------------
# fwd (CK 494d7a63, codegen/ops/fmha_fwd.py)
# ---------------------------------------------------------------------------

_W16 = (16, 16, 16, 16, 16, 16)
_W32_16 = (32, 32, 16, 32, 32, 16)
_W32_32 = (32, 32, 32, 32, 32, 32)


def _t(bm0, bn0, bk0, bn1, bk1, bk0max, warps, wtile, occ=-1):
    """One fwd-like tile: block dims + (rm0, rm1 with rn=rk=1 unless given) + warp tile."""
    if len(warps) == 2:
        warps = (warps[0], 1, 1, warps[1], 1, 1)
    return (bm0, bn0, bk0, bn1, bk1, bk0max) + tuple(warps) + tuple(wtile) + (occ,)


FWD_DTYPES: Dict[str, Tuple[str, ...]] = {
    "gfx9": ("fp32", "fp16", "bf16", "fp8", "fp8bf16", "fp8fp32"),
    "gfx950": ("fp32", "fp16", "bf16", "fp8", "fp8bf16", "fp8fp32"),
    "gfx11": ("fp16", "bf16"),
    "gfx12": ("fp16", "bf16", "fp8", "fp8bf16", "fp8fp32"),
}

_FWD_GFX9_FP32 = {
    (32, 32): [_t(64, 64, 16, 32, 32, 32, (4, 4), _W16)],
    (48, 48): [_t(32, 128, 16, 48, 16, 48, (2, 2), _W16),
               _t(128, 64, 16, 48, 32, 48, (4, 4), _W16)],
    (64, 64): [_t(64, 64, 32, 64, 32, 64, (4, 4), _W16)],
    (96, 128): [_t(128, 64, 32, 128, 32, 96, (4, 4), _W16)],
    (128, 128): [_t(32, 128, 32, 128, 16, 128, (2, 2), _W16),
                 _t(128, 64, 32, 128, 32, 128, (4, 4), _W16)],
    (192, 192): [_t(64, 64, 32, 192, 32, 192, (4, 4), _W16)],
    (256, 256): [_t(64, 64, 32, 256, 32, 256, (4, 4), _W16)],
}
_FWD_GFX9_FP16 = {
    (32, 32): [_t(128, 64, 16, 32, 32, 32, (4, 4), _W32_16)],
    (64, 64): [_t(16, 32, 64, 64, 32, 64, (1, 1), (16, 16, 32, 16, 16, 32)),
               _t(32, 32, 64, 64, 32, 64, (1, 1), _W32_16),
               _t(128, 64, 32, 64, 32, 64, (4, 4), _W32_16)],
    (80, 96): [_t(128, 128, 16, 96, 32, 80, (4, 4), _W32_16)],
    (96, 128): [_t(128, 128, 32, 128, 32, 96, (4, 4), _W32_16)],
    (128, 128): [_t(16, 32, 64, 128, 32, 128, (1, 1), (16, 16, 32, 16, 16, 32)),
                 _t(32, 32, 128, 128, 32, 128, (1, 1), _W32_16),
                 _t(64, 128, 32, 128, 32, 128, (4, 4), (16, 16, 32, 16, 16, 16)),
                 _t(128, 64, 32, 128, 16, 128, (4, 4), _W32_16),
                 _t(128, 128, 32, 128, 32, 128, (4, 4), _W32_16)],
    (192, 128): [_t(128, 128, 32, 128, 32, 192, (4, 4), _W32_16)],
    (192, 192): [_t(128, 128, 32, 192, 32, 192, (4, 4), _W32_16, 1)],
    (256, 256): [_t(128, 128, 32, 256, 32, 256, (4, 4), _W32_16)],
}
_FWD_GFX9_FP8 = {
    (64, 64): [_t(128, 64, 32, 64, 32, 64, (2, 2), _W32_32)],
    (128, 128): [_t(128, 128, 32, 128, 32, 128, (4, 4), _W32_32)],
    (192, 128): [_t(128, 128, 32, 128, 32, 192, (4, 4), _W32_32)],
    (256, 256): [_t(128, 128, 32, 256, 32, 256, (4, 4), _W32_32)],
}
_FWD_GFX9_FP8FP32 = {
    (128, 128): [_t(128, 128, 32, 128, 32, 128, (4, 4), _W32_32)],
}
# gfx950 adds the 8-warp tile that only qr_async_trload_v3 uses
_FWD_GFX950_FP16 = {k: list(v) for k, v in _FWD_GFX9_FP16.items()}
_FWD_GFX950_FP16[(128, 128)] = _FWD_GFX950_FP16[(128, 128)] + [
    _t(256, 32, 128, 128, 32, 128, (8, 8), _W32_16)]

_FWD_GFX11_FP16 = {
    (32, 32): [_t(64, 64, 16, 32, 32, 32, (4, 4), _W16)],
    (64, 64): [_t(64, 64, 32, 64, 32, 64, (4, 4), _W16)],
    (128, 128): [_t(64, 64, 32, 128, 32, 128, (4, 4), _W16)],
    (192, 128): [_t(64, 64, 32, 128, 32, 256, (4, 4), _W16)],
    (256, 256): [_t(64, 64, 32, 256, 32, 256, (4, 4), _W16)],
}
_FWD_GFX12_FP8 = {
    (64, 64): [_t(128, 64, 32, 64, 32, 64, (4, 4), _W16)],
    (128, 128): [_t(64, 64, 32, 128, 32, 128, (4, 4), _W16)],
    (256, 256): [_t(64, 32, 32, 256, 32, 256, (4, 4), _W16)],
}
_FWD_GFX12_FP8FP32 = {
    (128, 128): [_t(64, 64, 32, 128, 32, 128, (4, 4), _W16)],
}

# factory -> dtype -> {(hdim_q, hdim_v): [tile, ...]} (tiles ordered by bm0)
FWD_TILES: Dict[str, Dict[str, Dict[Tuple[int, int], List[tuple]]]] = {
    "gfx9": {
        "fp32": _FWD_GFX9_FP32, "fp16": _FWD_GFX9_FP16, "bf16": _FWD_GFX9_FP16,
        "fp8": _FWD_GFX9_FP8, "fp8bf16": _FWD_GFX9_FP8, "fp8fp32": _FWD_GFX9_FP8FP32,
    },
    "gfx950": {
        "fp32": _FWD_GFX9_FP32, "fp16": _FWD_GFX950_FP16, "bf16": _FWD_GFX950_FP16,
        "fp8": _FWD_GFX9_FP8, "fp8bf16": _FWD_GFX9_FP8, "fp8fp32": _FWD_GFX9_FP8FP32,
    },
    "gfx11": {"fp16": _FWD_GFX11_FP16, "bf16": _FWD_GFX11_FP16},
    "gfx12": {
        "fp16": _FWD_GFX11_FP16, "bf16": _FWD_GFX11_FP16,
        "fp8": _FWD_GFX12_FP8, "fp8bf16": _FWD_GFX12_FP8, "fp8fp32": _FWD_GFX12_FP8FP32,
    },
}

# gfx9 tile/hdim rule only looks at these pipelines (CK binds the gfx9 set
# even inside the gfx950 factory, so trload/v3 bypass it).
FWD_GFX9_RULE_PIPELINES = frozenset({"qr", "qr_async", "qs"})
FWD_TRLOAD_HDIMS = frozenset({(64, 64), (128, 128)})
FWD_V3_HDIMS = frozenset({(128, 128)})
FWD_V3_MASKS = ("no", "causal")
FWD_FP8_QSCALES = ("no", "pertensor", "blockscale")

# ---------------------------------------------------------------------------
# bwd (CK 494d7a63, codegen/ops/fmha_bwd.py)
# ---------------------------------------------------------------------------


def _bt(bm0, bn0, bk0, bk1, bk2, bk3, bk4, bhdq, bhdv, warps, wtile, occ, maxq=0):
    return (bm0, bn0, bk0, bk1, bk2, bk3, bk4, bhdq, bhdv) + tuple(warps) + tuple(wtile) + (occ, maxq)


_R_22 = (1, 4, 1, 4, 1, 1, 2, 2, 1)
_R_14 = (1, 4, 1, 4, 1, 1, 1, 4, 1)
_R_11 = (1, 1, 1, 1, 1, 1, 1, 1, 1)
_BW_16_32 = (16, 16, 32, 16, 16, 16)
_BW_16_32_32 = (16, 16, 32, 16, 16, 32)

# factory -> dtype -> trload("t"/"f") -> [tile, ...]
BWD_TILES: Dict[str, Dict[str, Dict[bool, List[tuple]]]] = {}
_BWD_GFX9 = {
    "fp32": {False: [
        _bt(32, 128, 32, 32, 32, 32, 64, 32, 32, _R_22, _W16, 1),
        _bt(16, 64, 64, 16, 64, 16, 16, 64, 64, _R_14, _W16, 1),
        _bt(16, 64, 128, 16, 128, 16, 16, 128, 128, _R_14, _W16, 1),
    ], True: []},
    "fp16": {False: [
        _bt(32, 128, 32, 32, 32, 32, 64, 32, 32, _R_22, _BW_16_32, 1),
        _bt(32, 128, 64, 32, 64, 32, 32, 64, 64, _R_14, _BW_16_32, 1),
        _bt(32, 128, 96, 32, 96, 32, 32, 96, 96, _R_22, _BW_16_32, 1),
        _bt(16, 128, 128, 16, 128, 16, 32, 128, 128, _R_14, _BW_16_32, 1),
        _bt(16, 64, 256, 16, 256, 16, 32, 256, 256, _R_14, _BW_16_32, 1),
    ], True: []},
}
_BWD_GFX9["bf16"] = _BWD_GFX9["fp16"]
_BWD_GFX950_TRLOAD = [
    _bt(32, 256, 64, 32, 64, 32, 32, 64, 64, _R_14, _BW_16_32_32, 1),
    _bt(32, 128, 128, 32, 128, 32, 32, 128, 128, _R_14, _BW_16_32_32, 1),
    _bt(16, 192, 128, 16, 128, 16, 32, 128, 128, _R_14, _BW_16_32, 1),
    _bt(32, 16, 64, 32, 64, 32, 16, 64, 64, _R_11, _BW_16_32, 2, 32),
    _bt(16, 16, 128, 16, 128, 16, 16, 128, 128, _R_11, _BW_16_32, 2, 16),
]
_BWD_GFX950 = {
    "fp32": _BWD_GFX9["fp32"],
    "fp16": {False: _BWD_GFX9["fp16"][False], True: _BWD_GFX950_TRLOAD},
}
_BWD_GFX950["bf16"] = _BWD_GFX950["fp16"]
_BWD_GFX11_FP16 = {False: [
    _bt(32, 64, 32, 32, 32, 32, 64, 32, 32, _R_22, _W16, -1),
    _bt(32, 64, 64, 32, 64, 32, 32, 64, 64, _R_22, _W16, -1),
    _bt(16, 64, 128, 16, 128, 16, 32, 128, 128, _R_14, _W16, -1),
    _bt(16, 64, 256, 16, 256, 16, 32, 256, 256, _R_14, _W16, -1),
], True: []}
_BWD_GFX12_FP16 = {False: [
    _bt(32, 64, 32, 32, 32, 32, 64, 32, 32, _R_22, _W16, -1),
    _bt(32, 64, 64, 32, 64, 32, 32, 64, 64, _R_14, _W16, -1),
    _bt(16, 64, 128, 16, 128, 16, 32, 128, 128, _R_14, _W16, -1),
    _bt(16, 64, 256, 16, 256, 16, 32, 256, 256, _R_14, _W16, -1),
], True: []}
BWD_TILES["gfx9"] = _BWD_GFX9
BWD_TILES["gfx950"] = _BWD_GFX950
BWD_TILES["gfx11"] = {"fp16": _BWD_GFX11_FP16, "bf16": _BWD_GFX11_FP16}
BWD_TILES["gfx12"] = {"fp16": _BWD_GFX12_FP16, "bf16": _BWD_GFX12_FP16}

# DROPOUT_MAP keys in CK order; value = (has_dropout, variant token)
BWD_DROPOUTS: Tuple[str, ...] = (
    "no", "dropout_wg32", "dropout_wg32_storerandval",
    "dropout_wg16", "dropout_wg16_storerandval",
)
BWD_PAD_VALUES: Tuple[int, ...] = (0, 8, 1)
BWD_M0_1D = 64          # block size of the 1-D kernels (dot_do_o, convert_dq)
BWD_1D_OCCUPANCY = 2

# ---------------------------------------------------------------------------
# split-KV (newest CK, codegen/ops/fmha_fwd_splitkv.py)
# ---------------------------------------------------------------------------

SPLITKV_TILES: Dict[str, Dict[str, Dict[int, List[tuple]]]] = {
    "gfx9": {
        "fp16": {
            32: [_t(32, 64, 16, 32, 32, 32, (2, 2), _W16)],
            64: [_t(64, 64, 32, 64, 32, 64, (4, 4), _W16)],
            96: [_t(64, 128, 32, 128, 32, 96, (4, 4), _W16)],
            128: [_t(64, 128, 32, 128, 32, 128, (4, 4), _W16)],
            256: [_t(64, 128, 32, 256, 32, 256, (4, 4), _W16)],
        },
        "fp8": {
            64: [_t(128, 64, 32, 64, 32, 64, (2, 2), _W32_32)],
            128: [_t(128, 128, 32, 128, 32, 128, (4, 4), _W32_32)],
        },
    },
    "gfx11": {
        "fp16": {
            32: [_t(16, 64, 16, 32, 32, 32, (1, 2, 1, 1, 2, 1), _W16),
                 _t(64, 64, 16, 32, 32, 32, (4, 4), _W16)],
            64: [_t(16, 64, 32, 64, 32, 64, (1, 4, 1, 1, 4, 1), _W16),
                 _t(64, 64, 32, 64, 32, 64, (4, 4), _W16)],
            # the bn0=32 tile serves vLLM's 16-token pages (sub-tile paging)
            128: [_t(16, 64, 32, 128, 32, 128, (1, 4, 1, 1, 4, 1), _W16),
                  _t(64, 64, 32, 128, 32, 128, (4, 4), _W16),
                  _t(64, 32, 32, 128, 32, 128, (4, 4), _W16)],
            256: [_t(16, 64, 32, 256, 32, 256, (1, 4, 1, 1, 4, 1), _W16),
                  _t(64, 64, 32, 256, 32, 256, (4, 4), _W16)],
        },
    },
    "gfx12": {
        "fp16": {
            32: [_t(16, 64, 16, 32, 32, 32, (1, 2, 1, 1, 2, 1), _W16),
                 _t(64, 64, 16, 32, 32, 32, (4, 4), _W16)],
            64: [_t(16, 64, 32, 64, 32, 64, (1, 4, 1, 1, 4, 1), _W16),
                 _t(64, 64, 32, 64, 32, 64, (4, 4), _W16)],
            128: [_t(16, 128, 32, 128, 32, 128, (1, 8, 1, 1, 8, 1), _W16),
                  _t(64, 64, 32, 128, 32, 128, (4, 4), _W16)],
            256: [_t(16, 128, 32, 256, 32, 256, (1, 8, 1, 1, 8, 1), _W16),
                  _t(64, 64, 32, 256, 32, 256, (4, 4), _W16)],
        },
        "fp8": {
            64: [_t(128, 64, 32, 64, 32, 64, (4, 4), _W16)],
            128: [_t(64, 64, 32, 128, 32, 128, (4, 4), _W16)],
        },
    },
}
for _fac in SPLITKV_TILES.values():
    _fac["bf16"] = _fac["fp16"]

SPLITKV_COMBINE_BN1 = 32
SPLITKV_COMBINE_HDIMS: Dict[str, Tuple[int, ...]] = {
    "fp16": (32, 64, 96, 128, 256),
    "bf16": (32, 64, 96, 128, 256),
    "fp8": (64, 128, 256),
}

# ---------------------------------------------------------------------------
# paged-KV prefill (newest CK, codegen/ops/fmha_pagedkv_prefill.py)
# ---------------------------------------------------------------------------

PAGEDKV_TILES: Dict[str, Dict[str, Dict[int, List[tuple]]]] = {
    "gfx9": {
        "fp16": {128: [_t(128, 128, 32, 128, 32, 128, (4, 4), _W32_16)]},
        "fp8": {
            64: [_t(128, 64, 32, 64, 32, 64, (2, 2), _W32_32)],
            128: [_t(128, 128, 32, 128, 32, 128, (4, 4), _W32_32)],
            256: [_t(128, 128, 32, 256, 32, 256, (4, 4), _W32_32)],
        },
    },
    "gfx11": {
        "fp16": {128: [_t(64, 64, 32, 128, 32, 128, (4, 4), _W16)]},
    },
    "gfx12": {
        "fp16": {128: [_t(64, 64, 32, 128, 32, 128, (4, 4), _W16)]},
        "fp8": {
            64: [_t(128, 64, 32, 64, 32, 64, (4, 4), _W16)],
            128: [_t(64, 64, 32, 128, 32, 128, (4, 4), _W16)],
            256: [_t(64, 32, 32, 256, 32, 256, (4, 4), _W16)],
        },
    },
}
for _fac in PAGEDKV_TILES.values():
    _fac["bf16"] = _fac["fp16"]

# ---------------------------------------------------------------------------
# append-KV (codegen/ops/fmha_fwd_appendkv.py)
# ---------------------------------------------------------------------------

APPENDKV_TILES: Dict[str, Dict[int, tuple]] = {
    "fp16": {32: (64, 64, 32, 32, -1), 64: (64, 64, 64, 64, -1),
             128: (64, 64, 128, 128, -1), 256: (64, 64, 256, 256, -1)},
    "fp8": {64: (64, 64, 64, 64, -1), 128: (64, 64, 128, 128, -1),
            256: (64, 64, 256, 256, -1)},
}
APPENDKV_TILES["bf16"] = APPENDKV_TILES["fp16"]
ROPES: Tuple[str, ...] = ("no", "inter", "half")

# ---------------------------------------------------------------------------
# batch prefill (newest CK, codegen/ops/fmha_batch_prefill.py); gfx9 only
# ---------------------------------------------------------------------------

BATCH_PREFILL_TILES: Dict[str, Dict[int, List[tuple]]] = {
    # the 64x128 tile is CK's CustomFactory insert (always used by batch prefill)
    "fp16": {
        128: [_t(64, 128, 64, 128, 64, 128, (4, 4), _W16),
              _t(128, 128, 32, 128, 32, 128, (4, 4), _W32_16)],
        256: [_t(128, 128, 32, 256, 32, 256, (4, 4), _W32_16)],
    },
    "fp8bf16": {
        128: [_t(128, 128, 32, 128, 32, 128, (4, 4), _W32_32)],
        256: [_t(128, 128, 32, 256, 32, 256, (4, 4), _W32_32)],
    },
}
BATCH_PREFILL_TILES["bf16"] = BATCH_PREFILL_TILES["fp16"]
PAGE_SIZES: Tuple[int, ...] = (1, 16, 1024)
KV_LAYOUTS: Tuple[str, ...] = ("vectorized", "linear")
KV_LOOKUPS: Tuple[str, ...] = ("vllm", "sglang")
BATCH_PREFILL_FP8_QSCALES: Tuple[str, ...] = ("pertensor", "kv_blockscale")

# Token CK writes for a qscale value in fwd-style names.
QSCALES: Tuple[str, ...] = ("no", "pertensor", "blockscale", "kv_blockscale")
