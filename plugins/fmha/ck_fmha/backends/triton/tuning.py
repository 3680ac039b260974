"""The tuned Triton FMHA configurations of an arch: ``ck_fmha/tuned/<arch>.json`` (with
provenance), read through ``ck_core.tuned_data`` and overlaid by the user's store; an arch without a
table of its own takes generic.json's.  Every reader takes the arch name the caller got from the
Dispatcher (or ``ck_core.device.current_arch``): no arch is assumed here.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Dict, Tuple

from ck_core.tuned_data import Table, table

from .configs import VARIANTS, TritonFmhaConfig, next_pow2, padded_hdim, valid_dchunk
from .gluon_fwd import HDIMS as GLUON_HDIMS

TUNED_DIR = str(Path(__file__).resolve().parent.parent.parent / "tuned")
#: seqlen buckets of the per-(hdim, causal, seqlen) tables
SEQ_BUCKETS = (512, 1024, 4096, 16384)


def tuned(name: str, arch: str) -> Table:
    """Table ``name`` of ``arch``'s tuned data, else of the generic data (empty when neither has it);
    its entries checked (:data:`CHECKS`) once per load, so a bad user override is refused by name."""
    check = CHECKS.get(name)
    t = table("fmha", arch, name, TUNED_DIR, check=check)
    return t if len(t) or arch == "generic" else table("fmha", "generic", name, TUNED_DIR, check=check)


# -- the records of each table, checked where they are read ------------------------------------

_FIELDS = frozenset(TritonFmhaConfig.__dataclass_fields__)


def _int(v, what: str, lo: int, hi: int, pow2: bool = False) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi or (pow2 and v & (v - 1)):
        raise ValueError(f"{what} {v!r:.40} is not {'a power of two' if pow2 else 'an integer'} in {lo}..{hi}")
    return v


#: the backward's dK/dV kernel also comes as ``kvsplit`` (keys.KVSPLIT: two programs per key block)
BWD_VARIANTS = VARIANTS + ("kvsplit",)


def check_config(v, variants=VARIANTS) -> None:
    """A TritonFmhaConfig record: known fields, power-of-two tiles, sane warps / stages, a known variant."""
    if not isinstance(v, dict):
        raise ValueError(f"a configuration is an object of {', '.join(sorted(_FIELDS))}, not {type(v).__name__}")
    unknown = sorted(str(k)[:30] for k in v if k not in _FIELDS)
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}")
    for f in ("BLOCK_M", "BLOCK_N"):
        _int(v.get(f, 16), f, 16, 512, pow2=True)
    _int(v.get("num_warps", 4), "num_warps", 1, 32)
    _int(v.get("num_stages", 1), "num_stages", 1, 8)
    if v.get("variant", "ptr") not in variants:
        raise ValueError(f"variant {v.get('variant')!r:.40} is not one of {', '.join(variants)}")
    if not valid_dchunk(_int(v.get("DCHUNK", 0), "DCHUNK", 0, 256)):
        raise ValueError(f"DCHUNK {v['DCHUNK']} is not 0 or a power of two in 16..256")
    _int(v.get("GSPLIT", 0), "GSPLIT", 0, 1024)


def _check_hdim_key(key) -> None:
    _int(key[0], "head dim", 1, 1024)
    for k in key[1:2]:
        if not isinstance(k, bool):
            raise ValueError(f"causal {k!r:.20} is not true/false")
    for k in key[2:3]:
        if k not in SEQ_BUCKETS:
            raise ValueError(f"seqlen bucket {k!r:.20} is not one of {SEQ_BUCKETS}")


def _check_fwd(key, v) -> None:
    _check_hdim_key(key)
    check_config(v)


def _check_bwd(key, v) -> None:
    _check_hdim_key(key)
    if not isinstance(v, dict) or set(v) != {"dkdv", "dq"}:
        raise ValueError("a backward entry is {\"dkdv\": config, \"dq\": config}")
    check_config(v["dkdv"], BWD_VARIANTS)
    check_config(v["dq"], BWD_VARIANTS)


def _check_tile(key, v) -> None:
    _check_hdim_key(key)
    if not isinstance(v, dict) or set(v) != {"BLOCK", "STAGES", "persistent"}:
        raise ValueError("a Gluon tile is {\"BLOCK\": n, \"STAGES\": n, \"persistent\": bool}")
    _int(v["BLOCK"], "BLOCK", 16, 256, pow2=True)
    _int(v["STAGES"], "STAGES", 1, 8)
    if not isinstance(v["persistent"], bool):
        raise ValueError("persistent is not true/false")


def _check_gsplit(key, v) -> None:
    if not isinstance(v, dict) or not set(v) <= {"waves", "min_rows", "gluon_waves"}:
        raise ValueError("a group-split rule is {\"waves\": n, \"min_rows\": n, \"gluon_waves\": n}")
    for f, x in v.items():
        _int(x, f, 0, 1 << 30)


#: table name -> the check of its entries
CHECKS = {**dict.fromkeys(("fwd_defaults", "fwd_dchunk", "fwd_tuned", "fwd_gluon", "fwd_fp8", "splitkv_defaults"),
                          _check_fwd),
          **dict.fromkeys(("bwd_tuned", "bwd_defaults"), _check_bwd),
          **dict.fromkeys(("bwd_gluon_dq", "bwd_gluon_dkdv", "bwd_gluon_fused", "gluon_dq_tiles", "gluon_dkdv_tiles",
                           "gluon_fused_tiles"), _check_tile),
          "bwd_gsplit": _check_gsplit}


def _cfg(v) -> "TritonFmhaConfig":
    return TritonFmhaConfig(**v)


@functools.lru_cache(maxsize=512)
def _cfg_at(t: Table, key):
    """The config at ``key`` of table ``t`` (None: no entry); built once per loaded table."""
    v = t.get(key)
    return None if v is None else _cfg(v)


@functools.lru_cache(maxsize=512)
def _bwd_at(t: Table, key):
    v = t.get(key)
    return None if v is None else (_cfg(v["dkdv"]), _cfg(v["dq"]))


def _tile(v) -> Tuple[int, int, bool]:
    return (int(v["BLOCK"]), int(v["STAGES"]), bool(v["persistent"]))


def _seq_bucket(s: int) -> int:
    for b in SEQ_BUCKETS[:-1]:
        if s <= b:
            return b
    return SEQ_BUCKETS[-1]


def gluon_fwd_configs(hdim: int, arch: str):
    """The distinct Gluon configurations of ``arch``'s ``fwd_gluon`` table for one head dim."""
    out = []
    for (d, _, _), c in tuned("fwd_gluon", arch).items():
        if d == hdim and _cfg(c) not in out:
            out.append(_cfg(c))
    return out


def tile_table(name: str, arch: str) -> Dict[int, Tuple[int, int, bool]]:
    """A per-head-dim table of Gluon backward tiles: head dim -> (BLOCK, STAGES, persistent)."""
    return {k[0]: _tile(v) for k, v in tuned(name, arch).items()}


def gluon_dq_tile(hdim: int, arch: str):
    """(BLOCK_N, STAGES, persistent) of the Gluon dQ pass where it beat the Triton dQ kernel, or None."""
    v = tuned("bwd_gluon_dq", arch).get(hdim)
    return None if v is None else _tile(v)


def gluon_dkdv_tile(hdim: int, causal: bool, arch: str):
    """(BLOCK_MQ, STAGES, persistent) of the Gluon dK/dV kernel where it beat the Triton one, or None."""
    v = tuned("bwd_gluon_dkdv", arch).get((hdim, bool(causal)))
    return None if v is None else _tile(v)


def gluon_fused_tile(hdim: int, causal: bool, arch: str):
    """Tile of the Gluon dK/dV kernel with dQ fused in (``deterministic=False``) where it won, or None;
    it applies from seqlen_k >= :func:`gluon_fused_min_seqlen`."""
    v = tuned("bwd_gluon_fused", arch).get((hdim, bool(causal)))
    return None if v is None else _tile(v)


def gluon_fused_min_seqlen(arch: str) -> int:
    return int(tuned("bwd_gluon_fused", arch).meta.get("min_seqlen_k", 1 << 62))


def fwd_dchunk(hdim_q: int, hdim_v: int, arch: str) -> int:
    """The head-dim chunk of ``arch``'s fp16/bf16 Triton forward for these head dims (table ``fwd_dchunk``,
    keyed by (larger head dim, causal, seqlen bucket), its configurations' ``DCHUNK``; 0: one tile padded to
    the next power of two): a head dim above the chunk runs as two power-of-two tiles
    (``configs.hdim_blocks``), e.g. 160 as 128 + 32."""
    return _dchunk_of(tuned("fwd_dchunk", arch), max(hdim_q, hdim_v))


@functools.lru_cache(maxsize=256)
def _dchunk_of(t: Table, d: int) -> int:
    for k, v in t.items():
        if k[0] == d and v.get("DCHUNK"):
            return int(v["DCHUNK"])
    return 0


def default_fwd_config(hdim_q: int, hdim_v: int, arch: str, causal: bool = False,
                       seqlen: int = 4096, fp8: bool = False, gluon: bool = True) -> TritonFmhaConfig:
    """The tuned forward configuration of ``arch``.  ``gluon``: fp16/bf16 with head dims 64/64 or
    128/128 take the arch's ``fwd_gluon`` table first, where it has one (``ops.fwd`` falls back to
    ``gluon=False`` for problems the Gluon kernel cannot run); False: the Triton kernel's choice only.
    fp16/bf16 head dims that ``fwd_dchunk`` splits take its tile for (head dim, causal, seqlen bucket), else
    the padded head dim's, with the chunk (``DCHUNK``) in the configuration."""
    chunk = 0 if fp8 else fwd_dchunk(hdim_q, hdim_v, arch)
    if chunk:
        exact = _cfg_at(tuned("fwd_dchunk", arch), (max(hdim_q, hdim_v), bool(causal), _seq_bucket(seqlen)))
        cfg = exact or _fwd_config(hdim_q, hdim_v, arch, causal, seqlen, False, gluon)
        if cfg.variant not in ("ptr", "tma"):
            cfg = cfg.with_(variant="tma" if cfg.variant.startswith("tma") else "ptr")
        return cfg.with_(DCHUNK=chunk)
    return _fwd_config(hdim_q, hdim_v, arch, causal, seqlen, fp8, gluon)


def _fwd_config(hdim_q, hdim_v, arch, causal, seqlen, fp8, gluon) -> TritonFmhaConfig:
    d = padded_hdim(max(hdim_q, hdim_v))
    if fp8:
        cfg = _cfg_at(tuned("fwd_fp8", arch), (d,))
        if cfg is not None:
            return cfg
    if gluon and not fp8 and hdim_q == hdim_v and hdim_q in GLUON_HDIMS:  # where the arch has a Gluon table
        cfg = _cfg_at(tuned("fwd_gluon", arch), (d, bool(causal), _seq_bucket(seqlen)))
        if cfg is not None:
            return cfg
    cfg = _cfg_at(tuned("fwd_tuned", arch), (min(d, 256), bool(causal), _seq_bucket(seqlen)))
    if cfg is not None:
        return cfg
    return _cfg_at(tuned("fwd_defaults", arch), (min(d, 256),))


def bwd_gsplit_rule(arch: str) -> dict:
    """When the Triton dK/dV kernel splits a GQA group over programs (``heuristics.group_split``; table
    ``bwd_gsplit``, entry ``triton``: ``waves``, ``min_rows``, ``gluon_waves``); empty: never (not measured)."""
    v = tuned("bwd_gsplit", arch).get(("triton",))
    return dict(v) if v else {}


def default_bwd_configs(hdim_q: int, hdim_v: int, arch: str, causal: bool = False):
    """(dK/dV config, dQ config) of the backward: the measured winner, else the head dim's default."""
    d = padded_hdim(max(hdim_q, hdim_v))
    return (_bwd_at(tuned("bwd_tuned", arch), (max(hdim_q, hdim_v), bool(causal)))
            or _bwd_at(tuned("bwd_tuned", arch), (d, bool(causal)))
            or _bwd_at(tuned("bwd_defaults", arch), (min(d, 256),)))


def default_splitkv_config(hdim_q: int, hdim_v: int, rows: int, arch: str) -> TritonFmhaConfig:
    d = padded_hdim(max(hdim_q, hdim_v))
    cfg = _cfg(tuned("splitkv_defaults", arch)[min(d, 256)])
    bm = max(16, next_pow2(rows))
    if bm > 16:
        bm = min(bm, 64)
        cfg = cfg.with_(BLOCK_M=bm, BLOCK_N=min(cfg.BLOCK_N, 64))
    return cfg
