"""Per-arch tuned configs and the selection function.

``ck_gemm/tuned/<arch>.json`` (read through :mod:`ck_core.tuned_data`, overlaid
by the user's store) holds the winners of the arch's sweep
(benchmarks/gemm_triton_bench.py --tune) in its ``winners`` table: one entry per
(dtype, layout, M, N, K) with the config name and its measured TFLOPS.
:func:`pick_config` returns the row nearest to the problem in log2(M, N, K)
space (M weighted most: it decides between skinny and square kernels),
preferring the same dtype and layout, else a size heuristic.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path

from ck_core.errors import ConfigError, InvalidProblem
from ck_core.tuned_data import Table, table

from .configs import GemmConfig

TUNED_DIR = str(Path(__file__).resolve().parent.parent.parent / "tuned")
#: dtypes whose tuned configs transfer to each other (same element size, same MMA path)
_SIBLINGS = {"fp16": ("bf16",), "bf16": ("fp16",), "fp8": ("bf8",), "bf8": ("fp8",)}


def load_table(arch: str = "sm90") -> tuple:
    """``(dtype, layout, M, N, K, GemmConfig)`` rows of the arch's ``winners`` table (empty: none)."""
    return _rows(table("gemm", arch, "winners", TUNED_DIR, check=check_winner))


def check_winner(key, v) -> None:
    """One ``winners`` record: key (dtype, layout, M, N, K), value {"config": a GemmConfig name, ...}."""
    if len(key) != 5 or not all(isinstance(x, str) for x in key[:2]) \
            or not all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 1 << 31 for x in key[2:]):
        raise ValueError("the key is [dtype, layout, M, N, K] with positive sizes")
    if not isinstance(v, dict) or not isinstance(v.get("config"), str):
        raise ValueError("the value is {\"config\": a config name, ...}")
    for f in ("tflops", "peer_tflops"):
        x = v.get(f)
        if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 <= x < 1e6):
            raise ValueError(f"{f} {x!r:.40} is not a number >= 0")
    c = GemmConfig.from_name(v["config"])
    for f, hi in (("block_m", 512), ("block_n", 512), ("block_k", 512), ("group_m", 64), ("num_warps", 32),
                  ("num_stages", 8), ("split_k", 64)):
        if getattr(c, f) > hi:
            raise ValueError(f"config {v['config'][:60]!r}: {f} {getattr(c, f)} is above {hi}")


@functools.lru_cache(maxsize=8)
def _rows(t: Table) -> tuple:
    # keyed by the store's Table object: parsed once per load of the data files
    rows = []
    for key, v in t.items():
        try:
            dtype, layout, m, n, k = key
            rows.append((dtype, layout, int(m), int(n), int(k), GemmConfig.from_name(v["config"])))
        except (KeyError, TypeError, ValueError, InvalidProblem) as e:
            raise ConfigError(f"gemm tuned data ({t.provenance.get('source', '?')}): bad winners entry "
                              f"{list(key)} -> {v!r}: {e}") from None
    return tuple(rows)


def shape_bucket(M: int, N: int, K: int) -> tuple:
    """Power-of-two bucket of a shape (how the tuning table is keyed)."""
    return tuple(1 << max(0, math.ceil(math.log2(max(x, 1)))) for x in (M, N, K))


def heuristic_config(M: int, N: int, K: int, dtype: str = "fp16", arch: str = "generic") -> GemmConfig:
    """A reasonable config without a table: small tiles for small problems."""
    hopper = arch == "sm90"
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
