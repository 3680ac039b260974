"""03 -- benchmark: warm-up, timed iterations, mean/median/stdev, TFLOPS.

    python examples/gemm/03_benchmark.py [--backend numpy|triton] [--iters N]
On the numpy backend the times are the host reference's, not a GPU's.
"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common as ex  # noqa: E402

from ck_gemm import GemmProblem  # noqa: E402

args = ex.parse_args(__doc__, lambda p: (p.add_argument("--warmup", type=int, default=2),
                                         p.add_argument("--iters", type=int, default=5)))
disp = ex.dispatcher("gemm", args, dtypes=["fp16"], layouts=["rcr"])
bk = disp.backend_spec
sizes = [(1024, 1024, 1024), (4096, 4096, 4096)] if args.gpu else [(128, 128, 128), (256, 192, 160)]
ok = True
for m, n, k in sizes:
    p = GemmProblem(m=m, n=n, k=k, dtype="fp16", layout="rcr")
    ok &= ex.check(disp, p, args.rng, label=f"{m}x{n}x{k}", show_plan=False)
    inputs = {n_: bk.to_backend(v) for n_, v in disp.mgr.op("gemm").make_inputs(p, args.rng).items()}
    for _ in range(args.warmup):
        disp.run(p, **inputs)
    times = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        disp.run(p, **inputs)
        if bk.synchronize:
            bk.synchronize()
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    sd = statistics.stdev(times) if len(times) > 1 else 0.0
    print(f"    {disp.select(p).name}")
    print(f"    mean {statistics.mean(times) * 1e3:.3f} ms  median {med * 1e3:.3f} ms  "
          f"stdev {sd * 1e3:.3f} ms  min {min(times) * 1e3:.3f} ms  {p.flops() / med / 1e12:.4f} TFLOPS")
ex.finish(ok)
