"""08 -- heuristic strategies: kernel pools chosen by problem size or by bound, and the built-in heuristic.

    python examples/gemm/08_heuristics.py [--backend numpy|triton]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common as ex  # noqa: E402

from ck_core import Dispatcher, Registry  # noqa: E402
from ck_gemm import GemmProblem  # noqa: E402

args = ex.parse_args(__doc__)
full = Registry.from_enumeration("gemm", args.arch, args.backend, dtypes=["fp16"], layouts=["rcr"])
POOLS = {
    "small": full.filter("c.tile_m <= 64 and c.tile_n <= 128 and c.pad_m and c.pad_n and c.pad_k"),
    "large": full.filter("c.tile_m >= 128 and c.tile_n >= 128 and c.pad_m and c.pad_n and c.pad_k"),
    "compute": full.filter("c.tile_m * c.tile_n >= 128 * 128 and c.pad_m and c.pad_n and c.pad_k"),
    "memory": full.filter("c.tile_m * c.tile_n <= 64 * 128 and c.pad_m and c.pad_n and c.pad_k"),
}
for name, pool in POOLS.items():
    print(f"pool {name:8s}: {len(pool)} kernels")


def size_based(p):
    return POOLS["small"] if p.m * p.n < 512 * 512 else POOLS["large"]


def bound_based(p):
    intensity = p.flops() / p.bytes_moved()  # flops per byte
    return POOLS["compute"] if intensity > 64 else POOLS["memory"]


def builtin(p):
    return full  # the op plugin's heuristic ranks the whole space


sizes = [(100, 90, 60), (520, 600, 130)] if not args.gpu else [(256, 256, 256), (2048, 2048, 2048)]
ok = True
for strategy in (size_based, bound_based, builtin):
    for m, n, k in sizes:
        p = GemmProblem(m=m, n=n, k=k, dtype="fp16", layout="rcr")
        reg = strategy(p)
        disp = Dispatcher(reg, backend=args.backend)
        ok &= ex.check(disp, p, args.rng, label=f"{strategy.__name__} {m}x{n}x{k} ({len(reg)} kernels)")
ex.finish(ok)
