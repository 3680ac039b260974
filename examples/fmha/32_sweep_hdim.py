"""32 -- sweep over the head dim (32 to 256), forward and causal: validated, with time and TFLOPS.

    python examples/fmha/32_sweep_hdim.py [--backend numpy|triton]
(The CK dispatcher's python/32_sweep_hdim.py.)
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

from ck_fmha.problem import FmhaProblem  # noqa: E402

args, disp = _fmha.setup(__doc__)
S = _fmha.sizes(args, dict(batch=1, nhead_q=2, seqlen_q=40, seqlen_k=40),
                dict(batch=2, nhead_q=16, seqlen_q=1024, seqlen_k=1024))
ex.finish(_fmha.sweep(disp, args, {f"hdim={d} mask={m}": FmhaProblem(hdim_q=d, mask=m, dtype="fp16", **S)
                                   for d in (32, 64, 96, 128, 256) for m in ("none", "b")}))
