"""07 -- stress test: 48 distinct kernels, each validated on its own problem and seed.

    python examples/gemm/07_stress_test.py [--backend numpy|triton] [--kernels 48]
Each kernel gets a one-kernel registry, so the dispatcher has to run exactly that kernel.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common as ex  # noqa: E402

import numpy as np  # noqa: E402

from ck_core import Dispatcher, Registry  # noqa: E402
from ck_gemm import GemmProblem  # noqa: E402

args = ex.parse_args(__doc__, lambda p: p.add_argument("--kernels", type=int, default=48))
everything = list(Registry.from_enumeration("gemm", args.arch, args.backend, dtypes=["fp16"], layouts=["rcr"]))
# spread the picks over the whole space: tiles, pipelines, schedulers, padding
step = max(1, len(everything) // args.kernels)
picks = everything[::step][: args.kernels]
print(f"{len(picks)} of {len(everything)} fp16 rcr kernels")
ex.table(ex.gemm_config_rows(picks), ["#", "tile", "wave", "warp", "pipeline", "scheduler", "pad"])
failed = 0
for i, key in enumerate(picks):
    a = key.algorithm
    # a problem this kernel can run: whole tiles when it does not pad, ragged ones when it does
    m = a.tile_m * (1 + i % 2) - (7 if a.pad_m else 0)
    n = a.tile_n - (5 if a.pad_n else 0)
    k = a.tile_k * a.split_k * 2 - (3 if a.pad_k else 0)
    p = GemmProblem(m=m, n=n, k=k, dtype="fp16", layout="rcr")
    disp = Dispatcher(Registry(args.arch, [key], name=f"k{i}"), backend=args.backend)
    ok = ex.check(disp, p, np.random.default_rng(42 + i), label=f"kernel {i + 1:2d} {m}x{n}x{k}",
                  show_plan=False)
    failed += not ok
print(f"{len(picks) - failed}/{len(picks)} kernels passed")
ex.finish(failed == 0 and len(picks) > 0)
