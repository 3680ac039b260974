"""The Gluon sm90 forward on an H100 (CK_TEST_GPU=1 pytest -m gpu): ``ops.fwd`` with every Gluon
variant against a float64 torch reference (o and lse), the dispatcher picking a Gluon key from an
sm90 registry, and the refusal of a Gluon config for a problem the Gluon kernel cannot run."""
import math
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from ck_fmha.problem import FmhaProblem  # noqa: E402
from ck_fmha.backends.triton import gluon_fwd, launch as ops  # noqa: E402
from ck_fmha.backends.triton import launch_bwd as ops_bwd  # noqa: E402
from ck_fmha import heuristics as tuning  # noqa: E402
from ck_fmha.backends.triton.configs import GLUON_VARIANTS, TritonFmhaConfig  # noqa: E402


@pytest.fixture(autouse=True)
def _sm90():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("TRITON_INTERPRET=1 runs the Triton kernel; run the GPU tests with CK_TEST_GPU=1")
    if torch.version.hip or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon forward needs an sm90 (Hopper) GPU")
    if not gluon_fwd.HAVE_GLUON:
        pytest.skip("triton.experimental.gluon is not importable")


@pytest.fixture
def gluon_calls(monkeypatch):
    """Counts the launches of the Gluon kernel (ops.fwd goes through gluon_fwd.fwd)."""
    calls = []
    real = gluon_fwd.fwd

    def counted(*a, **kw):
        calls.append(kw.get("tile"))
        return real(*a, **kw)

    monkeypatch.setattr(gluon_fwd, "fwd", counted)
    return calls


DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
TILES = {64: (128, 128, 12, 3), 128: (128, 128, 12, 2)}


def _triton_fwd(q, k, v, *, causal=False, layout="bhsd", **kw):
    """ops.fwd with the sm90 tables' Triton tile in its pointer form (the launcher runs the config it
    is given; issue #30 took its default choice away)."""
    d, s = q.shape[-1], q.shape[2] if layout == "bhsd" else q.shape[1]
    cfg = tuning.default_fwd_config(d, v.shape[-1], "sm90", causal, s, gluon=False).with_(variant="ptr")
    return ops.fwd(q, k, v, causal=causal, layout=layout, config=cfg, **kw)


def _gluon_bwd_choice(d, causal, dq="gluon"):
    """The (dK/dV, dQ) choice of the sm90 tables' Gluon backward: dK/dV tile and dQ pass (``dq``:
    "gluon" or "triton")."""
    kv = ("gluon", tuning.gluon_dkdv_tile(d, causal, "sm90") or tuning.gluon_tiles("dkdv", "sm90")[d])
    if dq == "gluon":
        return kv, ("gluon", tuning.gluon_dq_tile(d, "sm90"))
    return kv, ("triton", tuning.default_bwd_configs(d, d, "sm90", causal=causal)[1])


def _inputs(rng, b, hq, hk, sq, sk, d, layout, dtype):
    g = torch.Generator(device="cuda").manual_seed(int(rng.integers(1 << 62)))

    def t(h, s):
        shape = (b, h, s, d) if layout == "bhsd" else (b, s, h, d)
        return torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(DTYPES[dtype])

    return t(hq, sq), t(hk, sk), t(hk, sk)


def _reference(q, k, v, causal, layout, scale=None):
    """float64 o (bhsd) and lse [B, H, Sq] (natural log)."""
    if layout == "bshd":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    q, k, v = (x.double() for x in (q, k, v))
    grp = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(grp, 1), v.repeat_interleave(grp, 1)
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    if causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.exp(s - lse[..., None]) @ v, lse


def _rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


# every variant with both head dims, both masks, both layouts, both dtypes; lengths and GQA vary
V = list(GLUON_VARIANTS)
CASES = [  # (variant, hdim, causal, layout, dtype, seqlen, (hq, hk))
    (V[0 % len(V)], 64, False, "bhsd", "fp16", 256, (5, 5)),
    (V[1 % len(V)], 64, False, "bshd", "bf16", 384, (6, 2)),
    (V[2 % len(V)], 64, True, "bhsd", "bf16", 1024, (5, 5)),
    (V[3 % len(V)], 64, True, "bshd", "fp16", 256, (6, 2)),
    (V[2 % len(V)], 128, False, "bhsd", "bf16", 384, (6, 2)),
    (V[3 % len(V)], 128, False, "bshd", "fp16", 1024, (5, 5)),
    (V[0 % len(V)], 128, True, "bshd", "bf16", 384, (5, 5)),
    (V[1 % len(V)], 128, True, "bhsd", "fp16", 1024, (6, 2)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[:5] + (c[5], "%dx%d" % c[6]))))
def test_gluon_fwd_matches_float64(case, ck_rng, gluon_calls):
    variant, d, causal, layout, dtype, s, (hq, hk) = case
    q, k, v = _inputs(ck_rng, 3, hq, hk, s, s, d, layout, dtype)
    out = torch.full_like(q, float("nan"))
    cfg = TritonFmhaConfig(*TILES[d], variant)
    o, lse = ops.fwd(q, k, v, causal=causal, return_lse=True, layout=layout, config=cfg, out=out)
    assert gluon_calls == [TILES[d]], "the Gluon kernel did not run"
    assert o.data_ptr() == out.data_ptr() and lse.shape == (3, hq, s) and lse.dtype == torch.float32
    ro, rl = _reference(q, k, v, causal, layout)
    ob = o.transpose(1, 2) if layout == "bshd" else o
    assert torch.isfinite(ob).all() and torch.isfinite(lse).all()
    assert _rel(ob, ro) < 1e-2
    assert _rel(lse, rl) < 1e-5


def test_default_config_runs_gluon_and_scale(ck_rng, gluon_calls):
    """The tables' forward (FWD_GLUON_SM90) is the Gluon kernel; it runs with a custom scale."""
    q, k, v = _inputs(ck_rng, 3, 6, 2, 1024, 1024, 128, "bhsd", "bf16")
    o, lse = ops.fwd(q, k, v, causal=True, scale=0.05, return_lse=True,
                     config=tuning.default_fwd_config(128, 128, "sm90", True, 1024))
    assert len(gluon_calls) == 1
    ro, rl = _reference(q, k, v, True, "bhsd", scale=0.05)
    assert _rel(o, ro) < 1e-2 and _rel(lse, rl) < 1e-5


@pytest.mark.parametrize("sq, sk, causal", [(256, 384, True), (200, 333, True)], ids=["causal-sq<sk", "ragged-causal-sq<sk"])
def test_gluon_config_is_refused_where_it_cannot_run(sq, sk, causal, ck_rng, gluon_calls):
    """A Gluon config is what runs or an error, never swapped; the Triton kernel runs the problem."""
    from ck_core.errors import UnsupportedProblem

    q, k, v = _inputs(ck_rng, 3, 5, 5, sq, sk, 128, "bhsd", "bf16")
    out = torch.full_like(q, float("nan"))
    with pytest.raises(UnsupportedProblem, match="Gluon"):
        ops.fwd(q, k, v, causal=causal, return_lse=True, out=out, config=TritonFmhaConfig(128, 128, 12, 2, "gluon_wspp"))
    o, lse = _triton_fwd(q, k, v, causal=causal, return_lse=True, out=out)
    assert not gluon_calls and o.data_ptr() == out.data_ptr()
    ro, rl = _reference(q, k, v, causal, "bhsd")   # (top-left causal, as ops.fwd's causal=True)
    assert torch.isfinite(o).all()
    assert _rel(o, ro) < 1e-2 and _rel(lse, rl) < 1e-5


def test_dispatcher_selects_and_runs_a_gluon_key(ck_rng, gluon_calls):
    from ck_core import Dispatcher, Registry, get_manager
    from ck_core.testing import check_against_reference

    reg = Registry.from_enumeration("fmha", "sm90", "triton", families="fwd", dtypes=("bf16", "fp16"))
    disp = Dispatcher(reg, backend="triton")
    p = FmhaProblem(family="fwd", batch=3, nhead_q=6, nhead_k=2, seqlen_q=1024, seqlen_k=1024, hdim_q=128,
                    dtype="bf16", mask="bottom_right", lse=True, layout="bshd")
    key = disp.select(p)
    assert key.algorithm.variant == tuning.tuned("fwd_gluon", "sm90")[(128, True, 1024)]["variant"], key.name
    rep = check_against_reference(disp, p, ck_rng)
    assert rep.passed, str(rep)
    assert len(gluon_calls) == 1
    # and with the o / lse compared here too (rel l2)
    op = get_manager().op("fmha")
    inputs = op.make_inputs(p, ck_rng)
    t = {n: torch.from_numpy(np.ascontiguousarray(x)).cuda() for n, x in inputs.items()}
    got = disp.run_dict(p, t)
    ro, rl = _reference(*(t[n].to(torch.bfloat16) for n in ("q", "k", "v")), True, "bshd")
    assert _rel(got["o"].transpose(1, 2), ro) < 1e-2 and _rel(got["lse"], rl) < 1e-5
    # a problem the Gluon key rejects gets a Triton key
    p2 = FmhaProblem(family="fwd", batch=3, nhead_q=6, nhead_k=2, seqlen_q=1000, seqlen_k=1200, hdim_q=128,
                     dtype="bf16", mask="top_left")
    assert disp.select(p2).algorithm.variant not in GLUON_VARIANTS
    assert check_against_reference(disp, p2, ck_rng).passed


@pytest.mark.parametrize("variant", ["gluon_ws_pers", "gluon_wspp"])
def test_gluon_fwd_block_n_64(variant, ck_rng, gluon_calls):
    """The 128x64, 4-stage tile (tuned for short causal D=64) over more tiles than SMs."""
    q, k, v = _inputs(ck_rng, 5, 7, 7, 512, 512, 64, "bhsd", "fp16")
    out = torch.full_like(q, float("nan"))
    o, lse = ops.fwd(q, k, v, causal=True, return_lse=True, config=TritonFmhaConfig(128, 64, 12, 4, variant),
                     out=out)
    assert gluon_calls == [(128, 64, 12, 4)]
    ro, rl = _reference(q, k, v, True, "bhsd")
    assert torch.isfinite(o).all() and _rel(o, ro) < 1e-2 and _rel(lse, rl) < 1e-5


@pytest.mark.parametrize("variant", ["gluon_wspp_pers", "gluon_ws"])
def test_replayed_launches_take_new_tensors(variant, ck_rng):
    """Calls after the first replay the recorded launch: fresh tensors (new addresses), a reused
    output buffer and an LSE-less call of the same geometry must all be right."""
    from ck_fmha.backends.triton import gluon_fwd

    cfg = TritonFmhaConfig(128, 128, 12, 2, variant)
    out = None
    for i in range(4):
        q, k, v = _inputs(ck_rng, 2, 6, 3, 384, 384, 128, "bshd", "bf16")
        if i == 2:
            out = torch.full_like(q, float("nan"))
        o, lse = ops.fwd(q, k, v, causal=i % 2 == 1, return_lse=True, layout="bshd", config=cfg, out=out)
        ro, rl = _reference(q, k, v, i % 2 == 1, "bshd")
        assert _rel(o.transpose(1, 2), ro) < 1e-2 and _rel(lse, rl) < 1e-5, i
        o2 = ops.fwd(q, k, v, causal=i % 2 == 1, layout="bshd", config=cfg)
        assert _rel(o2.transpose(1, 2), ro) < 1e-2, i
    assert gluon_fwd._LAUNCHES and all(r.replay is not None for r in gluon_fwd._LAUNCHES.values())


@pytest.mark.parametrize("layout, causal, dtype, hk", [("bhsd", False, "bf16", 5), ("bshd", True, "fp16", 1),
                                                       ("bhsd", True, "bf16", 5)])
def test_backward_with_the_gluon_dq_pass(layout, causal, dtype, hk, ck_rng):
    """ops_bwd.bwd at D=128 takes the Gluon dK/dV kernel and dQ pass (the sm90 bwd_gluon_dkdv /
    bwd_gluon_dq tables); dq/dk/dv against float64 autograd, and dq against the Triton dQ kernel's."""
    from ck_fmha.backends.triton import gluon_bwd

    assert tuning.gluon_dq_tile(128, "sm90") is not None
    q, k, v = _inputs(ck_rng, 3, 5, hk, 384, 384, 128, layout, dtype)
    do = _inputs(ck_rng, 3, 5, 5, 384, 384, 128, layout, dtype)[0]
    o, lse = _triton_fwd(q, k, v, causal=causal, return_lse=True, layout=layout)
    delta = ops_bwd.bwd_dot_do_o(o, do, layout=layout)
    real, real_kv, calls = gluon_bwd.dq, gluon_bwd.dkdv, []
    gluon_bwd.dq = lambda *a, **kw: calls.append("dq") or real(*a, **kw)
    gluon_bwd.dkdv = lambda *a, **kw: calls.append("dkdv") or real_kv(*a, **kw)
    try:
        dq, _, dk, dv = ops_bwd.bwd_dq_dk_dv(q, k, v, do, lse, delta, causal=causal, layout=layout,
                                         choice=_gluon_bwd_choice(128, causal))
    finally:
        gluon_bwd.dq, gluon_bwd.dkdv = real, real_kv
    assert calls == ["dkdv", "dq"]   # the sm90 bwd_gluon_dkdv table has D=128 with and without a mask
    ts = [x.double().requires_grad_() for x in (q, k, v)]
    ro, _ = _reference(*ts, causal, layout)
    ro.backward(do.double().transpose(1, 2) if layout == "bshd" else do.double())
    for got, ref in zip((dq, dk, dv), ts):
        assert torch.isfinite(got).all() and _rel(got, ref.grad) < 1e-2
    dqt = ops_bwd.bwd_dq_dk_dv(q, k, v, do, lse, delta, causal=causal, layout=layout,
                           choice=_gluon_bwd_choice(128, causal, dq="triton"))[0]
    assert _rel(dq, dqt.double()) < 5e-3


@pytest.mark.parametrize("d, layout, causal, dtype, hk, s", [(64, "bhsd", False, "bf16", 5, 384),
                                                            (64, "bshd", True, "fp16", 1, 512),
                                                            (128, "bhsd", True, "bf16", 5, 384),
                                                            (128, "bshd", False, "fp16", 1, 256)])
def test_backward_with_dq_fused_into_dkdv(d, layout, causal, dtype, hk, s, ck_rng):
    """deterministic=False on the Gluon dK/dV kernel with dQ fused in (TMA reduce-adds into the fp32
    accumulator, then the convert stage): dq/dk/dv against float64 autograd; the accumulator is
    poisoned-free (zeroed by ops) and a NaN-filled one is never read."""
    from ck_fmha.backends.triton import gluon_bwd

    q, k, v = _inputs(ck_rng, 3, 5, hk, s, s, d, layout, dtype)
    do = _inputs(ck_rng, 3, 5, 5, s, s, d, layout, dtype)[0]
    o, lse = _triton_fwd(q, k, v, causal=causal, return_lse=True, layout=layout)
    delta = ops_bwd.bwd_dot_do_o(o, do, layout=layout)
    real, calls = gluon_bwd.dkdv, []
    fused = tuning.gluon_fused_tile(d, causal, "sm90") or tuning.gluon_tiles("fused", "sm90")[d]
    gluon_bwd.dkdv = lambda *a, **kw: calls.append(kw.get("dq_acc") is not None) or real(*a, **kw)
    try:
        dq0, dqa, dk, dv = ops_bwd.bwd_dq_dk_dv(q, k, v, do, lse, delta, causal=causal, layout=layout,
                                            deterministic=False, choice=(("gluon", fused), ("atomic",)))
    finally:
        gluon_bwd.dkdv = real
    assert calls == [True] and dq0 is None and dqa.dtype == torch.float32
    dq = ops_bwd.bwd_convert_dq(dqa, q, layout=layout)
    ts = [x.double().requires_grad_() for x in (q, k, v)]
    ro, _ = _reference(*ts, causal, layout)
    ro.backward(do.double().transpose(1, 2) if layout == "bshd" else do.double())
    for got, ref in zip((dq, dk, dv), ts):
        assert torch.isfinite(got).all() and _rel(got, ref.grad) < 1e-2
    # the same through ops_bwd.bwd: the deterministic answer within rounding
    dq2, dk2, dv2 = ops_bwd.bwd(q, k, v, o, lse, do, causal=causal, layout=layout, deterministic=True,
                            config=tuning.default_bwd_configs(d, d, "sm90", causal=causal))
    assert _rel(dq, dq2.double()) < 5e-3 and _rel(dk, dk2.double()) < 5e-3 and _rel(dv, dv2.double()) < 5e-3


def test_nondeterministic_backward_prefers_the_faster_path(ck_rng):
    """deterministic=False where no fused tile is configured (D=128): the tables' choice
    (heuristics.bwd_want) is the deterministic Gluon path (faster on the H100 than the Triton
    fp32-atomic kernel), and it runs; the Triton atomic kernel runs when given."""


    assert tuning.gluon_fused_tile(128, False, "sm90") is None
    q, k, v = _inputs(ck_rng, 2, 4, 4, 256, 256, 128, "bhsd", "bf16")
    do = _inputs(ck_rng, 2, 4, 4, 256, 256, 128, "bhsd", "bf16")[0]
    o, lse = _triton_fwd(q, k, v, return_lse=True)
    delta = ops_bwd.bwd_dot_do_o(o, do)
    from ck_core.plugins import get_manager

    p = FmhaProblem(family="bwd_dq_dk_dv", batch=2, nhead_q=4, nhead_k=4, dtype="bf16", hdim_q=128, hdim_v=128,
                    seqlen_q=256, seqlen_k=256, deterministic=False)
    kv, dq_field = tuning.bwd_want(p, get_manager().arch("sm90"))
    assert kv[4].startswith("gluon_dkdv") and dq_field.startswith("gluon")
    dq, dqa, _, _ = ops_bwd.bwd_dq_dk_dv(q, k, v, do, lse, delta, deterministic=False,
                                     choice=_gluon_bwd_choice(128, False))
    assert dq is not None and dqa is None
    dq, dqa, _, _ = ops_bwd.bwd_dq_dk_dv(q, k, v, do, lse, delta, deterministic=False,
                                     config=tuning.default_bwd_configs(128, 128, "sm90"))
    assert dq is None and dqa is not None


# -- ragged lengths: the last query / key blocks reach past the sequence ------------------------
# (variant, hdim, causal, layout, dtype, b, (hq, hk), sq, sk, tile or None)
RAGGED = [
    ("gluon_ws", 64, False, "bhsd", "fp16", 2, (4, 4), 1, 1, None),
    ("gluon_wspp", 64, True, "bshd", "bf16", 3, (6, 2), 127, 127, None),
    ("gluon_ws_pers", 128, False, "bhsd", "bf16", 2, (6, 2), 129, 1201, None),
    ("gluon_wspp_pers", 128, True, "bhsd", "fp16", 1, (4, 1), 3418, 3418, None),
    ("gluon_wspp_pers", 64, True, "bhsd", "bf16", 2, (5, 5), 1201, 1201, (128, 64, 12, 4)),
    ("gluon_ws", 128, False, "bshd", "fp16", 2, (3, 3), 200, 65, None),
    ("gluon_wspp", 128, True, "bshd", "bf16", 2, (4, 2), 129, 129, None),
    ("gluon_ws_pers", 64, False, "bshd", "fp16", 3, (4, 1), 1201, 3418, None),
]


@pytest.mark.parametrize("case", RAGGED, ids=lambda c: "-".join(map(str, c[:5])) + "-b%d-%dx%d-%dx%d" % (
    c[5], *c[6], c[7], c[8]) + ("-n%d" % c[9][1] if c[9] else ""))
def test_gluon_fwd_ragged_matches_float64(case, ck_rng, gluon_calls):
    """Odd seqlen_q / seqlen_k: o and lse match the float64 reference everywhere, and nothing is
    written past the output tensor (it is the front of a NaN-filled buffer)."""
    variant, d, causal, layout, dtype, b, (hq, hk), sq, sk, tile = case
    tile = tile or TILES[d]
    q, k, v = _inputs(ck_rng, b, hq, hk, sq, sk, d, layout, dtype)
    buf = torch.full((q.numel() + 4096 * d,), float("nan"), device="cuda", dtype=q.dtype)
    out = buf[:q.numel()].view(q.shape)
    o, lse = ops.fwd(q, k, v, causal=causal, return_lse=True, layout=layout, config=TritonFmhaConfig(*tile, variant),
                     out=out)
    assert gluon_calls == [tile], "the Gluon kernel did not run"
    assert lse.shape == (b, hq, sq)
    assert torch.isnan(buf[q.numel():]).all(), "the kernel wrote past the output tensor"
    ro, rl = _reference(q, k, v, causal, layout)
    ob = o.transpose(1, 2) if layout == "bshd" else o
    assert torch.isfinite(ob).all() and torch.isfinite(lse).all()
    assert _rel(ob, ro) < 1e-2
    assert _rel(lse, rl) < 1e-5
    # the last query block alone (where the masking happens) is right too
    tail = slice((sq - 1) // 128 * 128, sq)
    assert _rel(ob[:, :, tail], ro[:, :, tail]) < 1e-2 and _rel(lse[:, :, tail], rl[:, :, tail]) < 1e-5


def test_gluon_fwd_ragged_tail_reads_no_other_head(ck_rng, gluon_calls):
    """The ragged last key block of head 0 must not read head 1's keys/values (bhsd: they follow in
    memory): head 1 holds inf/NaN, head 0's output stays finite and right."""
    q, k, v = _inputs(ck_rng, 2, 2, 2, 129, 1201, 128, "bhsd", "bf16")
    k[:, 1] = float("inf")
    v[:, 1] = float("nan")
    q[:, 1] = float("nan")
    o, lse = ops.fwd(q, k, v, return_lse=True, config=TritonFmhaConfig(*TILES[128], "gluon_ws_pers"))
    assert len(gluon_calls) == 1
    ro, rl = _reference(q[:, :1], k[:, :1], v[:, :1], False, "bhsd")
    assert torch.isfinite(o[:, 0]).all() and torch.isfinite(lse[:, 0]).all()
    assert _rel(o[:, :1], ro) < 1e-2 and _rel(lse[:, :1], rl) < 1e-5


def test_dispatcher_selects_gluon_for_ragged_lengths(ck_rng, gluon_calls):
    from ck_core import Dispatcher, Registry
    from ck_core.testing import check_against_reference

    reg = Registry.from_enumeration("fmha", "sm90", "triton", families="fwd", dtypes=("bf16", "fp16"))
    disp = Dispatcher(reg, backend="triton")
    p = FmhaProblem(family="fwd", batch=2, nhead_q=4, nhead_k=2, seqlen_q=333, seqlen_k=333, hdim_q=64,
                    dtype="fp16", mask="bottom_right", lse=True, layout="bshd")
    assert disp.select(p).algorithm.variant in GLUON_VARIANTS
    rep = check_against_reference(disp, p, ck_rng)
    assert rep.passed, str(rep)
    assert len(gluon_calls) == 1


# (deterministic, hdim, causal, layout, dtype, b, (hq, hk), sq, sk): the backward kernels on ragged
# lengths.  NOT YET RUN ON A GPU (2026-11-27): the dispatcher and ops_bwd.bwd still refuse the Gluon
# backward for ragged lengths (heuristics.gluon_bwd_reason / gluon_dkdv_reason,
# gluon_bwd.dq_unsupported_reason, launch.default_bwd_choice and bwd_dq_dk_dv); this test calls the
# kernels directly, and lifting those rules waits for it to pass.
BWD_RAGGED = [
    (True, 128, True, "bhsd", "bf16", 2, (4, 2), 1201, 1201),
    (True, 128, False, "bshd", "fp16", 2, (3, 3), 200, 333),
    (True, 64, False, "bhsd", "fp16", 2, (4, 1), 129, 65),
    (True, 128, False, "bhsd", "bf16", 1, (2, 2), 1, 65),
    (False, 64, False, "bhsd", "bf16", 2, (4, 4), 127, 129),
    (False, 64, True, "bshd", "fp16", 2, (6, 2), 333, 333),
    (False, 128, True, "bhsd", "bf16", 2, (4, 2), 1201, 1201),
]


@pytest.mark.parametrize("case", BWD_RAGGED, ids=lambda c: ("det" if c[0] else "fused") + "-%d-%s-%s-%s-b%d-%dx%d-%dx%d" % (
    c[1], "causal" if c[2] else "full", c[3], c[4], c[5], *c[6], c[7], c[8]))
def test_backward_ragged_gluon_kernels_match_float64(case, ck_rng):
    """Odd lengths on the Gluon backward kernels themselves (3-D descriptors, masked tails): the
    dK/dV kernel with the dQ pass (deterministic) or with dQ fused in by TMA reduce-adds into a
    zeroed fp32 accumulator; dq/dk/dv against float64 autograd, and nothing written past dq."""
    from ck_fmha.backends.triton import gluon_bwd

    det, d, causal, layout, dtype, b, (hq, hk), sq, sk = case
    q, k, v = _inputs(ck_rng, b, hq, hk, sq, sk, d, layout, dtype)
    do = _inputs(ck_rng, b, hq, hq, sq, sq, d, layout, dtype)[0]
    o, lse = _triton_fwd(q, k, v, causal=causal, return_lse=True, layout=layout)
    delta = ops_bwd.bwd_dot_do_o(o, do, layout=layout)
    if det:
        dk, dv = gluon_bwd.dkdv(q, k, v, do, lse, delta, causal=causal, layout=layout,
                                tile=gluon_bwd.tiles("dkdv", "sm90")[d])
        buf = torch.full((q.numel() + 4096 * d,), float("nan"), device="cuda", dtype=q.dtype)
        dq = gluon_bwd.dq(q, k, v, do, lse, delta, causal=causal, layout=layout, tile=gluon_bwd.tiles("dq", "sm90")[d],
                          out=buf[:q.numel()].view(q.shape))
        assert torch.isnan(buf[q.numel():]).all(), "the dQ pass wrote past dq"
    else:
        dqa = torch.zeros((b, hq, sq, d), device="cuda", dtype=torch.float32)
        dk, dv = gluon_bwd.dkdv(q, k, v, do, lse, delta, causal=causal, layout=layout,
                                tile=gluon_bwd.tiles("fused", "sm90")[d], dq_acc=dqa)
        dq = ops_bwd.bwd_convert_dq(dqa, q, layout=layout)
    ts = [x.double().requires_grad_() for x in (q, k, v)]
    ro, _ = _reference(*ts, causal, layout)
    ro.backward(do.double().transpose(1, 2) if layout == "bshd" else do.double())
    for name, got, ref in zip("qkv", (dq, dk, dv), ts):
        assert torch.isfinite(got).all(), name
        assert _rel(got, ref.grad) < 1e-2, (name, _rel(got, ref.grad))
