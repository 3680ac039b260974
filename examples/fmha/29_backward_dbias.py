"""29 -- backward with a bias: the elementwise bias's gradient dBias next to dQ/dK/dV, a bias shared
over the batch ([1, H, Sq, Sk]) as well as per batch, and ALiBi (no gradient) in the backward.

    python examples/fmha/29_backward_dbias.py [--backend numpy|triton]
(The CK dispatcher's python/28_backward_dbias_fmha.py.)
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

args, disp = _fmha.setup(__doc__)
B = _fmha.sizes(args, dict(batch=2, nhead_q=4, seqlen_q=23, seqlen_k=31, hdim_q=64),
                dict(batch=4, nhead_q=16, seqlen_q=1024, seqlen_k=1024, hdim_q=128))
ok = True
ok &= _fmha.run(disp, args, "bwd bias + dbias", family="bwd_dq_dk_dv", bias="elementwise", dbias=True,
                dtype="fp16", **B)
ok &= _fmha.run(disp, args, "bwd bias + dbias causal", family="bwd_dq_dk_dv", bias="elementwise", dbias=True,
                mask="b", dtype="bf16", **B)
ok &= _fmha.run(disp, args, "bwd alibi", family="bwd_dq_dk_dv", bias="alibi", mask="b", dtype="fp16", **B)
ex.finish(ok)
