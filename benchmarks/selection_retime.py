"""Re-time listed (shape, kernel) rows of a selection oracle, several launches each (GPU).

    python3 benchmarks/selection_retime.py benchmarks/results/selection/gemm_retime.json --out $OUT/gemm_retime.json

The list (``benchmarks/selection_list_disturbed.py`` writes it) holds the op, arch and backend
and rows of ``{"family", "problem", "keys": [kernel names], "recorded_ms": {name: ms}}``: held-out
shapes whose recorded single-launch timings look disturbed.  Each row's kernels are checked
against the fp32 reference (as ``benchmarks/selection_collect.py`` does) and each is timed
alone: one warm launch, then ``--reps`` launches queued behind a GPU sleep kernel with CUDA
events around them, ``--rounds`` times (the minimum counts); the peer (torch.matmul for GEMM)
is timed the same way.  Output: the rows with ``ms`` (new) beside ``recorded_ms``.  On the CPU
(``TRITON_INTERPRET=1`` or no GPU) the same code runs with wall-clock timing, for tests.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import selection_collect as sc  # noqa: E402


def _gpu_time(fn, reps: int, rounds: int) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    est = time.perf_counter() - t
    n = max(2, min(reps, int(2e-3 / max(est, 1e-6)) + 2))
    best = math.inf
    for _ in range(rounds):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        # hold the stream while the host queues the launches: the events see kernel time only
        torch.cuda._sleep(int(sc.SLEEP_HZ * max(200e-6, 1.5 * est) * (n + 2)))
        s.record()
        for _ in range(n):
            fn()
        e.record()
        torch.cuda.synchronize()
        best = min(best, s.elapsed_time(e) / n)
    return best


def _wall_time(fn, reps: int, rounds: int) -> float:
    fn()
    best = math.inf
    for _ in range(max(1, rounds)):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def retime(doc: dict, reps: int = 20, rounds: int = 3, limit: int = 0, budget_s: float = 0.0) -> dict:
    from ck_core.api import dispatcher_for
    from ck_core.key import KernelKey
    from ck_core.plugins import get_manager

    mgr = get_manager()
    op_name, arch_name, backend = doc["op"], doc["arch"], doc.get("backend", "triton")
    op, arch = mgr.op(op_name), mgr.arch(arch_name)
    _, _, options_of, cuda_inputs = sc.OPS[op_name]
    cuda = backend == "triton" and not os.environ.get("TRITON_INTERPRET")
    if cuda:
        import torch
        cuda = torch.cuda.is_available()
    timer = _gpu_time if cuda else _wall_time
    out = []
    t0 = time.time()
    for row in doc["rows"][: limit or None]:
        if budget_s and time.time() - t0 > budget_s:
            print(f"budget reached: {len(out)} of {len(doc['rows'])} rows re-timed", flush=True)
            break
        p = op.problem_type.from_dict(row["problem"])
        seed = zlib.crc32(json.dumps(row["problem"], sort_keys=True).encode())
        if cuda:
            dev, ref = cuda_inputs(p, seed)
        else:
            dev, ref = sc._inputs(dispatcher_for(op_name, arch_name, backend, **options_of(p)), p, seed)
        tol = sc.op_tolerance(p)
        ms, errors = {}, {}
        for name in row["keys"]:
            try:
                key = KernelKey.from_name(name, mgr)
                fn = op.implement(key, backend, arch)
                err = sc._rel_err(fn(p, dict(dev)), ref)
                err = float(err) if not hasattr(err, "item") else float(err.item())
                if not err < tol:
                    raise ValueError(f"wrong result, relative error {err:.3g}")
                ms[name] = round(timer(lambda fn=fn: fn(p, dev), reps, rounds), 5)
            except Exception as exc:  # noqa: BLE001 - one failing kernel never sinks the list
                ms[name] = None
                errors[name] = f"{type(exc).__name__}: {str(exc)[:120]}"
        new = dict(row, ms=ms)
        if errors:
            new["errors"] = errors
        if cuda and op_name in sc.PEERS:
            new["peer_ms"] = round(timer(sc.PEERS[op_name][1](p, dev), reps, rounds), 5)   # a zero-argument call
        out.append(new)
        print(f"{row['family']} {row['problem'].get('m', '')} "
              + " ".join(f"{n[-40:]}: {row['recorded_ms'].get(n)} -> {ms[n]}" for n in row["keys"]), flush=True)
        del dev, ref
    from ck_core.bench import device_name

    return {k: v for k, v in doc.items() if k != "rows"} | {
        "device": device_name(), "date": time.strftime("%Y-%m-%d"), "reps": reps, "rounds": rounds,
        "command": " ".join(["benchmarks/selection_retime.py", *sys.argv[1:]]), "rows": out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("list", help="JSON list of rows (benchmarks/selection_list_disturbed.py)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=20, help="most launches a timed run queues")
    ap.add_argument("--rounds", type=int, default=3, help="timed runs per kernel (the minimum counts)")
    ap.add_argument("--limit", type=int, default=0, help="first N rows only (0: all)")
    ap.add_argument("--budget-s", type=float, default=300.0, help="start no new row after this (0: no limit)")
    args = ap.parse_args(argv)
    res = retime(json.loads(Path(args.list).read_text()), args.reps, args.rounds, args.limit, args.budget_s)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    from ck_core.bench import with_header

    Path(args.out).write_text(json.dumps(with_header(res), indent=1) + "\n")
    print(f"{len(res['rows'])} rows re-timed -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
