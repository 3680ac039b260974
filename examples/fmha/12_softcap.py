"""12 -- logits soft cap: s = cap * tanh(s / cap) before the softmax (Gemma 2, Grok).

    python examples/fmha/12_softcap.py [--backend numpy|triton]
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

args, disp = _fmha.setup(__doc__)
B = _fmha.sizes(args, dict(batch=2, nhead_q=4, seqlen_q=33, seqlen_k=47, hdim_q=64),
                dict(batch=4, nhead_q=16, seqlen_q=2048, seqlen_k=2048, hdim_q=128))
ok = True
for cap in (5.0, 30.0):
    ok &= _fmha.run(disp, args, f"softcap {cap}", logits_soft_cap=cap, dtype="fp16", **B)
ok &= _fmha.run(disp, args, "softcap 30 causal", logits_soft_cap=30.0, mask="b", dtype="bf16", **B)
ex.finish(ok)
