"""What a warm conv call costs the device (issue #26): per warm call of every conv API (conv1d/2d/3d,
NCHW and channels-last, grouped and depthwise; forward alone and forward+backward through autograd)
no Problem is built and no selection runs, and the call makes exactly the launches its plan needs
(counted with the launches stubbed, as ``benchmarks/overhead.py --part cpu`` does, on the sm90 arch's
registries) plus the device copies a layout still needs (counted as torch ops).  The numerics of
these paths are the interpreter tests' (test_nchw_direct.py, tests/test_warm_autograd.py)."""
from __future__ import annotations

import os
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="the stubbed launches read the interpreter's argument names")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from ck_core import api as core  # noqa: E402
from ck_core.backends import triton_artifacts, triton_replay  # noqa: E402
from ck_core.dispatcher import Dispatcher  # noqa: E402

#: torch ops that only make views or allocate (no kernel on a GPU)
_FREE = {"view", "permute", "as_strided", "detach", "empty_strided", "empty", "_reshape_alias", "alias",
         "expand", "unsqueeze", "squeeze", "t", "transpose", "slice", "select", "_unsafe_view"}


class _Stub:
    """A recorded launch that counts its replays and launches nothing."""

    def __init__(self, fn, args, kwargs, n):
        self.names = tuple(fn.arg_names)
        self.args = list(args) + [kwargs.get(a) for a in self.names[len(args):]]
        self.n = n

    def __call__(self, args):
        self.n["launches"] += 1

    def slot(self, name):
        return self.names.index(name)


class _DeviceOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in _FREE:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture
def counted(monkeypatch):
    """Launches stubbed and counted (cold launches and replays alike), Problems and Dispatcher calls counted."""
    from ck_conv.problem import ConvProblem

    n = Counter()
    monkeypatch.setenv("CK_BACKEND", "triton")
    monkeypatch.setenv("CK_CPU_ARCH", "sm90")
    monkeypatch.setattr(triton_artifacts, "launch", lambda *a, **k: n.update(["launches"]))
    monkeypatch.setattr(triton_replay, "replayable", lambda t: True)
    monkeypatch.setattr(triton_replay, "record", lambda fn, grid, args, kwargs, **kw: _Stub(fn, args, kwargs, n))

    def wrap(cls, attr, label):
        real = getattr(cls, attr)

        def counted_call(*a, **kw):
            n[label] += 1
            return real(*a, **kw)
        monkeypatch.setattr(cls, attr, counted_call)

    wrap(ConvProblem, "__init__", "problems")
    for name in ("select", "plan", "rank"):
        wrap(Dispatcher, name, name)
    core.clear()
    yield n
    core.clear()


def _case(nd, c, k, groups, channels_last, grad):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, c, *(9,) * nd, generator=g)
    w = torch.randn(k, c // groups, *(3,) * nd, generator=g)
    if channels_last:
        x, w = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
    fn = {1: "conv1d", 2: "conv2d", 3: "conv3d"}[nd]
    import ck_conv

    conv = getattr(ck_conv, fn)
    if not grad:
        return lambda: conv(x, w, padding=1, groups=groups)
    x.requires_grad_()
    w.requires_grad_()
    y = conv(x, w, padding=1, groups=groups)
    dy = torch.randn(y.shape, generator=g).to(memory_format=torch.channels_last) if channels_last \
        else torch.randn(y.shape, generator=g)   # as autograd hands a network's gradients: y's layout

    def step():
        x.grad = w.grad = None
        conv(x, w, padding=1, groups=groups).backward(dy)
    return step


#: (nd, C, K, groups, channels_last) -> (launches, device ops) of a warm forward and a warm fwd+bwd step.
#: NCHW: the implicit-GEMM and im2col forward, the bwd_data and the per-tap bwd_weight kernels (the
#: picks on these shapes) read and write it in place; the depthwise, tensor-descriptor and merged-group
#: kernels would take channels-last copies.  Depthwise bwd_weight: the tuned first tier (``first_tier``:
#: ``dw``) sums into a zeroed fp32 buffer (a memset; fp16/bf16 add a cast), not the one-launch
#: ``dw_atomicfix`` family.
CASES = {
    "conv1d": ((1, 16, 16, 1, False), (1, {}), (3, {})),
    "conv2d": ((2, 16, 16, 1, False), (1, {}), (3, {})),
    "conv3d": ((3, 16, 16, 1, False), (1, {}), (3, {})),
    "conv2d channels_last": ((2, 16, 16, 1, True), (1, {}), (3, {})),
    "conv2d groups=2": ((2, 16, 32, 2, False), (1, {}), (3, {})),
    "conv2d groups=2 channels_last": ((2, 16, 32, 2, True), (1, {}), (3, {})),
    "conv2d depthwise channels_last": ((2, 16, 16, 16, True), (1, {}), (3, {"zeros": 1})),
}


@pytest.mark.parametrize("grad", [False, True], ids=["forward", "fwd+bwd"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_warm_call_builds_nothing_and_makes_its_plans_launches(counted, case, grad):
    args, fwd, step = CASES[case]
    call = _case(*args, grad)
    call()
    call()   # warm from here
    counted.clear()
    with _DeviceOps() as dev:
        call()
    want_launches, want_ops = step if grad else fwd
    assert counted["problems"] == 0 and not {"select", "plan", "rank"} & set(counted), (case, dict(counted))
    assert counted["launches"] == want_launches, (case, dict(counted))
    assert dict(dev.ops) == want_ops, (case, dict(dev.ops))
