"""CUDA graphs over the public APIs (issue #26: "torch.compile and CUDA graphs keep working"): every
public call's forward and forward+backward captured with ``torch.cuda.graph`` after a warm-up, then
replayed on fresh data copied into the captured inputs; the replay's outputs and gradients match a
float64 reference computed independently on that fresh data (a replay that reads stale pointers or a
cached scratch buffer fails here).  And the calls under ``torch.compile(mode="reduce-overhead")``, forward
and forward+backward (tests/test_graph_pool_leaks.py checks on the CPU what that needs: no tensor of a
call outlives it).
Run with ``CK_TEST_GPU=1 pytest -m gpu tests/test_graph_capture_gpu.py``."""
import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

import importlib.util  # noqa: E402
from pathlib import Path  # noqa: E402

from ck_core import api as core  # noqa: E402

# the public calls and their references: test_warm_autograd_gpu's cases (--import-mode=importlib: by path)
_spec = importlib.util.spec_from_file_location("_warm_cases", Path(__file__).with_name("test_warm_autograd_gpu.py"))
_warm_cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_warm_cases)
_cases, _rand, _rel = _warm_cases._cases, _warm_cases._rand, _warm_cases._rel

NAN = float("nan")


def _reference(ref, leaves, dy):
    refs = [t.detach().double().requires_grad_() for t in leaves]
    want = ref(*refs)
    want.backward(dy.double())
    return want.detach(), [r.grad for r in refs]


def _capture(step):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step()
    return g, out


@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "fwd+bwd"])
@pytest.mark.parametrize("case", list(_cases()))
def test_captured_step_replays_on_fresh_data(case, backward):
    core.clear()
    make = _cases()[case]
    leaves, fn, ref, tol = make()
    leaves = [t.requires_grad_(backward) for t in leaves]
    dy_box = []

    def step():
        for t in leaves:
            t.grad = None
        y = fn(*leaves)
        if backward:
            if not dy_box:
                dy_box.append(_rand(*y.shape, dtype=y.dtype))
            y.backward(dy_box[0])
        return y

    g, y = _capture(step)
    for rep in range(3):
        fresh, _, _, _ = make()
        with torch.no_grad():
            for t, f in zip(leaves, fresh):
                t.copy_(f)
            y.fill_(NAN)
            if backward:
                for t in leaves:
                    t.grad.fill_(NAN)
                dy_box[0].copy_(_rand(*y.shape, dtype=y.dtype))
        g.replay()
        torch.cuda.synchronize()
        want, grads = _reference(ref, [t.detach() for t in leaves],
                                 dy_box[0] if backward else torch.zeros_like(y))
        assert _rel(y, want) < tol, (case, rep)
        if backward:
            for i, (t, r) in enumerate(zip(leaves, grads)):
                assert _rel(t.grad, r) < tol, (case, rep, i)


@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "fwd+bwd"])
@pytest.mark.parametrize("case", ["conv2d channels_last", "conv2d", "attention", "linear+bias", "matmul"])
def test_reduce_overhead_compile(case, backward):
    """torch.compile(mode="reduce-overhead"): CUDA-graph trees warm the compiled graph up with its
    allocations routed to the graph's pool, refuse any tensor left alive there but the outputs, then
    record and replay it; each rep runs on fresh data (its outputs and gradients checked against float64
    before the next replay overwrites them).  A failure names the leaked allocations' Python frames
    (cudagraph_trees_history_recording)."""
    import torch._inductor.config

    torch._dynamo.reset()
    core.clear()
    torch._inductor.config.triton.cudagraph_trees_history_recording = True
    try:
        make = _cases()[case]
        _, fn, ref, tol = make()
        c = torch.compile(fn, mode="reduce-overhead")
        for rep in range(4):
            fresh, _, _, _ = make()
            fresh = [t.requires_grad_(backward) for t in fresh]
            torch.compiler.cudagraph_mark_step_begin()
            y = c(*fresh)
            if backward:
                dy = _rand(*y.shape, dtype=y.dtype)
                y.backward(dy)
            torch.cuda.synchronize()
            want, grads = _reference(ref, [t.detach() for t in fresh], dy if backward else torch.zeros_like(y))
            assert _rel(y, want) < tol, (case, rep)
            if backward:
                for i, (t, r) in enumerate(zip(fresh, grads)):
                    assert _rel(t.grad, r) < tol, (case, rep, i)
    finally:
        torch._inductor.config.triton.cudagraph_trees_history_recording = False
