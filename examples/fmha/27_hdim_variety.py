"""27 -- head dims: 32, 64, 96, 128, 256 and the asymmetric (192, 128) of DeepSeek-style MLA, in fp16 and
bf16, each through the kernel its head dim selects (smaller dims pad up to a supported tile).

    python examples/fmha/27_hdim_variety.py [--backend numpy|triton]
(The CK dispatcher's python/26_hdim_variety_fmha.py.)
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

args, disp = _fmha.setup(__doc__)
B = _fmha.sizes(args, dict(batch=1, nhead_q=2, seqlen_q=19, seqlen_k=33),
                dict(batch=2, nhead_q=16, seqlen_q=1024, seqlen_k=1024))
ok = True
for hq, hv in ((32, 32), (64, 64), (96, 96), (128, 128), (256, 256), (192, 128)):
    for dtype in ("fp16", "bf16"):
        ok &= _fmha.run(disp, args, f"hdim {hq}/{hv} {dtype}", hdim_q=hq, hdim_v=hv, dtype=dtype, **B)
ex.finish(ok)
