"""The FMHA part of `ck demo`: a forward, a split-KV plan and a backward."""
from __future__ import annotations

from .problem import FmhaProblem


def demo_problems():
    base = dict(batch=2, nhead_q=4, nhead_k=2, seqlen_q=67, seqlen_k=131, hdim_q=64, dtype="fp16")
    return [
        ("fmha", FmhaProblem(family="fwd", mask="bottom_right", lse=True, **base), {"receipt": 0}),
        ("fmha", FmhaProblem(family="fwd_splitkv", num_splits=3, **base), {"receipt": 0}),
        ("fmha", FmhaProblem(family="bwd_dq_dk_dv", mask="top_left",
                             **dict(base, seqlen_k=67)), {"receipt": 0}),
    ]
