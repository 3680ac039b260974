"""The GEMM heuristic: the first pick among the keys that support a problem (before the ranker
and tuned data; see ck_core.dispatcher)."""
from __future__ import annotations

from .keys import STREAMK_VARIANTS


def heuristic(problem, candidates: list, arch) -> list:
    """First pick: least padded work, then enough tiles to fill the machine, then bigger tiles.

    On the triton backend the arch's tuning table (nearest measured shape) goes first.
    """
    cus = max(arch.compute_units, 1)
    preferred = None
    if candidates and candidates[0].backend == "triton":
        try:
            from .backends.triton.tuning import pick_config
            from .backends.triton.keys import config_of
            want = pick_config(problem.m, problem.n, problem.k, problem.dtype, arch.name,
                               layout=problem.layout, batch=problem.batch)
            preferred = [k for k in candidates if config_of(k) == want]
        except ImportError:
            preferred = None

    def cost(key):
        a = key.algorithm
        tiles_m = -(-problem.m // a.tile_m)
        tiles_n = -(-problem.n // a.tile_n)
        # the splits that get K steps at all (a K of fewer tiles than splits leaves some empty)
        k_tiles = -(-problem.k // a.tile_k)
        split = -(-k_tiles // -(-k_tiles // a.split_k))
        tiles = tiles_m * tiles_n * problem.batch * split
        waste = (tiles_m * a.tile_m * tiles_n * a.tile_n) / (problem.m * problem.n)
        waves = -(-tiles // cus)
        occupancy = tiles / (waves * cus)
        pad_penalty = 0.01 * (a.pad_m + a.pad_n + a.pad_k)
        # tenths: a few percent of tail effect must not beat a 16x larger (more intense) tile
        # ties: one launch before a split-K pair; stream-K keys after their data-parallel twins
        # (this estimate does not see what stream-K balances: the ranker and the rule below do)
        return (round(waste / occupancy, 1) + pad_penalty, a.variant in STREAMK_VARIANTS, split > 1,
                -a.tile_m * a.tile_n, a.tile_k)

    ranked = sorted(candidates, key=cost)
    if preferred:
        ranked = preferred[:1] + [k for k in ranked if k is not preferred[0]]
    return ranked

