"""01 -- basic GEMM: a registry of a few kernels, their config table, dispatched runs.

    python examples/gemm/01_basic_gemm.py [--backend numpy|triton]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common as ex  # noqa: E402

from ck_core import Dispatcher, Registry  # noqa: E402
from ck_gemm import GemmProblem  # noqa: E402

args = ex.parse_args(__doc__)
# every legal fp16 rcr kernel of the arch, narrowed to a handful of 128/256 tiles
reg = Registry.from_enumeration("gemm", args.arch, args.backend, dtypes=["fp16"], layouts=["rcr"])
reg = reg.filter("c.tile_m in (128, 256) and c.tile_n in (128, 256) and c.split_k == 1")
# three kernels that pad M, N and K (they run any size) and three that do not, spread over the space
padded = [k for k in reg if k.algorithm.pad_m and k.algorithm.pad_n and k.algorithm.pad_k]
plain = [k for k in reg if k not in set(padded)]
share = {id(padded): 3 if plain else 6, id(plain): 3 if padded else 6}
keys = [k for group in (padded, plain) for k in group[:: max(1, len(group) // share[id(group)])][:share[id(group)]]]
reg = Registry(args.arch, keys, name="basic")
print(f"{len(reg)} kernels:")
ex.table(ex.gemm_config_rows(reg), ["#", "tile", "wave", "warp", "pipeline", "scheduler", "pad"])

disp = Dispatcher(reg, backend=args.backend)
ok = True
for m, n, k in [(256, 256, 128), (200, 130, 72), (64, 512, 96)]:
    p = GemmProblem(m=m, n=n, k=k, dtype="fp16", layout="rcr")
    ok &= ex.check(disp, p, args.rng, label=f"{m}x{n}x{k}")
ex.finish(ok)
