"""04 -- bias: an elementwise bias tensor, and ALiBi slopes (with and without a causal mask).

    python examples/fmha/04_bias_alibi.py [--backend numpy|triton]
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

args, disp = _fmha.setup(__doc__)
B = _fmha.sizes(args, dict(batch=2, nhead_q=4, seqlen_q=29, seqlen_k=45, hdim_q=64),
                dict(batch=4, nhead_q=16, seqlen_q=1024, seqlen_k=1024, hdim_q=128))
ok = True
ok &= _fmha.run(disp, args, "elementwise bias", bias="elementwise", dtype="fp16", **B)
ok &= _fmha.run(disp, args, "alibi", bias="alibi", dtype="fp16", **B)
ok &= _fmha.run(disp, args, "alibi + causal", bias="alibi", mask="b", dtype="bf16", **B)
ex.finish(ok)
