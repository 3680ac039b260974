"""Nothing a public call allocates outlives the call in a cache or a closure (issue #26: torch.compile(mode=
"reduce-overhead") over every public call).

CUDA-graph trees run a compiled graph once in warm-up with every allocation routed to the graph's private
memory pool, then refuse ("tensor(s) in the cudagraph pool not tracked as outputs") any tensor alive there
but the graph's outputs.  So a recorded launch, a warm closure or a module-level buffer that keeps a
tensor of the call (an output, a copy of an input, a workspace, a flag made on first use) breaks
reduce-overhead for every model calling it.  Here, on the CPU: each public call runs through the GPU's
recorded-replay route (launches recorded and replayed; Triton's interpreter runs the replays), both in
eager form (the warm-call cache and autograd Entries) and as the custom ops a compiled graph calls; every
tensor a torch operation returns during the call is tracked (:class:`ck_core.testing.Allocations`); the
outputs and gradients are dropped and nothing tracked may stay alive.  First call and warm call, forward
and forward+backward; results checked against float64 so that a fix that breaks the replay fails too.
"""
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="CPU tensors run triton kernels only in the interpreter")

from ck_core import api as core  # noqa: E402
from ck_core.backends import triton_replay  # noqa: E402
from ck_core.testing import Allocations, interp_record  # noqa: E402

F = torch.nn.functional


def _fresh_module_buffers(monkeypatch):
    """Empty the module-level buffer caches, so that each test's first call makes its buffers again."""
    from ck_conv.backends.triton import buffers
    from ck_fmha import device_errors
    from ck_gemm.backends.triton import launch as gemm_launch

    for mod, names in ((buffers, ("_COUNTERS", "_ACCUM", "_TABLES", "_PIX", "_WEXP")),
                       (device_errors, ("_FLAGS",)), (gemm_launch, ("_SCRATCH",))):
        for name in names:
            monkeypatch.setattr(mod, name, {})


@pytest.fixture
def replay_route(monkeypatch, ck_dispatch_log):
    """The GPU's warm route on CPU tensors: launches recorded (:func:`ck_core.testing.interp_record`)
    and replayed by the interpreter; the module-level buffers made anew."""
    monkeypatch.setenv("CK_BACKEND", "triton")
    _fresh_module_buffers(monkeypatch)
    core.clear()
    made = []
    monkeypatch.setattr(triton_replay, "replayable", lambda t: True)
    monkeypatch.setattr(triton_replay, "record", interp_record(made))
    yield made
    core.clear()


def _rand(g, *shape, dtype=torch.float32):
    return (torch.rand(*shape, generator=g) * 2 - 1).to(dtype)


def _cases():
    """name -> (make(g) -> leaves, {"eager": fn, "op": fn (the custom op a compiled graph calls)}, float64
    reference, tolerance)."""
    from ck_conv import conv2d
    from ck_conv.api import conv_op
    from ck_fmha import attention
    from ck_fmha.api import attention_op
    from ck_gemm import linear, matmul
    from ck_gemm.api import gemm_op

    def conv(cl):
        def make(g):
            x, w = _rand(g, 2, 4, 5, 5), _rand(g, 6, 4, 3, 3)
            if cl:
                x, w = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
            return [x, w]
        return make, {"eager": lambda x, w: conv2d(x, w, padding=1),
                      "op": lambda x, w: conv_op(x, w, [1, 1], [1, 1], [1, 1], 1)}, \
            lambda x, w: F.conv2d(x, w, padding=1), 1e-5

    def varlen(q, k, v):   # two sequences of 5 and 6 rows (the offsets are a constant of the case)
        from ck_fmha.flash_attn import flash_attn_varlen_func

        cu = torch.tensor([0, 5, 11], dtype=torch.int32)
        return flash_attn_varlen_func(q, k, v, cu, cu, 6, 6, causal=True)

    def varlen_ref(q, k, v):
        return torch.cat([F.scaled_dot_product_attention(*(t[a:b].transpose(0, 1) for t in (q, k, v)),
                                                         is_causal=True).transpose(0, 1)
                          for a, b in ((0, 5), (5, 11))])

    def attn_op(q, k, v):
        return attention_op(q, k, v, None, None, None, None, -1, -1, "True", None, [-1, -1], 0.0, "bhsd", True,
                            0.0, 0, 0, "", [], None)[0]

    return {
        "matmul": (lambda g: [_rand(g, 9, 7), _rand(g, 7, 5)],
                   {"eager": matmul, "op": lambda a, b: gemm_op(a, b, [], "none", None)},
                   lambda a, b: a @ b, 1e-5),
        "linear+bias": (lambda g: [_rand(g, 2, 3, 7), _rand(g, 5, 7), _rand(g, 5)],
                        {"eager": linear,
                         "op": lambda x, w, b: gemm_op(x.reshape(-1, 7), w.t(), [b], "none", None).reshape(2, 3, 5)},
                        F.linear, 1e-5),
        "conv2d": conv(False),
        "conv2d channels_last": conv(True),
        "attention": (lambda g: [_rand(g, 1, 2, 11, 32, dtype=torch.float16) for _ in range(3)],
                      {"eager": lambda q, k, v: attention(q, k, v, causal=True), "op": attn_op},
                      lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), 1e-2),
        "flash_attn_varlen": (lambda g: [_rand(g, 11, 2, 32, dtype=torch.float16) for _ in range(3)],
                              {"eager": varlen}, varlen_ref, 1e-2),
    }


def _rel(got, want) -> float:
    return float((got.detach().double() - want).norm() / want.norm())


#: (case, form, backward): eager calls forward (no autograd record: the warm-call cache) and fwd+bwd (autograd
#: Entries); the custom ops fwd+bwd (their forward is the forward-only call's; matmul's op is linear's); group
#: mode (offset guards, the device flag, recorded multi-launch runs) fwd+bwd only (the interpreter is slow there)
_RUNS = ([(c, "eager", b) for c in ("matmul", "linear+bias", "conv2d", "conv2d channels_last", "attention")
          for b in (False, True)] + [("flash_attn_varlen", "eager", True)]
         + [(c, "op", True) for c in ("linear+bias", "conv2d", "conv2d channels_last", "attention")])


@pytest.mark.parametrize("case,form,backward", _RUNS,
                         ids=[f"{c}-{f}-{'fwd+bwd' if b else 'fwd'}" for c, f, b in _RUNS])
def test_no_tensor_of_a_call_outlives_it(replay_route, ck_rng, case, form, backward):
    make, fns, ref, tol = _cases()[case]
    fn = fns[form]
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 31)))
    for call in ("first", "warm"):
        leaves = [t.requires_grad_(backward) for t in make(g)]
        dy = None
        with Allocations() as allocs:
            y = fn(*leaves)
            if backward:
                dy = _rand(g, *y.shape, dtype=y.dtype)
                y.backward(dy)
        refs = [t.detach().double().requires_grad_(backward) for t in leaves]
        want = ref(*refs)
        assert _rel(y, want.detach()) < tol, (case, form, call, "forward")
        if backward:
            want.backward(dy.double())
            for i, (t, r) in enumerate(zip(leaves, refs)):
                assert _rel(t.grad, r.grad) < tol, (case, form, call, f"gradient {i}")
                t.grad = None
        del y, want, refs
        alive = allocs.alive(*leaves, dy)
        assert not alive, f"{case} {form} {call}: tensors the call allocated are still alive:\n" + "\n".join(
            f"  {op} at {' <- '.join(reversed(frames))}" for op, frames in alive)
    if form == "eager":   # the warm call replayed recorded launches (the route this test is about)
        assert any(r.calls for r in replay_route), case


def test_buffers_kept_for_good_are_no_calls(monkeypatch):
    """The module-level buffers a launch makes on first use and keeps (GEMM split-K / stream-K scratch,
    conv counters, accumulators and tables, the FMHA device flag, the Gluon forward's LSE placeholder, a
    Dispatcher's sample tensor) are made by :func:`ck_core.memory.persistent`: none is an allocation of
    the call that first needed it (on a GPU: none lands in a CUDA graph's pool during its warm-up)."""
    from ck_conv.backends.triton import buffers
    from ck_conv.problem import ConvProblem
    from ck_fmha import device_errors
    from ck_gemm.backends.triton import launch as gemm_launch

    from ck_core.memory import persistent

    _fresh_module_buffers(monkeypatch)
    cpu = torch.device("cpu")
    p = ConvProblem(N=2, G=1, C=4, K=6, input_spatial=(5, 7), filter=(3, 3), pad_left=(1, 1), pad_right=(1, 1),
                    direction="bwd_weight", dtype="fp32")
    rows = [[(0, 0, 1, 2, 3)], [(1, 1, 0, 0, 4), (2, 0, 0, 1, 5)]]
    kept = []
    with Allocations() as allocs:
        kept += [buffers._counters(cpu, 10), buffers._accumulator(cpu, 10), *buffers._table_tensor(rows, 2, cpu),
                 buffers._ctab_tensor([(1, 2), (3, 4)], cpu), *buffers.pixel_tables(p, cpu),
                 *buffers.pixel_tables(p, cpu, tap_bits=True), device_errors.flag(cpu),
                 gemm_launch.scratch(cpu, "f32", 100), gemm_launch.scratch(cpu, "locks", 10),
                 persistent(lambda: torch.ones(2))]
        made = torch.zeros(3)
    assert all(isinstance(t, torch.Tensor) for t in kept)
    assert int(kept[-4]) == 0 and not kept[-2].any() and kept[-1].tolist() == [1.0, 1.0]
    assert [op for op, _ in allocs.alive()] == ["aten.zeros.default (3,) float32"], "only the call's own tensor"
    del made
    assert not allocs.alive()
    with pytest.raises(ZeroDivisionError):   # an error in the helper thread is raised in the caller's
        persistent(lambda: 1 / 0)


def test_depthwise_weight_tables_are_kept_from_the_second_unchanged_call(monkeypatch):
    """The expanded depthwise weights of a row-reuse launch: built per call while the weights change (a
    training step's), kept (outside the call: no graph's pool) from the second call with unchanged weights,
    never for a tensor that is no longer the one seen."""
    from ck_conv.backends.triton import buffers

    monkeypatch.setattr(buffers, "_WEXP", {})
    g = torch.Generator().manual_seed(0)
    w = torch.rand(3, 1, 2, 2, generator=g)

    def table():
        return buffers._wexp_table(w, w.reshape(3, 1, 1, 4), 4, 3, 5)

    def want():
        return w.reshape(3, 4).t().unsqueeze(1).expand(4, 5, 3).reshape(4, 15)

    with Allocations() as allocs:
        first = table()
    assert torch.equal(first.reshape(4, 15), want()) and len(allocs.alive(w)) == 1   # (first, alive here)
    del first
    assert not allocs.alive(w), "the first call's table is not kept"
    with Allocations() as allocs:
        second = table()
    assert torch.equal(second.reshape(4, 15), want()) and table() is second
    del second
    assert not allocs.alive(w), "the kept table is not an allocation of the call"
    with torch.no_grad():
        w.mul_(2)   # an optimizer step: a new version, a new table
    assert torch.equal(table().reshape(4, 15), want())
