"""Run the broad suites on every visible GPU at once, then merge each suite's shards.

    python benchmarks/broad_multi.py --jobs fmha:6,conv:3,gemm:1 --deadline-s 540 --out-dir $OUT
    python benchmarks/broad_multi.py --quick --jobs fmha:1 --deadline-s 500 --out-dir $OUT   # one stratum each
    python benchmarks/broad_multi.py --jobs "" --cmd "python3 benchmarks/x_probe.py --out $OUT/x.json" ...

Each job ``OP:N`` is split into N shards (``python -m ck_OP.bench_broad --shard I/N``); one worker
per GPU takes the next shard (largest suites first) and runs it alone on its GPU
(``CUDA_VISIBLE_DEVICES``), so timings never share a device.  A shard gets the time left before the
deadline as its ``--budget``: cases past it are listed under ``skipped_for_time``, never dropped
silently.  ``--cmd`` adds other commands (probes, collections), each alone on a GPU like a shard
(started first, in the order given; killed at the deadline).  The merged ``OP_broad.json`` has the rows in the suite's case order and its summary
recomputed over all shards; ``broad_multi.log`` holds every shard's output.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

EXTRA = {"gemm": ["--prebuild", "4"]}   # compile the GEMM picks in 4 processes first (16 cores a GPU)


def _gpus() -> list[str]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env:
        return [g for g in env.split(",") if g]
    out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                         text=True, check=False).stdout.split()
    return out or ["0"]


def merge(op: str, parts: list[dict], command: str) -> dict:
    """One result of a suite from its shards' results: rows in the suite's case order."""
    mod = importlib.import_module(f"ck_{op}.bench_broad")
    order = {c["case"]: i for i, c in enumerate(mod.cases())}
    rows = sorted((r for p in parts for r in p["rows"]), key=lambda r: order.get(r.get("case"), 1 << 30))
    summ = getattr(mod, "summary", None) or mod._summary
    res = {k: v for k, v in parts[0].items() if k not in ("rows", "skipped_for_time", "summary", "elapsed_s")}
    res.update(rows=rows, skipped_for_time=[s for p in parts for s in p.get("skipped_for_time", [])],
               summary=summ(rows), shards=len(parts), command=command,
               elapsed_s=max(p.get("elapsed_s", 0) for p in parts))
    if "geomean" in res:
        res["geomean"] = res["summary"].get("fwd/all", {}).get("ratio_geomean")
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default="fmha:6,conv:3,gemm:1", help="OP:SHARDS,... (ops: fmha, conv, gemm)")
    ap.add_argument("--deadline-s", type=float, default=540.0, help="seconds from now when every shard stops")
    ap.add_argument("--out-dir", default="benchmarks/results")
    ap.add_argument("--cmd", action="append", default=[], help="a shell command to run alone on one GPU")
    ap.add_argument("--quick", action="store_true",
                    help="each suite's --quick subset (one case of every stratum) instead of the whole suite")
    a = ap.parse_args()
    t0 = time.time()
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jobs: list[tuple] = [("cmd", c, 0) for c in a.cmd]
    for spec in filter(None, a.jobs.split(",")):
        op, _, n = spec.partition(":")
        jobs += [(op, i, int(n or 1)) for i in range(int(n or 1))]
    todo: queue.Queue = queue.Queue()
    for j in jobs:
        todo.put(j)
    log_lock = threading.Lock()
    logf = open(out / "broad_multi.log", "a")

    def worker(gpu: str) -> None:
        while True:
            try:
                op, i, n = todo.get_nowait()
            except queue.Empty:
                return
            left = a.deadline_s - (time.time() - t0) - 25   # leave time to write and merge
            if left < 20:
                continue
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu, PYTHONUNBUFFERED="1")
            if op == "cmd":
                t = time.time()
                try:
                    p = subprocess.run(i, shell=True, env=env, capture_output=True, text=True, timeout=left + 20,
                                       check=False)
                    rc, so, se = p.returncode, p.stdout, p.stderr
                except subprocess.TimeoutExpired as e:
                    rc, so, se = "timeout", str(e.stdout or "")[-20000:], str(e.stderr or "")[-3000:]
                with log_lock:
                    logf.write(f"=== cmd on gpu {gpu} rc {rc} {time.time() - t:.0f}s: {i}\n{so[-20000:]}\n"
                               f"{se[-3000:]}\n")
                    logf.flush()
                    print(f"cmd on gpu {gpu}: rc {rc} in {time.time() - t:.0f}s: {i[:100]}", flush=True)
                continue
            cmd = [sys.executable, "-m", f"ck_{op}.bench_broad", "--shard", f"{i}/{n}", "--budget", f"{left:.0f}",
                   "--out", str(out / f"{op}_shard{i}of{n}.json")] + EXTRA.get(op, [])
            cmd += ["--quick"] if a.quick else []
            t = time.time()
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=left + 60, check=False)
            with log_lock:
                logf.write(f"=== {op} {i}/{n} gpu {gpu} rc {p.returncode} {time.time() - t:.0f}s\n{p.stdout}\n"
                           f"{p.stderr[-3000:]}\n")
                logf.flush()
                print(f"{op} {i}/{n} on gpu {gpu}: rc {p.returncode} in {time.time() - t:.0f}s", flush=True)

    threads = [threading.Thread(target=worker, args=(g,)) for g in _gpus()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    from ck_core.bench import with_header

    command = "python benchmarks/broad_multi.py " + " ".join(sys.argv[1:])
    for op in dict.fromkeys(j[0] for j in jobs if j[0] != "cmd"):
        parts = []
        for f in sorted(out.glob(f"{op}_shard*of*.json")):
            parts.append(json.loads(f.read_text()))
        if not parts:
            print(f"{op}: no shard wrote a result", flush=True)
            continue
        res = merge(op, parts, command)
        (out / f"{op}_broad.json").write_text(json.dumps(with_header(res), indent=1, default=str))
        print(op, json.dumps(res["summary"])[:1500], flush=True)
    print(f"done in {time.time() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
