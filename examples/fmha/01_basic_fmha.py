"""01 -- basic FMHA forward: softmax(Q K^T * scale) V, several shapes and head dims, LSE stored.

    python examples/fmha/01_basic_fmha.py [--backend numpy|triton]
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

args, disp = _fmha.setup(__doc__)
B = _fmha.sizes(args, dict(batch=2, nhead_q=4, seqlen_q=37, seqlen_k=53),
                dict(batch=4, nhead_q=16, seqlen_q=1024, seqlen_k=1024))
ok = True
for hdim in (64, 128):
    for dtype in ("fp16", "bf16"):
        ok &= _fmha.run(disp, args, f"fwd {dtype} hdim={hdim}", dtype=dtype, hdim_q=hdim, lse=True, **B)
ok &= _fmha.run(disp, args, "fwd bshd layout", dtype="fp16", hdim_q=64, layout="bshd", **B)
ex.finish(ok)
