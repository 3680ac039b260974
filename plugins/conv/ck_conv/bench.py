"""Grouped convolution: ck-conv's Triton kernels vs cuDNN (through PyTorch), fp16.

Same process, same inputs.  Per case and direction: the reference is PyTorch in
fp32 (TF32 off) on the upcast inputs; ours and cuDNN are both checked against
it (relative Frobenius error) before timing.  Times are medians of CUDA-graph
replays (``triton.testing.do_bench_cudagraph``), so Python launch overhead is
out of both numbers.  cuDNN runs with ``torch.backends.cudnn.benchmark = True``
on channels_last tensors; backward goes through ``torch.nn.grad.conv{2,3}d_input``
and ``conv{2,3}d_weight`` (aten's convolution_backward).

Ours = the fastest of ck_conv.heuristics.candidate_configs (a short tuning list,
heuristic pick first); the heuristic pick's own number is in the JSON too.
Kernels are compiled first in a pool of worker processes so that the timing
loop only loads them from Triton's disk cache.

    ck bench conv --vs torch --json $OUT/conv.json        # (or python -m ck_conv.bench --json ...)
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time

from ck_core.progress import Progress

DIRECTIONS = ("forward", "bwd_data", "bwd_weight")

# name, N, G, C, K, spatial, filter, stride, pad
CASES = [
    ("r50_c2_1x1_64_64_56", 32, 1, 64, 64, (56, 56), (1, 1), 1, 0),
    ("r50_c2_3x3_64_64_56", 32, 1, 64, 64, (56, 56), (3, 3), 1, 1),
    ("r50_c2_1x1_64_256_56", 32, 1, 64, 256, (56, 56), (1, 1), 1, 0),
    ("r50_c3_3x3_128_128_28", 32, 1, 128, 128, (28, 28), (3, 3), 1, 1),
    ("r50_c3_1x1s2_256_512_56", 32, 1, 256, 512, (56, 56), (1, 1), 2, 0),
    ("r50_c4_3x3_256_256_14", 32, 1, 256, 256, (14, 14), (3, 3), 1, 1),
    ("r50_c4_1x1_1024_256_14", 32, 1, 1024, 256, (14, 14), (1, 1), 1, 0),
    ("r50_c5_3x3_512_512_7", 32, 1, 512, 512, (7, 7), (3, 3), 1, 1),
    ("resnext_g32_3x3_512_14", 32, 32, 512, 512, (14, 14), (3, 3), 1, 1),
    ("depthwise_3x3_144_56", 32, 144, 144, 144, (56, 56), (3, 3), 1, 1),
    ("c3d_3x3x3_64_64_16x56x56", 8, 1, 64, 64, (16, 56, 56), (3, 3, 3), 1, 1),
    ("r3d_3x3x3_256_256_8x28x28", 8, 1, 256, 256, (8, 28, 28), (3, 3, 3), 1, 1),
]


def problem(case, direction):
    from ck_conv import ConvProblem
    name, n, g, c, k, sp, fl, st, pd = case
    return ConvProblem(N=n, G=g, C=c, K=k, input_spatial=sp, filter=fl, stride=st, pad_left=pd, pad_right=pd,
                       direction=direction, dtype="fp16", split_k=0 if direction == "bwd_weight" else 1)


def torch_operands(case, seed=0):
    """Channels-last torch tensors (x, w, dy) and ck-conv views of the same memory."""
    import torch
    name, n, g, c, k, sp, fl, st, pd = case
    nd = len(sp)
    p = problem(case, "forward")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    mf = torch.channels_last if nd == 2 else torch.channels_last_3d
    x = torch.randn((n, c) + sp, device="cuda", generator=gen, dtype=torch.float16).to(memory_format=mf)
    w = (torch.randn((k, c // g) + fl, device="cuda", generator=gen, dtype=torch.float16)
         / math.sqrt(c // g * math.prod(fl))).to(memory_format=mf)
    dy = torch.randn((n, k) + p.output_spatial, device="cuda", generator=gen,
                     dtype=torch.float16).to(memory_format=mf)
    return x, w, dy


def to_ours(t, g, kind):
    nd = t.dim() - 2
    perm = (0,) + tuple(range(2, 2 + nd)) + (1,)
    v = t.permute(*perm)
    if kind == "w":
        return v.reshape((g, v.shape[0] // g) + tuple(v.shape[1:]))
    return v.unflatten(-1, (g, v.shape[-1] // g))


def from_ours(t, kind):
    """Back to a torch-shaped tensor (N, C, *sp) or (K, C/G, *flt)."""
    if kind == "w":
        t = t.flatten(0, 1)
    else:
        t = t.flatten(-2, -1)
    nd = t.dim() - 2
    return t.permute(0, nd + 1, *range(1, nd + 1))


def torch_fns(case, direction, x, w, dy, autograd=False):
    """cuDNN through PyTorch.  Backward: ``torch.nn.grad.conv*d_input/_weight``, or with
    ``autograd=True`` aten's convolution_backward on the real tensors (what autograd
    runs; conv*d_input passes an expanded dummy input, which can lose channels_last)."""
    import torch
    import torch.nn.functional as F
    name, n, g, c, k, sp, fl, st, pd = case
    nd = len(sp)
    conv = F.conv2d if nd == 2 else F.conv3d
    gin = torch.nn.grad.conv2d_input if nd == 2 else torch.nn.grad.conv3d_input
    gw = torch.nn.grad.conv2d_weight if nd == 2 else torch.nn.grad.conv3d_weight
    cb = torch.ops.aten.convolution_backward
    args = ([st] * nd, [pd] * nd, [1] * nd, False, [0] * nd, g)
    if direction == "forward":
        return lambda: conv(x, w, stride=st, padding=pd, groups=g)
    if direction == "bwd_data":
        if autograd:
            return lambda: cb(dy, x, w, None, *args, (True, False, False))[0]
        return lambda: gin(x.shape, w, dy, stride=st, padding=pd, groups=g)
    if autograd:
        return lambda: cb(dy, x, w, None, *args, (False, True, False))[1]
    return lambda: gw(x, w.shape, dy, stride=st, padding=pd, groups=g)


def rel_err(a, b):
    a = a.double()
    b = b.double()
    if not bool(a.isfinite().all()):
        return float("inf")
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _compile_task(task):
    """Worker: run each config once on the case's real shapes (fills Triton's disk cache)."""
    import torch
    from ck_conv.heuristics import named_split
    from ck_conv.keys import ConvKernelConfig
    from ck_conv.backends.triton.launch import run
    from ck_core.device import current_arch

    arch = current_arch(torch.device("cuda"))
    ci, direction, names = task
    case = CASES[ci]
    p = problem(case, direction)
    x, w, dy = torch_operands(case)
    g = case[2]
    ops = {"forward": {"x": to_ours(x, g, "x"), "w": to_ours(w, g, "w")},
           "bwd_data": {"dy": to_ours(dy, g, "x"), "w": to_ours(w, g, "w")},
           "bwd_weight": {"x": to_ours(x, g, "x"), "dy": to_ours(dy, g, "x")}}[direction]
    res = []
    for nm in names:
        t = time.time()
        try:
            cfg, q = named_split(ConvKernelConfig.from_name(nm), p, arch)
            run(q, ops, cfg)
            torch.cuda.synchronize()
            res.append((nm, None, time.time() - t))
        except Exception as e:  # a config that fails to compile times as infinity
            res.append((nm, f"{type(e).__name__}: {str(e)[:200]}", time.time() - t))
    return ci, direction, res


def main(argv=None, progress=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--limit", type=int, default=None, help="candidates per case and direction")
    ap.add_argument("--cases", default=None, help="comma-separated case names")
    ap.add_argument("--directions", default=",".join(DIRECTIONS))
    args = ap.parse_args(argv)

    import torch
    import triton
    from triton.testing import do_bench_cudagraph
    from ck_conv.heuristics import candidate_configs, named_split
    from ck_conv.backends.triton.launch import run
    from ck_core.device import current_arch

    arch = current_arch(torch.device("cuda"))  # the lists plan waves for this GPU's SMs

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    cases = [c for c in CASES if not args.cases or c[0] in args.cases.split(",")]
    dirs = args.directions.split(",")

    # 1. compile every candidate in parallel
    t0 = time.time()
    tasks = []
    cands = {}
    for c in cases:
        ci = CASES.index(c)
        for d in dirs:
            cl = candidate_configs(problem(c, d), args.limit, arch=arch)
            cands[(ci, d)] = cl
            # chunks of a few launches, so that the long lists (c4/c5: 20) spread over the pool
            for i in range(0, len(cl), 6):
                tasks.append((ci, d, [x.name for x in cl[i:i + 6]]))
    failed = {}
    if args.workers > 1:
        import concurrent.futures as cf
        import multiprocessing as mp
        with cf.ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn")) as ex:
            for ci, d, res in ex.map(_compile_task, tasks):
                for nm, err, dt in res:
                    if err:
                        failed[nm] = err
                        print(f"compile/run failed {nm}: {err}", file=sys.stderr)
    print(f"# compiled {sum(len(t[2]) for t in tasks)} candidates in {time.time() - t0:.1f}s", file=sys.stderr)

    # 2. check and time (a bar on a terminal, a line every 30 s in a log; ck bench -q silences it)
    rows = []
    for c in (progress or Progress)(len(cases), "ck bench conv").each(cases, lambda c: c[0]):
        ci = CASES.index(c)
        g = c[2]
        x, w, dy = torch_operands(c, seed=ci + 1)
        for d in dirs:
            p = problem(c, d)
            peer = torch_fns(c, d, x, w, dy)
            ref = torch_fns(c, d, x.float(), w.float(), dy.float())()
            ops = {"forward": {"x": to_ours(x, g, "x"), "w": to_ours(w, g, "w")},
                   "bwd_data": {"dy": to_ours(dy, g, "x"), "w": to_ours(w, g, "w")},
                   "bwd_weight": {"x": to_ours(x, g, "x"), "dy": to_ours(dy, g, "x")}}[d]
            kind = {"forward": "x", "bwd_data": "x", "bwd_weight": "w"}[d]
            err_peer = rel_err(peer(), ref)
            t_peer = do_bench_cudagraph(peer, return_mode="median")
            peer_name = "cuDNN via torch.nn.grad.conv%dd_%s" % (p.ndim, "input" if d == "bwd_data" else "weight") \
                if d != "forward" else "cuDNN via F.conv%dd" % p.ndim
            peer_times = {peer_name: t_peer}
            if d != "forward":
                peer2 = torch_fns(c, d, x, w, dy, autograd=True)
                e2 = rel_err(peer2(), ref)
                t2 = do_bench_cudagraph(peer2, return_mode="median")
                peer_times["cuDNN via aten.convolution_backward (autograd)"] = t2
                if t2 < t_peer:
                    t_peer, err_peer, peer_name = t2, e2, "cuDNN via aten.convolution_backward (autograd)"
            best = None
            heur = None
            errs = {}

            def ours(cfg, split=None):
                c_, q = named_split(cfg, p, arch, split)
                return lambda: run(q, ops, c_)

            for i, cfg in enumerate(cands[(ci, d)]):
                if cfg.name in failed:
                    continue
                fn = ours(cfg)
                try:
                    out = fn()
                    e = rel_err(from_ours(out, kind), ref)
                except Exception as ex:  # pragma: no cover - GPU only
                    print(f"run failed {cfg.name}: {ex}", file=sys.stderr)
                    continue
                errs[cfg.name] = e
                if not e < 1e-2:
                    print(f"WRONG {c[0]} {d} {cfg.name}: rel err {e:.3e}", file=sys.stderr)
                    continue
                t = do_bench_cudagraph(fn, return_mode="median")
                if i == 0:
                    heur = (cfg.name, t)
                if best is None or t < best[1]:
                    best = (cfg.name, t, e, None, cfg)
            if best is not None:  # tune the reduction split of the winner
                from ck_conv.heuristics import auto_split_k
                if d == "bwd_weight":
                    from ck_core.device import current_arch

                    a = auto_split_k(p, best[4], current_arch(torch.device("cuda", 0)).compute_units)
                    splits = sorted({max(1, a // 2), a * 2, 1} - {a})
                else:
                    splits = [1, 2, 4, 8]
                for sp_ in splits:
                    fn = ours(best[4], sp_)
                    try:
                        e = rel_err(from_ours(fn(), kind), ref)
                    except Exception as ex:  # pragma: no cover
                        print(f"run failed {best[0]} split {sp_}: {ex}", file=sys.stderr)
                        continue
                    if not e < 1e-2:
                        print(f"WRONG {c[0]} {d} {best[0]} split {sp_}: rel err {e:.3e}", file=sys.stderr)
                        continue
                    t = do_bench_cudagraph(fn, return_mode="median")
                    if t < best[1]:
                        best = (best[0], t, e, sp_, best[4])
            fl = p.flops
            row = {"case": c[0], "direction": d, "unit": "TFLOPS", "peer_name": peer_name,
                   "peer": fl / t_peer / 1e9, "peer_ms": t_peer, "peer_rel_err": err_peer, "gflop": fl / 1e9,
                   "peer_ms_all": peer_times}
            if best:
                row.update(ours=fl / best[1] / 1e9, ours_ms=best[1], ours_kernel=best[0], ours_rel_err=best[2],
                           ours_split=best[3], ratio=t_peer / best[1], ok=True)
            else:
                row.update(ours=None, ratio=None, ok=False)
            if heur:
                row.update(ours_heuristic_kernel=heur[0], ours_heuristic=fl / heur[1] / 1e9,
                           ratio_heuristic=t_peer / heur[1])
            row["candidates_rel_err"] = errs
            rows.append(row)
            print(f"{c[0]:28s} {d:10s} ours {row.get('ours') or 0:7.1f} cudnn {row['peer']:7.1f} TFLOPS "
                  f"ratio {row.get('ratio') or 0:5.2f}  heur {row.get('ratio_heuristic') or 0:5.2f}  "
                  f"err {row.get('ours_rel_err', float('nan')):.1e}/{err_peer:.1e}  {row.get('ours_kernel', '-')} "
                  f"split={row.get('ours_split')}",
                  flush=True)

    geo = {}
    for d in dirs:
        rs = [r["ratio"] for r in rows if r["direction"] == d and r.get("ratio")]
        hs = [r["ratio_heuristic"] for r in rows if r["direction"] == d and r.get("ratio_heuristic")]
        geo[d] = {"geomean_ratio": math.exp(sum(map(math.log, rs)) / len(rs)) if rs else None,
                  "geomean_ratio_heuristic": math.exp(sum(map(math.log, hs)) / len(hs)) if hs else None,
                  "cases": len(rs), "all_ok": all(r["ok"] for r in rows if r["direction"] == d)}
    meta = {"device": torch.cuda.get_device_name(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "command": "PYTHONPATH=plugins/conv:. python " + " ".join([sys.argv[0]] + (argv or sys.argv[1:])),
            "torch": torch.__version__, "triton": triton.__version__,
            "cudnn": torch.backends.cudnn.version(), "dtype": "fp16", "geomean": geo,
            "timing": "median of CUDA-graph replays, triton.testing.do_bench_cudagraph"}
    print("# geomean ratio (ours/cuDNN throughput):",
          {d: round(v["geomean_ratio"] or 0, 3) for d, v in geo.items()},
          "heuristic:", {d: round(v["geomean_ratio_heuristic"] or 0, 3) for d, v in geo.items()})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def bench(peer: str, options: dict) -> dict:
    """``ck bench conv --vs torch``: run the suite, return rows in the common format."""
    import tempfile

    from ck_core.errors import UnsupportedProblem

    if peer not in ("torch", "cudnn"):
        raise UnsupportedProblem(f"conv benchmarks compare with 'torch' (cuDNN), not {peer!r}")
    argv = ["--workers", str(options.get("workers") or min(os.cpu_count() or 2, 15))]
    if options.get("quick"):
        argv += ["--cases", "r50_c2_3x3_64_64_56,r50_c2_1x1_64_256_56", "--limit", "2"]
    if options.get("cases"):
        argv += ["--cases", str(options["cases"])]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "conv.json")
        main(argv + ["--json", path], progress=options.get("progress"))
        with open(path) as f:
            raw = json.load(f)
    rows = []
    for r in raw["rows"]:
        rows.append({"group": r["direction"], "case": f"{r['case']} {r['direction']}",
                     "ours": round(r["ours"], 1) if r.get("ours") else None, "peer": round(r["peer"], 1),
                     "peer_name": r["peer_name"], "unit": "TFLOPS",
                     "ratio": round(r["ratio"], 3) if r.get("ratio") else 0.0, "ok": r["ok"],
                     "ratio_heuristic": round(r.get("ratio_heuristic") or 0, 3),
                     "kernel": r.get("ours_kernel"), "split": r.get("ours_split")})
    meta = raw["meta"]
    return {"rows": rows, "notes": "ours = fastest of the op's tuning candidates per case (ck tune); "
            "ratio_heuristic = the heuristic first pick; " + meta["timing"],
            "extra": {"geomean per direction": [dict(direction=d, **v) for d, v in meta["geomean"].items()]}}
