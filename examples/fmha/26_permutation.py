"""26 -- layouts: q/k/v/o as [B, H, S, D] ("bhsd") or [B, S, H, D] ("bshd", CK's -iperm=0/-operm=0);
the same values in either layout give the same attention.

    python examples/fmha/26_permutation.py [--backend numpy|triton]
(The CK dispatcher's python/25_permutation_fmha.py.)
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

import numpy as np  # noqa: E402

from ck_fmha.problem import FmhaProblem  # noqa: E402

args, disp = _fmha.setup(__doc__)
B = _fmha.sizes(args, dict(batch=2, nhead_q=4, nhead_k=2, seqlen_q=27, seqlen_k=35, hdim_q=64),
                dict(batch=4, nhead_q=16, nhead_k=4, seqlen_q=1024, seqlen_k=1024, hdim_q=128))
ok = True
for layout in ("bhsd", "bshd"):
    ok &= _fmha.run(disp, args, f"layout={layout}", layout=layout, mask="b", dtype="fp16", **B)
# bshd inputs are the bhsd ones with heads and sequence swapped; so must the output be
ph, ps = (FmhaProblem(layout=lay, dtype="fp16", **B) for lay in ("bhsd", "bshd"))
op, bk = disp.mgr.op("fmha"), disp.backend_spec
x = op.make_inputs(ph, args.rng)
xs = {k: (np.ascontiguousarray(np.swapaxes(v, 1, 2)) if k in ("q", "k", "v") else v) for k, v in x.items()}
oh = bk.to_numpy(disp.run_dict(ph, {k: bk.to_backend(v) for k, v in x.items()})["o"]).astype(np.float32)
os_ = bk.to_numpy(disp.run_dict(ps, {k: bk.to_backend(v) for k, v in xs.items()})["o"]).astype(np.float32)
diff = float(np.abs(np.swapaxes(os_, 1, 2) - oh).max())
print(f"o (bshd) vs o (bhsd) with axes 1 and 2 swapped: max |difference| {diff:.2e}")
ex.finish(ok and diff < 1e-2)
