"""Group-mode attention's warm calls (issue #26): the one kernel launch (which checks the offsets and
poisons its outputs itself) is recorded on a signature's first call and replayed on the next ones with
new tensors, bad offsets included.  On the CPU the recorded launches are stood in for by interpreted
launches of the same kernels and arguments."""
import inspect

import pytest
import torch

from ck_core import warm
from ck_fmha import device_errors as D


class _Interpreted:
    def __init__(self, fn, grid, args, kwargs, via):
        names = list(fn.arg_names)
        via(fn, grid)(*args, **kwargs)
        self.fn, self.grid, self.names = fn, grid, tuple(names)
        self.args = list(args) + [kwargs.get(n, _default(fn, n)) for n in names[len(args):]]
        self.calls = 0

    def slot(self, name):
        return self.names.index(name)

    def __call__(self, args):
        self.calls += 1
        self.fn[self.grid](**dict(zip(self.names, args)))


def _default(fn, name):
    return inspect.signature(getattr(fn, "fn", fn)).parameters[name].default


@pytest.fixture
def interpreted_replays(monkeypatch):
    from ck_core.api import clear
    from ck_core.backends import triton_replay

    made = []

    def record(fn, grid, args, kwargs, name=None, extra=None, via=None):
        made.append(_Interpreted(fn, grid, args, kwargs, via or (lambda f, g: f[g])))
        return made[-1]

    monkeypatch.setattr(triton_replay, "replayable", lambda t: True)
    monkeypatch.setattr(triton_replay, "record", record)
    clear()
    D._FLAGS.clear()
    yield made
    clear()
    D._FLAGS.clear()


def _ref(q, k, v, cu):
    out = torch.empty(q.shape, dtype=torch.float64)
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        qq, kk, vv = (x[s:e].double().transpose(0, 1) for x in (q, k, v))
        p = torch.softmax(qq @ kk.transpose(1, 2) / q.shape[-1] ** 0.5, -1)
        out[s:e] = (p @ vv).transpose(0, 1)
    return out


@pytest.mark.parametrize("same", [True, False])
def test_group_attention_replays_its_one_launch(interpreted_replays, same):
    from ck_fmha import attention

    g = torch.Generator().manual_seed(7 + same)
    lens = [5, 11, 3]
    cu = torch.tensor([0, 5, 16, 19], dtype=torch.int32)
    t = lambda: torch.randn(19, 2, 16, generator=g).half()   # noqa: E731
    call = lambda q, k, v, cq, ck: attention(q, k, v, layout="thd", cu_seqlens_q=cq, cu_seqlens_k=ck,  # noqa: E731
                                             max_seqlen_q=max(lens), max_seqlen_k=max(lens))
    q, k, v = t(), t(), t()
    before = warm.size()
    o = call(q, k, v, cu, cu if same else cu.clone())
    assert warm.size() == before + 1 and [r.fn.__name__ for r in interpreted_replays] == ["fmha_fwd_kernel"]
    err = (o.double() - _ref(q, k, v, cu)).norm() / _ref(q, k, v, cu).norm()
    assert err < 2e-2
    calls = sum(r.calls for r in interpreted_replays)
    q, k, v = t(), t(), t()                                  # new tensors, one signature: the replay
    cu2 = cu.clone()
    o = call(q, k, v, cu2, cu2 if same else cu2.clone())
    assert sum(r.calls for r in interpreted_replays) > calls and warm.size() == before + 1
    assert (o.double() - _ref(q, k, v, cu)).norm() / _ref(q, k, v, cu).norm() < 2e-2
    bad = torch.tensor([0, 5, 16, 40], dtype=torch.int32)   # past the packed rows: NaN and the flag
    with pytest.raises(D.DeviceLengthError, match="group-mode offsets"):
        call(q, k, v, bad, bad if same else bad.clone())


def test_group_backward_replays(interpreted_replays):
    from ck_fmha import attention

    g = torch.Generator().manual_seed(3)
    cu = torch.tensor([0, 6, 13], dtype=torch.int32)
    before = warm.size()
    for step in range(2):   # the cold step records, the second replays (new tensors, one signature)
        q, k, v = (torch.randn(13, 2, 16, generator=g).half().requires_grad_() for _ in range(3))
        do = torch.randn(13, 2, 16, generator=g).half()
        o = attention(q, k, v, layout="thd", cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=7, max_seqlen_k=7)
        o.backward(do)
        ref = [x.detach().double().requires_grad_() for x in (q, k, v)]
        _ref_autograd(*ref, cu).backward(do.double())
        for got, want in zip((q.grad, k.grad, v.grad), ref):
            assert float((got.double() - want.grad).norm() / want.grad.norm()) < 3e-2
        if step == 0:
            calls = sum(r.calls for r in interpreted_replays)
    assert sum(r.calls for r in interpreted_replays) > calls and warm.size() == before + 2   # fwd and bwd


def _ref_autograd(q, k, v, cu):
    outs = []
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        qq, kk, vv = (x[s:e].transpose(0, 1) for x in (q, k, v))
        p = torch.softmax(qq @ kk.transpose(1, 2) / q.shape[-1] ** 0.5, -1)
        outs.append((p @ vv).transpose(0, 1))
    return torch.cat(outs)


@pytest.mark.gpu
def test_gpu_group_warm_calls_check_each_call():
    """On a GPU: warm varlen calls (the one recorded kernel launch, which checks the offsets itself)
    against a float64 reference, and a warm call of the same signature with offsets past the packed
    rows gives NaN and the flag."""
    import os

    if os.environ.get("CK_TEST_GPU") != "1" or not torch.cuda.is_available():
        pytest.skip("needs CK_TEST_GPU=1 and a CUDA device")
    from ck_fmha import attention, check_errors

    dev = "cuda"
    cu = torch.tensor([0, 37, 100, 129], dtype=torch.int32, device=dev)
    call = lambda q, k, v, c: attention(q, k, v, layout="thd", cu_seqlens_q=c, cu_seqlens_k=c,  # noqa: E731
                                        max_seqlen_q=63, max_seqlen_k=63)
    for _ in range(3):
        q, k, v = (torch.randn(129, 4, 64, device=dev).half() for _ in range(3))
        want = _ref(q.cpu(), k.cpu(), v.cpu(), cu.cpu())
        o = call(q, k, v, cu)
        assert float((o.cpu().double() - want).norm() / want.norm()) < 1e-2
    check_errors()
    o = call(q, k, v, torch.tensor([0, 37, 100, 200], dtype=torch.int32, device=dev))
    assert torch.isnan(o).all()
    with pytest.raises(D.DeviceLengthError, match="group-mode offsets"):
        check_errors()
    assert torch.isfinite(call(q, k, v, cu)).all()
    check_errors()
