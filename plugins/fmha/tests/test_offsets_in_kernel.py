"""Group-mode offsets checked inside the kernels (issue #26: a warm varlen forward is one launch, its
backward no guard or poisoning launch).  Every kernel that reads ``cu_seqlens_q/k`` checks them all
first; bad ones (the start below 0, decreasing, past the packed rows, a sequence longer than
max_seqlen, a logical length outside its span) make the call's outputs NaN -- the whole tensors, rows
of no sequence too -- and set BAD_OFFSETS in the device flag, with nothing read or written outside the
tensors.  The launchers get the offsets as the Dispatcher passes run-time ones (``_trusted_varlen``:
no host check), so the kernels' check is what runs, in the interpreter.  Good offsets give the float64
reference's results."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import ck_fmha  # noqa: E402
from ck_fmha import device_errors as D  # noqa: E402
from ck_fmha.backends.triton import TritonFmhaConfig  # noqa: E402
from ck_fmha.backends.triton import launch as ops  # noqa: E402
from ck_fmha.backends.triton import launch_bwd as ops_bwd  # noqa: E402
from ck_fmha.backends.triton.launch_decode import batch_prefill_launch  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")]

SMALL = TritonFmhaConfig(16, 16, 4, 1)
SENTINEL = 1234.0
LENS_Q, LENS_K = [5, 9, 3], [7, 4, 10]   # odd sizes; q has 2 packed rows of no sequence, k 1
ROWS_Q, ROWS_K = sum(LENS_Q) + 2, sum(LENS_K) + 1


@pytest.fixture(autouse=True)
def _clean_flag():
    D._FLAGS.clear()
    yield
    D._FLAGS.clear()


def _cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


def _bad(kind, lens, rows):
    """(offsets, max_seqlen) of one kind of bad offsets for sequences ``lens`` in ``rows`` packed rows."""
    cu, longest = _cu(lens), max(lens)
    if kind == "negative":
        cu[0] = -2
    elif kind == "decreasing":
        cu[2] = cu[1] - 1
    elif kind == "past_rows":   # the last span stays within max_seqlen
        cu[-1] = rows + 1
    elif kind == "too_long":
        longest -= 1
    return cu, longest


def _ref(q, k, v, cu_q, cu_k, lens_k=None):
    """float64 attention per sequence (GQA by repeated kv heads); rows of no sequence stay 0."""
    group = q.shape[1] // k.shape[1]
    o = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=torch.float64)
    for i, (s, e) in enumerate(zip(cu_q[:-1].tolist(), cu_q[1:].tolist())):
        ks = int(cu_k[i])
        ke = ks + (int(lens_k[i]) if lens_k is not None else int(cu_k[i + 1]) - ks)
        qq = q[s:e].double().transpose(0, 1)
        kk, vv = (x[ks:ke].double().repeat_interleave(group, 1).transpose(0, 1) for x in (k, v))
        p = torch.softmax(qq @ kk.transpose(1, 2) / q.shape[-1] ** 0.5, -1)
        o[s:e] = (p @ vv).transpose(0, 1)
    return o


def _rel(got, want):
    return float((got.double() - want).norm() / want.norm())


def _inputs(seed, hq=2, hk=2, d=16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(ROWS_Q, hq, d, generator=g).half()
    k, v = (torch.randn(ROWS_K, hk, d, generator=g).half() for _ in range(2))
    return q, k, v


def _fwd_into_sentinel(q, k, v, cu_q, cu_k, max_q, max_k, **kw):
    """ops.fwd writing o into the middle of a sentinel buffer (a write outside o would show)."""
    buf = torch.full((q.shape[0] + 4,) + q.shape[1:], SENTINEL).half()
    o, lse = ops.fwd(q, k, v, layout="thd", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q,
                     max_seqlen_k=max_k, config=SMALL, return_lse=True, out=buf[2:-2], _trusted_varlen=True, **kw)
    assert (buf[:2] == SENTINEL).all() and (buf[-2:] == SENTINEL).all()
    return o, lse


@pytest.mark.parametrize("which", ["q", "k"])
@pytest.mark.parametrize("kind", ["negative", "decreasing", "past_rows", "too_long"])
def test_forward_bad_offsets_give_nan_and_the_flag(which, kind):
    q, k, v = _inputs(11)
    cu_q, max_q = _cu(LENS_Q), max(LENS_Q)
    cu_k, max_k = _cu(LENS_K), max(LENS_K)
    if which == "q":
        cu_q, max_q = _bad(kind, LENS_Q, ROWS_Q)
    else:
        cu_k, max_k = _bad(kind, LENS_K, ROWS_K)
    o, lse = _fwd_into_sentinel(q, k, v, cu_q, cu_k, max_q, max_k)
    assert torch.isnan(o).all() and torch.isnan(lse).all()   # rows of no sequence too: the whole outputs
    assert int(D.flag("cpu")) == D.BAD_OFFSETS


@pytest.mark.parametrize("seed", range(2))
def test_forward_good_offsets_match_the_reference(seed):
    q, k, v = _inputs(20 + seed, hq=4, hk=2, d=24)   # GQA, a padded head dim
    cu_q, cu_k = _cu(LENS_Q), _cu(LENS_K)
    o, lse = _fwd_into_sentinel(q, k, v, cu_q, cu_k, max(LENS_Q), max(LENS_K))
    want = _ref(q, k, v, cu_q, cu_k)
    rows = slice(0, sum(LENS_Q))
    assert _rel(o[rows], want[rows]) < 2e-3 and torch.isfinite(lse[:, rows]).all()
    assert int(D.flag("cpu")) == 0


@pytest.mark.parametrize("bad_len", [-1, 5, 11])   # below 0, past its span (4), past max_seqlen_k (10)
def test_forward_logical_key_lengths_are_checked(bad_len):
    q, k, v = _inputs(31)
    cu_q, cu_k = _cu(LENS_Q), _cu(LENS_K)
    lens = torch.tensor([6, 3, 10], dtype=torch.int32)
    o, _ = _fwd_into_sentinel(q, k, v, cu_q, cu_k, max(LENS_Q), 10, seqlens_k=lens)
    want = _ref(q, k, v, cu_q, cu_k, lens)
    assert _rel(o[:sum(LENS_Q)], want[:sum(LENS_Q)]) < 2e-3 and int(D.flag("cpu")) == 0
    lens[1] = bad_len
    o, _ = _fwd_into_sentinel(q, k, v, cu_q, cu_k, max(LENS_Q), 10, seqlens_k=lens)
    assert torch.isnan(o).all() and int(D.flag("cpu")) == D.BAD_OFFSETS


def test_the_check_agrees_with_the_torch_form_on_many_offsets():
    """Random good and bad offsets, past one 256-offset block of the kernels' scan (a bad one anywhere
    counts): NaN and the flag exactly where the torch statement of the contract
    (ck_fmha.device_errors.guard_offsets) changes something."""
    g = torch.Generator().manual_seed(5)
    d, hq = 16, 1
    for trial in range(6):
        n = 300 if trial == 1 else int(torch.randint(2, 12, (1,), generator=g))
        spans = torch.randint(0, 6, (n - 1,), generator=g)
        cu = torch.cat((torch.zeros(1, dtype=torch.long), spans.cumsum(0)))
        rows, longest = int(cu[-1]) + 1, max(1, int(spans.max()))
        if trial == 1:   # only the last offset (in the scan's second block of 256) is past the rows
            cu[-1] = rows + 1
        elif trial % 2:
            cu[int(torch.randint(0, n, (1,), generator=g))] += 3 if trial % 4 == 1 else -3
        cu = cu.to(torch.int32)
        D._FLAGS.clear()
        _, want_bad = D.guard_offsets(cu, rows, longest)
        D._FLAGS.clear()
        q = torch.randn(rows, hq, d, generator=g).half()
        o = ops.fwd(q, q, q, layout="thd", cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest,
                    max_seqlen_k=longest, config=SMALL, _trusted_varlen=True)
        assert bool(torch.isnan(o).all()) == bool(want_bad), (trial, cu.tolist())
        assert int(D.flag("cpu")) == (D.BAD_OFFSETS if want_bad else 0)
        if not want_bad:
            want = _ref(q, q, q, cu, cu)
            last = int(cu[-1])
            assert _rel(o[:last], want[:last]) < 2e-3


def _grads(q, k, v, do, cu_q, cu_k, max_q, max_k, cfg_kv, deterministic):
    o, lse = ops.fwd(q, k, v, layout="thd", cu_seqlens_q=_cu(LENS_Q), cu_seqlens_k=_cu(LENS_K),
                     max_seqlen_q=max(LENS_Q), max_seqlen_k=max(LENS_K), config=SMALL, return_lse=True,
                     _trusted_varlen=True)
    return ops_bwd.bwd(q, k, v, o, lse, do, layout="thd", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q,
                       max_seqlen_k=max_k, config=(cfg_kv, SMALL), deterministic=deterministic,
                       _trusted_varlen=True)


@pytest.mark.parametrize("deterministic,variant,gsplit", [(True, "ptr", 1), (False, "kvsplit", 2)])
def test_backward_bad_key_offsets_give_nan_gradients_and_the_flag(deterministic, variant, gsplit):
    """Every backward kernel checks the offsets: with bad key offsets dq, dk and dv are all NaN (dK/dV
    partials of a split GQA group too) and the flag is set; good offsets match float64 autograd."""
    q, k, v = _inputs(41, hq=4, hk=2)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(42)).half()
    cfg_kv = SMALL.with_(variant=variant, GSPLIT=gsplit)
    cu_q, cu_k = _cu(LENS_Q), _cu(LENS_K)
    dq, dk, dv = _grads(q, k, v, do, cu_q, cu_k, max(LENS_Q), max(LENS_K), cfg_kv, deterministic)
    ref = [x.detach().double().requires_grad_() for x in (q, k, v)]
    want_o = _ref_autograd(*ref, cu_q, cu_k)
    want_o.backward(do.double()[:sum(LENS_Q)])
    for got, want, n in zip((dq, dk, dv), ref, (sum(LENS_Q), sum(LENS_K), sum(LENS_K))):
        assert _rel(got[:n], want.grad[:n]) < 2e-2
    assert int(D.flag("cpu")) == 0
    for kind in ("decreasing", "past_rows"):
        bad_k, max_k = _bad(kind, LENS_K, ROWS_K)
        out = _grads(q, k, v, do, cu_q, bad_k, max(LENS_Q), max_k, cfg_kv, deterministic)
        assert all(torch.isnan(x).all() for x in out), [torch.isnan(x).float().mean().item() for x in out]
        assert int(D.flag("cpu")) == D.BAD_OFFSETS
        D._FLAGS.clear()
    bad_q, max_q = _bad("too_long", LENS_Q, ROWS_Q)
    out = _grads(q, k, v, do, bad_q, cu_k, max_q, max(LENS_K), cfg_kv, deterministic)
    assert all(torch.isnan(x).all() for x in out) and int(D.flag("cpu")) == D.BAD_OFFSETS


def _ref_autograd(q, k, v, cu_q, cu_k):
    group = q.shape[1] // k.shape[1]
    outs = []
    for i, (s, e) in enumerate(zip(cu_q[:-1].tolist(), cu_q[1:].tolist())):
        ks, ke = int(cu_k[i]), int(cu_k[i + 1])
        qq = q[s:e].transpose(0, 1)
        kk, vv = (x[ks:ke].repeat_interleave(group, 1).transpose(0, 1) for x in (k, v))
        p = torch.softmax(qq @ kk.transpose(1, 2) / q.shape[-1] ** 0.5, -1)
        outs.append((p @ vv).transpose(0, 1))
    return torch.cat(outs)


@pytest.mark.parametrize("kind", [None, "decreasing", "past_rows"])
def test_batch_prefill_query_offsets(kind):
    """batch_prefill's kernel checks its query offsets too (its page check is the page guard's)."""
    g = torch.Generator().manual_seed(51)
    ps, hq, hk, d = 4, 2, 1, 16
    q = torch.randn(ROWS_Q, hq, d, generator=g).half()
    pool = torch.randn(9, ps, hk, d, generator=g).half()
    pages = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 0]], dtype=torch.int32)
    lens = torch.tensor([9, 12, 5], dtype=torch.int32)
    cu_q, max_q = (_cu(LENS_Q), max(LENS_Q)) if kind is None else _bad(kind, LENS_Q, ROWS_Q)
    o, lse = batch_prefill_launch(q, pool, pool, lens, cu_seqlens_q=cu_q, max_seqlen_q=max_q, max_seqlen_k=12,
                                  block_table=pages, config=SMALL, return_lse=True, _trusted_varlen=True)
    if kind is not None:
        assert torch.isnan(o).all() and torch.isnan(lse).all() and int(D.flag("cpu")) == D.BAD_OFFSETS
        return
    kk = torch.cat([pool[pages[b]].reshape(-1, hk, d)[:int(lens[b])] for b in range(3)])
    want = _ref(q, kk, kk, cu_q, _cu(lens.tolist()))
    n = sum(LENS_Q)
    assert _rel(o[:n], want[:n]) < 2e-3 and int(D.flag("cpu")) == 0


def test_public_call_raises_for_bad_offsets_then_runs():
    """Through ck_fmha.attention (run-time offsets, the warm path): the CPU flag is read at once."""
    q, k, v = _inputs(61)
    bad, _ = _bad("decreasing", LENS_K, ROWS_K)
    with pytest.raises(D.DeviceLengthError, match="group-mode offsets"):
        ck_fmha.attention(q, k, v, layout="thd", cu_seqlens_q=_cu(LENS_Q), cu_seqlens_k=bad,
                          max_seqlen_q=max(LENS_Q), max_seqlen_k=max(LENS_K))
    o = ck_fmha.attention(q, k, v, layout="thd", cu_seqlens_q=_cu(LENS_Q), cu_seqlens_k=_cu(LENS_K),
                          max_seqlen_q=max(LENS_Q), max_seqlen_k=max(LENS_K))
    n = sum(LENS_Q)
    assert _rel(o[:n], _ref(q, k, v, _cu(LENS_Q), _cu(LENS_K))[:n]) < 2e-3


@pytest.mark.gpu
def test_gpu_offsets_checked_in_the_kernels_cold_and_warm():
    """On a GPU, through the public calls (run-time device offsets: recorded launches replayed):
    good offsets give the float64 reference (fwd and grads, cold and warm); every kind of bad query or
    key offsets gives all-NaN outputs and the flag, as do bad key offsets in the backward alone and bad
    query offsets in batch_prefill; good calls of the same signatures run on after them."""
    import os

    if os.environ.get("CK_TEST_GPU") != "1" or not torch.cuda.is_available():
        pytest.skip("needs CK_TEST_GPU=1 and a CUDA device")
    from ck_fmha.api import _bwd
    from ck_fmha.prefill import batch_prefill

    dev = "cuda"
    q, k, v = (x.to(dev) for x in _inputs(71, hq=4, hk=2, d=64))
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(72)).half().to(dev)
    good_q, good_k = _cu(LENS_Q).to(dev), _cu(LENS_K).to(dev)
    mq, mk, nq = max(LENS_Q), max(LENS_K), sum(LENS_Q)
    ref = [x.detach().cpu().double().requires_grad_() for x in (q, k, v)]
    want = _ref_autograd(*ref, _cu(LENS_Q), _cu(LENS_K))
    want.backward(do.cpu().double()[:nq])
    try:
        ck_fmha.check_errors()
    except D.DeviceLengthError:
        pass

    def fwd_bwd(cq, ck, max_q=mq, max_k=mk):
        x = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        o = ck_fmha.attention(*x, layout="thd", cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=max_q,
                              max_seqlen_k=max_k)
        o.backward(do)
        return o.detach(), [t.grad for t in x]

    for _ in range(3):   # the cold call records, the next two replay
        o, grads = fwd_bwd(good_q, good_k)
        assert _rel(o[:nq].cpu(), want.detach()[:nq]) < 1e-2
        for got, r, n in zip(grads, ref, (nq, sum(LENS_K), sum(LENS_K))):
            assert _rel(got[:n].cpu(), r.grad[:n]) < 2e-2
    ck_fmha.check_errors()
    for which in ("q", "k"):
        for kind in ("negative", "decreasing", "past_rows", "too_long"):
            cq, max_q = (_bad(kind, LENS_Q, ROWS_Q) if which == "q" else (_cu(LENS_Q), mq))
            ck, max_k = (_bad(kind, LENS_K, ROWS_K) if which == "k" else (_cu(LENS_K), mk))
            o = ck_fmha.attention(q, k, v, layout="thd", cu_seqlens_q=cq.to(dev), cu_seqlens_k=ck.to(dev),
                                  max_seqlen_q=max_q, max_seqlen_k=max_k)
            assert torch.isnan(o).all(), (which, kind)
            with pytest.raises(D.DeviceLengthError, match="group-mode offsets"):
                ck_fmha.check_errors()
    o, lse = ck_fmha.attention(q, k, v, layout="thd", cu_seqlens_q=good_q, cu_seqlens_k=good_k, max_seqlen_q=mq,
                               max_seqlen_k=mk, return_lse=True)
    for deterministic in (True, False):
        bad_k = _bad("decreasing", LENS_K, ROWS_K)[0].to(dev)
        out = _bwd(q, k, v, o, lse, do, None, None, good_q, bad_k, (mq, mk), False, None, (-1, -1), 0.0, "thd",
                   deterministic, 0.0, 0, 0, None, False)
        assert all(torch.isnan(x).all() for x in out[:3]), deterministic
        with pytest.raises(D.DeviceLengthError, match="group-mode offsets"):
            ck_fmha.check_errors()
    ps, hk = 16, 2
    pool = torch.randn(8, ps, hk, 64, generator=torch.Generator().manual_seed(73)).half().to(dev)
    pages = torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32, device=dev)
    lens = torch.tensor([20, 9, 32], dtype=torch.int32, device=dev)
    kw = dict(max_seqlen_k=32, block_table=pages)
    for cq, max_q, bad in ((good_q, mq, False), (_bad("past_rows", LENS_Q, ROWS_Q)[0].to(dev), mq, True),
                           (good_q, mq - 1, True), (good_q, mq, False)):
        op = batch_prefill(q, pool, pool, lens, cu_seqlens_q=cq, max_seqlen_q=max_q, **kw)
        if bad:
            assert torch.isnan(op).all()
            with pytest.raises(D.DeviceLengthError, match="group-mode offsets"):
                ck_fmha.check_errors()
        else:
            assert torch.isfinite(op[:nq]).all()
            ck_fmha.check_errors()
    o2, _ = fwd_bwd(good_q, good_k)
    assert _rel(o2[:nq].cpu(), want.detach()[:nq]) < 1e-2
    ck_fmha.check_errors()


_SM90_SCRIPT = r'''
import sys
import torch
from triton.backends.compiler import GPUTarget
from ck_core.backends import triton_artifacts as ta
from ck_fmha.backends.triton import TritonFmhaConfig
from ck_fmha.backends.triton import launch as ops, launch_bwd as ops_bwd
from ck_fmha.backends.triton.launch_decode import batch_prefill_launch

ta.current_target = lambda: GPUTarget("cuda", 90, 32)   # the GPU this box does not have
done = []
def compile_only(name, fn, grid, args, kwargs, cache_root=None, extra=None):
    ck, _ = ta.kernel_for_call(name, fn, args, kwargs, cache_root=sys.argv[1], extra=extra)
    done.append(ck.metadata.name)
ta.launch = compile_only
via = lambda fn, grid: ta.bind("chk/" + fn.__name__, fn, grid)
M = lambda *s, dt=torch.float16: torch.empty(s, dtype=dt, device="meta")
cu, lens = torch.empty(4, dtype=torch.int32, device="meta"), torch.empty(3, dtype=torch.int32, device="meta")
q, k, v, do = M(40, 4, 64), M(40, 2, 64), M(40, 2, 64), M(40, 4, 64)
cfg = TritonFmhaConfig(64, 64, 4, 2)
kw = dict(layout="thd", cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=17, max_seqlen_k=19, _trusted_varlen=True)
o, lse = ops.fwd(q, k, v, config=cfg, return_lse=True, causal="bottom_right", seqlens_k=lens, _via=via, **kw)
pool = M(9, 16, 2, 64)
batch_prefill_launch(q, pool, pool, lens, cu_seqlens_q=cu, max_seqlen_q=17, max_seqlen_k=32,
                     block_table=torch.empty(3, 2, dtype=torch.int32, device="meta"), config=cfg, return_lse=True,
                     _trusted_varlen=True, _via=via)
d = ops_bwd.bwd_dot_do_o(o, do, layout="thd", cu_seqlens_q=cu, max_seqlen_q=17, _trusted_varlen=True, _via=via)
lse = M(4, 40, dt=torch.float32)
res = ops_bwd.bwd_dq_dk_dv(q, k, v, do, lse, d, config=(cfg.with_(variant="kvsplit", GSPLIT=2), cfg),
                           deterministic=False, bias=M(4, 40, 19), return_dbias=True, _via=via, **kw)
ops_bwd.bwd_convert_dq(res[1], q, layout="thd", cu_seqlens_q=cu, max_seqlen_q=17, cu_seqlens_k=cu, max_seqlen_k=19,
                       total_k=40, _trusted_varlen=True, _via=via)
ops_bwd.bwd_dq_dk_dv(q, k, v, do, lse, d, config=(cfg, cfg), deterministic=True, _via=via, **kw)
print("COMPILED", " ".join(done))
'''


@pytest.mark.slow   # (15 s of compiles: CI's budget; run it with -m slow after changing these kernels)
def test_the_group_mode_kernels_compile_for_sm90(tmp_path):
    """The interpreter runs what Triton's compiler might refuse (an early return inside a run-time
    branch, constexpr / tensor mixing): the changed group-mode kernels are compiled for sm90 here, in a
    subprocess without the interpreter (a CPU box compiles for a GPU it does not have), no launch."""
    import os
    import subprocess
    import sys

    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    r = subprocess.run([sys.executable, "-c", _SM90_SCRIPT, str(tmp_path / "kernels")], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    names = r.stdout.split("COMPILED", 1)[1].split()
    assert names.count("fmha_fwd_kernel") == 2 and "fmha_bwd_dq_kernel" in names, names
    assert {"fmha_bwd_dot_do_o_kernel", "fmha_bwd_dq_dk_dv_kernel", "fmha_bwd_convert_dq_kernel"} <= set(names), names
