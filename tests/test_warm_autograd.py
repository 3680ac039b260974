"""Warm eager steps through autograd, and warm decode calls (issue #26): table lookups and launches.

A warm forward+backward step of a known signature builds no Problem and runs no selection: the
autograd context keeps its signature's :class:`ck_core.warm.Entry`, whose backward closures were
made on the first backward step.  Every step here runs on fresh random data and is checked against
float64 references written from the math; the previous step's outputs and gradients are poisoned
(NaN) first, so a closure that handed back a stale buffer, or launched on the old pointers, fails.
``replay``: the GPU route (launches recorded and replayed; the interpreter runs each replay with
the new arguments); ``plain``: the CPU route (cached Problem on the cached Dispatcher).
"""
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="CPU tensors run triton kernels only in the interpreter")

from ck_core import api as core  # noqa: E402
from ck_core import warm  # noqa: E402
from ck_core.dispatcher import Dispatcher  # noqa: E402
from ck_core.testing import interp_replays  # noqa: E402

F = torch.nn.functional
NAN = float("nan")


@pytest.fixture(params=["replay", "plain"])
def route(request, monkeypatch, ck_dispatch_log):
    monkeypatch.setenv("CK_BACKEND", "triton")
    core.clear()
    replays = interp_replays(monkeypatch) if request.param == "replay" else []
    yield request.param, replays
    core.clear()


class _Counts:
    """How many Problems were built and selections / plans / rankings run while installed."""

    def __init__(self, monkeypatch):
        from ck_conv.problem import ConvProblem
        from ck_fmha.problem import FmhaProblem
        from ck_gemm.problem import GemmProblem

        self.n = {}
        for cls in (GemmProblem, ConvProblem, FmhaProblem):
            self._wrap(monkeypatch, cls, "__init__", cls.__name__)
        for name in ("select", "plan", "rank"):
            self._wrap(monkeypatch, Dispatcher, name, f"Dispatcher.{name}")

    def _wrap(self, monkeypatch, cls, attr, label):
        real = getattr(cls, attr)
        counts = self.n

        def counted(*a, **kw):
            counts[label] = counts.get(label, 0) + 1
            return real(*a, **kw)
        monkeypatch.setattr(cls, attr, counted)


def _rel(got, want) -> float:
    return float((got.detach().double() - want).norm() / want.norm())


def _gen(ck_rng):
    return torch.Generator().manual_seed(int(ck_rng.integers(1 << 31)))


def _rand(g, *shape, dtype=torch.float32):
    return (torch.rand(*shape, generator=g) * 2 - 1).to(dtype)


def _cases():
    """name -> make(g) -> (leaves, ck step output fn, float64 reference fn of the leaves, tolerance)."""
    from ck_conv import conv1d, conv2d, conv3d
    from ck_fmha import attention
    from ck_gemm import linear, matmul

    cl = torch.channels_last

    def gemm(g):
        return [_rand(g, 9, 7), _rand(g, 7, 5)], matmul, lambda a, b: a @ b, 1e-5

    def lin(g):
        return [_rand(g, 2, 3, 7), _rand(g, 5, 7), _rand(g, 5)], linear, F.linear, 1e-5

    def conv(nd, fn, ref, memory_format=None):
        def make(g):
            n, size = (2, 5) if nd < 3 else (1, 4)   # (the interpreter's 3-D programs are slow)
            x, w = _rand(g, n, 4, *(size,) * nd), _rand(g, 6, 4, *(3,) * nd)
            if memory_format is not None:
                x, w = x.to(memory_format=memory_format), w.to(memory_format=memory_format)
            return [x, w], lambda x, w: fn(x, w, padding=1), lambda x, w: ref(x, w, padding=1), 1e-5
        return make

    def attn(g):
        q, k, v = (_rand(g, 1, 2, 11, 32, dtype=torch.float16) for _ in range(3))
        return [q, k, v], lambda q, k, v: attention(q, k, v, causal=True), \
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), 1e-2

    return {"matmul": gemm, "linear+bias": lin, "conv1d": conv(1, conv1d, F.conv1d),
            "conv2d": conv(2, conv2d, F.conv2d), "conv2d channels_last": conv(2, conv2d, F.conv2d, cl),
            "conv3d": conv(3, conv3d, F.conv3d), "attention": attn}


#: Dispatcher runs one forward+backward step makes: forward, then the backward's stages
_RUNS = {"matmul": 3, "linear+bias": 3, "conv1d": 3, "conv2d": 3, "conv2d channels_last": 3, "conv3d": 3,
         "attention": 2}


@pytest.mark.parametrize("case", list(_RUNS))
def test_warm_fwd_bwd_step_builds_no_problem_and_selects_nothing(route, ck_dispatch_log, ck_rng, monkeypatch,
                                                                 case):
    g = _gen(ck_rng)
    make = _cases()[case]
    poisoned = []
    for step in range(4):
        if step == 2:   # warm from here: count what a step builds and runs
            counts = _Counts(monkeypatch)
            ck_dispatch_log.take()
        for t in poisoned:   # last step's outputs and gradients: a stale buffer would show NaN here
            t.fill_(NAN)
        leaves, fn, ref, tol = make(g)
        leaves = [t.requires_grad_() for t in leaves]
        y = fn(*leaves)
        dy = _rand(g, *y.shape, dtype=y.dtype)
        y.backward(dy)
        refs = [t.detach().double().requires_grad_() for t in leaves]
        want = ref(*refs)
        want.backward(dy.double())
        assert _rel(y, want.detach()) < tol, (case, step, "forward")
        for i, (t, r) in enumerate(zip(leaves, refs)):
            assert _rel(t.grad, r.grad) < tol, (case, step, f"gradient {i}")
        poisoned = [y.detach()] + [t.grad for t in leaves]
    assert counts.n == {}, (case, "a warm step built a Problem or ran a selection", counts.n)
    runs = ck_dispatch_log.take()
    assert len(runs) == 2 * _RUNS[case], (case, [r[0] for r in runs])
    for problem, plan, launched in runs:   # what ran is the plan's keys (observers see warm calls too)
        assert launched == plan, (case, problem)
    kind, replays = route
    if kind == "replay" and case != "attention":   # the warm steps replayed recorded launches only
        assert any(r.calls for r in replays)


def test_backward_entry_misses_on_a_new_gradient_signature(route, ck_rng):
    """A gradient of other strides gets its own backward closure in the step's Entry (the cold path
    once), and the gradients stay right for both layouts, step after step."""
    from ck_conv import conv2d

    g = _gen(ck_rng)
    entries = lambda: [e for e in warm._CACHE.values() if isinstance(e, warm.Entry)]  # noqa: E731
    for step, layout in enumerate(["contiguous", "transposed", "contiguous", "transposed"]):
        x, w = _rand(g, 2, 3, 6, 6).requires_grad_(), _rand(g, 4, 3, 3, 3).requires_grad_()
        y = conv2d(x, w, padding=1)
        dy = _rand(g, *y.shape) if layout == "contiguous" else _rand(g, 2, 4, 6, 6).transpose(2, 3)
        y.backward(dy)
        xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
        F.conv2d(xd, wd, padding=1).backward(dy.double())
        assert _rel(x.grad, xd.grad) < 1e-5 and _rel(w.grad, wd.grad) < 1e-5, (step, layout)
        (entry,) = entries()
        assert len(entry.bwd) == min(step + 1, 2), (step, layout)


def test_forward_entry_misses_on_new_stride_dtype_shape(route, ck_rng):
    """Each new signature of the leaves (shape, strides, dtype) gets its own Entry; results stay right."""
    from ck_gemm import matmul

    g = _gen(ck_rng)
    variants = [lambda: (_rand(g, 6, 5), _rand(g, 5, 4)), lambda: (_rand(g, 7, 5), _rand(g, 5, 4)),
                lambda: (_rand(g, 6, 5), _rand(g, 4, 5).t()),
                lambda: (_rand(g, 6, 5, dtype=torch.float16), _rand(g, 5, 4, dtype=torch.float16))]
    for i, make in enumerate(variants):
        for step in range(2):
            a, b = (t.requires_grad_() for t in make())
            y = matmul(a, b)
            dy = _rand(g, *y.shape, dtype=y.dtype)
            y.backward(dy)
            ad, bd = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
            (ad @ bd).backward(dy.double())
            tol = 3e-3 if a.dtype == torch.float16 else 1e-5
            assert _rel(y, (ad @ bd).detach()) < tol and _rel(a.grad, ad.grad) < tol and _rel(b.grad, bd.grad) < tol
            n = sum(isinstance(e, warm.Entry) for e in warm._CACHE.values())
            assert n == i + 1, (i, step, "one Entry per signature")


# -- decode: splitkv, paged, appendkv ---------------------------------------------------------------

def _decode_ref(q, k, v, lens):
    """float64 attention of q [B, Hq, 1, D] over the first lens[b] keys of k/v [B, Hk, S, D] (GQA)."""
    b, hq, _, d = q.shape
    rep = hq // k.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for i in range(b):
        n = int(lens[i])
        kk = k[i, :, :n].double().repeat_interleave(rep, 0)
        vv = v[i, :, :n].double().repeat_interleave(rep, 0)
        att = torch.softmax(q[i].double() @ kk.transpose(-1, -2) * d ** -0.5, -1)
        out[i] = att @ vv
    return out


def _pages(k, v, ps, g):
    """k/v [B, Hk, S, D] in a page pool [pages, ps, Hk, D] through a random block table."""
    b, hk, sk, d = k.shape
    npg = -(-sk // ps)
    table = torch.randperm(b * npg + 2, generator=g)[:b * npg].view(b, npg).to(torch.int32)
    kc = torch.full((b * npg + 2, ps, hk, d), NAN, dtype=k.dtype)
    vc = kc.clone()
    pad = lambda x: F.pad(x, (0, 0, 0, npg * ps - sk))   # noqa: E731
    kp, vp = pad(k), pad(v)
    for bi in range(b):
        for pi in range(npg):
            kc[table[bi, pi]] = kp[bi, :, pi * ps:(pi + 1) * ps].transpose(0, 1)
            vc[table[bi, pi]] = vp[bi, :, pi * ps:(pi + 1) * ps].transpose(0, 1)
    return kc, vc, table


@pytest.fixture(params=["host", "device"])
def tables_on(request, monkeypatch):
    """'device': the decode entry points treat the (CPU) lengths and page tables as a GPU's, which the
    host does not read: the kernels check them, warm calls pass them to the launch as they are."""
    if request.param == "device":
        if request.getfixturevalue("route")[0] != "replay":
            pytest.skip("the device-table route differs from the host one in its warm (replayed) calls only")
        from ck_fmha import decode

        monkeypatch.setattr(decode, "_on_device", lambda t: True)
    return request.param


@pytest.mark.parametrize("paged", [False, True])
def test_decode_warm_steps_replay_and_give_the_new_result(route, ck_dispatch_log, ck_rng, monkeypatch, paged,
                                                          tables_on):
    from ck_fmha import decode

    g = _gen(ck_rng)
    b, hq, hk, sk, d = 2, 4, 2, 70, 32
    h = torch.float16
    before, last = warm.size(), None
    grow = 1 if route[0] == "replay" else 0   # the CPU route keeps no closure (nothing to replay)
    for step, lens in enumerate([[70, 33], [5, 70], [1, 64], [40, 2]]):
        if step == 2:
            counts = _Counts(monkeypatch)
        if last is not None:
            last.fill_(NAN)
        q = _rand(g, b, hq, 1, d, dtype=h)
        k, v = _rand(g, b, hk, sk, d, dtype=h), _rand(g, b, hk, sk, d, dtype=h)
        sl = torch.tensor(lens, dtype=torch.int32)
        if paged:
            kc, vc, table = _pages(k, v, 16, g)
            o = decode.paged_decode(q, kc, vc, table, sl)
        else:
            o = decode.splitkv_decode(q, k, v, seqlens_k=sl)
        assert _rel(o, _decode_ref(q, k, v, lens)) < 3e-3, (step, lens)
        assert warm.size() == before + grow, (step, "one closure for the signature")
        last = o
    assert counts.n == {}, counts.n
    runs = ck_dispatch_log.take()
    assert len(runs) == 4 and all(launched == plan for _, plan, launched in runs)
    # a new signature (another head count) misses, and is right too
    q = _rand(g, b, hk, 1, d, dtype=h)
    k, v = _rand(g, b, hk, sk, d, dtype=h), _rand(g, b, hk, sk, d, dtype=h)
    o = decode.splitkv_decode(q, k, v, seqlens_k=torch.tensor([9, 70], dtype=torch.int32))
    assert _rel(o, _decode_ref(q, k, v, [9, 70])) < 3e-3 and warm.size() == before + 2 * grow


def test_appendkv_warm_steps_write_the_new_keys(route, ck_dispatch_log, ck_rng, tables_on):
    from ck_fmha import decode

    g = _gen(ck_rng)
    b, hq, hk, sn, cap, d = 2, 4, 2, 3, 20, 32
    h = torch.float16
    kc, vc = _rand(g, b, hk, cap, d, dtype=h), _rand(g, b, hk, cap, d, dtype=h)
    want_k, want_v = kc.clone(), vc.clone()
    before, last = warm.size(), None
    grow = 1 if route[0] == "replay" else 0
    for step, lens in enumerate([[0, 5], [17, 2], [3, 3], [9, 16]]):
        if last is not None:
            last.fill_(NAN)
        q = _rand(g, b, hq, sn, d, dtype=h)
        kn, vn = _rand(g, b, hk, sn, d, dtype=h), _rand(g, b, hk, sn, d, dtype=h)
        q_rot, k2, v2 = decode.appendkv(q, kn, vn, kc, vc, torch.tensor(lens, dtype=torch.int32))
        assert k2 is kc and v2 is vc and torch.equal(q_rot, q), step   # rope='none': q_rot is q's copy
        for bi, n in enumerate(lens):
            want_k[bi, :, n:n + sn], want_v[bi, :, n:n + sn] = kn[bi], vn[bi]
        assert torch.equal(kc, want_k) and torch.equal(vc, want_v), step
        assert warm.size() == before + grow, step
        last = q_rot
    runs = ck_dispatch_log.take()
    assert len(runs) == 4 and all(launched == plan for _, plan, launched in runs)


def _rope64(x, cos, sin, pos, interleaved):
    """x [B, H, S, D] float64 rotated at positions pos [B, S] over the first 2 * cos.shape[1] channels."""
    x = x.double().clone()
    r = 2 * cos.shape[1]
    c, s = cos.double()[pos][:, None], sin.double()[pos][:, None]
    if interleaved:
        x1, x2 = x[..., 0:r:2].clone(), x[..., 1:r:2].clone()
        x[..., 0:r:2], x[..., 1:r:2] = x1 * c - x2 * s, x1 * s + x2 * c
    else:
        x1, x2 = x[..., : r // 2].clone(), x[..., r // 2: r].clone()
        x[..., : r // 2], x[..., r // 2: r] = x1 * c - x2 * s, x1 * s + x2 * c
    return x


@pytest.mark.parametrize("rope", ["interleaved", "half_rotated"])
def test_appendkv_rope_warm_steps_read_each_calls_tables(route, ck_rng, rope):
    """fp16 rotary tables (FlashAttention's): the kernel reads fp32 tables, converted before the launch,
    so the recorded replay (and its one verification run, which writes the caller's caches in place)
    reads the caller's tables; converted inside the launcher, a replay read an uninitialised scratch
    buffer in their place (FlashAttention's suite: wrong rotated keys in the cache on the H200)."""
    from ck_fmha import decode

    g = _gen(ck_rng)
    b, hq, hk, sn, cap, d, rdim = 2, 4, 2, 3, 20, 32, 16
    h = torch.float16
    kc, vc = _rand(g, b, hk, cap, d, dtype=h), _rand(g, b, hk, cap, d, dtype=h)
    want_k, want_v = kc.double(), vc.double()
    for step, lens in enumerate([[0, 5], [17, 2], [9, 16]]):
        q = _rand(g, b, hq, sn, d, dtype=h)
        kn, vn = _rand(g, b, hk, sn, d, dtype=h), _rand(g, b, hk, sn, d, dtype=h)
        ang = torch.rand(cap, rdim // 2, generator=g) * 6.283
        cos, sin = ang.cos().to(h), ang.sin().to(h)
        q_rot, _, _ = decode.appendkv(q, kn, vn, kc, vc, torch.tensor(lens, dtype=torch.int32), rotary_cos=cos,
                                      rotary_sin=sin, rope=rope, rotary_dim=rdim)
        pos = torch.tensor(lens)[:, None] + torch.arange(sn)[None, :]
        inter = rope == "interleaved"
        kr = _rope64(kn, cos, sin, pos, inter)
        for bi, n in enumerate(lens):
            want_k[bi, :, n:n + sn], want_v[bi, :, n:n + sn] = kr[bi], vn[bi].double()
        assert (kc.double() - want_k).abs().max() < 2e-3, step
        assert torch.equal(vc.double(), want_v), step
        assert _rel(q_rot, _rope64(q, cos, sin, pos, inter)) < 1e-3, step
    before = kc.clone()
    with pytest.raises(ValueError, match="appended keys reach position 19"):   # host lengths: checked
        decode.appendkv(q, kn, vn, kc, vc, torch.tensor([17, 2], dtype=torch.int32), rotary_cos=cos[:19],
                        rotary_sin=sin[:19], rope=rope, rotary_dim=rdim)
    assert torch.equal(kc, before)


def test_kvcache_alibi_warm_steps_read_each_calls_fp16_slopes(route, ck_rng):
    """ALiBi slopes in fp16 (the kernel reads fp32): converted before the recorded launch, so each warm
    step reads its own slopes and the replay is kept (converted in the launcher, the copy was replayed as
    an uninitialised buffer: its verification failed, or where the allocator handed back the same bytes,
    later steps read stale slopes)."""
    from ck_fmha import flash_attn as fa

    g = _gen(ck_rng)
    b, sq, h, d, cap = 2, 3, 2, 16, 13
    kc, vc = _rand(g, b, cap, h, d, dtype=torch.float16), _rand(g, b, cap, h, d, dtype=torch.float16)
    lens = torch.tensor([13, 6], dtype=torch.int32)
    before = warm.size()
    for step in range(3):
        q = _rand(g, b, sq, h, d, dtype=torch.float16)
        slopes = (torch.rand(b, h, generator=g) * 2).to(torch.float16)
        out = fa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, alibi_slopes=slopes, num_splits=1)
        for i in range(b):
            n = int(lens[i])
            s = torch.einsum("qhd,khd->hqk", q[i].double(), kc[i, :n].double()) * d ** -0.5
            dist = (torch.arange(sq)[:, None] + n - sq - torch.arange(n)[None, :]).abs()
            s = s - slopes[i].double()[:, None, None] * dist
            ref = torch.einsum("hqk,khd->qhd", s.softmax(-1), vc[i, :n].double())
            assert _rel(out[i], ref) < 3e-3, (step, i)
        # the replay engages (the fp32 copy made in the launcher failed its verification: no closure)
        assert warm.size() == before + (route[0] == "replay"), step


def test_autograd_through_torch_compile_still_traces_the_custom_ops(ck_manager, monkeypatch, ck_rng):
    """torch.compile(fullgraph=True) on CPU tensors: the custom ops (not the eager Entry path) are
    traced, forward and backward, and match float64."""
    from ck_gemm import matmul

    monkeypatch.setenv("CK_BACKEND", "numpy")
    core.clear()
    g = _gen(ck_rng)
    a, b = _rand(g, 6, 5).requires_grad_(), _rand(g, 5, 3).requires_grad_()
    f = torch.compile(lambda a, b: matmul(a, b), fullgraph=True, backend="eager")
    y = f(a, b)
    y.sum().backward()
    ad, bd = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    (ad @ bd).sum().backward()
    assert _rel(y, (ad @ bd).detach()) < 1e-5 and _rel(a.grad, ad.grad) < 1e-5 and _rel(b.grad, bd.grad) < 1e-5
    assert not any(isinstance(e, warm.Entry) for e in warm._CACHE.values())
    core.clear()


def test_double_backward_records_the_backward_graph(route, ck_rng):
    """create_graph=True: the backward runs through the custom ops (which record their own graph),
    so a gradient of the gradient is right; the warm Entry path is for plain backward steps."""
    from ck_gemm import matmul

    g = _gen(ck_rng)
    for step in range(2):
        a, b = _rand(g, 6, 5).requires_grad_(), _rand(g, 5, 4).requires_grad_()
        (ga,) = torch.autograd.grad(matmul(a, b).pow(2).sum(), a, create_graph=True)
        ga.sum().backward()
        ad, bd = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
        (gad,) = torch.autograd.grad((ad @ bd).pow(2).sum(), ad, create_graph=True)
        gad.sum().backward()
        assert _rel(ga, gad.detach()) < 1e-5 and _rel(b.grad, bd.grad) < 1e-5, step


def test_replay_zeroes_the_buffers_the_launcher_zeroed_and_no_others(monkeypatch):
    """A recorded replay allocates each intermediate as the launcher did: zeroed where the launcher
    said so (an accumulator, ck_fmha's warm.zeroed), else uninitialised (here: NaN, to tell)."""
    from ck_fmha.backends.triton import warm as recorded

    class Launch:   # a recorded launch: its arguments, and what each replay passed
        def __init__(self, args):
            self.args, self.seen = list(args), []

        def __call__(self, args):
            self.seen.append([a.clone() if isinstance(a, torch.Tensor) else a for a in args])

    x, out = torch.randn(4), torch.empty(4)
    acc, tmp = torch.zeros(8), torch.empty(8)
    with recorded.recording() as recs:
        recorded.zeroed(acc)
    launch = Launch([x, acc, 3, tmp, out])
    recs.append(launch)
    monkeypatch.setattr(torch, "empty_strided",
                        lambda shape, stride, **kw: torch.full(shape, NAN, **kw).as_strided(shape, stride))
    f = recorded.replayer({"x": x}, {"o": out}, recs, scratch=True)
    x2 = torch.randn(4)
    got = f(x2)
    args = launch.seen[-1]
    assert torch.equal(args[0], x2) and args[2] == 3 and got["o"] is not out and got["o"].shape == (4,)
    assert torch.equal(args[1], torch.zeros(8)), "the accumulator starts zeroed"
    assert torch.isnan(args[3]).all(), "the other intermediate is allocated as torch.empty"
