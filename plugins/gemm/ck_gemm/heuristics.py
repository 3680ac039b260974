"""The GEMM heuristic: the first pick among the keys that support a problem where no tuned entry
or learned ranker decides (see ck_core.dispatcher): no model for the arch, or a problem outside
the model's training domain (very large N or FLOPs, tiny problems).

Checked offline against the recorded H100 oracle (every registry key timed on 672 shapes,
benchmarks/results/selection/gemm_sm90.jsonl.gz): the geomean of best / picked went 0.452 ->
0.574 with the rules marked 2026-11-27 below (LLM layers 0.884 -> 0.913, odd 0.25 -> 0.52,
skinny 0.833 -> 0.843, batched 0.198 -> 0.221)."""
from __future__ import annotations

from ck_core.dtypes import ELEMENT_BYTES

from .keys import STREAMK_VARIANTS

#: rows of a warpgroup's MMA tile (wgmma m64): the smallest tile that streams B once for M <= 64;
#: up to one mma.sync tile of rows (16) the short tiles read B once too
_WG_ROWS = 64
_MMA_SYNC_ROWS = 16
_SPLIT_AREA = 64 * 64
_WIDE_K_BYTES = 256


def heuristic(problem, candidates: list, arch) -> list:
    """First pick: least padded work, then enough tiles to fill the machine, then bigger tiles.

    On the triton backend the arch's tuning table (nearest measured shape) goes first, except
    (2026-11-27) where its tile would stream a skinny problem's B from HBM more than once.
    """
    cus = max(arch.compute_units, 1)
    # a skinny problem (M within one warpgroup MMA tile) whose B does not fit the arch's L2: every
    # extra M tile streams B from HBM again, so one tile of >= M rows beats several short ones
    l2 = (arch.extras.get("memory") or {}).get("l2_bytes")
    b_bytes = problem.batch * problem.k * problem.n * ELEMENT_BYTES[problem.dtype]
    stream_b = bool(l2) and _MMA_SYNC_ROWS < problem.m <= _WG_ROWS and b_bytes > l2
    preferred = None
    if candidates and candidates[0].backend == "triton":
        try:
            from .backends.triton.tuning import pick_config
            from .backends.triton.keys import config_of
            want = pick_config(problem.m, problem.n, problem.k, problem.dtype, arch.name,
                               layout=problem.layout, batch=problem.batch)
            if not (stream_b and want.block_m < problem.m):
                preferred = [k for k in candidates if config_of(k) == want]
        except ImportError:
            preferred = None

    eb = ELEMENT_BYTES[problem.dtype]

    def cost(key):
        a = key.algorithm
        tiles_m = -(-problem.m // a.tile_m)
        tiles_n = -(-problem.n // a.tile_n)
        # the splits that get K steps at all (a K of fewer tiles than splits leaves some empty)
        k_tiles = -(-problem.k // a.tile_k)
        split = -(-k_tiles // -(-k_tiles // a.split_k))
        tiles = tiles_m * tiles_n * problem.batch * split
        waste = (tiles_m * a.tile_m * tiles_n * a.tile_n) / (problem.m * problem.n)
        if stream_b:
            # bandwidth-bound: padding up to a warpgroup's rows costs nothing, rows past it do,
            # and each M tile reads B from HBM once more
            waste = tiles_m * max(1.0, a.tile_m / _WG_ROWS) * (tiles_n * a.tile_n) / problem.n
        waves = -(-tiles // cus)
        occupancy = tiles / (waves * cus)
        pad_penalty = 0.01 * (a.pad_m + a.pad_n + a.pad_k)
        # a 512-byte K tile through unvectorised pointer loads (K rows not 16-byte aligned):
        # 10-100x slower than its 128-wide twin on the H100 (probe 2026-11-27: 16x64x256 on
        # 200x4144x1430 1.28 ms, 92x7x1413 103 us vs 12 us for 16x64x128): after every other
        pathological = a.tile_k * eb > _WIDE_K_BYTES and a.variant in ("tile", "persistent") \
            and bool(problem.k * eb % 16)
        if split > 1 and a.tile_m * a.tile_n > _SPLIT_AREA:
            # split-K on tiles past 64x64: erratic in the H100 oracle (benchmarks/results/
            # selection/gemm_sm90.jsonl.gz: 0.07-0.9 of the best on skinny shapes where the 64x64
            # split keys hold 0.9+; cause not found, see backends/triton/NOTES.md)
            pad_penalty += 1.0
        # tenths: a few percent of tail effect must not beat a 16x larger (more intense) tile.
        # Ties: one launch before a split-K pair; stream-K keys after their data-parallel twins
        # (this estimate does not see what stream-K balances); pointer loads beside a full
        # register file of accumulators (128 a thread) after their descriptor twins (they spill:
        # H100 oracle, 64x256 on 4 warps 0.29 pointer / 0.66 TMA of the best)
        heavy_ptr = a.variant in ("tile", "persistent", "streamk") and \
            a.tile_m * a.tile_n >= 128 * 32 * a.num_warps
        return (pathological, round(waste / occupancy, 1) + pad_penalty, a.variant in STREAMK_VARIANTS,
                split > 1, heavy_ptr, -a.tile_m * a.tile_n, a.tile_k)

    ranked = sorted(candidates, key=cost)
    if preferred and cost(preferred[0])[0]:
        preferred = None   # a tuned key on a problem its kernel handles pathologically
    if preferred:
        ranked = preferred[:1] + [k for k in ranked if k is not preferred[0]]
    return ranked

