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
"""
from __future__ import annotations

import datetime
import json
import math
import random
import sys
import time
from typing import Optional

from ck_core.bench import broad_result, eager_and_graph_ms, geomean
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


def _log_uniform(rng, lo, hi) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def cases(seed: int = SEED, n_llm: int = 40, n_odd: int = 16, n_batched: int = 6, n_fp8: int = 10) -> list[dict]:
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
    for c in out:
        c["case"] = f"{c['kind']} {c['dtype']} {c['layout']} b{c['batch']} {c['m']}x{c['n']}x{c['k']}"
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
    a = torch.randn(*lead, c["m"], c["k"], device=device, dtype=dt)
    if c["layout"] == "rcr":
        b = torch.randn(*lead, c["n"], c["k"], device=device, dtype=dt)
        peer = (lambda: torch.matmul(a, b.transpose(-1, -2)))
    else:
        b = torch.randn(*lead, c["k"], c["n"], device=device, dtype=dt)
        peer = (lambda: torch.matmul(a, b))
    return a, b, peer




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
        limit: Optional[int] = None, progress=None, shard: str = "", prebuild_workers: int = 0) -> dict:
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
    cs = shard_cases(cases(seed)[:limit] if limit else cases(seed), shard)

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
        picks = [(dispatcher(c).select(problem(c)), problem(c)) for c in cs]
        n = prebuild(picks, prebuild_workers)
        print(f"prebuilt {n} of {len(picks)} picks in {time.time() - t:.0f}s", flush=True)
    # a bar on a terminal, a line every 30 s in a log (ck bench passes its own, -q silences it)
    counter = (progress or Progress)(len(cs), "ck bench gemm --suite broad")
    for c in counter.each(cs, lambda c: c["case"]):
        if time.time() - t0 > budget_s:
            skipped.append(c["case"])
            continue
        row = dict(c)
        t_case = time.time()
        try:
            disp = dispatcher(c)
            p = problem(c)
            a, b, peer = _tensors(c, "cuda")
            t_first = time.time()
            out = disp.run(p, a, b)
            torch.cuda.synchronize()
            row["first_call_s"] = round(time.time() - t_first, 3)
            row["kernel"] = disp.select(p).name
            ref = a.float() @ (b.float().transpose(-1, -2) if c["layout"] == "rcr" else b.float())
            err = float((out.float() - ref).norm() / ref.norm().clamp_min(1e-30))
            row["rel_err"] = err
            row["status"] = "ok" if math.isfinite(err) and err < 2e-2 else "wrong"
            if row["status"] == "ok":
                fl = 2.0 * c["batch"] * c["m"] * c["n"] * c["k"]
                ours, theirs = eager_and_graph_ms(lambda: disp.run(p, a, b)), eager_and_graph_ms(peer)
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
                row.update(unit="TFLOPS (graph)", ratio=row.get("ratio_graph"),
                           peer_name="torch._scaled_mm (cuBLASLt fp8)" if c["dtype"] == "fp8"
                           else "torch.matmul (cuBLAS)")
            del a, b, out, ref
        except Exception as exc:
            row.update(status="error", error=f"{type(exc).__name__}: {str(exc)[:300]}")
        row["case_s"] = round(time.time() - t_case, 2)
        rows.append(row)
        print(f"{row['case']:52s} {row.get('status'):6s} graph={row.get('ratio_graph')} "
              f"eager={row.get('ratio_eager')} {row.get('error', '')[:100]}", flush=True)
        torch.cuda.empty_cache()
    res = {"suite": "broad", "seed": seed, "arch": arch_spec.name, "rows": rows, "skipped_for_time": skipped,
           "summary": summary(rows), "elapsed_s": round(time.time() - t0, 1), "device": device_name(),
           "date": datetime.date.today().isoformat(), "command": " ".join(sys.argv)}
    if out_path:
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return res




def _geomean(vals):
    g = geomean(vals)
    return round(g, 4) if g else None


def summary(rows: list[dict]) -> dict:
    out = {}
    for split in ("all", "train", "heldout", "fp8"):
        rs = [r for r in rows if (r.get("dtype") == "fp8") == (split == "fp8")
              and (split in ("all", "fp8") or r.get("split") == split)]
        big = [r for r in rs if (r.get("gflop") or 0) >= 1.0]
        out[split] = {"n": len(rs), "wrong": sum(r.get("status") == "wrong" for r in rs),
                      "errors": sum(r.get("status") == "error" for r in rs),
                      "graph_geomean": _geomean(r.get("ratio_graph") for r in rs),
                      "graph_min": min((r["ratio_graph"] for r in rs if r.get("ratio_graph")), default=None),
                      "eager_geomean": _geomean(r.get("ratio_eager") for r in rs),
                      "eager_geomean_ge_1gflop": _geomean(r.get("ratio_eager") for r in big)}
    return out


def bench(peer: str, options: dict) -> dict:
    from ck_core.errors import UnsupportedProblem

    if peer != "torch":
        raise UnsupportedProblem(f"gemm benchmarks compare with 'torch' (cuBLAS), not {peer!r}")
    res = run(None, float(options.get("budget") or 300.0), arch=options.get("arch"),
              limit=8 if options.get("quick") else None, progress=options.get("progress"))
    return broad_result(res)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/gemm_broad.json")
    ap.add_argument("--budget", type=float, default=300.0)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--shard", default="", metavar="I/N", help="every N-th case from the I-th (one GPU of N)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--prebuild", type=int, default=0, metavar="N",
                    help="compile the Dispatcher's picks in N processes first (first calls then load)")
    a = ap.parse_args()
    if a.list:
        for c in cases():
            print(c["split"], c["case"])
    else:
        print(json.dumps(run(a.out, a.budget, limit=a.limit or None, shard=a.shard, prebuild_workers=a.prebuild)["summary"],
                         indent=1))
