"""Warm calls of ck_gemm.matmul, ck_conv.conv2d and ck_fmha.attention (ck_core.warm): one
signature, one closure.

A wrong cache hit is a silently wrong result, so each test varies one field of the
signature (shape, strides, dtype, alignment, flags, device) and checks that a new
closure is made and that every call, warm or cold, matches a float64 reference on
fresh data.  ``replay`` runs the launchers' recorded-replay path on the CPU: records
are made as on a GPU, and a replay launches the recorded kernel through Triton's
interpreter with the new arguments, so the replayed slots are checked for real.
"""
import os
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="CPU tensors run triton kernels only in the interpreter")

from ck_conv.api import conv2d  # noqa: E402
from ck_core import api as core  # noqa: E402
from ck_core import warm  # noqa: E402
from ck_core.backends import triton_replay  # noqa: E402
from ck_core.testing import interp_replays  # noqa: E402
from ck_gemm.api import matmul  # noqa: E402

F = torch.nn.functional


@pytest.fixture(params=["replay", "plain"])
def route(request, monkeypatch, ck_dispatch_log):
    """``replay``: the GPU route (recorded replays, run by the interpreter); ``plain``: the CPU route."""
    monkeypatch.setenv("CK_BACKEND", "triton")
    core.clear()
    replays = interp_replays(monkeypatch) if request.param == "replay" else []
    yield request.param, replays
    core.clear()


def _rel(got, want) -> float:
    return float((got.detach().double() - want).norm() / want.norm())


def _rand(g, *shape, dtype=torch.float32):
    return (torch.rand(*shape, generator=g) * 2 - 1).to(dtype)


def _gen(ck_rng):
    return torch.Generator().manual_seed(int(ck_rng.integers(1 << 31)))


def _misaligned(g, *shape, dtype=torch.float32):
    """A tensor whose data pointer is 4 bytes past a 16-byte boundary."""
    n = 1
    for s in shape:
        n *= s
    buf = _rand(g, n + 8, dtype=dtype)
    off = next(i for i in range(8) if (buf.data_ptr() + i * buf.element_size()) % 16 == 4)
    return buf[off:off + n].view(*shape)


def test_matmul_each_signature_field_makes_a_new_plan(route, ck_dispatch_log, ck_rng):
    g = _gen(ck_rng)
    m, n, k = (int(ck_rng.integers(3, 12)) * 2 + 1 for _ in range(3))
    base = lambda: (_rand(g, m, k), _rand(g, k, n))  # noqa: E731
    variants = {
        "base": (base, {}),
        "shape": (lambda: (_rand(g, m + 2, k), _rand(g, k, n)), {}),
        "stride": (lambda: (_rand(g, m, k), _rand(g, n, k).t()), {}),
        "padded rows": (lambda: (_rand(g, m, k + 3)[:, :k], _rand(g, k, n)), {}),
        "dtype": (lambda: (_rand(g, m, k, dtype=torch.float16), _rand(g, k, n, dtype=torch.float16)), {}),
        "alignment": (lambda: (_misaligned(g, m, k), _rand(g, k, n)), {}),
        "activation": (base, {"activation": "relu"}),
        "out_dtype": (base, {"out_dtype": torch.float16}),
        "d": (base, {"d": (_rand(g, n),)}),
        "batch": (lambda: (_rand(g, 2, m, k), _rand(g, k, n)), {}),
    }
    for name, (make, kw) in variants.items():
        before = warm.size()
        for call in range(3):   # cold, then warm twice, each on fresh data
            a, b = make()
            got = matmul(a, b, **kw)
            want = a.double() @ b.double() + sum(d.double() for d in kw.get("d", ()))
            if kw.get("activation") == "relu":
                want = torch.relu(want)
            tol = 2e-3 if a.dtype == torch.float16 or "out_dtype" in kw else 1e-5
            assert got.shape == want.shape and _rel(got, want) < tol, (name, call)
            assert warm.size() == before + 1, (name, call, "one new closure, then hits")
        assert len(ck_dispatch_log.take()) == 3, name   # observers see warm calls too


def test_matmul_replays_the_recorded_launch(route, ck_rng):
    kind, replays = route
    if kind != "replay":
        pytest.skip("the recorded replay is the GPU route")
    g = _gen(ck_rng)
    a, b = _rand(g, 33, 17), _rand(g, 17, 9)
    matmul(a, b)
    assert len(replays) == 1
    for _ in range(2):
        a, b = _rand(g, 33, 17), _rand(g, 17, 9)
        assert _rel(matmul(a, b), a.double() @ b.double()) < 1e-5
    assert replays[0].calls == 2, "warm calls replay the recording, nothing else"


@pytest.mark.parametrize("batch", [1, 3])
def test_split_k_and_batched_gemm_replay_every_launch(route, ck_rng, batch):
    """A split-K GEMM is two launches (partials into a workspace, then their sum) and a batched one
    a 3-D grid: warm calls replay both launches with a fresh workspace, on fresh operands."""
    from ck_core import Dispatcher, Registry
    from ck_gemm import GemmProblem

    kind, replays = route
    if kind != "replay":
        pytest.skip("the recorded replay is the GPU route")
    reg = Registry.from_enumeration("gemm", "sm90", "triton", dtypes=["fp16"], layouts=["rcr"])
    sk = reg.filter(lambda f: f["split_k"] > 1 and f["variant"] == "tile" and f["tile_k"] <= 64)
    assert len(sk), "no split-K key to test"
    disp = Dispatcher(sk, backend="triton")
    g = _gen(ck_rng)
    m, n, k = (int(x) for x in ck_rng.integers(9, 40, size=3))
    p = GemmProblem(m=m, n=n, k=k * 8, dtype="fp16", layout="rcr", **({"batch": batch} if batch > 1 else {}))
    lead = (batch,) if batch > 1 else ()
    for call in range(3):
        a = _rand(g, *lead, m, k * 8, dtype=torch.float16)
        b = _rand(g, *lead, n, k * 8, dtype=torch.float16)
        got = disp.run(p, a, b)
        want = a.double() @ b.double().transpose(-1, -2)
        assert _rel(got, want) < 2e-3, (call, disp.select(p).name)
        if call == 0:
            seen, base = len(replays), sum(r.calls for r in replays)
            assert seen == 2, "a split-K GEMM records its two launches"
    assert len(replays) == seen and sum(r.calls for r in replays) - base == 4


def test_tensor_sig_has_the_device():
    a = torch.empty(4, 4)
    m = torch.empty(4, 4, device="meta")
    assert warm.tensor_sig(a)[:3] == warm.tensor_sig(m)[:3]
    assert warm.tensor_sig(a) != warm.tensor_sig(m)


def _conv_ref(x, w, **kw):
    return F.conv2d(x.double(), w.double(), **kw)


def test_conv2d_each_signature_field_makes_a_new_plan(route, ck_dispatch_log, ck_rng):
    g = _gen(ck_rng)
    n, c, k, h = 2, 4, 6, int(ck_rng.integers(5, 8))
    cl = torch.channels_last
    base = lambda: (_rand(g, n, c, h, h), _rand(g, k, c, 3, 3))  # noqa: E731
    variants = {
        "base": (base, {"padding": 1}),
        "shape": (lambda: (_rand(g, n, c, h + 1, h), _rand(g, k, c, 3, 3)), {"padding": 1}),
        "channels_last": (lambda: (_rand(g, n, c, h, h).to(memory_format=cl),
                                   _rand(g, k, c, 3, 3).to(memory_format=cl)), {"padding": 1}),
        "dtype": (lambda: (_rand(g, n, c, h, h, dtype=torch.float16), _rand(g, k, c, 3, 3, dtype=torch.float16)),
                  {"padding": 1}),
        "alignment": (lambda: (_misaligned(g, n, c, h, h), _rand(g, k, c, 3, 3)), {"padding": 1}),
        "stride": (base, {"padding": 1, "stride": 2}),
        "padding": (base, {"padding": [0, 1]}),
        "dilation": (base, {"padding": 1, "dilation": 2}),
        "groups": (lambda: (_rand(g, n, c, h, h), _rand(g, k, c // 2, 3, 3)), {"padding": 1, "groups": 2}),
    }
    for name, (make, kw) in variants.items():
        before = warm.size()
        for call in range(3):
            x, w = make()
            got = conv2d(x, w, **kw)
            want = _conv_ref(x, w, **kw)
            tol = 3e-3 if x.dtype == torch.float16 else 1e-5
            assert got.shape == want.shape and _rel(got, want) < tol, (name, call)
            assert got.is_contiguous(memory_format=cl if name == "channels_last" else torch.contiguous_format)
            assert warm.size() == before + 1, (name, call)
        assert len(ck_dispatch_log.take()) == 3, name
    kind, replays = route
    if kind == "replay":   # the warm calls of some variants went through recorded replays
        assert any(r.calls for r in replays)


def test_conv2d_backward_replays_its_recorded_launches(route, ck_rng):
    """bwd_data and bwd_weight launchers replay their first call's launches too (tables, split
    workspaces and counters included): later calls on fresh tensors match float64 gradients and
    record nothing new."""
    kind, replays = route
    if kind != "replay":
        pytest.skip("the recorded replay is the GPU route")
    g = _gen(ck_rng)
    for kw, wshape in (({"padding": 1}, (6, 4, 3, 3)), ({"padding": 1, "stride": 2}, (6, 4, 3, 3)),
                       ({"padding": 0}, (5, 4, 1, 1)), ({"padding": 1, "groups": 2}, (6, 2, 3, 3))):
        n, h = 2, int(ck_rng.integers(5, 9))
        seen = None
        for call in range(3):
            x = _rand(g, n, 4, h, h).requires_grad_()
            w = _rand(g, *wshape).requires_grad_()
            y = conv2d(x, w, **kw)
            dy = _rand(g, *y.shape)
            y.backward(dy)
            xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
            F.conv2d(xd, wd, **kw).backward(dy.double())
            assert _rel(x.grad, xd.grad) < 1e-5 and _rel(w.grad, wd.grad) < 1e-5, (kw, call)
            if call == 0:
                seen = len(replays)
                base = [r.calls for r in replays]
        assert len(replays) == seen, (kw, "warm calls recorded nothing new")
        assert sum(r.calls for r in replays) - sum(base) >= 2 * 3, (kw, "fwd, bwd_data, bwd_weight replayed twice")


def test_attention_each_signature_field_makes_a_new_plan(route, ck_dispatch_log, ck_rng):
    """ck_fmha.attention without autograd: every warm call (the replayed launch on the GPU route)
    matches float64 attention on fresh q, k, v; each signature field gets its own closure."""
    from ck_fmha import attention

    g = _gen(ck_rng)
    b, h, s, d = 1, 2, int(ck_rng.integers(9, 20)), 32
    f16 = torch.float16
    qkv = lambda *shape: tuple(_rand(g, *shape, dtype=f16) for _ in range(3))  # noqa: E731
    variants = {
        "base": (lambda: qkv(b, h, s, d), {}),
        "shape": (lambda: qkv(b, h, s + 3, d), {}),
        "stride": (lambda: tuple(t.transpose(1, 2) for t in qkv(b, s, h, d)), {}),
        "layout": (lambda: qkv(b, s, h, d), {"layout": "bshd"}),
        "alignment": (lambda: (_misaligned(g, b, h, s, d, dtype=f16),) + qkv(b, h, s, d)[1:], {}),
        "causal": (lambda: qkv(b, h, s, d), {"causal": True}),
        "scale": (lambda: qkv(b, h, s, d), {"scale": 0.3}),
        "softcap": (lambda: qkv(b, h, s, d), {"softcap": 2.0}),
    }
    for name, (make, kw) in variants.items():
        before = warm.size()
        for call in range(3):
            q, k, v = make()
            got = attention(q, k, v, **kw)
            x = [t.double() if kw.get("layout") != "bshd" else t.double().transpose(1, 2) for t in (q, k, v)]
            logits = (x[0] @ x[1].transpose(-1, -2)) * kw.get("scale", d ** -0.5)
            if "softcap" in kw:
                logits = kw["softcap"] * torch.tanh(logits / kw["softcap"])
            if kw.get("causal"):
                logits = logits.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
            want = torch.softmax(logits, -1) @ x[2]
            if kw.get("layout") == "bshd":
                want = want.transpose(1, 2)
            assert got.shape == want.shape and _rel(got, want) < 3e-3, (name, call)
            assert warm.size() == before + 1, (name, call)
        assert len(ck_dispatch_log.take()) == 3, name
    kind, replays = route
    if kind == "replay":   # warm calls replayed the recorded forward launch
        assert any(r.calls for r in replays) and all(r.fn.__name__ == "fmha_fwd_kernel" for r in replays)


@pytest.mark.parametrize("deterministic", [True, False])
def test_attention_backward_warm_calls(route, ck_dispatch_log, ck_rng, deterministic):
    """Eager attention forward + backward: the backward's warm calls (its recorded launches, with
    the delta and dQ accumulator allocated again, on the GPU route) give float64 gradients on
    fresh data, call after call, for two signatures in turn."""
    from ck_fmha import attention

    g = _gen(ck_rng)
    s = int(ck_rng.integers(9, 20))
    kind, replays = route
    for shape, causal in [((1, 2, s, 32), False), ((2, 1, s + 4, 32), True), ((1, 2, s, 32), False)]:
        for call in range(3):
            q, k, v = (_rand(g, *shape, dtype=torch.float16).requires_grad_() for _ in range(3))
            do = _rand(g, *shape, dtype=torch.float16)
            o = attention(q, k, v, causal=causal, deterministic=deterministic)
            o.backward(do)
            x = [t.detach().double().requires_grad_() for t in (q, k, v)]
            ref = F.scaled_dot_product_attention(*x, is_causal=causal)
            ref.backward(do.double())
            assert _rel(o, ref.detach()) < 3e-3, (shape, call)
            for t, r, name in zip((q, k, v), x, "qkv"):
                assert _rel(t.grad, r.grad) < 1e-2, (shape, call, name)
    if kind == "replay":   # warm backward calls replayed the recording (its check on the cold call: 1)
        bwd = [r for r in replays if r.fn.__name__.startswith("fmha_bwd")]
        assert bwd and max(r.calls for r in bwd) >= 3, [r.calls for r in bwd]


def test_eager_autograd_uses_the_cache_and_gets_the_gradients(route, ck_dispatch_log, ck_rng):
    g = _gen(ck_rng)
    before = warm.size()
    for call in range(2):
        a, b, d = _rand(g, 5, 7).requires_grad_(), _rand(g, 7, 3), _rand(g, 3).requires_grad_()
        y = matmul(a, b, d=(d,), activation="relu")
        w = torch.rand(y.shape, generator=g, dtype=torch.float64)
        (y.double() * w).sum().backward()
        refs = [t.detach().double().requires_grad_() for t in (a, b, d)]
        ref = torch.relu(refs[0] @ refs[1] + refs[2])
        (ref * w).sum().backward()
        assert _rel(y, ref.detach()) < 1e-5 and b.grad is None
        assert _rel(a.grad, refs[0].grad) < 1e-5 and _rel(d.grad, refs[2].grad) < 1e-5, call
        assert len(ck_dispatch_log.take()) == 3   # forward; backward: pre-activation, dA
    assert warm.size() >= before + 1


@pytest.mark.slow
def test_warm_call_host_time(monkeypatch, ck_manager, fake_arch):
    """A generous guard: a warm stubbed matmul/conv2d call stays far below the old ~100-400 us."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    import overhead

    monkeypatch.setenv("CK_BACKEND", "triton")
    monkeypatch.setenv("CK_CPU_ARCH", fake_arch.name)   # unobserved: the call users make
    core.clear()
    for mod, attr, stub in [(triton_replay, "replayable", lambda t: True),
                            (triton_replay, "record", lambda fn, grid, args, kwargs, **kw:
                             overhead._StubReplay(fn, args, kwargs))]:
        monkeypatch.setattr(mod, attr, stub)
    from ck_core.backends import triton_artifacts
    monkeypatch.setattr(triton_artifacts, "launch", lambda *a, **k: None)
    a, b = torch.randn(64, 64, dtype=torch.float16), torch.randn(64, 64, dtype=torch.float16)
    cl = torch.channels_last
    x = torch.randn(1, 8, 6, 6, dtype=torch.float16).to(memory_format=cl)
    w = torch.randn(8, 8, 3, 3, dtype=torch.float16).to(memory_format=cl)
    for call, limit in ((lambda: matmul(a, b), 50.0), (lambda: conv2d(x, w, padding=1), 100.0)):
        call(), call()
        best = min(_per_call(call) for _ in range(5))
        assert best < limit, f"{best:.1f} us per warm call"
    core.clear()


def _per_call(call, n=200):
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - t0) / n * 1e6
