"""FMHA features of (problem, Triton kernel) pairs for the learned ranker (:mod:`ck_core.ranker`).

Problem columns (lengths, heads, head dim, mask), kernel columns (tiles, warps,
stages, variant) and the analytic ones that carry most of the signal: padded
query rows and KV blocks of the actual lengths (:mod:`ck_fmha.seqtune`), the
programs against the arch's compute units (waves, occupancy).  CK-rule keys have
no ranker: they return no features, and the ranker's data is per backend.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ck_core.dtypes import ELEMENT_BYTES

from . import seqtune

_VARIANTS = ("ptr", "tma", "tma_host", "tma_ws")


@functools.lru_cache(maxsize=1 << 14)
def _kernel_row(key) -> tuple:
    a = key.algorithm
    return (a.block_m, a.block_n, a.num_warps, a.num_stages, *(a.variant == v for v in _VARIANTS),
            a.variant.startswith("gluon"), bool(getattr(a, "dchunk", 0)))


@functools.lru_cache(maxsize=256)
def _kernel_matrix(keys: tuple) -> np.ndarray:
    # one registry's candidate lists repeat from problem to problem
    m = np.array([_kernel_row(k) for k in keys], dtype=np.float64)
    m.flags.writeable = False
    return m


def features(problem, candidates: list, arch) -> dict:
    """``{feature name: array over candidates}`` (empty for keys that are not Triton keys)."""
    if not candidates or not hasattr(candidates[0].algorithm, "block_m"):
        return {}
    K = _kernel_matrix(tuple(candidates))
    bm, bn, warps, stages = K[:, 0], K[:, 1], K[:, 2], K[:, 3]
    n = len(candidates)
    sq = float(problem.seqlen_q or max(1, problem.total_q // max(1, problem.batch)))
    chunk = float(seqtune.kv_chunk(problem) or sq)
    heads = float(problem.batch * problem.nhead_q)
    cus = float(max(arch.compute_units, 1))
    programs = heads * np.ceil(sq / bm)
    waves = np.ceil(programs / cus)
    full = lambda v: np.full(n, float(v))
    causal = float(problem.is_causal)
    # one program's padded work; the slowest CU runs ``waves`` of them
    per_program = bm * np.ceil(chunk / bn) * bn * problem.hdim_q * (1.0 - 0.5 * causal)
    out = {
        "log_sq": full(math.log2(sq)), "log_sk": full(math.log2(chunk)), "hdim": full(problem.hdim_q),
        "log_heads": full(math.log2(heads)), "gqa": full(problem.nhead_q / max(1, problem.nhead_k)),
        "causal": full(causal), "elem_bytes": full(ELEMENT_BYTES[problem.dtype]),
        # the kernel family as a problem class: a ranker fitted on forward timings must not rank the
        # backward's or split-KV's keys (select_train bounds ``is_*`` features in its domain)
        "is_fwd": full(float(problem.family == "fwd")),
        "block_m": bm, "block_n": bn, "warps": warps, "stages": stages,
        "waste_q": np.ceil(sq / bm) * bm / sq, "waste_k": np.ceil(chunk / bn) * bn / chunk,
        "log_programs": np.log2(programs), "log_waves": np.log2(waves), "occupancy": programs / (waves * cus),
        "log_work_per_cu": np.log2(waves * per_program),
    }
    for i, v in enumerate(_VARIANTS + ("gluon", "dchunk")):   # v_dchunk: head-dim chunks (keys' _c<C>)
        out[f"v_{v}"] = K[:, 4 + i]
    return out
