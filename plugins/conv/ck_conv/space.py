"""The conv kernel space: CK's tile space and the Triton realisation families.

The tables both are built from are data (:func:`conv_facts`: ``space.json`` beside
this module, each ``arch`` field replaced by the ArchSpec's ``extras["conv"]`` where
it declares one).  CK's tile space (:func:`enumerate_configs`) holds one
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

import functools
import itertools
import json
import logging
import math
from pathlib import Path

import attrs

from . import keys as K
from .keys import ConvKernelConfig, cull_reason, evolved, key_of
from .problem import DIRECTIONS, DTYPES, ConvProblem

log = logging.getLogger(__name__)

#: split reductions that are not CK's atomic one
REDUCTIONS = ("relaxed", "twostage", "fixup", "atomicfix", "streamk")
FACTS_FILE = Path(__file__).resolve().parent / "space.json"


def as_tuples(x):
    if isinstance(x, dict):
        return {k: as_tuples(v) for k, v in x.items()}
    return tuple(as_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


@functools.lru_cache(maxsize=1)
def _generic() -> dict:
    data = json.loads(FACTS_FILE.read_text())
    return {**as_tuples(data["arch"]), **as_tuples(data["kernels"]), "triton": as_tuples(data["triton"])}


def conv_facts(arch=None) -> dict:
    """The conv space's tables: ``tiles``, ``waves``, ``depthwise_tiles``, ``max_block_threads``
    (arch facts: ``arch.extras["conv"]`` where it has the field, else the generic one),
    ``rows_rh`` (the row-reuse kernel's output rows) and ``triton`` (the realisation
    families' axes).  Plain tuples and dicts, shared: do not change them."""
    gen = _generic()
    own = dict(getattr(arch, "extras", {}).get("conv", {})) if arch is not None else {}
    if not own:
        return gen
    return {**gen, **{k: as_tuples(v) for k, v in own.items() if k in ("tiles", "waves", "depthwise_tiles",
                                                                      "max_block_threads")}}


def _axes(t: dict) -> tuple:
    return tuple(itertools.product(t["m"], t["n"], t["k"]))


def _triton() -> dict:
    return _generic()["triton"]


# -- CK's tile space ---------------------------------------------------------------------

def enumerate_configs(*, warp_size: int, lds_bytes: int, warp_tiles, directions=DIRECTIONS,
                      dtypes=DTYPES, ndims=(1, 2, 3), layouts=("nhwgc",), tiles=None,
                      waves=None, pipelines=K.PIPELINES, schedulers=("intrawave",),
                      specializations=K.SPECIALIZATIONS, vector=(4, 8, 8), depthwise_tiles=None,
                      max_threads: int | None = None, culled: list | None = None) -> list[ConvKernelConfig]:
    """Every legal kernel of CK's tile space for an arch described by ``warp_size``, ``lds_bytes``
    and ``warp_tiles`` (a dict dtype -> [(m, n, k), ...] or one list for every dtype).
    ``tiles``, ``waves``, ``depthwise_tiles`` and ``max_threads`` default to the generic
    tables (:func:`conv_facts`).

    Culled candidates are logged at debug level with their reason and appended
    to ``culled`` as (name, reason) when a list is given.
    """
    gen = conv_facts()
    tiles = gen["tiles"] if tiles is None else tiles
    waves = gen["waves"] if waves is None else waves
    depthwise_tiles = gen["depthwise_tiles"] if depthwise_tiles is None else depthwise_tiles
    max_threads = gen["max_block_threads"] if max_threads is None else max_threads
    out = []
    for d, dt, nd, lay, spec in itertools.product(directions, dtypes, ndims, layouts, specializations):
        wt = warp_tiles.get(dt, ()) if isinstance(warp_tiles, dict) else warp_tiles
        if spec == "depthwise":
            for t in depthwise_tiles:
                out.append(ConvKernelConfig(direction=d, dtype=dt, ndim=nd, layout=lay, pipeline="mem",
                                            tile=t, waves=(4, 1, 1), warp_tile=(1, 1, 1),
                                            specialization=spec, vector=vector))
            continue
        for t, wv, x, pipe, sch in itertools.product(tiles, waves, wt, pipelines, schedulers):
            cfg = ConvKernelConfig(direction=d, dtype=dt, ndim=nd, layout=lay, pipeline=pipe, scheduler=sch,
                                   tile=t, waves=wv, warp_tile=x, specialization=spec, vector=vector)
            why = cull_reason(cfg, warp_size=warp_size, lds_bytes=lds_bytes, warp_tiles=wt,
                              max_threads=max_threads)
            if why is None:
                out.append(cfg)
            else:
                log.debug("cull %s: %s", cfg.name, why)
                if culled is not None:
                    culled.append((cfg.name, why))
    return out


# -- the Triton realisation families -------------------------------------------------------

def classic_waves(tile, direction: str) -> tuple:
    """The wave layouts the classic rules give a tile (small tiles run on 1-2 warps)."""
    m, n, _ = tile
    if direction == "bwd_weight":
        return ((2, 2, 1), (2, 4, 1)) if m * n >= 64 * 64 else ((1, 2, 1), (1, 1, 1))
    return ((2, 2, 1), (2, 4, 1)) if m * n >= 64 * 64 else ((2, 1, 1),)


def classic_configs(direction: str, dtype: str, ndim: int, layout: str, specialization: str):
    """CK-style tiles the classic rules use that CK's table lacks (unsplit knobs): the tile axes of
    :func:`ck_conv.heuristics.heuristic_config` and the classic candidate list (few channels per
    group: N and K down to 16), each with the waves those rules give it."""
    common = dict(direction=direction, dtype=dtype, ndim=ndim, layout=layout, specialization=specialization)
    tt = _triton()
    if specialization == "depthwise":
        dw = tt["dw_classic"]["bwd_weight" if direction == "bwd_weight" else "forward"]
        return [ConvKernelConfig(pipeline="mem", tile=t, waves=(w, 1, 1), warp_tile=(1, 1, 1), **common)
                for t, w in dw]
    pipes = ("compv3", "mem", "compv4") if direction == "forward" else ("compv3", "mem")
    return [ConvKernelConfig(pipeline=pipe, tile=t, waves=w, warp_tile=(16, 16, 16), **common)
            for t in _axes(tt["classic_tiles"]) for w in classic_waves(t, direction)
            for pipe in pipes]


def realisation_configs(direction: str, dtype: str, ndim: int, layout: str, specialization: str):
    """Every realisation-family config of one signature and specialisation (structurally legal)."""
    common = dict(direction=direction, dtype=dtype, ndim=ndim, layout=layout, specialization=specialization)
    tt = _triton()
    if specialization == "depthwise":
        if direction == "bwd_weight":
            # the per-tap accumulator kernel's tiles with its one-launch reduction (and atomics)
            return [ConvKernelConfig(pipeline="mem", tile=t, waves=(w, 1, 1), warp_tile=(1, 1, 1), reduction=red,
                                     **common)
                    for t, w in tt["dw_bwd_weight_tiles"] for red in tt["dw_bwd_weight_reductions"]]
        out = [ConvKernelConfig(pipeline="mem", tile=t, waves=(w, 1, 1), warp_tile=(1, 1, 1), flat=True, **common)
               for t, w in tt["flat_tiles"]]
        if direction == "forward":
            out += [ConvKernelConfig(pipeline="mem", tile=t, waves=(w, 1, 1), warp_tile=(1, 1, 1), rows=r, **common)
                    for t, w, r in tt["rows_tiles"]]
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
    for tile, tap, red in itertools.product(_axes(tt["gemm_tiles"]), taps, ("atomic",) + reductions):
        if red == "streamk" and direction == "bwd_data" and not tap and not one_by_one:
            continue   # bwd_data stream-K runs on the tap-bit kernel
        for waves in classic_waves(tile, direction):
            for pipe, stages in (("compv3", 0), ("compv4", 0), ("compv3", 3), ("compv3", 4)):
                if pipe == "compv4" and direction != "forward":
                    continue
                if tap or red != "atomic" or stages or pipe == "compv4":
                    add(tile, waves, pipe, stages=stages, reduction=red, tap_mask=tap)
    for tile, stages, tap, red in itertools.product(_axes(tt["deep_tiles"]), tt["deep_stages"], taps, ("atomic",) + reductions):
        if red == "streamk" and direction == "bwd_data" and not tap and not one_by_one:
            continue
        for waves in classic_waves(tile, direction):
            add(tile, waves, stages=stages, reduction=red, tap_mask=tap)
    merge_taps = taps if direction != "bwd_data" or one_by_one else (True,)
    # bwd_weight merges (a batched dot) reduce with fixup over 64-128 pixel blocks; forward /
    # bwd_data merges are one block-diagonal GEMM of 64-128 rows
    merge_reds, merge_stages = (("fixup",), (0,)) if direction == "bwd_weight" else (("atomic",), (0, 3))
    for tile, gm, tap, red, stages in itertools.product(_axes(tt["merge_tiles"]), tt["group_merges"], merge_taps, merge_reds,
                                                        merge_stages):
        if (tile[0] < 64) if direction != "bwd_weight" else (tile[2] < 64):
            continue
        for waves in classic_waves(tile, direction):
            add(tile, waves, stages=stages, reduction=red, group_merge=gm, tap_mask=tap)
    if direction == "bwd_weight" and specialization in ("default", "filter3x3", "filter1x1_stride1_pad0"):
        # dy and the tap-shifted x through tensor descriptors (stride 1)
        tmt = tt["tma_tiles"]
        for tile, st, red in itertools.product(_axes(tmt), tmt["stages"], tt["tma_reductions"]):
            for w in (4, 8) if tile[0] * tile[1] >= 128 * 64 else (4,):
                add(tile, (w, 1, 1), stages=st, reduction=red, tma=True)
    if direction != "bwd_data" and specialization in ("default", "filter3x3"):
        # im2col over the flattened (tap, channel) axis (RGB stems: few channels per group)
        for tile, w in tt["flat_gemm_tiles"][direction]:
            for red in tt["flat_gemm_reductions"] if direction == "bwd_weight" else ("atomic",):
                add(tile, (w, 1, 1), reduction=red, flat=True)
    return out


# -- the key space: KernelKeys of the configs above and of CK's tile table ----------------------

OPTIONS = ("directions", "dtypes", "ndims", "layouts", "specializations", "pipelines", "tiles", "split_ks")
def _splits(c: ConvKernelConfig, override) -> tuple:
    """Reduction splits enumerated for ``c`` (``split_ks`` overrides all but stream-K's): per kind,
    CK-space atomic forward / bwd_data, the workspace reductions, bwd_weight's pixel split, stream-K's
    programs per SM, and depthwise bwd_weight's (one program per 16-64 groups: a MobileNet layer,
    G 32-384, fills an H100 only when its pixels are cut in a hundred parts or more)."""
    splits = _triton()["splits"]
    if c.reduction == "streamk":
        return splits["streamk"]
    if c.rows or (c.flat and c.direction != "bwd_weight") or (c.specialization == "depthwise"
                                                              and c.direction != "bwd_weight"):
        return (1,)
    if override:
        return override
    if c.direction == "bwd_weight":
        return splits["depthwise_bwd_weight" if c.specialization == "depthwise"
                      else "flat_bwd_weight" if c.flat else "tma_bwd_weight" if c.tma else "bwd_weight"]
    return splits["atomic" if c.reduction == "atomic" else "workspace"]


def key_space(arch, backend: str, options: dict):
    """The conv kernel space on ``arch`` as a KeySpace (:class:`ck_conv.keyspace.ConvSpace`)."""
    from .keyspace import ConvSpace

    return ConvSpace(arch, backend, options)


def enumerate_keys(arch, backend: str, options: dict) -> list:
    """Every key of :func:`key_space`, listed."""
    return list(key_space(arch, backend, options))


def shortlist(problem, arch, backend: str):
    """Two tiers of keys for ``problem``: its tuning list
    (:func:`ck_conv.heuristics.candidate_configs`: the heuristic pick first, then the classic
    and realisation variants that won on the H100), then the heuristic pick's kernel on
    each tile of CK's table (what a registry of CK's space alone holds).  Each config comes
    with the split that fills ``arch`` (as the launch makes it) and unsplit."""
    if not isinstance(problem, ConvProblem):
        return
    from .heuristics import candidate_configs

    yield _with_splits(candidate_configs(problem, arch=arch), problem, arch, backend)
    yield _with_splits(_ck_table_variants(problem, arch), problem, arch, backend)   # only when the first misses


def _with_splits(cfgs, problem, arch, backend: str) -> list:
    from .heuristics import preferred_split
    from .backends.triton.launch import split_plan

    cus, smem = max(int(arch.compute_units or 1), 1), arch.lds_bytes
    out = []
    for c in cfgs:
        if problem.split_k:
            picks = (c if c.split == problem.split_k else evolved(c, split=problem.split_k),)
        else:
            c1 = c if c.split == 1 else evolved(c, split=1)
            sp = preferred_split(c1, problem, cus, smem)
            if sp > 1 and c1.reduction != "streamk":
                sp = split_plan(c1, problem, sp)[0]   # the parts the launch makes
                sp = _enumerated_split(c1, sp, problem)
            # bwd_weight's tensor-descriptor, flat im2col and depthwise kernels are made to be split:
            # their unsplit twins only fill a few SMs (H100 probe: 0.1-0.3x cuDNN, and a ranker
            # that has not seen them may pick them)
            # (the triton key space holds the splits; other backends' spaces only unsplit keys)
            one = sp != 1 and backend == "triton" and c1.direction == "bwd_weight" and (
                c1.tma or c1.flat or c1.specialization == "depthwise")
            picks = (evolved(c1, split=sp),) if one else (evolved(c1, split=sp), c1) if sp != 1 else (c1,)
        out.extend(key_of(x, arch.name, backend) for x in picks)
    return out


def _enumerated_split(c1: ConvKernelConfig, want: int, problem) -> int:
    """The split nearest ``want`` (log scale; the smaller on a tie) among those the enumeration
    gives ``c1`` (:func:`_splits`) that its launch makes as named on ``problem``; 1 if none.
    The preferred split is any integer (263 parts of a MobileNet layer's pixels), the key space
    holds powers of two: a shortlist naming a split outside it would name no key at all."""
    from .backends.triton.launch import split_plan

    for s in _nearest_first(_splits(c1, ()), want):
        if s == 1 or split_plan(c1, problem, s)[0] == s:
            return s
    return 1


@functools.lru_cache(maxsize=4096)
def _nearest_first(splits: tuple, want: int) -> tuple:
    return tuple(sorted(splits, key=lambda s: (abs(math.log2(s / want)), s)))


def _ck_table_variants(problem, arch) -> list:
    from .heuristics import heuristic_config

    want = heuristic_config(problem)
    facts = conv_facts(arch)
    if want.specialization == "depthwise":
        return [attrs.evolve(want, tile=t) for t in facts["depthwise_tiles"]]
    tiles = facts["tiles"]
    waves = dict.fromkeys((want.waves, (2, 2, 1), (4, 1, 1), (2, 4, 1)))
    return [attrs.evolve(want, tile=tuple(t), waves=w) for t in tiles for w in waves]
