"""fp8 (e4m3) forward attention with per-tensor descales: the Triton kernel in the interpreter
against float64 references (tiny odd shapes, batch and group mode), the dispatcher's fp8 key
space per arch, and ahead-of-time compilation for sm90 / gfx942 / gfx950 / gfx1201 checking that
the native fp8 matrix instructions are used.  GPU runs: tests/test_dispatch_gpu.py (-m gpu).

The interpreter runs OCP e4m3fn (torch.float8_e4m3fn) only: Triton 3.6's interpreter cannot
lower fp8e4b8 (e4m3fnuz, CDNA3's format), so that path is covered by AOT compilation.
"""
from __future__ import annotations

import math
import os
import sys

if os.environ.get("CK_TEST_GPU") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

sys.path.insert(0, os.path.dirname(__file__))

from triton_ref import ref_attention, rel_err  # noqa: E402

from ck_core.errors import InvalidProblem, UnsupportedProblem  # noqa: E402
from ck_fmha.problem import FmhaProblem  # noqa: E402
from ck_fmha import attention  # noqa: E402
from ck_fmha.backends.triton import (TritonFmhaConfig, fwd, is_key_major, signature_for,  # noqa: E402
                                     v_key_major)
from ck_fmha.decode import splitkv_decode  # noqa: E402
from ck_fmha.backends.triton import launch as OPS  # noqa: E402

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
needs_interp = pytest.mark.skipif(not INTERP, reason="runs the kernels in the Triton interpreter")
pytestmark = [pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")]

F8 = torch.float8_e4m3fn
SMALL = TritonFmhaConfig(16, 16, 4, 1)


@pytest.fixture(autouse=True)
def _interpreter_fp8_rounding(monkeypatch):
    """Triton 3.6's interpreter rounds fp32 -> fp8 wrongly when the round-up carries into an odd
    exponent (124.5 -> 64 instead of 128: ``significand + 1`` is OR-ed into the exponent field),
    which the P cast hits; GPUs round to nearest even (``cvt.rn.satfinite.e4m3x2.f32``).  Route
    those casts through torch's correctly rounded conversion so the interpreter computes what the
    hardware does."""
    if not INTERP:
        return
    from triton.runtime import interpreter as I

    orig = I._convert_float
    to8 = {"fp8e4nv": torch.float8_e4m3fn, "fp8e4b8": getattr(torch, "float8_e4m3fnuz", None)}
    src = {"fp32": np.float32, "fp16": np.float16}

    def convert(data, in_dtype, out_dtype, rounding_mode):
        dst = to8.get(getattr(out_dtype, "name", None))
        npt = src.get(getattr(in_dtype, "name", None))
        if dst is None or npt is None:
            return orig(data, in_dtype, out_dtype, rounding_mode)
        x = torch.from_numpy(np.ascontiguousarray(data).view(npt).astype(np.float32))
        return x.to(dst).view(torch.uint8).numpy().reshape(np.shape(data))

    monkeypatch.setattr(I, "_convert_float", convert)
# P is quantised to e4m3 (2**-4 relative per element) and o is bf16: measured rel l2 ~2.5e-2
FP8_TOL = 6e-2


def _q8(shape, g):
    x = torch.randn(shape, generator=g)
    x = torch.where(x.abs() < 1e-2, torch.full_like(x, 0.5), x)   # never zero
    return x.to(F8)


FWD8_CASES = [
    # hq, hk, sq, sk, d, dv, causal, window, softcap, layout, descales as tensors, o dtype
    (2, 1, 37, 45, 32, 32, False, (-1, -1), 0.0, "bhsd", False, torch.bfloat16),
    (4, 2, 29, 41, 64, 64, "bottom_right", (-1, -1), 0.0, "bshd", True, torch.float16),
    (2, 2, 33, 33, 48, 32, True, (5, 0), 3.0, "bhsd", False, torch.bfloat16),   # window, softcap, padded hdim
]


@needs_interp
@pytest.mark.parametrize("case", FWD8_CASES, ids=lambda c: f"{c[0]}x{c[1]}-{c[2]}x{c[3]}-d{c[4]}/{c[5]}-{c[6]}-"
                                                          f"{c[7]}-sc{c[8]}-{c[9]}-{'tensor' if c[10] else 'float'}")
def test_fp8_fwd_matches_float64(case):
    hq, hk, sq, sk, d, dv, causal, window, softcap, layout, as_tensor, odt = case
    g = torch.Generator().manual_seed(11)
    shp = (lambda h, s, e: (1, h, s, e)) if layout == "bhsd" else (lambda h, s, e: (1, s, h, e))
    q, k, v = _q8(shp(hq, sq, d), g), _q8(shp(hk, sk, d), g), _q8(shp(hk, sk, dv), g)
    ds = (0.37, 1.9, 0.61)
    dk = [torch.tensor([x]) for x in ds] if as_tensor else list(ds)
    o, lse = fwd(q, k, v, causal=causal, window=window, softcap=softcap, layout=layout, return_lse=True,
                 config=SMALL, q_descale=dk[0], k_descale=dk[1], v_descale=dk[2], out_dtype=odt)
    assert o.dtype == odt
    ro, rl = ref_attention(q.double() * ds[0], k.double() * ds[1], v.double() * ds[2], causal=causal,
                           window=window, softcap=softcap, layout=layout)
    ob = o.transpose(1, 2) if layout == "bshd" else o
    assert torch.isfinite(ob).all()
    assert rel_err(ob, ro) < FP8_TOL
    fin = torch.isfinite(rl)
    assert torch.equal(torch.isinf(lse), ~fin)
    assert rel_err(lse[fin], rl[fin]) < 1e-5          # S is exact: fp8 products, fp32 sums


@needs_interp
def test_fp8_p_scale_scheme_is_exact_for_one_key_block():
    """With all keys in one block the online max is the row max, so the kernel computes exactly
    o = (fp8(P * 448) @ (v_descale v)) / (448 * l), l = sum of the unquantised P: check it to
    fp16 rounding (this pins the p scale, the fp32 l and the final descale)."""
    g = torch.Generator().manual_seed(5)
    q, k, v = _q8((1, 2, 21, 32), g), _q8((1, 2, 27, 32), g), _q8((1, 2, 27, 32), g)
    qd, kd, vd = 0.5, 1.25, 3.0
    o = fwd(q, k, v, config=TritonFmhaConfig(16, 32, 4, 1), q_descale=qd, k_descale=kd, v_descale=vd,
            out_dtype=torch.float16)
    s = (q.double() * qd) @ (k.double() * kd).transpose(-1, -2) / math.sqrt(32)
    p = torch.exp(s - s.amax(-1, keepdim=True))
    pq = (p * 448.0).float().to(F8).double()
    want = pq @ (v.double() * vd) / (448.0 * p.sum(-1, keepdim=True))
    assert rel_err(o, want) < 2e-3
    # the plain softmax is further away: the fp8 rounding of P is really there
    exact = torch.softmax(s, -1) @ (v.double() * vd)
    assert rel_err(o, exact) > 3 * rel_err(o, want)


@needs_interp
def test_fp8_group_mode_and_device_descales():
    lq, lk, h, hk, d = [5, 37, 20], [9, 37, 33], 4, 2, 32
    cq = torch.tensor([0, 5, 42, 62], dtype=torch.int32)
    ck = torch.tensor([0, 9, 46, 79], dtype=torch.int32)
    g = torch.Generator().manual_seed(3)
    q, k, v = _q8((sum(lq), h, d), g), _q8((sum(lk), hk, d), g), _q8((sum(lk), hk, d), g)
    ds = (torch.tensor([0.8]), torch.tensor(1.3), torch.tensor([[0.7]]))   # any 1-element shape
    o, lse = fwd(q, k, v, causal="bottom_right", layout="thd", cu_seqlens_q=cq, cu_seqlens_k=ck,
                 max_seqlen_q=max(lq), max_seqlen_k=max(lk), return_lse=True, config=SMALL,
                 q_descale=ds[0], k_descale=ds[1], v_descale=ds[2])
    assert o.dtype == torch.bfloat16
    refs = []
    for i in range(3):
        sl_q, sl_k = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
        ro, rl = ref_attention(q[sl_q].transpose(0, 1)[None].double() * 0.8,
                               k[sl_k].transpose(0, 1)[None].double() * 1.3,
                               v[sl_k].transpose(0, 1)[None].double() * 0.7, causal="bottom_right")
        assert rel_err(o[sl_q].transpose(0, 1)[None], ro) < FP8_TOL
        assert rel_err(lse[:, sl_q][None], rl) < 1e-5
        refs.append(ro)
    # attention() routes fp8 to the forward (no autograd): batch layout, float descales
    o2 = attention(q[5:42][None].transpose(1, 2), k[9:46][None].transpose(1, 2), v[9:46][None].transpose(1, 2),
                   causal="bottom_right", q_descale=0.8, k_descale=1.3, v_descale=0.7)
    assert o2.dtype == torch.bfloat16 and rel_err(o2, refs[1]) < FP8_TOL


# -- V layouts: key-contiguous V (V_TRANS, the default off AMD) vs channel-contiguous ----------------
def _count_copies(monkeypatch):
    calls = []
    real = OPS.v_key_major

    def counting(v, layout="bhsd", **kw):
        calls.append(layout)
        return real(v, layout, **kw)

    monkeypatch.setattr(OPS, "v_key_major", counting)
    return calls


@needs_interp
@pytest.mark.parametrize("case", FWD8_CASES[:2], ids=["bhsd", "bshd"])
def test_fp8_v_layouts_agree(case, monkeypatch):
    """fp8_v_trans=False (V as given, channel-contiguous), True (one transposed copy made by fwd) and a
    key-contiguous V from the caller (no copy) compute the same attention; the two key-contiguous runs
    are the same kernel on the same data, so they agree bit for bit."""
    hq, hk, sq, sk, d, dv, causal, window, softcap, layout, _, odt = case
    g = torch.Generator().manual_seed(7)
    shp = (lambda h, s, e: (2, h, s, e)) if layout == "bhsd" else (lambda h, s, e: (2, s, h, e))
    q, k, v = _q8(shp(hq, sq, d), g), _q8(shp(hk, sk, d), g), _q8(shp(hk, sk, dv), g)
    kw = dict(causal=causal, window=window, softcap=softcap, layout=layout, config=SMALL, return_lse=True,
              q_descale=0.5, k_descale=1.5, v_descale=0.75, out_dtype=odt)
    calls = _count_copies(monkeypatch)
    o_row, l_row = fwd(q, k, v, fp8_v_trans=False, **kw)
    assert calls == []
    o_cp, l_cp = fwd(q, k, v, fp8_v_trans=True, **kw)
    assert calls == [layout]
    vk = v_key_major(v, layout)
    assert is_key_major(vk, layout) and not is_key_major(v, layout)
    calls.clear()
    o_vk, l_vk = fwd(q, k, vk, fp8_v_trans=True, **kw)
    o_auto = fwd(q, k, vk, **{**kw, "return_lse": False})      # the interpreter's default is V_TRANS
    assert calls == []                                          # a key-contiguous V is used as it is
    assert torch.equal(o_cp, o_vk) and torch.equal(l_cp, l_vk) and torch.equal(o_cp, o_auto)
    assert rel_err(o_cp, o_row) < 1e-2 and torch.equal(l_cp, l_row)
    ro, _ = ref_attention(q.double() * 0.5, k.double() * 1.5, v.double() * 0.75, causal=causal, window=window,
                          softcap=softcap, layout=layout)
    ob = o_cp.transpose(1, 2) if layout == "bshd" else o_cp
    assert rel_err(ob, ro) < FP8_TOL
    # fp8_v_trans=False with a key-contiguous V: the launcher makes it channel-contiguous again
    o_back = fwd(q, k, vk, fp8_v_trans=False, **{**kw, "return_lse": False})
    assert torch.equal(o_back, o_row)


@needs_interp
def test_fp8_group_mode_v_layouts():
    lq, lk, h, hk, d = [7, 30, 19], [12, 33, 26], 4, 2, 32
    cq = torch.tensor([0, 7, 37, 56], dtype=torch.int32)
    ck = torch.tensor([0, 12, 45, 71], dtype=torch.int32)
    g = torch.Generator().manual_seed(13)
    q, k, v = _q8((sum(lq), h, d), g), _q8((sum(lk), hk, d), g), _q8((sum(lk), hk, d), g)
    kw = dict(causal=True, layout="thd", cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=max(lq),
              max_seqlen_k=max(lk), config=SMALL, q_descale=0.9, k_descale=1.1, v_descale=0.8)
    vk = v_key_major(v, "thd")
    assert vk.shape == v.shape and vk.stride(0) == 1 and vk.stride(2) % 16 == 0   # [Hk, D, T16] storage
    o_row = fwd(q, k, v, fp8_v_trans=False, **kw)
    o_cp = fwd(q, k, v, fp8_v_trans=True, **kw)
    o_vk = fwd(q, k, vk, **kw)
    assert torch.equal(o_cp, o_vk) and rel_err(o_cp, o_row) < 1e-2
    for i in range(3):
        sl_q, sl_k = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
        ro, _ = ref_attention(q[sl_q].transpose(0, 1)[None].double() * 0.9,
                              k[sl_k].transpose(0, 1)[None].double() * 1.1,
                              v[sl_k].transpose(0, 1)[None].double() * 0.8, causal=True)
        assert rel_err(o_cp[sl_q].transpose(0, 1)[None], ro) < FP8_TOL


@pytest.mark.parametrize("layout", ["bhsd", "bshd", "thd"])
@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=needs_interp)])
@pytest.mark.parametrize("seq", [37, 48])
def test_v_key_major_copy(layout, impl, seq):
    """v_key_major: same logical tensor, key stride 1, channel rows 16-byte aligned (key count padded
    to 16 with zeros), from either implementation; also for 2-byte types."""
    g = torch.Generator().manual_seed(seq)
    shape = {"bhsd": (2, 3, seq, 40), "bshd": (2, seq, 3, 40), "thd": (seq, 3, 40)}[layout]
    for v in (_q8(shape, g), torch.randn(shape, generator=g).to(torch.bfloat16)):
        vk = v_key_major(v, layout, impl=impl)
        assert vk.shape == v.shape and vk.dtype == v.dtype and is_key_major(vk, layout)
        assert torch.equal(vk.float(), v.float())
        kd = {"bhsd": 2, "bshd": 1, "thd": 0}[layout]
        sp = -(-seq // 16) * 16
        assert vk.stride(kd) == 1 and vk.stride(-1) == sp and (vk.stride(-1) * v.element_size()) % 16 == 0
        # the storage rows (one per batch, head, channel) are zero past the keys
        store = torch.as_strided(vk, (vk.numel() // seq, sp), (sp, 1))
        assert torch.equal(store[:, seq:].float(), torch.zeros_like(store[:, seq:].float()))


def test_fp8_rejections_are_clear():
    q = torch.randn(1, 2, 8, 32).to(F8)
    with pytest.raises(UnsupportedProblem, match="no bias, ALiBi or dropout"):
        fwd(q, q, q, bias=torch.zeros(1, 1, 8, 8))
    with pytest.raises(UnsupportedProblem, match="no bias, ALiBi or dropout"):
        fwd(q, q, q, dropout_p=0.1)
    with pytest.raises(InvalidProblem, match="fp8 descales"):
        fwd(q.half(), q.half(), q.half(), q_descale=2.0)
    with pytest.raises(InvalidProblem, match="must share dtype"):
        fwd(q, q.half(), q)
    with pytest.raises(InvalidProblem, match="bf16 or fp16"):
        fwd(q, q, q, out_dtype=torch.float32)
    with pytest.raises(InvalidProblem, match="positive and finite"):
        fwd(q, q, q, v_descale=0.0)
    with pytest.raises(InvalidProblem, match="per-tensor"):
        fwd(q, q, q, k_descale=torch.ones(2))
    with pytest.raises(UnsupportedProblem, match="no fp8 path"):
        splitkv_decode(q, q, q)
    with pytest.raises(InvalidProblem, match="belong to the fp8 forward"):
        attention(q.half(), q.half(), q.half(), v_descale=2.0)
    with pytest.raises(InvalidProblem, match="fp8_v_trans selects the V layout of the fp8 forward"):
        fwd(q.half(), q.half(), q.half(), fp8_v_trans=True)


def test_fp8_signatures():
    cfg = {"hdim_q": 128, "BLOCK_M": 128, "BLOCK_N": 64}
    sig, cx = signature_for("fwd", "fp8", cfg)
    assert sig["Q"] == sig["K"] == sig["V"] == "*fp8e4nv" and sig["O"] == "*bf16"
    assert sig["QDS"] == "*fp32" and sig["v_descale"] == "fp32" and cx["DESCALE_PTR"] is False
    sig, cx = signature_for("fwd", "fp8e4b8", dict(cfg, out_dtype="fp16", descale_ptr=True))
    assert sig["Q"] == "*fp8e4b8" and sig["O"] == "*fp16" and cx["DESCALE_PTR"] is True
    sig, _ = signature_for("fwd", "float8_e4m3fn", dict(cfg, variant="tma_host"))
    assert sig["K"] == "tensordesc<fp8e4nv[64,128]>" and sig["V"] == "tensordesc<fp8e4nv[64,128]>"
    sig, cx = signature_for("fwd", "fp8", dict(cfg, variant="tma_host", v_trans=True))
    assert sig["V"] == "tensordesc<fp8e4nv[128,64]>" and cx["V_TRANS"] is True   # [BLOCK_DV, BLOCK_N] tiles
    sig, cx = signature_for("v_transpose", "fp8", dict(cfg, BLOCK_M=64))
    assert sig["V"] == sig["VT"] == "*fp8e4nv" and cx == {"ALIGN_DV": 0, "BLOCK_S": 64, "BLOCK_DV": 128}
    with pytest.raises(ValueError, match="paged"):
        signature_for("batch_prefill", "bf16", dict(cfg, v_trans=True))
    with pytest.raises(ValueError, match="fp8"):
        signature_for("bwd_dq_dk_dv", "fp8", cfg)


# -- the dispatcher ---------------------------------------------------------------------------
def test_fp8_key_space_follows_the_arch_specs(monkeypatch):
    import attrs

    from ck_core import PluginManager, Registry, plugins
    from ck_fmha.backends.triton import implement as TKI, keys as TK

    mgr = PluginManager()
    monkeypatch.setattr(plugins, "_MANAGER", mgr)
    archs = mgr.archs()
    want = {"sm90": "fp8e4nv", "gfx942": "fp8e4b8", "gfx950": "fp8e4nv", "gfx1201": "fp8e4nv"}
    for name, spec in archs.items():
        keys = [k for k in Registry.from_enumeration("fmha", name, "triton", manager=mgr)
                if k.signature.dtype == "fp8"]
        if "fp8" not in spec.dtypes:
            assert not keys, name
            continue
        assert keys and {k.signature.family for k in keys} == {"fwd"}, name
        assert {(k.signature.hdim_q, k.signature.hdim_v) for k in keys} == set(TK.HDIMS)
        k = keys[0]
        assert TK.parse_name(k.body) == (k.signature, k.algorithm)
        if name in want:
            r = TKI.render(k, "triton")
            assert r.dtype == want[name], name
            # NVIDIA: the rendered kernel is the one the launcher runs, over a key-contiguous V
            assert r.config.get("v_trans", False) is (name == "sm90") is TK.fp8_v_trans(spec), name
    assert TK.fp8_format(archs["gfx942"]) == "e4m3fnuz" and TK.fp8_format(archs["sm90"]) == "e4m3fn"
    assert TKI._torch_dtype("fp8", "gfx942") == torch.float8_e4m3fnuz
    assert TKI._torch_dtype("fp8", "gfx950") == torch.float8_e4m3fn
    assert TK.fp8_v_trans(None) is True
    assert TK.fp8_v_trans(attrs.evolve(archs["gfx942"], extras={"fp8_v_trans": True})) is True


@pytest.fixture(scope="module")
def disp8():
    from ck_core import Dispatcher, PluginManager, Registry, plugins
    from ck_core.testing import arch_plugin, make_fake_arch

    if not INTERP:
        pytest.skip("the fp8 dispatcher on a GPU: tests/test_dispatch_gpu.py")
    mgr = PluginManager(plugins=[arch_plugin(make_fake_arch())])
    old = plugins._MANAGER
    plugins.reset_manager(mgr)
    reg = Registry.from_enumeration("fmha", "fake64", "triton", dtypes=("fp8", "fp16"),
                                    families=("fwd", "fwd_splitkv"))
    yield Dispatcher(reg, backend="triton")
    plugins.reset_manager(old)


FP8 = dict(family="fwd", dtype="fp8", scale_q=0.37, scale_k=1.9, scale_v=0.61, nhead_q=4, nhead_k=2,
           hdim_q=32)


@pytest.mark.parametrize("kw", [
    dict(batch=2, seqlen_q=37, seqlen_k=45, mask="bottom_right", lse=True, sink_logits=True),
    dict(mode="group", batch=3, seqstart_q=(0, 17, 18, 41), seqstart_k=(0, 29, 34, 65), mask="top_left"),
    # column-major V (CK's vlayout "c": [B, Hk, Dv, Sk] / [Hk, Dv, Tk]) is the key-contiguous layout
    # the fp8 kernel reads: no copy of V
    dict(batch=2, seqlen_q=21, seqlen_k=50, layout="bshd", vlayout="c", mask="top_left"),
    dict(mode="group", batch=2, seqstart_q=(0, 9, 40), seqstart_k=(0, 20, 52), vlayout="c"),
], ids=["batch", "group", "batch-vcol", "group-vcol"])
def test_fp8_dispatch_matches_reference(disp8, kw, ck_rng, monkeypatch):
    from ck_core import get_manager

    p = FmhaProblem(**{**FP8, **kw})
    key = disp8.select(p)
    assert key.signature.dtype == "fp8" and key.signature.family == "fwd"
    op = get_manager().op("fmha")
    inputs = op.make_inputs(p, ck_rng)
    ref = op.reference(p, inputs)
    calls = _count_copies(monkeypatch)
    out = disp8.run_dict(p, {n: torch.from_numpy(np.ascontiguousarray(x)) for n, x in inputs.items()})
    assert calls == ([] if p.vlayout == "c" else ["thd" if p.is_group else p.layout])
    assert out["o"].dtype == torch.bfloat16
    got = out["o"].float().numpy()
    assert np.linalg.norm(got - ref["o"]) / np.linalg.norm(ref["o"]) < FP8_TOL
    tol = op.tolerance(p)["o"]
    assert np.allclose(got, ref["o"], rtol=tol[0], atol=tol[1])
    if p.lse:
        assert np.allclose(out["lse"].numpy(), ref["lse"], rtol=1e-4, atol=1e-4)


def test_fp8_dispatch_rejections(disp8):
    from ck_core import MissingKernel

    from ck_fmha.backends.triton import keys as TK

    col = dict(seqlen_q=8, seqlen_k=8, vlayout="c")
    p16 = FmhaProblem(**{**FP8, **col, "dtype": "fp16", "scale_q": 1.0, "scale_k": 1.0, "scale_v": 1.0})
    k16 = [k for k in disp8.registry if k.signature.dtype == "fp16" and k.signature.family == "fwd"
           and k.signature.hdim_q == 32][0]
    assert "row-major only" in TK.supports(k16, p16)     # column-major V: the fp8 forward only
    p8 = FmhaProblem(**{**FP8, **col})
    assert TK.supports(disp8.select(p8), p8) is None
    with pytest.raises(MissingKernel, match="fp8 kernels cover the fwd family"):
        disp8.select(FmhaProblem(**{**FP8, "family": "fwd_splitkv", "seqlen_q": 1, "seqlen_k": 100,
                                    "num_splits": 2}))
    with pytest.raises(UnsupportedProblem, match="R27-fp8"):
        FmhaProblem(**{**FP8, "seqlen_q": 8, "seqlen_k": 8, "bias": "elementwise"})


# -- ahead-of-time compilation: native fp8 instructions per target ------------------------------
# One process per target: Triton 3.6's AMD backend keeps state across targets within a process
# (seen here: gfx950 compiled after gfx942 silently lowers fp32 -> fp8 in software, ~1000 extra
# compares/selects instead of v_cvt_scalef32_pk_fp8_f32; gfx942 compiled after gfx950 fails in
# ConvertTritonAMDGPUToLLVM), so every target gets a fresh interpreter.
_AOT_FP8_SCRIPT = r"""
import json, re, sys
from triton.backends.compiler import GPUTarget
from ck_fmha.backends.triton import aot_compile
targets = {"sm90": GPUTarget("cuda", 90, 32), "gfx942": GPUTarget("hip", "gfx942", 64),
           "gfx950": GPUTarget("hip", "gfx950", 64), "gfx1201": GPUTarget("hip", "gfx1201", 32)}
cases = json.loads(sys.argv[1])
out = []
for name, family, dtype, cfg in cases:
    ck = aot_compile(family, dtype, cfg, targets[name])
    asm = ck.asm.get("ptx") or ck.asm.get("amdgcn")
    blob = ck.asm.get("cubin") if name == "sm90" else ck.asm.get("hsaco")
    ins = sorted(set(re.findall(r"(wgmma\.mma_async\S*|mma\.sync\S*|v_mfma\S*|v_wmma\S*)", asm)))
    cvt = sorted(set(re.findall(r"(cvt\.rn\.satfinite\.e4m3x2\.f32|v_cvt\w*_fp8_f32)", asm)))
    out.append([len(blob or b""), ins, cvt])
print("AOT-RESULT " + json.dumps(out))
"""

_F8_CFG = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2, hdim_q=128)
AOT_FP8 = [
    # group mode, causal, LSE, device descales, soft cap: every run-time fp8 feature at once
    ("sm90", "fwd", "fp8", dict(_F8_CFG, varlen=True, mask_mode=1, lse=True, descale_ptr=True, softcap=True)),
    ("sm90", "fwd", "fp8", dict(_F8_CFG, BLOCK_M=128, variant="tma_host")),
    # key-contiguous V (V_TRANS, the NVIDIA default): pointer loads in group mode, host and device TMA
    ("sm90", "fwd", "fp8", dict(_F8_CFG, varlen=True, mask_mode=1, lse=True, descale_ptr=True, softcap=True,
                                v_trans=True)),
    ("sm90", "fwd", "fp8", dict(_F8_CFG, BLOCK_M=128, variant="tma_host", v_trans=True)),
    ("sm90", "fwd", "fp8", dict(_F8_CFG, BLOCK_M=128, BLOCK_N=128, num_warps=8, variant="tma", varlen=True,
                                mask_mode=1, v_trans=True)),
    ("sm90", "v_transpose", "fp8", dict(_F8_CFG)),
    ("gfx942", "fwd", "fp8", dict(_F8_CFG, mask_mode=1)),            # "fp8" resolves to fp8e4b8 (e4m3fnuz) here
    ("gfx942", "fwd", "fp8", dict(_F8_CFG, mask_mode=1, v_trans=True)),
    ("gfx942", "v_transpose", "fp8", dict(_F8_CFG)),
    ("gfx950", "fwd", "fp8", dict(_F8_CFG, hdim_q=64, varlen=True)),
    ("gfx950", "fwd", "fp8", dict(_F8_CFG, hdim_q=64, varlen=True, v_trans=True)),
    ("gfx1201", "fwd", "fp8", dict(_F8_CFG, hdim_q=64)),
    ("gfx1201", "fwd", "fp8", dict(_F8_CFG, hdim_q=64, v_trans=True)),
]
NATIVE = {"sm90": "e4m3.e4m3", "gfx942": "_fp8_fp8", "gfx950": "f8f6f4", "gfx1201": "_fp8_fp8"}
# the hardware fp32 -> fp8 conversion of P (gfx1201: Triton 3.6 converts in software there)
NATIVE_CVT = {"sm90": ["cvt.rn.satfinite.e4m3x2.f32"], "gfx942": ["v_cvt_pk_fp8_f32"],
              "gfx950": ["v_cvt_scalef32_pk_fp8_f32"], "gfx1201": []}


def _subprocess_env():
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(here), root, env.get("PYTHONPATH", "")])
    return env


def _run_script(script, arg):
    import json
    import subprocess

    r = subprocess.run([sys.executable, "-c", script, json.dumps(arg)],
                       capture_output=True, text=True, env=_subprocess_env(), timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("AOT-RESULT ")][-1]
    return json.loads(line[len("AOT-RESULT "):])


@pytest.mark.parametrize("target", list(NATIVE))
def test_aot_compile_fp8_native_instructions(target):
    cases = [c for c in AOT_FP8 if c[0] == target]
    res = _run_script(_AOT_FP8_SCRIPT, cases)
    assert len(res) == len(cases)
    for case, (nbytes, ins, cvt) in zip(cases, res):
        assert nbytes > 0, case
        if case[1] != "fwd":
            assert not ins, case     # the V copy: no matrix instructions
            continue
        # both products (Q K^T and P V) on the fp8 matrix units: no fp16 upcast, no other MMA
        assert ins and all(NATIVE[target] in i for i in ins), (case, ins)
        assert cvt == NATIVE_CVT[target], (case, cvt)


# -- the V operand of P @ V on sm90, compiled as the JIT specialises a real launch ----------------
# (the plain AOT signature has no divisibility hints, so its pointer loads are neither vectorised
# nor pipelined; here the launch arguments of ops.fwd on CPU tensors are captured and compiled with
# the JIT's specialisation: 16-byte alignment / divisibility by 16 / ints equal to 1)
_JIT_FP8_SCRIPT = r"""
import json, re, sys
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton._C.libtriton import native_specialize_impl
from triton.tools.tensor_descriptor import TensorDescriptor
from ck_fmha.backends.triton import launch as ops, kernels as K
from ck_fmha.backends.triton.configs import TritonFmhaConfig

target = GPUTarget("cuda", 90, 32)
backend = type(make_backend(target))
from ck_core.plugins import get_manager
SM90 = get_manager().arch("sm90")
ops._arch_of = lambda t: SM90   # launch as on the H100
TT = {torch.float8_e4m3fn: "fp8e4nv", torch.bfloat16: "bf16"}
real = K.fmha_fwd_kernel

def compile_launch(call):
    rec = {}
    class Capture:
        def __getitem__(self, grid):
            return lambda *a, **kw: rec.update(args=a, kw=kw)
    K.fmha_fwd_kernel = Capture()
    try:
        call()
    finally:
        K.fmha_fwd_kernel = real
    kw = dict(rec["kw"])
    compile_launch.last_kw = dict(kw)
    opts = {"num_warps": kw.pop("num_warps"), "num_stages": kw.pop("num_stages")}
    sig, cx, attrs = {}, dict(kw), {}
    for i, (name, a) in enumerate(zip(real.arg_names, rec["args"])):
        if isinstance(a, TensorDescriptor):
            sig[name] = f"tensordesc<{TT[a.base.dtype]}[{','.join(map(str, a.block_shape))}]>"
            continue
        ty, spec = native_specialize_impl(backend, a, False, True, True)
        if ty == "constexpr":
            cx[name] = spec
            continue
        sig[name] = ty
        if spec and backend.parse_attr(spec):
            attrs[(i,)] = backend.parse_attr(spec)
    for name in cx:
        sig[name] = "constexpr"
    return triton.compile(ASTSource(real, sig, constexprs=cx, attrs=attrs), target=target, options=opts)

out = {}
for name, c in json.loads(sys.argv[1]).items():
    b, h, s, d = 2, 2, 256, 128
    dt = torch.float8_e4m3fn if c["dtype"] == "fp8" else torch.bfloat16
    cfg = TritonFmhaConfig(*c["cfg"])
    kw = dict(config=cfg, causal=c.get("causal", False))
    if c["dtype"] == "fp8":
        kw["fp8_v_trans"] = c["v_trans"]
    if c.get("varlen"):
        q, k, v = (torch.empty(b * s, h, d, dtype=dt) for _ in range(3))
        cu = torch.arange(b + 1, dtype=torch.int32) * s
        kw.update(layout="thd", cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=s, max_seqlen_k=s)
    else:
        q, k, v = (torch.empty(b, h, s, d, dtype=dt) for _ in range(3))
    if c.get("v_trans"):   # the copy fwd would make (no GPU to run the Triton copy kernel on)
        v = ops.v_key_major(v, kw.get("layout", "bhsd"), impl="torch")
    ck = compile_launch(lambda: ops.fwd(q, k, v, **kw))
    ttgir, ptx = ck.asm["ttgir"], ck.asm["ptx"]
    ptx = ptx[:ptx.find(".section")] if ".section" in ptx else ptx
    n = lambda pat, txt: len(re.findall(pat, txt))
    out[name] = dict(
        local_load=n(r"ttg\.local_load ", ttgir), reg_to_smem=n(r"ttg\.local_alloc %", ttgir),
        async_copies=n(r"ttg\.async_copy_global_to_local|ttng\.async_tma_copy_global_to_local", ttgir),
        wgmma=sorted(set(re.findall(r"wgmma\.mma_async\.\S+", ptx))),
        ld_shared=n(r"\bld\.shared", ptx), st_shared=n(r"\bst\.shared", ptx), ldmatrix=n(r"\bldmatrix", ptx),
        stmatrix=n(r"\bstmatrix", ptx), prmt=n(r"\bprmt", ptx), shfl=n(r"\bshfl\.sync", ptx),
        cvt_e4m3=n(r"cvt\.rn\.satfinite\.e4m3x2", ptx))
    out[name]["v_trans"] = bool(compile_launch.last_kw.get("V_TRANS")) if hasattr(compile_launch, "last_kw") else None
print("AOT-RESULT " + json.dumps(out))
"""

JIT_CASES = {
    "ptr-row": dict(dtype="fp8", v_trans=False, cfg=[128, 64, 4, 2, "ptr"]),
    "ptr-key": dict(dtype="fp8", v_trans=True, cfg=[128, 64, 4, 2, "ptr"]),
    "tma_host-row": dict(dtype="fp8", v_trans=False, cfg=[128, 64, 4, 2, "tma_host"]),
    "tma_host-key": dict(dtype="fp8", v_trans=True, cfg=[128, 64, 4, 2, "tma_host"]),
    # group mode with key-contiguous V reads by pointer (device descriptors over that layout faulted on
    # the H100; a "tma" key is a supports() refusal there): V still lands K-major, but varlen row starts
    # are not known 16-aligned, so Q and V are staged through registers instead of cp.async
    "ptr-group-key": dict(dtype="fp8", v_trans=True, varlen=True, causal=True, cfg=[128, 64, 4, 2, "ptr"]),
    "tma_host-bf16": dict(dtype="bf16", cfg=[128, 64, 4, 2, "tma_host"]),
}


def test_sm90_fp8_v_is_read_k_major_without_a_shared_memory_transpose():
    """Key-contiguous V: the P @ V wgmma is e4m3 x e4m3 with V straight from the buffer its (cp.async
    or TMA) copy filled, i.e. no local_load -> local_alloc round trip of V through registers into a
    transposed shared layout (which the channel-contiguous V needs on every key block)."""
    res = _run_script(_JIT_FP8_SCRIPT, JIT_CASES)
    for name, r in res.items():
        assert r["v_trans"] is name.endswith("-key"), (name, r)
        if "bf16" in name:
            continue
        assert r["wgmma"] == ["wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3",   # P @ V (Dv = 128)
                              "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3"], (name, r)   # Q K^T
        assert r["cvt_e4m3"] > 0, (name, r)
    for var in ("ptr", "tma_host"):
        row, key = res[f"{var}-row"], res[f"{var}-key"]
        # the channel-contiguous V goes through registers into a transposed shared layout
        assert row["local_load"] + row["reg_to_smem"] > key["local_load"] + key["reg_to_smem"], (var, row, key)
        assert key["local_load"] == 0 and key["reg_to_smem"] == (1 if var == "ptr" else 0), (var, key)  # ptr: Q
        assert key["st_shared"] < row["st_shared"] and key["ld_shared"] <= row["ld_shared"], (var, row, key)
        assert key["async_copies"] >= row["async_copies"], (var, row, key)   # V is pipelined too
    # host TMA: what is left in shared memory is the same as bf16's (the epilogue's output tile)
    assert res["tma_host-key"]["st_shared"] == res["tma_host-bf16"]["st_shared"]
    assert res["tma_host-key"]["ld_shared"] == 0
    g = res["ptr-group-key"]
    assert g["local_load"] == 0 and g["reg_to_smem"] <= 3, g   # no shared-memory reload of V
