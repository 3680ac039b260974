"""30 -- sweep over the batch size (fixed heads, length and head dim): validated, with time and TFLOPS.

    python examples/fmha/30_sweep_batch.py [--backend numpy|triton]
(The CK dispatcher's python/30_sweep_batch.py.)
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

from ck_fmha.problem import FmhaProblem  # noqa: E402

args, disp = _fmha.setup(__doc__)
batches, S = ((1, 2, 4, 8, 16), dict(nhead_q=16, seqlen_q=1024, seqlen_k=1024)) if args.gpu else \
    ((1, 2, 3, 5), dict(nhead_q=2, seqlen_q=40, seqlen_k=40))
ex.finish(_fmha.sweep(disp, args, {f"batch={b}": FmhaProblem(batch=b, hdim_q=128, dtype="fp16", **S)
                                   for b in batches}))
