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

import itertools
import logging

from . import keys as K
from .keys import ConvKernelConfig, conv_facts, cull_reason
from .problem import DIRECTIONS, DTYPES

log = logging.getLogger(__name__)

#: split reductions that are not CK's atomic one
REDUCTIONS = ("relaxed", "twostage", "fixup", "atomicfix", "streamk")


def _axes(t: dict) -> tuple:
    return tuple(itertools.product(t["m"], t["n"], t["k"]))


def _triton() -> dict:
    return conv_facts()["triton"]


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


