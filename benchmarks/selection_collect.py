"""Collect the selection oracle: per shape, the time of every candidate kernel supports() admits.

    python benchmarks/selection_collect.py --op gemm --shapes 1200 --budget-s 240 --out $OUT

Shapes come from a fixed seed (LLM linear layers of public model configs, skinny M, random odd
sizes, batched; fp16 and bf16) with a train / held-out split: whole model configs are held out,
and about 30% of the other shapes.  For each shape every candidate of the registry the public
API uses (``ck_core.api.dispatcher_for`` with the API's options) is run once against an fp32
product (a wrong result is a failure, timed as infinity) and then timed: a GPU sleep kernel
holds the stream while the launches are queued, so the events measure back-to-back kernel time,
not host overhead, with no CUDA graph to capture.  Before timing, a pool of processes JIT-compiles
each (kernel, specialisation class) once, so the main process finds Triton's cache warm.

Rows are appended to ``<out>/<op>_<arch>.jsonl`` as they are measured (a killed run keeps them):
a header line with the kernel names, then one line per shape with ``times`` as
``[[kernel index, ms], ...]`` (``null`` ms: failed) and the heuristic's pick over the full set.
On the CPU (``--backend numpy`` or the Triton interpreter) the same code runs with wall-clock
timing, for tests.

Conv (``--op conv --workers N``): a conv signature's key space holds ~50k keys, so a shape's
candidates are the keys the Dispatcher ranks for it -- the op's first shortlist tier (the
tuning list with its splits) -- and cuDNN on the same channels-last tensors is timed with them
(``peer_ms``).  ``N`` processes check the kernels of different shapes at once (Triton compiles
overlap), then take turns on the GPU to time them, ``--rounds`` times each (the minimum counts).
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import random
import sys
import time
from pathlib import Path

from ck_gemm.bench_broad import MODELS as BROAD_MODELS

SEED = 20261125
#: (name, hidden, intermediate, vocab, q heads, kv heads, head dim): the broad GEMM suite's public
#: model configs and a few more
MODELS = BROAD_MODELS + (
    ("phi3-mini", 3072, 8192, 32064, 32, 32, 96),
    ("gemma2-9b", 3584, 14336, 256000, 16, 8, 256),
    ("bert-base", 768, 3072, 30522, 12, 12, 64),
)
#: model configs whose every layer is held out (never in training)
HELD_OUT_MODELS = ("qwen2-7b", "llama2-13b", "phi3-mini")
#: most FLOPs one measured shape may have (keeps one candidate's timing under ~2 ms)
MAX_FLOPS = 6e11


def _log_uniform(rng, lo, hi) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def gemm_cases(n: int, seed: int = SEED, max_dim: int = 16384) -> list[dict]:
    """``n`` GEMM shapes: 55% LLM layers, 20% skinny M, 15% odd sizes, 10% batched."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        r = rng.random()
        if r < 0.55:
            name, h, inter, vocab, nq, nkv, hd = rng.choice(MODELS)
            tokens = _log_uniform(rng, 1, 8192)
            layer, nn, k = rng.choice((("qkv", (nq + 2 * nkv) * hd, h), ("o", h, nq * hd), ("up", 2 * inter, h),
                                       ("down", h, inter), ("vocab", vocab, h)))
            c = dict(family=f"llm:{name}:{layer}", m=tokens, n=nn, k=k, batch=1, layout="rcr",
                     split="heldout" if name in HELD_OUT_MODELS else None)
        elif r < 0.75:
            # hidden sizes of real models are multiples of 256
            c = dict(family="skinny", m=rng.choice((1, 2, 4, 8, 16, 24, 32, 48, 64)),
                     n=_log_uniform(rng, 2, 128) * 256, k=_log_uniform(rng, 2, 64) * 256, batch=1,
                     layout=rng.choice(("rcr", "rcr", "rrr")))
        elif r < 0.9:
            c = dict(family="odd", m=_log_uniform(rng, 1, 8192), n=_log_uniform(rng, 16, 8192),
                     k=_log_uniform(rng, 16, 8192), batch=1, layout=rng.choice(("rcr", "rrr")))
        else:
            c = dict(family="batched", m=_log_uniform(rng, 32, 2048), n=_log_uniform(rng, 32, 2048),
                     k=_log_uniform(rng, 32, 2048), batch=rng.choice((2, 4, 8, 16)), layout="rcr")
        c["dtype"] = "bf16" if rng.random() < 0.35 else "fp16"
        c["m"], c["n"], c["k"] = (min(x, max_dim) for x in (c["m"], c["n"], c["k"]))
        if 2.0 * c["batch"] * c["m"] * c["n"] * c["k"] > MAX_FLOPS:
            continue
        if c.get("split") is None:
            c["split"] = "heldout" if rng.random() < 0.3 else "train"
        out.append(c)
    return out


def gemm_problem(c: dict):
    from ck_gemm.problem import GemmProblem

    return GemmProblem(m=c["m"], n=c["n"], k=c["k"], batch=c["batch"], dtype=c["dtype"], layout=c["layout"])


def gemm_options(p) -> dict:
    """The registry options ``ck_gemm.matmul`` dispatches through (see ck_gemm.api)."""
    return dict(dtypes=(p.dtype,), layouts=(p.layout,), dtypes_c=(p.dtype_c,), num_ds=(0,), d_ops=("add",),
                activations=("none",))


def gemm_cuda_inputs(p, seed: int):
    """Inputs and an fp32 reference made on the GPU (a float64 numpy product of a large shape
    would cost seconds per shape)."""
    import torch

    from ck_core.api import torch_dtype

    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = torch_dtype(p.dtype)
    a = torch.randn(p.shape_a(), device="cuda", generator=g).to(dt)
    b = torch.randn(p.shape_b(), device="cuda", generator=g).to(dt)
    af = a.float() if p.layout[0] == "r" else a.float().transpose(-1, -2)
    bf = b.float() if p.layout[1] == "r" else b.float().transpose(-1, -2)
    return {"a": a, "b": b}, {"c": af @ bf}


#: attention model families: (name, q heads, kv heads, head dim)
ATTN_MODELS = (("llama3-8b", 32, 8, 128), ("llama2-7b", 32, 32, 128), ("mistral-7b", 32, 8, 128),
               ("gemma2-9b", 16, 8, 256), ("phi3-mini", 32, 32, 96), ("bert-base", 12, 12, 64),
               ("qwen2-7b", 28, 4, 128), ("sd-unet", 8, 8, 64), ("gpt-j", 16, 16, 256), ("whisper", 20, 20, 64))
HELD_OUT_ATTN = ("qwen2-7b", "phi3-mini", "gpt-j")


def fmha_cases(n: int, seed: int = SEED, max_dim: int = 16384) -> list[dict]:
    """``n`` forward attention shapes (batch mode): model head configs x lengths x masks."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        name, hq, hk, d = rng.choice(ATTN_MODELS)
        sq = min(_log_uniform(rng, 16, 16384), max_dim)
        sk = sq if rng.random() < 0.7 else min(_log_uniform(rng, 16, 16384), max_dim)
        b = max(1, min(_log_uniform(rng, 1, 32), (1 << 16) // max(sq, sk)))
        c = dict(family=f"attn:{name}", batch=b, hq=hq, hk=hk, sq=sq, sk=sk, d=d,
                 mask=rng.choice(("none", "top_left")) if sq <= sk else "none",
                 dtype=rng.choice(("bf16", "fp16")))
        c["split"] = "heldout" if name in HELD_OUT_ATTN or rng.random() < 0.25 else "train"
        out.append(c)
    return out


def fmha_problem(c: dict):
    from ck_fmha.problem import FmhaProblem

    return FmhaProblem(family="fwd", batch=c["batch"], nhead_q=c["hq"], nhead_k=c["hk"], seqlen_q=c["sq"],
                       seqlen_k=c["sk"], hdim_q=c["d"], hdim_v=c["d"], dtype=c["dtype"], mask=c["mask"])


def fmha_options(p) -> dict:
    return {}


def fmha_cuda_inputs(p, seed: int):
    """q, k, v on the GPU and an fp32 SDPA reference (top-left causal where masked)."""
    import torch

    from ck_core.api import torch_dtype

    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = torch_dtype(p.dtype)
    q = torch.randn(p.batch, p.nhead_q, p.seqlen_q, p.hdim_q, device="cuda", generator=g).to(dt)
    k = torch.randn(p.batch, p.nhead_k, p.seqlen_k, p.hdim_q, device="cuda", generator=g).to(dt)
    v = torch.randn(p.batch, p.nhead_k, p.seqlen_k, p.hdim_v, device="cuda", generator=g).to(dt)
    rep = p.nhead_q // p.nhead_k
    kf, vf = k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), kf, vf, is_causal=p.mask == "top_left")
    return {"q": q, "k": k, "v": v}, {"o": ref}


def conv_cases(n: int, seed: int = SEED, max_dim: int = 0) -> list[dict]:
    """``n`` conv problems: the broad conv suite's network layers (``ck_conv.bench_broad.LAYERS``)
    x direction x dtype x batch 1/8/32, drawn without replacement; its held-out networks
    (EfficientNet-B0, the VAE) are held out whole, and about 25% of the other problems."""
    from ck_conv.bench_broad import HELD_OUT_NETS, LAYERS

    rng = random.Random(seed)
    combos = [(i, d, dt, b) for i in range(len(LAYERS)) for d in ("forward", "bwd_data", "bwd_weight")
              for dt in ("fp16", "bf16") for b in (1, 8, 32)]
    rng.shuffle(combos)
    out = []
    for i, d, dt, b in combos[:n]:
        net, C, K, G, sp, flt, st, pd = LAYERS[i]
        nd = len(sp)
        if max_dim:   # tests: the same layers shrunk (groups, channels per group, spatial)
            g2 = min(G, max_dim)
            C, K, G = g2 * min(C // G, max_dim), g2 * min(K // G, max_dim), g2
            sp = tuple(max(min(x, max_dim), f) for x, f in zip(sp, flt))
        # one tensor under ~1.5 GiB, as the broad suite keeps it (3D video, the 1D encoder)
        while b > 1 and b * max(C, K) * math.prod(sp) * 2 > 1.5 * (1 << 30):
            b //= 2
        out.append(dict(family=f"{net}:{d}", net=net, N=b, C=C, K=K, G=G, spatial=list(sp), filter=list(flt),
                        stride=list(st) if isinstance(st, tuple) else [st] * nd,
                        pad=list(pd) if isinstance(pd, tuple) else [pd] * nd, direction=d, dtype=dt,
                        split="heldout" if net in HELD_OUT_NETS or rng.random() < 0.25 else "train"))
    return out


def conv_problem(c: dict):
    from ck_conv.problem import ConvProblem

    # split_k 0: the kernel's split is the key's (what a user's call gets)
    return ConvProblem(N=c["N"], G=c["G"], C=c["C"], K=c["K"], input_spatial=tuple(c["spatial"]),
                       filter=tuple(c["filter"]), stride=tuple(c["stride"]), pad_left=tuple(c["pad"]),
                       pad_right=tuple(c["pad"]), direction=c["direction"], dtype=c["dtype"], split_k=0)


def conv_options(p) -> dict:
    """The registry options ``ck_conv.conv2d`` dispatches through (see ck_conv.api)."""
    return dict(directions=(p.direction,), dtypes=(p.dtype,), ndims=(p.ndim,), layouts=(p.layout_family,))


def conv_torch_tensors(p, seed: int, device: str):
    """Torch-shaped channels-last x, w, dy (what cuDNN is timed on) and our layouts' views of them."""
    import torch

    from ck_conv.bench import to_ours
    from ck_conv.bench_broad import _channels_last
    from ck_core.api import torch_dtype

    torch.manual_seed(seed)
    dt = torch_dtype(p.dtype)
    x = _channels_last((p.N, p.C) + tuple(p.input_spatial), dt, device)
    w = _channels_last((p.K, p.C // p.G) + tuple(p.filter), dt, device, 1 / math.sqrt(p.c_per_group * p.taps))
    dy = _channels_last((p.N, p.K) + tuple(p.output_spatial), dt, device)
    ops = {"x": to_ours(x, p.G, "x"), "w": to_ours(w, p.G, "w"), "dy": to_ours(dy, p.G, "x")}
    return (x, w, dy), {n: ops[n] for n in ("x", "w", "dy") if n in p.input_names()}


def conv_peer(p, x, w, dy):
    """cuDNN through torch on the channels-last tensors (bench_broad's peer)."""
    from ck_conv.bench_broad import _peer

    c = dict(spatial=p.input_spatial, stride=p.stride, pad=p.pad_left, G=p.G, direction=p.direction)
    return _peer(c, x, w, dy)


def conv_case(p, seed: int, device: str = "cuda"):
    """``(our operands, {output: fp32 result in our layout}, cuDNN callable)`` on ``device``."""
    from ck_conv.bench import to_ours

    (x, w, dy), ops = conv_torch_tensors(p, seed, device)
    ref = conv_peer(p, x.float(), w.float(), dy.float())()
    kind = "w" if p.direction == "bwd_weight" else "x"
    out = {"forward": "y", "bwd_data": "dx", "bwd_weight": "dw"}[p.direction]
    return ops, {out: to_ours(ref, p.G, kind).contiguous()}, conv_peer(p, x, w, dy)


def conv_cuda_inputs(p, seed: int, device: str = "cuda"):
    return conv_case(p, seed, device)[:2]


OPS = {"gemm": (gemm_cases, gemm_problem, gemm_options, gemm_cuda_inputs),
       "fmha": (fmha_cases, fmha_problem, fmha_options, fmha_cuda_inputs),
       "conv": (conv_cases, conv_problem, conv_options, conv_cuda_inputs)}


def spec_class(p) -> tuple:
    """What Triton specialises a launch on (ints equal to 1 or divisible by 16), plus the signature."""
    if p.op == "fmha":
        return (p.dtype, p.hdim_q, p.mask, p.nhead_q == p.nhead_k) + tuple(
            (x == 1, x % 16 == 0) for x in (p.seqlen_q, p.seqlen_k))
    dims = tuple((x == 1, x % 16 == 0) for x in (p.m, p.n, p.k))
    # the launcher's EVEN_K constexpr (K a multiple of the kernel's block K)
    even_k = tuple(p.k % bk == 0 for bk in (64, 128, 256))
    return (p.dtype, p.layout, p.batch > 1) + dims + even_k


def class_blocks(cases: list, problem_of, block: int) -> list:
    """``cases`` in runs of up to ``block`` shapes of one specialisation class, classes taken in
    turn: a process loads each (kernel, class) from Triton's cache once (tens of ms a kernel),
    so consecutive shapes of a class share that cost, and a run cut by its budget still holds
    every class."""
    if block <= 0:
        return cases
    by_class: dict = {}
    for c in cases:
        by_class.setdefault(spec_class(problem_of(c)), []).append(c)
    out = []
    for start in range(0, max(len(v) for v in by_class.values()), block):
        for v in by_class.values():
            out.extend(v[start:start + block])
    return out


# -- inputs and timing -------------------------------------------------------------------------

def _inputs(disp, problem, seed: int):
    import numpy as np

    op = disp.mgr.op(problem.op)
    host = op.make_inputs(problem, np.random.default_rng(seed))
    ref = op.reference(problem, dict(host))
    dev = {k: disp.backend_spec.to_backend(v) for k, v in host.items() if k in op.input_names}
    if hasattr(next(iter(dev.values())), "is_cuda") and getattr(problem, "dtype", "") in ("fp16", "bf16"):
        # numpy stores bf16 as float32: cast once here, not inside every timed launch
        from ck_core.api import torch_dtype

        dev = {k: v.to(torch_dtype(problem.dtype)) if v.is_floating_point() else v for k, v in dev.items()}
    return dev, {k: np.asarray(v, dtype=np.float64) for k, v in ref.items()}


def _to_numpy(x):
    import numpy as np

    if hasattr(x, "detach"):
        return x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def _rel_err(out: dict, ref: dict) -> float:
    import numpy as np

    worst = 0.0
    for k, r in ref.items():
        if k not in out:
            continue
        if hasattr(r, "is_cuda"):
            o = out[k].float().reshape(r.shape)
            worst = max(worst, float((o - r).norm() / r.norm().clamp_min(1e-30)))
            continue
        o = _to_numpy(out[k]).astype(np.float64).reshape(r.shape)
        worst = max(worst, float(np.linalg.norm(o - r) / max(np.linalg.norm(r), 1e-30)))
    return worst


def _timer(cuda: bool, reps: int):
    """``time(fn) -> ms`` of one call: back-to-back kernel time on CUDA, wall clock elsewhere.

    The stream is held for at least 150 us a launch, longer where one call takes longer
    (a launch path whose host work exceeds the hold would be timed, not its kernels)."""
    if not cuda:
        def wall(fn):
            best = math.inf
            for _ in range(max(1, reps // 2)):
                t = time.perf_counter()
                fn()
                best = min(best, time.perf_counter() - t)
            return best * 1e3
        return wall
    import torch

    def gpu(fn):
        fn()  # warm (first launch may record the replay)
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        est = time.perf_counter() - t
        n = max(2, min(reps, int(3e-3 / max(est, 1e-6))))
        # hold the stream while the host queues the launches: the events see kernel time only
        # (150 us a launch covers the general launch path's host time, e.g. batched GEMMs)
        torch.cuda._sleep(int(1.8e9 * max(150e-6, 1.3 * est) * (n + 2)))
        s.record()
        for _ in range(n):
            fn()
        e.record()
        torch.cuda.synchronize()
        return s.elapsed_time(e) / n
    return gpu


# -- warm-up pool -----------------------------------------------------------------------------

def _warm_worker(args):
    op_name, arch, backend, cls, tasks = args
    from ck_core.api import dispatcher_for

    _, problem_of, options_of, cuda_inputs = OPS[op_name]
    done = 0
    for case, name in tasks:
        try:
            p = problem_of(case)
            disp = dispatcher_for(op_name, arch, backend, **options_of(p))
            dev = cuda_inputs(p, 0)[0] if backend == "triton" and not os.environ.get("TRITON_INTERPRET") \
                else _inputs(disp, p, 0)[0]
            key = next(k for k in disp.registry.candidates(p, backend=backend) if k.name == name)
            disp.impl(key)(p, dict(dev))
            done += 1
        except Exception:  # the timing pass records the failure
            pass
    return cls, done


def warm(op_name, arch, backend, cases, workers: int, budget_s: float) -> set:
    """Compile every candidate once per specialisation class, most frequent class first, in
    ``workers`` processes; returns the classes whose compiles all finished in ``budget_s``."""
    from collections import Counter

    from ck_core.api import dispatcher_for

    _, problem_of, options_of, _ = OPS[op_name]
    freq = Counter(spec_class(problem_of(c)) for c in cases)
    rep = {}
    for c in cases:
        rep.setdefault(spec_class(problem_of(c)), c)
    chunks, pending = [], Counter()
    for cls, _ in freq.most_common():
        c = rep[cls]
        p = problem_of(c)
        disp = dispatcher_for(op_name, arch, backend, **options_of(p))
        names = [k.name for k in disp.registry.candidates(p, backend=backend)]
        for i in range(0, len(names), 4):
            chunks.append((op_name, arch, backend, cls, [(c, n) for n in names[i:i + 4]]))
            pending[cls] += 1
    print(f"warm: {len(freq)} specialisation classes, {len(chunks)} chunks over {workers} processes",
          flush=True)
    ctx = mp.get_context("spawn")
    t0 = time.time()
    done = 0
    with ctx.Pool(workers) as pool:
        it = pool.imap_unordered(_warm_worker, chunks)
        try:
            for _ in chunks:
                cls, n = it.next(timeout=max(1.0, budget_s - (time.time() - t0)))
                done += n
                pending[cls] -= 1
        except mp.TimeoutError:
            print(f"warm: budget reached after {done} compiles", flush=True)
            pool.terminate()
    warmed = {cls for cls in freq if pending[cls] == 0}
    print(f"warm: {done} compiles in {time.time() - t0:.0f}s; {len(warmed)} of {len(freq)} classes "
          f"({sum(freq[c] for c in warmed)} of {len(cases)} shapes) warm", flush=True)
    return warmed


# -- the collection ---------------------------------------------------------------------------

def collect(op_name: str, arch: str, backend: str, cases: list, out: Path, budget_s: float, reps: int,
            cap: int = 0) -> int:
    from ck_core.api import dispatcher_for

    _, problem_of, options_of, cuda_inputs = OPS[op_name]
    cuda = backend == "triton" and not os.environ.get("TRITON_INTERPRET")
    if cuda:
        import torch
        cuda = torch.cuda.is_available()
    timer = _timer(cuda, reps)
    path = out / f"{op_name}_{arch}.jsonl"
    names: dict = {}
    written = 0
    t0 = time.time()
    with open(path, "a") as f:
        for i, c in enumerate(cases):
            if time.time() - t0 > budget_s:
                print(f"{op_name}: budget reached after {i} of {len(cases)} shapes", flush=True)
                break
            try:
                p = problem_of(c)
                disp = dispatcher_for(op_name, arch, backend, **options_of(p))
                op = disp.mgr.op(op_name)
                cands = disp.registry.candidates(p, backend=backend)
                if not cands:
                    continue
                heur = op.heuristic(p, list(cands), disp.arch)[0] if op.heuristic else cands[0]
                ranked = disp.rank(p)  # the Dispatcher's own order (store > ranker > heuristic)
                chosen = ranked[0]
                first = list(dict.fromkeys([heur, *ranked[:3]]))   # always timed, even under --cap
                order = first + [k for k in cands if k not in first]
                if cap and len(order) > cap:
                    rest = order[len(first):]
                    random.Random(i).shuffle(rest)
                    order = first + rest[:max(0, cap - len(first))]
                dev, ref = cuda_inputs(p, i) if cuda else _inputs(disp, p, i)
            except Exception as exc:
                print(f"{op_name}: shape {c} skipped ({type(exc).__name__}: {str(exc)[:160]})", flush=True)
                continue
            times = []
            errors = {}
            for k in dict.fromkeys(order):
                idx = names.get(k.name)
                if idx is None:
                    idx = names[k.name] = len(names)
                    f.write(json.dumps({"kernel": idx, "name": k.name}) + "\n")
                try:
                    fn = disp.impl(k)
                    err = _rel_err(fn(p, dict(dev)), ref)
                    if not err < op_tolerance(p):
                        raise ValueError(f"wrong result, relative error {err:.3g}")
                    ms = timer(lambda: fn(p, dev))
                    times.append([idx, round(ms, 5)])
                except Exception as exc:  # one failing kernel never sinks the sweep
                    times.append([idx, None])
                    errors[idx] = f"{type(exc).__name__}: {str(exc)[:100]}"
            row = {"family": c["family"], "split": c["split"], "problem": p.to_dict(), "times": times,
                   "heuristic": names[heur.name], "dispatcher": names[chosen.name]}
            if errors:
                row["errors"] = errors
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
            f.flush()
            written += 1
            if i % 25 == 0:
                ok = [t for _, t in times if t is not None]
                print(f"{op_name} {i}/{len(cases)} {c['family']} "
                      f"{len(times)} kernels, best {min(ok) if ok else None} ms, {time.time() - t0:.0f}s",
                      flush=True)
    return written


# -- the shortlist collection (conv): compile in parallel, time one shape at a time ------------

def shortlist_of(disp, op, p) -> list:
    """The keys the Dispatcher ranks for ``p`` without listing its whole key space: those of the
    op's first shortlist tier that the registry holds and that support ``p``."""
    for tier in op.shortlist(p, disp.arch, disp.backend):
        keys = disp.registry.shortlist(p, tier, disp.backend)
        if keys:
            return list(keys)
    return []


_W: dict = {}


def _shape_worker_init(lock, deadline, op_name, arch, backend, reps, rounds):
    _W.update(lock=lock, deadline=deadline, op=op_name, arch=arch, backend=backend, reps=reps, rounds=rounds)


def _shape_worker(job):
    """One shape: check every shortlisted kernel (compiling it: in parallel with the other
    workers), then, holding the GPU lock, time them and the peer ``rounds`` times each (the
    minimum: a round another process's launch disturbed counts only if no other round was
    quicker)."""
    i, c = job
    if time.time() > _W["deadline"]:
        return None
    from ck_core.api import dispatcher_for

    op_name, backend = _W["op"], _W["backend"]
    _, problem_of, options_of, _ = OPS[op_name]
    cuda = backend == "triton" and not os.environ.get("TRITON_INTERPRET")
    if cuda:
        import torch
        cuda = torch.cuda.is_available()
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.allow_tf32 = False
    t0 = time.time()
    try:
        p = problem_of(c)
        disp = dispatcher_for(op_name, _W["arch"], backend, **options_of(p))
        op = disp.mgr.op(op_name)
        keys = shortlist_of(disp, op, p)
        if not keys:
            return {"case": c, "skipped": "no shortlisted kernel supports it"}
        heur = op.heuristic(p, keys, disp.arch)[0] if op.heuristic else keys[0]
        chosen = disp.select(p)
        keys = list(dict.fromkeys([*keys, chosen]))
        if cuda:
            dev, ref, peer = conv_case(p, i)
        else:
            (dev, ref), peer = _inputs(disp, p, i), None
    except Exception as exc:
        return {"case": c, "skipped": f"{type(exc).__name__}: {str(exc)[:160]}"}
    fns, errors = {}, {}
    for k in keys:
        try:
            # the op's launcher, not the Dispatcher's cached one: nothing outlives the shape
            fn = op.implement(k, disp.backend, disp.arch)
            err = _rel_err(fn(p, dict(dev)), ref)
            if not err < op_tolerance(p):
                raise ValueError(f"wrong result, relative error {err:.3g}")
            fns[k] = fn
        except Exception as exc:  # one failing kernel never sinks the sweep
            errors[k.name] = f"{type(exc).__name__}: {str(exc)[:100]}"
    t_check = time.time() - t0
    timer = _timer(cuda, _W["reps"])
    ms = {k.name: math.inf for k in keys}
    peer_ms = math.inf
    if peer is not None:
        peer()   # cuDNN's own autotuning (benchmark mode) before the timed rounds
    with _W["lock"]:
        for _ in range(_W["rounds"]):
            for k, fn in fns.items():
                try:
                    ms[k.name] = min(ms[k.name], timer(lambda: fn(p, dev)))
                except Exception as exc:
                    errors[k.name] = f"{type(exc).__name__}: {str(exc)[:100]}"
            if peer is not None:
                peer_ms = min(peer_ms, timer(peer))
    for name in errors:
        ms[name] = math.inf
    if cuda:
        del dev, ref, peer, fns
        torch.cuda.empty_cache()
    return {"case": c, "problem": p.to_dict(), "kernels": [k.name for k in keys],
            "ms": [None if not math.isfinite(ms[k.name]) else round(ms[k.name], 5) for k in keys],
            "heuristic": heur.name, "dispatcher": chosen.name, "errors": errors,
            "peer_ms": round(peer_ms, 5) if math.isfinite(peer_ms) else None,
            "check_s": round(t_check, 2), "shape_s": round(time.time() - t0, 2)}


def collect_shortlists(op_name: str, arch: str, backend: str, cases: list, out: Path, budget_s: float,
                       reps: int, workers: int, rounds: int = 3, grace_s: float = 30.0) -> int:
    """Time the shortlist of each shape in ``workers`` processes (compiles overlap; timings take
    turns on the GPU), appending rows as shapes finish; stops starting shapes after ``budget_s``
    and waits ``grace_s`` more for those under way."""
    ctx = mp.get_context("spawn")
    lock = ctx.Lock()
    t0 = time.time()
    deadline = t0 + budget_s
    names: dict = {}
    written = 0
    path = out / f"{op_name}_{arch}.jsonl"
    with open(path, "a") as f, ctx.Pool(workers, initializer=_shape_worker_init,
                                         initargs=(lock, deadline, op_name, arch, backend, reps, rounds)) as pool:
        it = pool.imap_unordered(_shape_worker, list(enumerate(cases)))
        while True:
            try:
                r = it.next(timeout=max(1.0, deadline + grace_s - time.time()))
            except StopIteration:
                break
            except mp.TimeoutError:
                print(f"{op_name}: budget reached; {written} shapes written", flush=True)
                pool.terminate()
                break
            if r is None:
                continue
            c = r["case"]
            if "skipped" in r:
                print(f"{op_name}: shape {c} skipped ({r['skipped']})", flush=True)
                continue
            times, errors = [], {}
            for name, ms in zip(r["kernels"], r["ms"]):
                idx = names.get(name)
                if idx is None:
                    idx = names[name] = len(names)
                    f.write(json.dumps({"kernel": idx, "name": name}) + "\n")
                times.append([idx, ms])
                if name in r["errors"]:
                    errors[idx] = r["errors"][name]
            row = {"family": c["family"], "split": c["split"], "problem": r["problem"], "times": times,
                   "heuristic": names[r["heuristic"]], "dispatcher": names[r["dispatcher"]],
                   "peer_ms": r["peer_ms"], "check_s": r["check_s"], "shape_s": r["shape_s"]}
            if errors:
                row["errors"] = errors
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
            f.flush()
            written += 1
            ok = [t for t in r["ms"] if t is not None]
            print(f"{op_name} {written} {c['family']} {c['direction'] if 'direction' in c else ''} "
                  f"{len(times)} kernels ({len(errors)} failed), best {min(ok) if ok else None} ms, "
                  f"peer {r['peer_ms']} ms, {r['shape_s']}s, {time.time() - t0:.0f}s", flush=True)
    return written


def op_tolerance(p) -> float:
    if p.op == "fmha":
        return 3e-2
    return 2e-2 if p.dtype in ("fp16", "bf16") else 1e-3


#: ops whose oracle is each shape's shortlist (key spaces of ~50k keys a signature), timed with a peer
SHORTLIST_OPS = ("conv",)
SHORTLIST_HEADER = {"candidates": "shortlist", "peer": "cuDNN via torch (channels_last)"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--op", default="gemm", choices=sorted(OPS))
    ap.add_argument("--arch", default="sm90")
    ap.add_argument("--backend", default="triton")
    ap.add_argument("--shapes", type=int, default=1200)
    ap.add_argument("--max-dim", type=int, default=16384)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop timing new shapes after this")
    ap.add_argument("--warm-workers", type=int, default=0, help="processes that JIT-compile first (GPU)")
    ap.add_argument("--warm-budget-s", type=float, default=120.0)
    ap.add_argument("--only-warm", action="store_true",
                    help="time only the shapes whose kernels the warm-up compiled (JIT costs seconds a shape)")
    ap.add_argument("--class-block", type=int, default=20,
                    help="time shapes in runs of this many of one specialisation class (0: shuffled order)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--cap", type=int, default=0, help="most candidates timed per shape (0: all)")
    ap.add_argument("--workers", type=int, default=1,
                    help="conv: processes that check and time shapes (compiles overlap, timings take turns)")
    ap.add_argument("--rounds", type=int, default=3, help="conv: timing rounds per kernel (the minimum counts)")
    ap.add_argument("--grace-s", type=float, default=30.0, help="conv: wait this long for shapes under way at the budget")
    ap.add_argument("--out", default="benchmarks/results/selection")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cases_of = OPS[args.op][0]
    cases = cases_of(args.shapes, args.seed, args.max_dim)
    random.Random(args.seed).shuffle(cases)  # a run cut by its budget still samples every family
    from ck_core.bench import device_name

    with open(out / f"{args.op}_{args.arch}.jsonl", "a") as f:
        f.write(json.dumps({"op": args.op, "arch": args.arch, "backend": args.backend, "device": device_name(),
                            "date": time.strftime("%Y-%m-%d"), "command": " ".join(["benchmarks/selection_collect.py",
                                                                                    *sys.argv[1:]]),
                            "seed": args.seed, "shapes": len(cases),
                            **(SHORTLIST_HEADER if args.op in SHORTLIST_OPS else {})}) + "\n")
    if args.op in SHORTLIST_OPS:
        n = collect_shortlists(args.op, args.arch, args.backend, cases, out, args.budget_s, args.reps,
                               max(1, args.workers), args.rounds, args.grace_s)
        print(f"{args.op}: {n} shapes written to {out}", flush=True)
        return 0
    if args.warm_workers:
        warmed = warm(args.op, args.arch, args.backend, cases, args.warm_workers, args.warm_budget_s)
        # shapes whose kernels are compiled go first; the rest compile as they are met
        problem_of = OPS[args.op][1]
        cases.sort(key=lambda c: spec_class(problem_of(c)) not in warmed)
        if args.only_warm:
            cases = [c for c in cases if spec_class(problem_of(c)) in warmed]
    cases = class_blocks(cases, OPS[args.op][1], args.class_block)
    n = collect(args.op, args.arch, args.backend, cases, out, args.budget_s, args.reps, args.cap)
    print(f"{args.op}: {n} shapes written to {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
