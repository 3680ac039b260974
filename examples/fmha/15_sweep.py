"""15 -- parameter sweep: seqlen x head dim x causal, validated, with time and TFLOPS per point.

    python examples/fmha/15_sweep.py [--backend numpy|triton]
On the numpy backend the times are the host reference's, not a GPU's.
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

import time  # noqa: E402

from ck_fmha.problem import FmhaProblem  # noqa: E402

args, disp = _fmha.setup(__doc__)
# every point is checked against a float64 NumPy reference: at 8 x 16 heads x 4096^2 that takes ~5 minutes
# of one core and ~9 GB of host memory per point (measured at 4 heads: 9.6 s, 2.2 GB), so the GPU sweep
# stops at 2048 with 4 sequences
seqlens = (512, 1024, 2048) if args.gpu else (16, 48, 96)
op, bk = disp.mgr.op("fmha"), disp.backend_spec
rows, ok = [], True
for s in seqlens:
    for hdim in (64, 128):
        for mask in ("none", "b"):
            p = FmhaProblem(batch=2 if not args.gpu else 4, nhead_q=4 if not args.gpu else 16, seqlen_q=s,
                            seqlen_k=s, hdim_q=hdim, mask=mask, dtype="fp16")
            good = ex.check(disp, p, args.rng, label=f"s={s} d={hdim} mask={mask}", show_plan=False)
            x = {k: bk.to_backend(v) for k, v in op.make_inputs(p, args.rng).items()}
            disp.run_dict(p, x)  # warm-up
            t0 = time.perf_counter()
            disp.run_dict(p, x)
            if bk.synchronize:
                bk.synchronize()
            secs = time.perf_counter() - t0
            rows.append({"seqlen": s, "hdim": hdim, "mask": mask, "ms": f"{secs * 1e3:.3f}",
                         "TFLOPS": f"{op.flops(p) / secs / 1e12:.4f}", "valid": "PASS" if good else "FAIL"})
            ok &= good
ex.table(rows, list(rows[0]))
ex.finish(ok)
