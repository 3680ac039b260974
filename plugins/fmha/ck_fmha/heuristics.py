"""Heuristic choices the Dispatcher path makes for FMHA problems, and the plugin's one reader of
its tuned data.

:func:`split_count`: how many key splits a split-KV / paged decode problem gets.  The
count is a problem field, so it is part of the cached plan and of what ``ck_after_run``
reports; the launcher runs exactly that many splits.

The Triton keys' ranking (what was ck_fmha.heuristics):
Which Triton FMHA key the heuristic puts first: the tuned tables' choice, expressed as a key.

The tables (``ck_fmha/tuned/<arch>.json`` with provenance, read here through ``ck_core.tuned_data``
and overlaid by the user's store; an arch without a table of its own takes generic.json's; every
reader takes the arch name the caller got from the Dispatcher) name a tile per
head dim, right-bounded mask and sequence-length bucket; on Hopper also a Gluon forward, Gluon
backward tiles and the dQ pass.  The heuristic turns them into a preference list of keys; the
candidates are already filtered by ``supports()``, so a key that cannot run the problem (a Gluon
kernel out of its scope, a TMA form the problem's strides cannot address) is simply not there and
the next preference wins.  The launcher then runs exactly the first key.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Dict, Optional, Tuple

import attrs

from ck_core import knobs
from ck_core.dispatcher import size_bucket
from ck_core.tuned_data import Table, table

from . import seqtune
from .backends.triton.configs import (GLUON_BWD_BLOCK_N, GLUON_BWD_WARPS, GLUON_HDIMS, GSPLITS, KVSPLIT,
                                      VARIANTS, TritonFmhaConfig, fp8_v_trans, hopper as _hopper, next_pow2,
                                      padded_hdim, valid_dchunk)


def split_count(batch_heads: int, max_seqlen_k: int, compute_units: int, *, query_rows: int = 1,
                min_chunk: int = 256, max_splits: int = 128) -> int:
    """Splits of the key sequence so that about two waves of programs cover the machine's
    ``compute_units`` (from the ArchSpec), keeping at least ``min_chunk`` keys per split
    (a split's fixed cost -- its Q load and its combine row -- must stay small next to its
    keys).  ``query_rows``: query rows per KV head (GQA group x seqlen_q); every 64 of them
    add a program per split.  Where batch x KV heads x query tiles already fill every compute
    unit, the answer is 1: one launch (a one-split plan has no combine stage), since splitting
    would only add partial outputs and a combine pass to a machine that is already busy."""
    programs = max(1, batch_heads) * max(1, -(-int(query_rows) // 64))
    cus = max(1, int(compute_units))
    if programs >= cus:
        return 1
    want = -(-2 * cus // programs)
    cap = max(1, int(max_seqlen_k) // min_chunk)
    return max(1, min(want, cap, max_splits))


DQ_ATOMIC = "atomic"


def group_split(batch: int, nhead_q: int, nhead_k: int, seqlen_q: int, seqlen_k: int, block_n: int,
                compute_units: int, rule: dict, *, parts: int = 1, splits=(2, 4, 8, 16)) -> int:
    """How many programs share a kv head's GQA group in the Triton dK/dV kernel (1: one program sums the
    whole group).  ``rule`` is the arch's measured ``bwd_gsplit`` entry (``tuning.bwd_gsplit_rule``; empty:
    never split): the group is split over the next of ``splits`` while the key blocks' programs are under
    ``waves`` waves on the machine's ``compute_units`` (from the ArchSpec) and each program still walks at
    least ``min_rows`` query rows (``ceil(group / n) * seqlen_q``: short problems lose to the partial
    sums); at most the group size.  ``parts``: programs per key block already (2 for kvsplit)."""
    group = nhead_q // max(1, nhead_k)
    waves, min_rows = float(rule.get("waves", 0)), float(rule.get("min_rows", 0))
    if waves <= 0 or group <= 1:
        return 1
    programs = max(1, -(-int(seqlen_k) // block_n)) * max(1, batch) * max(1, nhead_k) * parts
    n = 1
    for cand in splits:
        if (cand > group or programs * n >= waves * max(1, int(compute_units))
                or -(-group // cand) * max(1, int(seqlen_q)) < min_rows):
            break
        n = cand
    return n


interpreting = knobs.interpreting   # (one reader of TRITON_INTERPRET, in the core)


def right_bounded(p) -> bool:
    """The tables' "causal" column: a mask with a right edge (the kernels' MASK_MODE bit 0)."""
    return p.mask != "none" and p.window_right is not None and p.window_right >= 0


# -- the dQ field of a backward key --------------------------------------------------------

def dq_triton(cfg) -> str:
    return f"m{cfg.BLOCK_M}n{cfg.BLOCK_N}w{cfg.num_warps}s{cfg.num_stages}"


def dq_gluon(tile) -> str:
    bn, stages, persistent = tile
    return f"gluon{bn}s{stages}" + ("p" if persistent else "")


def parse_dq(dq: str):
    """-> ("atomic",) | ("triton", TritonFmhaConfig) | ("gluon", (BLOCK_N, STAGES, persistent))."""
    import re

    if dq == DQ_ATOMIC:
        return (DQ_ATOMIC,)
    m = re.match(r"^m(\d+)n(\d+)w(\d+)s(\d+)$", dq)
    if m:
        return ("triton", TritonFmhaConfig(*(int(x) for x in m.groups()), "ptr"))
    m = re.match(r"^gluon(\d+)s(\d+)(p?)$", dq)
    if m:
        return ("gluon", (int(m[1]), int(m[2]), m[3] == "p"))
    raise ValueError(f"dq field {dq!r} is not 'atomic', 'm<BM>n<BN>w<W>s<S>' or 'gluon<BN>s<S>[p]'")


# -- scope of the Gluon backward kernels (problem-level; the API hands them contiguous tensors) ----

def gluon_bwd_reason(p, block_n: int = 64) -> Optional[str]:
    """Why the Gluon backward kernels (dQ pass, dK/dV) cannot run ``p`` (None when they can)."""
    if p.is_group:
        return "group mode"
    if p.dtype not in ("fp16", "bf16"):
        return f"dtype {p.dtype}"
    if p.hdim_q != p.hdim_v or p.hdim_q not in (64, 128):
        return f"head dims {p.hdim_q}/{p.hdim_v} (64 or 128, q = v)"
    if (p.mask != "none" and not p.is_causal) or p.logits_soft_cap > 0 or p.bias != "none" or p.p_drop > 0:
        return "window/softcap/bias/ALiBi/dropout"
    if p.seqlens_k is not None or p.vlayout != "r":
        return "per-batch seqlens_k / column-major V"
    sq, sk = p.seqlen_q or 0, p.seqlen_k or 0
    if sq == 0 or sk == 0:   # ragged lengths: 3-D descriptors zero-fill the tails, the last blocks are masked
        return f"seqlen_q {sq} / seqlen_k {sk}: empty sequences"
    if p.is_causal and sq != sk:
        return "causal with seqlen_q != seqlen_k"
    return None


def gluon_dkdv_reason(p, block_mq: int, fused: bool) -> Optional[str]:
    why = gluon_bwd_reason(p)
    if why:
        return why
    if p.dbias:
        return "dbias"
    if fused and p.deterministic:
        return "dQ fused into dK/dV by atomics is not deterministic"
    return None


# -- the preferences ------------------------------------------------------------------------

def _bwd_tiles(hdim: int, causal: bool, seqlen_k: int, deterministic: bool, gluon_ok: bool, arch: str):
    """(deterministic, Gluon dK/dV tile or None): ``arch``'s tables' backward choice on Hopper."""

    env = knobs.get("CK_FMHA_GLUON_DKDV")
    if not deterministic and gluon_ok:
        fused = None
        if env != "0":
            fused = gluon_fused_tile(hdim, causal, arch)
            if fused is not None and seqlen_k < gluon_fused_min_seqlen(arch):
                fused = None
        if fused is not None:
            return False, fused
        deterministic = True   # no fused tile: the separate dQ pass measured faster than fp32 atomics
    if not deterministic:
        return False, None
    if env == "0":
        return True, None
    if env == "1":
        return True, gluon_dkdv_tile(hdim, causal, arch) or gluon_tiles("dkdv", arch).get(hdim)
    return True, gluon_dkdv_tile(hdim, causal, arch)


def bwd_gsplit(p, kv: tuple, arch) -> int:
    """The group split (a key's ``gsplit``, 0: none) of dK/dV choice ``kv`` (see :func:`bwd_want`) for ``p``:
    :func:`group_split` for the Triton dK/dV kernel; the Gluon kernel has none."""
    if kv[4] not in ("ptr", KVSPLIT) or p.nhead_q == p.nhead_k:
        return 0
    n = group_split(p.batch, p.nhead_q, p.nhead_k, p.seqlen_q or 0, p.seqlen_k or 0, kv[1], arch.compute_units,
                    bwd_gsplit_rule(arch.name), parts=2 if kv[4] == KVSPLIT else 1, splits=GSPLITS)
    return n if n > 1 else 0


def bwd_dchunk(p, kv: tuple, dq: str, arch) -> int:
    """The head-dim chunk of a Triton backward choice (the arch's ``bwd_tuned`` dK/dV entry names it;
    0: padded head dims); the Gluon kernels have none."""
    if kv[4] not in ("ptr", KVSPLIT) or dq.startswith("gluon") or p.dtype == "fp8":
        return 0
    return default_bwd_configs(p.hdim_q, p.hdim_v, arch.name, causal=right_bounded(p))[0].DCHUNK


def bwd_want(p, arch) -> tuple:
    """(dK/dV (block_m, block_n, warps, stages, variant), dq field) the tables pick for ``p``
    (the group split of a Triton dK/dV kernel: :func:`bwd_gsplit`).  A GQA / MQA problem whose Gluon
    dK/dV grid is under the rule's ``gluon_waves`` takes the Triton kernel with its group split."""
    rb = right_bounded(p)
    cfg_kv, cfg_q = default_bwd_configs(p.hdim_q, p.hdim_v, arch.name, causal=rb)
    triton_kv = (cfg_kv.BLOCK_M, cfg_kv.BLOCK_N, cfg_kv.num_warps, cfg_kv.num_stages,
                 "kvsplit" if cfg_kv.variant == "kvsplit" else "ptr")
    if not _hopper(arch) or interpreting():
        return triton_kv, (dq_triton(cfg_q) if p.deterministic else DQ_ATOMIC)
    scope = gluon_bwd_reason(p) or ("dbias" if p.dbias else None)
    det, gk = _bwd_tiles(p.hdim_q, p.is_causal, p.seqlen_k or 0, p.deterministic, scope is None, arch.name)
    kv = triton_kv
    rule = bwd_gsplit_rule(arch.name)   # the Gluon kernel gives way below its own waves
    few = group_split(p.batch, p.nhead_q, p.nhead_k, p.seqlen_q or 0, p.seqlen_k or 0, GLUON_BWD_BLOCK_N,
                      arch.compute_units, dict(rule, waves=rule.get("gluon_waves", 0))) > 1
    if gk is not None and scope is None and gluon_dkdv_reason(p, gk[0], not det) is None and not few:
        kv = (gk[0], GLUON_BWD_BLOCK_N, GLUON_BWD_WARPS, gk[1], "gluon_dkdv_pers" if gk[2] else "gluon_dkdv")
    if not det:
        return kv, DQ_ATOMIC
    gt = gluon_dq_tile(p.hdim_q, arch.name)
    if gt is not None and gluon_bwd_reason(p, gt[0]) is None:
        return kv, dq_gluon(gt)
    return kv, dq_triton(cfg_q)


def fwd_want(p, arch) -> list:
    """Preferred forward (block_m, block_n, warps, stages, variant, dchunk) tuples, best first: the Gluon
    kernel where tuned, then the Triton kernel's tuned tile with its TMA form, then that tile's
    lesser forms (device descriptors, then pointers) for problems the better form cannot address."""
    tag = arch.name   # the arch's tuned tables (the generic ones where it has none)
    kw = dict(causal=right_bounded(p), seqlen=p.seqlen_q if p.seqlen_q is not None else 4096,
              fp8=p.dtype == "fp8" and fp8_v_trans(arch))
    out = []
    first = default_fwd_config(p.hdim_q, p.hdim_v, tag, **kw)
    triton = default_fwd_config(p.hdim_q, p.hdim_v, tag, gluon=False, **kw)
    if first != triton:
        out.append(first)
    chain = {"tma_host": ("tma_host", "tma", "ptr"), "tma": ("tma", "ptr"), "tma_ws": ("tma_ws", "ptr")}
    for v in chain.get(triton.variant, (triton.variant,)):
        out.append(triton.with_(variant=v))
    fp8 = p.dtype == "fp8"   # (the chunks are an fp16/bf16 form)
    return [(c.BLOCK_M, c.BLOCK_N, c.num_warps, c.num_stages, c.variant, 0 if fp8 else c.DCHUNK) for c in out]


def rank(problem, candidates: list, arch, fit=None) -> list:
    """The tables' choice first (see :func:`fwd_want`, :func:`bwd_want`), then by tile size.
    ``fit(kv, dq, dchunk) -> (kv, dq)``: the backend's form of a backward choice on ``arch`` (a tuned
    tile too large for its shared memory: the nearest smaller form the enumeration holds instead), so
    the group split and the head-dim chunk are chosen for the tile that runs."""
    fam = problem.family
    if fam == "fwd":
        want = [(w, "") for w in fwd_want(problem, arch)]
    elif fam == "bwd_dq_dk_dv":
        kv, dq = bwd_want(problem, arch)
        if fit is not None:
            kv, dq = fit(kv, dq, bwd_dchunk(problem, kv, dq, arch))
        want = [(kv + (bwd_gsplit(problem, kv, arch), bwd_dchunk(problem, kv, dq, arch)), dq)]
    else:
        want = []

    def cost(k):
        a = k.algorithm
        t = ((a.block_m, a.block_n, a.num_warps, a.num_stages, a.variant)
             + ((a.dchunk,) if fam == "fwd" else (a.gsplit, a.dchunk) if fam == "bwd_dq_dk_dv" else ()), a.dq)
        # untuned: the tile that pads the actual lengths least, then the largest
        return (want.index(t) if t in want else len(want), seqtune.triton_cost(problem, a),
                -a.block_m * a.block_n)

    return sorted(candidates, key=cost)


# -- the tuned data ---------------------------------------------------------------------------

TUNED_DIR = str(Path(__file__).resolve().parent / "tuned")
#: seqlen buckets of the per-(hdim, causal, seqlen) tables


SEQ_BUCKETS = (512, 1024, 4096, 16384)

# -- the records of each table, checked where they are read ------------------------------------

_FIELDS = frozenset(TritonFmhaConfig.__dataclass_fields__)


def _int(v, what: str, lo: int, hi: int, pow2: bool = False) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi or (pow2 and v & (v - 1)):
        raise ValueError(f"{what} {v!r:.40} is not {'a power of two' if pow2 else 'an integer'} in {lo}..{hi}")
    return v


#: the backward's dK/dV kernel also comes as ``kvsplit`` (keys.KVSPLIT: two programs per key block)
BWD_VARIANTS = VARIANTS + (KVSPLIT,)


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


def tuned(name: str, arch: str) -> Table:
    """Table ``name`` of ``arch``'s tuned data, else of the generic data (empty when neither has it);
    its entries checked (:data:`CHECKS`) once per load."""
    check = CHECKS.get(name)
    t = table("fmha", arch, name, TUNED_DIR, check=check)
    return t if len(t) or arch == "generic" else table("fmha", "generic", name, TUNED_DIR, check=check)


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


#: kind -> table of the arch's tuned data, (tile, stages, persistent) per head dim: "dq" (BLOCK_N, ...)
#: of the Gluon dQ pass (the bwd_gluon_dq table says where the dispatcher uses the kernel); "dkdv" /
#: "fused" (BLOCK_MQ, ...) of the Gluon dK/dV kernel, without and with dQ fused in (first guesses)
_TILE_TABLES = {"dq": "gluon_dq_tiles", "dkdv": "gluon_dkdv_tiles", "fused": "gluon_fused_tiles"}


def gluon_tiles(kind: str, arch: str) -> dict:
    """Head dim -> the hand-picked tile of ``kind`` ("dq", "dkdv", "fused") in ``arch``'s tuned data."""
    return tile_table(_TILE_TABLES[kind], arch)


#: FmhaProblem fields that are run-time sizes: bucketed in a selection family (:func:`selection_family`)
_SIZE_FIELDS = ("batch", "seqlen_q", "seqlen_k", "packed_q", "packed_k")


@functools.lru_cache(maxsize=None)
def _family_fields(cls) -> tuple:
    return tuple(f.name for f in attrs.fields(cls) if f.name not in _SIZE_FIELDS)


def selection_family(p):
    """The problem's selection family (``OpSpec.selection_family``): every field but the sizes, which
    are bucketed (:func:`ck_core.dispatcher.size_bucket`: 8 steps per octave, cut at the powers of two of
    the tuned tables' length buckets).  A decode loop's next key length, a new batch or packed token count
    then reuses the pick of its bucket where that key supports the problem.  What the ranking reads
    continuously -- the padded tile's waste (:mod:`ck_fmha.seqtune`, rounded to tenths) and the learned
    ranker's length and occupancy features -- is approximated by the bucket.  Host-side offsets or lengths
    (``seqstart_q/k``, ``seqlens_k`` values in the problem) have no family: selected per problem."""
    if p.seqstart_q is not None or p.seqstart_k is not None or p.seqlens_k is not None:
        return None
    return (type(p), tuple(getattr(p, n) for n in _family_fields(type(p))),
            tuple(size_bucket(getattr(p, n)) if getattr(p, n) else 0 for n in _SIZE_FIELDS))
