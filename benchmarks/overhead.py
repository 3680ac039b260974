"""Host overhead of the public APIs, and the first call of a new problem (issue #13, "Measure").

(a) warm eager calls: ``ck_gemm.matmul``, ``ck_conv.conv2d``, ``ck_fmha.attention`` (fwd, and
    fwd+bwd) against the bare launch of the same Triton kernels (recorded from one API call:
    ``replay`` = the compiled kernel's own launcher, ``jit`` = ``fn[grid](*args)``).  Per call:
    ``host_us`` = Python time to issue it (no sync inside the loop), ``wall_us`` = with the final
    sync; median of 5 rounds of ``--calls`` calls.  Small problems, so the host is the bottleneck.
(b) first call of a new problem in a fresh process (import and tensor set-up excluded):
    ``cold`` = empty kernel cache and empty Triton cache; ``built`` = a kernel cache that
    ``ck build`` (``build_registry`` of the keys the cold call launched) filled in another
    process, with an empty Triton cache.  Reports ms and how many kernels Triton compiled.

(c) ``--part autograd``: where an eager attention fwd+bwd step spends its host time (forward with
    requires_grad, backward alone, the backward plan called directly; a torch.profiler table).
    ``--profile DIR`` writes a cProfile of each warm call; ``--only TEXT`` picks overhead cases.

(d) ``--part cpu``: a dry run without a GPU: the same warm API calls on CPU tensors, every
    Triton launch stubbed out (launches recorded as if on a GPU, replays that do nothing),
    so the time is the host path above the launch (the launch itself excluded).

    python benchmarks/overhead.py --out overhead.json
    python benchmarks/overhead.py --part overhead autograd --only fmha --profile prof --out o.json
    python benchmarks/overhead.py --part cpu --out overhead_cpu.json    # no GPU needed
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

def _t(shape, grad=False):
    return f"torch.randn({shape}, device='cuda', dtype=torch.float16{', requires_grad=True' if grad else ''})"


#: first call of a new problem: one expression each, run in a fresh process
FIRST = {"gemm": f"ck_gemm.matmul({_t('1536, 1024')}, {_t('1024, 2048')})",
         # channels multiples of 16: the specialisation of ck build's representative conv problem
         "conv": f"ck_conv.conv2d({_t('4, 64, 28, 28')}, {_t('64, 64, 3, 3')}, padding=1)",
         # channels 24 -> 40: another specialisation than ck build's (JIT-compiled into the cache)
         "conv unaligned": f"ck_conv.conv2d({_t('3, 24, 17, 17')}, {_t('40, 24, 3, 3')}, padding=1)",
         "fmha fwd": f"ck_fmha.attention_forward({_t('2, 16, 1024, 128')}, {_t('2, 16, 1024, 128')}, "
                     f"{_t('2, 16, 1024, 128')}, causal=True)",
         "fmha fwd+bwd": f"ck_fmha.attention(*[{_t('2, 16, 512, 64', True)} for _ in range(3)])"
                         ".sum().backward()",
         "fmha splitkv decode": f"ck_fmha.decode.splitkv_decode({_t('4, 32, 1, 128')}, {_t('4, 8, 4096, 128')}, "
                                f"{_t('4, 8, 4096, 128')})"}


def _timed(fn, calls):
    import torch

    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    host, wall = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) / calls * 1e6)
        wall.append((t2 - t0) / calls * 1e6)
    return {"host_us": round(statistics.median(host), 2), "wall_us": round(statistics.median(wall), 2)}


def _record_launches(call):
    """The Triton launches one ``call()`` makes: [(name or None, fn, grid, args, kwargs)]."""
    from triton.runtime.jit import JITFunction

    from ck_core.backends import triton_artifacts as ta
    from ck_core.backends.triton_replay import Replay

    got, real_launch, real_run, real_replay = [], ta.launch, JITFunction.run, Replay.__call__

    def replay(self, args):   # a launcher's recorded fast path
        got.append(("replay", self, None, tuple(args), None))
        return real_replay(self, args)

    def launch(name, fn, grid, args, kwargs, **kw):
        got.append((name, fn, grid, tuple(args), dict(kwargs)))
        return real_launch(name, fn, grid, args, kwargs, **kw)

    def run(self, *args, grid, warmup, **kwargs):
        if not warmup:
            got.append((None, self, grid, args, dict(kwargs)))
        return real_run(self, *args, grid=grid, warmup=warmup, **kwargs)

    ta.launch, JITFunction.run, Replay.__call__ = launch, run, replay
    try:
        call()
    finally:
        ta.launch, JITFunction.run, Replay.__call__ = real_launch, real_run, real_replay
    return got


def _bare(launches):
    from ck_core.backends import triton_replay

    replays = []
    for name, fn, grid, args, kwargs in launches:
        if name == "replay":
            replays.append((fn, list(args)))
            continue
        r = triton_replay.record(fn, grid, list(args), kwargs, name=name)
        if r is None:
            replays = None
            break
        replays.append((r, list(r.args)))
    # a launcher's own replay has no plain-JIT twin here: it stands for itself
    jits = [(fn, (list(args),), {}) if n == "replay" else (fn[grid], args, kwargs)
            for n, fn, grid, args, kwargs in launches]

    def jit():
        for b, a, k in jits:
            b(*a, **k)
    rep = None
    if replays is not None:
        def rep():
            for r, a in replays:
                r(a)
    return rep, jit


def _profile(call, calls: int, path: str) -> None:
    """cProfile of ``calls`` warm calls, the functions sorted by own time, into ``path``."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        call()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(40)
    with open(path, "w") as f:
        f.write(buf.getvalue())


def _slug(name: str) -> str:
    """A file name of a case name (letters, digits, '.', '_', '-' only)."""
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def autograd_parts(calls: int, profile_dir=None, dev: str = "cuda") -> dict:
    """Where an eager attention fwd+bwd spends its host time (``--part autograd``): the forward
    with requires_grad, the backward alone (``torch.autograd.grad`` on a retained graph), the
    backward plan called directly (``ck_fmha.api._bwd``, no autograd engine), each per call
    without and with a sync after every call; a torch.profiler table of the whole step."""
    import torch

    import ck_fmha
    from ck_fmha import api as fa

    h = torch.float16
    q, k, v = (torch.randn(1, 8, 128, 64, device=dev, dtype=h, requires_grad=True) for _ in range(3))
    do = torch.randn(1, 8, 128, 64, device=dev, dtype=h)
    o = ck_fmha.attention(q, k, v)
    o2, lse = ck_fmha.attention(q, k, v, return_lse=True)
    opts = (False, None, (-1, -1), 0.0, "bhsd", True, 0.0, 0, 0, None)
    qd, kd, vd = (t.detach() for t in (q, k, v))
    parts = {"fwd, requires_grad": lambda: ck_fmha.attention(q, k, v),
             "bwd alone (autograd.grad, retained graph)": lambda: torch.autograd.grad(o, (q, k, v), do,
                                                                                     retain_graph=True),
             "bwd plan direct (api._bwd)": lambda: fa._bwd(qd, kd, vd, o2.detach(), lse, do, None, None, None,
                                                          None, *opts, False),
             "fwd+bwd step": lambda: ck_fmha.attention(q, k, v).backward(do)}
    rows = {}
    for name, call in parts.items():
        try:
            row = {"pipelined": _timed(call, calls)}
            for _ in range(5):
                call()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls // 5):
                call()
                torch.cuda.synchronize()
            row["synced_us"] = round((time.perf_counter() - t0) / (calls // 5) * 1e6, 2)
            if profile_dir:
                os.makedirs(profile_dir, exist_ok=True)
                _profile(call, 300, os.path.join(profile_dir, "autograd_" + _slug(name) + ".txt"))
        except Exception as e:  # noqa: BLE001 - one part failing must not lose the others
            row = {"error": f"{type(e).__name__}: {e}"[:500]}
        rows[name] = row
        print(name, json.dumps(row), flush=True)
    try:
        from torch.profiler import ProfilerActivity, profile

        step = parts["fwd+bwd step"]
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                step()
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
        table += "\n" + prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12)
        if profile_dir:
            with open(os.path.join(profile_dir, "autograd_torch_profiler.txt"), "w") as f:
                f.write(table)
        print(table[:6000], flush=True)
    except Exception as e:  # noqa: BLE001
        print("torch.profiler failed:", type(e).__name__, e, flush=True)
    return rows


def overhead(calls: int, profile_dir=None, only=None) -> dict:
    import torch

    import ck_conv
    import ck_fmha
    import ck_gemm

    dev, h = "cuda", torch.float16
    a, b = torch.randn(256, 256, device=dev, dtype=h), torch.randn(256, 256, device=dev, dtype=h)
    x, w = torch.randn(2, 32, 16, 16, device=dev, dtype=h), torch.randn(32, 32, 3, 3, device=dev, dtype=h)
    q, k, v = (torch.randn(1, 8, 128, 64, device=dev, dtype=h) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    do = torch.randn_like(q)

    def fwd_bwd():
        o = ck_fmha.attention(qg, kg, vg)
        o.backward(do)

    cl = torch.channels_last
    xl, wl = x.to(memory_format=cl), w.to(memory_format=cl)
    cases = {"gemm.matmul 256^3 fp16": lambda: ck_gemm.matmul(a, b),
             "gemm.matmul 256^3 fp16, B transposed view": lambda: ck_gemm.matmul(a, b.t()),
             "conv.conv2d 2x32x16x16 k3 fp16": lambda: ck_conv.conv2d(x, w, padding=1),
             "conv.conv2d 2x32x16x16 k3 fp16 channels_last": lambda: ck_conv.conv2d(xl, wl, padding=1),
             "fmha.attention fwd 1x8x128x64 fp16": lambda: ck_fmha.attention(q, k, v),
             "fmha.attention fwd+bwd 1x8x128x64 fp16": fwd_bwd}
    F = torch.nn.functional
    d = lambda t: t.double()   # noqa: E731
    refs = {"gemm.matmul 256^3 fp16": (lambda: ck_gemm.matmul(a, b), lambda: d(a) @ d(b)),
            "gemm.matmul 256^3 fp16, B transposed view": (lambda: ck_gemm.matmul(a, b.t()), lambda: d(a) @ d(b).t()),
            "conv.conv2d 2x32x16x16 k3 fp16": (lambda: ck_conv.conv2d(x, w, padding=1),
                                               lambda: F.conv2d(d(x), d(w), padding=1)),
            "conv.conv2d 2x32x16x16 k3 fp16 channels_last": (lambda: ck_conv.conv2d(xl, wl, padding=1),
                                                             lambda: F.conv2d(d(x), d(w), padding=1)),
            "fmha.attention fwd 1x8x128x64 fp16": (lambda: ck_fmha.attention(q, k, v),
                                                   lambda: F.scaled_dot_product_attention(d(q), d(k), d(v)))}
    sdpa = F.scaled_dot_product_attention
    warm_checks = {"gemm.matmul 256^3 fp16": (ck_gemm.matmul, lambda a, b: a @ b, (a, b)),
                   "gemm.matmul 256^3 fp16, B transposed view": (ck_gemm.matmul, lambda a, b: a @ b, (a, b.t())),
                   "conv.conv2d 2x32x16x16 k3 fp16": (lambda x, w: ck_conv.conv2d(x, w, padding=1),
                                                      lambda x, w: F.conv2d(x, w, padding=1), (x, w)),
                   "conv.conv2d 2x32x16x16 k3 fp16 channels_last": (lambda x, w: ck_conv.conv2d(x, w, padding=1),
                                                                    lambda x, w: F.conv2d(x, w, padding=1), (xl, wl)),
                   "fmha.attention fwd 1x8x128x64 fp16": (ck_fmha.attention, sdpa, (q, k, v))}
    rows = {}
    for name, call in cases.items():
        if only and not any(s in name for s in only):
            continue
        row = {}
        try:
            if name in refs:   # correct before fast: relative error against float64, on fresh outputs
                got, ref = refs[name][0]().double(), refs[name][1]()
                row["rel_err"] = float((got - ref).norm() / ref.norm())
                if not row["rel_err"] < 1e-2:
                    raise AssertionError(f"relative error {row['rel_err']:.3g} against float64")
            for _ in range(3):
                call()
            if name in warm_checks:   # the warm path (recorded replays) on fresh inputs of the same signature
                api, ref_fn, like = warm_checks[name]
                errs = []
                for _ in range(3):
                    ins = [torch.randn_like(t) for t in like]   # same shapes, strides, dtype, device
                    want = ref_fn(*[t.double() for t in ins])
                    errs.append(float((api(*ins).double() - want).norm() / want.norm()))
                row["rel_err_warm"] = max(errs)
                if not row["rel_err_warm"] < 1e-2:
                    raise AssertionError(f"warm call: relative error {row['rel_err_warm']:.3g} against float64")
            launches = _record_launches(call)
            row["launches"] = [getattr(f, "names", None) and "replay" or n or getattr(f, "__name__", "?")
                               for n, f, *_ in launches]
            row["api"] = _timed(call, calls)
            rep, jit = _bare(launches)
            row["bare_jit"] = _timed(jit, calls)
            row["bare_replay"] = _timed(rep, calls) if rep else None
            floor = row["bare_replay"] or row["bare_jit"]
            row["overhead_host_us"] = round(row["api"]["host_us"] - floor["host_us"], 2)
            if profile_dir:
                os.makedirs(profile_dir, exist_ok=True)
                _profile(call, 1000, os.path.join(profile_dir, _slug(name) + ".txt"))
        except Exception as e:  # noqa: BLE001 - one case failing must not lose the others
            row["error"] = f"{type(e).__name__}: {e}"[:500]
        rows[name] = row
        print(name, json.dumps(row), flush=True)
    return rows


class _StubReplay:
    """A recorded launch that launches nothing (``--part cpu``)."""

    def __init__(self, fn, args, kwargs):
        names = list(fn.arg_names)
        self.names, self.args = tuple(names), list(args) + [kwargs.get(n) for n in names[len(args):]]

    def __call__(self, args):
        pass

    def slot(self, name):
        return self.names.index(name)


def _stub_launches():
    """Route CPU tensors as GPU ones would go (recorded replays) and launch nothing."""
    from ck_core.backends import triton_artifacts as ta
    from ck_core.backends import triton_replay

    ta.launch = lambda name, fn, grid, args, kwargs, **kw: None
    triton_replay.replayable = lambda t: True
    triton_replay.record = lambda fn, grid, args, kwargs, **kw: _StubReplay(fn, args, kwargs)


def cpu_dry_run(calls: int) -> dict:
    """Warm host us/call of the public APIs on CPU tensors with every launch stubbed."""
    os.environ.setdefault("CK_BACKEND", "triton")
    import torch

    import ck_conv
    import ck_fmha
    import ck_gemm

    _stub_launches()
    h = torch.float16
    a, b = torch.randn(256, 256, dtype=h), torch.randn(256, 256, dtype=h)
    x, w = torch.randn(2, 32, 16, 16, dtype=h), torch.randn(32, 32, 3, 3, dtype=h)
    xl, wl = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
    q, k, v = (torch.randn(1, 8, 128, 64, dtype=h) for _ in range(3))
    qg = q.clone().requires_grad_()
    # on the CPU the layout copies and conversions the API makes do their work in the call
    # (on a GPU they are asynchronous launches); the channels_last case has none
    cases = {"gemm.matmul 256^3 fp16": lambda: ck_gemm.matmul(a, b),
             "gemm.matmul 256^3 fp16, B transposed view": lambda: ck_gemm.matmul(a, b.t()),
             "conv.conv2d 2x32x16x16 k3 fp16": lambda: ck_conv.conv2d(x, w, padding=1),
             "conv.conv2d 2x32x16x16 k3 fp16 channels_last": lambda: ck_conv.conv2d(xl, wl, padding=1),
             "fmha.attention fwd 1x8x128x64 fp16": lambda: ck_fmha.attention(q, k, v),
             "fmha.attention fwd 1x8x128x64 fp16, requires_grad (forward only)": lambda: ck_fmha.attention(qg, k, v)}
    rows = {}
    for name, call in cases.items():
        try:
            for _ in range(3):
                call()
            best = []
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(calls):
                    call()
                best.append((time.perf_counter() - t0) / calls * 1e6)
            rows[name] = {"host_us": round(statistics.median(best), 2)}
        except Exception as e:  # noqa: BLE001 - one case failing must not lose the others
            rows[name] = {"error": f"{type(e).__name__}: {e}"[:500]}
        print(name, json.dumps(rows[name]), flush=True)
    return rows


CHILD = r'''
import json, sys, time
import torch, triton
from triton import knobs
import ck_gemm, ck_conv, ck_fmha, ck_fmha.decode
from ck_core.plugins import get_manager
from ck_core.testing import DispatchLog
from ck_core.backends import triton_artifacts as ta
compiles = []
knobs.compilation.listener = lambda **kw: None if kw.get("cache_hit") else compiles.append(1)
log = DispatchLog()
get_manager().pm.register(log)
torch.randn(8, device="cuda"); torch.cuda.synchronize()
t0 = time.perf_counter()
out = EXPR
torch.cuda.synchronize()
ms = (time.perf_counter() - t0) * 1e3
print("RESULT" + json.dumps({"ms": round(ms, 1), "triton_compiles": len(compiles), "artifacts": dict(ta.STATS),
                             "launched": sorted({n for r in log.runs for n in r[2]})}))
'''

BUILD = r'''
import json, sys
from ck_core import Registry
from ck_core.build import build_registry
from ck_core.key import KernelKey
keys = [KernelKey.from_name(n) for n in json.loads(sys.argv[1])]
rep = build_registry(Registry(keys[0].arch, keys), progress=False)
print("RESULT" + json.dumps({"built": len(rep.built), "failed": rep.failed, "seconds": round(rep.seconds, 1)}))
'''


def _child(code, env, *args):
    r = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=400)
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT")]
    if not lines:
        return {"error": r.stderr[-1500:]}
    return json.loads(lines[-1][6:])


def first_call(cases=None) -> dict:
    """Each case cold in a fresh process; then one ``ck build`` of every key the cold calls
    launched, into one kernel cache; then each case again in a fresh process on that cache
    (each process with its own empty Triton cache)."""
    out = {}
    cases = {n: e for n, e in FIRST.items() if cases is None or n in cases}
    with tempfile.TemporaryDirectory() as tmp:
        def env(tag, ck="cold"):
            e = dict(os.environ, CK_CACHE_DIR=os.path.join(tmp, "ck_" + ck),
                     TRITON_CACHE_DIR=os.path.join(tmp, f"triton_{tag}_{time.time_ns()}"))
            e.pop("TRITON_INTERPRET", None)
            return e
        launched = set()
        for i, (op, expr) in enumerate(cases.items()):
            cold = _child(CHILD.replace("EXPR", expr), env(f"cold{i}", f"cold{i}"))
            out[op] = {"problem": expr, "cold": cold}
            launched |= set(cold.get("launched", ()))
            print(op, "cold", json.dumps(cold), flush=True)
        out["ck_build"] = _child(BUILD, env("build", "built"), json.dumps(sorted(launched)))
        print("ck build", json.dumps(out["ck_build"]), flush=True)
        for i, (op, expr) in enumerate(cases.items()):
            out[op]["built"] = _child(CHILD.replace("EXPR", expr), env(f"built{i}", "built"))
            print(op, "built", json.dumps(out[op]["built"]), flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--part", nargs="+", choices=["all", "overhead", "first", "cpu", "autograd"], default=["all"])
    ap.add_argument("--only", nargs="*", metavar="TEXT", help="overhead cases whose name contains one of these")
    ap.add_argument("--profile", metavar="DIR", help="cProfile each warm API call into DIR (after timing it)")
    ap.add_argument("--first", nargs="*", metavar="CASE", help=f"first-call cases (default all: {', '.join(FIRST)})")
    ns = ap.parse_args(argv)
    if "cpu" in ns.part:   # the interpreter's functions carry the argument names the stubs need
        os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import triton

    if "cpu" in ns.part:
        res = {"device": "cpu (launches stubbed)", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
               "command": "python benchmarks/overhead.py " + " ".join(argv or sys.argv[1:]),
               "versions": {"torch": torch.__version__, "triton": triton.__version__}, "unit": "us/call",
               "overhead": cpu_dry_run(ns.calls)}
        with open(ns.out, "w") as f:
            json.dump(res, f, indent=1)
        return

    res = {"device": torch.cuda.get_device_name(0), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "command": "python benchmarks/overhead.py " + " ".join(argv or sys.argv[1:]),
           "versions": {"torch": torch.__version__, "triton": triton.__version__}, "unit": "us/call, ms"}
    if {"all", "first"} & set(ns.part):
        res["first_call"] = first_call(ns.first)
    if {"all", "overhead"} & set(ns.part):
        res["overhead"] = overhead(ns.calls, ns.profile, ns.only)
    if "autograd" in ns.part:
        res["autograd"] = autograd_parts(ns.calls, ns.profile)
    with open(ns.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
