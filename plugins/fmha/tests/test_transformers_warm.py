"""The transformers adapter's warm path (issue #26): a dense no-grad call of a known signature -- each layer
of each generated token past the first layer -- replays the attention's recorded launch on the tensors the
model hands over, with no Problem, selection or FlashAttention wrapper.  The recorded launches run in the
Triton interpreter with each call's arguments; every call draws fresh data and is checked against a
float64 reference written from the math (GQA, causal aligned bottom-right, odd lengths)."""
from __future__ import annotations

import math
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")
_interp = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                             reason="CPU tensors run triton kernels only in the interpreter")
pytestmark = [pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")]

from ck_core import api as core  # noqa: E402
from ck_core.testing import interp_replays  # noqa: E402
from ck_fmha.integrations import transformers as ck_tf  # noqa: E402
from ck_fmha.problem import FmhaProblem  # noqa: E402


@pytest.fixture
def replays(monkeypatch):
    monkeypatch.setenv("CK_BACKEND", "triton")
    core.clear()
    yield interp_replays(monkeypatch)
    core.clear()


def _ref(q, k, v, scale, causal):
    """float64 [B, Sq, H, D] of softmax(q k^T * scale) v, GQA, causal aligned bottom-right."""
    q, k, v = q.double(), k.double(), v.double()
    b, h, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    k, v = k.repeat_interleave(h // hk, 1), v.repeat_interleave(h // hk, 1)
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        i = torch.arange(sq)[:, None] + (sk - sq)
        s = s.masked_fill(torch.arange(sk)[None, :] > i, float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2)


class _Attn:
    is_causal = True


@_interp
@pytest.mark.parametrize("sq, sk", [(1, 13), (3, 29)])
def test_dense_steps_replay_the_recorded_launch(replays, monkeypatch, sq, sk):
    g = torch.Generator().manual_seed(sq * 100 + sk)
    b, h, hk, d = 2, 4, 2, 16
    scale = 1 / math.sqrt(d)

    def draw():
        return (torch.randn(b, h, sq, d, generator=g).half(), torch.randn(b, hk, sk, d, generator=g).half(),
                torch.randn(b, hk, sk, d, generator=g).half())

    q, k, v = draw()
    out, _ = ck_tf.attention_forward(_Attn(), q, k, v, None, scaling=scale)
    assert len(ck_tf._WARM) == 1   # the signature's recorded launch, kept
    ref = _ref(q, k, v, scale, True)
    assert ((out.double() - ref).norm() / ref.norm()) < 3e-3
    built = []
    real = FmhaProblem.__init__

    def counted(self, *a, **kw):
        built.append(1)
        real(self, *a, **kw)

    monkeypatch.setattr(FmhaProblem, "__init__", counted)
    for step in range(2):
        out.fill_(float("nan"))   # a stale output handed back would fail
        q, k, v = draw()
        calls = sum(r.calls for r in replays)
        out, lse = ck_tf.attention_forward(_Attn(), q, k, v, None, scaling=scale)
        assert lse is None and out.shape == (b, sq, h, d)
        assert sum(r.calls for r in replays) == calls + 1, "one recorded launch per warm call"
        ref = _ref(q, k, v, scale, True)
        assert ((out.double() - ref).norm() / ref.norm()) < 3e-3, step
    assert not built, "a warm call builds no Problem"
    monkeypatch.setattr(FmhaProblem, "__init__", real)
    # another option (not causal) is another signature: its own first call, then its own replay
    out, _ = ck_tf.attention_forward(_Attn(), q, k, v, None, scaling=scale, is_causal=False)
    ref = _ref(q, k, v, scale, False)
    assert ((out.double() - ref).norm() / ref.norm()) < 3e-3 and len(ck_tf._WARM) == 2


@_interp
def test_training_and_masked_calls_keep_the_general_path(replays):
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 5, 16, generator=g).half().requires_grad_()
    k, v = (torch.randn(2, 2, 5, 16, generator=g).half().requires_grad_() for _ in range(2))
    out, _ = ck_tf.attention_forward(_Attn(), q, k, v, None, scaling=0.25)
    out.float().sum().backward()
    assert q.grad is not None and not ck_tf._WARM   # autograd: no replay of the forward alone


@pytest.mark.gpu
def test_decoding_steps_on_the_gpu():
    """On a GPU (``CK_TEST_GPU=1 pytest -m gpu``): a generation's decoding steps -- growing key lengths, each
    length met once per layer stack -- through the adapter, each call against the float64 reference, and
    the second layer of a step (a known signature) replaying the recorded launch."""
    if os.environ.get("CK_TEST_GPU") != "1" or not torch.cuda.is_available():
        pytest.skip("needs CK_TEST_GPU=1 and a CUDA device")
    core.clear()
    ck_tf._WARM.clear()
    b, h, hk, d = 3, 8, 2, 64
    scale = 1 / math.sqrt(d)
    for sk in range(37, 45):
        for layer in range(2):
            q = torch.randn(b, h, 1, d, device="cuda").half()
            k, v = (torch.randn(b, hk, sk, d, device="cuda").half() for _ in range(2))
            with torch.no_grad():
                out, _ = ck_tf.attention_forward(_Attn(), q, k, v, None, scaling=scale)
            ref = _ref(q.cpu(), k.cpu(), v.cpu(), scale, True)
            assert ((out.cpu().double() - ref).norm() / ref.norm()) < 3e-3, (sk, layer)
    assert len(ck_tf._WARM) == 8   # one recorded launch per key length
    core.clear()
