"""ck_fmha.attention through the Dispatcher vs the kernel-direct launch of the same kernels (GPU).

For a few shapes: the plan's keys, whether the kernel-direct default choice (ops.fwd / ops.bwd
without a config: the tables as the launcher read them before the Dispatcher path) is the same
kernel, the time per call of both (eager, CUDA events), and the host time of a warm call on a
launch-bound shape.  Usage: python benchmarks/fmha_api_path.py [--out result.json]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

import ck_fmha
from ck_core import api
from ck_fmha.api import _problem
from ck_fmha.backends.triton import launch as ops

SHAPES = [  # (batch, heads, seqlen, hdim, causal)
    (4, 16, 1024, 128, False), (4, 16, 1024, 128, True), (2, 16, 4096, 64, True), (8, 16, 512, 64, False),
    (2, 8, 1000, 96, True),
]


def _ms(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


def _host_us(fn, reps=200):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    host = (time.perf_counter() - t) / reps * 1e6
    torch.cuda.synchronize()
    return host


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rows = []
    for b, h, s, d, causal in SHAPES:
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        do = torch.randn_like(q)
        p, disp = _problem(q, k, v, None, None, None, None, None, causal, None, (-1, -1), 0.0, "bhsd", 0.0, 0, 0,
                           None, None)
        plan = disp.plan(p)
        key = plan.stages[0].key
        with torch.no_grad():
            o, lse = ops.fwd(q, k, v, causal=causal, return_lse=True)
        direct_cfg = ops.default_fwd_choice(q, k, v, d, d, s, v_trans=False, varlen=False, layout="bhsd",
                                            mode=1 if causal else 0, left=0, right=0, softcap=0.0, bias=None,
                                            alibi_slopes=None, dropout_p=0.0, sink=None, sink_tokens=0, out=None,
                                            fp8=False, out_dtype=None, paged=None)
        cfg = key.algorithm.config()
        with torch.no_grad():
            new_fwd = _ms(lambda: ck_fmha.attention(q, k, v, causal=causal))
            old_fwd = _ms(lambda: ops.fwd(q, k, v, causal=causal, config=cfg))

        def new_train():
            ck_fmha.attention(q, k, v, causal=causal).backward(do)

        def old_train():
            o, lse = ops.fwd(q, k, v, causal=causal, return_lse=True, config=cfg)
            ops.bwd(q, k, v, o, lse, do, causal=causal)

        new_fb, old_fb = _ms(new_train, 10), _ms(old_train, 10)
        import attrs
        bplan = disp.plan(attrs.evolve(p, family="bwd_dq_dk_dv", lse=False, deterministic=True))
        rows.append(dict(shape=[b, h, s, d, causal], fwd_key=key.name, bwd_keys=[st.key.name for st in bplan.stages],
                         direct_default_same=direct_cfg == cfg, direct_default=str(direct_cfg),
                         fwd_ms_api=round(new_fwd, 4), fwd_ms_direct=round(old_fwd, 4),
                         fwd_bwd_ms_api=round(new_fb, 4), fwd_bwd_ms_direct=round(old_fb, 4)))
        print(json.dumps(rows[-1]), flush=True)
    q, k, v = (torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    with torch.no_grad():
        host_api = _host_us(lambda: ck_fmha.attention(q, k, v))
        cfg = ops.default_fwd_choice(q, k, v, 64, 64, 128, v_trans=False, varlen=False, layout="bhsd", mode=0, left=0,
                                     right=0, softcap=0.0, bias=None, alibi_slopes=None, dropout_p=0.0, sink=None,
                                     sink_tokens=0, out=None, fp8=False, out_dtype=None, paged=None)
        host_direct = _host_us(lambda: ops.fwd(q, k, v, config=cfg))
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    host_api_grad = _host_us(lambda: ck_fmha.attention(qg, kg, vg), 100)
    over = dict(host_us_api_fwd=round(host_api, 1), host_us_direct_fwd=round(host_direct, 1),
                host_us_api_fwd_with_autograd_record=round(host_api_grad, 1))
    print(json.dumps(over), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(rows=rows, overhead=over, device=torch.cuda.get_device_name()), f, indent=1)
    api.clear()


if __name__ == "__main__":
    main()
