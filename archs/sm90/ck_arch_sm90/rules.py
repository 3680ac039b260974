"""Hopper's GEMM rules: how wgmma lays out over a block, and the register file.

Each rule is ``rule(key) -> str | None`` and reads only the public KernelKey
(``op``, and the names ``key.fields`` lists, taken from ``key.signature`` /
``key.algorithm``).  The shapes follow Triton 3.6's MMAv3 lowering
(``warpsPerTileV3``, ``mmaVersionToInstrShape``), which is how these keys run
on an H100, and the PTX rules behind it.
"""
from __future__ import annotations

from functools import lru_cache

from .facts import MMA_SYNC

#: accumulators (fp32 / int32, one register each) a thread may hold: wgmma
#: keeps the whole C tile in registers and a thread has 255; past 128 the
#: operand addresses and epilogue no longer fit and the kernel spills
MAX_ACC_REGS = 128

#: N of a wgmma instruction that Triton tries, widest first (PTX: n8..n256 step 8;
#: for s8 inputs N stops at 224 and goes in steps of 16 above 32)
_N_FLOAT = tuple(range(256, 0, -8))
_N_INT8 = (224, 208, 192, 176, 160, 144, 128, 112, 96, 80, 64, 48, 32, 24, 16, 8)


@lru_cache(maxsize=4096)
def warpgroup_layout(tile_m: int, warps: int) -> tuple:
    """(warp_m, warp_n) of a wgmma block: warpgroups (4 x 1 warps) stack along M while rows remain."""
    wm, wn = 4, 1
    while wm * wn < warps:
        if tile_m > 16 * wm:
            wm *= 2
        else:
            wn *= 2
    return wm, wn


@lru_cache(maxsize=4096)
def wgmma_n(dtype: str, tile_m: int, tile_n: int, warps: int) -> int:
    """The N of the wgmma each warpgroup issues: the widest that divides its share of tile N."""
    m_warps = max(tile_m // 16, 1)
    n_warps = max(warps // m_warps, 1)
    max_n = max(tile_n // n_warps, 8)
    for n in (_N_INT8 if dtype == "int8" else _N_FLOAT):
        if tile_n % n == 0 and n <= max_n:
            return n
    return 8


def accumulator_registers(key):
    """Reject C tiles whose fp32/int32 accumulators overflow a thread's registers."""
    if key.op != "gemm":
        return None
    a = key.algorithm
    threads = a.warp_m * a.warp_n * a.warp_k * 32
    acc = a.tile_m * a.tile_n // threads
    if acc > MAX_ACC_REGS:
        return (f"a {a.tile_m}x{a.tile_n} C tile on {threads} threads needs {acc} accumulator "
                f"registers per thread; sm90 allows {MAX_ACC_REGS} of its 255 before spilling")
    return None


def wgmma_shape(key):
    """Match the warp tile and wave layout to the instruction Hopper issues for the block.

    A block of whole warpgroups whose tile M is a multiple of 64 runs wgmma
    (mma.sync only where it cannot), its warpgroups placed as Triton places
    them, each issuing one wgmma as wide as its share of tile N.  So every
    (tile, warps) has one legal (wave layout, warp tile) and no two keys
    describe the same kernel.
    """
    if key.op != "gemm":
        return None
    s, a = key.signature, key.algorithm
    warps = a.warp_m * a.warp_n * a.warp_k
    wgmma_ok = warps % 4 == 0 and a.tile_m % 64 == 0
    if (a.warp_tile_m, a.warp_tile_n, a.warp_tile_k) == MMA_SYNC.get(s.dtype):
        if wgmma_ok:
            return (f"mma.sync tile on a {a.tile_m}-row block of {warps} warps: sm90 issues wgmma "
                    f"there (tile M % 64 == 0, whole warpgroups)")
        return None
    if not wgmma_ok:
        return (f"wgmma needs whole warpgroups (warps % 4 == 0, not {warps}) and tile M a "
                f"multiple of 64 (not {a.tile_m})")
    if a.warp_k != 1:
        return "wgmma blocks do not split K across warps (warp_k must be 1)"
    layout = warpgroup_layout(a.tile_m, warps)
    if (a.warp_m, a.warp_n) != layout:
        return (f"{warps} warps on a {a.tile_m}-row tile form a {layout[0]}x{layout[1]}x1 "
                f"wave layout (warpgroups stack along M), not {a.warp_m}x{a.warp_n}x{a.warp_k}")
    n = wgmma_n(s.dtype, a.tile_m, a.tile_n, warps)
    if a.warp_tile_n != n:
        return (f"each warpgroup issues m64n{n} wgmma for a {a.tile_m}x{a.tile_n} tile on "
                f"{warps} warps, not n{a.warp_tile_n}")
    return None


# both read GEMM keys only: other ops' enumerations skip them (ArchSpec.rules_for)
accumulator_registers.ops = wgmma_shape.ops = ("gemm",)
RULES = (accumulator_registers, wgmma_shape)
