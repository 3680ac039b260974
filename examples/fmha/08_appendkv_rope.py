"""08 -- append-KV with RoPE: new tokens rotated and appended to a KV cache, Q rotated.

    python examples/fmha/08_appendkv_rope.py [--backend numpy|triton]
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

args, disp = _fmha.setup(__doc__)
B = _fmha.sizes(args, dict(batch=2, nhead_q=4, nhead_k=2, seqlen_q=3, seqlen_k=64, seqlens_k=(20, 41), hdim_q=64),
                dict(batch=8, nhead_q=32, nhead_k=8, seqlen_q=1, seqlen_k=4096, seqlens_k=(1000,) * 8,
                     hdim_q=128))
ok = True
for rope in ("none", "interleaved", "half_rotated"):
    ok &= _fmha.run(disp, args, f"appendkv rope={rope}", family="fwd_appendkv", seqlen_knew=B["seqlen_q"],
                    rope=rope, rotary_dim=0 if rope == "none" else 32, dtype="fp16", **B)
ex.finish(ok)
