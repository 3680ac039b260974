"""The Triton realisation families of the conv kernel space.

CK's tile space (:func:`ck_conv.keys.enumerate_configs`) holds one
realisation per tile: acq_rel atomic split reductions, the pipeline's default
depth, one group per program, the gather kernels.  The Triton kernels implement
more, and those won the H100 benchmarks: workspace / counter split reductions
(relaxed, twostage, fixup, atomicfix), stream-K, tap-validity bitmasks, BLOCK_K
128 with 4-5 stages, block-diagonal group merging, and the flat-row and
row-reuse depthwise kernels.  :func:`realisation_configs` enumerates them for
one signature so the triton registry holds them and selection can reach them;
whether one runs a problem is ``ConvKernelConfig.why_not`` (the op's
``supports()``).

The families are products over small axes, not every tile of CK's table: the
full cross product of tiles x knobs would be millions of keys per signature.
"""
from __future__ import annotations

import itertools
import math

import attrs

from . import keys as K
from .keys import ConvKernelConfig, key_of
from .problem import ConvProblem

#: split reductions that are not CK's atomic one
REDUCTIONS = ("relaxed", "twostage", "fixup", "atomicfix", "streamk")
#: implicit-GEMM tiles of the realisation families (M, N, K); waves by :func:`classic_waves`
GEMM_TILES = tuple(itertools.product((64, 128, 256), (16, 32, 64, 128, 256), (32, 64)))
#: BLOCK_K 128 tiles and the stage counts they were measured with
DEEP_TILES = tuple(itertools.product((64, 128), (16, 32, 64, 128, 256), (128,)))
DEEP_STAGES = (4, 5)
#: merged groups per program and the tiles they run on (whole groups of <= 32 channels per block)
GROUP_MERGES = (4, 8, 16)
MERGE_TILES = tuple(itertools.product((16, 32, 64, 128), (16, 32, 64, 128), (16, 32, 64, 128)))
#: depthwise flat-row tiles (rows, flat (W, G) span) and warps
FLAT_TILES = (((4, 1024, 1), 4), ((2, 1024, 1), 4), ((8, 512, 1), 4), ((2, 2048, 1), 8), ((8, 1024, 1), 8),
              ((1, 2048, 1), 4), ((128, 16, 1), 4), ((256, 16, 1), 4))
#: depthwise row-reuse tiles (output rows, span), warps, weights (1 gathered, 2 host-expanded)
ROWS_TILES = (((4, 1024, 1), 4, 1), ((8, 1024, 1), 4, 1), ((4, 2048, 1), 8, 1), ((4, 1024, 1), 4, 2),
              ((8, 2048, 1), 8, 2), ((2, 1024, 1), 4, 1), ((16, 1024, 1), 4, 1))


#: the tile axes of ``heuristic_config`` and the classic candidate list (few channels per
#: group: N and K down to 16), each with the waves those rules give it
CLASSIC_M = (16, 32, 64, 128, 256)
CLASSIC_N = (16, 32, 64, 128, 256)
CLASSIC_K = (16, 32, 64, 128)
#: the classic depthwise direct-kernel tiles (pixels, groups) and warps
DW_CLASSIC = {"forward": (((128, 32, 1), 4), ((256, 16, 1), 4), ((64, 64, 1), 4), ((128, 16, 1), 4),
                          ((256, 32, 1), 4), ((64, 32, 1), 4), ((512, 16, 1), 8), ((256, 16, 1), 8)),
              "bwd_weight": (((8, 32, 1), 4), ((16, 32, 1), 4), ((16, 16, 1), 4), ((32, 16, 1), 4),
                             ((8, 64, 1), 4), ((32, 32, 1), 4))}
DW_CLASSIC["bwd_data"] = DW_CLASSIC["forward"]


def classic_waves(tile, direction: str) -> tuple:
    """The wave layouts the classic rules give a tile (small tiles run on 1-2 warps)."""
    m, n, _ = tile
    if direction == "bwd_weight":
        return ((2, 2, 1), (2, 4, 1)) if m * n >= 64 * 64 else ((1, 2, 1), (1, 1, 1))
    return ((2, 2, 1), (2, 4, 1)) if m * n >= 64 * 64 else ((2, 1, 1),)


def classic_configs(direction: str, dtype: str, ndim: int, layout: str, specialization: str):
    """CK-style tiles the classic rules use that CK's table lacks (unsplit knobs)."""
    common = dict(direction=direction, dtype=dtype, ndim=ndim, layout=layout, specialization=specialization)
    if specialization == "depthwise":
        return [ConvKernelConfig(pipeline="mem", tile=t, waves=(w, 1, 1), warp_tile=(1, 1, 1), **common)
                for t, w in DW_CLASSIC[direction]]
    pipes = ("compv3", "mem", "compv4") if direction == "forward" else ("compv3", "mem")
    return [ConvKernelConfig(pipeline=pipe, tile=t, waves=w, warp_tile=(16, 16, 16), **common)
            for t in itertools.product(CLASSIC_M, CLASSIC_N, CLASSIC_K) for w in classic_waves(t, direction)
            for pipe in pipes]


def realisation_configs(direction: str, dtype: str, ndim: int, layout: str, specialization: str):
    """Every realisation-family config of one signature and specialisation (structurally legal)."""
    common = dict(direction=direction, dtype=dtype, ndim=ndim, layout=layout, specialization=specialization)
    if specialization == "depthwise":
        if direction == "bwd_weight":
            return []
        out = [ConvKernelConfig(pipeline="mem", tile=t, waves=(w, 1, 1), warp_tile=(1, 1, 1), flat=True, **common)
               for t, w in FLAT_TILES]
        if direction == "forward":
            out += [ConvKernelConfig(pipeline="mem", tile=t, waves=(w, 1, 1), warp_tile=(1, 1, 1), rows=r, **common)
                    for t, w, r in ROWS_TILES]
        return out
    one_by_one = specialization.startswith("filter1x1")
    taps = (False,) if one_by_one else (False, True)
    reductions = tuple(r for r in REDUCTIONS if not (r == "streamk" and direction == "bwd_weight"))
    out = []

    def add(tile, waves, pipeline="compv3", **kw):
        c = ConvKernelConfig(pipeline=pipeline, tile=tile, waves=waves, warp_tile=(16, 16, 16), **common, **kw)
        if c not in seen:
            seen.add(c)
            out.append(c)

    seen: set = set()
    for tile, tap, red in itertools.product(GEMM_TILES, taps, ("atomic",) + reductions):
        if red == "streamk" and direction == "bwd_data" and not tap and not one_by_one:
            continue   # bwd_data stream-K runs on the tap-bit kernel
        for waves in classic_waves(tile, direction):
            for pipe, stages in (("compv3", 0), ("compv4", 0), ("compv3", 3), ("compv3", 4)):
                if pipe == "compv4" and direction != "forward":
                    continue
                if tap or red != "atomic" or stages or pipe == "compv4":
                    add(tile, waves, pipe, stages=stages, reduction=red, tap_mask=tap)
    for tile, stages, tap, red in itertools.product(DEEP_TILES, DEEP_STAGES, taps, ("atomic",) + reductions):
        if red == "streamk" and direction == "bwd_data" and not tap and not one_by_one:
            continue
        for waves in classic_waves(tile, direction):
            add(tile, waves, stages=stages, reduction=red, tap_mask=tap)
    merge_taps = taps if direction != "bwd_data" or one_by_one else (True,)
    # bwd_weight merges (a batched dot) reduce with fixup over 64-128 pixel blocks; forward /
    # bwd_data merges are one block-diagonal GEMM of 64-128 rows
    merge_reds, merge_stages = (("fixup",), (0,)) if direction == "bwd_weight" else (("atomic",), (0, 3))
    for tile, gm, tap, red, stages in itertools.product(MERGE_TILES, GROUP_MERGES, merge_taps, merge_reds,
                                                        merge_stages):
        if (tile[0] < 64) if direction != "bwd_weight" else (tile[2] < 64):
            continue
        for waves in classic_waves(tile, direction):
            add(tile, waves, stages=stages, reduction=red, group_merge=gm, tap_mask=tap)
    return out


# -- the key space: KernelKeys of the configs above and of CK's tile table ----------------------

OPTIONS = ("directions", "dtypes", "ndims", "layouts", "specializations", "pipelines", "tiles", "split_ks")
#: reduction splits enumerated per kind of kernel (``split_ks`` overrides them all):
#: CK-space atomic forward / bwd_data, the workspace reductions, bwd_weight's pixel split
#: (stream-K: persistent programs per SM)
SPLITS = {"atomic": (1, 2, 4, 8), "workspace": (1, 2, 4, 8), "bwd_weight": (1, 2, 4, 8, 16, 32),
          "streamk": (1, 2),
          # a depthwise bwd_weight launch has one program per 16-64 groups: a MobileNet layer
          # (G 32-384) fills an H100 only when its pixels are cut in a hundred parts or more
          "depthwise_bwd_weight": (1, 2, 4, 8, 16, 32, 64, 128, 256)}


def _splits(c: ConvKernelConfig, override) -> tuple:
    if c.reduction == "streamk":
        return SPLITS["streamk"]
    if c.flat or c.rows or (c.specialization == "depthwise" and c.direction != "bwd_weight"):
        return (1,)
    if override:
        return override
    if c.direction == "bwd_weight":
        return SPLITS["depthwise_bwd_weight" if c.specialization == "depthwise" else "bwd_weight"]
    return SPLITS["atomic" if c.reduction == "atomic" else "workspace"]


def key_space(arch, backend: str, options: dict):
    """The conv kernel space on ``arch`` as a KeySpace (:class:`ck_conv.keyspace.ConvSpace`)."""
    from .keyspace import ConvSpace

    return ConvSpace(arch, backend, options)


def enumerate_keys(arch, backend: str, options: dict) -> list:
    """Every key of :func:`key_space`, listed."""
    return list(key_space(arch, backend, options))


def shortlist(problem, arch, backend: str):
    """Two tiers of keys for ``problem``: its tuning list
    (:func:`ck_conv.keys.candidate_configs`: the heuristic pick first, then the classic
    and realisation variants that won on the H100), then the heuristic pick's kernel on
    each tile of CK's table (what a registry of CK's space alone holds).  Each config comes
    with the split that fills ``arch`` (as the launch makes it) and unsplit."""
    if not isinstance(problem, ConvProblem):
        return
    yield _with_splits(K.candidate_configs(problem, arch=arch), problem, arch, backend)
    yield _with_splits(_ck_table_variants(problem, arch), problem, arch, backend)   # only when the first misses


def _with_splits(cfgs, problem, arch, backend: str) -> list:
    from .heuristics import preferred_split
    from .backends.triton.launch import split_plan

    cus, smem = max(int(arch.compute_units or 1), 1), arch.lds_bytes
    out = []
    for c in cfgs:
        if problem.split_k:
            picks = (c if c.split == problem.split_k else attrs.evolve(c, split=problem.split_k),)
        else:
            c1 = c if c.split == 1 else attrs.evolve(c, split=1)
            sp = preferred_split(c1, problem, cus, smem)
            if sp > 1 and c1.reduction != "streamk":
                sp = split_plan(c1, problem, sp)[0]   # the parts the launch makes
                sp = _enumerated_split(c1, sp, problem)
            picks = (attrs.evolve(c1, split=sp), c1) if sp != 1 else (c1,)
        out.extend(key_of(x, arch.name, backend) for x in picks)
    return out


def _enumerated_split(c1: ConvKernelConfig, want: int, problem) -> int:
    """The split nearest ``want`` (log scale; the smaller on a tie) among those the enumeration
    gives ``c1`` (:func:`_splits`) that its launch makes as named on ``problem``; 1 if none.
    The preferred split is any integer (263 parts of a MobileNet layer's pixels), the key space
    holds powers of two: a shortlist naming a split outside it would name no key at all."""
    from .backends.triton.launch import split_plan

    for s in sorted(_splits(c1, ()), key=lambda s: (abs(math.log2(s / want)), s)):
        if s == 1 or split_plan(c1, problem, s)[0] == s:
            return s
    return 1


def _ck_table_variants(problem, arch) -> list:
    want = K.heuristic_config(problem, warp_size=arch.warp_size, big_smem=arch.lds_bytes > 100_000)
    if want.specialization == "depthwise":
        return [attrs.evolve(want, tile=t) for t in K.DEPTHWISE_TILES]
    tiles = dict(getattr(arch, "extras", {}).get("conv", {})).get("tiles") or K.DEFAULT_TILES
    waves = dict.fromkeys((want.waves, (2, 2, 1), (4, 1, 1), (2, 4, 1)))
    return [attrs.evolve(want, tile=tuple(t), waves=w) for t in tiles for w in waves]
