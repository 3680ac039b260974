"""Selection time of NEW problems through the public API's Dispatcher (CPU, no GPU), and their picks.

    python benchmarks/select_time.py gemm conv:forward conv:bwd_data conv:bwd_weight \\
        [--problems 300] [--seed 15] [--picks out.json] [--profile out.txt]

Problems are drawn with a fixed seed around the recorded oracles' shapes (GEMM: random
M/N/K/batch, fp16/bf16, the four layouts; conv: oracle layers with a random batch and
spatial size).  Each signature's Dispatcher is made and warmed first on a twin of every problem
(M or the batch + 1000: the signature's key-space and per-key caches filled); then every
problem is selected once, timed (``Dispatcher.select`` of a problem it never saw: the cost of a
new problem).  ``--picks`` writes every problem's pick (compare two versions' files:
a speed-up must not change a single pick).  ``--profile`` writes a cProfile of the timed loop.
"""
from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import pstats
import random
import statistics
import sys
import time
from pathlib import Path

import attrs

from ck_core import ranker, select_data, tuned_data
from ck_core.api import dispatcher_for
from ck_core.plugins import get_manager

DATA = Path(__file__).resolve().parent / "results" / "selection"


def gemm_problems(n: int, seed: int) -> list:
    from ck_gemm.problem import GemmProblem

    rng = random.Random(seed)
    out = []
    while len(out) < n:
        m = max(1, int(2 ** rng.uniform(0, 13)))
        nn, k = (int(2 ** rng.uniform(4, 14)) for _ in range(2))
        batch = 1 if rng.random() < 0.8 else rng.choice((2, 3, 4, 8, 16))
        dtype = rng.choice(("fp16", "bf16"))
        layout = rng.choice(("rcr", "rrr", "crr", "ccr"))
        out.append(GemmProblem(m=m, n=nn, k=k, batch=batch, dtype=dtype, dtype_c=dtype, layout=layout))
    return out


def conv_problems(direction: str, n: int, seed: int, mgr) -> list:
    oracle = select_data.load(DATA / "conv_sm90.jsonl.gz", mgr)
    base = [s.problem for s in oracle.shapes if s.problem.direction == direction]
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        p = rng.choice(base)
        spatial = tuple(max(1, s + rng.randint(-3, 9)) for s in p.input_spatial)
        try:
            q = attrs.evolve(p, N=rng.randint(1, 40), input_spatial=spatial)
            q.output_spatial   # noqa: B018  (a filter larger than the padded input raises)
        except Exception:   # noqa: BLE001  (an invalid draw is skipped)
            continue
        out.append(q)
    return out


def dispatcher(p):
    if p.op == "gemm":
        return dispatcher_for("gemm", "sm90", "triton", dtypes=(p.dtype,), layouts=(p.layout,),
                              dtypes_c=(p.dtype_c,), num_ds=(0,), d_ops=("add",), activations=("none",))
    return dispatcher_for("conv", "sm90", "triton", directions=(p.direction,), dtypes=(p.dtype,),
                          ndims=(p.ndim,), layouts=(p.layout_family,))


def problems(what: str, n: int, seed: int, mgr) -> list:
    if what == "gemm":
        return gemm_problems(n, seed)
    op, direction = what.split(":")
    return conv_problems(direction, n, seed, mgr)


def ranker_fingerprint(op: str) -> str:
    """sha256 of the (op, sm90, triton) ranker the picks were made with (picks recorded with another
    ranker are not comparable)."""
    spec = tuned_data.table(op, "sm90", ranker.TABLE).get(("triton",))
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ops", nargs="+", help="gemm, conv:forward, conv:bwd_data, conv:bwd_weight")
    ap.add_argument("--problems", type=int, default=300)
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--picks", metavar="JSON")
    ap.add_argument("--profile", metavar="TXT")
    args = ap.parse_args(argv)
    mgr = get_manager()
    picks, prof = {}, cProfile.Profile() if args.profile else None
    for what in args.ops:
        probs = problems(what, args.problems, args.seed, mgr)
        for p in probs:   # every signature's registry enumerated and its per-key caches filled once
            q = attrs.evolve(p, m=p.m + 1000) if p.op == "gemm" else attrs.evolve(p, N=p.N + 1000)
            dispatcher(q).select(q)
        times, rules = [], {}
        for p in probs:
            d = dispatcher(p)
            if p in d._selected:
                continue
            if prof:
                prof.enable()
            t = time.perf_counter()
            key = d.select(p)
            times.append(time.perf_counter() - t)
            if prof:
                prof.disable()
            picks[f"{what} {p!r}"] = key.name
            rules[getattr(d, "_rule", "?")] = rules.get(getattr(d, "_rule", "?"), 0) + 1
        times.sort()
        print(f"{what}: median {statistics.median(times) * 1e3:.3f} ms, mean {statistics.mean(times) * 1e3:.3f} ms, "
              f"P90 {times[int(0.9 * len(times))] * 1e3:.3f} ms over {len(times)} new problems; rules {rules}",
              flush=True)
    if args.picks:
        ops = sorted({w.split(":")[0] for w in args.ops})
        doc = {"command": "python benchmarks/select_time.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "rankers": {op: ranker_fingerprint(op) for op in ops}, "picks": picks}
        from ck_core.bench import with_header

        Path(args.picks).write_text(json.dumps(with_header(doc, device="CPU (selection only, no kernels run)"),
                                               indent=0, sort_keys=True))
    if prof:
        with open(args.profile, "w") as f:
            pstats.Stats(prof, stream=f).sort_stats("cumulative").print_stats(60)
            pstats.Stats(prof, stream=f).sort_stats("tottime").print_stats(40)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
