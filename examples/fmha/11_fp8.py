"""11 -- fp8 forward: e4m3 Q/K/V with per-tensor descales, bf16 output.

    python examples/fmha/11_fp8.py [--backend numpy|triton]
The numpy backend runs it anywhere; the triton backend needs a Hopper GPU.
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

args, disp = _fmha.setup(__doc__)
B = _fmha.sizes(args, dict(batch=2, nhead_q=4, seqlen_q=33, seqlen_k=47, hdim_q=128),
                dict(batch=4, nhead_q=16, seqlen_q=2048, seqlen_k=2048, hdim_q=128))
ok = True
ok &= _fmha.run(disp, args, "fp8", dtype="fp8", **B)
ok &= _fmha.run(disp, args, "fp8 causal, descales", dtype="fp8", mask="b", scale_q=0.5, scale_k=0.25,
                scale_v=2.0, **B)
ex.finish(ok)
