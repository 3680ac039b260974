"""The tiles the sm90 tables name for head dims above 128 (160/192/256 pad to 256) compute the right
forward and backward: run in the Triton interpreter on odd sizes (tails in every tile, head dims that
are not powers of two, GQA) against a float64 attention written here."""
from __future__ import annotations

import os

if os.environ.get("CK_TEST_GPU") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

if os.environ.get("TRITON_INTERPRET") != "1":  # pragma: no cover
    pytest.skip("these tests run the kernels in the Triton interpreter", allow_module_level=True)

from ck_fmha.backends.triton import bwd, fwd  # noqa: E402
from ck_fmha import heuristics as C  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")]


def _attention64(q, k, v, causal):
    """softmax(q k^T / sqrt(d)) v in float64, K/V heads repeated over their query-head group."""
    q, k, v = (t.double() for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        sq, sk = s.shape[-2:]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("d,causal", [(160, False), (192, True)])
def test_sm90_large_head_dim_tiles(d, causal):
    fcfg = C.default_fwd_config(d, d, "sm90", causal=causal, seqlen=4096, gluon=False).with_(variant="ptr")
    kv, dq = C.default_bwd_configs(d, d, "sm90", causal=causal)
    # one more row than a tile in each direction: every kernel sees a full block and a ragged tail
    s = max(fcfg.BLOCK_M, fcfg.BLOCK_N, kv.BLOCK_M, kv.BLOCK_N, dq.BLOCK_M, dq.BLOCK_N) + 5
    g = torch.Generator().manual_seed(d + causal)
    q = torch.randn(1, 4, s, d, generator=g).half()
    k, v = (torch.randn(1, 2, s, d, generator=g).half() for _ in range(2))
    do = torch.randn(1, 4, s, d, generator=g).half()
    o, lse = fwd(q, k, v, causal=causal, return_lse=True, config=fcfg)
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    ref = _attention64(qd, kd, vd, causal)
    ref.backward(do.double())
    assert _rel(o, ref.detach()) < 2e-3
    got = bwd(q, k, v, o, lse, do, causal=causal, config=(kv, dq))
    for name, x, want in zip(("dq", "dk", "dv"), got, (qd.grad, kd.grad, vd.grad)):
        assert torch.isfinite(x).all(), name
        assert _rel(x, want) < 4e-3, name
