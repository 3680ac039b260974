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


OPS = {"gemm": (gemm_cases, gemm_problem, gemm_options, gemm_cuda_inputs),
       "fmha": (fmha_cases, fmha_problem, fmha_options, fmha_cuda_inputs)}


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
    """``time(fn) -> ms`` of one call: back-to-back kernel time on CUDA, wall clock elsewhere."""
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
        torch.cuda._sleep(int(1.8e9 * 150e-6 * (n + 2)))
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


def op_tolerance(p) -> float:
    if p.op == "fmha":
        return 3e-2
    return 2e-2 if p.dtype in ("fp16", "bf16") else 1e-3


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
                            "seed": args.seed, "shapes": len(cases)}) + "\n")
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
