"""One test per FMHA correctness class of issue 12 (the fuzz suite is tests/test_fuzz.py, whose
float64 reference these tests reuse)."""
from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from ck_core import Dispatcher, InvalidProblem, PluginManager, Registry, plugins  # noqa: E402
from ck_core.testing import arch_plugin, make_fake_arch  # noqa: E402
from ck_fmha.problem import FmhaProblem, check_tensors  # noqa: E402
from test_fuzz import attend, make_tensors, mismatches, reference  # noqa: E402

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
cpu_only = pytest.mark.skipif(not INTERP, reason="CPU tests (Triton interpreter)")


@pytest.fixture(scope="module")
def disp():
    old = plugins._MANAGER
    plugins.reset_manager(PluginManager(plugins=[arch_plugin(make_fake_arch())]))
    out = {b: Dispatcher(Registry.from_enumeration("fmha", "fake64", b, dtypes="fp16"), backend=b)
           for b in ("numpy", "triton")}
    yield out
    plugins.reset_manager(old)


def _case(**kw):
    p = FmhaProblem(**kw)
    return dict(problem=p, scale=p.softmax_scale, cap=p.logits_soft_cap, mask=p.mask, left=p.window_left,
                right=p.window_right, sink_tokens=p.sink_tokens, neg_logits=False,
                bias_shape=(False, True) if p.bias == "elementwise" else None)


def _run(d, case, t):
    be = d.backend_spec
    out = d.run_dict(case["problem"], {n: be.to_backend(x) for n, x in t.items()})
    return {n: be.to_numpy(v) for n, v in out.items() if n in ("o", "lse", "dq", "dk", "dv", "dbias")}


GROUP = dict(mode="group", batch=3, nhead_q=2, nhead_k=1, hdim_q=32, seqstart_q=(0, 7, 7, 20),
             seqstart_k=(0, 29, 31, 60), seqlens_k=(20, 0, 17))


# 1. group mode with logical seqlens_k shorter than the seqstart_k spans
@cpu_only
@pytest.mark.parametrize("backend", ["numpy", "triton"])
@pytest.mark.parametrize("kw", [dict(family="fwd", mask="bottom_right", bias="elementwise"),
                                dict(family="fwd", p_drop=0.0, sink_logits=True),
                                dict(family="bwd_dq_dk_dv", bias="elementwise", dbias=True),
                                dict(family="bwd_dq_dk_dv", mask="top_left", deterministic=True)])
def test_group_mode_seqlens_k(disp, backend, kw):
    case = _case(**GROUP, **kw)
    t = make_tensors(case, np.random.default_rng(1))   # keys and bias columns past seqlens_k hold NaN
    got = _run(disp[backend], case, t)
    if case["problem"].family == "fwd":
        want = {n: v.numpy() for n, v in reference(case, t).items()}
    else:
        r = reference(case, t, grads=True)
        want = {n: r[n].numpy() for n in ("dq", "dk", "dv", "dbias") if n in r}
    assert not mismatches(case, got, want, t)


@cpu_only
def test_group_mode_seqlens_k_dropout_randval(disp):
    """store_randval in group mode with seqlens_k writes [H, Tq, max seqlens_k] (it wrote past it)."""
    p = FmhaProblem(**GROUP, family="fwd", p_drop=0.3, seed=5, store_randval=True)
    t = make_tensors(_case(**GROUP, family="fwd"), np.random.default_rng(2))
    got = disp["triton"].run_dict(p, {n: torch.from_numpy(x) for n, x in t.items()})
    want = disp["numpy"].run_dict(p, t)
    assert tuple(got["randval"].shape) == (2, 20, 20)
    np.testing.assert_array_equal(got["randval"].numpy(), want["randval"])


# 2. the backward of rows with a very negative LSE when seqlen_k is not a multiple of the key tile
DEVICES = [pytest.param("cpu", marks=cpu_only),
           pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(INTERP, reason="needs a CUDA GPU")])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(softcap=30.0),
                                dict(window=(5, 3)), dict(bias=True)])
def test_backward_with_very_negative_lse(deterministic, kw, device):
    from ck_fmha.backends.triton import launch as ops
    from ck_fmha.backends.triton import launch_bwd as ops_bwd

    g = torch.Generator().manual_seed(0)
    B, H, Sq, Sk, D = (1, 2, 37, 45, 32) if device == "cpu" else (2, 4, 300, 333, 128)
    w = torch.ones(D, dtype=torch.float64)
    q = (-2.0 * w + 0.05 * torch.randn(B, H, Sq, D, generator=g, dtype=torch.float64)).half()
    k = (2.0 * w + 0.05 * torch.randn(B, H, Sk, D, generator=g, dtype=torch.float64)).half()
    v = torch.randn(B, H, Sk, D, generator=g, dtype=torch.float64).half()
    do = torch.randn(B, H, Sq, D, generator=g, dtype=torch.float64).half()
    bias = torch.randn(B, H, Sq, Sk, generator=g, dtype=torch.float64).half() if kw.pop("bias", False) else None
    q, k, v, do = (x.to(device) for x in (q, k, v, do))
    bias = None if bias is None else bias.to(device)
    from ck_fmha.heuristics import default_bwd_configs, default_fwd_config

    # the generic tables' Triton tiles, pointer form (the launchers run the configs they are given)
    fcfg = default_fwd_config(D, D, "generic", bool(kw.get("causal")), Sq, gluon=False).with_(variant="ptr")
    o, lse = ops.fwd(q, k, v, return_lse=True, bias=bias, config=fcfg, **kw)
    assert lse.max() < -11   # the regime of FlashAttention's test_flash_attn_bwd_varlen_overflow
    dq, dk, dv = ops_bwd.bwd(q, k, v, o, lse, do, deterministic=deterministic, bias=bias,
                         config=default_bwd_configs(D, D, "generic", causal=bool(kw.get("causal"))), **kw)
    c = dict(scale=D ** -0.5, cap=kw.get("softcap", 0.0), mask="top_left" if (kw.get("causal") or "window" in kw) else "none",
             left=kw.get("window", (-1, -1))[0], right=0 if kw.get("causal") else kw.get("window", (-1, -1))[1],
             sink_tokens=0)
    leaves = [x.cpu().double().requires_grad_(True) for x in (q, k, v)]
    ref_o = torch.stack([attend(*(x[b] for x in leaves), c, None if bias is None else bias[b].cpu().double())[0]
                         for b in range(B)])
    want = torch.autograd.grad((ref_o * do.cpu().double()).sum(), leaves)
    dq, dk, dv = (x.cpu() for x in (dq, dk, dv))
    for name, got, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), want):
        assert torch.isfinite(got).all(), f"{name} has NaN/Inf"
        err = (got.double() - ref).abs().max() / ref.abs().max()
        assert err < 5e-2, (name, float(err))


# 3. split-KV over a paged KV cache plans (its combine stage does not inherit the paging)
@cpu_only
@pytest.mark.parametrize("backend", ["numpy", "triton"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_paged_splitkv_plans_and_runs(disp, backend, layout):
    case = _case(family="fwd_splitkv", batch=2, nhead_q=4, nhead_k=2, seqlen_q=2, seqlen_k=90, hdim_q=32,
                 seqlens_k=(90, 33), paged_kv=True, page_size=16, num_splits=3, layout=layout,
                 mask="bottom_right")
    stages = disp[backend].plan(case["problem"]).stages
    assert [s.problem.family for s in stages] == ["fwd_splitkv", "fwd_splitkv_combine"]
    assert stages[0].problem.paged_kv and not stages[1].problem.paged_kv
    t = make_tensors(case, np.random.default_rng(3))
    want = {n: v.numpy() for n, v in reference(case, t).items()}
    assert not mismatches(case, _run(disp[backend], case, t), want)


# 4. NaN / Inf in q/k/v gives NaN out, never a silent 0 with lse -inf
@cpu_only
@pytest.mark.parametrize("backend", ["numpy", "triton"])
@pytest.mark.parametrize("where", ["q", "k", "v", "k_inf"])
def test_nan_inputs_propagate(disp, backend, where):
    p = FmhaProblem(family="fwd", batch=1, nhead_q=1, seqlen_q=5, seqlen_k=9, hdim_q=32, dtype="fp16")
    rng = np.random.default_rng(4)
    t = {n: rng.standard_normal((1, 1, 5 if n == "q" else 9, 32)).astype(np.float16) for n in ("q", "k", "v")}
    name = where[0]
    t[name][0, 0, 2, 3] = np.inf if where == "k_inf" else np.nan
    out = disp[backend].run_dict(p, {n: disp[backend].backend_spec.to_backend(x) for n, x in t.items()})
    o = disp[backend].backend_spec.to_numpy(out["o"]).astype(np.float64)
    lse = disp[backend].backend_spec.to_numpy(out["lse"])
    if where != "k_inf":   # (an infinite key gives +inf logits in some rows, -inf in others)
        rows = [2] if where == "q" else list(range(5))   # every row sees key 2
        assert np.isnan(o[0, 0, rows]).any(axis=-1).all(), o[0, 0]
    assert not (np.isneginf(lse).any()), lse
    want = torch.nn.functional.scaled_dot_product_attention(*(torch.from_numpy(t[n]).double() for n in "qkv"))
    assert np.array_equal(np.isnan(o).any(-1), want.isnan().any(-1).numpy())


# 5. bad input is an error, never truncated, ignored or converted silently
@pytest.mark.parametrize("kw", [dict(batch=2.7), dict(batch=True), dict(seqlen_q="abc"), dict(nhead_q=1.5),
                                dict(mode="group", seqstart_q=[0, 2.5], seqstart_k=[0, 3], batch=1)])
def test_problem_fields_are_true_integers(kw):
    with pytest.raises(InvalidProblem, match="integer"):
        FmhaProblem(**{"seqlen_q": 4, "hdim_q": 32, **kw})
    assert FmhaProblem(batch=2.0, seqlen_q=np.int64(4), hdim_q=32).batch == 2


def test_causal_mask_with_a_left_window_stays_causal():
    """mask='causal' + window_left=3 is a causal sliding window: window_right defaults to 0."""
    from ck_fmha.masks import visible

    p = FmhaProblem(seqlen_q=8, seqlen_k=8, hdim_q=32, mask="causal", window_left=3)
    assert (p.mask, p.window_left, p.window_right) == ("top_left", 3, 0)
    vis = visible(p, 8, 8)
    i, j = np.nonzero(vis)
    assert (j <= i).all() and (i - j <= 3).all()
    assert FmhaProblem(seqlen_q=8, hdim_q=32, mask="b", window_left=3, window_right=2).window_right == 2


@cpu_only
@pytest.mark.parametrize("backend", ["numpy", "triton"])
def test_unknown_or_unused_tensors_are_refused(disp, backend):
    p = FmhaProblem(family="fwd", seqlen_q=4, hdim_q=32, dtype="fp16")
    x = np.zeros((1, 1, 4, 32), np.float16)
    be = disp[backend].backend_spec
    t = {n: be.to_backend(x) for n in ("q", "k", "v")}
    with pytest.raises(InvalidProblem, match="alibi_slopes"):
        disp[backend].run_dict(p, {**t, "bais": be.to_backend(np.zeros((1, 1, 4, 4), np.float16))})
    with pytest.raises(InvalidProblem, match="bias="):   # a bias the problem does not ask for
        disp[backend].run_dict(p, {**t, "bias": be.to_backend(np.zeros((1, 1, 4, 4), np.float16))})


def test_unknown_attention_keywords_are_refused():
    import ck_fmha

    q = torch.zeros(1, 1, 4, 32, dtype=torch.float16)
    with pytest.raises(InvalidProblem, match="alibi_slopes"):
        ck_fmha.attention(q, q, q, bais=None)
    with pytest.raises(InvalidProblem, match="return_lse"):
        ck_fmha.attention_forward(q, q, q, retrun_lse=True)


@cpu_only
def test_float32_tensors_for_an_fp16_problem_are_refused(disp):
    p = FmhaProblem(family="fwd", seqlen_q=4, hdim_q=32, dtype="fp16")
    t = {n: np.zeros((1, 1, 4, 32), np.float32) for n in ("q", "k", "v")}
    with pytest.raises(InvalidProblem, match="dtype"):
        disp["triton"].run_dict(p, {n: torch.from_numpy(x) for n, x in t.items()})
    with pytest.raises(InvalidProblem, match="dtype"):
        disp["numpy"].run_dict(p, t)


def test_fp8_inputs_outside_the_e4m3_range_are_refused():
    from ck_fmha.backends.triton.implement import _as_kernel_dtype

    p = FmhaProblem(family="fwd", seqlen_q=4, hdim_q=32, dtype="fp8")
    q = np.full((1, 1, 4, 32), 0.5, np.float32)
    check_tensors(p, q=q)
    q[0, 0, 1, 2] = 1000.0
    with pytest.raises(InvalidProblem, match="e4m3"):
        check_tensors(p, q=q)
    for dt in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        with pytest.raises(InvalidProblem, match="range"):
            _as_kernel_dtype(p, "q", torch.from_numpy(q), dt)
    assert _as_kernel_dtype(p, "q", torch.full((4,), 0.5), torch.float8_e4m3fn).dtype == torch.float8_e4m3fn


@cpu_only
@pytest.mark.parametrize("bad", ["decreasing", "max_seqlen_q", "past_the_end", "seqlens_k"])
def test_bad_cu_seqlens_are_refused_on_the_host(bad):
    from ck_fmha.backends.triton import launch as ops
    from ck_fmha.backends.triton import launch_bwd as ops_bwd

    q = torch.randn(20, 2, 32).half()
    cu_q, cu_k = torch.tensor([0, 12, 20], dtype=torch.int32), torch.tensor([0, 9, 20], dtype=torch.int32)
    kw = dict(max_seqlen_q=12, max_seqlen_k=11)
    if bad == "decreasing":
        cu_q = torch.tensor([0, 12, 8], dtype=torch.int32)
    elif bad == "max_seqlen_q":
        kw["max_seqlen_q"] = 8
    elif bad == "past_the_end":
        cu_k = torch.tensor([0, 9, 25], dtype=torch.int32)
    else:
        kw["seqlens_k"] = torch.tensor([5, 12], dtype=torch.int32)
    with pytest.raises(InvalidProblem):
        ops.fwd(q, q, q, layout="thd", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **kw)
    with pytest.raises(InvalidProblem):
        ops_bwd.bwd(q, q, q, q, torch.zeros(2, 20), q, layout="thd", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                **{"max_seqlen_k": 11, **kw})


def test_group_problem_maxima_cover_every_sequence():
    with pytest.raises(InvalidProblem, match="seqlen_q=3"):
        FmhaProblem(mode="group", batch=2, seqstart_q=(0, 5, 9), seqstart_k=(0, 5, 9), seqlen_q=3, hdim_q=32)


@pytest.mark.gpu
@pytest.mark.skipif(INTERP or not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bad_device_cu_seqlens_give_nan_not_a_result():
    """Offsets already on the GPU are checked there (by the kernel) without a host sync: outputs become NaN
    and the device flag names the offsets."""
    from ck_fmha.backends.triton import launch as ops
    from ck_fmha.backends.triton import launch_bwd as ops_bwd

    from ck_fmha.backends.triton.configs import TritonFmhaConfig

    q = torch.randn(20, 2, 64, device="cuda").half()
    cu_k = torch.tensor([0, 9, 20], dtype=torch.int32, device="cuda")
    cfg = TritonFmhaConfig(64, 64, 4, 2, "ptr")   # the launcher runs the config it is given
    ok = ops.fwd(q, q, q, layout="thd", cu_seqlens_q=cu_k, cu_seqlens_k=cu_k, max_seqlen_q=11, max_seqlen_k=11,
                 config=cfg)
    assert torch.isfinite(ok).all()
    bad = ops.fwd(q, q, q, layout="thd", cu_seqlens_q=torch.tensor([0, 12, 8], dtype=torch.int32, device="cuda"),
                  cu_seqlens_k=cu_k, max_seqlen_q=12, max_seqlen_k=11, config=cfg)
    assert torch.isnan(bad).all()
    small = ops.fwd(q, q, q, layout="thd", cu_seqlens_q=cu_k, cu_seqlens_k=cu_k, max_seqlen_q=4, max_seqlen_k=11,
                    config=cfg)
    assert torch.isnan(small).all()
    from ck_fmha import check_errors
    from ck_fmha.device_errors import DeviceLengthError

    with pytest.raises(DeviceLengthError, match="group-mode offsets"):   # the kernel flagged them (and reset)
        check_errors()
