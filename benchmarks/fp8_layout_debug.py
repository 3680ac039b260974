"""Isolate fp8 forward failures on the GPU: each (layout, variant, V layout) case runs in its
own process with CUDA_LAUNCH_BLOCKING=1, so one illegal instruction cannot poison the rest.

    python benchmarks/fp8_layout_debug.py
"""
import itertools
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

CASE = r'''
import sys, torch
from ck_fmha.backends.triton import TritonFmhaConfig, fwd, v_key_major
layout, variant, vt = sys.argv[1], sys.argv[2], sys.argv[3]
f8 = torch.float8_e4m3fn
g = torch.Generator(device="cuda").manual_seed(3)
b, h, hk, s, d = 2, 8, 2, 400, 128
kw = dict(causal=True, config=TritonFmhaConfig(128, 64, 4, 2, variant), q_descale=0.5, k_descale=1.5,
          v_descale=0.8, layout=layout)
if layout == "thd":
    cu = torch.tensor([0, 150, 400], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(s, n, d, device="cuda", generator=g).to(f8) for n in (h, hk, hk))
    kw.update(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=250, max_seqlen_k=250)
else:
    q, k, v = (torch.randn(b, n, s, d, device="cuda", generator=g).to(f8) for n in (h, hk, hk))
if vt == "vk":
    vk = v_key_major(v, layout); torch.cuda.synchronize(); print("v_key_major ok", flush=True)
    o = fwd(q, k, vk, **kw)
else:
    o = fwd(q, k, v, fp8_v_trans=(vt == "copy"), **kw)
torch.cuda.synchronize()
print("OK", float(o.float().abs().mean()))
'''


def one(args):
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    r = subprocess.run([sys.executable, "-c", CASE, *args], capture_output=True, text=True, env=env, timeout=240)
    tail = (r.stdout + r.stderr).strip().splitlines()
    err = [ln for ln in tail if "Error" in ln or "error" in ln][-1:] or tail[-1:]
    return args, r.returncode, err


cases = list(itertools.product(["thd", "bhsd"], ["ptr", "tma", "tma_host"], ["row", "copy", "vk"]))
with ThreadPoolExecutor(6) as ex:
    for args, rc, err in ex.map(one, cases):
        print(" ".join(args).ljust(24), "rc", rc, (err[0] if err else "")[:200], flush=True)
