"""`ck bench gemm --vs torch`: dispatched Triton GEMM vs torch.matmul (cuBLAS).

Same process, same inputs; both sides are timed as CUDA-graph replays
(``triton.testing.do_bench_cudagraph``: warm-up, median), so Python launch cost
is out of both numbers -- it is measured on its own: the host overhead of
``Dispatcher.run`` over the bare Triton launch.  Also measured: the parallel AOT
build speed-up and cache-hit loads.
"""
from __future__ import annotations

import math
import os
import tempfile
import time

from ck_core.errors import UnsupportedProblem
from ck_core.progress import Progress

SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (2048, 2048, 2048), (1024, 1024, 1024),
          (16, 4096, 4096), (128, 14336, 4096), (4096, 14336, 4096), (8192, 4096, 14336)]
QUICK = [(4096, 4096, 4096), (16, 4096, 4096)]


def _gpu_arch(mgr, arch_name):
    if arch_name:
        return mgr.arch(arch_name)
    tb = mgr.backend("triton")
    for arch in mgr.archs().values():
        if tb.can_execute(arch)[0] and arch.vendor != "other":
            return arch
    raise UnsupportedProblem("ck bench gemm needs a GPU that an installed arch plugin describes "
                             "(e.g. ck-arch-sm90 on an H100); none is visible here")


def bench(peer: str, options: dict) -> dict:
    import torch
    from triton.testing import do_bench_cudagraph

    from ck_core import Dispatcher, Registry, get_manager

    from .problem import GemmProblem

    if peer != "torch":
        raise UnsupportedProblem(f"gemm benchmarks compare with 'torch' (cuBLAS), not {peer!r}")
    mgr = get_manager()
    arch = _gpu_arch(mgr, options.get("arch"))
    shapes = QUICK if options.get("quick") else SHAPES
    dtypes = options.get("dtypes") or ["bf16", "fp16"]
    dtypes = [dtypes] if isinstance(dtypes, str) else dtypes
    rows = []
    regs = {}
    counter = (options.get("progress") or Progress)(len(dtypes) * len(shapes), "ck bench gemm")
    for dtype in dtypes:
        regs[dtype] = reg = Registry.from_enumeration("gemm", arch.name, "triton", dtypes=[dtype],
                                                      layouts=["rcr"])
        disp = Dispatcher(reg, backend="triton")
        tdt = getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[dtype])
        for (m, n, k) in shapes:
            p = GemmProblem(m=m, n=n, k=k, dtype=dtype, layout="rcr")
            a = torch.randn(m, k, device="cuda", dtype=tdt)
            b = torch.randn(n, k, device="cuda", dtype=tdt)
            key = disp.select(p)
            c = disp.run(p, a, b)
            ref = torch.matmul(a.float(), b.float().t())
            err = ((c.float() - ref).norm() / ref.norm()).item()
            ours = do_bench_cudagraph(lambda: disp.run(p, a, b), rep=200, return_mode="median")
            theirs = do_bench_cudagraph(lambda: torch.matmul(a, b.t()), rep=200, return_mode="median")
            fl = 2.0 * m * n * k
            t_ours, t_peer = fl / ours / 1e9, fl / theirs / 1e9
            rows.append({"group": dtype, "case": f"{dtype} {m}x{n}x{k}", "ours": round(t_ours, 1),
                         "peer": round(t_peer, 1), "peer_name": "torch.matmul (cuBLAS)",
                         "unit": "TFLOPS", "ratio": round(t_ours / t_peer, 3),
                         "ok": err < 2e-2, "rel_err": err, "kernel": key.name})
            del a, b, c, ref
            counter.update(label=rows[-1]["case"])
    counter.close()
    extra = {"host overhead": _overhead(regs[dtypes[0]], dtypes[0])}
    if not options.get("quick"):
        extra["build"] = _build_speed(arch, dtypes[0], int(options.get("workers") or os.cpu_count() or 2))
    return {"rows": rows, "extra": extra, "arch": arch.name}


def _overhead(reg, dtype):
    """Host microseconds per call: Dispatcher.run vs launching the same kernel directly.

    Two baselines per kernel: ``kernel[grid](*args)`` (the plain Triton launch, the
    issue's "raw launch") and the compiled kernel's own launcher (the floor that
    Dispatcher.run's replay path calls).  One pointer kernel and one TMA-descriptor
    kernel, both on a 256^3 problem, C preallocated on every side.
    """
    import torch

    from ck_core import Dispatcher, Registry

    from .problem import GemmProblem
    from .backends.triton.keys import bare_launch

    p = GemmProblem(m=256, n=256, k=256, dtype=dtype, layout="rcr")
    tdt = getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[dtype])
    a = torch.randn(256, 256, device="cuda", dtype=tdt)
    b = torch.randn(256, 256, device="cuda", dtype=tdt)
    c = torch.empty(256, 256, device="cuda", dtype=tdt)
    cands = reg.candidates(p, "triton")
    picks = {}
    for k in cands:
        kind = "tma" if k.algorithm.variant.startswith("tma") else "pointer"
        if k.algorithm.split_k == 1 and kind not in picks and k.algorithm.tile_m <= 128:
            picks[kind] = k

    def per_call(fn, n=2000):
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        best = math.inf
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter() - t0) / n)
            torch.cuda.synchronize()
        return best * 1e6

    rows = []
    for kind, key in sorted(picks.items()):
        disp = Dispatcher(Registry(reg.arch, [key]), backend="triton")
        out = disp.run(p, a, b, c=c)
        ref = a.float() @ b.float().t()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        raw = bare_launch(key, p, a, b)
        floor = bare_launch(key, p, a, b, replay=True)
        t_run = per_call(lambda: disp.run(p, a, b, c=c))
        t_raw = per_call(raw)
        row = {"case": f"Dispatcher.run (warm) vs kernel[grid](...), {kind} kernel", "run_us": round(t_run, 2),
               "raw_us": round(t_raw, 2), "overhead_us": round(t_run - t_raw, 2), "kernel": key.name,
               "rel_err": err}
        if floor is not None:
            t_floor = per_call(floor)
            row["replay_floor_us"] = round(t_floor, 2)
            row["over_floor_us"] = round(t_run - t_floor, 2)
        rows.append(row)
    return rows


def _build_speed(arch, dtype, workers):
    """AOT-compile 32 kernels with 1, then 2, 4, ... up to N workers, each into fresh caches
    (the pool's start-up counted in); then cache-hit loads."""
    from ck_core import Registry
    from ck_core.build import build_registry

    base = Registry.from_enumeration("gemm", arch.name, "triton", dtypes=[dtype], layouts=["rcr"])
    keys = list(base)[:32]
    out = []
    t_one = None
    old = os.environ.get("TRITON_CACHE_DIR")
    counts = [1] + [w for w in (2, 4, 8) if w < workers] + [workers]
    for n in counts:
        with tempfile.TemporaryDirectory() as d:
            # a cold Triton cache too, or the second build would only read the first's binaries
            os.environ["TRITON_CACHE_DIR"] = os.path.join(d, "triton")
            reg = Registry(arch.name, keys)
            rep = build_registry(reg, max_workers=n, progress=False, cache_root=d)
            if n == 1:
                t_one = rep.seconds
            row = {"case": f"build 32 kernels, {n} worker(s)", "seconds": round(rep.seconds, 2),
                   "built": len(rep.built), "failed": len(rep.failed),
                   "speedup": round(t_one / rep.seconds, 2), "workers": n,
                   "speedup_per_worker": round(t_one / rep.seconds / n, 2),
                   # summed triton.compile seconds: grows with N when the workers slow each
                   # other down (shared cores, clocks), stays flat when the pool itself costs
                   "compile_cpu_s": round(sum(m.get("compile_seconds", 0.0) for m in rep.built.values()), 2)}
            if n == workers:
                reg2 = Registry(arch.name, keys)
                rep2 = build_registry(reg2, max_workers=1, progress=False, cache_root=d)
                row["cache_hit_ms_per_kernel"] = round(rep2.seconds / max(len(keys), 1) * 1e3, 2)
                row["cache_hits"] = rep2.cache_hits
            out.append(row)
    if old is None:
        os.environ.pop("TRITON_CACHE_DIR", None)
    else:
        os.environ["TRITON_CACHE_DIR"] = old
    return out
