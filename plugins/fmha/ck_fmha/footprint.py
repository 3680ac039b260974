"""Bytes an FMHA problem's tensors take, and the numpy backend's working set on top.

The Dispatcher refuses a problem whose memory cannot fit before anything is allocated
(``ck_core.memory``); these are the op's two figures for it.  Sizes come from the problem
alone: a paged cache counts the pages its logical key lengths fill (the least any cache
holding them needs).
"""
from __future__ import annotations

import math

from ck_core.dtypes import ELEMENT_BYTES

from .problem import FmhaProblem, expected_shapes

BWD = ("bwd_dot_do_o", "bwd_dq_dk_dv", "bwd_convert_dq")
#: fp32 tensors of the plans (row statistics, split-KV and dq accumulators)
_FP32 = ("lse", "d", "o_acc", "lse_acc", "dq_acc")
#: float64 score-sized arrays the numpy reference holds at once per sequence (logits, mask,
#: exponentials, probabilities, dropout; the backward adds dP, dS and their temporaries)
_SCORE_COPIES = {"fwd": 8, "bwd": 16}


def _tensor_names(p: FmhaProblem) -> list:
    fam = p.family
    if fam == "fwd_splitkv_combine":
        return ["o_acc", "lse_acc", "o", "lse"]
    if fam == "bwd_dot_do_o":
        return ["o", "do", "d"]
    if fam == "bwd_convert_dq":
        return ["dq_acc", "dq"]
    names = ["q"]
    if p.bias == "elementwise":
        names += ["bias", "dbias"] if (fam in BWD and p.dbias) else ["bias"]
    if fam == "fwd_appendkv":   # a copy kernel: caches updated in place, q_rot a second q
        return names + ["knew", "vnew", "k_cache", "v_cache", "q"]
    if p.paged_kv or fam in ("fwd_pagedkv", "batch_prefill"):
        names += ["k_cache", "v_cache"]
    else:
        names += ["k", "v"]
    if fam in BWD:
        return names + ["o", "do", "lse", "d", "dq_acc", "dq", "dk", "dv"]
    names += ["o", "lse"]
    if fam == "fwd_splitkv":
        names += ["o_acc", "lse_acc"]
    if p.store_randval:
        names.append("randval")
    return names


def _pages(p: FmhaProblem) -> int:
    lens = p.seqlens_k_list() if (p.seqlens_k is not None or p.is_group) else [p.seqlen_k or 0] * p.batch
    grow = p.seqlen_knew if p.family == "fwd_appendkv" else 0   # the append lands in the cache's pages
    return sum(-(-(int(n) + grow) // p.page_size) for n in lens) if p.page_size else 0


def _shapes(p: FmhaProblem) -> dict:
    sh = expected_shapes(p)
    if p.is_group and "k" not in sh:
        hk, tk = p.nhead_k, sum(p.seqlens_k_list())
        sh["k"] = (tk, hk, p.hdim_q)
        sh["v"] = (tk, hk, p.hdim_v)
    if "k_cache" in sh and any(s is None for s in sh["k_cache"]):
        n = _pages(p)
        sh["k_cache"] = (n,) + tuple(sh["k_cache"][1:])
        sh["v_cache"] = (n,) + tuple(sh["v_cache"][1:])
    # one fp32 dQ accumulator: the GPU plans' deterministic backward runs a separate dQ pass (no
    # per-key-block partials); the numpy reference's partials are its working set (below)
    sh["dq_acc"] = (1,) + tuple(sh["dq"])
    return sh


def _numel(shape) -> int:
    if shape and isinstance(shape[0], tuple):   # alternatives (broadcastable): the full one
        shape = shape[0]
    return math.prod(int(s) for s in shape)


def _element_bytes(p: FmhaProblem, name: str) -> int:
    if name in _FP32:
        return 4
    if name == "randval":
        return 1
    if p.dtype == "fp8" and name == "o":
        return 2   # fp8 kernels write bf16
    return ELEMENT_BYTES[p.dtype]


def bytes_moved(p: FmhaProblem) -> float:
    """Bytes of every tensor the problem's plan reads, writes or hands between its stages."""
    sh = _shapes(p)
    return float(sum(_numel(sh[n]) * _element_bytes(p, n) for n in _tensor_names(p)))


def working_bytes(p: FmhaProblem, backend: str) -> float:
    """Memory the ``backend`` needs beyond the tensors: the numpy backend computes in float64
    (a float64 copy of each tensor) and holds a few score-sized arrays per sequence."""
    if backend != "numpy":
        return 0.0
    sh = _shapes(p)
    copies = 8.0 * sum(_numel(sh[n]) for n in _tensor_names(p))
    if p.family in BWD and p.deterministic:   # the reference keeps one dQ partial per key block
        from .reference.backward import dq_splits

        copies += 8.0 * (dq_splits(p) - 1) * _numel(sh["dq"])
    if p.family in ("fwd_splitkv_combine", "bwd_dot_do_o", "bwd_convert_dq", "fwd_appendkv"):
        return copies   # no score matrix: a merge, a row dot, a conversion, a copy
    sq = max(p.seqlens_q_list(), default=0) if p.is_group else (p.seqlen_q or 0)
    sk = p.seqlen_k or 0
    per_seq = _SCORE_COPIES["bwd" if p.family in BWD else "fwd"] * 8.0 * p.nhead_q * sq * sk
    return copies + per_seq
