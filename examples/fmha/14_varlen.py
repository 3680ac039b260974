"""14 -- group mode (varlen): sequences of different lengths packed into one tensor, cu_seqlens style.

    python examples/fmha/14_varlen.py [--backend numpy|triton]
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

args, disp = _fmha.setup(__doc__)
B = _fmha.sizes(args, dict(batch=3, nhead_q=4, hdim_q=64, seqstart_q=(0, 5, 20, 33), seqstart_k=(0, 9, 30, 47)),
                dict(batch=4, nhead_q=16, hdim_q=128, seqstart_q=(0, 100, 1100, 1600, 3648),
                     seqstart_k=(0, 100, 1100, 1600, 3648)))
ok = True
ok &= _fmha.run(disp, args, "group mode", mode="group", dtype="fp16", **B)
ok &= _fmha.run(disp, args, "group mode causal", mode="group", mask="b", dtype="fp16", **B)
ok &= _fmha.run(disp, args, "group mode backward", family="bwd_dq_dk_dv", mode="group", dtype="fp16", **B)
ex.finish(ok)
