"""The GEMM heuristic: the first pick among the keys that support a problem where no tuned entry
or learned ranker decides (see ck_core.dispatcher): no model for the arch, or a problem outside
the model's training domain (very large N or FLOPs, tiny problems).

Checked offline against the recorded H100 oracle (every registry key timed on 672 shapes,
benchmarks/results/selection/gemm_sm90.jsonl.gz): the geomean of best / picked went 0.452 ->
0.574 with the rules marked 2026-11-27 below (LLM layers 0.884 -> 0.913, odd 0.25 -> 0.52,
skinny 0.833 -> 0.843, batched 0.198 -> 0.221).

The plugin's one reader of its tuned data: ``ck_gemm/tuned/<arch>.json`` (read through
:mod:`ck_core.tuned_data`, overlaid by the user's store) holds the winners of the arch's sweep in
its ``kernels`` table (the Dispatcher's store: one entry per problem bucket with the kernel, its
Triton config, the measured shape and TFLOPS) and the learned ranker.  :func:`pick_config` returns the row
nearest to the problem in log2(M, N, K) space (M weighted most: it decides between skinny and
square kernels), preferring the same dtype and layout, else a size heuristic; :func:`tuned_keys`
adds the winners to the registry (the plugin passes it to the space and the legality check).
"""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path

from ck_core.dtypes import ELEMENT_BYTES
from ck_core.errors import ConfigError, InvalidProblem
from ck_core.key import KernelKey
from ck_core.plugins import get_manager
from ck_core.tuned_data import Table, table

from .backends.triton.configs import GemmConfig, config_of_algorithm
from .keys import STREAMK_VARIANTS, GemmSignature, legal as _legal
from .space import algorithm_for_config, enumerate_keys as _enumerate_keys

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
        want = pick_config(problem.m, problem.n, problem.k, problem.dtype, arch.name,
                           layout=problem.layout, batch=problem.batch)
        if not (stream_b and want.block_m < problem.m):
            preferred = [k for k in candidates if config_of_algorithm(k.algorithm) == want]

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


# -- tuned data ------------------------------------------------------------------------------

TUNED_DIR = str(Path(__file__).resolve().parent / "tuned")
#: dtypes whose tuned configs transfer to each other (same element size, same MMA path)
_SIBLINGS = {"fp16": ("bf16",), "bf16": ("fp16",), "fp8": ("bf8",), "bf8": ("fp8",)}


def load_table(arch: str = "sm90") -> tuple:
    """``(dtype, layout, M, N, K, GemmConfig)`` rows of the arch's measured winners (empty: none).

    They are the ``kernels`` table's entries (the Dispatcher's store of winners per problem bucket)
    that name a Triton config: the shipped sweep's, at the shape each was measured on (``shape``;
    the bucket's own sizes where an entry has none).  Winners ``ck tune`` recorded name a kernel
    only: the Dispatcher's store serves those directly."""
    return _rows(table("gemm", arch, "kernels", TUNED_DIR))


@functools.lru_cache(maxsize=8)
def _rows(t: Table) -> tuple:
    # keyed by the store's Table object: parsed once per load of the data files
    rows = []
    for key, v in t.items():
        if not (isinstance(v, dict) and "config" in v):
            continue
        try:
            backend, bucket = key
            b = json.loads(bucket)
            dtype, layout = b[0], b[2]
            m, n, k = (int(x) for x in (v.get("shape") or b[-3:]))
            cfg = GemmConfig.from_name(v["config"])
            if not all(1 <= x <= 1 << 31 for x in (m, n, k)):
                raise ValueError(f"shape {m}x{n}x{k} is not three positive sizes")
            for f, hi in (("block_m", 512), ("block_n", 512), ("block_k", 512), ("group_m", 64),
                          ("num_warps", 32), ("num_stages", 8), ("split_k", 64)):
                if getattr(cfg, f) > hi:
                    raise ValueError(f"config {v['config'][:60]!r}: {f} {getattr(cfg, f)} is above {hi}")
            rows.append((dtype, layout, m, n, k, cfg))
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, RecursionError, InvalidProblem) as e:
            raise ConfigError(f"gemm tuned data {t.file_of(key)}: bad kernels entry "
                              f"{list(key) if isinstance(key, tuple) else key} -> {v!r}: {e}") from None
    return tuple(sorted(rows, key=lambda r: r[:5]))


@functools.lru_cache(maxsize=None)
def _has_tma(arch: str) -> bool:
    spec = get_manager().archs().get(arch)
    return bool(spec is not None and spec.extras.get("nvidia", {}).get("tma"))


def heuristic_config(M: int, N: int, K: int, dtype: str = "fp16", arch: str = "generic") -> GemmConfig:
    """A reasonable config without a table: small tiles for small problems (TMA forms where the
    arch plugin's ArchSpec says the arch has the tensor-memory accelerator)."""
    hopper = _has_tma(arch)
    if M <= 32:
        sk = 1 if N * K < (1 << 22) else max(1, min(8, K // 1024))
        return GemmConfig(block_m=16 if M <= 16 else 32, block_n=64, block_k=128, group_m=1, num_warps=4,
                          num_stages=4, variant="plain", split_k=sk)
    if M <= 128 or N <= 128:
        return GemmConfig(64, 128, 64, 8, 4, 4, "tma" if hopper else "plain", 1)
    if hopper:
        return GemmConfig(128, 256, 64, 8, 8, 3, "tma_persistent", 1)
    return GemmConfig(128, 128, 64, 8, 4, 3, "plain", 1)


def pick_config(M: int, N: int, K: int, dtype: str = "fp16", arch: str = "sm90", *, layout: str = "rcr",
                batch: int = 1) -> GemmConfig:
    """Best known config for an M x N x K ``dtype`` GEMM on ``arch``.

    Nearest tuned row (dtype, then sibling dtype; same layout preferred) by a
    weighted log2 distance; the heuristic when the arch has no table or no row
    lies within a factor of 4 per dimension.
    """
    for x, n in ((M, "M"), (N, "N"), (K, "K")):
        if x < 1:
            raise InvalidProblem(f"pick_config: {n}={x} must be positive")
    rows = load_table(arch)
    if not rows:
        return heuristic_config(M, N, K, dtype, arch)
    lm, ln, lk = (math.log2(x) for x in (M, N, K))
    best, best_d = None, None
    # own dtype, then its sibling, then (8-bit floats) the 16-bit rows at twice the K tile: the
    # same bytes a pipeline stage and the same C tile (space.tuned_keys adds those keys)
    tiers = (((dtype,), 0.0, 1), (_SIBLINGS.get(dtype, ()), 0.25, 1),
             (("bf16", "fp16") if dtype in ("fp8", "bf8") else (), 0.5, 2))
    for dts, penalty, k_scale in tiers:
        for (dt, lay, m, n, k, cfg) in rows:
            if dt not in dts:
                continue
            d = (2.0 * abs(lm - math.log2(m)) + abs(ln - math.log2(n)) + abs(lk - math.log2(k))
                 + penalty + (0.0 if lay == layout else 0.5))
            if best_d is None or d < best_d:
                best, best_d = (cfg if k_scale == 1 else cfg.evolve(block_k=cfg.block_k * k_scale)), d
        if best is not None:
            break
    if best is None or best_d > 6.0:
        return heuristic_config(M, N, K, dtype, arch)
    return best


def tuned_keys(arch, backend, dtypes, layouts) -> list:
    """The measured winners of the arch's tuning table (so the registry holds them)."""
    out = []
    pipeline = (arch.pipelines or ("compv3",))[0]
    for dt, _lay, _m, _n, _k, cfg in load_table(arch.name):
        for dtype in (d for d in dtypes if d == dt or {d, dt} <= {"fp16", "bf16"}):
            for lay in layouts:
                alg = algorithm_for_config(cfg, arch, dtype, pipeline, lay)
                if alg is not None:
                    out.append(KernelKey("gemm", GemmSignature(dtype, lay), alg, arch.name, backend))
        # 8-bit floats: the 16-bit winners' persistent TMA kernels at twice the K tile (the same
        # bytes a stage, the same tile of C), where the table has no row of their own
        if dt in ("fp16", "bf16") and "persistent" in cfg.variant and cfg.is_tma:
            for dtype in (d for d in dtypes if d in ("fp8", "bf8") and d in arch.dtypes
                          and not any(r[0] == d for r in load_table(arch.name))):
                for lay in layouts:
                    alg = algorithm_for_config(cfg.evolve(block_k=2 * cfg.block_k), arch, dtype, pipeline, lay)
                    if alg is not None:
                        out.append(KernelKey("gemm", GemmSignature(dtype, lay), alg, arch.name, backend))
    return list(dict.fromkeys(out))


def enumerate_keys(arch, backend: str, options: dict) -> list[KernelKey]:
    """The registry's keys: the space's CK-style keys and, on triton, the arch's measured winners."""
    return _enumerate_keys(arch, backend, options, tuned=tuned_keys)


def legal(key: KernelKey, arch) -> str | None:
    """:func:`ck_gemm.keys.legal`, with the arch's measured winners legal whatever the Triton
    shared-memory model says (they ran)."""
    return _legal(key, arch, tuned=tuned_keys)
