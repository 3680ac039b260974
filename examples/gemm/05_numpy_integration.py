"""05 -- NumPy integration: numpy arrays in, numpy arrays out, any layout, an fp32 epilogue.

    python examples/gemm/05_numpy_integration.py [--backend numpy|triton]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common as ex  # noqa: E402

import numpy as np  # noqa: E402

from ck_core.dtypes import quantize  # noqa: E402
from ck_gemm import GemmProblem  # noqa: E402

args = ex.parse_args(__doc__)
disp = ex.dispatcher("gemm", args, dtypes=["fp16"], layouts=["rcr", "rrr"])
bk = disp.backend_spec


def gemm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x (M, K) @ w (K, N) for float arrays: quantize to fp16, dispatch, return float32."""
    (m, k), (_, n) = x.shape, w.shape
    p = GemmProblem(m=m, n=n, k=k, dtype="fp16", layout="rrr")  # w row-major (K x N)
    c = disp.run(p, bk.to_backend(quantize(x, "fp16")), bk.to_backend(quantize(w, "fp16")))
    return np.asarray(bk.to_numpy(c), dtype=np.float32)


x = args.rng.standard_normal((70, 50))
w = args.rng.standard_normal((50, 30)) / np.sqrt(50)
y = gemm(x, w)
ref = quantize(x, "fp16").astype(np.float64) @ quantize(w, "fp16").astype(np.float64)
err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
print(f"y = gemm(x, w): shape {y.shape} dtype {y.dtype}, relative L2 error {err:.2e}")
ok = err < 2e-3
# the same dispatcher also holds rcr kernels (B stored N x K): checked on fresh inputs
p = GemmProblem(m=70, n=30, k=50, dtype="fp16", layout="rcr")
ok &= ex.check(disp, p, args.rng, label="rcr")
ex.finish(ok)
