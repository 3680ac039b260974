"""03 -- masks: causal top-left / bottom-right, sliding windows, xformers windows, CK's generic mask.

    python examples/fmha/03_masks.py [--backend numpy|triton]
Masks may be written as CK's -mask= strings: 't', 'b', 't:left,right', 'b:left,right', 'xt:w', 'g:y,x'.
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

args, disp = _fmha.setup(__doc__)
B = _fmha.sizes(args, dict(batch=2, nhead_q=4, seqlen_q=41, seqlen_k=57, hdim_q=64),
                dict(batch=2, nhead_q=16, seqlen_q=1024, seqlen_k=1024, hdim_q=128))
ok = True
for mask in ("none", "t", "b", "t:8,4", "b:16,0", "xt:8", "xb:12", "g:5,3"):
    ok &= _fmha.run(disp, args, f"mask {mask}", mask=mask, dtype="fp16", **B)
ok &= _fmha.run(disp, args, "mask by fields", mask="bottom_right", window_left=8, window_right=4,
                dtype="fp16", **B)
ex.finish(ok)
