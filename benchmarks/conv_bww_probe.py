"""Probe conv bwd_weight (and stem forward) variants against cuDNN and the Dispatcher's pick (issue #17).

Cases: every bwd_weight case of the broad suite (``ck_conv.bench_broad.cases()``, same batch and
dtype), a few more depthwise / stem bwd_weight layers of its layer table, and stem forwards.
Per case, on the same channels-last tensors as the broad suite:

* ``peer``: cuDNN via ``aten.convolution_backward`` / ``F.conv*d`` (as bench_broad);
* ``pick``: ``Dispatcher.run`` with the triton registry (what the broad suite measures);
* ``new``: the new kernels at several splits: the im2col GEMM over the flattened (tap, channel)
  axis (``_flat`` keys; forward and bwd_weight) and depthwise bwd_weight tiles with the one-launch
  ``_atomicfix`` reduction and splits up to 1024 (the key space had up to 256);
* ``short``: every key of the Dispatcher's shortlist (the ranker's candidates), so the oracle of the
  existing keys after the split-snapping fix is measured too.

Every launch is checked against cuDNN in fp32 first (rel. error < 2e-2, else ``wrong``), then timed
as the median of CUDA-graph replays (``triton.testing.do_bench_cudagraph``).  Kernels are compiled
first by a pool of worker processes into the kernel cache (no GPU work:
``ck_core.backends.triton_backend.build_for_problem``); the timing process only loads them.
The JSON (``--out``) is rewritten after every case, so a run cut off by its budget keeps what it
measured.

    python3 benchmarks/conv_bww_probe.py --out $OUT/probe_convk.json     # ~5 min on one H100
    python3 benchmarks/conv_bww_probe.py --list                           # cases and variant counts (CPU)
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import multiprocessing as mp
import os
import sys
import time

REP_MS = 10
#: shortlist keys timed per case (the ranker's candidates; the first ones)
SHORT_MAX = 10


# -- cases ---------------------------------------------------------------------------------------

def _extra(net, C, K, G, sp, flt, st, pd, N, dtype, direction):
    nd = len(sp)
    st = st if isinstance(st, tuple) else (st,) * nd
    pd = pd if isinstance(pd, tuple) else (pd,) * nd
    return dict(net=net, N=N, C=C, K=K, G=G, spatial=sp, filter=flt, stride=st, pad=pd, dtype=dtype,
                direction=direction, split="extra")


EXTRA = (
    # depthwise bwd_weight: the worst oracle rows of the selection set (session 7)
    ("mobilenet_v2", 32, 32, 32, (112, 112), (3, 3), 1, 1, 32, "bf16", "bwd_weight"),
    ("mobilenet_v2", 144, 144, 144, (56, 56), (3, 3), 1, 1, 32, "bf16", "bwd_weight"),
    ("mobilenet_v2", 96, 96, 96, (112, 112), (3, 3), 2, 1, 32, "bf16", "bwd_weight"),
    ("efficientnet_b0", 240, 240, 240, (28, 28), (5, 5), 1, 2, 8, "bf16", "bwd_weight"),
    ("mobilenet_v2", 384, 384, 384, (14, 14), (3, 3), 1, 1, 32, "fp16", "bwd_weight"),
    # stems bwd_weight
    ("resnet50", 3, 64, 1, (224, 224), (7, 7), 2, 3, 8, "bf16", "bwd_weight"),
    ("unet", 4, 320, 1, (64, 64), (3, 3), 1, 1, 32, "fp16", "bwd_weight"),
    ("efficientnet_b0", 3, 32, 1, (224, 224), (3, 3), 2, 1, 8, "fp16", "bwd_weight"),
    ("audio1d", 1, 512, 1, (16000,), (10,), 5, 0, 8, "fp16", "bwd_weight"),
    # stems forward
    ("resnet50", 3, 64, 1, (224, 224), (7, 7), 2, 3, 32, "fp16", "forward"),
    ("resnet50", 3, 64, 1, (224, 224), (7, 7), 2, 3, 8, "bf16", "forward"),
    ("mobilenet_v2", 3, 32, 1, (224, 224), (3, 3), 2, 1, 8, "fp16", "forward"),
    ("video3d", 3, 64, 1, (16, 112, 112), (3, 7, 7), (1, 2, 2), (1, 3, 3), 8, "bf16", "forward"),
    ("unet", 4, 320, 1, (64, 64), (3, 3), 1, 1, 32, "fp16", "forward"),
)


def all_cases() -> list:
    from ck_conv.bench_broad import cases

    suite = [c for c in cases() if c["direction"] == "bwd_weight"]
    for c in suite:
        c["split"] = "suite"
    # the suite's weakest first (2026-11-27 baseline: 3D stem 0.24, depthwise 5x5 0.32, 1x1 C24 0.40,
    # VAE 3x3 0.49, 3D 3x1x1 0.51), then the extra layers, then the suite's 1x1 layers (0.76-0.90)
    weak = [c for c in suite if not (c["filter"] == (1,) * len(c["filter"]) and c["C"] >= 128)]
    rest = [c for c in suite if c not in weak]
    out = weak + [_extra(*e) for e in EXTRA] + rest
    from ck_conv.bench_broad import case_name

    for c in out:
        c["case"] = case_name(c)
    return out


def problem_of(c):
    from ck_conv.bench_broad import _problem

    return _problem(c)


# -- variants ------------------------------------------------------------------------------------

def _pow2(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(x, 1))))


def _splits_for(cfg, p, targets, sms: int, cap: int = 1024) -> list:
    """Distinct splits (as the launch makes them) that give about ``t * sms`` programs."""
    import attrs

    from ck_conv.backends.triton.launch import reduction_shape, split_plan

    tiles, _ = reduction_shape(cfg, p)
    out = []
    for t in targets:
        want = min(cap, max(1, round(t * sms / max(tiles, 1))))
        want = 1 << round(math.log2(want))
        s = split_plan(attrs.evolve(cfg, split=want), p)[0]
        if s not in out:
            out.append(s)
    return out


def variants(p, sms: int = 132) -> list:
    """[(label, config)] of the new kernels for problem ``p`` (splits set as launched)."""
    import attrs

    from ck_conv.keys import ConvKernelConfig

    out = []
    common = dict(direction=p.direction, dtype=p.dtype, ndim=p.ndim, layout=p.layout_family)
    if p.c_per_group == 1 and p.k_per_group == 1:
        if p.direction != "bwd_weight":
            return []
        gp = _pow2(p.G)
        # accumulators per thread and tap: BLOCK_P*BLOCK_G / threads (a 5x5 filter has 25 of them)
        for (bp, bg), w in (((32, 32), 4), ((16, 32), 4), ((32, 32), 8), ((16, 64), 8), ((64, 32), 8),
                            ((32, 64), 8), ((64, 64), 8)):
            if bg > max(32, gp):
                continue
            for red in ("atomicfix",) if out else ("atomicfix", "atomic"):
                c = ConvKernelConfig(pipeline="mem", tile=(bp, bg, 1), waves=(w, 1, 1), warp_tile=(1, 1, 1),
                                     specialization="depthwise", reduction=red, **common)
                for s in _splits_for(c, p, (1, 2, 4) if red == "atomicfix" else (2,), sms):
                    out.append((f"dw {red}", attrs.evolve(c, split=s)))
        return out
    tc = p.c_per_group * p.taps
    K = p.k_per_group
    if p.direction == "forward":
        if p.c_per_group > 16:
            return []
        bn = min(128, max(16, _pow2(K)))
        for bm, bk, w in ((128, 32, 4), (128, 64, 4), (64, 64, 4), (256, 32, 8), (128, 32, 8), (64, 32, 4)):
            out.append(("flat fwd", ConvKernelConfig(tile=(bm, bn, bk), waves=(w, 1, 1), warp_tile=(16, 16, 16),
                                                     flat=True, **common)))
            if K > 64 and bn > 64:
                out.append(("flat fwd", ConvKernelConfig(tile=(bm, 64, bk), waves=(w, 1, 1),
                                                         warp_tile=(16, 16, 16), flat=True, **common)))
        return out
    if all(st == 1 for st in p.stride) and (p.C * 2) % 16 == 0 and (p.K * 2) % 16 == 0:
        # the tensor-descriptor kernel: dy and the tap-shifted x as TMA boxes
        spec = "filter1x1_stride1_pad0" if p.specialization == "filter1x1_stride1_pad0" else "default"
        for tile, w, st in (((128, 128, 64), 8, 0), ((128, 128, 64), 4, 4), ((64, 128, 64), 4, 0),
                            ((128, 64, 64), 4, 0), ((128, 256, 64), 8, 3), ((64, 64, 128), 4, 0)):
            tile = (min(tile[0], max(16, _pow2(K))), min(tile[1], max(16, _pow2(p.c_per_group))), tile[2])
            w = w if tile[0] * tile[1] >= 128 * 64 else 4   # the key space's rule
            base = ConvKernelConfig(tile=tile, waves=(w, 1, 1), warp_tile=(16, 16, 16), tma=True, stages=st,
                                    specialization=spec, **common)
            if base.why_not(p) is not None or any(attrs.evolve(base, split=1) == attrs.evolve(c, split=1)
                                                  for _, c in out):
                continue
            for red, targets in (("atomicfix", (1, 2)), ("fixup", (1,))):
                c = attrs.evolve(base, reduction=red)
                for s in _splits_for(c, p, targets, sms, cap=16 if red == "fixup" else 1024):
                    out.append((f"tma {red}", attrs.evolve(c, split=s)))
    if p.c_per_group > 32:
        return out
    bms = [b for b in (32, 64, 128) if b <= max(32, _pow2(K))]
    bns = [b for b in (16, 32, 64, 128, 256) if b <= max(16, _pow2(tc)) and (b >= 32 or tc <= 16)]
    tiles = []
    for bm in bms:
        for bn in bns:
            if bm * bn > 128 * 256:
                continue
            w = 8 if bm * bn >= 128 * 128 else 4
            for bk in ((32,) if bm * bn >= 128 * 256 else (64, 128) if bm * bn <= 64 * 64 else (64,)):
                tiles.append(((bm, bn, bk), w))
    # the largest few (fewest re-reads of dy) and a small one
    tiles = sorted(tiles, key=lambda t: -t[0][0] * t[0][1])[:5] + sorted(tiles, key=lambda t: t[0][0] * t[0][1])[:1]
    seen = set()
    for tile, w in tiles:
        if tile in seen:
            continue
        seen.add(tile)
        base = ConvKernelConfig(tile=tile, waves=(w, 1, 1), warp_tile=(16, 16, 16), flat=True, **common)
        for red, targets in (("atomicfix", (1, 2, 4)), ("fixup", (1,))):
            c = attrs.evolve(base, reduction=red)
            for s in _splits_for(c, p, targets, sms, cap=16 if red == "fixup" else 1024):
                out.append((f"flat {red}", attrs.evolve(c, split=s)))
    return out


def _uniq(items):
    seen, out = set(), []
    for label, name in items:
        if name not in seen:
            seen.add(name)
            out.append((label, name))
    return out


def plan_case(c, arch, disp):
    """[(label, key name)] to time for case ``c``: the pick, the new variants, the shortlist."""
    from ck_conv.keys import key_of

    p = problem_of(c)
    items = []
    pick = disp.plan(p).stages[0].key.name
    items.append(("pick", pick))
    for label, cfg in variants(p, arch.compute_units):
        why = cfg.why_not(p)
        if why is None:
            items.append((label, key_of(cfg, arch.name, "triton").name))
    op = disp.mgr.op("conv")
    for k in disp._shortlist(p, op)[:SHORT_MAX]:
        items.append(("short", k.name))
    return _uniq(items)


# -- compile pool ----------------------------------------------------------------------------------

def _compile_worker(args):
    ci, names = args
    return ci, compile_for(all_cases()[ci], names)


def compile_for(c, names) -> dict:
    """Compile each key's launches on case ``c``'s problem into the kernel cache (meta tensors:
    nothing runs), as ``ck build`` does for a representative problem; {name: error} of failures."""
    from ck_conv.backends.triton.keys import jit_calls
    from ck_core.backends import triton_artifacts as ta
    from ck_core.key import KernelKey
    from ck_core.plugins import get_manager

    mgr = get_manager()
    p = problem_of(c)
    failed = {}
    for name in names:
        try:
            key = KernelKey.from_name(name, mgr)
            arch = mgr.arch(key.arch)
            extra = ta.compile_options(key)
            for suffix, fn, fargs, kwargs in jit_calls(key, p):
                ck, _ = ta.get_or_build(key.name + suffix, fn, fargs, kwargs, target=arch.gpu_target(), extra=extra)
                try:   # Triton's launcher stub (a C build per signature); needs a driver
                    from triton.runtime import driver

                    driver.active.launcher_cls(ck.src, ck.metadata)
                except Exception:  # noqa: BLE001 - no driver here: the first call builds it
                    pass
        except Exception as exc:  # noqa: BLE001 - that kernel's failure, reported
            failed[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return failed


# -- main --------------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="conv_bww_probe.json")
    ap.add_argument("--budget-s", type=float, default=320.0, help="stop timing new cases after this")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--cases", default="", help="comma-separated case indices (default: all)")
    ap.add_argument("--no-short", action="store_true", help="skip the shortlist keys")
    ap.add_argument("--list", action="store_true", help="print the cases and variant counts (no GPU)")
    a = ap.parse_args(argv)
    t0 = time.time()

    from ck_core import Dispatcher, Registry, get_manager

    mgr = get_manager()
    cs = all_cases()
    idx = [int(i) for i in a.cases.split(",")] if a.cases else list(range(len(cs)))
    if a.list:
        arch = mgr.arch("sm90")
        for i in idx:
            vs = variants(problem_of(cs[i]), arch.compute_units)
            print(i, cs[i]["case"], len(vs), sorted({cfg.name.split("_")[-1] for _, cfg in vs})[:6])
        return 0

    import torch
    import triton.testing

    from ck_conv.bench import from_ours, rel_err, to_ours
    from ck_conv.bench_broad import _channels_last, _peer
    from ck_conv.backends.triton.keys import make_launcher
    from ck_core.bench import device_name
    from ck_core.key import KernelKey

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    tb = mgr.backend("triton")
    arch = next(x for x in mgr.archs().values() if tb.can_execute(x)[0] and x.vendor != "other")
    disps = {}

    def disp_for(c):
        dk = (c["dtype"], c["direction"])
        if dk not in disps:
            disps[dk] = Dispatcher(Registry.from_enumeration("conv", arch.name, "triton", dtypes=[c["dtype"]]),
                                   backend="triton")
        return disps[dk]

    plans = {i: plan_case(cs[i], arch, disp_for(cs[i])) for i in idx}
    print(f"planned {sum(len(v) for v in plans.values())} launches over {len(idx)} cases "
          f"in {time.time() - t0:.1f}s", flush=True)
    pool = mp.get_context("spawn").Pool(a.workers)
    pending = {}
    for i in idx:
        names = [n for lab, n in plans[i] if not (a.no_short and lab == "short")]
        pending[i] = [pool.apply_async(_compile_worker, ((i, names[j:j + 3]),)) for j in range(0, len(names), 3)]

    res = {"probe": "conv_bww_probe", "device": device_name(), "date": datetime.date.today().isoformat(),
           "command": " ".join(sys.argv), "arch": arch.name, "torch": torch.__version__,
           "triton": triton.__version__, "timing": "median of CUDA-graph replays (do_bench_cudagraph)",
           "ratio": "cuDNN time / ours (>1: ours faster)", "cases": []}

    def dump():
        if a.out:
            with open(a.out, "w") as f:
                json.dump(res, f, indent=1, default=str)

    def gbench(fn):
        return triton.testing.do_bench_cudagraph(fn, rep=REP_MS, return_mode="median")

    for i in idx:
        c = cs[i]
        if time.time() - t0 > a.budget_s:
            res.setdefault("skipped_for_time", []).append(c["case"])
            continue
        failed = {}
        for r in pending[i]:
            try:
                failed.update(r.get(timeout=max(5.0, a.budget_s + 30 - (time.time() - t0)))[1])
            except Exception as exc:  # noqa: BLE001 - timing compiles what is missing
                failed["?"] = f"compile task: {type(exc).__name__}: {exc}"
        row = {k: (list(v) if isinstance(v, tuple) else v) for k, v in c.items()}
        row.update(index=i, compile_failed=failed, runs=[])
        res["cases"].append(row)
        tc = time.time()
        try:
            p = problem_of(c)
            dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[c["dtype"]]
            G = c["G"]
            x = _channels_last((c["N"], c["C"]) + tuple(c["spatial"]), dt, "cuda")
            w = _channels_last((c["K"], c["C"] // G) + tuple(c["filter"]), dt, "cuda",
                               1 / math.sqrt(c["C"] // G * math.prod(c["filter"])))
            dy = _channels_last((c["N"], c["K"]) + tuple(p.output_spatial), dt, "cuda")
            if c["direction"] == "forward":
                ops, kind, out_name = {"x": to_ours(x, G, "x"), "w": to_ours(w, G, "w")}, "x", "y"
            else:
                ops, kind, out_name = {"x": to_ours(x, G, "x"), "dy": to_ours(dy, G, "x")}, "w", "dw"
            peer = _peer(c, x, w, dy)
            ref = _peer(c, x.float(), w.float(), dy.float())()
            row["peer_ms"] = gbench(peer)
            disp = disp_for(c)
            for label, name in plans[i]:
                if a.no_short and label == "short":
                    continue
                run = {"label": label, "kernel": name}
                try:
                    if label == "pick":
                        fn = lambda: disp.run(p, **ops)  # noqa: E731
                    else:
                        key = KernelKey.from_name(name, mgr)
                        launch = make_launcher(key, arch)
                        fn = lambda launch=launch: launch(p, ops)[out_name]  # noqa: E731
                    out = fn()
                    torch.cuda.synchronize()
                    err = rel_err(from_ours(out, kind), ref)
                    run["rel_err"] = round(err, 6)
                    if err < 2e-2:
                        ms = gbench(fn)
                        run["ms"] = ms
                        run["ratio"] = round(row["peer_ms"] / ms, 4)
                        run["status"] = "ok"
                    else:
                        run["status"] = "wrong"
                    del out
                except Exception as exc:  # noqa: BLE001 - that kernel's failure
                    run["status"] = "error"
                    run["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                row["runs"].append(run)
            ok = [r for r in row["runs"] if r.get("status") == "ok"]
            pick = next((r for r in ok if r["label"] == "pick"), None)
            new = [r for r in ok if r["label"] not in ("pick", "short")]
            short = [r for r in ok if r["label"] == "short"]
            row["pick_ratio"] = pick and pick["ratio"]
            row["pick_kernel"] = pick and pick["kernel"]
            for what, rs in (("best_new", new), ("best_short", short), ("best", ok)):
                if rs:
                    b = max(rs, key=lambda r: r["ratio"])
                    row[f"{what}_ratio"], row[f"{what}_kernel"] = b["ratio"], b["kernel"]
            del x, w, dy, ref, ops
        except Exception as exc:  # noqa: BLE001 - the case's failure, reported
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        row["case_s"] = round(time.time() - tc, 1)
        print(f"[{time.time() - t0:6.1f}s] {c['case']:72s} pick={row.get('pick_ratio')} "
              f"new={row.get('best_new_ratio')} short={row.get('best_short_ratio')} "
              f"({len(row['runs'])} runs, {row['case_s']}s)", flush=True)
        torch.cuda.empty_cache()
        res["elapsed_s"] = round(time.time() - t0, 1)
        dump()
    pool.terminate()

    def gm(vals):
        vals = [v for v in vals if v]
        return round(math.exp(sum(math.log(v) for v in vals) / len(vals)), 4) if vals else None

    summ = {}
    for d in ("bwd_weight", "forward"):
        for grp in ("suite", "extra"):
            rows = [r for r in res["cases"] if r["direction"] == d and r["split"] == grp]
            if rows:
                summ[f"{d}/{grp}"] = {"n": len(rows), "pick": gm(r.get("pick_ratio") for r in rows),
                                      "best_new": gm(r.get("best_new_ratio") for r in rows),
                                      "best_short": gm(r.get("best_short_ratio") for r in rows),
                                      "best": gm(r.get("best_ratio") for r in rows)}
    res["summary"] = summ
    res["elapsed_s"] = round(time.time() - t0, 1)
    dump()
    print(json.dumps(summ, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
