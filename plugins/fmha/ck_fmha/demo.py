"""The FMHA part of `ck demo`: a forward, a split-KV plan and a backward."""
from __future__ import annotations

from ck_core.records import DemoCase

from .problem import FmhaProblem


def demo_cases() -> list:
    base = dict(batch=2, nhead_q=4, nhead_k=2, seqlen_q=67, seqlen_k=131, hdim_q=64, dtype="fp16")
    problems = [
        FmhaProblem(family="fwd", mask="bottom_right", lse=True, **base),
        FmhaProblem(family="fwd_splitkv", num_splits=3, **base),
        FmhaProblem(family="bwd_dq_dk_dv", mask="top_left", **dict(base, seqlen_k=67)),
    ]
    # after the GEMM case (order 0)
    return [DemoCase("fmha", p, {"receipt": 0}, order=10 + i) for i, p in enumerate(problems)]
