"""Heuristic choices the Dispatcher path makes for FMHA problems (no tuned tables here).

:func:`split_count`: how many key splits a split-KV / paged decode problem gets.  The
count is a problem field, so it is part of the cached plan and of what ``ck_after_run``
reports; the launcher runs exactly that many splits.

The Triton keys' ranking (what was ck_fmha.heuristics):
Which Triton FMHA key the heuristic puts first: the tuned tables' choice, expressed as a key.

The tables (``ck_fmha/tuned/<arch>.json``, read through ``ck_fmha.backends.triton.tuning``) name a tile per
head dim, right-bounded mask and sequence-length bucket; on Hopper also a Gluon forward, Gluon
backward tiles and the dQ pass.  The heuristic turns them into a preference list of keys; the
candidates are already filtered by ``supports()``, so a key that cannot run the problem (a Gluon
kernel out of its scope, a TMA form the problem's strides cannot address) is simply not there and
the next preference wins.  The launcher then runs exactly the first key.
"""
from __future__ import annotations

import os
from typing import Optional

from ck_core import knobs

from . import seqtune


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


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


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

    from .backends.triton.configs import TritonFmhaConfig

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


def _tile_of_alg(a) -> tuple:
    return (a.block_m, a.num_stages, a.variant.endswith("_pers"))


# -- the preferences ------------------------------------------------------------------------

def _bwd_tiles(hdim: int, causal: bool, seqlen_k: int, deterministic: bool, gluon_ok: bool, arch: str):
    """(deterministic, Gluon dK/dV tile or None): ``arch``'s tables' backward choice on Hopper."""
    from .backends.triton import gluon_bwd
    from .backends.triton import tuning as T

    env = knobs.get("CK_FMHA_GLUON_DKDV")
    if not deterministic and gluon_ok:
        fused = None
        if env != "0":
            fused = T.gluon_fused_tile(hdim, causal, arch)
            if fused is not None and seqlen_k < T.gluon_fused_min_seqlen(arch):
                fused = None
        if fused is not None:
            return False, fused
        deterministic = True   # no fused tile: the separate dQ pass measured faster than fp32 atomics
    if not deterministic:
        return False, None
    if env == "0":
        return True, None
    if env == "1":
        return True, T.gluon_dkdv_tile(hdim, causal, arch) or gluon_bwd.tiles("dkdv", arch).get(hdim)
    return True, T.gluon_dkdv_tile(hdim, causal, arch)


def bwd_gsplit(p, kv: tuple, arch) -> int:
    """The group split (a key's ``gsplit``, 0: none) of dK/dV choice ``kv`` (see :func:`bwd_want`) for ``p``:
    :func:`group_split` for the Triton dK/dV kernel; the Gluon kernel has none."""
    from .backends.triton import tuning as T
    from .backends.triton.keys import GSPLITS, KVSPLIT

    if kv[4] not in ("ptr", KVSPLIT) or p.nhead_q == p.nhead_k:
        return 0
    n = group_split(p.batch, p.nhead_q, p.nhead_k, p.seqlen_q or 0, p.seqlen_k or 0, kv[1], arch.compute_units,
                    T.bwd_gsplit_rule(arch.name), parts=2 if kv[4] == KVSPLIT else 1, splits=GSPLITS)
    return n if n > 1 else 0


def bwd_dchunk(p, kv: tuple, dq: str, arch) -> int:
    """The head-dim chunk of a Triton backward choice (the arch's ``bwd_tuned`` dK/dV entry names it;
    0: padded head dims); the Gluon kernels have none."""
    from .backends.triton import tuning as T
    from .backends.triton.keys import KVSPLIT

    if kv[4] not in ("ptr", KVSPLIT) or dq.startswith("gluon") or p.dtype == "fp8":
        return 0
    return T.default_bwd_configs(p.hdim_q, p.hdim_v, arch.name, causal=right_bounded(p))[0].DCHUNK


def bwd_want(p, arch) -> tuple:
    """(dK/dV (block_m, block_n, warps, stages, variant), dq field) the tables pick for ``p``
    (the group split of a Triton dK/dV kernel: :func:`bwd_gsplit`).  A GQA / MQA problem whose Gluon
    dK/dV grid is under the rule's ``gluon_waves`` takes the Triton kernel with its group split."""
    from .backends.triton import tuning as T
    from .backends.triton.keys import GLUON_BWD_BLOCK_N, GLUON_BWD_WARPS, _hopper

    rb = right_bounded(p)
    cfg_kv, cfg_q = T.default_bwd_configs(p.hdim_q, p.hdim_v, arch.name, causal=rb)
    triton_kv = (cfg_kv.BLOCK_M, cfg_kv.BLOCK_N, cfg_kv.num_warps, cfg_kv.num_stages,
                 "kvsplit" if cfg_kv.variant == "kvsplit" else "ptr")
    if not _hopper(arch) or interpreting():
        return triton_kv, (dq_triton(cfg_q) if p.deterministic else DQ_ATOMIC)
    scope = gluon_bwd_reason(p) or ("dbias" if p.dbias else None)
    det, gk = _bwd_tiles(p.hdim_q, p.is_causal, p.seqlen_k or 0, p.deterministic, scope is None, arch.name)
    kv = triton_kv
    rule = T.bwd_gsplit_rule(arch.name)   # the Gluon kernel gives way below its own waves
    few = group_split(p.batch, p.nhead_q, p.nhead_k, p.seqlen_q or 0, p.seqlen_k or 0, GLUON_BWD_BLOCK_N,
                      arch.compute_units, dict(rule, waves=rule.get("gluon_waves", 0))) > 1
    if gk is not None and scope is None and gluon_dkdv_reason(p, gk[0], not det) is None and not few:
        kv = (gk[0], GLUON_BWD_BLOCK_N, GLUON_BWD_WARPS, gk[1], "gluon_dkdv_pers" if gk[2] else "gluon_dkdv")
    if not det:
        return kv, DQ_ATOMIC
    gt = T.gluon_dq_tile(p.hdim_q, arch.name)
    if gt is not None and gluon_bwd_reason(p, gt[0]) is None:
        return kv, dq_gluon(gt)
    return kv, dq_triton(cfg_q)


def fwd_want(p, arch) -> list:
    """Preferred forward (block_m, block_n, warps, stages, variant, dchunk) tuples, best first: the Gluon
    kernel where tuned, then the Triton kernel's tuned tile with its TMA form, then that tile's
    lesser forms (device descriptors, then pointers) for problems the better form cannot address."""
    from .backends.triton import tuning as T
    from .backends.triton.keys import fp8_v_trans

    tag = arch.name   # the arch's tuned tables (the generic ones where it has none)
    kw = dict(causal=right_bounded(p), seqlen=p.seqlen_q if p.seqlen_q is not None else 4096,
              fp8=p.dtype == "fp8" and fp8_v_trans(arch))
    out = []
    first = T.default_fwd_config(p.hdim_q, p.hdim_v, tag, **kw)
    triton = T.default_fwd_config(p.hdim_q, p.hdim_v, tag, gluon=False, **kw)
    if first != triton:
        out.append(first)
    chain = {"tma_host": ("tma_host", "tma", "ptr"), "tma": ("tma", "ptr"), "tma_ws": ("tma_ws", "ptr")}
    for v in chain.get(triton.variant, (triton.variant,)):
        out.append(triton.with_(variant=v))
    fp8 = p.dtype == "fp8"   # (the chunks are an fp16/bf16 form)
    return [(c.BLOCK_M, c.BLOCK_N, c.num_warps, c.num_stages, c.variant, 0 if fp8 else c.DCHUNK) for c in out]


def rank(problem, candidates: list, arch) -> list:
    """The tables' choice first (see :func:`fwd_want`, :func:`bwd_want`), then by tile size."""
    fam = problem.family
    if fam == "fwd":
        want = [(w, "") for w in fwd_want(problem, arch)]
    elif fam == "bwd_dq_dk_dv":
        kv, dq = bwd_want(problem, arch)
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
