"""The Gluon sm90 forward as a dispatchable fwd variant, without a GPU: the key space per arch, the
support rules, the tuned defaults, ahead-of-time compilation to an sm90 cubin (through the
registry build too), and ``ops.fwd`` in the interpreter: an explicit Gluon config is refused (never
swapped for another kernel), the default choice runs the Triton kernel.
The GPU runs are tests/test_gluon_gpu.py."""
from __future__ import annotations

import os
import sys

if os.environ.get("CK_TEST_GPU") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from ck_core.errors import UnsupportedProblem  # noqa: E402
from ck_fmha.backends.triton import keys as TK  # noqa: E402
from ck_fmha.problem import FmhaProblem  # noqa: E402
from ck_fmha import heuristics as tuning  # noqa: E402
from ck_fmha.backends.triton import aot  # noqa: E402
from ck_fmha.backends.triton import configs as C  # noqa: E402
from ck_fmha.backends.triton import gluon_fwd, launch as ops  # noqa: E402
from ck_fmha.backends.triton.configs import TritonFmhaConfig  # noqa: E402

needs_gluon = pytest.mark.skipif(not gluon_fwd.HAVE_GLUON, reason="triton.experimental.gluon is not importable")
AMD = ("gfx942", "gfx90a", "gfx950", "gfx1100", "gfx1201")


def _sm90(name: str, value=lambda v: TritonFmhaConfig(**v)) -> dict:
    """The sm90 table ``name`` as {key tuple (or the head dim): value}."""
    return {(k[0] if len(k) == 1 else tuple(k)): value(v) for k, v in tuning.tuned(name, "sm90").items()}


def _tile(v):
    return (int(v["BLOCK"]), int(v["STAGES"]), bool(v["persistent"]))


@pytest.fixture
def mgr(monkeypatch):
    from ck_core import PluginManager, plugins

    m = PluginManager()
    monkeypatch.setattr(plugins, "_MANAGER", m)
    return m


def _fwd_keys(mgr, arch, **kw):
    from ck_core import Registry

    return list(Registry.from_enumeration("fmha", arch, "triton", manager=mgr, families="fwd", **kw))


# -- names, tables, key space -------------------------------------------------------------------
def test_variant_names_agree():
    assert TK.GLUON_VARIANTS == tuple(gluon_fwd.GLUON_VARIANTS) == C.GLUON_VARIANTS
    for v in C.GLUON_VARIANTS:
        assert v in C.VARIANTS and v in C.CUDA_ONLY_VARIANTS and v in TK.VARIANTS and v in TK.CUDA_ONLY


def test_default_fwd_config_takes_the_gluon_table_on_sm90_only():
    for (d, causal, s), cfg in _sm90("fwd_gluon").items():
        assert cfg.variant in C.GLUON_VARIANTS and (cfg.BLOCK_M, cfg.num_warps) == (128, gluon_fwd.WS_WARPS)
        assert tuning.default_fwd_config(d, d, "sm90", causal, s) == cfg
        assert tuning.default_fwd_config(d, d, "sm90", causal, s, gluon=False) == _sm90("fwd_tuned")[(d, causal, s)]
        assert tuning.default_fwd_config(d, d, "generic", causal, s).variant == "ptr"
    assert tuning.default_fwd_config(128, 128, "sm90", seqlen=2000).variant == "gluon_wspp_pers"
    assert tuning.default_fwd_config(128, 128, "sm90", causal=True, seqlen=512).variant == "gluon_ws_pers"
    assert tuning.default_fwd_config(64, 64, "sm90", seqlen=4096).variant == "gluon_ws_pers"
    assert tuning.default_fwd_config(64, 64, "sm90", seqlen=512).variant == "gluon_wspp_pers"
    assert tuning.default_fwd_config(64, 64, "sm90", causal=True, seqlen=4096).variant == "gluon_ws_pers"
    assert tuning.default_fwd_config(64, 64, "sm90", causal=True, seqlen=1024).BLOCK_N == 64
    assert tuning.default_fwd_config(64, 64, "sm90", causal=True, seqlen=512).BLOCK_N == 64
    # the Triton configs stay for what Gluon cannot run
    assert tuning.default_fwd_config(96, 96, "sm90").variant not in C.GLUON_VARIANTS
    assert tuning.default_fwd_config(128, 64, "sm90").variant not in C.GLUON_VARIANTS
    assert tuning.default_fwd_config(64, 64, "sm90", fp8=True).variant not in C.GLUON_VARIANTS
    assert tuning.default_fwd_config(128, 128, "sm90", fp8=True) == _sm90("fwd_fp8")[128]


def test_sm90_enumerates_gluon_keys_amd_archs_do_not(mgr):
    keys = _fwd_keys(mgr, "sm90")
    g = [k for k in keys if k.algorithm.variant in TK.GLUON_VARIANTS]
    got = {(k.signature.dtype, k.signature.hdim_q, k.signature.hdim_v, k.algorithm.variant) for k in g}
    assert got == {(dt, d, d, c.variant) for dt in ("fp16", "bf16") for d in (64, 128) for c in tuning.gluon_fwd_configs(d, "sm90")}
    lds = mgr.arch("sm90").lds_bytes
    for k in g:
        assert k.signature.family == "fwd"
        assert TK.parse_name(k.body) == (k.signature, k.algorithm)
        assert TK.smem.need("fwd", k.signature.hdim_q, k.signature.hdim_v, k.algorithm) <= lds
    # the Triton keys are all still there: the tuned Triton tile of every (hdim, causal) at 4096
    tiles = {(k.signature.hdim_q, k.algorithm.block_m, k.algorithm.block_n, k.algorithm.num_warps,
              k.algorithm.num_stages, k.algorithm.variant) for k in keys}
    for d in (64, 128):
        for causal in (False, True):
            c = tuning.default_fwd_config(d, d, "sm90", causal, gluon=False)
            assert (d, c.BLOCK_M, c.BLOCK_N, c.num_warps, c.num_stages, c.variant) in tiles
    for arch in AMD:   # dropped there, not turned into pointer keys
        keys = _fwd_keys(mgr, arch)
        assert keys, arch
        assert not [k for k in keys if k.algorithm.variant in TK.GLUON_VARIANTS or k.algorithm.num_warps == 12], arch


def test_rank_puts_the_tuned_gluon_key_first(mgr, monkeypatch):
    from ck_core import Dispatcher, Registry

    monkeypatch.setenv("TRITON_INTERPRET", "0")   # rank as on the GPU (the interpreter has no Gluon)

    reg = Registry.from_enumeration("fmha", "sm90", "triton", manager=mgr, families="fwd", dtypes="bf16")
    disp = Dispatcher(reg, backend="triton", check_backend=False)

    def pick(**kw):
        return disp.select(FmhaProblem(**{**dict(family="fwd", batch=2, nhead_q=4, dtype="bf16"), **kw})).algorithm

    assert pick(hdim_q=128, seqlen_q=1024, seqlen_k=1024).variant == "gluon_ws_pers"
    assert pick(hdim_q=128, seqlen_q=4096, seqlen_k=4096).variant == "gluon_wspp_pers"
    assert pick(hdim_q=128, seqlen_q=512, seqlen_k=512, mask="top_left").variant == "gluon_ws_pers"
    assert pick(hdim_q=64, seqlen_q=4096, seqlen_k=4096, mask="bottom_right").variant == "gluon_ws_pers"
    assert pick(hdim_q=64, seqlen_q=512, seqlen_k=512).variant == "gluon_wspp_pers"
    # ragged lengths too (the kernel masks its last blocks)
    assert pick(hdim_q=128, seqlen_q=3418, seqlen_k=3418).variant in TK.GLUON_VARIANTS
    assert pick(hdim_q=64, seqlen_q=1201, seqlen_k=1201, mask="bottom_right").variant in TK.GLUON_VARIANTS
    assert pick(hdim_q=64, seqlen_q=1, seqlen_k=129).variant in TK.GLUON_VARIANTS
    # problems the Gluon key rejects get the Triton kernel's tuned tile
    a = pick(hdim_q=128, seqlen_q=200, seqlen_k=328, mask="top_left")
    t = tuning.default_fwd_config(128, 128, "sm90", causal=True, seqlen=200, gluon=False)
    assert (a.block_m, a.block_n, a.num_warps, a.num_stages, a.variant) == (t.BLOCK_M, t.BLOCK_N, t.num_warps,
                                                                             t.num_stages, t.variant)


GOOD = dict(family="fwd", batch=2, nhead_q=6, nhead_k=2, seqlen_q=256, seqlen_k=384, hdim_q=128, dtype="bf16")


@pytest.mark.parametrize("kw, why", [
    (dict(mode="group", seqstart_q=(0, 128, 256), seqstart_k=(0, 128, 256)), "batch mode only"),
    (dict(bias="elementwise"), "no bias or ALiBi"),
    (dict(bias="alibi"), "no bias or ALiBi"),
    (dict(p_drop=0.1), "no dropout"),
    (dict(logits_soft_cap=30.0), "no logits soft cap"),
    (dict(mask="top_left", window_left=64, window_right=0), "no sliding-window"),
    (dict(mask="generic", window_left=3, window_right=5), "no sliding-window"),
    (dict(mask="bottom_right", sink_tokens=4), "no sink tokens"),
    (dict(sink_logits=True), "no sink tokens"),
    (dict(vlayout="c"), "V row-major only"),
    (dict(mask="top_left"), "causal only with seqlen_q == seqlen_k"),
    (dict(dtype="fp8"), "takes fp16/bf16"),
    (dict(hdim_q=128, hdim_v=64), "head dims 64/64 or 128/128"),
    (dict(hdim_q=96), "head dims 64/64 or 128/128"),
])
def test_supports_reasons(mgr, kw, why):
    key = [k for k in _fwd_keys(mgr, "sm90", dtypes="bf16") if k.algorithm.variant == "gluon_wspp_pers" and k.signature.hdim_q == 128][0]
    assert TK.supports(key, FmhaProblem(**GOOD)) is None
    assert TK.supports(key, FmhaProblem(**{**GOOD, "mask": "bottom_right", "seqlen_k": 256})) is None
    p = FmhaProblem(**{**GOOD, **kw})
    r = TK._gluon_unsupported(key.algorithm, p)
    assert r and why in r and "Gluon" in r, r
    assert TK.supports(key, p)   # (dtype / head-dim mismatches are named by the generic checks first)


# -- ops.fwd: the reasons, and the fallback in the interpreter ----------------------------------
GCFG = TritonFmhaConfig(128, 128, 12, 2, "gluon_wspp")


def test_gluon_reasons_of_ops_fwd(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")   # _gluon_reason only; nothing launches here
    q = torch.randn(1, 2, 128, 64, dtype=torch.float16)
    base = dict(layout="bhsd", mode=0, left=0, right=0, softcap=0.0, bias=None, alibi_slopes=None, dropout_p=0.0,
                sink=None, sink_tokens=0, out=None, fp8=False, out_dtype=None, paged=None)

    def why(**kw):
        a = {**base, **kw}
        return ops._gluon_reason(a.pop("q", q), a.pop("k", q), a.pop("v", q), a.pop("cfg", GCFG), **a)

    assert "sm90" in why()                      # CPU tensors: the kernel's own rule
    assert "group mode" in why(layout="thd")
    assert "paged" in why(paged={})
    assert "fp8" in why(fp8=True)
    assert "hdim_q 64 != hdim_v 32" in why(v=q[..., :32])
    assert "BLOCK_M=128" in why(cfg=GCFG.with_(BLOCK_M=64))
    assert "num_warps=12" in why(cfg=GCFG.with_(num_warps=8))
    assert "empty" in why(k=q[:, :, :0])
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "TRITON_INTERPRET" in why()


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter fallback (CPU tensors)")
@pytest.mark.parametrize("variant", ["gluon_wspp", "gluon_ws"])
@pytest.mark.parametrize("kw", [
    dict(layout="bhsd", nhead_q=3, nhead_k=1, seqlen_q=37, seqlen_k=45, hdim_q=64),
    dict(layout="bshd", nhead_q=2, nhead_k=2, seqlen_q=33, seqlen_k=29, hdim_q=64, mask="bottom_right"),
    dict(layout="bhsd", nhead_q=2, nhead_k=1, seqlen_q=20, seqlen_k=52, hdim_q=32, mask="top_left",
         window_left=7, window_right=3),
], ids=["plain-gqa", "bshd-causal-br", "window-d32"])
def test_ops_fwd_runs_what_it_is_given(variant, kw, ck_rng, monkeypatch):
    from ck_fmha.reference import forward as R

    calls = []
    monkeypatch.setattr(gluon_fwd, "fwd", lambda *a, **k: calls.append(1))
    p = FmhaProblem(family="fwd", batch=2, dtype="fp16", **kw)
    qs = (2, p.nhead_q, p.seqlen_q, p.hdim_q) if p.layout == "bhsd" else (2, p.seqlen_q, p.nhead_q, p.hdim_q)
    ks = (2, p.nhead_k, p.seqlen_k, p.hdim_q) if p.layout == "bhsd" else (2, p.seqlen_k, p.nhead_k, p.hdim_q)
    q, k, v = (torch.from_numpy(ck_rng.standard_normal(s).astype(np.float16)) for s in (qs, ks, ks))
    out = torch.full_like(q, float("nan"))
    causal = p.mask if p.is_causal else False
    window = (p.window_left, p.window_right) if p.has_window and not p.is_causal else (-1, -1)
    args = dict(causal=causal, window=window, align=p.mask if p.has_window else None, return_lse=True,
                layout=p.layout, out=out)
    with pytest.raises(UnsupportedProblem, match="Hopper"):
        ops.fwd(q, k, v, config=GCFG.with_(variant=variant), **args)
    # the launcher has no default choice (issue #30): the tuned tables' Triton tile for a non-Hopper arch
    o, lse = ops.fwd(q, k, v, config=tuning.default_fwd_config(p.hdim_q, p.hdim_q, "generic"), **args)
    assert not calls and o.data_ptr() == out.data_ptr()
    ref = R.fwd(p, q.double().numpy(), k.double().numpy(), v.double().numpy())
    assert torch.isfinite(o).all()
    assert _rel(o.double().numpy(), ref.o) < 5e-3
    fin = np.isfinite(ref.lse)
    assert _rel(lse.double().numpy()[fin], ref.lse[fin]) < 1e-5


# -- ahead-of-time: sm90 cubins through the registry build and aot_compile ----------------------
_AOT_SCRIPT = r"""
import json, sys, tempfile
from triton.backends.compiler import GPUTarget
from ck_core import Registry
from ck_core.build import build_registry
from ck_core.errors import UnsupportedProblem
from ck_fmha.backends.triton import implement as TKI, keys as TK
from ck_fmha.backends.triton import aot_compile

def facts(ck):
    ptx = ck.asm["ptx"]
    return dict(cubin=len(ck.asm.get("cubin") or b""), shared=ck.metadata.shared,
                ins=[s for s in ("wgmma.mma_async", "setmaxnreg", "cp.async.bulk.tensor") if s in ptx])

out = {}
sm90 = GPUTarget("cuda", 90, 32)
# the dispatcher's build of the sm90 registry's first Gluon key (bf16, d128), then its kernel
reg = Registry.from_enumeration("fmha", "sm90", "triton", families="fwd", dtypes="bf16").filter(
    lambda f: f["variant"] in TK.GLUON_VARIANTS and f["hdim_q"] == 128)
with tempfile.TemporaryDirectory() as tmp:
    rep = build_registry(reg, max_workers=1, progress=False, force=True, cache_root=tmp)
out["build"] = dict(built={k: v["binary"] for k, v in rep.built.items()}, failed=rep.failed)
key = reg.keys()[0]
a = key.algorithm
out["render"] = dict(facts(TKI.render(key, "triton").compile(sm90)), variant=a.variant,
                     smem=TK.smem.need("fwd", 128, 128, a))
# the other variant: fp16, d64, causal, bshd
cfg = dict(BLOCK_M=128, BLOCK_N=128, num_warps=12, num_stages=3, variant="gluon_ws", hdim_q=64, mask_mode=1,
           bshd=True)
out["ws"] = dict(facts(aot_compile("fwd", "fp16", cfg, sm90)),
                 smem=TK.smem.need("fwd", 64, 64, TK.TritonFmhaAlg(128, 128, 12, 3, "gluon_ws")))
out["refused"] = {}
for name, tgt in (("gfx942", GPUTarget("hip", "gfx942", 64)), ("sm80", GPUTarget("cuda", 80, 32))):
    try:
        aot_compile("fwd", "bf16", cfg, tgt)
        out["refused"][name] = ""
    except UnsupportedProblem as exc:
        out["refused"][name] = str(exc)
print("AOT-RESULT " + json.dumps(out))
"""


@needs_gluon
def test_aot_sm90_cubins():
    import json
    import subprocess

    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)   # real JIT functions (the interpreter replaces them)
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(here), root, env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", _AOT_SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("AOT-RESULT ")][-1][len("AOT-RESULT "):])
    assert not res["build"]["failed"] and set(res["build"]["built"].values()) == {"cubin"}, res["build"]
    assert res["render"]["variant"] in ("gluon_ws_pers", "gluon_wspp_pers")
    for name in ("render", "ws"):
        f = res[name]
        assert f["cubin"] > 0 and f["ins"] == ["wgmma.mma_async", "setmaxnreg", "cp.async.bulk.tensor"], (name, f)
        assert 0 < f["shared"] <= f["smem"], (name, f)   # the key space's estimate is an upper bound
    for name, msg in res["refused"].items():
        assert "not the target of an installed Hopper arch plugin" in msg, (name, msg)


def test_kernel_for_refuses_gluon_variants():
    for fn in (lambda c: aot.kernel_for("fwd", c), lambda c: aot.signature_for("fwd", "bf16", c)):
        with pytest.raises(UnsupportedProblem, match="aot_compile"):
            fn(GCFG)


@pytest.mark.parametrize("family, dtype, kw, match", [
    ("fwd", "bf16", dict(softcap=True, mask_mode=3, bias_mode="alibi"), "softcap, bias_mode, mask_mode=3"),
    ("fwd", "bf16", dict(varlen=True), "varlen"),
    ("fwd", "fp8", {}, "fp16/bf16"),
    ("fwd", "bf16", dict(hdim_q=96), "head dims 64/128"),
    ("fwd", "bf16", dict(BLOCK_M=64), "BLOCK_M=128"),
    ("bwd_dq_dk_dv", "bf16", {}, "forward kernel"),
])
def test_aot_compile_refuses_what_the_gluon_kernel_lacks(family, dtype, kw, match):
    from triton.backends.compiler import GPUTarget

    cfg = {**GCFG.as_dict(), "hdim_q": 128, **kw}
    with pytest.raises(UnsupportedProblem, match=match):
        aot.aot_compile(family, dtype, cfg, GPUTarget("cuda", 90, 32))


def test_gluon_backward_tables_name_known_tiles():
    from ck_fmha.backends.triton import gluon_bwd
    for d, t in _sm90("bwd_gluon_dq", _tile).items():
        assert d in gluon_fwd.HDIMS and len(t) == 3 and t[0] in (64, 128)
    for (d, causal), t in _sm90("bwd_gluon_dkdv", _tile).items():
        assert d in gluon_fwd.HDIMS and isinstance(causal, bool) and len(t) == 3 and t[0] in (64, 128)
    assert set(gluon_bwd.tiles("dkdv", "sm90")) == set(gluon_bwd.tiles("dq", "sm90")) == set(gluon_fwd.HDIMS)


@needs_gluon
def test_gluon_backward_kernels_compile_for_sm90():
    """Both backward kernels build for sm90 on this CPU-only machine (wgmma, setmaxnreg, TMA)."""
    import subprocess

    code = r"""
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.runtime.jit import mangle_type
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.experimental.gluon._runtime import GluonASTSource
from ck_fmha.backends.triton import gluon_bwd as B

def desc(rows, d, dt=torch.bfloat16, gdt=gl.bfloat16):   # 3-D, as the launchers build them
    x = torch.empty(2, 256, d, dtype=dt)
    return mangle_type(TensorDescriptor.from_tensor(x, [1, rows, d],
                                                    gl.NVMMASharedLayout.get_default_for([1, rows, d], gdt)))

ints = dict(H="i32", HK="i32", GROUP="i32", SEQ_Q="i32", SEQ_K="i32", scale2="fp32", sm_scale="fp32",
            LSE="*fp32", DELTA="*fp32")
q, kv = desc(64, 128), desc(64, 128)
for fn, sig, cx in (
        (B.fmha_bwd_dq_gluon_ws_sm90, dict(q_desc=q, do_desc=q, k_desc=kv, v_desc=kv, dq_desc=q, BH="i32", **ints),
         dict(BSHD=False, CAUSAL=True, BLOCK_N=64, HEAD_D=128, STAGES=4, PERSISTENT=True)),
        (B.fmha_bwd_dkdv_gluon_ws_sm90, dict(k_desc=kv, v_desc=kv, q_desc=q, do_desc=q, dk_desc=kv, dv_desc=kv,
                                             dq_desc=kv, BHK="i32", **ints),
         dict(BSHD=True, CAUSAL=True, BLOCK_MQ=64, HEAD_D=128, STAGES=2, PERSISTENT=False, FUSED_DQ=False)),
        (B.fmha_bwd_dkdv_gluon_ws_sm90, dict(k_desc=kv, v_desc=kv, q_desc=q, do_desc=q, dk_desc=kv, dv_desc=kv,
                                             dq_desc=desc(64, 128, torch.float32, gl.float32), BHK="i32", **ints),
         dict(BSHD=False, CAUSAL=False, BLOCK_MQ=64, HEAD_D=128, STAGES=2, PERSISTENT=True, FUSED_DQ=True))):
    sig = {n: sig.get(n, "constexpr") for n in fn.arg_names}
    src = GluonASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in cx.items()})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=1)).asm["ptx"]
    assert all(s in ptx for s in ("wgmma.mma_async", "setmaxnreg", "cp.async.bulk.tensor")), fn
    assert ("cp.reduce.async.bulk.tensor" in ptx) == bool(cx.get("FUSED_DQ")), fn
print("OK")
"""
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(here), root, env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]


def _bwd_pick(d, causal, seqlen, deterministic):
    """(dK/dV algorithm tuple, dq field) the heuristic picks on sm90 (as on the GPU)."""
    from ck_core.plugins import get_manager
    from ck_fmha.heuristics import bwd_want

    p = FmhaProblem(family="bwd_dq_dk_dv", batch=1, nhead_q=2, dtype="bf16", hdim_q=d, seqlen_q=seqlen,
                    seqlen_k=seqlen, mask="top_left" if causal else "none", deterministic=deterministic)
    return bwd_want(p, get_manager().arch("sm90"))


def _gluon_kv(tile):
    return (tile[0], TK.GLUON_BWD_BLOCK_N, TK.GLUON_BWD_WARPS, tile[1],
            "gluon_dkdv_pers" if tile[2] else "gluon_dkdv")


def test_dkdv_choice_follows_table_and_knob(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.delenv("CK_FMHA_GLUON_DKDV", raising=False)
    for (d, causal), tile in _sm90("bwd_gluon_dkdv", _tile).items():
        assert _bwd_pick(d, causal, 1024, True)[0] == _gluon_kv(tile)
    monkeypatch.setenv("CK_FMHA_GLUON_DKDV", "1")
    assert _bwd_pick(64, False, 1024, True)[0][4].startswith("gluon_dkdv")
    monkeypatch.setenv("CK_FMHA_GLUON_DKDV", "0")
    assert _bwd_pick(128, True, 1024, True)[0][4] == "ptr"


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_geometry_gives_the_flattened_views(layout):
    b, hq, hk, sq, sk, d = 3, 6, 2, 256, 384, 64
    shp = (lambda h, s: (b, h, s, d)) if layout == "bhsd" else (lambda h, s: (b, s, h, d))
    q, k = torch.empty(shp(hq, sq)), torch.empty(shp(hk, sk))
    g = gluon_fwd.geometry(q, k, layout)
    assert g[:5] == (b, hq, sq, hk, sk)
    assert q.view(g[5], g[7]).shape == (g[5], g[7]) and g[5] * g[7] == q.numel()
    assert k.view(g[6], g[8]).shape == (g[6], g[8]) and g[6] * g[8] == k.numel()
    assert g[7] == (d if layout == "bhsd" else hq * d)
    assert gluon_fwd.grid_for(1000, False, torch.device("cpu")) == (1000, )


def test_fused_dq_tables_and_shared_memory(monkeypatch):
    """The fused dK/dV+dQ choice follows its table, seqlen threshold and the knob; every tile in the
    tables fits the sm90 shared memory (the fused kernel adds dS^T and two fp32 dQ staging tiles)."""
    from ck_core.plugins import get_manager
    from ck_fmha.backends.triton import gluon_bwd as B
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.delenv("CK_FMHA_GLUON_DKDV", raising=False)
    smem = get_manager().arch("sm90").lds_bytes
    for (d, causal), tile in _sm90("bwd_gluon_fused", _tile).items():
        n = tuning.gluon_fused_min_seqlen("sm90")
        assert _bwd_pick(d, causal, n, False) == (_gluon_kv(tile), "atomic")
        assert _bwd_pick(d, causal, n - 128, False)[1] != "atomic"   # below the threshold: the dQ pass
        assert B.dkdv_smem_bytes(d, tile[0], tile[1], True) <= smem
    for d, tile in B.tiles("fused", "sm90").items():
        assert B.dkdv_smem_bytes(d, tile[0], tile[1], True) <= smem
    for (d, _), tile in _sm90("bwd_gluon_dkdv", _tile).items():
        assert B.dkdv_smem_bytes(d, tile[0], tile[1], False) <= smem
    assert B.dkdv_smem_bytes(128, 64, 3, True) > smem     # 3 stages do not fit with dQ fused at D=128


@needs_gluon
@pytest.mark.parametrize("sq, sk, ok", [(256, 384, True), (200, 384, True), (256, 300, True), (0, 300, False)])
def test_gluon_dq_pass_takes_ragged_lengths(sq, sk, ok):
    """The Gluon dQ pass reads 3-D descriptors (tails zero-filled, the last blocks masked): any lengths
    but empty ones."""
    from ck_fmha.backends.triton import gluon_bwd

    def t(h, s, d=64, dt=torch.float16):
        return torch.empty(2, h, s, d, device="meta", dtype=dt)

    q, k = t(4, sq), t(2, sk)
    lse = torch.empty(2, 4, sq, device="meta", dtype=torch.float32)
    why = gluon_bwd.dq_unsupported_reason(q, k, k, q, lse, lse, causal=False, layout="bhsd", block_n=64)
    assert (why == "") == ok, why
    assert ok or "empty" in why


def test_gluon_fwd_launches_through_via_while_a_warm_call_is_recorded(monkeypatch):
    """The Gluon forward replays its own launch cache; while the public API records a warm closure
    (``warm.recording()``) it must launch through ``_via`` again, or the closure records nothing
    and every warm call takes the full ~100 us host path (H100, 1x8x128x64: 104.7 us host)."""
    from ck_fmha.backends.triton import gluon_fwd as GF
    from ck_fmha.backends.triton import warm

    calls = []

    class _Rec:
        class replay:
            args = [None] * 5

            def __call__(self, args):
                pass

        slots = (0, 1, 2, 3, 4)
        dummy_lse = None

    def fake_record(*a, **k):
        calls.append(warm.active())
        r = _Rec()
        r.replay = _Rec.replay()
        return r

    monkeypatch.setattr(GF, "_record", fake_record)
    monkeypatch.setattr(GF, "_LAUNCHES", None)
    q = torch.zeros(1, 2, 128, 64, dtype=torch.float16)
    via = object()
    GF.fwd(q, q, q, tile=(128, 64, GF.WS_WARPS, 2), _checked=True, _via=via)   # records: cache filled
    GF.fwd(q, q, q, tile=(128, 64, GF.WS_WARPS, 2), _checked=True, _via=via)   # cache hit: no record
    assert calls == [False]
    with warm.recording():
        GF.fwd(q, q, q, tile=(128, 64, GF.WS_WARPS, 2), _checked=True, _via=via)
    assert calls == [False, True]
