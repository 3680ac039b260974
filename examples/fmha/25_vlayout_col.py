"""25 -- column-major V: V stored [B, Hk, Dv, Sk] (keys contiguous, CK's `-vlayout=c`), the same
attention as row-major V on the same values.

    python examples/fmha/25_vlayout_col.py [--backend numpy|triton]
(The CK dispatcher's python/24_vlayout_col_fmha.py.)
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

import attrs  # noqa: E402
import numpy as np  # noqa: E402

from ck_core.errors import MissingKernel  # noqa: E402
from ck_fmha.problem import FmhaProblem  # noqa: E402

args, disp = _fmha.setup(__doc__)
B = _fmha.sizes(args, dict(batch=2, nhead_q=4, seqlen_q=31, seqlen_k=45, hdim_q=128),
                dict(batch=4, nhead_q=16, seqlen_q=1024, seqlen_k=1024, hdim_q=128))
cases = {"fp16": dict(dtype="fp16"), "bf16 causal, GQA": dict(dtype="bf16", mask="b", nhead_k=2),
         "fp8 (descales)": dict(dtype="fp8", scale_q=0.5, scale_k=0.25, scale_v=2.0)}
ok, ran = True, []
for label, f in cases.items():
    p = FmhaProblem(vlayout="c", **dict(B, **f))
    try:
        disp.select(p)
    except MissingKernel:  # e.g. the Triton kernels read column-major V in the fp8 forward only
        print(f"[vlayout=c {label}] no kernel for column-major V in this space: not run")
        continue
    ok &= ex.check(disp, p, args.rng, label=f"vlayout=c {label}")
    ran.append(p)
# the same numbers either way: transpose V's last two axes and compare the outputs
pc = ran[0]
pr = attrs.evolve(pc, vlayout="r")
op, bk = disp.mgr.op("fmha"), disp.backend_spec
x = op.make_inputs(pr, args.rng)
xc = dict(x, v=np.ascontiguousarray(np.swapaxes(x["v"], -1, -2)))
o_r, o_c = (bk.to_numpy(disp.run_dict(p, {k: bk.to_backend(v) for k, v in t.items()})["o"]).astype(np.float32)
            for p, t in ((pr, x), (pc, xc)))
diff = float(np.abs(o_r - o_c).max())
print(f"{pc.dtype}: row- vs column-major V on the same values: max |difference| {diff:.2e}")
ex.finish(ok and diff <= 2e-2 * max(1.0, float(np.abs(o_r).max())))
