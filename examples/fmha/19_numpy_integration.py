"""19 -- NumPy integration: an `attention(q, k, v, causal)` over float32 NumPy arrays [B, H, S, D]
that quantizes to fp16, dispatches, and returns float32, checked against a softmax written here.

    python examples/fmha/19_numpy_integration.py [--backend numpy|triton]
(The CK dispatcher's python/05_numpy_integration.py.)
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

import numpy as np  # noqa: E402

from ck_fmha.problem import FmhaProblem  # noqa: E402

args, disp = _fmha.setup(__doc__)
bk = disp.backend_spec


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = False) -> np.ndarray:
    """softmax(q k^T / sqrt(D)) v on NumPy arrays; GQA when k/v have fewer heads than q."""
    b, h, sq, d = q.shape
    p = FmhaProblem(batch=b, nhead_q=h, nhead_k=k.shape[1], seqlen_q=sq, seqlen_k=k.shape[2], hdim_q=d,
                    hdim_v=v.shape[3], mask="b" if causal else "none", dtype="fp16")
    x = {n: bk.to_backend(np.ascontiguousarray(t, dtype=np.float16)) for n, t in zip("qkv", (q, k, v))}
    return bk.to_numpy(disp.run_dict(p, x)["o"]).astype(np.float32)


def softmax_attention(q, k, v, causal):
    """The textbook formula in float64 (on the fp16-rounded inputs the kernel saw)."""
    q, k, v = (t.astype(np.float16).astype(np.float64) for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    if causal:  # bottom-right aligned: query i sees keys up to i + (Sk - Sq)
        sq, sk = s.shape[-2:]
        s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + sk - sq, s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v


shape = (4, 16, 512, 128) if args.gpu else (2, 4, 24, 64)
ok = True
for hk, causal in ((shape[1], False), (shape[1], True), (shape[1] // 4, True)):
    b, h, s, d = shape
    q = args.rng.standard_normal((b, h, s, d), dtype=np.float32)
    k = args.rng.standard_normal((b, hk, s + 5, d), dtype=np.float32)
    v = args.rng.standard_normal((b, hk, s + 5, d), dtype=np.float32)
    o = attention(q, k, v, causal)
    ref = softmax_attention(q, k, v, causal)
    err = float(np.linalg.norm(o - ref) / np.linalg.norm(ref))
    good = o.dtype == np.float32 and o.shape == (b, h, s, d) and err < 2e-3
    print(f"heads {h}/{hk} causal={causal}: out {o.shape} {o.dtype}, relative L2 error {err:.2e} "
          f"{'PASS' if good else 'FAIL'}")
    ok &= good
ex.finish(ok)
