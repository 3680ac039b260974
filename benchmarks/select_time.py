"""Selection time of NEW problems through the public API's Dispatcher (CPU, no GPU), and their picks.

    python benchmarks/select_time.py gemm conv:forward conv:bwd_data conv:bwd_weight fmha \\
        [--problems 300] [--seed 15] [--picks out.json] [--shortlists out.json] [--profile out.txt]

Problems are drawn with a fixed seed around the recorded oracles' shapes (GEMM: random
M/N/K/batch, fp16/bf16, the four layouts; conv: oracle layers with a random batch and
spatial size; fmha: FlashAttention-suite-like attention problems, forward and dQ/dK/dV).  Each signature's Dispatcher is made and warmed first on a twin of every problem
(M or the batch + 1000: the signature's key-space and per-key caches filled); then every
problem is selected once, timed (``Dispatcher.select`` of a problem it never saw: the cost of a
new problem).  ``--picks`` writes every problem's pick (compare two versions' files:
a speed-up must not change a single pick).  ``--shortlists`` writes every timed problem's shortlist
(``Dispatcher._shortlist``: the keys the ranking scores) beside its pick, the finer comparison for a
change to the shortlisting (was ``conv_select_fresh.py``).  ``--profile`` writes a cProfile of the
timed loop.
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


#: FlashAttention's CK suite's head dims (benchmarks/compile_count.py FA_HDIMS and 80)
FA_HDIMS = (32, 40, 64, 80, 96, 128, 160, 192, 224, 256)


def fmha_problems(n: int, seed: int) -> list:
    """Attention problems as FlashAttention's suite calls them (bshd, bottom-right masks, MHA/GQA/MQA,
    random lengths, causal / local / ALiBi / dropout), forward and the backward's dQ/dK/dV stage."""
    from ck_fmha.problem import FmhaProblem

    rng = random.Random(seed)
    out = []
    while len(out) < n:
        d = rng.choice(FA_HDIMS)
        hq = rng.choice((8, 9, 16, 32))
        hk = rng.choice([h for h in (hq, 1, hq // 2, hq // 4) if h and hq % h == 0])
        sq, sk = (max(1, int(2 ** rng.uniform(0, 13))) for _ in range(2))
        mask = rng.choice(("none", "bottom_right", "bottom_right", "window"))
        fields = {"mask": "none"} if mask == "none" else (
            {"mask": "bottom_right", "window_left": -1, "window_right": 0} if mask == "bottom_right" else
            {"mask": "bottom_right", "window_left": rng.randint(0, sk), "window_right": rng.randint(0, sk)})
        family = rng.choice(("fwd", "fwd", "bwd_dq_dk_dv"))
        try:
            out.append(FmhaProblem(family=family, batch=rng.randint(1, 16), nhead_q=hq, nhead_k=hk, seqlen_q=sq,
                                   seqlen_k=sk, hdim_q=d, hdim_v=d, dtype=rng.choice(("fp16", "bf16")),
                                   layout="bshd", lse=family == "fwd", bias="alibi" if rng.random() < 0.2 else "none",
                                   p_drop=0.17 if rng.random() < 0.2 else 0.0, **fields))
        except Exception:   # noqa: BLE001  (an invalid draw is skipped)
            continue
    return out


def _twin(p):
    if p.op == "gemm":
        return attrs.evolve(p, m=p.m + 1000)
    if p.op == "fmha":
        return attrs.evolve(p, batch=p.batch + 1000)
    return attrs.evolve(p, N=p.N + 1000)


def dispatcher(p):
    if p.op == "fmha":
        return dispatcher_for("fmha", "sm90", "triton", families=("fwd", "bwd_dot_do_o", "bwd_dq_dk_dv",
                                                                  "bwd_convert_dq"),
                              dtypes=(p.dtype,), hdims=((p.hdim_q, p.hdim_v),))
    if p.op == "gemm":
        return dispatcher_for("gemm", "sm90", "triton", dtypes=(p.dtype,), layouts=(p.layout,),
                              dtypes_c=(p.dtype_c,), num_ds=(0,), d_ops=("add",), activations=("none",))
    return dispatcher_for("conv", "sm90", "triton", directions=(p.direction,), dtypes=(p.dtype,),
                          ndims=(p.ndim,), layouts=(p.layout_family,))


def problems(what: str, n: int, seed: int, mgr) -> list:
    if what == "gemm":
        return gemm_problems(n, seed)
    if what == "fmha":
        return fmha_problems(n, seed)
    op, direction = what.split(":")
    return conv_problems(direction, n, seed, mgr)


def ranker_fingerprint(op: str) -> str:
    """sha256 of the (op, sm90, triton) ranker the picks were made with (picks recorded with another
    ranker are not comparable)."""
    spec = tuned_data.table(op, "sm90", ranker.TABLE).get(("triton",))
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ops", nargs="+", help="gemm, conv:forward, conv:bwd_data, conv:bwd_weight, fmha")
    ap.add_argument("--problems", type=int, default=300)
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--picks", metavar="JSON")
    ap.add_argument("--shortlists", metavar="JSON", help="every timed problem's shortlist and pick")
    ap.add_argument("--profile", metavar="TXT")
    args = ap.parse_args(argv)
    mgr = get_manager()
    if "fmha" in args.ops:
        # select as on an sm90 GPU (the registry of a GPU process, not the interpreter's); nothing runs
        from ck_core.backends import triton_backend

        triton_backend._device_target = lambda: ("cuda", 90)
    picks, shortlists, prof = {}, {}, cProfile.Profile() if args.profile else None
    for what in args.ops:
        probs = problems(what, args.problems, args.seed, mgr)
        for p in probs:   # every signature's registry enumerated and its per-key caches filled once
            q = _twin(p)
            dispatcher(q).select(q)
        times, cpu, rules = [], [], {}
        for p in probs:
            d = dispatcher(p)
            if p in d._selected:
                continue
            if prof:
                prof.enable()
            t, c = time.perf_counter(), time.thread_time()
            key = d.select(p)
            times.append(time.perf_counter() - t)
            cpu.append(time.thread_time() - c)
            if prof:
                prof.disable()
            picks[f"{what} {p!r}"] = key.name
            if args.shortlists:   # after the timing: the Dispatcher's shortlist of the problem it just selected
                shortlists[f"{what} {p!r}"] = {"shortlist": [k.name for k in d._shortlist(p, mgr.op(p.op))],
                                               "pick": key.name}
            rules[getattr(d, "_rule", "?")] = rules.get(getattr(d, "_rule", "?"), 0) + 1
        times.sort()
        cpu.sort()
        # CPU time of the selecting thread beside the wall time: on a loaded machine the wall time's
        # tail is the scheduler's (a preempted select waits a time slice), not the selection's
        print(f"{what}: median {statistics.median(times) * 1e3:.3f} ms, mean {statistics.mean(times) * 1e3:.3f} ms, "
              f"P90 {times[int(0.9 * len(times))] * 1e3:.3f} ms over {len(times)} new problems "
              f"(thread CPU time: median {statistics.median(cpu) * 1e3:.3f}, mean {statistics.mean(cpu) * 1e3:.3f}, "
              f"P90 {cpu[int(0.9 * len(cpu))] * 1e3:.3f}, max {cpu[-1] * 1e3:.3f} ms); rules {rules}", flush=True)
    if args.picks:
        ops = sorted({w.split(":")[0] for w in args.ops})
        doc = {"command": "python benchmarks/select_time.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "rankers": {op: ranker_fingerprint(op) for op in ops}, "picks": picks}
        from ck_core.bench import with_header

        Path(args.picks).write_text(json.dumps(with_header(doc, device="CPU (selection only, no kernels run)"),
                                               indent=0, sort_keys=True))
    if args.shortlists:
        from ck_core.bench import with_header

        doc = {"command": "python benchmarks/select_time.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "shortlists": shortlists}
        Path(args.shortlists).write_text(json.dumps(with_header(doc, device="CPU (selection only, no kernels run)"),
                                                    indent=0, sort_keys=True))
    if prof:
        with open(args.profile, "w") as f:
            pstats.Stats(prof, stream=f).sort_stats("cumulative").print_stats(60)
            pstats.Stats(prof, stream=f).sort_stats("tottime").print_stats(40)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
