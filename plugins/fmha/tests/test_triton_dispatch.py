"""FMHA through the dispatcher on the triton backend (Triton's CPU interpreter here; the GPU
in `-m gpu` runs): every Triton family and plan against the float64 reference."""
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from ck_core import Dispatcher, KernelKey, MissingKernel, Registry  # noqa: E402
from ck_core.testing import check_against_reference  # noqa: E402
from ck_fmha.problem import FmhaProblem  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                reason="needs a GPU or TRITON_INTERPRET=1")


@pytest.fixture(scope="module")
def disp():
    from ck_core import PluginManager, plugins
    from ck_core.testing import arch_plugin, make_fake_arch

    mgr = PluginManager(plugins=[arch_plugin(make_fake_arch())])
    old = plugins._MANAGER
    plugins.reset_manager(mgr)
    arch = "fake64"
    if os.environ.get("TRITON_INTERPRET") != "1":  # on a GPU (CK_TEST_GPU=1): the arch that describes it
        tb = mgr.backend("triton")
        arch = next((a.name for a in mgr.archs().values() if tb.can_execute(a)[0]), None)
        if arch is None:
            plugins.reset_manager(old)
            pytest.skip("no installed arch plugin describes this GPU")
    reg = Registry.from_enumeration("fmha", arch, "triton", dtypes="fp16")
    yield Dispatcher(reg, backend="triton")
    plugins.reset_manager(old)


BASE = dict(batch=2, nhead_q=4, nhead_k=2, seqlen_q=37, seqlen_k=45, hdim_q=32, dtype="fp16")


@pytest.mark.parametrize("kw", [
    dict(family="fwd"),
    dict(family="fwd", mask="bottom_right", lse=True),
    dict(family="fwd", mask="generic", window_left=6, window_right=2, logits_soft_cap=20.0),
    dict(family="fwd", layout="bshd", mask="top_left"),
    dict(family="fwd_splitkv", seqlen_q=1, seqlen_k=200, num_splits=3),
    dict(family="bwd_dq_dk_dv", seqlen_k=37, mask="top_left"),
    dict(family="bwd_dq_dk_dv", seqlen_k=37, deterministic=True),
])
def test_triton_plans_match_reference(disp, kw, ck_rng):
    p = FmhaProblem(**{**BASE, **kw})
    rep = check_against_reference(disp, p, ck_rng)
    assert rep.passed, str(rep)


def test_group_mode_forward(disp, ck_rng):
    p = FmhaProblem(family="fwd", mode="group", batch=3, nhead_q=4, nhead_k=4, hdim_q=32,
                    seqstart_q=(0, 17, 17, 40), seqstart_k=(0, 29, 29, 60), mask="bottom_right")
    assert check_against_reference(disp, p, ck_rng).passed


def test_paged_decode(disp, ck_rng):
    p = FmhaProblem(family="fwd_pagedkv", batch=2, nhead_q=4, nhead_k=2, seqlen_q=1, seqlen_k=96,
                    seqlens_k=(96, 41), hdim_q=32, paged_kv=True, page_size=16, layout="bshd")
    assert check_against_reference(disp, p, ck_rng).passed


def test_unsupported_features_are_clear(disp):
    with pytest.raises(MissingKernel, match="bias"):
        disp.select(FmhaProblem(**{**BASE, "family": "fwd_splitkv", "seqlen_q": 1, "num_splits": 2,
                                   "bias": "alibi"}))
    with pytest.raises(MissingKernel, match="sink"):
        disp.select(FmhaProblem(**{**BASE, "family": "bwd_dq_dk_dv", "mask": "top_left", "window_left": 8,
                                   "window_right": 0, "sink_tokens": 2}))


# -- bias, ALiBi, dropout, group-mode backward ------------------------------------------------
SEED = dict(seed=0x9E3779B97F4A7C15, offset=0x0000000700000003)
G = dict(mode="group", batch=3, seqstart_q=(0, 17, 18, 41), seqstart_k=(0, 29, 34, 65))


@pytest.mark.parametrize("kw", [
    dict(family="fwd", bias="elementwise", mask="bottom_right"),
    dict(family="fwd", bias="alibi"),                                       # no mask: bottom-right |i+off-j|
    dict(family="fwd", bias="alibi", mask="top_left", layout="bshd"),      # causal: vertical form
    dict(family="fwd", bias="alibi", mask="generic", window_left=6, window_right=2),
    dict(family="fwd", p_drop=0.2, mask="top_left", **SEED),
    dict(family="fwd", p_drop=0.3, bias="elementwise", layout="bshd", **SEED),
    dict(family="fwd", p_drop=0.1, bias="alibi", mask="bottom_right", nhead_k=4, **G, **SEED),
    dict(family="fwd", bias="elementwise", **G),
    dict(family="bwd_dq_dk_dv", bias="elementwise", dbias=True, mask="bottom_right"),
    dict(family="bwd_dq_dk_dv", bias="alibi", mask="top_left", deterministic=True),
    dict(family="bwd_dq_dk_dv", bias="alibi", seqlen_q=45, seqlen_k=29, layout="bshd"),
    dict(family="bwd_dq_dk_dv", p_drop=0.25, mask="generic", window_left=5, window_right=3, **SEED),
    dict(family="bwd_dq_dk_dv", p_drop=0.2, bias="elementwise", dbias=True, deterministic=True, **SEED),
    dict(family="bwd_dq_dk_dv", mask="bottom_right", **G),
    dict(family="bwd_dq_dk_dv", deterministic=True, bias="alibi", mask="top_left", **G),
    dict(family="bwd_dq_dk_dv", p_drop=0.15, bias="elementwise", dbias=True, nhead_k=1, **G, **SEED),
], ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items() if k not in ("seed", "offset", "seqstart_q",
                                                                          "seqstart_k", "batch")))
def test_triton_bias_dropout_group_bwd(disp, kw, ck_rng):
    p = FmhaProblem(**{**BASE, **kw})
    rep = check_against_reference(disp, p, ck_rng)
    assert rep.passed, str(rep)


def _run_custom(disp, p, rng, **replace):
    """check_against_reference with some inputs replaced (broadcast bias, [B, H] slopes)."""
    from ck_core.validate import compare_all

    op = disp.mgr.op("fmha")
    inputs = op.make_inputs(p, rng)
    inputs.update(replace)
    if p.family.startswith("bwd"):   # redo the forward with the replaced extras
        import attrs
        import numpy as np

        from ck_fmha import reference as R
        fp = attrs.evolve(p, family="fwd", dbias=False, deterministic=False)
        ex = {k: inputs[k] for k in ("bias", "alibi_slopes") if k in inputs}
        r = R.fwd(fp, inputs["q"], inputs["k"], inputs["v"], **ex)
        inputs["o"] = r.o.astype(inputs["q"].dtype)
        inputs["lse"] = np.asarray(r.lse, np.float32)
    ref = op.reference(p, inputs)
    be = disp.backend_spec
    outs = disp.run_dict(p, {k: be.to_backend(v) for k, v in inputs.items()})
    got = {k: be.to_numpy(outs[k]) for k in ref}
    return compare_all(got, ref, {k: p.dtype for k in ref}, op.tolerance(p)), outs


@pytest.mark.parametrize("bshape", [(1, 4), (2, 1), (1, 1)])
def test_broadcast_bias_dbias(disp, bshape, ck_rng):
    p = FmhaProblem(**{**BASE, "family": "bwd_dq_dk_dv", "bias": "elementwise", "dbias": True,
                       "mask": "top_left", "p_drop": 0.1, **SEED})
    bias = ck_rng.standard_normal(bshape + (p.seqlen_q, p.seqlen_k)).astype("float16")
    rep, outs = _run_custom(disp, p, ck_rng, bias=bias)
    assert tuple(outs["dbias"].shape) == bias.shape
    assert rep.passed, str(rep)


def test_alibi_slopes_per_batch(disp, ck_rng):
    import numpy as np

    p = FmhaProblem(**{**BASE, "family": "fwd", "bias": "alibi", "mask": "bottom_right"})
    slopes = ck_rng.uniform(0.05, 0.9, (p.batch, p.nhead_q)).astype(np.float32)
    rep, _ = _run_custom(disp, p, ck_rng, alibi_slopes=slopes)
    assert rep.passed, str(rep)


@pytest.mark.parametrize("group", [False, True])
def test_store_randval_is_bit_exact(disp, group, ck_rng):
    import numpy as np

    from ck_fmha import reference as R

    kw = dict(G, nhead_k=4) if group else {}
    p = FmhaProblem(**{**BASE, "family": "fwd", "p_drop": 0.3, "store_randval": True, **SEED, **kw})
    inputs = disp.mgr.op("fmha").make_inputs(p, ck_rng)
    be = disp.backend_spec
    outs = disp.run_dict(p, {k: be.to_backend(v) for k, v in inputs.items()})
    want = R.fwd(p, inputs["q"], inputs["k"], inputs["v"]).randval
    assert np.array_equal(be.to_numpy(outs["randval"]), want)


def test_triton_names_round_trip(disp):
    for key in disp.registry:
        assert KernelKey.from_name(key.name) == key
        assert KernelKey.from_dict(key.to_dict()) == key


# -- fwd_appendkv (+ RoPE), contiguous and paged caches -----------------------------------------
AKV = dict(family="fwd_appendkv", batch=2, nhead_q=4, nhead_k=2, hdim_q=32, dtype="fp16", seqlen_knew=5,
           seqlens_k=(7, 20))


@pytest.mark.parametrize("kw", [
    dict(seqlen_k=40),
    dict(seqlen_k=40, rope="interleaved", rotary_dim=32, layout="bshd"),
    dict(seqlen_k=40, rope="half_rotated", rotary_dim=16, seqlen_q=3),
    dict(paged_kv=True, page_size=16, rope="half_rotated", rotary_dim=32, seqlen_q=9),
    # (make_inputs' block tables point every unowned slot at one spare page: only one batch may append
    # past its own pages, and page_size=1 leaves room for a single new token)
    dict(paged_kv=True, page_size=1, batch=1, seqlens_k=(9,), seqlen_knew=1, seqlen_q=3, rope="interleaved",
         rotary_dim=12, layout="bshd"),
    dict(paged_kv=True, page_size=4, seqlens_k=(8, 17), seqlen_knew=3, nhead_k=1, hdim_q=96,
         rope="half_rotated", rotary_dim=20),
], ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_appendkv(disp, kw, ck_rng):
    p = FmhaProblem(**{**AKV, **kw})
    rep = check_against_reference(disp, p, ck_rng)
    assert rep.passed, str(rep)


# -- batch_prefill: group-mode queries over a paged cache -----------------------------------------
BP = dict(family="batch_prefill", mode="group", batch=3, nhead_q=4, nhead_k=2, hdim_q=32, dtype="fp16",
          paged_kv=True, seqstart_q=(0, 17, 18, 41), seqlens_k=(29, 5, 40))


@pytest.mark.parametrize("kw", [
    dict(page_size=16),
    dict(page_size=1, kv_lookup="sglang", mask="bottom_right", lse=True),
    dict(page_size=16, kv_lookup="sglang", mask="top_left", logits_soft_cap=15.0),
    dict(page_size=64, mask="generic", window_left=6, window_right=2, nhead_k=1, seqlens_k=(150, 5, 70)),
    dict(page_size=128, kv_lookup="sglang", seqlens_k=(300, 0, 129)),
    dict(page_size=4, bias="alibi", mask="bottom_right"),
    dict(page_size=32, bias="elementwise", kv_lookup="sglang"),
    dict(page_size=16, p_drop=0.2, mask="top_left", **SEED),
    dict(page_size=16, kv_layout="vectorized", mask="bottom_right"),
    dict(page_size=8, kv_layout="vectorized", kv_lookup="sglang", hdim_q=64),
], ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items() if k not in ("seed", "offset")))
def test_batch_prefill(disp, kw, ck_rng):
    p = FmhaProblem(**{**BP, **kw})
    rep = check_against_reference(disp, p, ck_rng)
    assert rep.passed, str(rep)


# -- sink tokens and sink logits --------------------------------------------------------------------
@pytest.mark.parametrize("kw", [
    dict(family="fwd", mask="bottom_right", window_left=5, window_right=0, sink_tokens=3),
    dict(family="fwd", mask="top_left", window_left=4, window_right=2, sink_tokens=20, layout="bshd"),
    dict(family="fwd", sink_logits=True, lse=True),
    dict(family="fwd", mask="bottom_right", window_left=5, window_right=0, sink_tokens=70, seqlen_q=70,
         seqlen_k=260, nhead_q=2, nhead_k=1),                                  # sink blocks left of the window
    dict(family="fwd", mask="bottom_right", seqlen_q=45, seqlen_k=29, sink_logits=True),  # rows with no key
    dict(family="fwd", mask="generic", window_left=3, window_right=1, sink_tokens=2, sink_logits=True,
         bias="alibi", **G),
    dict(BP, page_size=16, mask="bottom_right", window_left=4, window_right=0, sink_tokens=4, sink_logits=True),
    dict(family="fwd_splitkv", seqlen_q=3, seqlen_k=200, num_splits=3, sink_logits=True),
    dict(family="fwd_splitkv", seqlen_q=2, seqlen_k=200, num_splits=4, mask="bottom_right", window_left=9,
         window_right=0, sink_tokens=5, sink_logits=True),                    # splits with no visible key
    dict(family="fwd_pagedkv", seqlen_q=1, seqlen_k=96, seqlens_k=(96, 41), paged_kv=True, page_size=16,
         mask="bottom_right", window_left=7, window_right=0, sink_tokens=3),
], ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items() if k not in ("seqstart_q", "seqstart_k",
                                                                          "seqlens_k", "batch")))
def test_sinks(disp, kw, ck_rng):
    p = FmhaProblem(**{**BASE, **kw})
    rep = check_against_reference(disp, p, ck_rng)
    assert rep.passed, str(rep)
