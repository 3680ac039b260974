"""How many distinct Triton compiles a suite needs: kernels specialised on sizes vs not.

    python benchmarks/compile_count.py --cpu [--suites gemm,conv,fmha] --out OUT.json
    python benchmarks/compile_count.py --gpu SUITE --out OUT.json [--fa PATH] [--budget-s S]
                                      [--prebuilt SET] [--fraction F --min-per-test N]

``--cpu`` (no GPU needed): for every case of the broad suites (``ck_<op>.bench_broad.cases()``;
fmha: the batch-mode attention cases, forward and backward) and of ``fa_like`` (the shapes
FlashAttention's CK test suite sweeps: its sequence-length pairs x head dims x causal x dtype x
MHA/GQA/MQA, batch 4, forward and backward), the Dispatcher selects the key(s)
on sm90 as the public API does, the key's launcher is traced on meta tensors, and each launch is
specialised as ``ck_core.backends.triton_artifacts`` would (``specialise``: signature, constants,
attributes) without compiling.  The distinct (kernel name, specialisation) pairs are the compiles a
fresh process needs.  "now" is the kernels' declared policy (triton_artifacts.specialisation);
"before" is Triton's default binder on the same launches (integers equal to 1 made constants,
divisibility by 16 of every integer; the policies cleared): a lower bound of the old count, since
the old launchers also split the backward on EVEN_M x EVEN_N separately.

``--gpu SUITE`` (on the device machine, from the repo root): runs SUITE in this process with a
fresh, empty kernel cache (CK_CACHE_DIR in a temporary folder) and reports what
``triton_artifacts.STATS`` counted (compiled / loaded / memory), the cache's entries and the wall
time; with ``--prebuilt SET`` (a kernel-cache folder or a ``ck-kernels-<arch>`` wheel, unpacked
into the temporary folder) the set is read beside the empty cache (``CK_KERNEL_SETS``), so the
compiles are what the set lacks.  Compiles outside the kernel cache are counted too (Triton JIT
kernels, Triton's C launcher stubs).  SUITE: fa (FlashAttention's CK test suite through benchmarks/flash_attn_suite.py; needs
--fa PATH), fmha, gemm, conv (``ck_<op>.bench_broad.run``).  Run it on main before and after the
merge to compare.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _target():
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", 90, 32)


def _policy_off(fns):
    """Clear the kernels' specialisation policies (Triton's default binder); returns an undo."""
    from ck_core.backends import triton_artifacts as ta

    saved = []
    philox = {"seed_lo", "seed_hi", "off_lo", "drop_thresh"}   # the kernels' own do_not_specialize before
    for fn in fns:
        saved.append((fn, [p.do_not_specialize for p in fn.params], getattr(fn, "ck_align_only", None),
                      getattr(fn, "ck_align_groups", None)))
        for p in fn.params:
            p.do_not_specialize = p.name in philox
        fn.ck_align_only, fn.ck_align_groups = frozenset(), ()
    ta._binder.cache_clear()
    ta._align_policy.cache_clear()

    def undo():
        for fn, flags, al, gr in saved:
            for p, f in zip(fn.params, flags):
                p.do_not_specialize = f
            fn.ck_align_only, fn.ck_align_groups = al, gr
        ta._binder.cache_clear()
        ta._align_policy.cache_clear()
    return undo


def _specs(calls):
    """Distinct (name, material digest) of traced launches ``[(name, fn, args, kwargs, extra)]``."""
    from ck_core.backends import triton_artifacts as ta
    from ck_core.cache import digest

    out = set()
    for name, fn, args, kwargs, extra in calls:
        _, _, _, material = ta.specialise(fn, args, kwargs, _target(), extra)
        out.add((name, digest(material)))
    return out


def _dispatcher(op, **opts):
    from ck_core.dispatcher import Dispatcher
    from ck_core.plugins import get_manager
    from ck_core.registry import Registry

    mgr = get_manager()
    reg = mgr.hook.ck_api_registry(op=op, arch=mgr.arch("sm90"), backend="triton", options=dict(opts))
    if reg is None:
        reg = Registry.from_enumeration(op, "sm90", "triton", manager=mgr, **opts)
    return Dispatcher(reg, backend="triton", check_backend=False)


def _trace_gemm(errors):
    from ck_core.backends import triton_artifacts as ta
    from ck_core.plugins import get_manager
    from ck_gemm import bench_broad
    from ck_gemm.problem import GemmProblem

    op, calls, disps = get_manager().op("gemm"), [], {}
    for c in bench_broad.cases():
        try:
            p = GemmProblem(m=c["m"], n=c["n"], k=c["k"], batch=c["batch"], dtype=c["dtype"], layout=c["layout"])
            dk = (p.dtype, p.layout, p.dtype_c)
            disp = disps.get(dk) or disps.setdefault(dk, _dispatcher(
                "gemm", dtypes=(p.dtype,), layouts=(p.layout,), dtypes_c=(p.dtype_c,), num_ds=(0,), d_ops=("add",),
                activations=("none",)))
            key = disp.select(p)
            extra = ta.compile_options(key)
            calls += [(key.name + s, f, a, kw, extra) for s, f, a, kw in op.render(key, "triton").jit_calls(p)]
        except Exception as exc:  # noqa: BLE001 - a case we cannot trace is reported, not fatal
            errors.append(f"gemm {c['case']}: {type(exc).__name__}: {str(exc)[:200]}")
    return calls


def _trace_conv(errors):
    from ck_conv import bench_broad
    from ck_conv.backends.triton.keys import jit_calls
    from ck_core.backends import triton_artifacts as ta

    calls, disps = [], {}
    for c in bench_broad.cases():
        try:
            p = bench_broad._problem(c)
            dk = (p.direction, p.dtype, p.ndim, p.layout_family)
            disp = disps.get(dk) or disps.setdefault(dk, _dispatcher(
                "conv", directions=(p.direction,), dtypes=(p.dtype,), ndims=(p.ndim,), layouts=(p.layout_family,)))
            key = disp.select(p)
            extra = ta.compile_options(key)
            calls += [(key.name + s, f, a, kw, extra) for s, f, a, kw in jit_calls(key, p)]
        except Exception as exc:  # noqa: BLE001
            errors.append(f"conv {c['case']}: {type(exc).__name__}: {str(exc)[:200]}")
    return calls


#: FlashAttention's tests/test_flash_attn_ck.py sweeps (test_flash_attn_output and kin): its
#: (seqlen_q, seqlen_k) pairs, head dims, batch 4 with 9 query heads (MHA, GQA 9/3, MQA), causal and not
FA_SEQLENS = ((113, 203), (128, 217), (113, 211), (108, 256), (256, 512), (512, 256), (1024, 1024), (1023, 1024),
              (1024, 1023), (2048, 2048))
FA_HDIMS = (32, 40, 59, 64, 96, 111, 128, 160, 192, 224, 256)


def _fa_like_cases():
    out = []
    for sq, sk in FA_SEQLENS:
        for d in FA_HDIMS:
            for causal in (False, True):
                for dtype in ("fp16", "bf16"):
                    for hk in (9, 3, 1):
                        out.append(dict(kind="attn", b=4, hq=9, hk=hk, s=sq, sk=sk, d=d,
                                        mask="causal" if causal else "full", dtype=dtype,
                                        case=f"fa {dtype} {sq}x{sk} d{d} hk{hk} {'causal' if causal else ''}"))
    return out


def _trace_fa_like(errors):
    return _trace_fmha(errors, _fa_like_cases(), align="bottom_right")


def _trace_fmha(errors, cases=None, align="top_left"):
    import attrs
    import torch

    from ck_core.plugins import get_manager
    from ck_fmha import bench_broad
    from ck_fmha.api import _mask_fields
    from ck_core.backends import triton_artifacts as ta
    from ck_fmha.backends.triton import implement as T
    from ck_fmha.problem import FmhaProblem

    op, calls, disps = get_manager().op("fmha"), [], {}
    for c in (bench_broad.cases() if cases is None else cases):
        if c["kind"] != "attn":
            continue
        try:
            dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[c["dtype"]]
            b, hq, hk, s, d = c["b"], c["hq"], c["hk"], c["s"], c["d"]
            sk = c.get("sk", s)
            win = (c["window"], 0) if c["mask"] == "window" else (-1, -1)
            p = FmhaProblem(family="fwd", batch=b, nhead_q=hq, nhead_k=hk, seqlen_q=s, seqlen_k=sk, hdim_q=d,
                            hdim_v=d, dtype=c["dtype"], layout="bhsd", lse=True,
                            **_mask_fields(c["mask"] != "full", win, align))
            dk = (p.dtype, d)
            disp = disps.get(dk) or disps.setdefault(dk, _dispatcher(
                "fmha", families=("fwd", "bwd_dot_do_o", "bwd_dq_dk_dv", "bwd_convert_dq"), dtypes=(p.dtype,),
                hdims=((d, d),)))

            def meta(*shape, dtype=dt):   # bhsd, as torch's scaled_dot_product_attention takes them
                return torch.empty(shape, dtype=dtype, device="meta")

            f32 = torch.float32
            tensors = {"fwd": lambda: dict(q=meta(b, hq, s, d), k=meta(b, hk, sk, d), v=meta(b, hk, sk, d)),
                       "bwd_dot_do_o": lambda: dict(o=meta(b, hq, s, d), do=meta(b, hq, s, d)),
                       "bwd_dq_dk_dv": lambda: dict(q=meta(b, hq, s, d), k=meta(b, hk, sk, d), v=meta(b, hk, sk, d),
                                                    do=meta(b, hq, s, d), lse=meta(b, hq, s, dtype=f32),
                                                    d=meta(b, hq, s, dtype=f32)),
                       "bwd_convert_dq": lambda: dict(q=meta(b, hq, s, d), dq_acc=meta(b, hq, s, d, dtype=f32))}
            bp = attrs.evolve(p, family="bwd_dq_dk_dv", lse=False)
            for prob in (p, bp):
                for _, sub in op.plan(prob):
                    key = disp.select(sub)
                    got: list = []
                    T.make_launcher(key, capture=got)(sub, tensors[sub.family]())
                    pre = T.artifact_name(key)   # the entries the launcher loads (a head-dim class's, shared)
                    calls += [(ta.entry_name(pre, sfx), f, a, kw, None) for sfx, f, a, kw in got]
        except Exception as exc:  # noqa: BLE001
            errors.append(f"fmha {c['case']}: {type(exc).__name__}: {str(exc)[:200]}")
    return calls


def cpu(suites, out):
    errors, result = [], {"mode": "cpu", "target": "cuda:90", "suites": {}}
    for suite in suites:
        t0 = time.time()
        calls = {"gemm": _trace_gemm, "conv": _trace_conv, "fmha": _trace_fmha,
                 "fa_like": _trace_fa_like}[suite](errors)
        now = _specs(calls)
        undo = _policy_off({c[1] for c in calls})
        try:
            before = _specs(calls)
        finally:
            undo()
        result["suites"][suite] = {"launches": len(calls), "kernels": len({c[0] for c in calls}),
                                   "compiles_now": len(now), "compiles_before": len(before),
                                   "seconds": round(time.time() - t0, 1)}
        print(suite, result["suites"][suite], flush=True)
    result["errors"] = errors
    from ck_core.bench import with_header

    with open(out, "w") as f:
        json.dump(with_header(result, device="CPU (launches traced on meta tensors, not compiled)"), f, indent=1)


def _prebuilt_root(path, tmp):
    """The kernel-cache root of a prebuilt set: a folder as it is, a ``ck-kernels-<arch>`` wheel unpacked."""
    if os.path.isdir(path):
        return os.path.abspath(path)
    from pathlib import Path

    from ck_core.kernel_wheel import unpack_wheel

    return str(unpack_wheel(Path(path), Path(tmp) / "prebuilt"))


def _count_outside():
    """Counters of what compiles outside the kernel cache: Triton JIT kernels (``fn[grid]``: the
    suite's own, e.g. FlashAttention's rotary reference) and Triton's C launcher stubs (one per
    distinct kernel signature per machine, cached in TRITON_CACHE_DIR)."""
    counts = {"triton_jit_compiles": 0, "launcher_stub_builds": 0}
    try:
        from triton.runtime import build, jit
    except ImportError:   # pragma: no cover
        return counts
    do_compile, cc = jit.JITFunction._do_compile, build._build

    def counted_compile(self, *a, **k):
        counts["triton_jit_compiles"] += 1
        return do_compile(self, *a, **k)

    def counted_build(*a, **k):
        counts["launcher_stub_builds"] += 1
        return cc(*a, **k)

    jit.JITFunction._do_compile, build._build = counted_compile, counted_build
    return counts


def gpu(suite, out, fa, budget_s, prebuilt=None, fa_args=()):
    """One schema for every suite: cases (run / passed / failed / skipped / not_run), compiles into
    the (fresh, empty) kernel cache, what loaded from the prebuilt set, what compiled outside the
    cache, wall time."""
    tmp = tempfile.mkdtemp(prefix="ck-compile-count-")
    os.environ["CK_CACHE_DIR"] = tmp
    # no prebuilt set unless one is given: count what a bare install compiles
    os.environ["CK_KERNEL_SETS"] = _prebuilt_root(prebuilt, tmp) if prebuilt else "none"
    from ck_core.backends import triton_artifacts as ta
    from ck_core.cache import KernelCache

    outside = _count_outside()
    t0 = time.time()
    report = os.path.join(tmp, "suite.json")
    if suite == "fa":
        sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
        import flash_attn_suite

        argv = ["--fa", fa, "--json", report, *fa_args] + (["--budget-s", str(budget_s)] if budget_s else [])
        try:
            flash_attn_suite.main(argv)
        except SystemExit:
            pass
    else:
        mod = __import__(f"ck_{suite}.bench_broad", fromlist=["run"])
        mod.run(out_path=report, **({"budget_s": budget_s} if budget_s else {}))
    summary, cases = None, None
    try:
        with open(report) as f:
            rep = json.load(f)
        summary = rep.get("summary")
        tot = rep.get("totals")          # flash_attn_suite.py's report
        if tot:
            cases = {"run": tot["passed"] + tot["failed"] + tot["skipped"], **{
                k: tot[k] for k in ("passed", "failed", "skipped", "not_run", "selected", "collected")}}
            summary = {"totals": tot, "per_test": rep.get("per_test"), "failures": rep.get("failures", [])[:20],
                       "wall_s": rep.get("wall_s")}
    except (OSError, ValueError, KeyError):
        pass
    seconds = round(time.time() - t0, 1)
    res = {"mode": "gpu", "suite": suite, "prebuilt": prebuilt, "prebuilt_root": os.environ["CK_KERNEL_SETS"],
           "cases": cases, "compiles": ta.STATS["compiled"], "loaded": ta.STATS["loaded"],
           "stats": dict(ta.STATS), "outside_kernel_cache": outside,
           "cases_per_minute": round(cases["run"] / seconds * 60, 1) if cases and seconds else None,
           "cache": KernelCache(os.path.join(tmp, "kernels"), extra_roots=[]).stats(),
           "seconds": seconds, "suite_summary": summary}
    from ck_core.bench import with_header

    with open(out, "w") as f:
        json.dump(with_header(res), f, indent=1, default=str)
    print(json.dumps({k: v for k, v in res.items() if k != "suite_summary"}, default=str)[:3000])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--suites", default="gemm,conv,fmha,fa_like")
    ap.add_argument("--gpu", choices=("fa", "fmha", "gemm", "conv"))
    ap.add_argument("--fa", help="--gpu fa: a snapshot of the flash-attention repository")
    ap.add_argument("--budget-s", type=float, default=None)
    ap.add_argument("--prebuilt", default=None,
                    help="--gpu: a prebuilt kernel set (a kernel-cache root folder, or the ck-kernels-<arch> "
                         ".whl that `ck build --wheel` / benchmarks/fa_trace.py --wheel wrote), read through "
                         "CK_KERNEL_SETS beside the empty cache; compiles then count what it lacks")
    ap.add_argument("--fraction", type=float, default=None, help="--gpu fa: flash_attn_suite.py --fraction")
    ap.add_argument("--min-per-test", type=int, default=None, help="--gpu fa: flash_attn_suite.py --min-per-test")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.cpu == bool(a.gpu):
        ap.error("give --cpu or --gpu SUITE")
    if a.cpu:
        cpu([s for s in a.suites.split(",") if s], a.out)
    else:
        if a.gpu == "fa" and not a.fa:
            ap.error("--gpu fa needs --fa PATH")
        fa_args = (["--fraction", str(a.fraction)] if a.fraction is not None else []) + (
            ["--min-per-test", str(a.min_per_test)] if a.min_per_test is not None else [])
        gpu(a.gpu, a.out, a.fa, a.budget_s, prebuilt=a.prebuilt, fa_args=fa_args)


if __name__ == "__main__":
    main()
