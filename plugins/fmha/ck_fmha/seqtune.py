"""Sequence-length-aware selection (the seeds' "seqtune"): rank FMHA keys by the actual lengths.

A tile's rows past the end of the query (or a KV block past the end of a split's
chunk) are work thrown away; a ``max_seq_q`` kernel is a specialisation for
short queries and computes nothing longer.  (The split-KV count itself is
:func:`ck_fmha.heuristics.split_count`, the one the Dispatcher uses.)
"""
from __future__ import annotations

import math
from typing import Optional

def waste(length: Optional[int], tile: int) -> float:
    """Padded over useful length of ``length`` cut into ``tile``-sized blocks (1.0 = none), in
    tenths, so that near-equal fits tie and the next criterion decides."""
    if not length or tile <= 0:
        return 1.0
    return round(math.ceil(length / tile) * tile / length, 1)


def max_seq_q_reason(max_seq_q: int, problem) -> Optional[str]:
    """Why a ``max_seq_q`` specialisation cannot run ``problem`` (None: it can)."""
    if max_seq_q and (problem.is_group or (problem.seqlen_q or 0) > max_seq_q):
        what = "group mode" if problem.is_group else f"seqlen_q {problem.seqlen_q}"
        return f"kernel is specialised for seqlen_q <= {max_seq_q} (batch mode); problem has {what}"
    return None


def kv_chunk(problem) -> Optional[int]:
    """Keys one program of ``problem`` walks: the KV length, or one split's share of it."""
    sk = problem.seqlen_k
    if not sk:
        return None
    return -(-sk // max(1, problem.num_splits)) if problem.family in ("fwd_splitkv", "fwd_pagedkv") else sk


def ck_cost(problem, spec) -> tuple:
    """Seqlen part of a CK key's rank: fitting ``max_seq_q`` specialisations first (smallest
    limit first), then the least padded query and key tiles."""
    maxq = getattr(spec, "max_seq_q", 0) or 0
    fits_short = 0 if maxq and (problem.seqlen_q or 0) <= maxq else 1
    tile = spec.tile or ()
    wq = waste(problem.seqlen_q, tile[0]) if tile else 1.0
    wk = waste(kv_chunk(problem), tile[1]) if len(tile) > 1 and problem.family != "bwd_dq_dk_dv" else 1.0
    return (fits_short, maxq or math.inf, wq * wk)


def triton_cost(problem, algorithm) -> float:
    """Seqlen part of a Triton key's rank: padded query rows times padded KV blocks."""
    return round(waste(problem.seqlen_q, algorithm.block_m) * waste(kv_chunk(problem), algorithm.block_n), 1)
