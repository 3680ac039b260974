"""GPU check of the conv tails (issue #29): grouped and depthwise bwd_weight, the 3x3 forward.

    python benchmarks/conv_tail_check.py --out /tmp/conv_tail.json        (under 2 minutes on an H100/H200)
    python benchmarks/conv_tail_check.py --dry-run --out /tmp/t.json      (tiny shapes on the CPU: the script only)

Sections (bf16 / fp16, channels-last, each row checked against fp32 cuDNN first: a wrong key gets no
time; ratio = cuDNN's time / ours, CUDA-graph medians, eager beside them for the picks):

``grouped``   bwd_weight of ResNeXt-50 32x4d's grouped 3x3 layers (G=32, 4-32 channels per group,
              batch 32) and the broad suite's N8 row (0.15x in session 10): the Dispatcher's pick, then
              the next keys of its ranked shortlist, the pick unsplit and split half / twice as many
              ways (what ``split_target.grouped_warps`` should be set from);
``depthwise`` bwd_weight of ConvNeXt-T's 7x7, MobileNetV2's 3x3 and EfficientNet-B0's 5x5 depthwise
              layers (batch 32): the pick, the next ranked key and the other family (3x3 picks the
              one-launch atomicfix tiles since session 11: the classic tiles beside them; 5x5 / 7x7
              the classic ones: atomicfix 32x32 w8 beside them);
``forward``   ResNet-50's 3x3 forward layers (batch 32) and ResNeXt's grouped stride-2 one: the pick and
              the next ranked keys, and on the ResNet rows probes of the key space beyond the shortlist
              (128x64 / 128x128 tiles, BLOCK_K 64-128, tap bits, 3-4 stages: which tiles the 3x3
              candidate list should hold) and the new tensor-descriptor forward (``_tma``: x boxes of
              output rows x 8 columns at each tap-shifted corner, TMA + wgmma; keys of the space, on
              no candidate list until measured: its ``tma_*`` rows);
``api``       ``ck_conv.conv2d``'s autograd on a ResNeXt layer: dW and dX against fp32 torch, the
              bwd_weight key that ran (``ck_after_run``) equal to the Dispatcher's pick, the eager
              fwd+bwd step against torch's.

Every key timed is compiled first by a pool of processes (Triton's disk cache), so the timing loop
loads kernels.  The JSON is rewritten after every row, so a run cut by ``--budget-s`` keeps its numbers.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "plugins" / "conv"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

TOL = 2e-2
#: (name, dtype, N, G, C, K, H (= W), filter, stride) per section; padding filter // 2
ROWS = {
    "grouped": [
        ("resnext50 l1 3x3 G32 C128", "bf16", 32, 32, 128, 128, 56, 3, 1),
        ("resnext50 l2.0 3x3 s2 G32 C256", "bf16", 32, 32, 256, 256, 56, 3, 2),
        ("resnext50 l2 3x3 G32 C256", "bf16", 32, 32, 256, 256, 28, 3, 1),
        ("resnext50 l3 3x3 G32 C512", "bf16", 32, 32, 512, 512, 14, 3, 1),
        ("resnext50 l4 3x3 G32 C1024", "bf16", 32, 32, 1024, 1024, 7, 3, 1),
        ("broad: resnext50 N8 G32 C256 28x28", "bf16", 8, 32, 256, 256, 28, 3, 1),
    ],
    "depthwise": [
        ("convnext_t dw7 C96 56x56", "bf16", 32, 96, 96, 96, 56, 7, 1),
        ("convnext_t dw7 C384 14x14", "bf16", 32, 384, 384, 384, 14, 7, 1),
        ("mobilenet_v2 dw3 C144 56x56", "fp16", 32, 144, 144, 144, 56, 3, 1),
        ("mobilenet_v2 dw3 s2 C96 112x112", "fp16", 32, 96, 96, 96, 112, 3, 2),
        ("mobilenet_v2 dw3 C384 14x14", "fp16", 32, 384, 384, 384, 14, 3, 1),
        ("efficientnet_b0 dw5 C240 28x28", "fp16", 32, 240, 240, 240, 28, 5, 1),
        ("broad: efficientnet_b0 dw5 s2 C672 14x14", "fp16", 32, 672, 672, 672, 14, 5, 2),
    ],
    "forward": [
        ("resnet50 l1 3x3 C64", "bf16", 32, 1, 64, 64, 56, 3, 1),
        ("resnet50 l2 3x3 C128", "bf16", 32, 1, 128, 128, 28, 3, 1),
        ("resnet50 l3 3x3 C256", "bf16", 32, 1, 256, 256, 14, 3, 1),
        ("resnet50 l4 3x3 C512", "bf16", 32, 1, 512, 512, 7, 3, 1),
        ("broad: resnext50 fwd s2 G32 C256", "fp16", 8, 32, 256, 256, 56, 3, 2),
    ],
}
DIRECTION = {"grouped": "bwd_weight", "depthwise": "bwd_weight", "forward": "forward"}
#: ranked alternatives timed per section after the pick
ALTS = {"grouped": 2, "depthwise": 1, "forward": 2}
#: forward probes on the ungrouped 3x3 rows: keys of the space beyond the shortlist (tile, warps as
#: waves, stages, tap bits), timed to tell which tiles and depths the 3x3 candidate list should hold
FORWARD_PROBES = [((128, 64, 64), (2, 4, 1), 3), ((128, 128, 64), (2, 4, 1), 4), ((128, 64, 128), (2, 4, 1), 4)]
#: the tensor-descriptor forward (session 11: keys of the space, on no candidate list yet): (tile, warps, stages)
TMA_PROBES = [((128, 64, 64), 4, 0), ((128, 64, 64), 8, 4), ((128, 128, 64), 8, 0), ((64, 64, 64), 4, 0),
              ((256, 64, 64), 8, 3), ((128, 128, 64), 8, 4)]
#: the dry run: tiny shapes under the interpreter (fp16: its bf16 dot is not exact enough)
DRY = {
    "grouped": [("tiny grouped G4", "fp16", 1, 4, 16, 16, 12, 3, 1)],
    "depthwise": [("tiny depthwise", "fp16", 1, 8, 8, 8, 10, 3, 1)],
    "forward": [("tiny 3x3", "fp16", 1, 1, 64, 64, 8, 3, 1)],
}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _problem(row, direction, split_k=0):
    from ck_conv.problem import LAYOUT_FAMILIES, ConvProblem

    _, dtype, n, g, c, k, h, f, s = row
    i, w, o = LAYOUT_FAMILIES["nhwgc"][2]
    return ConvProblem(N=n, G=g, C=c, K=k, input_spatial=(h, h), filter=(f, f), stride=(s, s),
                       pad_left=(f // 2,) * 2, pad_right=(f // 2,) * 2, direction=direction, dtype=dtype,
                       in_layout=i, wei_layout=w, out_layout=o, split_k=split_k)


def _operands(row, direction, device, seed=0):
    """(torch-shaped x, w, dy in channels-last memory, our operands of ``direction``)."""
    import torch

    from ck_conv.bench import to_ours

    _, dtype, n, g, c, k, h, f, s = row
    p = _problem(row, direction)
    td = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    gen = torch.Generator(device=device).manual_seed(seed)

    def cl(shape, scale=1.0):
        t = torch.randn((shape[0],) + tuple(shape[2:]) + (shape[1],), generator=gen, device=device) * scale
        return t.to(td).movedim(-1, 1)

    x = cl((n, c, h, h))
    w = cl((k, c // g, f, f), 1 / math.sqrt(c // g * f * f))
    dy = cl((n, k) + tuple(p.output_spatial))
    ops = {"forward": {"x": to_ours(x, g, "x"), "w": to_ours(w, g, "w")},
           "bwd_weight": {"x": to_ours(x, g, "x"), "dy": to_ours(dy, g, "x")}}[direction]
    return x, w, dy, ops


def _peer(row, direction, x, w, dy):
    import torch

    _, _, _, g, _, _, _, f, s = row
    if direction == "forward":
        return lambda: torch.nn.functional.conv2d(x, w, stride=s, padding=f // 2, groups=g)
    cb = torch.ops.aten.convolution_backward
    return lambda: cb(dy, x, w, None, [s, s], [f // 2] * 2, [1, 1], False, [0, 0], g, (False, True, False))[1]


def _compile_task(task):
    """Worker: run each (row, direction, config name) once on its real shapes (fills the disk cache)."""
    import torch

    from ck_conv.backends.triton.launch import run
    from ck_conv.heuristics import named_split
    from ck_conv.keys import ConvKernelConfig
    from ck_core.device import current_arch

    out = []
    for row, direction, name, dev in task:
        if dev == "cpu":   # the dry run: the interpreter (set in the parent's environment)
            from ck_core.plugins import get_manager
            arch = get_manager().arch("sm90")
        else:
            arch = current_arch(torch.device(dev))
        t = time.time()
        try:
            _, _, _, ops = _operands(row, direction, dev)
            cfg, q = named_split(ConvKernelConfig.from_name(name), _problem(row, direction), arch,
                                 ConvKernelConfig.from_name(name).split)
            run(q, ops, cfg)
            if dev != "cpu":
                torch.cuda.synchronize()
            out.append((name, None, round(time.time() - t, 2)))
        except Exception as e:  # reported by the timing loop too
            out.append((name, f"{type(e).__name__}: {str(e)[:200]}", round(time.time() - t, 2)))
    return out


def _ranked(disp, p, n):
    """The first ``n`` keys of the Dispatcher's ranked shortlist for ``p`` (its pick first)."""
    from ck_core import ranker

    op = disp.mgr.op("conv")
    short = []
    for tier in op.shortlist(p, disp.arch, disp.backend):
        short = disp.registry.shortlist(p, tier, disp.backend)
        if short:
            break
    model = disp.ranker(op)
    got = ranker.rank(model, op, p, list(short), disp.arch) if model is not None and short else None
    return (got or op.heuristic(p, list(short), disp.arch))[:n]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON results file")
    ap.add_argument("--budget-s", type=float, default=105.0, help="skip the keys left once this is spent")
    ap.add_argument("--workers", type=int, default=14, help="processes compiling the keys first")
    ap.add_argument("--sections", nargs="+", default=["grouped", "depthwise", "forward", "api"])
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU, correctness only")
    ap.add_argument("--plan-only", action="store_true",
                    help="list the keys each row would time (the real rows, selected for sm90 on the CPU) and stop")
    args = ap.parse_args(argv)
    if args.plan_only:
        import os
        os.environ["TRITON_INTERPRET"] = "1"
    if args.dry_run:
        import os
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ.setdefault("CK_BACKEND", "triton")

    import torch

    from ck_conv.bench import from_ours
    from ck_conv.backends.triton.launch import run
    from ck_conv.geometry import reduction_shape, split_plan
    from ck_conv.heuristics import heuristic_config, named_split
    from ck_conv.keys import config_of
    from ck_core import api as core
    from ck_core.bench import RESULT_SCHEMA
    from ck_core.plugins import get_manager

    if not torch.cuda.is_available() and not args.dry_run and not args.plan_only:
        print("no CUDA device: this check times kernels on a GPU (--dry-run checks the script on the CPU)",
              file=sys.stderr)
        return 2
    dev = "cpu" if args.dry_run else "cuda"
    if args.dry_run or args.plan_only:
        arch = get_manager().arch("sm90")

        def times(fn, graph_only=False):
            fn()
            return {}
    else:
        from ck_core.bench import eager_and_graph_ms
        from ck_core.device import current_arch
        from triton.testing import do_bench_cudagraph

        arch = current_arch(torch.device("cuda"))
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.allow_tf32 = False

        def times(fn, graph_only=False):
            if not graph_only:
                return eager_and_graph_ms(fn)
            fn()
            torch.cuda.synchronize()
            return {"graph_ms": do_bench_cudagraph(fn, rep=40, return_mode="median")}

    rows_of = DRY if args.dry_run else ROWS
    out = {"schema": dict(RESULT_SCHEMA), "kind": "conv_tail_check",
           "device": "cpu (dry run)" if dev == "cpu" or args.plan_only else torch.cuda.get_device_name(0),
           "arch": arch.name,
           "date": dt.datetime.now(dt.timezone.utc).isoformat(),
           "command": " ".join([Path(sys.argv[0]).name] + (sys.argv[1:] if argv is None else list(argv))),
           "commit": _commit(), "torch": torch.__version__, "skipped_for_time": 0, "compile": {},
           **{s: [] for s in args.sections}}
    t_start = time.perf_counter()
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)

    def save():
        out["seconds"] = round(time.perf_counter() - t_start, 1)
        path.write_text(json.dumps(out, indent=1))

    disps = {}

    def disp_for(direction, dtype):
        if (direction, dtype) not in disps:
            disps[direction, dtype] = core.dispatcher_for("conv", arch.name, "triton", directions=(direction,),
                                                          dtypes=(dtype,), ndims=(2,), layouts=("nhwgc",))
        return disps[direction, dtype]

    # 1. what each row runs: the pick, its ranked alternatives, (grouped) its split variants
    plan = []   # (section, row, direction, [(label, config)])
    for sec in [s for s in args.sections if s in ROWS]:
        direction = DIRECTION[sec]
        for row in rows_of[sec]:
            p = _problem(row, direction)
            disp = disp_for(direction, row[1])
            pick = disp.select(p)
            keys = [("pick", config_of(pick))]
            ranked = _ranked(disp, p, 64)
            for i, k in enumerate(ranked[:ALTS[sec] + 1]):
                if k != pick:
                    keys.append((f"alt{i}", config_of(k)))
            if sec == "depthwise":   # the other family at its preferred split: classic (memset, atomics,
                # cast) beside an atomicfix pick (one launch), atomicfix 32x32 w8 beside a classic pick
                c0 = config_of(pick)
                other = (heuristic_config(p) if c0.reduction == "atomicfix" else
                         attrs_evolve(c0, tile=(32, 32, 1), waves=(8, 1, 1), reduction="atomicfix", split=1))
                oc = named_split(attrs_evolve(other, split=1), p, arch)[0]
                if all(oc != x for _, x in keys):
                    keys.append(("classic" if c0.reduction == "atomicfix" else "atomicfix", oc))
            c = config_of(pick)
            if sec == "forward" and row[3] == 1:
                for tile, waves, st in FORWARD_PROBES[:2] if args.dry_run else FORWARD_PROBES:
                    if tile[1] > row[5]:
                        continue   # an N tile wider than the output channels: padding
                    pc = attrs_evolve(c, tile=tile, waves=waves, stages=st, tap_mask=True, pipeline="compv3",
                                      reduction="atomic", split=1, group_merge=1, flat=False)
                    if pc.why_not(p) is None and all(pc != x for _, x in keys):
                        keys.append((f"probe_{'x'.join(map(str, tile))}_st{st}", pc))
                for tile, nw, st in TMA_PROBES[:2] if args.dry_run else TMA_PROBES:
                    if tile[1] > row[5]:
                        continue
                    pc = attrs_evolve(c, tile=tile, waves=(nw, 1, 1), stages=st, tap_mask=False, pipeline="compv3",
                                      reduction="atomic", split=1, group_merge=1, flat=False, tma=True)
                    if pc.why_not(p) is None:
                        keys.append((f"tma_{'x'.join(map(str, tile))}_w{nw}_st{st or 3}", pc))
            if sec == "grouped" and c.reduction != "streamk":
                for label, sp in (("unsplit", 1), ("split_half", c.split // 2), ("split_twice", c.split * 2)):
                    if sp >= 1 and sp != c.split:
                        cs, _ = named_split(c, p, arch, sp)
                        if all(cs != x for _, x in keys):
                            keys.append((label, cs))
            plan.append((sec, row, direction, keys, disp._rule if hasattr(disp, "_rule") else None))
    out["planned_keys"] = sum(len(k) for _, _, _, k, _ in plan)
    if args.plan_only:
        out["plan"] = [{"section": sec, "case": row[0], "rule": rule, "keys": {lb: c.name for lb, c in keys}}
                       for sec, row, _, keys, rule in plan]
        save()
        print(f"{out['planned_keys']} keys planned; listed in {path}")
        return 0

    # 2. compile them in parallel (a process per chunk; the timing loop then loads them)
    if args.workers > 1 and plan:   # (the dry run: two workers on the interpreter, the pool's own check)
        import concurrent.futures as cf
        import multiprocessing as mp

        tasks, chunk = [], []
        for _, row, direction, keys, _ in plan:
            for _, c in keys:
                chunk.append((row, direction, c.name, dev))
                if len(chunk) == 2:
                    tasks.append(chunk)
                    chunk = []
        tasks += [chunk] if chunk else []
        t0 = time.perf_counter()
        ex = cf.ProcessPoolExecutor(min(args.workers, 2) if args.dry_run else args.workers,
                                    mp_context=mp.get_context("spawn"))
        futs = [ex.submit(_compile_task, t) for t in tasks]
        # at most half the budget: what is not compiled by then compiles in the timing loop
        done, late = cf.wait(futs, timeout=args.budget_s / 2)
        for fu in done:
            for name, err, secs in fu.result() if fu.exception() is None else ():
                if err:
                    out["compile"].setdefault("failed", {})[name] = err
        ex.shutdown(wait=False, cancel_futures=True)
        out["compile"].update(seconds=round(time.perf_counter() - t0, 1), tasks=len(tasks), late=len(late))
        save()

    # 3. time them: the picks of every row first, then the alternatives
    results = {}
    first = {"forward": 0, "grouped": 1, "depthwise": 2}   # alternatives: the forward probes first
    for phase in ("pick", "alt"):
        for sec, row, direction, keys, rule in plan if phase == "pick" else sorted(plan, key=lambda t: first[t[0]]):
            rk = (sec, row[0])
            if rk not in results:
                results[rk] = {"case": row[0], "dtype": row[1], "N": row[2], "G": row[3], "C": row[4], "K": row[5],
                               "HW": row[6], "filter": row[7], "stride": row[8], "direction": direction,
                               "rule": rule, "keys": {}}
                out[sec].append(results[rk])
            res = results[rk]
            try:
                x, w, dy, ops = _operands(row, direction, dev, seed=len(res["keys"]))
                peer = _peer(row, direction, x, w, dy)
                want = _peer(row, direction, x.float(), w.float(), dy.float())()
                kind = "w" if direction == "bwd_weight" else "x"
                if phase == "pick":
                    res["peer"] = times(peer)
                for label, c in keys:
                    if (label == "pick") != (phase == "pick"):
                        continue
                    if time.perf_counter() - t_start > args.budget_s:
                        out["skipped_for_time"] += 1
                        continue
                    p = _problem(row, direction)
                    tiles, red = reduction_shape(c, p)
                    kr = res["keys"][label] = {"key": c.name, "programs": tiles * (c.split if c.reduction != "streamk"
                                                                                   else 1),
                                               "warps": c.num_warps, "split": c.split}
                    try:
                        if label == "pick":
                            disp = disp_for(direction, row[1])
                            fn = (lambda d=disp, q=p: d.run(q, **ops))
                        else:
                            q = attrs_evolve(p, split_k=c.split) if c.split > 1 and c.reduction != "streamk" else p
                            if c.split > 1 and c.reduction != "streamk" and split_plan(c, p)[0] != c.split:
                                kr["status"] = "not a key of this problem"
                                continue
                            fn = (lambda q=q, c=c: run(q, ops, c))
                        err = float((from_ours(fn(), kind).float() - want.float()).norm()
                                    / want.float().norm().clamp_min(1e-30))
                        kr["rel_err"] = round(err, 6)
                        if not err < TOL:
                            kr["status"] = "wrong"
                            continue
                        kr.update(times(fn, graph_only=label != "pick"), status="ok")
                        pg = res["peer"].get("graph_ms")
                        if kr.get("graph_ms") and pg:
                            kr["ratio_graph"] = round(pg / kr["graph_ms"], 4)
                        if kr.get("eager_ms") and res["peer"].get("eager_ms"):
                            kr["ratio_eager"] = round(res["peer"]["eager_ms"] / kr["eager_ms"], 4)
                    except Exception as e:  # a key that fails is a row's finding, not the script's end
                        kr.update(status="error", error=f"{type(e).__name__}: {str(e)[:300]}")
            except Exception as e:
                res.update(status="error", error=f"{type(e).__name__}: {str(e)[:300]}")
            save()
            if phase == "pick":
                pk = res["keys"].get("pick", {})
                print(f"{sec:9s} {row[0]:42s} {pk.get('ratio_graph')} {pk.get('key', '')[:90]}", flush=True)

    # 4. the public API on a grouped layer: autograd's bwd_weight key is the Dispatcher's pick
    if "api" in args.sections and time.perf_counter() - t_start < args.budget_s + 10:
        out["api"] = [_api_row(rows_of["grouped"][-1], dev, arch, times, disp_for)]
        save()
    out["summary"] = {sec: _summary(out[sec]) for sec in ROWS if sec in out}
    save()
    print(json.dumps(out["summary"], indent=1))
    return 0


def attrs_evolve(obj, **kw):
    import attrs

    return attrs.evolve(obj, **kw)


def _api_row(row, dev, arch, times, disp_for) -> dict:
    import torch

    from ck_conv.api import conv2d
    from ck_core.hookspecs import hookimpl
    from ck_core.plugins import get_manager

    class Log:
        def __init__(self):
            self.runs = []

        @hookimpl
        def ck_after_run(self, problem, launched):
            self.runs.append((problem.direction, tuple(launched)))

    from ck_core import api as core

    res = {"case": f"conv2d autograd: {row[0]}"}
    log = Log()
    mgr = get_manager()
    mgr.pm.register(log)
    core.clear()   # the API's Dispatchers look for observers when they are made
    try:
        _, dtype, n, g, c, k, h, f, s = row
        x, w, dy, _ = _operands(row, "bwd_weight", dev, seed=5)
        x, w = x.detach().requires_grad_(), w.detach().requires_grad_()

        def step():
            x.grad = w.grad = None
            y = conv2d(x, w, stride=s, padding=f // 2, groups=g)
            y.backward(dy)
            return y

        step()
        xr, wr = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
        torch.nn.functional.conv2d(xr, wr, stride=s, padding=f // 2, groups=g).backward(dy.float())
        res["dw_rel_err"] = round(float((w.grad.float() - wr.grad).norm() / wr.grad.norm()), 6)
        res["dx_rel_err"] = round(float((x.grad.float() - xr.grad).norm() / xr.grad.norm()), 6)
        ran = [names for d, names in log.runs if d == "bwd_weight"]
        p = _problem(row, "bwd_weight")
        res["bwd_weight_ran"] = list(ran[-1]) if ran else None
        # the pick of the Dispatcher of the arch that ran it (the dry run's CPU arch is not sm90)
        ran_arch = ran[-1][0].split(".")[-2] if ran else arch.name
        res["bwd_weight_pick"] = core.dispatcher_for("conv", ran_arch, "triton", directions=("bwd_weight",),
                                                     dtypes=(dtype,), ndims=(2,), layouts=("nhwgc",)).select(p).name
        res["same_key"] = bool(ran) and res["bwd_weight_pick"] in ran[-1]
        res["status"] = "ok" if res["dw_rel_err"] < TOL and res["dx_rel_err"] < TOL and res["same_key"] else "wrong"
        if res["status"] == "ok":
            xt, wt = x.detach().requires_grad_(), w.detach().requires_grad_()

            def peer_step():
                xt.grad = wt.grad = None
                torch.nn.functional.conv2d(xt, wt, stride=s, padding=f // 2, groups=g).backward(dy)

            ours, theirs = {}, {}
            if dev == "cuda":
                import triton

                ours = {"eager_ms": triton.testing.do_bench(step, warmup=5, rep=60, return_mode="median")}
                theirs = {"eager_ms": triton.testing.do_bench(peer_step, warmup=5, rep=60, return_mode="median")}
            res["ours_step"], res["peer_step"] = ours, theirs
            if ours.get("eager_ms") and theirs.get("eager_ms"):
                res["ratio_step_eager"] = round(theirs["eager_ms"] / ours["eager_ms"], 4)
    except Exception as e:
        res.update(status="error", error=f"{type(e).__name__}: {str(e)[:300]}")
    finally:
        mgr.pm.unregister(log)
    return res


def _summary(rows: list) -> dict:
    r = [x["keys"]["pick"]["ratio_graph"] for x in rows if x.get("keys", {}).get("pick", {}).get("ratio_graph")]
    best = []
    for x in rows:   # the best timed key of each row against cuDNN: what the selector could reach
        vals = [k["ratio_graph"] for k in x.get("keys", {}).values() if k.get("ratio_graph")]
        if vals:
            best.append(max(vals))
    gm = (lambda v: round(math.exp(sum(math.log(a) for a in v) / len(v)), 4) if v else None)  # noqa: E731
    return {"n": len(rows), "pick_graph_geomean": gm(r), "pick_graph_min": min(r) if r else None,
            "best_timed_geomean": gm(best), "best_timed_min": min(best) if best else None,
            "wrong": sum(1 for x in rows for k in x.get("keys", {}).values() if k.get("status") == "wrong")}


if __name__ == "__main__":
    sys.exit(main())
