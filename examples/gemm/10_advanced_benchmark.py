"""10 -- advanced benchmark: several kernels on one problem, full control of warm-up and iterations.

    python examples/gemm/10_advanced_benchmark.py [--backend numpy|triton] [--top 4] [--warmup 2] [--iters 5]
Times every one of the heuristic's first N candidates (as `ck tune` does) and reports
min/median/mean/stdev/p90 and TFLOPS per kernel; every timed kernel is validated.
"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common as ex  # noqa: E402

import numpy as np  # noqa: E402

from ck_core import Dispatcher, Registry  # noqa: E402
from ck_gemm import GemmProblem  # noqa: E402

args = ex.parse_args(__doc__, lambda p: (p.add_argument("--top", type=int, default=4),
                                         p.add_argument("--warmup", type=int, default=2),
                                         p.add_argument("--iters", type=int, default=5)))
full = Registry.from_enumeration("gemm", args.arch, args.backend, dtypes=["fp16"], layouts=["rcr"])
m, n, k = (2048, 2048, 2048) if args.gpu else (192, 160, 128)
p = GemmProblem(m=m, n=n, k=k, dtype="fp16", layout="rcr")
ranked = Dispatcher(full, backend=args.backend).rank(p)[: args.top]
op = full.mgr.op("gemm")
rows, ok = [], True
for key in ranked:
    disp = Dispatcher(Registry(args.arch, [key]), backend=args.backend)
    ok &= ex.check(disp, p, args.rng, label=key.name, show_plan=False)
    bk = disp.backend_spec
    inputs = {n_: bk.to_backend(v) for n_, v in op.make_inputs(p, args.rng).items()}
    for _ in range(args.warmup):
        disp.run(p, **inputs)
    t = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        disp.run(p, **inputs)
        if bk.synchronize:
            bk.synchronize()
        t.append(time.perf_counter() - t0)
    med = statistics.median(t)
    rows.append({"kernel": key.name[:60], "min ms": f"{min(t) * 1e3:.3f}", "median ms": f"{med * 1e3:.3f}",
                 "mean ms": f"{statistics.mean(t) * 1e3:.3f}",
                 "stdev ms": f"{(statistics.stdev(t) if len(t) > 1 else 0) * 1e3:.3f}",
                 "p90 ms": f"{np.percentile(t, 90) * 1e3:.3f}", "TFLOPS": f"{p.flops() / med / 1e12:.4f}"})
print(f"problem {m}x{n}x{k} fp16 rcr, {args.warmup} warm-up + {args.iters} timed iterations each")
ex.table(rows, list(rows[0]))
ex.finish(ok)
