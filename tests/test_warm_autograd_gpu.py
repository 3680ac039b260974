"""Warm eager steps on the GPU (issue #26): the recorded replays of every public API's forward and
backward (gemm with D / activation, conv TMA bwd_weight descriptors, decode main + combine) give
float64-correct results on fresh data, step after step, over poisoned outputs; a warm step builds
no Problem and selects nothing.  Run with ``CK_TEST_GPU=1 pytest -m gpu tests/test_warm_autograd_gpu.py``."""
import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from ck_core import PluginManager, device, plugins, warm  # noqa: E402
from ck_core import api as core  # noqa: E402
from ck_core.testing import DispatchLog  # noqa: E402

F = torch.nn.functional
NAN = float("nan")


@pytest.fixture
def gpu_log(monkeypatch):
    log = DispatchLog()
    log.manager = PluginManager(plugins=[log])
    monkeypatch.setattr(plugins, "_MANAGER", log.manager)
    monkeypatch.delenv("CK_BACKEND", raising=False)
    try:
        device.current_arch(torch.empty(1, device="cuda"), log.manager)
    except Exception as exc:   # no arch plugin for this GPU
        pytest.skip(str(exc))
    core.clear()
    yield log
    core.clear()


def _rel(got, want) -> float:
    return float((got.detach().double() - want).norm() / want.norm())


def _rand(*shape, dtype=torch.float16):
    return (torch.rand(*shape, device="cuda") * 2 - 1).to(dtype)


def _counting(monkeypatch):
    from ck_conv.problem import ConvProblem
    from ck_core.dispatcher import Dispatcher
    from ck_fmha.problem import FmhaProblem
    from ck_gemm.problem import GemmProblem

    n = {}
    for cls, attr in ((GemmProblem, "__init__"), (ConvProblem, "__init__"), (FmhaProblem, "__init__"),
                      (Dispatcher, "select"), (Dispatcher, "plan"), (Dispatcher, "rank")):
        real = getattr(cls, attr)

        def counted(*a, _real=real, _label=f"{cls.__name__}.{attr}", **kw):
            n[_label] = n.get(_label, 0) + 1
            return _real(*a, **kw)
        monkeypatch.setattr(cls, attr, counted)
    return n


def _cases():
    from ck_conv import conv1d, conv2d, conv3d
    from ck_fmha import attention
    from ck_fmha.flash_attn import flash_attn_func
    from ck_gemm import linear, matmul

    cl = torch.channels_last

    def conv(nd, fn, ref, fmt=None, ch=16):
        def make():
            x, w = _rand(2, ch, *(8,) * nd), _rand(ch, ch, *(3,) * nd)
            if fmt is not None:
                x, w = x.to(memory_format=fmt), w.to(memory_format=fmt)
            return [x, w], lambda x, w: fn(x, w, padding=1), lambda x, w: ref(x, w, padding=1), 1e-2
        return make

    return {
        "matmul": lambda: ([_rand(64, 64), _rand(64, 64)], matmul, lambda a, b: a @ b, 5e-3),
        "matmul relu + d": lambda: ([_rand(48, 40), _rand(40, 72), _rand(72)],
                                    lambda a, b, d: matmul(a, b, d=(d,), activation="relu"),
                                    lambda a, b, d: torch.relu(a @ b + d), 5e-3),
        "linear+bias": lambda: ([_rand(4, 16, 64), _rand(128, 64), _rand(128)], linear, F.linear, 5e-3),
        "conv1d": conv(1, conv1d, F.conv1d), "conv2d": conv(2, conv2d, F.conv2d),
        "conv2d channels_last": conv(2, conv2d, F.conv2d, torch.channels_last),
        "conv2d channels_last 64ch": conv(2, conv2d, F.conv2d, cl, ch=64),
        "conv3d": conv(3, conv3d, F.conv3d),
        "attention": lambda: ([_rand(1, 8, 128, 64) for _ in range(3)],
                              lambda q, k, v: attention(q, k, v, causal=True),
                              lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), 1e-2),
        "flash_attn_func": lambda: ([_rand(1, 128, 8, 64) for _ in range(3)],
                                    lambda q, k, v: flash_attn_func(q, k, v, causal=True),
                                    lambda q, k, v: F.scaled_dot_product_attention(
                                        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                        is_causal=True).transpose(1, 2), 1e-2),
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_warm_fwd_bwd_steps_on_the_gpu(gpu_log, monkeypatch, case):
    make = _cases()[case]
    poisoned, counts = [], None
    for step in range(5):
        if step == 3:
            counts = _counting(monkeypatch)
        for t in poisoned:
            t.fill_(NAN)
        leaves, fn, ref, tol = make()
        leaves = [t.requires_grad_() for t in leaves]
        y = fn(*leaves)
        dy = _rand(*y.shape, dtype=y.dtype)
        y.backward(dy)
        refs = [t.detach().double().requires_grad_() for t in leaves]
        want = ref(*refs)
        want.backward(dy.double())
        assert _rel(y, want.detach()) < tol, (case, step)
        for i, (t, r) in enumerate(zip(leaves, refs)):
            assert _rel(t.grad, r.grad) < tol, (case, step, i)
        poisoned = [y.detach()] + [t.grad for t in leaves]
    assert counts == {}, (case, counts)
    for _, plan, launched in gpu_log.take():
        assert launched == plan


@pytest.mark.parametrize("paged", [False, True])
def test_warm_decode_on_the_gpu(gpu_log, monkeypatch, paged):
    from ck_fmha import decode

    b, hq, hk, sk, d, ps = 4, 8, 8, 200, 128, 16
    npg = -(-sk // ps)
    before, last, counts = warm.size(), None, None
    for step, lens in enumerate([[200, 17, 1, 64], [3, 200, 99, 150], [1, 1, 1, 1], [128, 5, 77, 200]]):
        if step == 2:
            counts = _counting(monkeypatch)
        if last is not None:
            last.fill_(NAN)
        q, k, v = _rand(b, hq, 1, d), _rand(b, hk, sk, d), _rand(b, hk, sk, d)
        sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
        if paged:
            table = torch.randperm(b * npg, device="cuda").view(b, npg).to(torch.int32)
            kc = torch.full((b * npg, ps, hk, d), NAN, dtype=q.dtype, device="cuda")
            vc = kc.clone()
            kp = F.pad(k, (0, 0, 0, npg * ps - sk)).view(b, hk, npg, ps, d).permute(0, 2, 3, 1, 4)
            vp = F.pad(v, (0, 0, 0, npg * ps - sk)).view(b, hk, npg, ps, d).permute(0, 2, 3, 1, 4)
            kc[table.long()] = kp
            vc[table.long()] = vp
            o = decode.paged_decode(q, kc, vc, table, sl)
        else:
            o = decode.splitkv_decode(q, k, v, seqlens_k=sl)
        want = torch.empty(q.shape, dtype=torch.float64, device="cuda")
        for i, n in enumerate(lens):
            att = torch.softmax(q[i].double() @ k[i, :, :n].double().transpose(-1, -2) * d ** -0.5, -1)
            want[i] = att @ v[i, :, :n].double()
        assert _rel(o, want) < 5e-3, (step, lens)
        last = o
    assert counts == {}, counts
    assert warm.size() == before + 1
