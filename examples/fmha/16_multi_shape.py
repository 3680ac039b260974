"""16 -- one kernel, many shapes: a single forward kernel runs batches, heads and lengths it was not
specialised for (padded tiles), each validated, with time and TFLOPS per shape.

    python examples/fmha/16_multi_shape.py [--backend numpy|triton]
(The CK dispatcher's python/02_multi_shape.py.)
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

from ck_fmha.problem import FmhaProblem  # noqa: E402

args, disp = _fmha.setup(__doc__)
shapes = ([(1, 4, 4, 64, 64), (2, 8, 8, 128, 128), (4, 8, 8, 128, 256), (1, 16, 16, 256, 256),
           (2, 8, 2, 512, 512), (1, 8, 8, 1024, 1024)] if args.gpu else
          [(1, 2, 2, 16, 16), (2, 4, 4, 19, 33), (3, 4, 2, 40, 24), (1, 8, 8, 7, 61)])
problems = [FmhaProblem(batch=b, nhead_q=hq, nhead_k=hk, seqlen_q=sq, seqlen_k=sk, hdim_q=128, dtype="fp16")
            for b, hq, hk, sq, sk in shapes]
op = disp.mgr.op("fmha")
# the first kernel (in the heuristic's order for the first shape) that computes every shape
key = next(k for k in disp.rank(problems[0]) if all(op.supports(k, p) is None for p in problems))
print(f"kernel: {key.name}")
one = _fmha.alone(key, args, "multi_shape")
ok = _fmha.sweep(one, args, {f"B{p.batch} Hq{p.nhead_q} Hk{p.nhead_k} S{p.seqlen_q}x{p.seqlen_k}": p
                             for p in problems})
ex.finish(ok and all(one.select(p) == key for p in problems))
