"""24 -- advanced benchmark: the heuristic's first N kernels for one problem, each run alone and
validated, timed with min/median/mean/stdev/p90 and TFLOPS (what `ck tune` measures).

    python examples/fmha/24_advanced_benchmark.py [--backend numpy|triton] [--top 4] [--warmup 2] [--iters 5]
(The CK dispatcher's python/10_advanced_benchmark.py.)
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

import statistics  # noqa: E402

import numpy as np  # noqa: E402

from ck_fmha.problem import FmhaProblem  # noqa: E402

args, disp = _fmha.setup(__doc__, lambda p: (p.add_argument("--top", type=int, default=4),
                                             p.add_argument("--warmup", type=int, default=2),
                                             p.add_argument("--iters", type=int, default=5)))
p = FmhaProblem(hdim_q=128, dtype="bf16", mask="b", **_fmha.sizes(
    args, dict(batch=2, nhead_q=4, seqlen_q=64, seqlen_k=64), dict(batch=4, nhead_q=32, seqlen_q=2048, seqlen_k=2048)))
op, rows, ok = disp.mgr.op("fmha"), [], True
for key in disp.rank(p)[: args.top]:
    one = _fmha.alone(key, args)
    ok &= ex.check(one, p, args.rng, label=key.name[:90], show_plan=False)
    t = _fmha.times(one, p, _fmha.inputs(one, p, args.rng), args.warmup, args.iters)
    med = statistics.median(t)
    rows.append({"kernel": key.name[:56], "min ms": f"{min(t) * 1e3:.3f}", "median ms": f"{med * 1e3:.3f}",
                 "mean ms": f"{statistics.mean(t) * 1e3:.3f}",
                 "stdev ms": f"{(statistics.stdev(t) if len(t) > 1 else 0) * 1e3:.3f}",
                 "p90 ms": f"{np.percentile(t, 90) * 1e3:.3f}", "TFLOPS": f"{op.flops(p) / med / 1e12:.4f}"})
print(f"{p.batch}x{p.nhead_q}x{p.seqlen_q}x{p.hdim_q} bf16 causal; {args.warmup} warm-up + {args.iters} timed each")
ex.table(rows, list(rows[0]))
ex.finish(ok)
