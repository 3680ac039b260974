"""07 -- backward: dQ, dK, dV through the three-stage plan (dot(dO, O), dQ/dK/dV, convert dQ).

    python examples/fmha/07_backward.py [--backend numpy|triton]
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

args, disp = _fmha.setup(__doc__)
B = _fmha.sizes(args, dict(batch=2, nhead_q=4, seqlen_q=29, seqlen_k=29, hdim_q=64),
                dict(batch=4, nhead_q=16, seqlen_q=1024, seqlen_k=1024, hdim_q=128))
ok = True
ok &= _fmha.run(disp, args, "bwd", family="bwd_dq_dk_dv", dtype="fp16", **B)
ok &= _fmha.run(disp, args, "bwd causal", family="bwd_dq_dk_dv", mask="t", dtype="bf16", **B)
ok &= _fmha.run(disp, args, "bwd GQA, deterministic", family="bwd_dq_dk_dv", nhead_k=2,
                deterministic=True, dtype="fp16", **B)
ex.finish(ok)
