"""``ck bench conv --suite broad``: grouped convolution on the layers users run, through the Dispatcher.

Cases are drawn with a fixed seed from the conv layers of public networks: every distinct layer
of ResNet-50, the grouped 3x3 layers of ResNeXt-50 (G=32), MobileNetV2 and EfficientNet-B0
(depthwise 3x3 / 5x5 at stride 1 and 2, pointwise), a Stable-Diffusion-style UNet/VAE (3x3,
C 128..512, 32..128 spatial), RGB stems (C=3), 1D audio (k 3..31) and 3D video (3x3x3, 1x3x3,
3x1x1); batch 1, 8 or 32; fp16 or bf16; forward, bwd_data and bwd_weight.  Ours is the
Dispatcher's own choice (``Dispatcher.run``), cuDNN runs through PyTorch on the same
channels-last memory (forward ``F.conv*d``; backward ``aten.convolution_backward``, what autograd
runs).  Each row is checked against an fp32 result first.  Timed as CUDA-graph replays and
eagerly.  Whole networks are held out from the training split (``split`` column).

Issue #29's strata: every direction and kind of layer (:data:`KINDS`: 1x1, 3x3, 5x5, 7x7, strided,
grouped, depthwise, stems, 1D, 3D; :func:`kinds`).  After the seeded draws, a second generator adds a
layer for every (direction, kind) cell they left empty.  The summary gives ``direction/kind`` and
``all/kind`` their geomean and minimum (graph and eager); depthwise rows, memory-bound, also report
the bandwidth reached (``ours_gb_s`` / ``peer_gb_s``: bytes of x, w and dy over the graph time).
``--quick``: the first case of every stratum.
"""
from __future__ import annotations

import json
import math
import random
import sys
import time
from typing import Optional

from ck_core.bench import broad_result, eager_and_graph_ms, geomean, with_header
from ck_core.bench import shard as shard_cases
from ck_core.progress import Progress

SEED = 20261125
DIRECTIONS = ("forward", "bwd_data", "bwd_weight")
HELD_OUT_NETS = ("efficientnet_b0", "vae")

# (net, C, K, G, spatial, filter, stride, pad): one row per distinct layer shape
LAYERS = (
    # ResNet-50 (bottleneck 1x1 / 3x3 / 1x1, downsampling 1x1 stride 2, 7x7 stem)
    ("resnet50", 3, 64, 1, (224, 224), (7, 7), 2, 3),
    ("resnet50", 64, 64, 1, (56, 56), (1, 1), 1, 0), ("resnet50", 64, 64, 1, (56, 56), (3, 3), 1, 1),
    ("resnet50", 64, 256, 1, (56, 56), (1, 1), 1, 0), ("resnet50", 256, 64, 1, (56, 56), (1, 1), 1, 0),
    ("resnet50", 256, 128, 1, (56, 56), (1, 1), 1, 0), ("resnet50", 128, 128, 1, (56, 56), (3, 3), 2, 1),
    ("resnet50", 128, 128, 1, (28, 28), (3, 3), 1, 1), ("resnet50", 128, 512, 1, (28, 28), (1, 1), 1, 0),
    ("resnet50", 256, 512, 1, (56, 56), (1, 1), 2, 0), ("resnet50", 512, 128, 1, (28, 28), (1, 1), 1, 0),
    ("resnet50", 512, 256, 1, (28, 28), (1, 1), 1, 0), ("resnet50", 256, 256, 1, (28, 28), (3, 3), 2, 1),
    ("resnet50", 256, 256, 1, (14, 14), (3, 3), 1, 1), ("resnet50", 256, 1024, 1, (14, 14), (1, 1), 1, 0),
    ("resnet50", 512, 1024, 1, (28, 28), (1, 1), 2, 0), ("resnet50", 1024, 256, 1, (14, 14), (1, 1), 1, 0),
    ("resnet50", 1024, 512, 1, (14, 14), (1, 1), 1, 0), ("resnet50", 512, 512, 1, (14, 14), (3, 3), 2, 1),
    ("resnet50", 512, 512, 1, (7, 7), (3, 3), 1, 1), ("resnet50", 512, 2048, 1, (7, 7), (1, 1), 1, 0),
    ("resnet50", 1024, 2048, 1, (14, 14), (1, 1), 2, 0), ("resnet50", 2048, 512, 1, (7, 7), (1, 1), 1, 0),
    # ResNeXt-50 32x4d grouped 3x3
    ("resnext50", 128, 128, 32, (56, 56), (3, 3), 1, 1), ("resnext50", 256, 256, 32, (28, 28), (3, 3), 1, 1),
    ("resnext50", 256, 256, 32, (56, 56), (3, 3), 2, 1), ("resnext50", 512, 512, 32, (14, 14), (3, 3), 1, 1),
    ("resnext50", 1024, 1024, 32, (7, 7), (3, 3), 1, 1),
    # MobileNetV2: stem, depthwise 3x3 (stride 1 and 2), pointwise
    ("mobilenet_v2", 3, 32, 1, (224, 224), (3, 3), 2, 1), ("mobilenet_v2", 32, 32, 32, (112, 112), (3, 3), 1, 1),
    ("mobilenet_v2", 96, 96, 96, (112, 112), (3, 3), 2, 1), ("mobilenet_v2", 144, 144, 144, (56, 56), (3, 3), 1, 1),
    ("mobilenet_v2", 144, 144, 144, (56, 56), (3, 3), 2, 1), ("mobilenet_v2", 384, 384, 384, (14, 14), (3, 3), 1, 1),
    ("mobilenet_v2", 960, 960, 960, (7, 7), (3, 3), 1, 1), ("mobilenet_v2", 144, 24, 1, (56, 56), (1, 1), 1, 0),
    ("mobilenet_v2", 24, 144, 1, (56, 56), (1, 1), 1, 0), ("mobilenet_v2", 576, 96, 1, (14, 14), (1, 1), 1, 0),
    # EfficientNet-B0: depthwise 5x5 (stride 1 and 2), 3x3, pointwise
    ("efficientnet_b0", 3, 32, 1, (224, 224), (3, 3), 2, 1),
    ("efficientnet_b0", 144, 144, 144, (56, 56), (5, 5), 2, 2),
    ("efficientnet_b0", 240, 240, 240, (28, 28), (5, 5), 1, 2),
    ("efficientnet_b0", 480, 480, 480, (14, 14), (5, 5), 1, 2),
    ("efficientnet_b0", 672, 672, 672, (14, 14), (5, 5), 2, 2),
    ("efficientnet_b0", 1152, 1152, 1152, (7, 7), (5, 5), 1, 2),
    ("efficientnet_b0", 96, 96, 96, (112, 112), (3, 3), 2, 1),
    ("efficientnet_b0", 1152, 192, 1, (7, 7), (1, 1), 1, 0),
    # Stable-Diffusion-style UNet and VAE 3x3
    ("unet", 320, 320, 1, (64, 64), (3, 3), 1, 1), ("unet", 640, 640, 1, (32, 32), (3, 3), 1, 1),
    ("unet", 320, 640, 1, (32, 32), (3, 3), 1, 1), ("unet", 4, 320, 1, (64, 64), (3, 3), 1, 1),
    ("unet", 320, 320, 1, (64, 64), (3, 3), 2, 1),
    ("vae", 128, 128, 1, (128, 128), (3, 3), 1, 1), ("vae", 256, 256, 1, (64, 64), (3, 3), 1, 1),
    ("vae", 512, 512, 1, (32, 32), (3, 3), 1, 1), ("vae", 256, 128, 1, (128, 128), (3, 3), 1, 1),
    # 1D audio (wav2vec-style feature encoder and 1D residual blocks)
    ("audio1d", 1, 512, 1, (16000,), (10,), 5, 0), ("audio1d", 512, 512, 1, (3199,), (3,), 2, 0),
    ("audio1d", 256, 256, 1, (4000,), (31,), 1, 15), ("audio1d", 128, 128, 1, (8000,), (7,), 1, 3),
    ("audio1d", 512, 512, 512, (2000,), (15,), 1, 7),
    # 3D video (C3D / R(2+1)D / temporal 3x1x1)
    ("video3d", 64, 64, 1, (16, 56, 56), (3, 3, 3), 1, 1), ("video3d", 128, 128, 1, (8, 28, 28), (3, 3, 3), 1, 1),
    ("video3d", 64, 144, 1, (16, 56, 56), (1, 3, 3), 1, (0, 1, 1)),
    ("video3d", 144, 64, 1, (16, 56, 56), (3, 1, 1), 1, (1, 0, 0)),
    ("video3d", 3, 64, 1, (16, 112, 112), (3, 7, 7), (1, 2, 2), (1, 3, 3)),
)


#: issue #29's kinds of layer (a layer may be several: a strided depthwise 5x5 is three)
KINDS = ("1x1", "3x3", "5x5", "7x7", "strided", "grouped", "depthwise", "stem", "1d", "3d")


def kinds(c: dict) -> list[str]:
    """The kinds of a case's layer: its square 2D filter (``1x1`` .. ``7x7``) or ``1d`` / ``3d``;
    ``strided`` (a stride above 1), ``grouped`` (1 < G < C), ``depthwise`` (G = C = K > 1),
    ``stem`` (at most 4 input channels: RGB, latents, audio)."""
    flt, nd = tuple(c["filter"]), len(c["filter"])
    out = []
    if nd == 1:
        out.append("1d")
    elif nd == 3:
        out.append("3d")
    elif flt[0] == flt[1] and f"{flt[0]}x{flt[1]}" in KINDS:
        out.append(f"{flt[0]}x{flt[1]}")
    if max(c["stride"]) > 1:
        out.append("strided")
    if 1 < c["G"] < c["C"]:
        out.append("grouped")
    if c["G"] == c["C"] == c["K"] > 1:
        out.append("depthwise")
    if c["C"] <= 4:
        out.append("stem")
    return out


def _case(rng, i: int, direction: Optional[str] = None) -> dict:
    net, C, K, G, sp, flt, st, pd = LAYERS[i]
    nd = len(sp)
    batch = rng.choice((1, 8, 32))
    # keep one tensor under ~1.5 GiB (3D video and the 1D encoder at batch 32 are large)
    while batch > 1 and batch * max(C, K) * math.prod(sp) * 2 > 1.5 * (1 << 30):
        batch //= 2
    st = st if isinstance(st, tuple) else (st,) * nd
    pd = pd if isinstance(pd, tuple) else (pd,) * nd
    dtype = rng.choice(("fp16", "bf16"))
    return dict(net=net, N=batch, C=C, K=K, G=G, spatial=sp, filter=flt, stride=st, pad=pd, dtype=dtype,
                direction=direction or rng.choice(DIRECTIONS), split="heldout" if net in HELD_OUT_NETS else "train")


def cases(seed: int = SEED, n: int = 40, with_strata: bool = True) -> list[dict]:
    """``n`` layers drawn without replacement, each with a batch, a dtype and a direction; then (from
    a second generator, so the first ``n`` never change) a layer for every (direction, kind) cell of
    :data:`DIRECTIONS` x :data:`KINDS` the draws left empty, so every stratum has rows."""
    rng = random.Random(seed)
    picks = rng.sample(range(len(LAYERS)), min(n, len(LAYERS)))
    out = [_case(rng, i) for i in picks]
    if with_strata:
        rng2 = random.Random(seed + 29)
        have = {(c["direction"], k) for c in out for k in kinds(c)}
        train = {_shape(c) for c in out if c["split"] == "train"}
        held = {_shape(c) for c in out if c["split"] == "heldout"}
        for d in DIRECTIONS:
            for kind in KINDS:
                if (d, kind) in have:
                    continue
                layers = [i for i, L in enumerate(LAYERS)
                          if kind in kinds(dict(C=L[1], K=L[2], G=L[3], filter=L[5],
                                                stride=L[6] if isinstance(L[6], tuple) else (L[6],)))]
                for _ in range(20):   # a held-out network's layer never also trains (and the reverse)
                    c = _case(rng2, rng2.choice(layers), d)
                    if _shape(c) not in (held if c["split"] == "train" else train):
                        break
                out.append(c)
                (train if c["split"] == "train" else held).add(_shape(c))
                have |= {(d, k) for k in kinds(c)}
    for c in out:
        c["case"] = case_name(c)
    return out


def _shape(c: dict) -> tuple:
    return (c["N"], c["C"], c["K"], c["G"], tuple(c["spatial"]), tuple(c["filter"]), tuple(c["stride"]),
            tuple(c["pad"]), c["dtype"], c["direction"])


def strata(c: dict) -> list[str]:
    """The strata a case counts in: ``direction/kind`` for each of its :func:`kinds`."""
    return [f"{c['direction']}/{k}" for k in kinds(c)]


def quick_cases(cs: list[dict]) -> list[dict]:
    """``--quick``: the first case of every stratum not yet covered (one GPU, minutes)."""
    seen, out = set(), []
    for c in cs:
        new = [s for s in strata(c) if s not in seen]
        if new:
            seen.update(new)
            out.append(c)
    return out


def case_name(c: dict) -> str:
    """A case's name: network, direction, dtype and the layer's sizes."""
    return (f"{c['net']} {c['direction']} {c['dtype']} N{c['N']} G{c['G']} C{c['C']} K{c['K']} "
            f"{'x'.join(map(str, c['spatial']))} f{'x'.join(map(str, c['filter']))} "
            f"s{'x'.join(map(str, c['stride']))}")


def _problem(c):
    from .problem import ConvProblem

    return ConvProblem(N=c["N"], G=c["G"], C=c["C"], K=c["K"], input_spatial=tuple(c["spatial"]),
                       filter=tuple(c["filter"]), stride=tuple(c["stride"]), pad_left=tuple(c["pad"]),
                       pad_right=tuple(c["pad"]), direction=c["direction"], dtype=c["dtype"],
                       # bwd_weight: 0 = the split over N*spatial is chosen per problem (as a user's call gets)
                       split_k=0 if c["direction"] == "bwd_weight" else 1)


def _channels_last(shape, dtype, device, scale=1.0):
    """A torch-shaped (N, C, *sp) tensor whose memory is channels-last (N, *sp, C)."""
    import torch

    t = torch.randn((shape[0],) + tuple(shape[2:]) + (shape[1],), device=device, dtype=torch.float32) * scale
    return t.to(dtype).movedim(-1, 1)


def _peer(c, x, w, dy):
    import torch
    import torch.nn.functional as F

    nd = len(c["spatial"])
    conv = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
    st, pd, g = list(c["stride"]), list(c["pad"]), c["G"]
    if c["direction"] == "forward":
        return lambda: conv(x, w, stride=st, padding=pd, groups=g)
    mask = (True, False, False) if c["direction"] == "bwd_data" else (False, True, False)
    idx = 0 if c["direction"] == "bwd_data" else 1
    cb = torch.ops.aten.convolution_backward
    return lambda: cb(dy, x, w, None, st, pd, [1] * nd, False, [0] * nd, g, mask)[idx]




def run(out_path: Optional[str] = None, budget_s: float = 300.0, seed: int = SEED, arch: Optional[str] = None,
        limit: Optional[int] = None, progress=None, shard: str = "", quick: bool = False) -> dict:
    import torch

    from ck_core import Dispatcher, Registry, get_manager
    from ck_core.bench import device_name
    from ck_core.errors import UnsupportedProblem

    from .bench import from_ours, rel_err, to_ours

    if not torch.cuda.is_available():
        raise UnsupportedProblem("the broad conv suite times CUDA kernels: no CUDA device is visible")
    mgr = get_manager()
    arch_name = arch
    if arch_name is None:
        tb = mgr.backend("triton")
        arch_name = next(a.name for a in mgr.archs().values() if tb.can_execute(a)[0] and a.vendor != "other")
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    disps = {}
    rows, skipped = [], []
    t0 = time.time()
    cs = quick_cases(cases(seed)) if quick else cases(seed)
    cs = shard_cases(cs[:limit] if limit else cs, shard)
    # a bar on a terminal, a line every 30 s in a log (ck bench passes its own, -q silences it)
    counter = (progress or Progress)(len(cs), "ck bench conv --suite broad")
    for c in counter.each(cs, lambda c: c["case"]):
        if time.time() - t0 > budget_s:
            skipped.append(c["case"])
            continue
        row = {k: (list(v) if isinstance(v, tuple) else v) for k, v in c.items()}
        row.update(kinds=kinds(c), strata=strata(c))
        t_case = time.time()
        try:
            p = _problem(c)
            dk = (c["dtype"], c["direction"])
            if dk not in disps:
                reg = Registry.from_enumeration("conv", arch_name, "triton", dtypes=[c["dtype"]])
                disps[dk] = Dispatcher(reg, backend="triton")
            disp = disps[dk]
            dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[c["dtype"]]
            G = c["G"]
            x = _channels_last((c["N"], c["C"]) + tuple(c["spatial"]), dt, "cuda")
            w = _channels_last((c["K"], c["C"] // G) + tuple(c["filter"]), dt, "cuda",
                               1 / math.sqrt(c["C"] // G * math.prod(c["filter"])))
            dy = _channels_last((c["N"], c["K"]) + tuple(p.output_spatial), dt, "cuda")
            ops = {"forward": {"x": to_ours(x, G, "x"), "w": to_ours(w, G, "w")},
                   "bwd_data": {"dy": to_ours(dy, G, "x"), "w": to_ours(w, G, "w")},
                   "bwd_weight": {"x": to_ours(x, G, "x"), "dy": to_ours(dy, G, "x")}}[c["direction"]]
            kind = "w" if c["direction"] == "bwd_weight" else "x"
            peer = _peer(c, x, w, dy)
            ref = _peer(c, x.float(), w.float(), dy.float())()
            t_first = time.time()
            out = disp.run(p, **ops)
            torch.cuda.synchronize()
            row["first_call_s"] = round(time.time() - t_first, 3)
            row["kernels"] = [s.key.name for s in disp.plan(p).stages]
            err = rel_err(from_ours(out, kind), ref)
            row["rel_err"] = err
            row["status"] = "ok" if err < 2e-2 else "wrong"
            if row["status"] == "ok":
                ours, theirs = eager_and_graph_ms(lambda: disp.run(p, **ops)), eager_and_graph_ms(peer)
                for mode in ("graph", "eager"):
                    o, t = ours.get(f"{mode}_ms"), theirs.get(f"{mode}_ms")
                    row[f"ours_{mode}_ms"], row[f"peer_{mode}_ms"] = o, t
                    if o and t:
                        row[f"ratio_{mode}"] = round(t / o, 4)
                fl = float(p.flops)
                if fl and ours.get("graph_ms") and theirs.get("graph_ms"):
                    row["ours"] = round(fl / ours["graph_ms"] / 1e9, 2)
                    row["peer"] = round(fl / theirs["graph_ms"] / 1e9, 2)
                else:
                    row["ours"], row["peer"] = ours.get("graph_ms"), theirs.get("graph_ms")
                row.update(unit="TFLOPS (graph)" if fl else "ms (graph)",
                           peer_name="cuDNN via torch (channels_last)", ratio=row.get("ratio_graph"))
                if "depthwise" in row["kinds"]:   # memory-bound: the bandwidth reached beside the ratio
                    nbytes = (x.numel() + w.numel() + dy.numel()) * x.element_size()
                    row["bytes_moved"] = nbytes
                    for who, t in (("ours", ours), ("peer", theirs)):
                        if t.get("graph_ms"):
                            row[f"{who}_gb_s"] = round(nbytes / t["graph_ms"] / 1e6, 1)
            del x, w, dy, out, ref
        except Exception as exc:
            row.update(status="error", error=f"{type(exc).__name__}: {str(exc)[:300]}")
        row["case_s"] = round(time.time() - t_case, 2)
        rows.append(row)
        print(f"{row['case']:78s} {row.get('status'):6s} graph={row.get('ratio_graph')} "
              f"eager={row.get('ratio_eager')} {row.get('error', '')[:100]}", flush=True)
        torch.cuda.empty_cache()
    res = with_header({"suite": "broad", "seed": seed, "arch": arch_name, "rows": rows, "skipped_for_time": skipped,
                       "summary": summary(rows), "elapsed_s": round(time.time() - t0, 1)},
                      command="python -m ck_conv.bench_broad " + " ".join(sys.argv[1:]), device=device_name())
    if out_path:
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return res




def _geomean(vals):
    g = geomean(vals)
    return round(g, 4) if g else None


def _stats(rs: list[dict]) -> dict:
    out = {"n": len(rs), "wrong": sum(r.get("status") == "wrong" for r in rs),
           "errors": sum(r.get("status") == "error" for r in rs),
           "graph_geomean": _geomean(r.get("ratio_graph") for r in rs),
           "graph_min": min((r["ratio_graph"] for r in rs if r.get("ratio_graph")), default=None),
           "eager_geomean": _geomean(r.get("ratio_eager") for r in rs),
           "eager_min": min((r["ratio_eager"] for r in rs if r.get("ratio_eager")), default=None)}
    if any(r.get("ours_gb_s") for r in rs):   # depthwise: bandwidth reached, ours and cuDNN's
        out["ours_gb_s_geomean"] = _geomean(r.get("ours_gb_s") for r in rs)
        out["peer_gb_s_geomean"] = _geomean(r.get("peer_gb_s") for r in rs)
    return out


def summary(rows: list[dict]) -> dict:
    """``direction/split`` (``all`` directions too), then issue #29's strata: ``direction/kind`` for
    every direction and kind of :data:`KINDS` with rows, and ``all/kind`` over the directions."""
    out = {}
    for d in DIRECTIONS + ("all",):
        for split in ("all", "train", "heldout"):
            rs = [r for r in rows if (d == "all" or r["direction"] == d) and (split == "all" or r["split"] == split)]
            out[f"{d}/{split}"] = _stats(rs)
    for d in DIRECTIONS + ("all",):
        for k in KINDS:
            rs = [r for r in rows if (d == "all" or r["direction"] == d) and k in (r.get("kinds") or _kinds_of(r))]
            if rs:
                out[f"{d}/{k}"] = _stats(rs)
    return out


def _kinds_of(r: dict) -> list:
    try:
        return kinds(r)
    except (KeyError, TypeError, ValueError):   # a row of an older run without the layer's fields
        return []


def bench(peer: str, options: dict) -> dict:
    from ck_core.errors import UnsupportedProblem

    if peer not in ("torch", "cudnn"):
        raise UnsupportedProblem(f"conv benchmarks compare with 'torch' (cuDNN), not {peer!r}")
    res = run(None, float(options.get("budget") or 300.0), arch=options.get("arch"),
              quick=bool(options.get("quick")), progress=options.get("progress"))
    return broad_result(res)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/conv_broad.json")
    ap.add_argument("--budget", type=float, default=300.0)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--shard", default="", metavar="I/N", help="every N-th case from the I-th (one GPU of N)")
    ap.add_argument("--quick", action="store_true", help="the first case of every direction/kind stratum")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    if a.list:
        for c in (quick_cases(cases()) if a.quick else cases()):
            print(c["split"], ",".join(kinds(c)), c["case"])
    else:
        print(json.dumps(run(a.out, a.budget, limit=a.limit or None, shard=a.shard, quick=a.quick)["summary"],
                         indent=1))
