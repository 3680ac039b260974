"""13 -- sinks: StreamingLLM sink tokens in a sliding window, and per-head sink logits (gpt-oss).

    python examples/fmha/13_sinks.py [--backend numpy|triton]
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

args, disp = _fmha.setup(__doc__)
B = _fmha.sizes(args, dict(batch=2, nhead_q=4, seqlen_q=40, seqlen_k=40, hdim_q=64),
                dict(batch=2, nhead_q=16, seqlen_q=2048, seqlen_k=2048, hdim_q=128))
ok = True
ok &= _fmha.run(disp, args, "sink tokens in a window", mask="t:8,0", sink_tokens=4, dtype="fp16", **B)
ok &= _fmha.run(disp, args, "sink logits", sink_logits=True, dtype="fp16", **B)
ok &= _fmha.run(disp, args, "sink logits causal", sink_logits=True, mask="b", dtype="bf16", **B)
ex.finish(ok)
