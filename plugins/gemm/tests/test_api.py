"""ck_gemm.matmul / linear: through the Dispatcher, on the numpy backend and the Triton interpreter.

References are float64 torch on the same inputs; every call must reach the
Dispatcher (a DispatchLog plugin sees it) and launch exactly its plan's keys.
"""
import os

import pytest

torch = pytest.importorskip("torch")

from ck_core.errors import InvalidProblem  # noqa: E402
from ck_gemm.api import linear, matmul  # noqa: E402

BACKENDS = ["numpy", pytest.param("triton", marks=pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="CPU tensors run triton kernels only in the interpreter"))]


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch, ck_dispatch_log):
    pytest.importorskip("triton") if request.param == "triton" else None
    monkeypatch.setenv("CK_BACKEND", request.param)
    return request.param


def _rel(got, want) -> float:
    return float((got.detach().double() - want).norm() / want.norm())


def _odd(rng, lo=5, hi=40):
    return int(rng.integers(lo, hi)) * 2 + 1


def _check_log(log, n):
    runs = log.take()
    assert len(runs) == n, [r[0] for r in runs]
    for problem, planned, launched in runs:
        assert problem.op == "gemm" and launched == planned and launched, (problem, planned, launched)
        assert all(".fake64." in name for name in launched), launched
    return [r[0] for r in runs]


def test_matmul_layouts_batches_epilogues(backend, ck_dispatch_log, ck_rng):
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 31)))
    m, n, k, bt = _odd(ck_rng), _odd(ck_rng), _odd(ck_rng), 3
    r = lambda *s: torch.rand(*s, generator=g) * 2 - 1  # noqa: E731
    a, b = r(m, k), r(k, n)
    at, bt_ = r(k, m).t(), r(n, k).t()            # transposed views: column-major operands
    cases = [
        ((a, b), {}, a.double() @ b.double(), "rrr"),
        ((at, b), {}, at.double() @ b.double(), "crr"),
        ((a, bt_), {}, a.double() @ bt_.double(), "rcr"),
        ((at, bt_), {}, at.double() @ bt_.double(), "ccr"),
    ]
    a3, b3 = r(bt, m, k), r(bt, k, n)
    cases += [((a3, b3), {}, a3.double() @ b3.double(), "rrr"),
              ((a3, b), {}, a3.double() @ b.double(), "rrr"),     # broadcast B
              ((a, b3), {}, a.double() @ b3.double(), "rrr")]     # broadcast A
    bias, full = r(n), r(m, n)
    acts = {"relu": torch.relu, "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu,
            "sigmoid": torch.sigmoid, "tanh": torch.tanh}
    for name, fn in acts.items():
        cases.append(((a, bt_), dict(d=(bias, full), activation=name),
                      fn(a.double() @ bt_.double() + bias.double() + full.double()), "rcr"))
    for (x, y), kw, want, layout in cases:
        got = matmul(x, y, **kw)
        assert got.dtype == torch.float32 and got.shape == want.shape
        assert _rel(got, want) < 1e-5, (layout, kw.get("activation"))
        (problem,) = _check_log(ck_dispatch_log, 1)
        assert problem.layout == layout and problem.num_d == len(kw.get("d", ()))
    x16, y16 = r(m, k).half(), r(k, n).half()
    got = matmul(x16, y16)
    assert got.dtype == torch.float16 and _rel(got, x16.double() @ y16.double()) < 2e-3
    _check_log(ck_dispatch_log, 1)


def test_matmul_and_linear_autograd(backend, ck_dispatch_log, ck_rng):
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 31)))
    m, n, k = _odd(ck_rng, 3, 20), _odd(ck_rng, 3, 20), _odd(ck_rng, 3, 20)
    leaf = lambda *s: (torch.rand(*s, generator=g) * 2 - 1).requires_grad_()  # noqa: E731
    a, b, d = leaf(2, m, k), leaf(k, n), leaf(n)
    out = matmul(a, b, d=(d,), activation="gelu")
    w = torch.rand(out.shape, generator=g, dtype=torch.float64)
    (out.double() * w).sum().backward()
    _check_log(ck_dispatch_log, 4)   # forward; backward: pre-activation, dA, dB
    refs = [t.detach().double().requires_grad_() for t in (a, b, d)]
    ref = torch.nn.functional.gelu(refs[0] @ refs[1] + refs[2])
    (ref * w).sum().backward()
    assert _rel(out, ref.detach()) < 1e-5
    for t, r in zip((a, b, d), refs):
        assert _rel(t.grad, r.grad) < 1e-5

    x, wt, bias = leaf(3, 2, k), leaf(n, k), leaf(n)
    y = linear(x, wt, bias)
    assert y.shape == (3, 2, n)
    (y.double() * 1.5).sum().backward()
    problems = _check_log(ck_dispatch_log, 3)    # forward, dX, dW
    assert problems[0].layout == "rcr" and problems[0].num_d == 1
    refs = [t.detach().double().requires_grad_() for t in (x, wt, bias)]
    (torch.nn.functional.linear(*refs) * 1.5).sum().backward()
    for t, r in zip((x, wt, bias), refs):
        assert _rel(t.grad, r.grad) < 1e-5


def test_matmul_bad_input_says_what_to_fix(ck_dispatch_log):
    with pytest.raises(InvalidProblem, match="float32"):
        matmul(torch.ones(3, 4, dtype=torch.float64), torch.ones(4, 5, dtype=torch.float64))
    with pytest.raises(InvalidProblem, match="K"):
        matmul(torch.ones(3, 4), torch.ones(5, 6))
    with pytest.raises(InvalidProblem, match="activation"):
        matmul(torch.ones(3, 4), torch.ones(4, 5), activation="softplus")
    with pytest.raises(InvalidProblem, match="cast"):
        matmul(torch.ones(3, 4), torch.ones(4, 5, dtype=torch.float16))
    with pytest.raises(InvalidProblem, match="in_features"):
        linear(torch.ones(3, 4), torch.ones(5, 6))
    assert ck_dispatch_log.take() == []
