"""CK Tile's GEMM legality rules that depend on the warp size and CK's tile distributions.

Ported from composable_kernel ``tile_engine/ops/gemm/gemm_validation_utils.py``
(``validate_whole_wg_cover_configuration``, ``validate_cshuffle_epilogue_distribution``,
``TRAIT_UNSUPPORTED_COMBINATIONS``) and ``dispatcher/codegen/arch_specs.json``
(``unsupported_trait_combos``).  :func:`ck_gemm.keys.rules_violation` checks
dtypes, warp tiles, wave layouts, tile divisibility and LDS from the arch's
facts; on AMD archs it adds these, the checks it cannot make without the warp
size or CK's load/store tile distributions.
"""
from __future__ import annotations

from functools import lru_cache

from ck_core.dtypes import ELEMENT_BYTES

#: (pipeline, epilogue, scheduler) that CK cannot build: only ``mem`` has an
#: interwave scheduler (arch_specs.json ``unsupported_trait_combos``)
UNSUPPORTED_TRAITS = frozenset({
    ("compv3", "cshuffle", "interwave"), ("compv3", "default", "interwave"),
    ("compv4", "cshuffle", "interwave"), ("compv4", "default", "interwave"),
    ("compv5", "cshuffle", "interwave"), ("compv5", "default", "interwave"),
    ("compv6", "cshuffle", "interwave"), ("compv6", "default", "interwave"),
})


def _vector_load(block_size: int, k_per_block: int, eb: int, mn_per_block: int, x_per_tile: int) -> int:
    """Elements per global load (CK ``get_global_vector_load_size``): 16 or 8 bytes, else 1 element."""
    per_thread = mn_per_block * k_per_block / block_size
    for nbytes in (16, 8):
        vec = nbytes // eb
        if x_per_tile % vec == 0 and per_thread % vec == 0:
            return vec
    # CK's 4- and 2-byte branches only fire for elements at least that wide,
    # where they give one element per load
    return 1


def _covers_wave(x_per_tile: int, y_per_tile: int, block_size: int, vec: int, warp_size: int) -> bool:
    """CK ``wg_cover_core_validation``: one wave's lanes tile X exactly (``X0 * Y1 == warp_size``)."""
    if x_per_tile % vec:
        return False
    largest_vec = (x_per_tile * y_per_tile) / block_size
    x1 = largest_vec if vec > largest_vec else vec
    x0 = x_per_tile / x1
    y1 = warp_size // x0
    return x0 * y1 == warp_size


@lru_cache(maxsize=65536)
def load_cover_violation(warp_size, tile_m, tile_n, tile_k, warps, layout, eb_a, eb_b):
    """Why the A/B global-load distribution does not cover whole waves, or None."""
    bs = warps * warp_size
    if layout[0] == "r":
        vec = _vector_load(bs, tile_k, eb_a, tile_m, tile_k)
        x, y = tile_k, tile_m
    else:
        vec = _vector_load(bs, tile_k, eb_a, tile_m, tile_m)
        if not _covers_wave(tile_k, tile_m, bs, vec, warp_size):
            return "A (column-major) load distribution does not cover a whole wave"
        x, y = tile_m, tile_k
    if not _covers_wave(x, y, bs, vec, warp_size):
        return "A load distribution does not cover a whole wave"
    if layout[1] == "r":
        vec = _vector_load(bs, tile_k, eb_b, tile_n, tile_n)
        if not _covers_wave(tile_k, tile_n, bs, vec, warp_size):
            return "B (row-major) load distribution does not cover a whole wave"
        x, y = tile_n, tile_k
    else:
        vec = _vector_load(bs, tile_k, eb_b, tile_n, tile_k)
        x, y = tile_k, tile_n
    if not _covers_wave(x, y, bs, vec, warp_size):
        return "B load distribution does not cover a whole wave"
    return None


@lru_cache(maxsize=65536)
def cshuffle_violation(warp_size, tile_m, tile_n, warp_m, warps, eb_c):
    """CK's CShuffleEpilogue static_assert ``X0 * Y1 == warp_size``, or None."""
    vec = 16 // eb_c
    x, y = tile_n, tile_m // warp_m
    largest_vec = max((x * y) // (warps * warp_size), 1)
    x1 = max(min(vec, largest_vec), 1)
    x0 = min(warp_size, x // x1)
    y1 = warp_size // x0 if x0 else 0
    if x0 * y1 != warp_size:
        return (f"cshuffle epilogue: {x0} x {y1} lanes do not cover a {warp_size}-lane wave "
                f"for a {tile_m}x{tile_n} C tile on {warps} waves")
    return None


def violation(sig, a, arch_name: str, warp_size: int) -> str | None:
    """Why CK Tile cannot build GEMM ``(sig, a)`` on ``arch_name`` (``warp_size``-lane waves), or None.

    Checks, in order: CK's trait table, the A/B load cover (depends on the
    layout), the cshuffle epilogue's store distribution.
    """
    if (a.pipeline, a.epilogue, a.scheduler) in UNSUPPORTED_TRAITS:
        return (f"CK has no {a.pipeline} pipeline with the {a.scheduler} scheduler "
                f"(only mem is interwave)")
    warps = a.warp_m * a.warp_n * a.warp_k
    eb = ELEMENT_BYTES[sig.dtype]
    why = load_cover_violation(warp_size, a.tile_m, a.tile_n, a.tile_k, warps, sig.layout, eb, eb)
    if why:
        return f"{why} ({warp_size}-lane waves on {arch_name})"
    if a.epilogue == "cshuffle":
        why = cshuffle_violation(warp_size, a.tile_m, a.tile_n, a.warp_m, warps, ELEMENT_BYTES[sig.dtype_c])
        if why:
            return f"{why} ({arch_name})"
    return None
