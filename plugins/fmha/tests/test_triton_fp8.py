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
from ck_fmha.triton import TritonFmhaConfig, attention, fwd, signature_for, splitkv_decode  # noqa: E402

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


def test_fp8_signatures():
    cfg = {"hdim_q": 128, "BLOCK_M": 128, "BLOCK_N": 64}
    sig, cx = signature_for("fwd", "fp8", cfg)
    assert sig["Q"] == sig["K"] == sig["V"] == "*fp8e4nv" and sig["O"] == "*bf16"
    assert sig["QDS"] == "*fp32" and sig["v_descale"] == "fp32" and cx["DESCALE_PTR"] is False
    sig, cx = signature_for("fwd", "fp8e4b8", dict(cfg, out_dtype="fp16", descale_ptr=True))
    assert sig["Q"] == "*fp8e4b8" and sig["O"] == "*fp16" and cx["DESCALE_PTR"] is True
    sig, _ = signature_for("fwd", "float8_e4m3fn", dict(cfg, variant="tma_host"))
    assert sig["K"] == "tensordesc<fp8e4nv[64,128]>"
    with pytest.raises(ValueError, match="fp8"):
        signature_for("bwd_dq_dk_dv", "fp8", cfg)


# -- the dispatcher ---------------------------------------------------------------------------
def test_fp8_key_space_follows_the_arch_specs(monkeypatch):
    from ck_core import PluginManager, Registry, plugins
    from ck_fmha import triton_keys as TK

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
            assert TK.render(k, "triton").dtype == want[name], name
    assert TK.fp8_format(archs["gfx942"]) == "e4m3fnuz" and TK.fp8_format(archs["sm90"]) == "e4m3fn"
    assert TK._torch_dtype("fp8", "gfx942") == torch.float8_e4m3fnuz
    assert TK._torch_dtype("fp8", "gfx950") == torch.float8_e4m3fn


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
], ids=["batch", "group"])
def test_fp8_dispatch_matches_reference(disp8, kw, ck_rng):
    from ck_core import get_manager

    p = FmhaProblem(**{**FP8, **kw})
    key = disp8.select(p)
    assert key.signature.dtype == "fp8" and key.signature.family == "fwd"
    op = get_manager().op("fmha")
    inputs = op.make_inputs(p, ck_rng)
    ref = op.reference(p, inputs)
    out = disp8.run_dict(p, {n: torch.from_numpy(np.ascontiguousarray(x)) for n, x in inputs.items()})
    assert out["o"].dtype == torch.bfloat16
    got = out["o"].float().numpy()
    assert np.linalg.norm(got - ref["o"]) / np.linalg.norm(ref["o"]) < FP8_TOL
    tol = op.tolerance(p)["o"]
    assert np.allclose(got, ref["o"], rtol=tol[0], atol=tol[1])
    if p.lse:
        assert np.allclose(out["lse"].numpy(), ref["lse"], rtol=1e-4, atol=1e-4)


def test_fp8_dispatch_rejections(disp8):
    from ck_core import MissingKernel

    with pytest.raises(MissingKernel, match="fp8 kernels cover the fwd family"):
        disp8.select(FmhaProblem(**{**FP8, "family": "fwd_splitkv", "seqlen_q": 1, "seqlen_k": 100,
                                    "num_splits": 2}))
    with pytest.raises(UnsupportedProblem, match="R27-fp8"):
        FmhaProblem(**{**FP8, "seqlen_q": 8, "seqlen_k": 8, "bias": "elementwise"})


# -- ahead-of-time compilation: native fp8 instructions per target ------------------------------
_AOT_FP8_SCRIPT = r"""
import json, re, sys
from triton.backends.compiler import GPUTarget
from ck_fmha.triton import aot_compile
targets = {"sm90": GPUTarget("cuda", 90, 32), "gfx942": GPUTarget("hip", "gfx942", 64),
           "gfx950": GPUTarget("hip", "gfx950", 64), "gfx1201": GPUTarget("hip", "gfx1201", 32)}
cases = json.loads(sys.argv[1])
out = {}
for name, dtype, cfg in cases:
    ck = aot_compile("fwd", dtype, cfg, targets[name])
    asm = ck.asm.get("ptx") or ck.asm.get("amdgcn")
    blob = ck.asm.get("cubin") if name == "sm90" else ck.asm.get("hsaco")
    ins = sorted(set(re.findall(r"(wgmma\.mma_async\S*|mma\.sync\S*|v_mfma\S*|v_wmma\S*)", asm)))
    out[name + ":" + cfg.get("variant", "ptr")] = [len(blob or b""), ins]
print("AOT-RESULT " + json.dumps(out))
"""

_F8_CFG = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2, hdim_q=128)
AOT_FP8 = [
    # group mode, causal, LSE, device descales, soft cap: every run-time fp8 feature at once
    ("sm90", "fp8", dict(_F8_CFG, varlen=True, mask_mode=1, lse=True, descale_ptr=True, softcap=True)),
    ("sm90", "fp8", dict(_F8_CFG, BLOCK_M=128, variant="tma_host")),
    ("gfx942", "fp8", dict(_F8_CFG, mask_mode=1)),            # "fp8" resolves to fp8e4b8 (e4m3fnuz) here
    ("gfx950", "fp8", dict(_F8_CFG, hdim_q=64, varlen=True)),
    ("gfx1201", "fp8", dict(_F8_CFG, hdim_q=64)),
]
NATIVE = {"sm90": "e4m3.e4m3", "gfx942": "_fp8_fp8", "gfx950": "f8f6f4", "gfx1201": "_fp8_fp8"}


def test_aot_compile_fp8_native_instructions():
    import json
    import subprocess

    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(here), root, env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", _AOT_FP8_SCRIPT, json.dumps(AOT_FP8)],
                       capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("AOT-RESULT ")][-1]
    res = json.loads(line[len("AOT-RESULT "):])
    assert len(res) == len(AOT_FP8)
    for key, (nbytes, ins) in res.items():
        tgt = key.split(":")[0]
        assert nbytes > 0, key
        # both products (Q K^T and P V) on the fp8 matrix units: no fp16 upcast, no other MMA
        assert ins and all(NATIVE[tgt] in i for i in ins), (key, ins)
