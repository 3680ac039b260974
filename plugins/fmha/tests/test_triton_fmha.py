"""CPU tests of the Triton FMHA kernels: TRITON_INTERPRET=1 on tiny odd shapes
against a float64 torch reference, plus ahead-of-time compilation for the
CUDA and AMD targets.  (bf16 is left to the GPU tests: the interpreter's bf16
dot is broken with numpy, fp16 exercises the same code.)"""
from __future__ import annotations

import os
import sys

if os.environ.get("CK_TEST_GPU") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

sys.path.insert(0, os.path.dirname(__file__))

from triton_ref import ref_attention, rel_err  # noqa: E402

if os.environ.get("TRITON_INTERPRET") != "1":  # pragma: no cover
    pytest.skip("these tests run the kernels in the Triton interpreter", allow_module_level=True)

from ck_fmha.triton import (TritonFmhaConfig, attention, bwd, fwd, kernel_for, num_splits_heuristic,  # noqa: E402
                            paged_decode, signature_for, splitkv_decode)

# the interpreter's numpy log2(0) for rows that see no key is expected (LSE = -inf)
# and its numpy scalar-conversion deprecation on scalar loads (cu_seqlens, page table) are expected
pytestmark = [pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")]

SMALL = TritonFmhaConfig(16, 16, 4, 1)
TOL = 2e-3  # fp16 operands, fp32 accumulation


def _qkv(b, hq, hk, sq, sk, d, dv, layout="bhsd", dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    if layout == "bhsd":
        shp = lambda h, s, e: (b, h, s, e)  # noqa: E731
    else:
        shp = lambda h, s, e: (b, s, h, e)  # noqa: E731
    q = torch.randn(shp(hq, sq, d), generator=g).to(dtype)
    k = torch.randn(shp(hk, sk, d), generator=g).to(dtype)
    v = torch.randn(shp(hk, sk, dv), generator=g).to(dtype)
    return q, k, v


FWD_CASES = [
    # hq, hk, sq, sk, d, dv, causal, window, softcap, layout
    (2, 2, 37, 37, 32, 32, False, (-1, -1), 0.0, "bhsd"),
    (2, 2, 37, 37, 64, 64, True, (-1, -1), 0.0, "bhsd"),
    (2, 2, 29, 45, 32, 32, "bottom_right", (-1, -1), 0.0, "bshd"),
    (2, 2, 45, 29, 32, 32, "bottom_right", (-1, -1), 0.0, "bhsd"),   # rows with no key -> 0, lse -inf
    (4, 2, 37, 37, 64, 64, False, (5, 3), 0.0, "bshd"),             # sliding window, GQA
    (4, 1, 37, 41, 48, 32, True, (-1, -1), 5.0, "bhsd"),             # MQA, softcap, asym + padded hdim
    (2, 2, 33, 33, 32, 32, False, (9, -1), 0.0, "bhsd"),             # left-only window
]


@pytest.mark.parametrize("case", FWD_CASES, ids=lambda c: f"{c[0]}x{c[1]}-{c[2]}x{c[3]}-d{c[4]}/{c[5]}-{c[6]}-{c[7]}-sc{c[8]}-{c[9]}")
def test_fwd(case):
    hq, hk, sq, sk, d, dv, causal, window, softcap, layout = case
    q, k, v = _qkv(1, hq, hk, sq, sk, d, dv, layout)
    o, lse = fwd(q, k, v, causal=causal, window=window, softcap=softcap, return_lse=True, layout=layout,
                 config=SMALL)
    ro, rl = ref_attention(q, k, v, causal=causal, window=window, softcap=softcap, layout=layout)
    ob = o.transpose(1, 2) if layout == "bshd" else o
    assert torch.isfinite(ob).all()
    assert rel_err(ob, ro) < TOL
    fin = torch.isfinite(rl)
    assert torch.equal(torch.isinf(lse), ~fin)
    assert rel_err(lse[fin], rl[fin]) < 1e-5


def test_fwd_scale_and_no_lse():
    q, k, v = _qkv(2, 2, 2, 19, 23, 32, 32)
    o = fwd(q, k, v, scale=0.3, config=SMALL)
    ro, _ = ref_attention(q, k, v, scale=0.3)
    assert rel_err(o, ro) < TOL


def test_fwd_varlen_group_mode():
    lq, lk, h, hk, d = [5, 37, 20], [9, 37, 33], 4, 2, 32
    cq = torch.tensor([0, 5, 42, 62], dtype=torch.int32)
    ck = torch.tensor([0, 9, 46, 79], dtype=torch.int32)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(sum(lq), h, d, generator=g).half()
    k = torch.randn(sum(lk), hk, d, generator=g).half()
    v = torch.randn(sum(lk), hk, d, generator=g).half()
    o, lse = fwd(q, k, v, causal="bottom_right", layout="thd", cu_seqlens_q=cq, cu_seqlens_k=ck,
                 max_seqlen_q=max(lq), max_seqlen_k=max(lk), return_lse=True, config=SMALL)
    for i in range(3):
        sl_q, sl_k = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
        ro, rl = ref_attention(q[sl_q].transpose(0, 1)[None], k[sl_k].transpose(0, 1)[None],
                               v[sl_k].transpose(0, 1)[None], causal="bottom_right")
        assert rel_err(o[sl_q].transpose(0, 1)[None], ro) < TOL
        assert rel_err(lse[:, sl_q][None], rl) < 1e-5


BWD_CASES = [
    # hq, hk, sq, sk, d, dv, causal, window, softcap, deterministic
    (2, 2, 37, 37, 32, 32, False, (-1, -1), 0.0, True),
    (2, 2, 37, 37, 32, 32, True, (-1, -1), 0.0, False),              # atomic dQ + convert
    (4, 2, 37, 45, 32, 32, "bottom_right", (-1, -1), 0.0, True),     # GQA: dk/dv summed over the group
    (4, 1, 37, 37, 64, 32, False, (7, 2), 4.0, True),                # window + softcap + asym hdim
]


@pytest.mark.parametrize("case", BWD_CASES, ids=lambda c: f"{c[0]}x{c[1]}-{c[2]}x{c[3]}-d{c[4]}-{c[6]}-{c[7]}-sc{c[8]}-det{c[9]}")
def test_bwd(case):
    hq, hk, sq, sk, d, dv, causal, window, softcap, det = case
    q, k, v = _qkv(1, hq, hk, sq, sk, d, dv, seed=1)
    do = torch.randn(1, hq, sq, dv, generator=torch.Generator().manual_seed(2)).half()
    o, lse = fwd(q, k, v, causal=causal, window=window, softcap=softcap, return_lse=True, config=SMALL)
    dq, dk, dv_ = bwd(q, k, v, o, lse, do, causal=causal, window=window, softcap=softcap, deterministic=det,
                      config=(SMALL, SMALL))
    qd, kd, vd = (x.double().requires_grad_() for x in (q, k, v))
    ro, _ = ref_attention(qd, kd, vd, causal=causal, window=window, softcap=softcap)
    ro.backward(do.double())
    assert rel_err(dq, qd.grad) < TOL
    assert rel_err(dk, kd.grad) < TOL
    assert rel_err(dv_, vd.grad) < TOL


@pytest.mark.slow
def test_attention_autograd_bshd():
    q, k, v = _qkv(1, 2, 2, 21, 21, 32, 32, layout="bshd", seed=4)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    # the autograd wrapper uses the default configs (interpreter: generic table)
    o = attention(q, k, v, causal=True, layout="bshd")
    o.float().sum().backward()
    qd, kd, vd = (x.detach().double().requires_grad_() for x in (q, k, v))
    ro, _ = ref_attention(qd, kd, vd, causal=True, layout="bshd")
    ro.sum().backward()
    assert rel_err(o.transpose(1, 2), ro) < TOL
    assert rel_err(q.grad, qd.grad) < TOL and rel_err(k.grad, kd.grad) < TOL and rel_err(v.grad, vd.grad) < TOL


@pytest.mark.parametrize("hq,hk,sq,sk,causal,seqlens,ns", [
    (4, 4, 1, 300, False, None, 5),
    (8, 2, 3, 200, True, [200, 77], 3),
    (4, 1, 1, 130, False, [130, 1], None),
])
def test_splitkv_and_paged(hq, hk, sq, sk, causal, seqlens, ns):
    d = 32
    q, k, v = _qkv(2, hq, hk, sq, sk, d, d, seed=5)
    sl = None if seqlens is None else torch.tensor(seqlens, dtype=torch.int32)
    o, lse = splitkv_decode(q, k, v, seqlens_k=sl, causal=causal, num_splits=ns, return_lse=True, config=SMALL)
    ro, rl = ref_attention(q, k, v, causal=causal, align="bottom_right", seqlens_k=sl)
    assert rel_err(o, ro) < TOL and rel_err(lse, rl) < 1e-5
    sl2 = sl if sl is not None else torch.full((2,), sk, dtype=torch.int32)
    for ps in (8, 32):  # page smaller than BLOCK_N (per-key gather) and a multiple of it
        npg = -(-sk // ps)
        table = torch.randperm(2 * npg + 3, generator=torch.Generator().manual_seed(ps))[:2 * npg]
        table = table.view(2, npg).to(torch.int32)
        kc = torch.zeros(2 * npg + 3, ps, hk, d, dtype=q.dtype)
        vc = torch.zeros_like(kc)
        kp = torch.nn.functional.pad(k, (0, 0, 0, npg * ps - sk))
        vp = torch.nn.functional.pad(v, (0, 0, 0, npg * ps - sk))
        for bi in range(2):
            for pi in range(npg):
                kc[table[bi, pi]] = kp[bi, :, pi * ps:(pi + 1) * ps].transpose(0, 1)
                vc[table[bi, pi]] = vp[bi, :, pi * ps:(pi + 1) * ps].transpose(0, 1)
        o2 = paged_decode(q, kc, vc, table, sl2, causal=causal, num_splits=ns, config=SMALL)
        ro2, _ = ref_attention(q, k, v, causal=causal, align="bottom_right", seqlens_k=sl2)
        assert rel_err(o2, ro2) < TOL


def test_num_splits_heuristic():
    assert num_splits_heuristic(132 * 4, 4096) == 1            # machine already full
    n = num_splits_heuristic(8, 131072)
    assert 16 <= n <= 128
    assert num_splits_heuristic(1, 100) == 1                    # never below one chunk


def test_kernel_for_contract():
    fn, cx = kernel_for("fwd", {"BLOCK_M": 64, "BLOCK_N": 32, "hdim_q": 192, "hdim_v": 128, "mask_mode": 1})
    assert cx["BLOCK_DQ"] == 256 and cx["BLOCK_DV"] == 128 and cx["D_Q"] == 192
    sig, cx2 = signature_for("fwd", "bf16", {"hdim_q": 64})
    assert set(sig) == set(fn.arg_names)
    assert sig["Q"] == "*bf16" and sig["LSE"] == "*fp32" and sig["scale2"] == "fp32" and sig["H"] == "i32"
    assert all(sig[n] == "constexpr" for n in cx2)
    for fam in ("bwd_dot_do_o", "bwd_dq_dk_dv", "bwd_dq", "bwd_convert_dq", "fwd_splitkv",
                "fwd_pagedkv", "fwd_splitkv_combine"):
        f, c = kernel_for(fam, TritonFmhaConfig(64, 64, 4, 2))
        assert set(c) <= set(f.arg_names)


# --------------------------------------------------------------------------
# ahead-of-time compilation (no GPU needed).  The interpreter replaces
# @triton.jit functions, so compilation runs in a child process without
# TRITON_INTERPRET.
# --------------------------------------------------------------------------
_AOT_SCRIPT = r"""
import json, sys
from triton.backends.compiler import GPUTarget
from ck_fmha.triton import aot_compile
targets = {"sm90": GPUTarget("cuda", 90, 32), "gfx942": GPUTarget("hip", "gfx942", 64),
           "gfx90a": GPUTarget("hip", "gfx90a", 64), "gfx950": GPUTarget("hip", "gfx950", 64),
           "gfx1100": GPUTarget("hip", "gfx1100", 32), "gfx1201": GPUTarget("hip", "gfx1201", 32)}
cases = json.loads(sys.argv[1])
out = {}
for name in sys.argv[2].split(","):
    tgt = targets[name]
    for fam, dtype, cfg in cases:
        if cfg.get("variant", "ptr") != "ptr" and tgt.backend != "cuda":
            continue
        ck = aot_compile(fam, dtype, cfg, tgt)
        blob = ck.asm.get("cubin") if tgt.backend == "cuda" else ck.asm.get("hsaco")
        out[name + ":" + fam + ":" + cfg.get("variant", "ptr")] = [len(blob or b""), ck.metadata.shared]
print("AOT-RESULT " + json.dumps(out))
"""

AOT_FAST = [  # small instances that compile quickly: forward, backward, split-KV
    ("fwd", "fp16", dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2, hdim_q=64, mask_mode=1, lse=True)),
    ("bwd_dq_dk_dv", "fp16", dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1, hdim_q=32, mask_mode=1)),
    ("fwd_splitkv", "bf16", dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=2, hdim_q=64)),
]

AOT_ALL = AOT_FAST + [
    ("fwd", "bf16", dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=2, hdim_q=128, mask_mode=3,
                         softcap=True, varlen=True)),
    ("fwd", "bf16", dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2, hdim_q=192, hdim_v=128)),
    ("bwd_dot_do_o", "bf16", dict(BLOCK_M=64, hdim_q=128)),
    ("bwd_dq_dk_dv", "bf16", dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=2, hdim_q=64, atomic_dq=True)),
    ("bwd_dq", "bf16", dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2, hdim_q=64, mask_mode=1)),
    ("bwd_convert_dq", "bf16", dict(BLOCK_M=64, hdim_q=128)),
    ("fwd_pagedkv", "bf16", dict(BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=2, hdim_q=128, page_size=16)),
    ("fwd_splitkv_combine", "bf16", dict(hdim_v=128, num_splits=16)),
    # CUDA-only variants (device-side TMA descriptors, warp specialisation): skipped on hip
    ("fwd", "bf16", dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3, hdim_q=128, variant="tma")),
    ("fwd", "bf16", dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3, hdim_q=128, variant="tma_ws")),
    ("fwd", "bf16", dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=2, hdim_q=128, variant="tma_host")),
]

TARGETS = ["sm90", "gfx942", "gfx90a", "gfx950", "gfx1100", "gfx1201"]


def _aot(cases, targets):
    import json
    import subprocess

    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(here), root, env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", _AOT_SCRIPT, json.dumps(cases), ",".join(targets)],
                       capture_output=True, text=True, env=env, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("AOT-RESULT ")][-1]
    res = json.loads(line[len("AOT-RESULT "):])
    for key, (nbytes, _shared) in res.items():
        assert nbytes > 0, key
    return res


def test_aot_compile_six_targets():
    res = _aot(AOT_FAST, TARGETS)
    assert len(res) == len(AOT_FAST) * len(TARGETS)


@pytest.mark.slow
def test_aot_compile_all_families():
    res = _aot(AOT_ALL, TARGETS)
    assert any(k.endswith(":tma_ws") for k in res)
