"""Heuristic choices the Dispatcher path makes for FMHA problems (no tuned tables here).

:func:`split_count`: how many key splits a split-KV / paged decode problem gets.  The
count is a problem field, so it is part of the cached plan and of what ``ck_after_run``
reports; the launcher runs exactly that many splits.
"""
from __future__ import annotations


def split_count(batch_heads: int, max_seqlen_k: int, compute_units: int, *, query_rows: int = 1,
                min_chunk: int = 256, max_splits: int = 128) -> int:
    """Splits of the key sequence so that about two waves of programs cover the machine's
    ``compute_units`` (from the ArchSpec), keeping at least ``min_chunk`` keys per split
    (a split's fixed cost -- its Q load and its combine row -- must stay small next to its
    keys).  ``query_rows``: query rows per KV head (GQA group x seqlen_q); every 64 of them
    add a program per split."""
    programs = max(1, batch_heads) * max(1, -(-int(query_rows) // 64))
    want = -(-2 * max(1, int(compute_units)) // programs)
    cap = max(1, int(max_seqlen_k) // min_chunk)
    return max(1, min(want, cap, max_splits))
