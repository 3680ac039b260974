"""Conv features of (problem, kernel) pairs for the learned ranker (:mod:`ck_core.ranker`).

Problem columns (direction, group shape, pixels, filter, stride), kernel columns
(tile, warps, stages, the realisation knobs: reduction, split, merged groups, tap
bits, flat / row-reuse depthwise) and the analytic columns that carry most of the
signal: the programs the launch makes (:func:`ck_conv.geometry.reduction_shape`,
times the split) against the arch's compute units, the matrix work the padded tiles
do over the useful work, and a roofline estimate from the ArchSpec's peaks.  The
old heuristic's order is a column too (its rank among the candidates): the trees
learn where to trust it.  The ``rel_*`` columns are estimates over the candidate set's best
(the target is each kernel's time over its shortlist's best), ``tail`` / ``m_fit`` / ``n_fit``
how full the last wave and the edge tiles are; splits are continuous (``log_split``), so a
split the oracle never measured (64-256) still gets a score.  ``tma`` (the tensor-descriptor bwd_weight
kernel) and ``flat`` on a non-depthwise key (the im2col kernels over (tap, channel)) are columns a
ranker fitted before session 8 never saw.

The conv ranker ranks the op's shortlist (the tuning list of
:func:`ck_conv.heuristics.candidate_configs` with its splits), not the whole key space:
a few dozen keys a problem, so a new problem costs well under a millisecond.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ck_core.dtypes import ELEMENT_BYTES

from . import keys as K
from .geometry import reduction_shape

_REDUCTIONS = K.REDUCTIONS
_PIPES = K.PIPELINES
_DIRS = ("forward", "bwd_data", "bwd_weight")
#: kernel columns, in the order of :func:`_kernel_row`
_KERNEL = ("tile_m", "tile_n", "tile_k", "warps", "stages", "split", "group_merge", "tap_mask", "flat",
           "rows", "k_depthwise", "k_1x1", "k_3x3", *(f"pipe_{p}" for p in _PIPES),
           *(f"red_{r}" for r in _REDUCTIONS), "tma")


@functools.lru_cache(maxsize=1 << 16)
def _kernel_row(key) -> tuple:
    from .keys import config_of

    c = config_of(key)
    return (*c.tile, c.num_warps, c.num_stages, c.split, c.group_merge, c.tap_mask, c.flat, c.rows,
            c.specialization == "depthwise", c.specialization.startswith("filter1x1"),
            c.specialization == "filter3x3", *(c.pipeline == p for p in _PIPES),
            *(c.reduction == r for r in _REDUCTIONS), c.tma)


@functools.lru_cache(maxsize=1 << 12)
def _kernel_matrix(keys: tuple) -> np.ndarray:
    m = np.array([_kernel_row(k) for k in keys], dtype=np.float64)
    m.flags.writeable = False
    return m


def _launch_columns(keys: tuple, problem, cus: int) -> np.ndarray:
    """Per key: (output tiles, reduction length, programs) of its launch on ``problem``."""
    from .keys import config_of

    out = np.empty((len(keys), 3))
    m, n, _ = problem.gemm_mnk
    for i, k in enumerate(keys):
        c = config_of(k)
        if c.specialization == "depthwise" and problem.direction != "bwd_weight":
            # direct kernels: one program per tile of (pixels or rows, groups or flat span)
            tiles, red = _cdiv(m * problem.G, c.tile[0] * c.tile[1]), problem.taps
        else:
            tiles, red = reduction_shape(c, problem)
        progs = c.split * cus if c.reduction == "streamk" else tiles * c.split
        out[i] = (tiles, red, progs)
    return out


def _heuristic_rank(keys: tuple, problem, arch) -> np.ndarray:
    from .heuristics import heuristic

    pos = {k: i for i, k in enumerate(heuristic(problem, list(keys), arch))}
    return np.array([pos[k] for k in keys], dtype=np.float64)


def features(problem, candidates: list, arch) -> dict:
    """``{feature name: array over candidates}``."""
    keys = tuple(candidates)
    n_c = len(keys)
    Km = _kernel_matrix(keys)
    col = {name: Km[:, i] for i, name in enumerate(_KERNEL)}
    cus = max(int(arch.compute_units or 1), 1)
    tiles, red, progs = _launch_columns(keys, problem, cus).T
    p = problem
    m, n, k = (float(x) for x in p.gemm_mnk)
    eb = float(ELEMENT_BYTES[p.dtype])
    flops = float(p.flops)
    peak = arch.peak.get(f"{p.dtype}_tflops") or arch.peak.get("fp16_tflops") or 100.0
    bw = arch.peak.get("mem_gbs") or 1000.0
    dw_k = col["k_depthwise"] > 0
    waves = np.ceil(progs / cus)
    # matrix work the padded tiles do (a merged-groups tile multiplies gm x the useful
    # channels, mostly zeros); depthwise kernels do the useful work on CUDA cores
    tm, tn, tk, gm = col["tile_m"], col["tile_n"], col["tile_k"], col["group_merge"]
    if p.direction == "bwd_weight":
        work = tiles * tm * tn * red * 2.0
    else:
        work = tiles * tm * tn * np.maximum(red, 1.0) * tk * 2.0
    work = np.where(dw_k, flops, np.maximum(work, flops))
    rate = np.where(dw_k, peak * 1e12 / 16.0, peak * 1e12)   # CUDA-core fp32 ~ 1/16 of the MMA peak
    t_compute = waves * (work / np.maximum(progs, 1.0)) / (rate / cus)
    io = float(math.prod(p.input_shape) + math.prod(p.weight_shape) + math.prod(p.output_shape)) * eb
    ws = (col["split"] > 1) & ~(col["red_streamk"] > 0)
    result = float(math.prod({"forward": p.output_shape, "bwd_data": p.input_shape,
                              "bwd_weight": p.weight_shape}[p.direction]))
    t_mem = (io + ws * col["split"] * result * 4.0) / (bw * 1e9)
    roof = np.maximum(t_compute, t_mem) + 3e-6 * (1.0 + ws)
    full = lambda v: np.full(n_c, float(v))   # noqa: E731
    n_fit = float(p.c_per_group) if p.direction == "bwd_weight" else n   # a bwd_weight tile spans one tap's channels
    hr = _heuristic_rank(keys, p, arch)
    out = {
        "log_n": full(math.log2(p.N)), "log_g": full(math.log2(p.G)),
        "log_cpg": full(math.log2(p.c_per_group)), "log_kpg": full(math.log2(p.k_per_group)),
        "log_pix_out": full(math.log2(max(1, math.prod(p.output_spatial)))),
        "log_taps": full(math.log2(p.taps)), "stride": full(max(p.stride)), "ndim": full(p.ndim),
        "depthwise": full(p.c_per_group == 1 and p.k_per_group == 1),
        "dir_bwd_data": full(p.direction == "bwd_data"), "dir_bwd_weight": full(p.direction == "bwd_weight"),
        "elem_bytes": full(eb), "bf16": full(p.dtype == "bf16"),
        "log_gemm_m": full(math.log2(m)), "log_gemm_n": full(math.log2(n)), "log_gemm_k": full(math.log2(k)),
        "log_flops": full(math.log2(max(flops, 1.0))),
        "log_tiles": np.log2(np.maximum(tiles, 1.0)), "log_programs": np.log2(np.maximum(progs, 1.0)),
        "log_waves": np.log2(np.maximum(waves, 1.0)), "occupancy": progs / np.maximum(waves * cus, 1.0),
        "log_red_per_prog": np.log2(np.maximum(red / col["split"], 1.0)),
        "mma_waste": np.log2(work / max(flops, 1.0)),
        "log_t_compute": np.log(t_compute), "log_t_mem": np.log(np.full(n_c, 1.0) * t_mem),
        "log_roofline": np.log(roof),
        "heur_rank": hr, "heur_first": (hr == 0).astype(np.float64),
        # problem shape against the tile: how full the last wave and the edge tiles are, and the
        # estimates relative to the shortlist's best (the target is relative to the shortlist's best)
        "dir_index": full(_DIRS.index(p.direction)), "grouped": full(p.G > 1 and p.c_per_group * p.k_per_group > 1),
        "log_bytes_per_flop": full(math.log2(io / max(flops, 1.0))),
        "tail": (progs - (waves - 1.0) * cus) / cus,
        "m_fit": m / (np.ceil(m / tm) * tm), "n_fit": n_fit / (np.ceil(n_fit / tn) * tn),
        "log_work_per_prog": np.log2(np.maximum(work / np.maximum(progs, 1.0), 1.0)),
        "log_split": np.log2(col["split"]),
        "rel_roofline": np.log(roof) - np.log(roof).min(),
        "rel_t_compute": np.log(t_compute) - np.log(t_compute).min(),
        "rel_t_mem": np.log(t_mem * np.ones(n_c)) - np.log(t_mem * np.ones(n_c)).min(),
        "rel_waves": np.log2(np.maximum(waves, 1.0)) - np.log2(np.maximum(waves, 1.0)).min(),
    }
    for name in _KERNEL:
        out[name] = col[name]
    for name in ("tile_m", "tile_n", "tile_k", "split", "group_merge"):
        out[name] = np.log2(col[name])
    return out


def _cdiv(a, b) -> int:
    return -(-int(a) // int(b))
