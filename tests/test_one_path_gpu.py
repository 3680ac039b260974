"""The public GEMM and conv APIs on the GPU: the device's arch plugin, the triton backend,
every call through the Dispatcher (run with CK_TEST_GPU=1 pytest -m gpu)."""
import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
pytest.importorskip("ck_gemm")
pytest.importorskip("ck_conv")

from ck_core import PluginManager, device, plugins  # noqa: E402
from ck_core.testing import DispatchLog  # noqa: E402

TOL = {torch.float16: 5e-3, torch.bfloat16: 2e-2}


@pytest.fixture
def gpu_log(monkeypatch):
    log = DispatchLog()
    log.manager = PluginManager(plugins=[log])
    monkeypatch.setattr(plugins, "_MANAGER", log.manager)
    monkeypatch.delenv("CK_BACKEND", raising=False)
    try:
        arch = device.current_arch(torch.empty(1, device="cuda"), log.manager)
    except Exception as exc:   # no arch plugin for this GPU
        pytest.skip(str(exc))
    log.arch = arch.name
    return log


def _rel(got, want) -> float:
    return float((got.detach().double() - want).norm() / want.norm())


def _check(log, n, op):
    runs = log.take()
    assert len(runs) == n and all(p.op == op for p, _, _ in runs)
    for _, planned, launched in runs:
        assert launched == planned and all(f".{log.arch}.triton" in k for k in launched), launched


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matmul_and_linear_on_gpu(gpu_log, dtype):
    g = torch.Generator(device="cuda").manual_seed(7)
    from ck_gemm import linear, matmul

    a = torch.randn(301, 257, device="cuda", dtype=dtype, generator=g)
    b = torch.randn(133, 257, device="cuda", dtype=dtype, generator=g).t()
    bias = torch.randn(133, device="cuda", dtype=dtype, generator=g)
    c = matmul(a, b, d=(bias,), activation="relu")
    assert _rel(c, torch.relu(a.double() @ b.double() + bias.double())) < TOL[dtype]
    _check(gpu_log, 1, "gemm")
    x = torch.randn(4, 65, 257, device="cuda", dtype=dtype, generator=g, requires_grad=True)
    w = torch.randn(129, 257, device="cuda", dtype=dtype, generator=g, requires_grad=True)
    y = linear(x, w)
    y.float().sum().backward()
    _check(gpu_log, 3, "gemm")
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    torch.nn.functional.linear(xr, wr).sum().backward()
    assert _rel(y, xr @ wr.t()) < TOL[dtype]
    assert _rel(x.grad, xr.grad) < TOL[dtype] and _rel(w.grad, wr.grad) < TOL[dtype]


@pytest.mark.parametrize("channels_last", [False, True])
def test_conv2d_on_gpu(gpu_log, channels_last):
    from ck_conv import conv2d

    g = torch.Generator(device="cuda").manual_seed(11)
    x = torch.randn(4, 64, 28, 28, device="cuda", dtype=torch.float16, generator=g)
    w = torch.randn(128, 32, 3, 3, device="cuda", dtype=torch.float16, generator=g) * 0.05
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    x.requires_grad_(), w.requires_grad_()
    y = conv2d(x, w, stride=2, padding=1, groups=2)
    y.float().sum().backward()
    _check(gpu_log, 3, "conv")
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    want = torch.nn.functional.conv2d(xr, wr, stride=2, padding=1, groups=2)
    want.sum().backward()
    assert _rel(y, want.detach()) < 5e-3
    assert _rel(x.grad, xr.grad) < 5e-3 and _rel(w.grad, wr.grad) < 1e-2


@pytest.mark.parametrize("layer", [(64, 128, 3, 2, 1, 2), (96, 40, 1, 1, 0, 1), (48, 48, 5, 2, 2, 48)])
def test_conv2d_warm_calls_forward_and_backward_on_gpu(gpu_log, layer):
    """Warm calls replay the recorded launches of all three directions: fresh data each call,
    every output and gradient against float64 (split reductions, tables and counters reused)."""
    from ck_conv import conv2d

    C, K, f, s, pad, groups = layer
    g = torch.Generator(device="cuda").manual_seed(5 + f)
    for call in range(4):
        x = torch.randn(3, C, 23, 23, device="cuda", dtype=torch.float16, generator=g)
        x = x.to(memory_format=torch.channels_last).requires_grad_()
        w = (torch.randn(K, C // groups, f, f, device="cuda", dtype=torch.float16, generator=g) * 0.1)
        w = w.to(memory_format=torch.channels_last).requires_grad_()
        y = conv2d(x, w, stride=s, padding=pad, groups=groups)
        dy = torch.randn(y.shape, device="cuda", dtype=torch.float16, generator=g)
        y.backward(dy)
        xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
        want = torch.nn.functional.conv2d(xr, wr, stride=s, padding=pad, groups=groups)
        want.backward(dy.double())
        assert _rel(y, want.detach()) < 5e-3, call
        assert _rel(x.grad, xr.grad) < 5e-3 and _rel(w.grad, wr.grad) < 1e-2, call
    gpu_log.take()


@pytest.mark.parametrize("batch", [1, 4])
def test_split_k_and_batched_gemm_warm_calls_on_gpu(gpu_log, batch):
    """Every split-K key of the arch (two launches and a workspace) on a batched and a plain
    problem, called four times on fresh data: the warm replays match float64 each time."""
    from ck_core import Dispatcher, Registry
    from ck_gemm import GemmProblem

    reg = Registry.from_enumeration("gemm", gpu_log.arch, "triton", dtypes=["fp16"], layouts=["rcr"])
    keys = [k for k in reg if k.algorithm.split_k > 1][:6]
    if not keys:
        pytest.skip("no split-K keys on this arch")
    g = torch.Generator(device="cuda").manual_seed(batch)
    for key in keys:
        disp = Dispatcher(Registry(reg.arch, [key]), backend="triton")
        p = GemmProblem(m=77, n=190, k=1000, dtype="fp16", layout="rcr", **({"batch": batch} if batch > 1 else {}))
        lead = (batch,) if batch > 1 else ()
        for call in range(4):
            a = torch.randn(*lead, 77, 1000, device="cuda", dtype=torch.float16, generator=g)
            b = torch.randn(*lead, 190, 1000, device="cuda", dtype=torch.float16, generator=g)
            got = disp.run(p, a, b)
            want = a.double() @ b.double().transpose(-1, -2)
            assert _rel(got, want) < 5e-3, (key.name, call)
