"""The GEMM heuristic: the first pick among the keys that support a problem (before the ranker
and tuned data; see ck_core.dispatcher)."""
from __future__ import annotations


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
        tiles = tiles_m * tiles_n * problem.batch * a.split_k
        waste = (tiles_m * a.tile_m * tiles_n * a.tile_n) / (problem.m * problem.n)
        waves = -(-tiles // cus)
        occupancy = tiles / (waves * cus)
        pad_penalty = 0.01 * (a.pad_m + a.pad_n + a.pad_k)
        # tenths: a few percent of tail effect must not beat a 16x larger (more intense) tile
        return (round(waste / occupancy, 1) + pad_penalty, -a.tile_m * a.tile_n, a.tile_k)

    ranked = sorted(candidates, key=cost)
    if preferred:
        ranked = preferred[:1] + [k for k in ranked if k is not preferred[0]]
    return ranked

