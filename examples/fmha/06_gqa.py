"""06 -- grouped-query and multi-query attention: nhead_q query heads share nhead_k K/V heads.

    python examples/fmha/06_gqa.py [--backend numpy|triton]
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

args, disp = _fmha.setup(__doc__)
B = _fmha.sizes(args, dict(batch=2, seqlen_q=31, seqlen_k=43, hdim_q=64),
                dict(batch=4, seqlen_q=2048, seqlen_k=2048, hdim_q=128))
ok = True
for hq, hk in ((8, 8), (8, 4), (8, 2), (8, 1)):
    kind = "MHA" if hq == hk else ("MQA" if hk == 1 else f"GQA {hq // hk}:1")
    ok &= _fmha.run(disp, args, f"{kind} nhead_q={hq} nhead_k={hk}", nhead_q=hq, nhead_k=hk, mask="b",
                    dtype="fp16", **B)
ex.finish(ok)
