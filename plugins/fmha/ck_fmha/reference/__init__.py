"""NumPy references of all nine FMHA families, and one-shot helpers.

``REFERENCES[family]`` is the stage function of that family; the
``attention_forward`` / ``attention_backward`` helpers chain the stages the
dispatcher's plan would run (split-KV = main + combine; backward = dot_do_o,
dq_dk_dv, convert_dq).  Semantics (mask, sink, dropout RNG, ALiBi) are
documented in :mod:`ck_fmha.masks` and :mod:`ck_fmha.philox`.
"""
from __future__ import annotations

import attrs

from ck_core.errors import InvalidProblem

from ..problem import FmhaProblem, combine_problem
from .backward import BwdResult, bwd_convert_dq, bwd_dot_do_o, bwd_dq_dk_dv, dq_splits
from .forward import (AppendKvResult, FwdResult, SplitKvResult, batch_prefill, fwd,
                      fwd_appendkv, fwd_pagedkv, fwd_splitkv, fwd_splitkv_combine, split_ranges)

__all__ = [
    "REFERENCES", "attention_forward", "attention_backward", "fwd", "fwd_splitkv",
    "fwd_splitkv_combine", "fwd_pagedkv", "fwd_appendkv", "batch_prefill", "bwd_dot_do_o",
    "bwd_dq_dk_dv", "bwd_convert_dq", "FwdResult", "SplitKvResult", "AppendKvResult", "BwdResult",
    "split_ranges", "dq_splits",
]

REFERENCES = {
    "fwd": fwd,
    "fwd_splitkv": fwd_splitkv,
    "fwd_splitkv_combine": fwd_splitkv_combine,
    "fwd_pagedkv": fwd_pagedkv,
    "fwd_appendkv": fwd_appendkv,
    "batch_prefill": batch_prefill,
    "bwd_dot_do_o": bwd_dot_do_o,
    "bwd_dq_dk_dv": bwd_dq_dk_dv,
    "bwd_convert_dq": bwd_convert_dq,
}


def attention_forward(problem: FmhaProblem, q, k, v, **kw) -> FwdResult:
    """The whole forward the problem asks for, by family.

    * fwd and the bwd families: :func:`fwd` (k, v dense)
    * fwd_splitkv / fwd_splitkv_combine: split main stage + combine
    * fwd_pagedkv / batch_prefill: k, v are the paged caches; pass the tables in ``kw``
    * fwd_appendkv: k, v are the caches; pass ``knew``, ``vnew`` (and rotary
      tables); returns attention of the rotated q over the updated caches.
    """
    p = problem
    fam = p.family
    if fam in ("fwd",) or fam.startswith("bwd"):
        return fwd(p, q, k, v, **kw)
    if fam in ("fwd_splitkv", "fwd_splitkv_combine"):
        ps = attrs.evolve(p, family="fwd_splitkv")
        split_tile = kw.pop("split_tile", 1)
        acc = fwd_splitkv(ps, q, k, v, split_tile=split_tile, **kw)
        return fwd_splitkv_combine(combine_problem(ps), acc.o_acc, acc.lse_acc)
    if fam == "fwd_pagedkv":
        return fwd_pagedkv(p, q, k, v, **kw)
    if fam == "batch_prefill":
        return batch_prefill(p, q, k, v, **kw)
    if fam == "fwd_appendkv":
        app_kw = {n: kw.pop(n) for n in ("knew", "vnew", "rotary_cos", "rotary_sin", "block_table") if n in kw}
        out = fwd_appendkv(p, q, app_kw["knew"], app_kw["vnew"], k, v,
                           rotary_cos=app_kw.get("rotary_cos"), rotary_sin=app_kw.get("rotary_sin"),
                           block_table=app_kw.get("block_table"))
        lens = tuple(l + p.seqlen_knew for l in p.seqlens_k)
        base = dict(seqlen_knew=0, rope="none", rotary_dim=0, seqlens_k=lens)
        if p.paged_kv:
            pf = attrs.evolve(p, family="fwd_pagedkv", **base)
            return fwd_pagedkv(pf, out.q, out.k_cache, out.v_cache, block_table=app_kw["block_table"], **kw)
        pf = attrs.evolve(p, family="fwd", **base)
        return fwd(pf, out.q, out.k_cache, out.v_cache, **kw)
    raise InvalidProblem(f"unknown FMHA family {fam!r}; use one of {', '.join(REFERENCES)}")


def attention_backward(problem: FmhaProblem, q, k, v, o, lse, do, *, bias=None, alibi_slopes=None,
                       kn0: int = 128) -> BwdResult:
    """dot_do_o -> dq_dk_dv -> convert_dq; dq comes back in the problem dtype's storage."""
    p = problem
    d = bwd_dot_do_o(p, o, do)
    res = bwd_dq_dk_dv(p, q, k, v, lse, do, d, bias=bias, alibi_slopes=alibi_slopes, kn0=kn0)
    dq = bwd_convert_dq(p, res.dq)
    return BwdResult(dq, res.dk, res.dv, res.dbias)
