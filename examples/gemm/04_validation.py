"""04 -- validation: dtypes and layouts against a float64 NumPy reference, with a poisoned check.

    python examples/gemm/04_validation.py [--backend numpy|triton]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common as ex  # noqa: E402

import numpy as np  # noqa: E402

from ck_core import compare  # noqa: E402
from ck_gemm import GemmProblem  # noqa: E402

args = ex.parse_args(__doc__)
dtypes = ["fp16", "bf16"]
layouts = ["rcr", "rrr", "crr", "ccr"]
disp = ex.dispatcher("gemm", args, dtypes=dtypes, layouts=layouts)
ok = True
for dt in dtypes:
    for lay in layouts:
        p = GemmProblem(m=97, n=66, k=83, dtype=dt, layout=lay)
        ok &= ex.check(disp, p, args.rng, label=f"{dt} {lay}", show_plan=False)

# the check must be able to fail: a corrupted output is caught
p = GemmProblem(m=64, n=48, k=40, dtype="fp16", layout="rcr")
op = disp.mgr.op("gemm")
inputs = op.make_inputs(p, args.rng)
ref = op.reference(p, inputs)["c"]
bad = np.array(ref, dtype=np.float32)
bad[3, 5] += 1.0
v = compare(bad, ref, "fp16", "c (poisoned)")
print(f"[poisoned output] caught: {not v.passed} ({v.n_bad} bad of {v.n_total}, max_abs={v.max_abs:.2f})")
ok &= not v.passed
ex.finish(ok)
