"""02 -- split-KV: the keys split into num_splits chunks, then a combine stage (a two-stage plan).

    python examples/fmha/02_splitkv.py [--backend numpy|triton]
Decode-shaped problems (one query row, long keys) gain the most.
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

args, disp = _fmha.setup(__doc__)
B = _fmha.sizes(args, dict(batch=2, nhead_q=4, seqlen_q=1, seqlen_k=300, hdim_q=128),
                dict(batch=8, nhead_q=32, seqlen_q=1, seqlen_k=8192, hdim_q=128))
ok = True
for splits in (2, 4):
    ok &= _fmha.run(disp, args, f"splitkv num_splits={splits}", family="fwd_splitkv", num_splits=splits,
                    dtype="fp16", **B)
ok &= _fmha.run(disp, args, "splitkv causal, lse", family="fwd_splitkv", num_splits=3, mask="b",
                lse=True, dtype="bf16", **dict(B, seqlen_q=4))
ex.finish(ok)
