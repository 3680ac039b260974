"""09 -- paged decode: K/V read through a block table of fixed-size pages (vLLM style).

    python examples/fmha/09_paged_decode.py [--backend numpy|triton]
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

args, disp = _fmha.setup(__doc__)
B = _fmha.sizes(args, dict(batch=2, nhead_q=4, nhead_k=2, seqlen_q=1, seqlen_k=300, seqlens_k=(300, 77), hdim_q=128),
                dict(batch=16, nhead_q=32, nhead_k=8, seqlen_q=1, seqlen_k=8192, seqlens_k=(8192, 3000) * 8,
                     hdim_q=128))
ok = True
for page in (16, 64):
    ok &= _fmha.run(disp, args, f"paged decode page_size={page}", family="fwd_pagedkv", paged_kv=True,
                    page_size=page, dtype="fp16", **B)
ex.finish(ok)
