"""18 -- validation: dtypes x head dims x masks against the float64 reference, with the tolerance per
output; then a poisoned output (one element changed) must be caught by the same comparison.

    python examples/fmha/18_validation.py [--backend numpy|triton]
(The CK dispatcher's python/04_validation.py.)
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

import numpy as np  # noqa: E402

from ck_core.validate import compare_all  # noqa: E402
from ck_fmha.problem import FmhaProblem  # noqa: E402

args, disp = _fmha.setup(__doc__)
B = _fmha.sizes(args, dict(batch=2, nhead_q=2, seqlen_q=21, seqlen_k=37),
                dict(batch=2, nhead_q=16, seqlen_q=777, seqlen_k=1031))
ok = True
for dtype in ("fp16", "bf16"):
    for hdim in (64, 128):
        for mask in ("none", "t", "b:16,0"):
            ok &= _fmha.run(disp, args, f"{dtype} hdim={hdim} mask={mask}", dtype=dtype, hdim_q=hdim, mask=mask,
                            lse=True, **B)
# a wrong result must fail: poison one element of a correct output
p = FmhaProblem(dtype="fp16", hdim_q=64, **B)
op, bk = disp.mgr.op("fmha"), disp.backend_spec
x = op.make_inputs(p, args.rng)
o = bk.to_numpy(disp.run_dict(p, {k: bk.to_backend(v) for k, v in x.items()})["o"]).astype(np.float32)
ref = {"o": op.reference(p, x)["o"]}
idx = tuple(int(args.rng.integers(n)) for n in o.shape)
o[idx] += 0.5
caught = not compare_all({"o": o}, ref, {"o": "fp16"}, op.tolerance(p)).passed
print(f"poisoned element {idx}: caught={caught}")
ex.finish(ok and caught)
