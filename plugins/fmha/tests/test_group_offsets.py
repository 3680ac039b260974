"""Group mode without a host synchronisation: ``ck_fmha.attention(layout='thd')`` and
``batch_prefill`` build their problem from the shapes and ``max_seqlen_q/k`` only; the offsets
``cu_seqlens_q/k`` are read on the device (clamped there, bad ones flagged), never by the host."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import ck_fmha  # noqa: E402
from ck_core import api  # noqa: E402
from ck_core.errors import InvalidProblem  # noqa: E402
from ck_fmha.api import _dispatcher  # noqa: E402
from ck_fmha.device_errors import DeviceLengthError  # noqa: E402
from ck_fmha.problem import FmhaProblem  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")]

_HOST_READS = ("tolist", "item", "cpu", "numpy", "__array__", "__int__", "__index__", "__bool__", "__iter__",
               "__float__")


@contextlib.contextmanager
def no_host_read(*watched):
    """Fail on any host read (``.tolist()``, ``.item()``, ``.cpu()``, ``int()``, iteration, numpy) of
    the ``watched`` tensors: in a GPU run each would be a device -> host synchronisation."""
    ptrs = {t.untyped_storage().data_ptr() for t in watched}   # views of them too (cu[0], cu[1:])

    def watched_(t):
        try:
            return t.untyped_storage().data_ptr() in ptrs
        except (RuntimeError, NotImplementedError):   # tensors without storage (fake, meta)
            return False

    saved = {}
    for name in _HOST_READS:
        orig = getattr(torch.Tensor, name)
        saved[name] = orig

        def spy(self, *a, _orig=orig, _name=name, **kw):
            if watched_(self):
                raise AssertionError(f"host read .{_name}() of an offsets tensor in the warm path")
            return _orig(self, *a, **kw)

        setattr(torch.Tensor, name, spy)
    try:
        yield
    finally:
        for name, orig in saved.items():
            setattr(torch.Tensor, name, orig)


def test_the_spy_sees_host_reads():
    cu = _cu([3, 4])
    for read in (lambda: cu.tolist(), lambda: int(cu[-1]), lambda: cu[1:].cpu(), lambda: cu[0].item(),
                 lambda: list(cu)):
        with no_host_read(cu), pytest.raises(AssertionError, match="host read"):
            read()


def _ref(q, k, v, cq, ck):
    """float64 attention per packed sequence (no mask), written from the definition."""
    out = np.zeros((q.shape[0], q.shape[1], v.shape[2]))
    qd, kd, vd = (x.detach().double().numpy() for x in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    for b in range(len(cq) - 1):
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        for h in range(q.shape[1]):
            s = qd[qs, h] @ kd[ks, h // rep].T / np.sqrt(q.shape[2])
            if s.shape[1] == 0:
                continue
            p = np.exp(s - s.max(axis=1, keepdims=True))
            out[qs, h] = (p / p.sum(axis=1, keepdims=True)) @ vd[ks, h // rep]
    return out


def _cu(lens):
    return torch.tensor(np.cumsum([0, *lens]), dtype=torch.int32)


@pytest.fixture
def triton_backend(monkeypatch):
    monkeypatch.setenv("CK_BACKEND", "triton")
    api.clear()
    with contextlib.suppress(DeviceLengthError):
        ck_fmha.check_errors()
    yield
    api.clear()


@pytest.mark.parametrize("lens_q,lens_k,heads", [((5, 14), (9, 3), (2, 2)), ((1, 7, 3), (6, 6, 11), (4, 2)),
                                                 ((16,), (40,), (2, 1))])
def test_the_plan_is_the_one_of_the_offsets(lens_q, lens_k, heads):
    """Same keys as the problem that carried the offsets (same maxima, same packed rows)."""
    hq, hk = heads
    q = torch.ones(1, dtype=torch.float16)   # fp16: the interpreter refuses bf16 dot kernels
    for fam, extra in (("fwd", dict(lse=True)), ("bwd_dq_dk_dv", dict(deterministic=True))):
        kw = dict(family=fam, mode="group", batch=len(lens_q), nhead_q=hq, nhead_k=hk, hdim_q=64, hdim_v=64,
                  dtype="fp16", mask="top_left", **extra)
        old = FmhaProblem(seqstart_q=tuple(np.cumsum([0, *lens_q])), seqstart_k=tuple(np.cumsum([0, *lens_k])), **kw)
        new = FmhaProblem(runtime_seqstarts=True, seqlen_q=max(lens_q), seqlen_k=max(lens_k), packed_q=sum(lens_q),
                          packed_k=sum(lens_k), **kw)
        disp = _dispatcher(q, new)
        assert [s.key.name for s in disp.plan(new).stages] == [s.key.name for s in disp.plan(old).stages]


def test_warm_group_attention_reads_no_offsets_on_the_host(triton_backend, ck_rng):
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 30)))
    tq, tk, hq, hk, d = 23, 29, 4, 2, 32
    q = torch.randn(tq, hq, d, generator=g, dtype=torch.float16)
    k = torch.randn(tk, hk, d, generator=g, dtype=torch.float16)
    v = torch.randn(tk, hk, d, generator=g, dtype=torch.float16)
    first = (_cu([9, 14]), _cu([17, 12]))
    ck_fmha.attention(q, k, v, layout="thd", cu_seqlens_q=first[0], cu_seqlens_k=first[1], max_seqlen_q=23,
                      max_seqlen_k=29)
    from ck_fmha import api as fmha_api
    cached = len(fmha_api._PROBLEMS)
    for lq, lk in (((16, 7), (5, 24)), ((0, 23), (20, 9))):   # new offsets, same shapes and maxima
        cq, ck = _cu(lq), _cu(lk)
        want = _ref(q, k, v, cq.tolist(), ck.tolist())
        with no_host_read(cq, ck):
            o = ck_fmha.attention(q, k, v, layout="thd", cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=23,
                                  max_seqlen_k=29)
        assert len(fmha_api._PROBLEMS) == cached   # no new problem for new offsets
        got = o.double().numpy()
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 5e-3


def test_warm_group_backward_reads_no_offsets_on_the_host(triton_backend, ck_rng):
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 30)))
    q, k, v = (torch.randn(19, 2, 32, generator=g, dtype=torch.float16, requires_grad=True) for _ in range(3))
    cu = _cu([5, 14])
    ck_fmha.attention(q, k, v, causal=True, layout="thd", cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=14,
                      max_seqlen_k=14).sum().backward()
    want = q.grad.clone()
    q.grad = k.grad = v.grad = None
    cu2 = _cu([5, 14])
    with no_host_read(cu2):
        ck_fmha.attention(q, k, v, causal=True, layout="thd", cu_seqlens_q=cu2, cu_seqlens_k=cu2, max_seqlen_q=14,
                          max_seqlen_k=14).sum().backward()
    assert torch.equal(q.grad, want)


@pytest.mark.parametrize("bad", [[0, 5, 30], [0, 12, 8], [-1, 5, 19], [0, 1, 19]])
def test_bad_offsets_are_flagged_not_read_past(triton_backend, bad):
    """Past the packed rows, decreasing, from below 0, or longer than max_seqlen_q: refused (on the
    CPU at once, from the device flag), and the next good call runs."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(19, 2, 32, generator=g, dtype=torch.float16) for _ in range(3))
    good = _cu([5, 14])
    with pytest.raises(DeviceLengthError, match="cu_seqlens"):
        ck_fmha.attention(q, k, v, layout="thd", cu_seqlens_q=torch.tensor(bad, dtype=torch.int32),
                          cu_seqlens_k=good, max_seqlen_q=14, max_seqlen_k=14)
    o = ck_fmha.attention(q, k, v, layout="thd", cu_seqlens_q=good, cu_seqlens_k=good, max_seqlen_q=14,
                          max_seqlen_k=14)
    assert torch.isfinite(o).all()


@pytest.mark.parametrize("deterministic", [True, False])
def test_bad_offsets_give_nan_gradients_and_the_flag(triton_backend, deterministic):
    """The backward plan with bad run-time offsets (one guard for its three stages): every gradient
    (dq, dk, dv) is NaN -- the last stage fills them in one launch -- and the flag names the offsets;
    then good offsets give finite gradients of the same signature."""
    from ck_fmha.api import _bwd

    g = torch.Generator().manual_seed(9)
    q, k, v, o, do = (torch.randn(19, 2, 32, generator=g, dtype=torch.float16) for _ in range(5))
    lse = torch.randn(2, 19, generator=g)
    good = _cu([5, 14])

    def grads(cu_q):
        return _bwd(q, k, v, o, lse, do, None, None, cu_q, good, (14, 14), False, None, (-1, -1), 0.0, "thd",
                    deterministic, 0.0, 0, 0, None, False)

    out = grads(torch.tensor([0, 12, 8], dtype=torch.int32))
    assert all(torch.isnan(x).all() for x in out[:3]), [torch.isnan(x).float().mean().item() for x in out[:3]]
    with pytest.raises(DeviceLengthError, match="cu_seqlens"):
        ck_fmha.check_errors()
    assert all(torch.isfinite(x).all() for x in grads(good)[:3])
    ck_fmha.check_errors()


def test_group_mode_needs_the_maxima(triton_backend):
    q = torch.zeros(8, 2, 32, dtype=torch.float16)
    cu = _cu([3, 5])
    with pytest.raises(InvalidProblem, match="max_seqlen_q and max_seqlen_k"):
        ck_fmha.attention(q, q, q, layout="thd", cu_seqlens_q=cu, cu_seqlens_k=cu)


def test_warm_batch_prefill_reads_no_offsets_on_the_host(triton_backend):
    from ck_fmha.prefill import batch_prefill

    g = torch.Generator().manual_seed(7)
    ps, hq, hk, d = 4, 2, 1, 32
    q = torch.randn(12, hq, d, generator=g, dtype=torch.float16)
    pool = torch.randn(9, ps, hk, d, generator=g, dtype=torch.float16)
    pages = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=torch.int32)
    lens = torch.tensor([13, 11], dtype=torch.int32)
    kw = dict(max_seqlen_q=7, max_seqlen_k=16, block_table=pages)
    batch_prefill(q, pool, pool, lens, cu_seqlens_q=_cu([5, 7]), **kw)
    cq = _cu([7, 5])
    with no_host_read(cq):
        o = batch_prefill(q, pool, pool, lens, cu_seqlens_q=cq, **kw)
    keys = [pool[pages[b]].reshape(16, hk, d)[:int(lens[b])] for b in range(2)]
    kk = torch.cat(keys)
    want = _ref(q, kk, kk, [0, 7, 12], [0, 13, 24])
    assert np.linalg.norm(o.double().numpy() - want) / np.linalg.norm(want) < 5e-3


def test_float_offsets_are_refused_warm_or_cold(triton_backend):
    q = torch.zeros(8, 2, 32, dtype=torch.float16)
    cu = _cu([3, 5])
    ck_fmha.attention(q, q, q, layout="thd", cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=5, max_seqlen_k=5)
    with pytest.raises(InvalidProblem, match="cu_seqlens_q"):
        ck_fmha.attention(q, q, q, layout="thd", cu_seqlens_q=cu.float(), cu_seqlens_k=cu, max_seqlen_q=5,
                          max_seqlen_k=5)
