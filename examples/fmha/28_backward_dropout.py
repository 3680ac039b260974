"""28 -- backward with dropout: dQ/dK/dV when the forward dropped attention weights (Philox seed and
offset regenerate the same mask in the backward), with and without a causal mask.

    python examples/fmha/28_backward_dropout.py [--backend numpy|triton]
(The CK dispatcher's python/27_backward_dropout_fmha.py.)
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

args, disp = _fmha.setup(__doc__)
B = _fmha.sizes(args, dict(batch=2, nhead_q=4, seqlen_q=25, seqlen_k=25, hdim_q=64),
                dict(batch=4, nhead_q=16, seqlen_q=1024, seqlen_k=1024, hdim_q=128))
ok = True
for p_drop, mask in ((0.1, "none"), (0.3, "t")):
    ok &= _fmha.run(disp, args, f"bwd dropout p={p_drop} mask={mask}", family="bwd_dq_dk_dv", p_drop=p_drop,
                    seed=2024, offset=3, mask=mask, dtype="fp16", **B)
ok &= _fmha.run(disp, args, "bwd dropout bf16, GQA", family="bwd_dq_dk_dv", p_drop=0.2, seed=7, nhead_k=2,
                dtype="bf16", **B)
ex.finish(ok)
