"""ck_conv.conv1d/2d/3d: NCHW and channels-last tensors through the Dispatcher, forward and backward.

References are float64 torch convolutions of the same inputs; every
forward, bwd_data and bwd_weight call must reach the Dispatcher (a DispatchLog
plugin sees it) and launch exactly its plan's keys.
"""
import os

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from ck_conv.api import conv1d, conv2d, conv3d  # noqa: E402
from ck_core.errors import InvalidProblem  # noqa: E402

BACKENDS = ["numpy", pytest.param("triton", marks=pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="CPU tensors run triton kernels only in the interpreter"))]
OURS = {1: conv1d, 2: conv2d, 3: conv3d}
TORCH = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
CL = {2: torch.channels_last, 3: torch.channels_last_3d}


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch, ck_dispatch_log):
    if request.param == "triton":
        pytest.importorskip("triton")
    monkeypatch.setenv("CK_BACKEND", request.param)
    return request.param


def _rel(got, want) -> float:
    return float((got.detach().double() - want).norm() / want.norm())


CASES = [  # ndim, channels_last, groups, stride, padding, dilation
    (1, False, 1, 1, 0, 1),
    (1, False, 2, 2, 1, 2),
    (2, False, 2, 2, 1, 1),
    (2, True, 1, 1, 1, 2),
    (3, False, 1, 2, 1, 1),
    (3, True, 2, 1, 0, 1),
]


@pytest.mark.parametrize("nd,cl,groups,stride,padding,dilation", CASES)
def test_conv_forward_backward(backend, ck_dispatch_log, ck_rng, nd, cl, groups, stride, padding, dilation):
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 31)))
    r = lambda *s: torch.rand(*s, generator=g) * 2 - 1  # noqa: E731
    n, c, k = 2, 2 * groups, 3 * groups
    spatial = [int(ck_rng.integers(5, 9 if nd < 3 else 6)) for _ in range(nd)]
    x, w, bias = r(n, c, *spatial), r(k, c // groups, *([3] * nd)), r(k)
    if cl:
        x = x.to(memory_format=CL[nd])
    x.requires_grad_(), w.requires_grad_(), bias.requires_grad_()
    y = OURS[nd](x, w, bias, stride=stride, padding=padding, dilation=dilation, groups=groups)
    dy = torch.rand(y.shape, generator=g, dtype=torch.float64)
    (y.double() * dy).sum().backward()
    refs = [t.detach().double().requires_grad_() for t in (x, w, bias)]
    want = TORCH[nd](*refs, stride=stride, padding=padding, dilation=dilation, groups=groups)
    (want * dy).sum().backward()
    assert y.shape == want.shape and y.dtype == torch.float32
    assert _rel(y, want.detach()) < 1e-5
    for t, ref in zip((x, w, bias), refs):
        assert _rel(t.grad, ref.grad) < 1e-5
    if cl:  # the result keeps the input's memory format
        assert y.is_contiguous(memory_format=CL[nd]) and x.grad.is_contiguous(memory_format=CL[nd])
    runs = ck_dispatch_log.take()
    assert [p.direction for p, _, _ in runs] == ["forward", "bwd_data", "bwd_weight"]
    for problem, planned, launched in runs:
        assert launched == planned and launched and all(".fake64." in k for k in launched)
        assert problem.layout_family == ("nhwgc" if cl else "ngchw") and problem.G == groups


def test_conv_without_grad_and_unbatched(backend, ck_dispatch_log, ck_rng):
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 31)))
    x, w = torch.rand(3, 6, 7, generator=g), torch.rand(4, 3, 2, 2, generator=g)
    with torch.no_grad():
        y = conv2d(x, w, stride=(1, 2), padding=(1, 0))
    assert _rel(y, F.conv2d(x.double(), w.double(), stride=(1, 2), padding=(1, 0))) < 1e-5
    assert len(ck_dispatch_log.take()) == 1


def test_conv_bad_input_says_what_to_fix(ck_dispatch_log):
    x, w = torch.ones(1, 4, 5, 5), torch.ones(2, 4, 3, 3)
    with pytest.raises(InvalidProblem, match="float32"):
        conv2d(x.double(), w.double())
    with pytest.raises(InvalidProblem, match="channels"):
        conv2d(x, w, groups=2)
    with pytest.raises(InvalidProblem, match="same"):
        conv2d(x, w, padding="same")
    with pytest.raises(InvalidProblem, match="4-D"):
        conv2d(torch.ones(1, 1, 4, 5, 5), w)
    assert ck_dispatch_log.take() == []
