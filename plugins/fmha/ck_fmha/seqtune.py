"""Sequence-length-aware selection (the seeds' "seqtune"): rank FMHA keys by the actual lengths.

A tile's rows past the end of the query (or a KV block past the end of a split's
chunk) are work thrown away; a ``max_seq_q`` kernel is a specialisation for
short queries and computes nothing longer.  Split-KV decode wants enough
programs to fill the machine: batch x KV heads against the arch's SM / CU count
(from the ArchSpec, never a constant), without chunks shorter than a few blocks.
"""
from __future__ import annotations

import math
from typing import Optional

#: fewest keys per split chunk (shorter chunks spend more on the combine than they save)
MIN_CHUNK = 256
MAX_SPLITS = 128


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


def split_count(programs: int, seqlen_k: int, sms: int, block_n: int = 64, min_chunk: int = MIN_CHUNK,
                max_splits: int = MAX_SPLITS) -> int:
    """Split the KV sequence until about two waves of ``programs`` x splits cover ``sms``
    compute units, keeping at least ``min_chunk`` keys per split (chunks rounded to ``block_n``)."""
    programs = max(1, programs)
    want = max(1, -(-2 * max(1, sms) // programs))
    n = max(1, min(want, max(1, seqlen_k // min_chunk), max_splits))
    chunk = -(-seqlen_k // n)
    chunk = -(-chunk // block_n) * block_n
    return max(1, -(-seqlen_k // chunk))


def decode_splits(problem, arch, block_n: int = 64) -> int:
    """Split-KV count for a decode ``problem`` on ``arch``: its programs (batch x KV heads x
    64-row blocks of the query rows each KV head serves) against the ArchSpec's compute units,
    and its KV length."""
    m_blocks = -(-(problem.seqlen_q or 1) * (problem.nhead_q // max(1, problem.nhead_k)) // 64)
    return split_count(problem.batch * problem.nhead_k * m_blocks, problem.seqlen_k or 1,
                       int(arch.compute_units), block_n)


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
