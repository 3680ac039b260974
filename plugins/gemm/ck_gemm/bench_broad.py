"""``ck bench gemm --suite broad``: GEMM on shapes users run, through ``Dispatcher.run``.

Cases are drawn with a fixed seed: the linear layers of public LLM configs (QKV, attention
output, MLP up/gate and down projections, the vocabulary projection) at token counts 1..16k,
random odd sizes 1..8k per dimension, and batched GEMMs; bf16 and fp16, layouts rcr
(``x @ W^T``, as torch.nn.Linear) and rrr.  Each case is checked against an fp32 product first,
then ours (the Dispatcher's own choice) and torch.matmul (cuBLAS) are timed on the same tensors,
as CUDA-graph replays and eagerly.  Whole model configs are held out from the training split
(``split`` column): tuning may look at ``train`` rows only.

fp8 rows (kind ``fp8:<model>:<layer>``, drawn from a second generator so the rows above never
change): e4m3 inputs, fp16 out, rcr, against ``torch._scaled_mm`` with unit scales (the
plugin's fp8 GEMM has no scale operands: unit scales compute the same product).  Their ratios
are summarised on their own (``summary["fp8"]``) and left out of ``all`` / ``train`` /
``heldout``, whose peer is torch.matmul.

Issue #29's strata (:func:`strata_cases`, a third generator: the rows above never change): every
layout (rcr, rrr, crr, ccr: A and B stored row-major ``r`` or as transposed views ``c``), LLM layers
at mid M (16..1000), and linear-layer training steps (forward + dX + dW through autograd of
``ck_gemm.linear`` against ``torch.nn.functional.linear``).  The summary gives every stratum
(:data:`STRATA`; a row counts in its layout, its kind and, at mid M, ``llm/mid_m``) its geomean and
minimum, graph and eager.  ``--quick``: the first case of every stratum.
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


#: (name, hidden, intermediate, vocab, q heads, kv heads, head dim): public model configs
MODELS = (
    ("llama2-7b", 4096, 11008, 32000, 32, 32, 128),
    ("llama3-8b", 4096, 14336, 128256, 32, 8, 128),
    ("llama2-13b", 5120, 13824, 32000, 40, 40, 128),
    ("mistral-7b", 4096, 14336, 32768, 32, 8, 128),
    ("qwen2-7b", 3584, 18944, 152064, 28, 4, 128),
    ("llama3-70b", 8192, 28672, 128256, 64, 8, 128),
)
HELD_OUT_MODELS = ("qwen2-7b", "llama2-13b")
#: issue #29's layout strata: how A and B are stored (C row-major)
LAYOUTS = ("rcr", "rrr", "crr", "ccr")


def _log_uniform(rng, lo, hi) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def cases(seed: int = SEED, n_llm: int = 40, n_odd: int = 16, n_batched: int = 6, n_fp8: int = 10,
          with_strata: bool = True) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n_llm):
        name, h, inter, vocab, nq, nkv, hd = rng.choice(MODELS)
        tokens = _log_uniform(rng, 1, 16384)
        layer, n, k = rng.choice((("qkv", (nq + 2 * nkv) * hd, h), ("o", h, nq * hd), ("up", 2 * inter, h),
                                  ("down", h, inter), ("vocab", vocab, h)))
        if layer == "vocab":
            tokens = min(tokens, 4096)  # logits of the last tokens; full-prompt logits rarely
        out.append(dict(kind=f"llm:{name}:{layer}", m=tokens, n=n, k=k, batch=1,
                        dtype=rng.choice(("bf16", "fp16")), layout="rcr",
                        split="heldout" if name in HELD_OUT_MODELS else "train"))
    for _ in range(n_odd):
        m, n, k = (_log_uniform(rng, 1, 8192) for _ in range(3))
        out.append(dict(kind="odd", m=m, n=n, k=k, batch=1, dtype=rng.choice(("bf16", "fp16")),
                        layout=rng.choice(("rcr", "rrr")), split="heldout" if rng.random() < 0.3 else "train"))
    for _ in range(n_batched):
        out.append(dict(kind="batched", m=_log_uniform(rng, 64, 2048), n=_log_uniform(rng, 64, 2048),
                        k=_log_uniform(rng, 64, 2048), batch=rng.choice((4, 8, 16, 32)), dtype="bf16",
                        layout="rcr", split="heldout" if rng.random() < 0.3 else "train"))
    rng8 = random.Random(seed + 8)
    for _ in range(n_fp8):
        name, h, inter, vocab, nq, nkv, hd = rng8.choice(MODELS)
        tokens = _log_uniform(rng8, 1, 16384)
        layer, n, k = rng8.choice((("qkv", (nq + 2 * nkv) * hd, h), ("o", h, nq * hd), ("up", 2 * inter, h),
                                   ("down", h, inter)))
        out.append(dict(kind=f"fp8:{name}:{layer}", m=tokens, n=n, k=k, batch=1, dtype="fp8", layout="rcr",
                        split="heldout" if name in HELD_OUT_MODELS else "train"))
    if with_strata:
        out += strata_cases(seed)
    for c in out:
        c["case"] = f"{c['kind']} {c['dtype']} {c['layout']} b{c['batch']} {c['m']}x{c['n']}x{c['k']}"
    return out


def _llm_layer(rng, names=None):
    name, h, inter, vocab, nq, nkv, hd = rng.choice([m for m in MODELS if names is None or m[0] in names])
    layer, n, k = rng.choice((("qkv", (nq + 2 * nkv) * hd, h), ("o", h, nq * hd), ("up", 2 * inter, h),
                              ("down", h, inter)))
    return name, layer, n, k


def strata_cases(seed: int = SEED, per_layout: int = 6, n_mid: int = 12, n_linear: int = 10) -> list[dict]:
    """Issue #29's strata, from their own generator (the cases before them never change):
    ``per_layout`` cases of every layout of :data:`LAYOUTS` (LLM layers and odd sizes; A and B stored
    as the letters say: ``r`` row-major, ``c`` a transposed view, as ``matmul(a, b.t())`` passes it),
    ``n_mid`` LLM layers at mid M (16..1000 tokens, where tile choice matters most), and ``n_linear``
    linear-layer training steps (``linear_train:``: forward, dX and dW through autograd of
    ``ck_gemm.linear`` against ``torch.nn.functional.linear``)."""
    rng = random.Random(seed + 29)
    out = []
    for layout in LAYOUTS:
        for i in range(per_layout):
            dtype = rng.choice(("bf16", "fp16"))
            if i % 2 == 0:
                name, layer, n, k = _llm_layer(rng)
                out.append(dict(kind=f"llm:{name}:{layer}", m=_log_uniform(rng, 16, 8192), n=n, k=k, batch=1,
                                dtype=dtype, layout=layout,
                                split="heldout" if name in HELD_OUT_MODELS else "train"))
            else:
                m, n, k = (_log_uniform(rng, 64, 8192) for _ in range(3))
                out.append(dict(kind="odd", m=m, n=n, k=k, batch=1, dtype=dtype, layout=layout,
                                split="heldout" if rng.random() < 0.3 else "train"))
    for _ in range(n_mid):
        name, layer, n, k = _llm_layer(rng)
        out.append(dict(kind=f"llm:{name}:{layer}", m=_log_uniform(rng, 16, 1000), n=n, k=k, batch=1,
                        dtype=rng.choice(("bf16", "fp16")), layout="rcr",
                        split="heldout" if name in HELD_OUT_MODELS else "train"))
    for _ in range(n_linear):
        name, layer, n, k = _llm_layer(rng)
        out.append(dict(kind=f"linear_train:{name}:{layer}", m=_log_uniform(rng, 16, 8192), n=n, k=k, batch=1,
                        dtype=rng.choice(("bf16", "fp16")), layout="rcr",
                        split="heldout" if name in HELD_OUT_MODELS else "train"))
    return out


def strata(c: dict) -> list[str]:
    """The strata a case counts in: its layout (``layout/rcr``; not the training steps, which run
    three), its kind (``kind/llm``, ``kind/odd``, ``kind/batched``, ``kind/linear_train``,
    ``kind/fp8``) and, for LLM layers at 16 <= M <= 1000, ``llm/mid_m``."""
    if "kind" not in c:   # a row of an older run (or a synthetic one) without the case's fields
        return []
    kind = c["kind"].split(":")[0]
    out = [f"kind/{kind}"]
    if kind not in ("linear_train", "fp8") and c.get("layout"):
        out.insert(0, f"layout/{c['layout']}")
    if kind == "llm" and 16 <= c.get("m", 0) <= 1000:
        out.append("llm/mid_m")
    return out


def quick_cases(cs: list[dict]) -> list[dict]:
    """``--quick``: the first case of every stratum (one GPU, minutes)."""
    seen, out = set(), []
    for c in cs:
        new = [s for s in strata(c) if s not in seen]
        if new:
            seen.update(new)
            out.append(c)
    return out


def _tensors(c, device):
    import torch

    if c["dtype"] == "fp8":
        # e4m3 inputs of a size that keeps the fp16 products finite; the peer: cuBLAS Lt's fp8 GEMM
        a = (torch.randn(c["m"], c["k"], device=device) * 0.5).to(torch.float8_e4m3fn)
        b = (torch.randn(c["n"], c["k"], device=device) * 0.5).to(torch.float8_e4m3fn)
        one = torch.ones((), device=device, dtype=torch.float32)
        return a, b, (lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float16))
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[c["dtype"]]
    lead = (c["batch"],) if c["batch"] > 1 else ()
    # stored as the layout says (what Dispatcher.run takes); the peer gets the logical views
    a = torch.randn(*lead, *((c["m"], c["k"]) if c["layout"][0] == "r" else (c["k"], c["m"])), device=device,
                    dtype=dt)
    b = torch.randn(*lead, *((c["k"], c["n"]) if c["layout"][1] == "r" else (c["n"], c["k"])), device=device,
                    dtype=dt)
    al, bl = _logical(a, b, c["layout"])
    return a, b, (lambda: torch.matmul(al, bl))


def _logical(a, b, layout: str):
    """A (M x K) and B (K x N) as views of their stored tensors."""
    return (a if layout[0] == "r" else a.transpose(-1, -2)), (b if layout[1] == "r" else b.transpose(-1, -2))


def _gemm_row(c: dict, row: dict, disp, p) -> None:
    """One GEMM through ``Dispatcher.run`` (the Dispatcher's own pick) against torch on the same
    tensors, checked against fp32 first."""
    import torch

    a, b, peer = _tensors(c, "cuda")
    t_first = time.time()
    out = disp.run(p, a, b)
    torch.cuda.synchronize()
    row["first_call_s"] = round(time.time() - t_first, 3)
    row["kernel"] = disp.select(p).name
    if c["dtype"] == "fp8":
        ref = a.float() @ b.float().transpose(-1, -2)
    else:
        al, bl = _logical(a, b, c["layout"])
        ref = al.float() @ bl.float()
    err = _rel(out, ref)
    row["rel_err"] = err
    row["status"] = "ok" if math.isfinite(err) and err < 2e-2 else "wrong"
    if row["status"] == "ok":
        _time(row, lambda: disp.run(p, a, b), peer, 2.0 * c["batch"] * c["m"] * c["n"] * c["k"])
        row["peer_name"] = "torch._scaled_mm (cuBLASLt fp8)" if c["dtype"] == "fp8" else "torch.matmul (cuBLAS)"


def _linear_row(c: dict, row: dict, device) -> None:
    """A linear layer's training step (forward, dX, dW through autograd): ``ck_gemm.linear`` against
    ``torch.nn.functional.linear`` on the same tensors, checked against fp32 first."""
    import torch
    import torch.nn.functional as F

    import ck_gemm

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[c["dtype"]]
    x = torch.randn(c["m"], c["k"], device=device, dtype=dt).requires_grad_(True)
    w = (torch.randn(c["n"], c["k"], device=device, dtype=dt) / math.sqrt(c["k"])).requires_grad_(True)
    dy = torch.randn(c["m"], c["n"], device=device, dtype=dt)

    def step(fn):
        return lambda: torch.autograd.grad(fn(x, w), (x, w), dy)

    t_first = time.time()
    y = ck_gemm.linear(x, w)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    torch.cuda.synchronize()
    row["first_call_s"] = round(time.time() - t_first, 3)
    xf, wf, dyf = x.detach().float(), w.detach().float(), dy.float()
    errs = [_rel(y, xf @ wf.t()), _rel(dx, dyf @ wf), _rel(dw, dyf.t() @ xf)]
    row["rel_err"] = max(errs)
    row["status"] = "ok" if all(math.isfinite(e) for e in errs) and max(errs) < 2e-2 else "wrong"
    if row["status"] != "ok":
        return
    fl = 3 * 2.0 * c["m"] * c["n"] * c["k"]
    _time(row, step(ck_gemm.linear), step(F.linear), fl)
    row["peer_name"] = "torch.nn.functional.linear + autograd (cuBLAS)"


def _rel(got, want) -> float:
    return float((got.detach().float() - want).norm() / want.norm().clamp_min(1e-30))


def _time(row: dict, ours_fn, peer_fn, fl: float) -> None:
    ours, theirs = eager_and_graph_ms(ours_fn), eager_and_graph_ms(peer_fn)
    for mode in ("graph", "eager"):
        o, t = ours.get(f"{mode}_ms"), theirs.get(f"{mode}_ms")
        row[f"ours_{mode}_ms"], row[f"peer_{mode}_ms"] = o, t
        if o and t:
            row[f"ratio_{mode}"] = round(t / o, 4)
    row["gflop"] = round(fl / 1e9, 3)
    if ours.get("graph_ms"):
        row["ours"] = round(fl / ours["graph_ms"] / 1e9, 2)
    if theirs.get("graph_ms"):
        row["peer"] = round(fl / theirs["graph_ms"] / 1e9, 2)
    row.update(unit="TFLOPS (graph)", ratio=row.get("ratio_graph"))




def _prebuild_one(args):
    name, problem = args
    from ck_core.backends.triton_backend import build_for_problem
    from ck_core.key import KernelKey
    from ck_core.plugins import get_manager

    from .problem import GemmProblem

    mgr = get_manager()
    key = KernelKey.from_name(name, mgr)
    try:
        return build_for_problem(key, mgr.op("gemm"), mgr.arch(key.arch), GemmProblem.from_dict(problem))
    except Exception:  # noqa: BLE001 - the timed first call reports the failure
        return False


def prebuild(picks: list, workers: int) -> int:
    """Compile ``[(key, problem)]`` into the kernel cache in ``workers`` processes (no GPU):
    the suite's first calls then run with a built cache, as after ``ck build``."""
    import multiprocessing as mp

    todo = list(dict.fromkeys((k.name, p) for k, p in picks))
    with mp.get_context("spawn").Pool(workers) as pool:
        done = sum(pool.map(_prebuild_one, [(n, p.to_dict()) for n, p in todo]))
    return done


def run(out_path: Optional[str] = None, budget_s: float = 300.0, seed: int = SEED, arch: Optional[str] = None,
        limit: Optional[int] = None, progress=None, shard: str = "", prebuild_workers: int = 0,
        quick: bool = False) -> dict:
    import torch

    from ck_core import Dispatcher, Registry, get_manager
    from ck_core.bench import device_name
    from ck_core.errors import UnsupportedProblem

    from .bench import _gpu_arch
    from .problem import GemmProblem

    if not torch.cuda.is_available():
        raise UnsupportedProblem("the broad GEMM suite times CUDA kernels: no CUDA device is visible")
    arch_spec = _gpu_arch(get_manager(), arch)
    disps = {}
    rows = []
    skipped = []
    t0 = time.time()
    cs = quick_cases(cases(seed)) if quick else cases(seed)
    cs = shard_cases(cs[:limit] if limit else cs, shard)

    def dispatcher(c):
        dk = (c["dtype"], c["layout"])
        if dk not in disps:
            reg = Registry.from_enumeration("gemm", arch_spec.name, "triton", dtypes=[c["dtype"]],
                                            layouts=[c["layout"]])
            disps[dk] = Dispatcher(reg, backend="triton")
        return disps[dk]

    def problem(c):
        kw = dict(m=c["m"], n=c["n"], k=c["k"], dtype=c["dtype"], layout=c["layout"])
        if c["batch"] > 1:
            kw["batch"] = c["batch"]
        return GemmProblem(**kw)

    if prebuild_workers:
        t = time.time()
        picks = [(dispatcher(c).select(problem(c)), problem(c)) for c in cs if not c["kind"].startswith("linear")]
        n = prebuild(picks, prebuild_workers)
        print(f"prebuilt {n} of {len(picks)} picks in {time.time() - t:.0f}s", flush=True)
    # a bar on a terminal, a line every 30 s in a log (ck bench passes its own, -q silences it)
    counter = (progress or Progress)(len(cs), "ck bench gemm --suite broad")
    for c in counter.each(cs, lambda c: c["case"]):
        if time.time() - t0 > budget_s:
            skipped.append(c["case"])
            continue
        row = dict(c, strata=strata(c))
        t_case = time.time()
        try:
            if c["kind"].startswith("linear_train:"):
                _linear_row(c, row, "cuda")
            else:
                _gemm_row(c, row, dispatcher(c), problem(c))
        except Exception as exc:
            row.update(status="error", error=f"{type(exc).__name__}: {str(exc)[:300]}")
        row["case_s"] = round(time.time() - t_case, 2)
        rows.append(row)
        print(f"{row['case']:52s} {row.get('status'):6s} graph={row.get('ratio_graph')} "
              f"eager={row.get('ratio_eager')} {row.get('error', '')[:100]}", flush=True)
        torch.cuda.empty_cache()
    res = with_header({"suite": "broad", "seed": seed, "arch": arch_spec.name, "rows": rows,
                       "skipped_for_time": skipped, "summary": summary(rows), "elapsed_s": round(time.time() - t0, 1)},
                      command="python -m ck_gemm.bench_broad " + " ".join(sys.argv[1:]), device=device_name())
    if out_path:
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return res




def _geomean(vals):
    g = geomean(vals)
    return round(g, 4) if g else None


def _stats(rs: list[dict]) -> dict:
    big = [r for r in rs if (r.get("gflop") or 0) >= 1.0]
    return {"n": len(rs), "wrong": sum(r.get("status") == "wrong" for r in rs),
            "errors": sum(r.get("status") == "error" for r in rs),
            "graph_geomean": _geomean(r.get("ratio_graph") for r in rs),
            "graph_min": min((r["ratio_graph"] for r in rs if r.get("ratio_graph")), default=None),
            "eager_geomean": _geomean(r.get("ratio_eager") for r in rs),
            "eager_min": min((r["ratio_eager"] for r in rs if r.get("ratio_eager")), default=None),
            "eager_geomean_ge_1gflop": _geomean(r.get("ratio_eager") for r in big),
            "below_0.85": sum(r["ratio_graph"] < 0.85 for r in rs if r.get("ratio_graph"))}


#: the order of the strata in the summary
STRATA = tuple(f"layout/{x}" for x in LAYOUTS) + ("llm/mid_m",) + tuple(
    f"kind/{k}" for k in ("llm", "odd", "batched", "linear_train", "fp8"))


def summary(rows: list[dict]) -> dict:
    """``all`` / ``train`` / ``heldout``: the GEMM rows against torch.matmul (not the fp8 rows, whose
    peer is torch._scaled_mm, summarised under ``fp8``, nor the training steps, under
    ``kind/linear_train``); then every stratum of :data:`STRATA` (issue #29) that has rows: geomean and
    minimum, graph and eager, and the rows below 0.85x."""
    out = {}
    for split in ("all", "train", "heldout", "fp8"):
        rs = [r for r in rows if (r.get("dtype") == "fp8") == (split == "fp8")
              and not str(r.get("kind", "")).startswith("linear_train:")
              and (split in ("all", "fp8") or r.get("split") == split)]
        out[split] = _stats(rs)
    for st in STRATA:
        rs = [r for r in rows if st in (r.get("strata") or strata(r))]
        if rs:
            out[st] = _stats(rs)
    return out


def bench(peer: str, options: dict) -> dict:
    from ck_core.errors import UnsupportedProblem

    if peer != "torch":
        raise UnsupportedProblem(f"gemm benchmarks compare with 'torch' (cuBLAS), not {peer!r}")
    res = run(None, float(options.get("budget") or 300.0), arch=options.get("arch"),
              quick=bool(options.get("quick")), progress=options.get("progress"))
    return broad_result(res)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/gemm_broad.json")
    ap.add_argument("--budget", type=float, default=300.0)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--shard", default="", metavar="I/N", help="every N-th case from the I-th (one GPU of N)")
    ap.add_argument("--quick", action="store_true", help="the first case of every stratum")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--prebuild", type=int, default=0, metavar="N",
                    help="compile the Dispatcher's picks in N processes first (first calls then load)")
    a = ap.parse_args()
    if a.list:
        for c in (quick_cases(cases()) if a.quick else cases()):
            print(c["split"], " ".join(strata(c)), c["case"])
    else:
        print(json.dumps(run(a.out, a.budget, limit=a.limit or None, shard=a.shard, prebuild_workers=a.prebuild,
                             quick=a.quick)["summary"], indent=1))
