"""torch.compile traces conv forward and forward+backward (issue #26): the custom ops ``ck::conv``,
``ck::conv_bwd_data``, ``ck::conv_bwd_weight`` have fake implementations whose outputs have the real
outputs' shapes and strides (NCHW and channels-last, grouped, 1D / 3D), and a compiled step
(``aot_eager``: AOT autograd's forward and backward graphs, on the CPU) matches torch's conv in
float64, forward and both gradients."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import ck_conv  # noqa: E402
from ck_conv import api  # noqa: E402

F = torch.nn.functional
CL = {2: torch.channels_last, 3: torch.channels_last_3d}

#: (nd, N, C, K, spatial, filter, stride, padding, dilation, groups, channels_last)
CASES = {
    "conv2d nchw groups=2 strided": (2, 2, 6, 4, (7, 6), 3, 2, 1, 1, 2, False),
    "conv2d channels_last dilated": (2, 2, 5, 3, (6, 7), 3, 1, 2, 2, 1, True),
    "conv1d": (1, 3, 4, 5, (9,), 2, 3, 1, 1, 1, False),
    "conv3d channels_last": (3, 1, 3, 2, (4, 5, 3), 2, 1, 1, 1, 1, True),
}


def _operands(case, g, dtype=torch.float32):
    nd, n, c, k, sp, f, s, p, d, groups, cl = CASES[case]
    x = torch.rand(n, c, *sp, generator=g, dtype=dtype) * 2 - 1
    w = torch.rand(k, c // groups, *(f,) * nd, generator=g, dtype=dtype) * 2 - 1
    if cl:
        x, w = x.to(memory_format=CL[nd]), w.to(memory_format=CL[nd])
    return x, w, dict(stride=s, padding=p, dilation=d, groups=groups)


def _args(nd, kw):
    return ([kw["stride"]] * nd, [kw["padding"]] * nd, [kw["dilation"]] * nd, kw["groups"])


@pytest.mark.parametrize("case", list(CASES))
def test_fake_outputs_have_the_real_strides(case, ck_rng):
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 31)))
    x, w, kw = _operands(case, g)
    nd = x.dim() - 2
    stride, padding, dilation, groups = _args(nd, kw)
    cl = api._is_channels_last(x)
    y = api.conv_op(x, w, stride, padding, dilation, groups)
    dy = torch.rand_like(y)
    dx = api.conv_bwd_data_op(dy, w, list(x.shape), stride, padding, dilation, groups, cl)
    dw = api.conv_bwd_weight_op(x, dy, list(w.shape), stride, padding, dilation, groups, cl)
    with FakeTensorMode() as mode:
        fx, fw, fdy = mode.from_tensor(x), mode.from_tensor(w), mode.from_tensor(dy)
        fy = api.conv_op(fx, fw, stride, padding, dilation, groups)
        fdx = api.conv_bwd_data_op(fdy, fw, list(x.shape), stride, padding, dilation, groups, cl)
        fdw = api.conv_bwd_weight_op(fx, fdy, list(w.shape), stride, padding, dilation, groups, cl)
    for name, real, fake in (("y", y, fy), ("dx", dx, fdx), ("dw", dw, fdw)):
        assert (tuple(fake.shape), fake.stride(), fake.dtype) == (tuple(real.shape), real.stride(), real.dtype), \
            (case, name)


@pytest.mark.parametrize("case", ["conv2d nchw groups=2 strided", "conv3d channels_last"])   # (compiles: seconds each)
def test_compiled_fwd_bwd_matches_float64(case, ck_rng):
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 31)))
    x, w, kw = _operands(case, g)
    nd = x.dim() - 2
    conv = (ck_conv.conv1d, ck_conv.conv2d, ck_conv.conv3d)[nd - 1]
    tconv = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
    bias = torch.rand(w.shape[0], generator=g) - 0.5
    torch._dynamo.reset()

    def step(x, w, b):
        return conv(x, w, b, **kw).sin()

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    for _ in range(2):   # the second call runs the compiled graphs again on new data
        xs, ws = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        out = compiled(xs, ws, bias)
        dy = torch.rand(out.shape, generator=g) - 0.5
        out.backward(dy)
        xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
        want = tconv(xd, wd, bias.double(), **kw).sin()
        want.backward(dy.double())
        rel = lambda a, b: float((a.detach().double() - b.detach()).norm() / b.detach().norm())  # noqa: E731
        assert rel(out, want) < 1e-5 and rel(xs.grad, xd.grad) < 1e-5 and rel(ws.grad, wd.grad) < 1e-5, case
        x, w = torch.rand_like(x) * 2 - 1, torch.rand_like(w) * 2 - 1
    torch._dynamo.reset()
