"""02 -- batched GEMM: ``batch`` independent products in one launch.

    python examples/gemm/02_batch_gemm.py [--backend numpy|triton]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common as ex  # noqa: E402

import numpy as np  # noqa: E402

from ck_core.dtypes import quantize  # noqa: E402
from ck_gemm import GemmProblem  # noqa: E402

args = ex.parse_args(__doc__)
disp = ex.dispatcher("gemm", args, dtypes=["fp16"], layouts=["rcr"])
ok = True
for batch, m, n, k in [(4, 96, 80, 64), (3, 33, 65, 47)]:
    p = GemmProblem(m=m, n=n, k=k, batch=batch, dtype="fp16", layout="rcr")
    # the problem gives the storage shapes: A (batch, M, K), B (batch, N, K) for rcr
    a = quantize(args.rng.uniform(-1, 1, p.shape_a()), "fp16")
    b = quantize(args.rng.uniform(-1, 1, p.shape_b()), "fp16")
    ok &= ex.check(disp, p, args.rng, label=f"batch={batch} {m}x{n}x{k}", inputs={"a": a, "b": b})
    # the same thing through Dispatcher.run, compared with a per-batch float64 matmul
    bk = disp.backend_spec
    c = bk.to_numpy(disp.run(p, bk.to_backend(a), bk.to_backend(b))).astype(np.float64)
    ref = np.stack([a[i].astype(np.float64) @ b[i].astype(np.float64).T for i in range(batch)])
    err = np.abs(c - ref).max() / np.abs(ref).max()
    print(f"    per-batch matmul: max error / max |C| = {err:.2e}")
    ok &= bool(err < 1e-2)
ex.finish(ok)
