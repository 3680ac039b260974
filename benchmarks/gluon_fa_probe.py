"""Probe the Gluon sm90 attention forward (ck_fmha.backends.triton.gluon_fwd) on the H100.

    python benchmarks/gluon_fa_probe.py --out $OUT/gluon_probe.json [--quick]

1. correctness: small odd-batch cases (bf16/fp16, bhsd/bshd, causal, GQA, D 64/128) against a float64
   softmax, rel l2 of o and of the LSE; a poisoned output buffer (NaN) is passed in.
2. speed: the issue's forward cases (B, H, S) x D {64, 128} x causal, bf16, for a few tiles, against
   torch SDPA (cuDNN backend) and our Triton forward (launcher default), CUDA-graph medians
   (``triton.testing.do_bench_cudagraph``).  TFLOPS count 4*B*H*S^2*D, half when causal.
Every row is caught on its own (a failing tile is recorded with its error); the JSON is rewritten
after each row.
"""
import argparse
import json
import math
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (os.path.join(ROOT, "plugins", "fmha"), ROOT):
    if p not in sys.path:
        sys.path.insert(0, p)

CASES = [(16, 16, 1024), (8, 16, 4096), (2, 16, 16384), (32, 32, 512)]
# (BLOCK_N, stages, variant) of the warp-specialised kernel (BLOCK_M 128, 12 warps)
TILES = {128: [(128, 2, "gluon_wspp_pers"), (128, 2, "gluon_ws_pers"), (64, 4, "gluon_ws_pers"),
               (64, 4, "gluon_wspp_pers")],
         64: [(128, 3, "gluon_ws_pers"), (128, 3, "gluon_wspp_pers"), (64, 4, "gluon_ws_pers"),
              (64, 4, "gluon_wspp_pers"), (64, 3, "gluon_ws_pers"), (64, 4, "gluon_ws"), (64, 6, "gluon_ws_pers")]}


def _timed(res, dump, row, fn, flops, unit):
    """One timing row (CUDA-graph median); an exception is recorded in the row, not raised."""
    import torch
    import triton
    try:
        fn()
        torch.cuda.synchronize()
        ms = triton.testing.do_bench_cudagraph(fn, rep=40)
        row.update({"ms": ms, unit: flops / ms * 1e-9})
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {e}"[:1500]
    print(row, flush=True)
    res["speed"].append(row)
    dump()
    return row


def _failed(row, e):
    row["error"] = f"{type(e).__name__}: {e}"[:2000]
    traceback.print_exc()


def _check_row(res, dump, row):
    print(row, flush=True)
    res["check"].append(row)
    dump()


def ref_attention(q, k, v, causal, scale, layout):
    import torch
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, 1)
    v = v.repeat_interleave(g, 1)
    s = torch.einsum("bhqd,bhkd->bhqk", q.double(), k.double()) * scale
    if causal:
        sq, sk = s.shape[-2:]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.softmax(s, -1) @ v.double()
    if layout == "bshd":
        o = o.transpose(1, 2)
    return o, lse


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gluon_probe.json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--causal", choices=("both", "only", "no"), default="both")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--hdims", default="128,64", help="head dims of the speed part")
    ap.add_argument("--seqs", default="", help="only these sequence lengths in the speed part (e.g. 512,1024)")
    ap.add_argument("--bwd", action="store_true", help="probe the Gluon dQ pass instead of the forward")
    ap.add_argument("--fused", action="store_true",
                    help="probe the dK/dV kernel with dQ fused in (non-deterministic backward) instead")
    args = ap.parse_args()
    import torch
    import triton
    from ck_fmha.backends.triton import gluon_fwd as G
    from ck_fmha.backends.triton import launch as ops
    res = dict(device=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d"), check=[], speed=[])

    def dump():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    torch.manual_seed(0)
    if args.bwd:
        return probe_bwd(args, res, dump)
    if args.fused:
        return probe_fused(args, res, dump)
    checks = [(3, 4, 2, 384, 128, "bhsd", False, torch.bfloat16), (3, 4, 4, 256, 64, "bshd", True, torch.float16),
              (2, 8, 2, 512, 128, "bshd", True, torch.bfloat16), (1, 2, 2, 640, 64, "bhsd", False, torch.bfloat16),
              (3, 8, 2, 1024, 128, "bhsd", True, torch.bfloat16), (2, 6, 6, 1152, 64, "bshd", True, torch.float16)]
    for (b, h, hk, s, d, layout, causal, dt) in ([] if args.no_check else checks):
        row = dict(b=b, h=h, hk=hk, s=s, d=d, layout=layout, causal=causal, dtype=str(dt))
        try:
            shp = lambda hh: (b, hh, s, d) if layout == "bhsd" else (b, s, hh, d)
            q = torch.randn(shp(h), device="cuda", dtype=dt)
            k = torch.randn(shp(hk), device="cuda", dtype=dt)
            v = torch.randn(shp(hk), device="cuda", dtype=dt)
            out = torch.full_like(q, float("nan"))
            for tile in TILES[d]:
                t4 = (128, tile[0], 12, tile[1])
                if G.unsupported_reason(q, k, v, causal=causal, layout=layout, tile=t4):
                    continue
                o, lse = G.fwd(q, k, v, causal=causal, layout=layout, return_lse=True, tile=t4, out=out,
                               **G.GLUON_VARIANTS[tile[2]])
                ro, rl = ref_attention(q, k, v, causal, 1 / math.sqrt(d), layout)
                row[f"err_o_{tile}"] = rel(o, ro)
                row[f"err_lse_{tile}"] = rel(lse, rl)
                out.fill_(float("nan"))
        except Exception as e:
            _failed(row, e)
        _check_row(res, dump, row)

    from torch.nn.attention import sdpa_kernel, SDPBackend
    F = torch.nn.functional
    cases = CASES[1:2] if args.quick else CASES
    if args.seqs:
        cases = [c for c in cases if str(c[2]) in args.seqs.split(",")]
    for (b, h, s) in cases:
        for d in (int(x) for x in args.hdims.split(",")):
            for causal in {"both": (False, True), "only": (True, ), "no": (False, )}[args.causal]:
                q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
                base = dict(b=b, h=h, s=s, d=d, causal=causal)

                def timeit(name, fn):
                    return _timed(res, dump, dict(base, kind=name), fn, flops, "tflops")

                def cudnn():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                timeit("sdpa_cudnn", cudnn)
                for tile in TILES[d]:
                    o = torch.empty_like(q)
                    timeit(f"{tile[2]}/n{tile[0]}s{tile[1]}",
                           lambda: G.fwd(q, k, v, causal=causal, return_lse=True, tile=(128, tile[0], 12, tile[1]),
                                         out=o, **G.GLUON_VARIANTS[tile[2]]))
    dump()


def _bwd_inputs(b, h, hk, s, d, layout, dt):
    """q, k, v, dO (random normal) in ``layout``; k/v with ``hk`` heads."""
    import torch
    shp = lambda hh: (b, hh, s, d) if layout == "bhsd" else (b, s, hh, d)
    return tuple(torch.randn(shp(x), device="cuda", dtype=dt) for x in (h, hk, hk, h))


def _bwd_checks():
    """(b, h, hk, s, d, layout, causal, dtype) of the backward correctness rows."""
    import torch
    return [(3, 4, 2, 384, 128, "bhsd", False, torch.bfloat16), (2, 6, 6, 512, 64, "bshd", True, torch.float16),
            (3, 8, 2, 1024, 128, "bhsd", True, torch.bfloat16), (2, 4, 4, 256, 64, "bhsd", False, torch.bfloat16),
            (1, 4, 1, 640, 128, "bshd", True, torch.float16)]


DKDV_TILES = {128: [(64, 2, True), (64, 2, False), (64, 3, True)],
              64: [(64, 3, True), (64, 4, True), (128, 2, True)]}
DQ_TILES = {128: [(64, 3, True), (64, 3, False), (64, 4, True), (128, 2, True)],
            64: [(64, 3, True), (64, 4, True), (128, 2, True), (128, 3, True)]}


def probe_bwd(args, res, dump):
    """dQ pass: correctness against float64 autograd, then bwd_dq_dk_dv with the Triton dQ kernel,
    the Gluon one and none (dK/dV alone), and the Gluon dQ kernel alone per tile."""
    import torch
    import triton
    from ck_fmha.backends.triton import gluon_bwd as GB
    from ck_fmha.backends.triton import launch as ops

    inputs = _bwd_inputs
    for (b, h, hk, s, d, layout, causal, dt) in ([] if args.no_check else _bwd_checks()[:4]):
        row = dict(b=b, h=h, hk=hk, s=s, d=d, layout=layout, causal=causal, dtype=str(dt))
        try:
            q, k, v, do = inputs(b, h, hk, s, d, layout, dt)
            o, lse = ops.fwd(q, k, v, causal=causal, layout=layout, return_lse=True)
            delta = ops.bwd_dot_do_o(o, do, layout=layout)
            q64 = q.double().requires_grad_()
            ro, _ = ref_attention(q64, k, v, causal, 1 / math.sqrt(d), layout)
            ro.backward(do.double() if layout == "bhsd" else do.double())
            for t in DQ_TILES[d]:
                dqg = GB.dq(q, k, v, do, lse, delta, causal=causal, layout=layout, tile=t,
                            out=torch.full_like(q, float("nan")))
                row[f"err_dq_{t}"] = rel(dqg, q64.grad)
            dqt = ops.bwd_dq_dk_dv(q, k, v, do, lse, delta, causal=causal, layout=layout, _dq="triton")[0]
            row["err_dq_triton"] = rel(dqt, q64.grad)
            k64, v64 = k.double().requires_grad_(), v.double().requires_grad_()
            ro2, _ = ref_attention(q.double(), k64, v64, causal, 1 / math.sqrt(d), layout)
            ro2.backward(do.double())
            for t in DKDV_TILES[d]:
                dk, dv = GB.dkdv(q, k, v, do, lse, delta, causal=causal, layout=layout, tile=t)
                row[f"err_dk_{t}"] = rel(dk, k64.grad)
                row[f"err_dv_{t}"] = rel(dv, v64.grad)
            _, _, dk, dv = ops.bwd_dq_dk_dv(q, k, v, do, lse, delta, causal=causal, layout=layout, _dkdv="triton")
            row["err_dk_triton"], row["err_dv_triton"] = rel(dk, k64.grad), rel(dv, v64.grad)
        except Exception as e:
            _failed(row, e)
        _check_row(res, dump, row)

    for (b, h, s) in CASES:
        for d in (128, 64):
            for causal in {"both": (False, True), "only": (True, ), "no": (False, )}[args.causal]:
                q, k, v, do = inputs(b, h, h, s, d, "bhsd", torch.bfloat16)
                o, lse = ops.fwd(q, k, v, causal=causal, return_lse=True)
                delta = ops.bwd_dot_do_o(o, do)
                flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)   # forward flops; dQ pass: 1.5x this
                base = dict(b=b, h=h, s=s, d=d, causal=causal)

                def timeit(name, fn):
                    return _timed(res, dump, dict(base, kind=name), fn, flops, "fwd_tflops")

                for mode in ("triton", "gluon"):
                    timeit(f"dqdkdv/dkdv_{mode}",
                           lambda: ops.bwd_dq_dk_dv(q, k, v, do, lse, delta, causal=causal, _dkdv=mode))
                timeit("dkdv_only/triton", lambda: ops.bwd_dq_dk_dv(q, k, v, do, lse, delta, causal=causal,
                                                                    _dq="none", _dkdv="triton"))
                for t in DKDV_TILES[d]:
                    timeit(f"gluon_dkdv{t}", lambda: GB.dkdv(q, k, v, do, lse, delta, causal=causal, tile=t))
    dump()


FUSED_TILES = {128: [(64, 2, True), (64, 2, False)],
               64: [(64, 3, True), (64, 3, False), (64, 4, True), (64, 4, False)]}



def probe_fused(args, res, dump):
    """dK/dV with dQ fused in (gluon_bwd.dkdv(dq_acc=...)): dq/dk/dv against float64 autograd per tile,
    then whole backwards (ops.bwd, deterministic and not, CUDA-graph medians) per case, with the cuDNN
    SDPA backward (autograd.grad, eager do_bench) and ours eager for the ratio."""
    import torch
    import triton
    from ck_fmha.bench import peer_callable
    from ck_fmha.backends.triton import gluon_bwd as GB
    from ck_fmha.backends.triton import launch as ops

    inputs = _bwd_inputs
    for (b, h, hk, s, d, layout, causal, dt) in ([] if args.no_check else _bwd_checks()):
        row = dict(b=b, h=h, hk=hk, s=s, d=d, layout=layout, causal=causal, dtype=str(dt))
        try:
            q, k, v, do = inputs(b, h, hk, s, d, layout, dt)
            o, lse = ops.fwd(q, k, v, causal=causal, layout=layout, return_lse=True)
            delta = ops.bwd_dot_do_o(o, do, layout=layout)
            q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
            ro, _ = ref_attention(q64, k64, v64, causal, 1 / math.sqrt(d), layout)
            ro.backward(do.double())
            for t in FUSED_TILES[d]:
                dqa = torch.zeros(b, h, s, d, device="cuda", dtype=torch.float32)
                dk, dv = GB.dkdv(q, k, v, do, lse, delta, causal=causal, layout=layout, tile=t, dq_acc=dqa)
                dq = ops.bwd_convert_dq(dqa, q, layout=layout)
                row[f"err_{t}"] = [rel(dq, q64.grad), rel(dk, k64.grad), rel(dv, v64.grad)]
            dq, dk, dv = ops.bwd(q, k, v, o, lse, do, causal=causal, layout=layout, deterministic=False)
            row["err_ops_nondet"] = [rel(dq, q64.grad), rel(dk, k64.grad), rel(dv, v64.grad)]
            dq, dk, dv = ops.bwd(q, k, v, o, lse, do, causal=causal, layout=layout, deterministic=True)
            row["err_ops_det"] = [rel(dq, q64.grad), rel(dk, k64.grad), rel(dv, v64.grad)]
        except Exception as e:
            _failed(row, e)
        _check_row(res, dump, row)

    cases = CASES[1:3] if args.quick else CASES
    for (b, h, s) in cases:
        for d in (int(x) for x in args.hdims.split(",")):
            for causal in {"both": (False, True), "only": (True, ), "no": (False, )}[args.causal]:
                q, k, v, do = inputs(b, h, h, s, d, "bhsd", torch.bfloat16)
                o, lse = ops.fwd(q, k, v, causal=causal, return_lse=True)
                delta = ops.bwd_dot_do_o(o, do)
                flops = 2.5 * 4 * b * h * s * s * d * (0.5 if causal else 1.0)
                base = dict(b=b, h=h, s=s, d=d, causal=causal)

                def timeit(name, fn):
                    return _timed(res, dump, dict(base, kind=name), fn, flops, "tflops")

                def eager(name, fn):
                    row = dict(base, kind=name)
                    try:
                        fn()
                        ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
                        row.update(ms=ms, tflops=flops / ms * 1e-9)
                    except Exception as e:
                        row["error"] = f"{type(e).__name__}: {e}"[:1500]
                    print(row, flush=True)
                    res["speed"].append(row)
                    return row

                task = dict(group="bwd", b=b, hq=h, hk=h, s=s, d=d, causal=causal)
                peer, _ = peer_callable(task, "cudnn", (q, k, v))
                eager("sdpa_cudnn_eager", peer)
                del peer
                eager("ours_det_eager", lambda: ops.bwd(q, k, v, o, lse, do, causal=causal, deterministic=True))
                eager("ours_nondet_eager", lambda: ops.bwd(q, k, v, o, lse, do, causal=causal, deterministic=False))
                timeit("ours_det", lambda: ops.bwd(q, k, v, o, lse, do, causal=causal, deterministic=True))
                for t in FUSED_TILES[d]:
                    def fused(t=t):
                        dqa = torch.zeros(b, h, s, d, device="cuda", dtype=torch.float32)
                        GB.dkdv(q, k, v, do, lse, delta, causal=causal, tile=t, dq_acc=dqa)
                        return dqa
                    timeit(f"fused_dkdv{t}", fused)
                    timeit(f"dkdv{t}", lambda: GB.dkdv(q, k, v, do, lse, delta, causal=causal, tile=t))
                timeit("dkdv_triton", lambda: ops.bwd_dq_dk_dv(q, k, v, do, lse, delta, causal=causal, _dq="none",
                                                                _dkdv="triton"))
                torch.cuda.empty_cache()
    dump()


if __name__ == "__main__":
    main()
