"""31 -- sweep over the number of query heads, each as MHA, GQA 4:1 and MQA: validated, with time and
TFLOPS.

    python examples/fmha/31_sweep_nhead.py [--backend numpy|triton]
(The CK dispatcher's python/31_sweep_nhead.py.)
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

from ck_fmha.problem import FmhaProblem  # noqa: E402

args, disp = _fmha.setup(__doc__)
heads, S = ((8, 16, 32, 64), dict(batch=1, seqlen_q=1024, seqlen_k=1024)) if args.gpu else \
    ((4, 8), dict(batch=1, seqlen_q=32, seqlen_k=32))
points = {}
for h in heads:
    for name, hk in (("MHA", h), ("GQA", h // 4), ("MQA", 1)):
        points[f"Hq={h} {name} Hk={hk}"] = FmhaProblem(nhead_q=h, nhead_k=hk, hdim_q=128, dtype="fp16", **S)
ex.finish(_fmha.sweep(disp, args, points))
