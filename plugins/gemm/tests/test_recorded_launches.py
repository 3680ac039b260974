"""The recorded fast path of the GEMM launcher for kernels that launch more than once (split-K:
partial products, then their sum) or keep scratch (stream-K), under Triton's interpreter: the
replays are stubbed the way tests/test_warm_calls.py does (the interpreter runs the recording)."""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton")

from ck_core.key import KernelKey  # noqa: E402
from ck_core.testing import interp_replays  # noqa: E402
from ck_gemm.backends.triton import keys as tk  # noqa: E402
from ck_gemm.keys import GemmAlgorithm, GemmSignature  # noqa: E402
from ck_gemm.problem import GemmProblem  # noqa: E402


@pytest.fixture
def replays(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("the stubbed replays run on the interpreter")
    return interp_replays(monkeypatch)


def _key(variant, split_k, layout):
    alg = GemmAlgorithm(64, 64, 64, 4, 1, 1, 16, 64, 16, pipeline="multistage", pad_m=True, pad_n=True,
                        pad_k=True, split_k=split_k, stages=3, variant=variant)
    return KernelKey("gemm", GemmSignature("fp16", layout), alg, "sm90", "triton")


@pytest.mark.parametrize("variant,split_k,layout,launches", [("tile", 3, "rcr", 2), ("tile", 2, "crr", 2),
                                                             ("streamk", 1, "rrr", 1), ("tile", 1, "rcr", 1)])
def test_recorded_calls_replay_every_launch_on_new_tensors(replays, variant, split_k, layout, launches, ck_rng):
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 30)))
    m, n, k = (int(x) * 2 + 1 for x in ck_rng.integers(20, 50, size=3))
    k = k * 3    # several K tiles a split
    p = GemmProblem(m=m, n=n, k=k, dtype="fp16", layout=layout)
    launch = tk.make_fast_launcher(_key(variant, split_k, layout), num_sms=5)

    def operands():
        a = torch.randn(*p.shape_a(), generator=g).half()
        b = torch.randn(*p.shape_b(), generator=g).half()
        al = a.double() if layout[0] == "r" else a.double().t()
        bl = b.double() if layout[1] == "r" else b.double().t()
        return a, b, al @ bl

    outs = []
    for call in range(3):   # the first records, the others replay the recording
        a, b, want = operands()
        c = launch(p, {"a": a, "b": b})["c"]
        got = c.double() if layout[2] == "r" else c.double().t()
        assert float((got - want).norm() / want.norm()) < 2e-3, call
        outs.append(c)
    assert len(replays) == launches
    assert all(r.calls == 2 for r in replays), "each launch of the call replayed once per warm call"
    # the replays wrote into the caller's new C each time, not into the recorded one
    assert outs[0].data_ptr() != outs[2].data_ptr() or not torch.equal(outs[0], outs[2])
