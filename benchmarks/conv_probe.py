"""Probe ck-conv's new kernel variants against the current winners and cuDNN on the weak layers.

Times, exactly as ``ck bench conv --vs torch`` (ck_conv.bench) does -- same cases,
same inputs, channels_last cuDNN peer (fastest of the two backward entry points),
CUDA-graph medians, relative error against PyTorch fp32 -- for

* forward: ResNet-50 c5 / c4 / c3 3x3, r3d 3x3x3, the depthwise 144-channel layer and
  resnext g32;
* bwd_data: c5 / c4 3x3, c3d / r3d 3x3x3, depthwise, c4 1x1, resnext g32;

weakest first (session-2 ratios), so that a short budget keeps the worst ones.  Per
case: the session-2 winner (``benchmarks/results/conv.json``, at its split) and the
heuristic pick ("old"), and the new variants ("new"): the bwd_data tap-bit kernel,
stream-K (``_streamk``, a persistent grid; its split = programs per SM), BLOCK_K 128
with 4 stages, the fixup split with a split sweep, the flat-row depthwise kernel
(``_flat``), block-diagonal merged groups (``_gm``, resnext) --
``ck_conv.heuristics.extended_candidates`` plus the winner with the tap bits.  All
(config, split) launches are compiled first in a pool of worker processes; a
candidate that fails to compile, run or verify is reported and skipped.
One JSON line per (case, candidate, split) on stdout, one summary line per case,
everything in ``--out`` (rewritten after each case, so a cut-off run keeps what it
measured), and a closing table: per case the old best and the new best ratio, per
direction the geomean over the probed cases and the suite geomean this projects
(session-2 suite geomean times the probed speedups).

    python benchmarks/conv_probe.py --out $OUT/conv_probe.json

Just the row-reuse depthwise forward kernels against the old winner and cuDNN (~1 min):

    python benchmarks/conv_probe.py --cases depthwise_3x3_144_56 --directions forward --rows-only \
        --out $OUT/conv_probe_rows.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

FWD_CASES = ["r50_c5_3x3_512_512_7", "depthwise_3x3_144_56", "r3d_3x3x3_256_256_8x28x28", "r50_c4_3x3_256_256_14",
             "resnext_g32_3x3_512_14", "r50_c3_3x3_128_128_28"]
BWD_D_CASES = ["r50_c5_3x3_512_512_7", "depthwise_3x3_144_56", "r3d_3x3x3_256_256_8x28x28",
               "r50_c4_3x3_256_256_14", "c3d_3x3x3_64_64_16x56x56", "r50_c4_1x1_1024_256_14",
               "resnext_g32_3x3_512_14"]
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
#: session-2 suite geomeans (benchmarks/results/conv.json), for the projection
SESSION2_GEOMEAN = {"forward": 0.861, "bwd_data": 0.799, "bwd_weight": 0.826}
NUM_CASES = 12


def _old_winners():
    """{(case, direction): (kernel, split, ratio)} of the last full run: ``conv.json``
    (``ck bench conv`` rows), else the raw ``conv_raw.json`` of the older bench script."""
    try:
        with open(os.path.join(RESULTS, "conv.json")) as f:
            rows = json.load(f)["rows"]
        return {tuple(r["case"].rsplit(" ", 1)): (r.get("kernel"), r.get("split"), r.get("ratio")) for r in rows}
    except (OSError, ValueError, KeyError):
        pass
    try:
        with open(os.path.join(RESULTS, "conv_raw.json")) as f:
            return {(r["case"], r["direction"]): (r.get("ours_kernel"), r.get("ours_split"), r.get("ratio"))
                    for r in json.load(f)["rows"]}
    except (OSError, ValueError, KeyError):
        return {}


#: extra row-reuse shapes the probe times beside extended_candidates' (RH, BLOCK, warps, weights)
ROWS_EXTRA = (((8, 1024, 1), 4, 2), ((4, 2048, 1), 8, 2), ((2, 2048, 1), 8, 1), ((2, 1024, 1), 4, 2),
              ((2, 1024, 1), 4, 1))


def plan(case_names=None, directions=("forward", "bwd_data"), rows_only=False):
    """[(case index, direction, [(config name, split or None, is_new, label), ...])] in timing order.

    ``rows_only``: per depthwise case just the session-2 winner (old) against the
    row-reuse kernels (``_rows`` / ``_rows_wexp``, new); other cases are dropped."""
    import attrs

    from ck_conv.bench import CASES, problem
    from ck_conv.heuristics import candidate_configs, extended_candidates, heuristic_config
    from ck_conv.keys import ConvKernelConfig

    old = _old_winners()
    names = [c[0] for c in CASES]
    todo = []
    order = [(c, "forward") for c in FWD_CASES] + [(c, "bwd_data") for c in BWD_D_CASES]
    # interleave so that the weakest of both directions come first
    order = sorted(order, key=lambda cd: (old.get(cd, (None, None, 1.0))[2] or 1.0))
    for cname, d in order:
        if d not in directions or (case_names and cname not in case_names):
            continue
        ci = names.index(cname)
        p = problem(CASES[ci], d)
        items = []
        seen = set()

        def add(cfg, split, new, label):
            if cfg.why_not(p) is not None:
                return
            # one timing per distinct launch: with no split the reduction modes coincide
            eff = used_split(p, cfg.name, split, 132)
            key = (attrs.evolve(cfg, reduction="atomic") if eff == 1 else cfg, eff)
            if key not in seen:
                seen.add(key)
                items.append((cfg.name, split, new, label))

        wname, wsplit, _ = old.get((cname, d), (None, None, None))
        win = ConvKernelConfig.from_name(wname) if wname else heuristic_config(p)
        add(win, wsplit, False, "session2 winner")
        h = heuristic_config(p)
        if h != win:
            add(h, None, False, "heuristic")
        if rows_only:
            if win.specialization != "depthwise":
                continue
            rows = [c for c in extended_candidates(p) if c.rows]
            rows += [attrs.evolve(win, tile=t, waves=(nw, 1, 1), pipeline="mem", warp_tile=(1, 1, 1), flat=False,
                                  rows=r) for t, nw, r in ROWS_EXTRA]
            for c in rows:
                add(c, None, True, "row reuse")
            if len(items) > 1:
                todo.append((ci, d, items))
            continue
        if win.specialization == "depthwise":
            for c in candidate_configs(p):
                if not c.flat:  # the classic tiles that won before: old
                    add(c, None, False, "classic")
            for c in extended_candidates(p):
                add(c, None, True, "flat rows")
            todo.append((ci, d, items))
            continue
        tap = p.taps <= 31 and not p.specialization.startswith("filter1x1")
        if tap and not win.tap_mask:
            add(attrs.evolve(win, tap_mask=True), wsplit, True, "winner+tapmask")
        ext = extended_candidates(p)
        for c in ext:
            add(c, None, True, "extended")
        # stream-K: 1 and 2 programs per SM (one of them is the automatic choice)
        for c in [c for c in ext if c.reduction == "streamk"]:
            for per_sm in (1, 2):
                add(c, per_sm, True, "streamk per-SM sweep")
        # fixup: a few splits around the automatic one
        for c in [c for c in ext if c.reduction == "fixup"][:2]:
            for sp in (2, 3, 4, 6):
                add(c, sp, True, "split sweep")
        todo.append((ci, d, items))
    return todo


def _operands(ci, d, seed):
    from ck_conv.bench import CASES, to_ours, torch_operands
    case = CASES[ci]
    g = case[2]
    x, w, dy = torch_operands(case, seed=seed)
    ops = {"forward": {"x": to_ours(x, g, "x"), "w": to_ours(w, g, "w")},
           "bwd_data": {"dy": to_ours(dy, g, "x"), "w": to_ours(w, g, "w")},
           "bwd_weight": {"x": to_ours(x, g, "x"), "dy": to_ours(dy, g, "x")}}[d]
    return x, w, dy, ops


def _launcher(p, ops, name, split):
    import torch

    from ck_conv.heuristics import named_split
    from ck_conv.keys import ConvKernelConfig
    from ck_conv.backends.triton.launch import run
    from ck_core.device import current_arch

    cfg, q = named_split(ConvKernelConfig.from_name(name), p, current_arch(torch.device("cuda")), split)
    return lambda: run(q, ops, cfg)


def _worker(chunk_path, status_path):
    """Worker process: launch each (config, split) of a chunk once on the case's real
    shapes, which fills Triton's disk cache; one status line per launch, flushed, so
    the parent knows what finished, what failed and what a crash cut off."""
    import torch

    from ck_conv.bench import CASES, problem
    with open(chunk_path) as f:
        ci, d, items = json.load(f)
    p = problem(CASES[ci], d)
    _, _, _, ops = _operands(ci, d, seed=0)
    with open(status_path, "a") as st:
        for i, (name, split) in enumerate(items):
            st.write(f"start\t{i}\n")
            st.flush()
            t = time.time()
            try:
                _launcher(p, ops, name, split)()
                torch.cuda.synchronize()
                st.write(f"ok\t{i}\t{time.time() - t:.2f}\n")
                st.flush()
            except Exception as e:  # noqa: BLE001 - reported to the parent
                msg = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
                st.write(f"err\t{i}\t{msg}\n")
                st.flush()
                if "CUDA" in msg or "cuda" in msg:  # the context may be gone: stop here
                    os._exit(3)
    return 0


def compile_all(chunks, workers, budget, per_proc_s=150.0):
    """Run the chunks in worker processes (at most ``workers`` at once) until done or
    ``budget`` seconds pass.  Returns ({(ci, d, name, split): error}, warmed set)."""
    import collections
    import subprocess
    import tempfile

    t0 = time.time()
    failed, warmed = {}, set()
    queue = collections.deque(chunks)
    running = []
    tmp = tempfile.mkdtemp(prefix="conv_probe_")
    n = 0

    def reap(proc, chunk, status, errpath, killed):
        ci, d, items, tries = chunk
        lines = []
        if os.path.exists(status):
            with open(status) as f:
                lines = [ln.rstrip("\n").split("\t", 2) for ln in f if ln.strip()]
        done, began = set(), set()
        for ln in lines:
            i = int(ln[1])
            if ln[0] == "start":
                began.add(i)
            elif ln[0] == "ok":
                done.add(i)
                warmed.add((ci, d, *items[i]))
            elif ln[0] == "err":
                done.add(i)
                failed[(ci, d, *items[i])] = ln[2] if len(ln) > 2 else "error"
        rest = []
        for i, it in enumerate(items):
            if i in done:
                continue
            if i in began:  # the launch that was running when the process died or was killed
                failed[(ci, d, *it)] = "worker died or timed out during this launch" + (" (killed)" if killed else "")
            else:
                rest.append(it)
        if rest and (began or tries < 1):  # progress was made, or one retry of a worker that never started
            queue.append((ci, d, rest, tries + (0 if began else 1)))
        elif rest:
            tail = ""
            if os.path.exists(errpath):
                with open(errpath) as f:
                    tail = " ".join(f.read().split())[-300:]
            for it in rest:
                failed[(ci, d, *it)] = f"worker exited {proc.returncode} before launching: {tail}"

    while (queue or running) and time.time() - t0 < budget:
        while queue and len(running) < workers:
            chunk = queue.popleft()
            n += 1
            cpath, spath, epath = (os.path.join(tmp, f"{k}{n}.{x}") for k, x in (("c", "json"), ("s", "log"),
                                                                                  ("e", "log")))
            with open(cpath, "w") as f:
                json.dump(chunk[:3], f)
            err = open(epath, "w")
            proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", cpath, spath],
                                    stdout=subprocess.DEVNULL, stderr=err)
            running.append((proc, chunk, spath, epath, time.time(), err))
        time.sleep(0.1)
        for r in list(running):
            proc, chunk, spath, epath, started, err = r
            killed = False
            if proc.poll() is None and time.time() - started > per_proc_s:
                proc.kill()
                killed = True
            if proc.poll() is not None or killed:
                proc.wait()
                err.close()
                running.remove(r)
                reap(proc, chunk, spath, epath, killed)
    for proc, chunk, spath, epath, started, err in running:  # budget spent: the rest compiles on use
        proc.kill()
        proc.wait()
        err.close()
    return failed, warmed


def used_split(p, name, split, num_sms):
    """The reduction split run() will launch with (None: auto); for stream-K the
    program count as ``"sk<n>"``; 1 for the depthwise kernels."""
    from ck_conv.keys import ConvKernelConfig
    from ck_conv.heuristics import auto_split_k, auto_split_mn
    from ck_conv.backends.triton.launch import _cdiv, _class_rows, geometry, streamk_fits, streamk_programs
    cfg = ConvKernelConfig.from_name(name)
    if cfg.specialization == "depthwise" and p.direction != "bwd_weight":
        return 1
    g = geometry(p)
    m, n, k = cfg.tile
    if p.direction == "bwd_weight":
        P = p.N * g["Do"] * g["Ho"] * g["Wo"]
        s = split or auto_split_k(p, cfg, num_sms)
        chunk = _cdiv(_cdiv(P, s), k) * k
        return _cdiv(P, chunk)
    one = cfg.specialization == "filter1x1_stride1_pad0"
    if p.direction == "forward":
        tiles = _cdiv(p.N * g["Do"] * g["Ho"] * g["Wo"], m) * _cdiv(p.k_per_group, n) * p.G
        steps = (1 if one else p.taps) * _cdiv(p.c_per_group, k)
    else:
        rows = _class_rows(g["sd"], g["pad"], g["dil"], g["flt"], g["Ho"], g["Wo"])
        Mr = p.N * _cdiv(g["Di"], g["sd"][0]) * _cdiv(g["Hi"], g["sd"][1]) * _cdiv(g["Wi"], g["sd"][2])
        tiles = _cdiv(Mr, m) * _cdiv(p.c_per_group, n) * p.G * len(rows)
        steps = (1 if one else max(r[0] * r[1] * r[2] for r in rows)) * _cdiv(p.k_per_group, k)
    if cfg.reduction == "streamk":
        total = tiles * steps
        nprog = streamk_programs(cfg, total, steps, num_sms, split or streamk_fits(cfg))
        return f"sk{_cdiv(total, _cdiv(total, nprog))}"
    s = split or auto_split_mn(tiles, steps, num_sms, eager=cfg.reduction in ("twostage", "fixup", "atomicfix"))
    return _cdiv(steps, _cdiv(steps, s))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="conv_probe.json")
    ap.add_argument("--budget", type=float, default=215.0, help="seconds; no new timing starts after this")
    ap.add_argument("--compile-budget", type=float, default=110.0, help="seconds for the parallel compile phase")
    ap.add_argument("--workers", type=int, default=min(15, max(1, (os.cpu_count() or 2) - 1)),
                    help="compile worker processes (0: compile on use in this process)")
    ap.add_argument("--worker", nargs=2, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cases", default=None, help="comma-separated case names (default: all planned)")
    ap.add_argument("--directions", default="forward,bwd_data")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit (no GPU needed)")
    ap.add_argument("--rows-only", action="store_true",
                    help="depthwise cases only: the session-2 winner against the row-reuse kernels (_rows)")
    args = ap.parse_args(argv)
    if args.worker:
        return _worker(*args.worker)
    t0 = time.time()

    todo = plan(args.cases.split(",") if args.cases else None, tuple(args.directions.split(",")), args.rows_only)
    n_items = sum(len(it) for _, _, it in todo)
    if args.dry_run:
        from ck_conv.bench import CASES
        for ci, d, items in todo:
            print(f"{CASES[ci][0]} {d}: {len(items)}")
            for it in items:
                print("   ", it)
        print(f"# {n_items} timings, {len({(ci, d, n) for ci, d, its in todo for n, *_ in its})} configs")
        return 0

    import torch
    import triton
    from triton.testing import do_bench_cudagraph

    from ck_conv.bench import CASES, from_ours, problem, rel_err, torch_fns

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "cudnn": torch.backends.cudnn.version(), "sms": num_sms, "dtype": "fp16",
            "timing": "median of CUDA-graph replays, triton.testing.do_bench_cudagraph (as ck_conv.bench)",
            "planned_timings": n_items}
    rows, summaries = [], []

    def dump():
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows, "summary": summaries}, f, indent=1)

    dump()

    # 1. compile every (config, split) in worker processes, in chunks of four launches
    chunks = []
    for ci, d, items in todo:
        pairs = [[n, s] for n, s, _, _ in items]
        for i in range(0, len(pairs), 4):
            chunks.append((ci, d, pairs[i:i + 4], 0))
    failed, warmed = compile_all(chunks, args.workers, args.compile_budget) if args.workers > 0 else ({}, set())
    for (ci, d, name, split), err in failed.items():
        print(f"# compile/run failed {CASES[ci][0]} {d} {name} split={split}: {err}", file=sys.stderr)
    meta["compile_s"] = round(time.time() - t0, 1)
    meta["warmed"], meta["failed_in_warmup"] = len(warmed), len(failed)
    print(f"# warmed {len(warmed)} of {n_items} launches ({len(failed)} failed) in {meta['compile_s']}s",
          file=sys.stderr, flush=True)

    # 2. check and time, case by case
    dead = False
    for ci, d, items in todo:
        if dead:
            break
        if time.time() - t0 > args.budget:
            print(f"# budget spent; skipping {CASES[ci][0]} {d}", file=sys.stderr)
            summaries.append({"case": CASES[ci][0], "direction": d, "skipped": "budget"})
            continue
        case = CASES[ci]
        p = problem(case, d)
        x, w, dy, ops = _operands(ci, d, seed=ci + 1)
        kind = {"forward": "x", "bwd_data": "x", "bwd_weight": "w"}[d]
        ref = torch_fns(case, d, x.float(), w.float(), dy.float())()
        peer_times = {}
        for autograd in ((False, True) if d != "forward" else (False,)):
            fn = torch_fns(case, d, x, w, dy, autograd=autograd)
            e = rel_err(fn(), ref)
            peer_times["aten.convolution_backward" if autograd else "F.conv / nn.grad"] = \
                (do_bench_cudagraph(fn, return_mode="median"), e)
        peer_name, (t_peer, e_peer) = min(peer_times.items(), key=lambda kv: kv[1][0])
        fl = p.flops
        best = {False: None, True: None}
        for name, split, new, label in items:
            if time.time() - t0 > args.budget:
                print(f"# budget spent inside {case[0]} {d}", file=sys.stderr)
                break
            row = {"case": case[0], "direction": d, "kernel": name, "split": split, "new": new, "label": label,
                   "peer": peer_name, "peer_ms": t_peer, "peer_tflops": fl / t_peer / 1e9, "peer_rel_err": e_peer}
            err = failed.get((ci, d, name, split))
            cold = args.workers > 0 and (ci, d, name, split) not in warmed
            if err:
                row.update(ok=False, error=err)
            elif cold and time.time() - t0 > args.budget - 45:
                row.update(ok=False, error="not compiled in the warm-up and too little budget left to compile")
            else:
                try:
                    row["split_used"] = used_split(p, name, split, num_sms)
                    fn = _launcher(p, ops, name, split)
                    e = rel_err(from_ours(fn(), kind), ref)
                    row["rel_err"] = e
                    if not e < 1e-2:
                        row.update(ok=False, error=f"rel err {e:.3e}")
                    else:
                        t = do_bench_cudagraph(fn, return_mode="median")
                        row.update(ok=True, ms=t, tflops=fl / t / 1e9, ratio=t_peer / t)
                        if best[new] is None or t < best[new]["ms"]:
                            best[new] = row
                except Exception as ex:  # noqa: BLE001 - one failing candidate never sinks the probe
                    row.update(ok=False, error=f"{type(ex).__name__}: {str(ex)[:300]}")
                    try:
                        torch.cuda.synchronize()
                    except Exception:  # noqa: BLE001 - a sticky CUDA error: nothing more can run here
                        dead = True
            rows.append(row)
            print(json.dumps(row), flush=True)
            if dead:
                meta["aborted"] = f"CUDA context lost after {name} split={split}"
                print(f"# {meta['aborted']}; stopping", file=sys.stderr)
                break
        old_r = _old_winners().get((case[0], d), (None, None, None))[2]
        summ = {"case": case[0], "direction": d, "summary": True, "peer_ms": t_peer, "session2_ratio": old_r}
        for new, tag in ((False, "old"), (True, "new")):
            b = best[new]
            if b:
                summ.update({f"best_{tag}": b["kernel"], f"best_{tag}_split": b["split"],
                             f"best_{tag}_split_used": b.get("split_used"), f"best_{tag}_ratio": b["ratio"],
                             f"best_{tag}_ms": b["ms"]})
        if best[False] and best[True]:
            summ["speedup_new_over_old"] = best[False]["ms"] / best[True]["ms"]
        summaries.append(summ)
        print(json.dumps(summ), flush=True)
        dump()
        del x, w, dy, ops, ref

    geo = {}
    for d in ("forward", "bwd_data"):
        for tag in ("old", "new"):
            rs = [s[f"best_{tag}_ratio"] for s in summaries if s.get("direction") == d and f"best_{tag}_ratio" in s]
            if rs:
                geo[f"{d}_{tag}"] = {"geomean_ratio": math.exp(sum(map(math.log, rs)) / len(rs)), "cases": len(rs)}
        rs = [max(s.get("best_old_ratio", 0), s.get("best_new_ratio", 0)) for s in summaries
              if s.get("direction") == d and ("best_old_ratio" in s or "best_new_ratio" in s)]
        if rs:
            geo[f"{d}_best"] = {"geomean_ratio": math.exp(sum(map(math.log, rs)) / len(rs)), "cases": len(rs)}
        # the suite geomean this projects: session 2's, each probed case sped up by
        # old-best / best-of-both measured here (peer noise cancels within a case)
        sp = [s["best_old_ms"] / min(s["best_old_ms"], s.get("best_new_ms", math.inf)) for s in summaries
              if s.get("direction") == d and "best_old_ms" in s]
        if sp:
            geo[f"{d}_projected_suite"] = {
                "geomean_ratio": SESSION2_GEOMEAN[d] * math.exp(sum(map(math.log, sp)) / NUM_CASES),
                "from": SESSION2_GEOMEAN[d], "cases_sped_up": sum(x > 1.0 for x in sp)}
    meta["geomean_over_probed_cases"] = geo
    meta["wall_s"] = round(time.time() - t0, 1)
    dump()
    # a compact table last, so that the tail of the output holds the results
    print("# case direction | session-2 ratio | old best now | new best (ratio, kernel tail, split used) | speedup")
    for sm in summaries:
        if "skipped" in sm:
            print(f"# {sm['case']} {sm['direction']} skipped ({sm['skipped']})")
            continue
        tail = (sm.get("best_new") or "-").split("_intrawave_")[-1]
        print(f"# {sm['case']} {sm['direction']} | {sm.get('session2_ratio') or 0:.3f} | "
              f"{sm.get('best_old_ratio') or 0:.3f} | {sm.get('best_new_ratio') or 0:.3f} {tail} "
              f"split={sm.get('best_new_split_used')} | x{sm.get('speedup_new_over_old') or 0:.3f}", flush=True)
    for k, v in geo.items():
        print(f"# geomean {k}: {v['geomean_ratio']:.3f}" + (f" (from {v['from']:.3f})" if "from" in v else ""))
    print(json.dumps({"geomean": geo, "wall_s": meta["wall_s"]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
