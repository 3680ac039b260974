"""GPU correctness of the Triton FMHA kernels (run on the device machine:
``CK_TEST_GPU=1 PYTHONPATH=plugins/fmha:. python -m pytest -m gpu -n 8 plugins/fmha/tests/test_triton_fmha_gpu.py``;
without CK_TEST_GPU=1 the root conftest selects the CPU interpreter and this file skips).
References are computed in float64 from the same random inputs; outputs are
poisoned before each run so that unwritten elements show up."""
from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

sys.path.insert(0, os.path.dirname(__file__))
from triton_ref import ref_attention, rel_err  # noqa: E402

from ck_fmha import attention  # noqa: E402
from ck_fmha.backends.triton import TritonFmhaConfig, bwd, fwd  # noqa: E402
from ck_fmha.decode import paged_decode, splitkv_decode  # noqa: E402

DEV = "cuda"
TOL = {torch.float16: 4e-3, torch.bfloat16: 2e-2}


def _qkv(b, hq, hk, sq, sk, d, dv, layout, dtype, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    shp = (lambda h, s, e: (b, h, s, e)) if layout == "bhsd" else (lambda h, s, e: (b, s, h, e))
    return (torch.randn(shp(hq, sq, d), device=DEV, generator=g, dtype=dtype),
            torch.randn(shp(hk, sk, d), device=DEV, generator=g, dtype=dtype),
            torch.randn(shp(hk, sk, dv), device=DEV, generator=g, dtype=dtype))


FWD = [
    # b, hq, hk, sq, sk, d, dv, causal, window, softcap, layout, variant
    (2, 4, 4, 1000, 1000, 128, 128, False, (-1, -1), 0.0, "bhsd", "tma"),
    (2, 4, 4, 1000, 1000, 128, 128, True, (-1, -1), 0.0, "bhsd", "tma"),
    (2, 4, 4, 1024, 1024, 64, 64, True, (-1, -1), 0.0, "bshd", "tma"),
    (2, 4, 4, 777, 1025, 64, 64, "bottom_right", (-1, -1), 0.0, "bhsd", "ptr"),
    (1, 8, 2, 513, 513, 128, 128, False, (100, 20), 0.0, "bshd", "tma"),
    (1, 8, 1, 300, 300, 192, 128, True, (-1, -1), 30.0, "bhsd", "ptr"),
    (1, 4, 4, 300, 300, 256, 256, False, (-1, -1), 0.0, "bhsd", "ptr"),
    (1, 4, 4, 255, 255, 32, 32, True, (-1, -1), 0.0, "bhsd", "tma"),
    (2, 4, 4, 1024, 1024, 128, 128, False, (-1, -1), 0.0, "bhsd", "tma_ws"),
    (2, 4, 4, 1000, 1000, 128, 128, True, (-1, -1), 0.0, "bhsd", "tma_host"),
    (2, 8, 2, 999, 1001, 64, 64, "bottom_right", (-1, -1), 0.0, "bshd", "tma_host"),
    (1, 4, 4, 700, 700, 64, 64, False, (64, 64), 0.0, "bhsd", "tma_host"),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", FWD, ids=lambda c: "-".join(map(str, c)))
def test_fwd_gpu(case, dtype):
    b, hq, hk, sq, sk, d, dv, causal, window, softcap, layout, variant = case
    q, k, v = _qkv(b, hq, hk, sq, sk, d, dv, layout, dtype, seed=sq + d)
    from ck_core.device import current_arch
    from ck_fmha.heuristics import default_fwd_config
    cfg = default_fwd_config(d, dv, current_arch(q).name, gluon=False).with_(variant=variant)
    shape = (b, hq, sq, dv) if layout == "bhsd" else (b, sq, hq, dv)
    out = torch.full(shape, float("nan"), device=DEV, dtype=dtype)
    try:
        o, lse = fwd(q, k, v, causal=causal, window=window, softcap=softcap, return_lse=True, layout=layout,
                     config=cfg, out=out)
    except Exception as e:  # warp specialisation is experimental on Hopper in triton 3.6
        if variant == "tma_ws":
            pytest.xfail(f"tma_ws: {type(e).__name__}: {e}")
        raise
    ro, rl = ref_attention(q.cpu(), k.cpu(), v.cpu(), causal=causal, window=window, softcap=softcap,
                           layout=layout)
    ob = (o.transpose(1, 2) if layout == "bshd" else o).cpu()
    assert torch.isfinite(ob).all()
    assert rel_err(ob, ro) < TOL[dtype]
    fin = torch.isfinite(rl)
    assert rel_err(lse.cpu()[fin], rl[fin]) < 1e-3


BWD = [
    (2, 4, 4, 1000, 1000, 128, False, True),
    (2, 4, 4, 1024, 1024, 64, True, True),
    (1, 8, 2, 777, 777, 128, True, False),
    (1, 8, 1, 513, 513, 64, "bottom_right", True),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", BWD, ids=lambda c: "-".join(map(str, c)))
def test_bwd_gpu(case, dtype):
    b, hq, hk, sq, sk, d, causal, det = case
    q, k, v = _qkv(b, hq, hk, sq, sk, d, d, "bhsd", dtype, seed=7 + d)
    do = torch.randn(b, hq, sq, d, device=DEV, dtype=dtype)
    from ck_fmha.heuristics import default_bwd_configs, default_fwd_config

    # the sm90 tables' Triton tiles (the launchers run the configs they are given)
    o, lse = fwd(q, k, v, causal=causal, return_lse=True,
                 config=default_fwd_config(d, d, "sm90", causal, sq, gluon=False).with_(variant="ptr"))
    dq, dk, dv = bwd(q, k, v, o, lse, do, causal=causal, deterministic=det,
                     config=default_bwd_configs(d, d, "sm90", causal=causal))
    qd, kd, vd = (x.cpu().double().requires_grad_() for x in (q, k, v))
    ro, _ = ref_attention(qd, kd, vd, causal=causal)
    ro.backward(do.cpu().double())
    tol = 2 * TOL[dtype]
    assert rel_err(dq.cpu(), qd.grad) < tol and rel_err(dk.cpu(), kd.grad) < tol
    assert rel_err(dv.cpu(), vd.grad) < tol


def test_attention_autograd_gpu():
    q, k, v = _qkv(1, 4, 2, 333, 333, 64, 64, "bshd", torch.bfloat16, seed=11)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    o = attention(q, k, v, causal=True, layout="bshd")
    o.float().square().sum().backward()
    qd, kd, vd = (x.detach().cpu().double().requires_grad_() for x in (q, k, v))
    ro, _ = ref_attention(qd, kd, vd, causal=True, layout="bshd")
    ro.square().sum().backward()
    assert rel_err(o.transpose(1, 2).cpu(), ro) < 2e-2
    assert rel_err(q.grad.cpu(), qd.grad) < 4e-2 and rel_err(k.grad.cpu(), kd.grad) < 4e-2
    assert rel_err(v.grad.cpu(), vd.grad) < 4e-2


@pytest.mark.parametrize("page", [0, 16, 64, 256])
def test_decode_gpu(page):
    b, hq, hk, sq, sk, d = 3, 32, 8, 1, 5000, 128
    dtype = torch.bfloat16
    q, k, v = _qkv(b, hq, hk, sq, sk, d, d, "bhsd", dtype, seed=page + 1)
    sl = torch.tensor([5000, 4097, 17], dtype=torch.int32, device=DEV)
    if page == 0:
        o, lse = splitkv_decode(q, k, v, seqlens_k=sl, return_lse=True)
    else:
        npg = -(-sk // page)
        table = torch.randperm(b * npg, device=DEV).view(b, npg).to(torch.int32)
        kc = torch.empty(b * npg, page, hk, d, device=DEV, dtype=dtype)
        vc = torch.empty_like(kc)
        kp = torch.nn.functional.pad(k, (0, 0, 0, npg * page - sk)).view(b, hk, npg, page, d).permute(0, 2, 3, 1, 4)
        vp = torch.nn.functional.pad(v, (0, 0, 0, npg * page - sk)).view(b, hk, npg, page, d).permute(0, 2, 3, 1, 4)
        kc[table.long().flatten()] = kp.reshape(b * npg, page, hk, d)
        vc[table.long().flatten()] = vp.reshape(b * npg, page, hk, d)
        o, lse = paged_decode(q, kc, vc, table, sl, return_lse=True)
    ro, rl = ref_attention(q.cpu(), k.cpu(), v.cpu(), seqlens_k=sl.cpu(), align="bottom_right")
    assert rel_err(o.cpu(), ro) < 2e-2
    assert rel_err(lse.cpu(), rl) < 1e-3
