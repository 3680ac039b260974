"""Selection rules of the conv op: how far to split a kernel's reduction.

The split is a key field (``ConvKernelConfig.split``); these rules rank the
registry's keys by how close their split is to the one that fills the GPU
(the arch's compute units), so the launcher never sizes a split itself.
"""
from __future__ import annotations

import math

from . import keys as K
from .keys import ConvKernelConfig, config_of
from .problem import ConvProblem

#: ``fixup``'s preferred split stops here: the last program of a tile reads every partial
FIXUP_MAX_SPLIT = 16
#: the workspace reductions, which cost no atomics and no memset
EAGER_REDUCTIONS = ("twostage", "fixup", "atomicfix")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def auto_split_k(p: ConvProblem, cfg: ConvKernelConfig, num_sms: int) -> int:
    """Split of the bwd_weight pixel reduction that fills about two waves of the GPU."""
    from .backends.triton.launch import reduction_shape

    tiles, P = reduction_shape(cfg, p)
    min_chunk = 4 * cfg.tile[0] if cfg.specialization == "depthwise" else 8 * cfg.tile[2]
    want = max(1, _cdiv(2 * num_sms, tiles))
    if cfg.reduction == "fixup":
        want = min(want, FIXUP_MAX_SPLIT)
    return max(1, min(want, P // min_chunk if P >= min_chunk else 1))


def auto_split_mn(tiles: int, steps: int, num_sms: int, eager: bool = False) -> int:
    """Split-K for forward / bwd_data: only when the output tiles leave most SMs idle.

    ``eager`` (the workspace reductions): the split (at most 8, at least 8 steps
    per split) whose programs fill the last wave best, one program per SM
    assumed, a little penalty per extra split.
    """
    if eager:
        best, score = 1, None
        for sp in range(1, min(8, steps // 8) + 1):
            n = tiles * sp
            sc = n / (_cdiv(n, num_sms) * num_sms) - 0.03 * (sp - 1)
            if score is None or sc > score + 1e-9:
                best, score = sp, sc
        return best
    if tiles * 2 >= num_sms or steps < 8:
        return 1
    return max(1, min(num_sms // tiles, steps // 4))


def preferred_split(cfg: ConvKernelConfig, p: ConvProblem, num_sms: int, smem_bytes: int | None = None) -> int:
    """The split of ``cfg``'s tile and reduction that suits ``p`` on ``num_sms`` SMs/CUs
    (stream-K: programs per SM, two where two buffer sets fit ``smem_bytes``)."""
    if p.split_k:
        return p.split_k
    if cfg.reduction == "streamk":
        from .backends.triton.launch import streamk_fits

        return streamk_fits(cfg, smem_bytes)
    if cfg.flat or cfg.rows or (cfg.specialization == "depthwise" and p.direction != "bwd_weight"):
        return 1
    if p.direction == "bwd_weight":
        return auto_split_k(p, cfg, num_sms)
    from .backends.triton.launch import reduction_shape

    tiles, steps = reduction_shape(cfg, p)
    return auto_split_mn(tiles, steps, num_sms, eager=cfg.reduction in EAGER_REDUCTIONS)


def named_split(cfg: ConvKernelConfig, p: ConvProblem, num_sms: int, split: int | None = None) -> tuple:
    """``(config, problem)`` to time ``cfg`` split ``split`` ways (None: :func:`preferred_split`).

    For callers that hold configs rather than the Dispatcher's keys (the kernel
    benchmarks): the config gets the split its launch really makes (a short
    reduction has fewer parts than asked) and the problem asks for exactly that.
    """
    import attrs

    from .backends.triton.launch import split_plan

    p0 = attrs.evolve(p, split_k=0)
    c = attrs.evolve(cfg, split=split or preferred_split(cfg, p0, num_sms))
    if c.reduction != "streamk":
        c = attrs.evolve(c, split=split_plan(c, p0)[0])
    return c, attrs.evolve(p, split_k=c.split)


def heuristic(problem, candidates, arch) -> list:
    """Rank candidates by closeness to :func:`ck_conv.keys.heuristic_config`'s pick."""
    want = K.heuristic_config(problem, warp_size=getattr(arch, "warp_size", 32),
                              big_smem=getattr(arch, "lds_bytes", 65536) > 100_000)
    cus = max(getattr(arch, "compute_units", 0) or 1, 1)
    spec_rank = {"depthwise": 0, "filter1x1_stride1_pad0": 0, "filter1x1_pad0": 1, "filter3x3": 2, "default": 3}

    def score(k):
        c = config_of(k)
        s = sum(abs(math.log2(a / b)) for a, b in zip(c.tile, want.tile))
        s += 0.5 * (c.pipeline != want.pipeline) + 0.25 * (c.waves != want.waves)
        s += 0.1 * spec_rank.get(c.specialization, 3) + 0.05 * (c.warp_tile != want.warp_tile)
        # the split that fills the GPU for this tile (the launcher never sizes one)
        s += 0.3 * abs(math.log2(c.split / split_for(c)))
        return s

    preferred: dict = {}

    def split_for(c):
        # what the preferred split depends on (not the split itself): one computation per family
        fam = (c.tile, c.group_merge, c.tap_mask, c.reduction, c.stages, c.pipeline, c.flat, c.rows,
               c.specialization)
        if fam not in preferred:
            preferred[fam] = preferred_split(c, problem, cus, getattr(arch, "lds_bytes", None))
        return preferred[fam]

    return sorted(candidates, key=score)   # the Dispatcher passes the keys that support the problem
