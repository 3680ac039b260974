"""Collect the selection oracle: per shape, the time of every candidate kernel supports() admits.

    python benchmarks/selection_collect.py --op gemm --shapes 1500 --workers 14 --budget-s 280 --out $OUT

Shapes come from a fixed seed (LLM linear layers of public model configs, skinny M, random odd
sizes, batched; fp16 and bf16) with a train / held-out split: whole model configs are held out,
and about 30% of the other shapes.  For each shape every candidate of the registry the public
API uses (``ck_core.api.dispatcher_for`` with the API's options) is run once against an fp32
product (a wrong result is a failure, timed as infinity; one read-back for all candidates),
then timed with CUDA events: all candidates queued behind one GPU sleep kernel (so the events
see back-to-back kernel time, not host time), one launch each, then several launches for those
within 2x of the fastest; torch.matmul (cuBLAS) is timed the same way on the same tensors.

Shapes are grouped by Triton specialisation class (:func:`spec_class`: shapes of one class run
the same compiled kernels).  ``--workers`` processes compile each class's candidates into the
kernel cache (meta tensors, no GPU; most frequent class first) while the main process times the
shapes of the classes already compiled, in runs of ``--class-block`` shapes a class.

Rows are appended to ``<out>/<op>_<arch>.jsonl`` as they are measured (a killed run keeps them):
a header line, ``{"kernel": i, "name": ...}`` lines, then one line per shape with ``times`` as
``[[kernel index, ms], ...]`` (``null`` ms: failed), ``peer_ms`` and the heuristic's pick over
the full set.  On the CPU (``--backend numpy`` or the Triton interpreter) the same code runs with
wall-clock timing and no peer, for tests.

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
import zlib
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))   # the sibling module below, also in workers
from selection_shapes import (ATTN_MODELS, HELD_OUT_ATTN, HELD_OUT_MODELS, MAX_FLOPS, MODELS, OPS,  # noqa: E402,F401
                              PEERS, SEED, class_blocks, conv_case, conv_cases, conv_cuda_inputs, conv_options,
                              conv_peer, conv_problem, conv_torch_tensors, fmha_cases, fmha_cuda_inputs,
                              fmha_options, fmha_peer, fmha_problem, gemm_cases, gemm_cuda_inputs, gemm_options,
                              gemm_peer, gemm_problem, spec_class)

def _compile_worker(args):
    """Compile one class's kernels into the kernel cache without touching the GPU, so the
    timing process only loads them (``ck_core.backends.triton_backend.build_for_problem``)."""
    op_name, arch_name, backend, cls, case, names = args
    from ck_core.backends.triton_backend import build_for_problem
    from ck_core.key import KernelKey
    from ck_core.plugins import get_manager

    mgr = get_manager()
    op, arch = mgr.op(op_name), mgr.arch(arch_name)
    p = OPS[op_name][1](case)
    failed = []
    for name in names:
        try:
            build_for_problem(KernelKey.from_name(name, mgr), op, arch, p)
        except Exception as exc:  # noqa: BLE001 - one failing kernel is that kernel's failure
            failed.append((name, f"{type(exc).__name__}: {str(exc)[:160]}"))
    return cls, len(names), failed


class CompilePool:
    """Compiles the classes' kernels in worker processes, most frequent class first, while the
    main process times the classes already compiled."""

    def __init__(self, op_name, arch, backend, plan, workers: int):
        import threading

        self.pending = {cls: 0 for cls, _, _ in plan}
        self.failed: dict = {cls: {} for cls, _, _ in plan}
        self.compiled = 0
        tasks = []
        for cls, case, names in plan:
            for i in range(0, len(names), 4):
                tasks.append((op_name, arch, backend, cls, case, names[i:i + 4]))
                self.pending[cls] += 1
        self.t0 = time.time()
        self._pool = mp.get_context("spawn").Pool(workers)
        self._it = self._pool.imap(_compile_worker, tasks)   # in order: the first classes finish first
        self._tasks = tasks
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()
        print(f"compile: {len(plan)} classes, {len(tasks)} tasks over {workers} processes", flush=True)

    def _drain(self):
        for task in self._tasks:   # imap answers in task order
            try:
                cls, n, failed = self._it.next()
            except Exception as exc:  # noqa: BLE001 - a lost task: the timing process compiles its kernels
                print(f"compile: a task failed ({type(exc).__name__}: {str(exc)[:200]})", flush=True)
                cls, n, failed = task[3], 0, []
            with self._lock:
                self.pending[cls] -= 1
                self.compiled += n
                self.failed[cls].update(failed)

    def ready(self, cls) -> bool:
        with self._lock:
            return self.pending.get(cls, 0) <= 0

    def close(self):
        self._pool.terminate()


# -- measuring one shape ------------------------------------------------------------------------

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


def _rel_err(out: dict, ref: dict):
    """Relative error of the outputs (a 0-d GPU tensor on CUDA: read back once for all kernels)."""
    import numpy as np

    worst = 0.0
    for k, r in ref.items():
        if k not in out:
            continue
        if hasattr(r, "is_cuda"):
            o = out[k].float().reshape(r.shape)
            e = (o - r).norm() / r.norm().clamp_min(1e-30)
            worst = e if isinstance(worst, float) else worst.maximum(e)
            continue
        o = np.asarray(out[k].detach().float().cpu().numpy() if hasattr(out[k], "detach") else out[k],
                       dtype=np.float64).reshape(r.shape)
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


#: GPU time each kernel's timed run aims at (more launches for short kernels, up to --reps)
TARGET_MS = 0.15
#: H100 SM clock (cycles a second) for torch.cuda._sleep
SLEEP_HZ = 1.75e9


def _queued(runs, reps, sleep_s):
    """Time ``runs`` (name, fn) with ``reps`` launches each, all queued behind one GPU sleep
    kernel so the events see back-to-back kernel time, not host time; one sync.  Returns
    (ms per launch or None, host seconds spent queueing)."""
    import torch

    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in runs]
    bad = set()
    torch.cuda._sleep(int(min(sleep_s, 0.25) * SLEEP_HZ))
    t = time.perf_counter()
    for i, ((_, fn), n, (s, e)) in enumerate(zip(runs, reps, ev)):
        s.record()
        try:
            for _ in range(n):
                fn()
        except Exception:  # noqa: BLE001 - a kernel that ran in the check but not here
            bad.add(i)
        e.record()
    host = time.perf_counter() - t
    torch.cuda.synchronize()
    return [None if i in bad else s.elapsed_time(e) / n for i, ((s, e), n) in enumerate(zip(ev, reps))], host


def measure_cuda(op, p, keys, backend, arch, dev, ref, peer, reps: int, stats: dict):
    """``({name: ms or None}, {name: error}, peer ms)``: every key checked against the fp32
    reference (one read-back for all), then timed twice in queued batches (one launch each,
    then enough launches for ~TARGET_MS each)."""
    import torch

    t0 = time.perf_counter()
    tol = op_tolerance(p)
    runs, errs, errors = [], [], {}
    for k in keys:
        try:
            fn = op.implement(k, backend, arch)   # fresh: a recorded launch holds its tensors
            errs.append(_rel_err(fn(p, dict(dev)), ref))
            runs.append((k.name, (lambda fn=fn: fn(p, dev))))
        except Exception as exc:  # noqa: BLE001 - one failing kernel never sinks the sweep
            errors[k.name] = f"{type(exc).__name__}: {str(exc)[:100]}"
    # one read-back for every check (the errors are 0-d tensors on the device)
    where = next((e.device for e in errs if torch.is_tensor(e)), "cpu")
    checked = torch.stack([torch.as_tensor(e, dtype=torch.float32, device=where) for e in errs]).tolist() \
        if errs else []
    kept = []
    for (name, fn), e in zip(runs, checked):
        if e < tol:
            kept.append((name, fn))
        else:
            errors[name] = f"wrong result, relative error {e:.3g}"
    kept.append(("__peer__", peer))
    t1 = time.perf_counter()
    first, host = _queued(kept, [1] * len(kept), 40e-6 * len(kept) + 1e-4)
    per_launch = host / len(kept)
    # the second, longer run only for the contenders (within 2x of the fastest single run) and
    # the peer: a kernel 2x slower is never picked, its single run says so well enough
    fastest = min((t for t in first[:-1] if t is not None), default=None)
    again = [i for i, t in enumerate(first) if t is not None and (
        i == len(first) - 1 or fastest is None or t <= 2.0 * fastest)]
    n = [max(1, min(reps, math.ceil(TARGET_MS / max(first[i], 1e-3)))) for i in again]
    sleep = 1.5 * per_launch * sum(n) + 1e-4
    ms, host2 = _queued([kept[i] for i in again], n, sleep)
    ms = dict(zip(again, ms))
    stats["check_s"] += t1 - t0
    stats["time_s"] += time.perf_counter() - t1
    stats["host_bound"] += host2 > sleep
    stats["timed_twice"] += len(again)
    times = {}
    for i, ((name, _), t) in enumerate(zip(kept, first)):
        times[name] = ms.get(i, t)
        if times[name] is None:
            errors[name] = "failed while timed"
    return times, errors, times.pop("__peer__")


def measure_wall(op, p, keys, backend, arch, dev, ref, peer, reps: int, stats: dict):
    """The CPU twin of :func:`measure_cuda` (numpy backend, interpreter): wall clock, no peer."""
    t0 = time.perf_counter()
    tol = op_tolerance(p)
    times, errors = {}, {}
    for k in keys:
        try:
            fn = op.implement(k, backend, arch)
            err = _rel_err(fn(p, dict(dev)), ref)
            if not err < tol:
                raise ValueError(f"wrong result, relative error {err:.3g}")
            best = math.inf
            for _ in range(max(1, reps // 2)):
                t = time.perf_counter()
                fn(p, dev)
                best = min(best, time.perf_counter() - t)
            times[k.name] = best * 1e3
        except Exception as exc:  # noqa: BLE001 - one failing kernel never sinks the sweep
            times[k.name] = None
            errors[k.name] = f"{type(exc).__name__}: {str(exc)[:100]}"
    stats["time_s"] += time.perf_counter() - t0
    return times, errors, None


def op_tolerance(p) -> float:
    if p.op == "fmha":
        return 3e-2
    return 2e-2 if p.dtype in ("fp16", "bf16") else 1e-3


# -- the collection ---------------------------------------------------------------------------

def collect(op_name: str, arch: str, backend: str, cases: list, out: Path, budget_s: float, reps: int,
            cap: int = 0, workers: int = 0, block: int = 40) -> int:
    from ck_core.api import dispatcher_for

    _, problem_of, options_of, cuda_inputs = OPS[op_name]
    cuda = backend == "triton" and not os.environ.get("TRITON_INTERPRET")
    if cuda:
        import torch
        cuda = torch.cuda.is_available()
    t0 = time.time()
    cases = class_blocks(cases, problem_of, block)
    first_of: dict = {}
    for c in cases:
        first_of.setdefault(spec_class(problem_of(c)), c)

    def candidates(p):
        disp = dispatcher_for(op_name, arch, backend, **options_of(p))
        return disp, list(disp.registry.candidates(p, backend=backend))

    pool = None
    if cuda and workers:
        plan = [(cls, c, [k.name for k in candidates(problem_of(c))[1]]) for cls, c in first_of.items()]
        pool = CompilePool(op_name, arch, backend, plan, workers)
    path = out / f"{op_name}_{arch}.jsonl"
    names: dict = {}
    stats = {"check_s": 0.0, "time_s": 0.0, "setup_s": 0.0, "wait_s": 0.0, "host_bound": 0, "timed_twice": 0}
    written = 0
    todo = [(spec_class(problem_of(c)), c) for c in cases]
    try:
        with open(path, "a") as f:
            while todo:
                if time.time() - t0 > budget_s:
                    print(f"{op_name}: budget reached with {len(todo)} of {len(cases)} shapes left", flush=True)
                    break
                # the next shape whose class is compiled (shapes of other classes wait their turn)
                i = next((j for j, (cls, _) in enumerate(todo) if pool is None or pool.ready(cls)), None)
                if i is None:
                    time.sleep(0.2)
                    stats["wait_s"] += 0.2
                    continue
                cls, c = todo.pop(i)
                ts = time.perf_counter()
                try:
                    p = problem_of(c)
                    disp, cands = candidates(p)
                    if not cands:
                        continue
                    op = disp.mgr.op(op_name)
                    heur = op.heuristic(p, list(cands), disp.arch)[0] if op.heuristic else cands[0]
                    chosen = disp.rank(p)[0]   # the Dispatcher's own order (store > ranker > heuristic)
                    order = list(dict.fromkeys([heur, chosen, *cands]))
                    if cap and len(order) > cap:
                        rest = order[2:]
                        random.Random(len(todo)).shuffle(rest)
                        order = order[:2] + rest[:max(0, cap - 2)]
                    skip = pool.failed.get(cls, {}) if pool else {}
                    seed = zlib.crc32(json.dumps(c, sort_keys=True).encode())
                    dev, ref = cuda_inputs(p, seed) if cuda else _inputs(disp, p, seed)
                except Exception as exc:  # noqa: BLE001
                    print(f"{op_name}: shape {c} skipped ({type(exc).__name__}: {str(exc)[:160]})", flush=True)
                    continue
                stats["setup_s"] += time.perf_counter() - ts
                measure = measure_cuda if cuda else measure_wall
                peer = PEERS[op_name][1](p, dev) if cuda else None
                times, errors, peer_ms = measure(op, p, [k for k in order if k.name not in skip], backend,
                                                 disp.arch, dev, ref, peer, reps, stats)
                errors.update({n: f"compile failed: {skip[n]}" for n in skip})
                rows = []
                for k in order:
                    idx = names.get(k.name)
                    if idx is None:
                        idx = names[k.name] = len(names)
                        f.write(json.dumps({"kernel": idx, "name": k.name}) + "\n")
                    t = times.get(k.name)
                    rows.append([idx, None if t is None else round(t, 5)])
                row = {"family": c["family"], "split": c["split"], "problem": p.to_dict(), "times": rows,
                       "heuristic": names[heur.name], "dispatcher": names[chosen.name]}
                if peer_ms is not None:
                    row["peer_ms"] = round(peer_ms, 5)
                if errors:
                    row["errors"] = {names[n]: e for n, e in errors.items() if n in names}
                f.write(json.dumps(row, separators=(",", ":")) + "\n")
                f.flush()
                del dev, ref, peer
                written += 1
                if written % 25 == 1:
                    ok = [t for _, t in rows if t is not None]
                    from ck_core.backends import triton_artifacts

                    print(f"{op_name} {written} shapes, {len(todo)} left; {c['family']} {len(rows)} kernels, "
                          f"best {min(ok) if ok else None} ms, peer {peer_ms} ms; {time.time() - t0:.0f}s; "
                          + " ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in stats.items())
                          + f"; main process {triton_artifacts.STATS}"
                          + (f"; pool {pool.compiled} compiled" if pool else ""), flush=True)
    finally:
        if pool:
            done = sum(1 for cls in pool.pending if pool.ready(cls))
            print(f"compile: {pool.compiled} kernels compiled in {time.time() - pool.t0:.0f}s, {done} of "
                  f"{len(pool.pending)} classes complete, {sum(map(len, pool.failed.values()))} failures", flush=True)
            pool.close()
    print(f"{op_name}: phases " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                            for k, v in stats.items()), flush=True)
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
    ap.add_argument("--workers", type=int, default=0,
                    help="GEMM/FMHA: processes that compile each class's kernels while the main process times "
                         "(GPU); conv: processes that check and time shapes (at least 1)")
    ap.add_argument("--class-block", type=int, default=40,
                    help="time shapes in runs of this many of one specialisation class (0: shuffled order)")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--cap", type=int, default=0, help="most candidates timed per shape (0: all)")
    ap.add_argument("--rounds", type=int, default=3, help="conv: timing rounds per kernel (the minimum counts)")
    ap.add_argument("--grace-s", type=float, default=30.0, help="conv: wait this long for shapes under way at the budget")
    ap.add_argument("--out", default="benchmarks/results/selection")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cases = OPS[args.op][0](args.shapes, args.seed, args.max_dim)
    random.Random(args.seed).shuffle(cases)  # a run cut by its budget still samples every family
    from ck_core.bench import device_name

    with open(out / f"{args.op}_{args.arch}.jsonl", "a") as f:
        f.write(json.dumps({"op": args.op, "arch": args.arch, "backend": args.backend, "device": device_name(),
                            "date": time.strftime("%Y-%m-%d"), "command": " ".join(["benchmarks/selection_collect.py",
                                                                                    *sys.argv[1:]]),
                            "seed": args.seed, "shapes": len(cases),
                            **({"peer": PEERS[args.op][0]} if args.op in PEERS else {}),
                            **(SHORTLIST_HEADER if args.op in SHORTLIST_OPS else {})}) + "\n")
    if args.op in SHORTLIST_OPS:
        n = collect_shortlists(args.op, args.arch, args.backend, cases, out, args.budget_s, args.reps,
                               max(1, args.workers), args.rounds, args.grace_s)
        print(f"{args.op}: {n} shapes written to {out}", flush=True)
        return 0
    n = collect(args.op, args.arch, args.backend, cases, out, args.budget_s, args.reps, args.cap,
                args.workers, args.class_block)
    print(f"{args.op}: {n} shapes written to {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
