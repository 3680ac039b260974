"""17 -- benchmark: warm-up, timed iterations, mean/median/stdev/min and TFLOPS for forward problems.

    python examples/fmha/17_benchmark.py [--backend numpy|triton] [--warmup 2] [--iters 5]
(The CK dispatcher's python/03_benchmark.py.)  On the numpy backend the times are the host
reference's, not a GPU's.
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

import statistics  # noqa: E402

from ck_fmha.problem import FmhaProblem  # noqa: E402

args, disp = _fmha.setup(__doc__, lambda p: (p.add_argument("--warmup", type=int, default=2),
                                             p.add_argument("--iters", type=int, default=5)))
B = _fmha.sizes(args, dict(batch=2, nhead_q=4, seqlen_q=48, seqlen_k=48),
                dict(batch=2, nhead_q=16, seqlen_q=2048, seqlen_k=2048))
op, ok = disp.mgr.op("fmha"), True
for hdim, mask in ((64, "none"), (128, "none"), (128, "b")):
    p = FmhaProblem(hdim_q=hdim, mask=mask, dtype="fp16", **B)
    ok &= ex.check(disp, p, args.rng, label=f"hdim={hdim} mask={mask}", show_plan=False)
    t = _fmha.times(disp, p, _fmha.inputs(disp, p, args.rng), args.warmup, args.iters)
    med = statistics.median(t)
    sd = statistics.stdev(t) if len(t) > 1 else 0.0
    print(f"    {disp.select(p).name}")
    print(f"    mean {statistics.mean(t) * 1e3:.3f} ms  median {med * 1e3:.3f} ms  stdev {sd * 1e3:.3f} ms  "
          f"min {min(t) * 1e3:.3f} ms  {op.flops(p) / med / 1e12:.4f} TFLOPS")
ex.finish(ok)
