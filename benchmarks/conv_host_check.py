"""GPU check of the conv eager host path (issue #26): the kernels that read NCHW in place, warm-call
launch counts, and torch.compile of conv forward and forward+backward.  Under 2 minutes on one GPU.

(1) ``nchw``: the implicit-GEMM and im2col forward, both bwd_data kernels and the per-tap bwd_weight
    kernel on NCHW tensors (fp16 / bf16; 3x3, strided, dilated, 1x1, grouped, split reductions, stream-K, 1D / 3D) against
    float64 torch, over outputs poisoned with NaN (compiles each NCHW kernel variant on the device).
(2) ``warm``: per warm eager call (conv1d/2d/3d NCHW, channels-last, grouped; forward and fwd+bwd)
    the launches it makes (the profiler's CUDA kernels of one call, ours and torch's) and the us/call;
    the NCHW ResNet layer also with the in-place bound lifted (``ck_in_place``: the in-place kernels on a
    large problem vs the channels-last copies, what ``launch_cost.nchw_in_place_max_mmac`` should weigh).
(3) ``compile``: ``torch.compile(mode="reduce-overhead")`` (Inductor + CUDA graphs; ``--compile-modes``
    adds others, e.g. ``default``) of a forward and of a fwd+bwd step, NCHW and channels-last, against
    float64 torch; the error and the tail of its traceback where one fails to trace or run.

    python benchmarks/conv_host_check.py --out conv_host_check.json [--parts nchw warm compile]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback


#: the device the parts run on (``--device cpu``: the nchw part on the interpreter, a dry run of the script)
DEV = "cuda"


def _rel(a, b) -> float:
    return float((a.detach().double() - b.detach().double()).norm() / max(b.detach().double().norm(), 1e-30))


def _err(e: BaseException) -> dict:
    return {"error": f"{type(e).__name__}: {e}"[:600], "traceback": traceback.format_exc()[-2500:]}


def nchw_part() -> list:
    """Each NCHW kernel variant through the launcher, over NaN-poisoned outputs, vs float64 torch."""
    import attrs
    import torch

    from ck_conv.backends.triton import launch as L
    from ck_conv.geometry import split_plan
    from ck_conv.heuristics import flat_candidates, heuristic_config
    from ck_conv.problem import LAYOUT_FAMILIES, ConvProblem

    real_empty = torch.empty

    def poisoned(*a, **k):
        t = real_empty(*a, **k)
        return t.fill_(math.nan) if t.is_floating_point() else t

    shapes = {
        "3x3 s1 C64": dict(N=4, G=1, C=64, K=64, input_spatial=(28, 28), filter=(3, 3), pad_left=1, pad_right=1),
        "3x3 s2 dil2 C48 K40 odd": dict(N=3, G=1, C=48, K=40, input_spatial=(17, 19), filter=(3, 3), stride=(2, 2),
                                        pad_left=2, pad_right=2, dilation=(2, 2)),
        "1x1 C128 K96": dict(N=2, G=1, C=128, K=96, input_spatial=(14, 15), filter=(1, 1)),
        "1x1 s2 C64 K32": dict(N=2, G=1, C=64, K=32, input_spatial=(15, 14), filter=(1, 1), stride=(2, 2)),
        "grouped G4 C64": dict(N=2, G=4, C=64, K=64, input_spatial=(13, 11), filter=(3, 3), pad_left=1, pad_right=1),
        "1d C32": dict(N=3, G=1, C=32, K=48, input_spatial=(101,), filter=(5,), pad_left=(2,), pad_right=(2,)),
        "3d C16": dict(N=2, G=1, C=16, K=32, input_spatial=(6, 9, 10), filter=(3, 3, 3), pad_left=1, pad_right=1),
    }
    rows = []
    # every shape with the heuristic's kernel in fp16; bf16 on two; the kernel variants on one (each
    # variant is a compile of its own: the part stays near a minute)
    plan = [(name, "fp16", False) for name in shapes] + [("3x3 s1 C64", "bf16", False), ("1d C32", "bf16", False),
                                                         ("3x3 s2 dil2 C48 K40 odd", "fp16", True)]
    for name, dtype, all_variants in plan:
        shape = shapes[name]
        nd = len(shape["input_spatial"])
        i, w, o = LAYOUT_FAMILIES["ngchw"][nd]
        for direction in ("forward", "bwd_data", "bwd_weight"):
            p = ConvProblem(**shape, direction=direction, dtype=dtype, in_layout=i, wei_layout=w, out_layout=o,
                            split_k=0)
            base = heuristic_config(p)
            if direction == "bwd_weight":   # the per-tap kernel: the one that reads NCHW in place
                base = attrs.evolve(base, tma=False, flat=False, group_merge=1)
            variants = {"heuristic": (base, 1)}
            if all_variants:
                variants.update({"tap bits": (attrs.evolve(base, tap_mask=True), 1),
                                 "atomic split 3": (attrs.evolve(base, reduction="atomic"), 3),
                                 "fixup split 3": (attrs.evolve(base, reduction="fixup"), 3)})
                if direction == "bwd_weight":
                    variants["atomicfix split 3"] = (attrs.evolve(base, reduction="atomicfix"), 3)
                else:
                    variants["stream-K"] = (attrs.evolve(base, reduction="streamk", tap_mask=True), 2)
                if direction == "forward":
                    flat = [c for c in flat_candidates(p) if c.why_not(p) is None]
                    if flat:
                        variants["im2col"] = (flat[0], 1)
            for vname, (cfg, split) in variants.items():
                row = {"shape": name, "direction": direction, "dtype": dtype, "variant": vname}
                try:
                    if split > 1 and cfg.reduction != "streamk":
                        split = split_plan(attrs.evolve(cfg, split=split), p)[0]
                    q, c = attrs.evolve(p, split_k=split), attrs.evolve(cfg, split=split)
                    why = c.why_not(q)
                    if why:
                        row["skipped"] = why
                        rows.append(row)
                        continue
                    row["key"] = c.name
                    td = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
                    g = torch.Generator(device=DEV).manual_seed(len(rows))
                    xs = (q.N, q.C, *q.input_spatial)
                    ws = (q.K, q.C // q.G, *q.filter)
                    ys = (q.N, q.K, *q.output_spatial)
                    kw = dict(stride=q.stride, padding=q.pad_left, dilation=q.dilation, groups=q.G)
                    conv = (torch.nn.functional.conv1d, torch.nn.functional.conv2d,
                            torch.nn.functional.conv3d)[nd - 1]
                    wt = torch.randn(ws, device=DEV, generator=g).to(td)
                    torch.empty = poisoned
                    try:
                        if direction == "forward":
                            xt = torch.randn(xs, device=DEV, generator=g).to(td)
                            out = L.run(q, {"x": xt.view(q.N, q.G, q.C // q.G, *q.input_spatial),
                                            "w": wt.view(q.G, q.K // q.G, q.C // q.G, *q.filter)}, c)
                            want = conv(xt.double(), wt.double(), **kw)
                        elif direction == "bwd_weight":
                            xt = torch.randn(xs, device=DEV, generator=g).to(td)
                            dyt = torch.randn(ys, device=DEV, generator=g).to(td)
                            out = L.run(q, {"x": xt.view(q.N, q.G, q.C // q.G, *q.input_spatial),
                                            "dy": dyt.view(q.N, q.G, q.K // q.G, *q.output_spatial)}, c)
                            wd = torch.zeros(ws, device=DEV, dtype=torch.float64, requires_grad=True)
                            conv(xt.double(), wd, **kw).backward(dyt.double())
                            want = wd.grad
                        else:
                            dyt = torch.randn(ys, device=DEV, generator=g).to(td)
                            out = L.run(q, {"dy": dyt.view(q.N, q.G, q.K // q.G, *q.output_spatial),
                                            "w": wt.view(q.G, q.K // q.G, q.C // q.G, *q.filter)}, c)
                            xd = torch.zeros(xs, device=DEV, dtype=torch.float64, requires_grad=True)
                            conv(xd, wt.double(), **kw).backward(dyt.double())
                            want = xd.grad
                    finally:
                        torch.empty = real_empty
                    if DEV == "cuda":
                        torch.cuda.synchronize()
                    row["rel_err"] = _rel(out.reshape(want.shape), want)
                    row["ok"] = bool(row["rel_err"] < (2e-3 if dtype == "fp16" else 1.5e-2))
                except Exception as e:  # noqa: BLE001 - one variant failing must not lose the others
                    row.update(_err(e), ok=False)
                rows.append(row)
                print(json.dumps(row)[:300], flush=True)
    return rows


def _cases():
    import torch

    import ck_conv

    F = torch.nn.functional
    g = torch.Generator(device=DEV).manual_seed(0)
    out = {}
    for nd, ours, theirs in ((1, ck_conv.conv1d, F.conv1d), (2, ck_conv.conv2d, F.conv2d),
                             (3, ck_conv.conv3d, F.conv3d)):
        out[f"conv{nd}d 2x16x8 k3"] = (nd, (2, 16, *(8,) * nd), (16, 16, *(3,) * nd), 1, None, ours, theirs)
    cl = torch.channels_last
    out["conv2d channels_last 2x16x8x8 k3"] = (2, (2, 16, 8, 8), (16, 16, 3, 3), 1, cl, ck_conv.conv2d, F.conv2d)
    out["conv2d groups=2 2x16x8x8 k3"] = (2, (2, 16, 8, 8), (32, 8, 3, 3), 2, None, ck_conv.conv2d, F.conv2d)
    out["conv2d 64x256x14x14 k3 (ResNet layer3)"] = (2, (64, 256, 14, 14), (256, 256, 3, 3), 1, None,
                                                     ck_conv.conv2d, F.conv2d)
    return out, g


def _operands(spec, g, grad):
    import torch

    nd, xs, ws, groups, fmt, _, _ = spec
    x = torch.randn(xs, device=DEV, generator=g).half()
    w = (torch.randn(ws, device=DEV, generator=g) * 0.1).half()
    if fmt is not None:
        x, w = x.to(memory_format=fmt), w.to(memory_format=fmt)
    if grad:
        x.requires_grad_()
        w.requires_grad_()
    return x, w, dict(padding=1, groups=groups)


def _kernels_per_call(fn) -> int:
    import torch

    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def _us(fn, calls=200) -> float:
    import torch

    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    best = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best.append((time.perf_counter() - t0) / calls * 1e6)
    return round(min(best), 2)


def warm_part() -> dict:
    import torch

    cases, g = _cases()
    rows = {}
    for name, spec in cases.items():
        for grad in (False, True):
            row = {}
            try:
                x, w, kw = _operands(spec, g, grad)
                ours, theirs = spec[5], spec[6]
                dy = torch.randn_like(theirs(x, w, **kw)) if grad else None
                for label, conv in (("ck", ours), ("torch", theirs)):
                    if grad:
                        def fn(conv=conv):
                            x.grad = w.grad = None
                            conv(x, w, **kw).backward(dy)
                    else:
                        def fn(conv=conv):
                            return conv(x, w, **kw)
                    row[label] = {"kernels_per_call": _kernels_per_call(fn), "us_per_call": _us(fn)}
                row["ratio"] = round(row["ck"]["us_per_call"] / row["torch"]["us_per_call"], 2)
                if spec[4] is None and "ResNet" in name:   # NCHW above the in-place bound: also in place
                    from ck_conv import api
                    from ck_core import api as core

                    core.clear()
                    api._IN_PLACE[:] = [1 << 62]
                    try:
                        def fn():
                            if grad:
                                x.grad = w.grad = None
                                ours(x, w, **kw).backward(dy)
                            else:
                                ours(x, w, **kw)
                        row["ck_in_place"] = {"kernels_per_call": _kernels_per_call(fn), "us_per_call": _us(fn)}
                    finally:
                        core.clear()
            except Exception as e:  # noqa: BLE001
                row.update(_err(e))
            key = name + (" fwd+bwd" if grad else "")
            rows[key] = row
            print(key, json.dumps(row)[:300], flush=True)
    return rows


#: torch.compile modes of the compile part (``--compile-modes``; each case and mode is a compile of its own)
COMPILE_MODES = ["reduce-overhead"]


def compile_part() -> dict:
    import torch

    cases, g = _cases()
    rows = {}
    for name in ("conv2d 2x16x8 k3", "conv2d channels_last 2x16x8x8 k3"):
        spec = cases[name]
        ours, theirs = spec[5], spec[6]
        for mode in COMPILE_MODES:
            for grad in (False, True):
                key = f"{name} {'fwd+bwd' if grad else 'forward'} mode={mode}"
                row = {}
                try:
                    torch._dynamo.reset()
                    x, w, kw = _operands(spec, g, grad)
                    f = torch.compile(lambda x, w: ours(x, w, **kw).float().sin(), mode=mode)
                    for it in range(3):   # warm-up, record, replay (CUDA graphs)
                        if mode == "reduce-overhead":
                            torch.compiler.cudagraph_mark_step_begin()
                        if grad:
                            x.grad = w.grad = None
                        y = f(x, w)
                        if grad:
                            y.sum().backward()
                    xd = x.detach().double().requires_grad_()
                    wd = w.detach().double().requires_grad_()
                    want = theirs(xd, wd, **kw).sin()
                    row["rel_err"] = _rel(y, want)
                    if grad:
                        want.sum().backward()
                        row["rel_err_dx"] = _rel(x.grad, xd.grad)
                        row["rel_err_dw"] = _rel(w.grad, wd.grad)
                    row["ok"] = all(v < 5e-3 for k, v in row.items() if k.startswith("rel_err"))
                except Exception as e:  # noqa: BLE001
                    row.update(_err(e), ok=False)
                rows[key] = row
                print(key, json.dumps(row)[:400], flush=True)
    torch._dynamo.reset()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", nargs="+", choices=["nchw", "warm", "compile"], default=["nchw", "warm", "compile"])
    ap.add_argument("--compile-modes", nargs="+", default=COMPILE_MODES, metavar="MODE",
                    help="torch.compile modes of the compile part (default: reduce-overhead)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a dry run of the nchw part on the Triton interpreter (TRITON_INTERPRET=1)")
    ns = ap.parse_args(argv)
    global DEV
    DEV = ns.device
    COMPILE_MODES[:] = ns.compile_modes
    if DEV == "cpu":
        import os

        os.environ["TRITON_INTERPRET"] = "1"
        ns.parts = ["nchw"]
    import torch

    if DEV == "cuda" and not torch.cuda.is_available():
        sys.exit("conv_host_check.py needs a CUDA GPU (or --device cpu for a dry run of the nchw part)")
    res = {"name": "ck.conv_host_check", "version": 1}
    t0 = time.perf_counter()
    parts = {"nchw": nchw_part, "warm": warm_part, "compile": compile_part}
    for part in ns.parts:
        try:
            res[part] = parts[part]()
        except Exception as e:  # noqa: BLE001 - the other parts still run
            res[part] = _err(e)
        res.setdefault("seconds", {})[part] = round(time.perf_counter() - t0, 1)
    from ck_core.bench import with_header

    res = with_header(res, "python benchmarks/conv_host_check.py " + " ".join(sys.argv[1:] if argv is None else argv),
                      torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu (Triton interpreter)")
    with open(ns.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
