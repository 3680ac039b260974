"""Which compiled kernels FlashAttention's CK suite needs, found on the CPU, and a set built for them.

    python benchmarks/fa_trace.py --fa .fa --max-cases 1000 --out OUT.json
        [--fraction F --min-per-test N --seed S]       # the same sample and order as flash_attn_suite.py
        [--build DIR --workers W]                      # compile the distinct kernels for sm90 into DIR

No GPU is needed.  FlashAttention's tests/test_flash_attn_ck.py runs (a copy with its tensors on the
CPU; the sample and the order are flash_attn_suite.py's for the same --fraction/--min-per-test/--seed,
so the first N cases here are the first N cases a GPU run starts) against ck_fmha.flash_attn with the
public API dispatching as on an sm90 GPU (``CK_CPU_ARCH=sm90``, the triton backend, no interpreter).
The tests' tensors live on the CPU; each public function they call gets meta twins of its tensors
(same shapes, strides, storage offsets and shared storages: the alignment classes a GPU sees) and
runs the GPU's path of the API on them (meta tensors are what ``ck build`` traces launchers with;
no host branch of the CPU is taken), through an autograd function, so the tests' backward calls
trace the backward.  Every kernel launch (``ck_core.backends.triton_artifacts.launch``) is
specialised for sm90 exactly as the GPU process would (kernel name, Triton signature, constants,
attributes, options: the cache entry's key material) and not run.  The functions return zeros, and
the suite's references (``attention_ref``, ``apply_rotary_emb``) are replaced by zeros of their
shapes, so the tests' checks between the forward and the backward pass.  Test outcomes here mean
nothing; the launches are what the GPU run launches.

The report: per case (in run order) the entries it needs and the new ones it adds, the distinct
entries (the compiles a fresh cache needs), grouped by kernel and key.  ``--build DIR`` compiles
each distinct entry once (forked workers, ``triton.compile`` for sm90) into the kernel-cache root DIR,
the same entries the GPU process looks up: pack it with ``python -m ck_core.kernel_archive pack``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
import types
from collections import Counter, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _env() -> None:
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ["CK_CPU_ARCH"] = "sm90"
    os.environ["CK_BACKEND"] = "triton"
    os.environ["CK_KERNEL_SETS"] = "none"
    os.environ.setdefault("CK_CACHE_DIR", tempfile.mkdtemp(prefix="ck-fa-trace-cache-"))


def _copy_tests(snapshot: str, folder: str) -> str:
    """The suite's two test files with their tensors on the CPU; returns the tests folder."""
    tests = os.path.join(folder, "tests")
    os.makedirs(tests, exist_ok=True)
    for name in ("test_flash_attn_ck.py", "test_flash_attn.py"):
        with open(os.path.join(snapshot, "tests", name)) as f:
            text = f.read()
        text = re.sub(r'device\s*=\s*"cuda"', 'device="cpu"', text)
        with open(os.path.join(tests, name), "w") as f:
            f.write(text)
    return tests


def _fake_cuda() -> None:
    """What the suite asks of torch.cuda at import and in skip conditions: an H200."""
    import torch

    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(
        total_memory=141 * 2**30, name="NVIDIA H200 (traced on the CPU)", major=9, minor=0)


def _stub_references(tests_dir: str) -> None:
    """Zeros of the references' shapes (the suite's float32 references cost seconds per case on a CPU)."""
    import torch

    sys.path.insert(0, tests_dir)
    import test_flash_attn as helper   # noqa: E402  (the suite's helper module, from the copy)

    def attention_ref(q, k, v, *args, **kwargs):
        out = q[..., : v.shape[-1]] * 0 + (k.sum() + v.sum()) * 0
        b, sq, h = q.shape[:3]
        return out, torch.zeros((), dtype=q.dtype).expand(b, h, sq, k.shape[1])

    helper.attention_ref = attention_ref
    import flash_attn.layers.rotary as rotary

    rotary.apply_rotary_emb = lambda x, *a, **k: x * 1


class Tracer:
    """``triton_artifacts.launch`` replaced: specialise for sm90, record, zero the float tensors."""

    def __init__(self):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", 90, 32)
        self.case = None
        self.first = {}          # (name, digest) -> index of the first case that launched it
        self.pending = []        # (name, src, options, material) per new entry, in first-use order
        self.per_case = defaultdict(set)
        self.launches = 0
        self.errors = Counter()
        self.check = False
        self.check_errors = Counter()

    def launch(self, name, fn, grid, args, kwargs, cache_root=None, extra=None):
        import torch

        from ck_core.backends import triton_artifacts as ta
        from ck_core.cache import digest

        self.launches += 1
        if not hasattr(fn, "params"):
            self.errors[f"{name}: not a JIT function"] += 1
            return None
        try:
            bound, src, options, material = ta.specialise(fn, args, kwargs, self.target, extra)
        except Exception as exc:  # noqa: BLE001 - reported, the trace goes on
            self.errors[f"{name}: {type(exc).__name__}: {str(exc)[:160]}"] += 1
            return None
        k = (name, digest(material))
        if k not in self.first:
            self.first[k] = self.case
            self.pending.append((name, src, options, material))
        self.per_case[self.case].add(k)
        if self.check:   # load the entry from the prebuilt set (triton.compile raises meanwhile)
            try:
                ta.kernel_for_call(name, fn, args, kwargs, extra=extra)
            except Exception as exc:  # noqa: BLE001
                self.check_errors[f"{name}: {type(exc).__name__}: {str(exc)[:120]}"] += 1
        return None


def _metas(tensors):
    """Meta twins of CPU ``tensors``: views of one meta storage per CPU storage, same offsets."""
    import torch

    bases, out = {}, []
    for t in tensors:
        st = t.untyped_storage()
        key = (st.data_ptr(), t.dtype)
        base = bases.get(key)
        if base is None:
            n = max(st.nbytes() // t.element_size(), t.storage_offset() + 1)
            base = bases[key] = torch.empty(n, dtype=t.dtype, device="meta")
        m = base.as_strided(t.shape, t.stride(), t.storage_offset()).detach()
        out.append(m.requires_grad_() if t.requires_grad else m)
    return out


class _OnMeta:
    """An autograd function per call: the public function on meta twins; zeros back on the CPU.

    A call whose signature (tensors' shapes, strides, storage offsets, dtypes, storage sharing,
    grad flags; the other arguments) was traced before launches what it launched then (the premise
    of the warm path): its entries are taken from the memo and nothing runs (the suite repeats
    calls: test_flash_attn_race_condition 250 times)."""

    memo: dict = {}
    tracer = None

    @staticmethod
    def make(fn):
        import torch

        def note(keys):
            t = _OnMeta.tracer
            if t is not None and t.case is not None:
                t.per_case[t.case] |= keys

        def launched(run):
            t = _OnMeta.tracer
            before = set(t.per_case.get(t.case, ())) if t is not None else set()
            t.per_case[t.case] = set()
            try:
                res = run()
            finally:
                got = t.per_case[t.case]
                t.per_case[t.case] = before | got
            return res, got

        class F(torch.autograd.Function):
            @staticmethod
            def forward(ctx, spec, sig, *tensors):
                ctx.sig, ctx.shapes = sig, [(m.shape, m.dtype, m.requires_grad) for m in tensors]
                hit = _OnMeta.memo.get(sig)
                if hit is not None and hit["fwd"] is not None:
                    note(hit["fwd"])
                    ctx.metas = ctx.outs = None
                    outs = hit["outs"]
                else:
                    metas = _metas(tensors)
                    it = iter(metas)
                    args, kwargs = spec(lambda: next(it))
                    with torch.enable_grad():
                        res, keys = launched(lambda: fn(*args, **kwargs))
                    res_t = res if isinstance(res, tuple) else (res,)
                    outs = [(o.shape, o.dtype, o.requires_grad) if isinstance(o, torch.Tensor) else o
                            for o in res_t]
                    _OnMeta.memo[sig] = {"fwd": keys, "bwd": None, "outs": outs}
                    ctx.metas, ctx.outs = metas, res_t
                zeros = tuple(torch.zeros(o[0], dtype=o[1]) if isinstance(o, tuple) and len(o) == 3
                              and isinstance(o[1], torch.dtype) else o for o in outs)
                for z, o in zip(zeros, outs):
                    if isinstance(o, tuple) and len(o) == 3 and isinstance(o[1], torch.dtype) and not o[2]:
                        ctx.mark_non_differentiable(z)
                return zeros

            @staticmethod
            def backward(ctx, *grads):
                memo = _OnMeta.memo[ctx.sig]
                if ctx.metas is None or memo["bwd"] is not None:
                    note(memo["bwd"] or set())
                else:
                    outs = [(o, g) for o, g in zip(ctx.outs, grads)
                            if isinstance(o, torch.Tensor) and o.requires_grad and g is not None]
                    wants = [m for m in ctx.metas if m.requires_grad]
                    keys = set()
                    if outs and wants:
                        _, keys = launched(lambda: torch.autograd.grad(
                            [o for o, _ in outs], wants,
                            [torch.empty(g.shape, dtype=g.dtype, device="meta") for _, g in outs],
                            allow_unused=True, retain_graph=True))
                    memo["bwd"] = keys
                return (None, None) + tuple(torch.zeros(sh, dtype=dt) if rg else None for sh, dt, rg in ctx.shapes)

        def wrapped(*args, **kwargs):
            flat = []

            def mark(x):
                if isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.dim() > 0 and not (
                        x.numel() == 2 and not x.is_floating_point() and x.dim() == 1 and x.dtype == torch.int64):
                    flat.append(x)
                    return _SLOT
                return x

            a2 = [mark(x) for x in args]
            k2 = {k: mark(v) for k, v in kwargs.items()}

            def spec(nxt):
                return ([nxt() if x is _SLOT else x for x in a2], {k: nxt() if v is _SLOT else v for k, v in k2.items()})

            stores = {}
            sig = (fn.__name__, torch.is_grad_enabled(),
                   tuple((tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.requires_grad,
                          stores.setdefault(t.untyped_storage().data_ptr(), len(stores))) for t in flat),
                   repr([x.tolist() if isinstance(x, torch.Tensor) else x for x in a2]),
                   repr(sorted((k, v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in k2.items())))
            res = F.apply(spec, sig, *flat)
            return res[0] if len(res) == 1 and not _returns_tuple(args, kwargs) else res

        return wrapped


_SLOT = object()


def _returns_tuple(args, kwargs) -> bool:
    return bool(kwargs.get("return_attn_probs") or kwargs.get("return_softmax_lse"))


def _wrap_public(shim_names) -> None:
    """The shim's public functions (and flash_attn_interface's) on meta twins."""
    import flash_attn
    import flash_attn.flash_attn_interface as iface

    for n in shim_names:
        w = _OnMeta.make(getattr(flash_attn, n))
        setattr(flash_attn, n, w)
        setattr(iface, n, w)


def digest_of(material) -> str:
    from ck_core.cache import digest

    return digest(material)


def _compile_slice(pending, worker, workers, root, target, deadline):
    from ck_core.backends import triton_artifacts as ta

    done = failed = 0
    for i, (name, src, options, material) in enumerate(pending):
        if i % workers != worker:
            continue
        if time.time() > deadline:
            break
        try:
            ta._get_or_build(name, src, options, material, target, root)
            done += 1
        except Exception as exc:  # noqa: BLE001
            failed += 1
            print(f"build failed: {name}: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr, flush=True)
    return done, failed


def build(pending, root, workers, target, budget_s=1e9) -> dict:
    """Compile ``pending`` (in first-use order: the front of the suite first) into the kernel-cache
    root ``root`` with ``workers`` forked processes; no compile starts after ``budget_s``."""
    os.makedirs(root, exist_ok=True)
    t0 = time.time()
    pids = []
    for w in range(workers):
        pid = os.fork()
        if pid == 0:   # pragma: no cover - the child
            code = 0
            try:
                _, failed = _compile_slice(pending, w, workers, root, target, t0 + budget_s)
                code = 1 if failed else 0
            finally:
                os._exit(code)
        pids.append(pid)
    codes = [os.waitpid(p, 0)[1] for p in pids]
    from ck_core.cache import KernelCache

    stats = KernelCache(root, extra_roots=[]).stats()
    return {"entries_wanted": len(pending), "entries_built": stats.get("entries"), "bytes": stats.get("bytes"),
            "seconds": round(time.time() - t0, 1), "workers": workers, "workers_failed": sum(c != 0 for c in codes)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fa", required=True, help="a Dao-AILab/flash-attention snapshot (as flash_attn_suite.py)")
    ap.add_argument("--fraction", type=float, default=0.0025)
    ap.add_argument("--min-per-test", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-cases", type=int, default=1000, help="trace the first N cases of the run order")
    ap.add_argument("-k", default=None)
    ap.add_argument("--build", default=None, help="compile the distinct entries into this kernel-cache root")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--build-cases", type=int, default=None,
                    help="--build: only the entries the first N cases need (the front of the suite)")
    ap.add_argument("--build-budget-s", type=float, default=1e9, help="--build: start no compile after this")
    ap.add_argument("--wheel", default=None, help="--build: also write the set as a ck-kernels-sm90 wheel here")
    ap.add_argument("--check-set", default=None,
                    help="a built set (folder or wheel): every launch also loads its entry from it, with "
                         "triton.compile raising (nothing may compile); the report counts loaded / compiled")
    ap.add_argument("--out", required=True)
    ap.add_argument("--debug", action="store_true", help="show the tests' output and tracebacks")
    a = ap.parse_args(argv)
    _env()
    import pytest

    sys.path.insert(0, HERE)
    import flash_attn_suite as fas

    snapshot = os.path.abspath(a.fa)
    work = tempfile.mkdtemp(prefix="ck-fa-trace-")
    try:
        tests_dir = _copy_tests(snapshot, work)
        shim = fas.write_shim(os.path.join(work, "shim"), snapshot)
        sys.path.insert(0, shim)
        for p in (os.path.join(ROOT, "plugins", "fmha"), ROOT):
            if p not in sys.path:
                sys.path.append(p)
        _fake_cuda()
        _stub_references(tests_dir)
        _wrap_public(fas.PUBLIC)
        from ck_core.backends import triton_artifacts as ta

        tracer = Tracer()
        if a.check_set:
            import triton

            sys.path.insert(0, HERE)
            from compile_count import _prebuilt_root

            os.environ["CK_KERNEL_SETS"] = _prebuilt_root(a.check_set, work)
            tracer.check = True

            def no_compiler(*args, **kwargs):
                raise AssertionError("triton.compile called although the prebuilt set should hold the kernel")

            triton.compile = no_compiler
        _OnMeta.tracer = tracer
        ta.launch = tracer.launch
        import torch

        torch.equal = lambda *a, **k: True          # the tests' comparisons of zeros (outcomes mean nothing)
        torch.allclose = lambda *a, **k: True
        ta.current_target = lambda: tracer.target
        from ck_core import device as ck_device
        from ck_core.backends import triton_backend

        triton_backend._device_target = lambda: ("cuda", 90)   # the GPU the Dispatcher would see
        real_target = ck_device.device_target
        ck_device.device_target = lambda d: ("cuda", 90) if getattr(d, "type", str(d)) == "meta" else real_target(d)

        sampler = fas.Sampler(a.fraction, a.min_per_test, a.seed, budget_s=1e9)
        order = []

        class Cut:
            @pytest.hookimpl(hookwrapper=True)
            def pytest_collection_modifyitems(self, session, config, items):
                yield     # after the sampler's ordering
                config.hook.pytest_deselected(items=items[a.max_cases:])
                items[:] = items[: a.max_cases]

            def pytest_runtest_setup(self, item):
                tracer.case = len(order)
                order.append(item.nodeid.split("::")[-1])

        ini = os.path.join(shim, "pytest.ini")
        with open(ini, "w") as f:
            f.write("[pytest]\n")
        args = [os.path.join(tests_dir, "test_flash_attn_ck.py"), "-q", "-c", ini, "--rootdir", tests_dir,
                "--confcutdir", tests_dir, "--import-mode=prepend", "-p", "no:cacheprovider",
                "--tb=short" if a.debug else "--tb=no", "-W", "ignore::DeprecationWarning", "-s"]
        if a.k:
            args += ["-k", a.k]
        t0 = time.time()
        devnull = open(os.devnull, "w")
        real_stdout = sys.stdout
        if not a.debug:
            sys.stdout = devnull      # the tests print their diffs
        try:
            rc = int(pytest.main(args, plugins=[sampler, Cut()]))
        finally:
            sys.stdout = real_stdout
            devnull.close()
        trace_s = time.time() - t0
        first_index = Counter(tracer.first.values())
        cum, running = [], 0
        for i in range(len(order)):
            running += first_index.get(i, 0)
            cum.append(running)
        by_kernel = Counter(n.split("/")[-1] for n, _ in tracer.first)
        by_key = Counter(n.rsplit("/", 1)[0] for n, _ in tracer.first)
        res = {
            "what": "distinct sm90 kernel-cache entries (= compiles of a fresh cache) the first cases of "
                    "FlashAttention's CK suite launch, traced on the CPU (benchmarks/fa_trace.py)",
            "fraction": a.fraction, "min_per_test": a.min_per_test, "seed": a.seed, "max_cases": a.max_cases,
            "cases": len(order), "launches": tracer.launches, "distinct_entries": len(tracer.first),
            "distinct_kernels": len(by_kernel), "distinct_keys": len(by_key), "pytest_exit_code": rc,
            "trace_seconds": round(trace_s, 1),
            "entries_after_cases": {str(n): cum[n - 1] for n in (10, 25, 50, 100, 200, 400, 600, 800, 1000, 1200,
                                                                 1500, 2000) if n <= len(cum)},
            "by_kernel": dict(by_kernel.most_common()),
            "per_test_function": dict(Counter(fas.function_of(c) for c in order)),
            "trace_errors": dict(tracer.errors.most_common(20)),
            "cases_in_order": [{"case": c, "entries": len(tracer.per_case.get(i, ())),
                                "new": first_index.get(i, 0)} for i, c in enumerate(order)],
            "entries": sorted([n, d, tracer.first[(n, d)]] for n, d in tracer.first),
            # what each entry specialises on (the constexprs, the integers' and pointers' attributes)
            "entry_details": [{"name": n, "first_case": tracer.first[(n, digest_of(m))],
                               "constexprs": m["constexprs"], "attrs": m["attrs"],
                               "options": {k: m["options"].get(k) for k in ("num_warps", "num_stages")}}
                              for n, _, _, m in tracer.pending],
        }
        # Triton's C launcher stub is one per distinct argument-type list (compiled with the host's C
        # compiler on first use on each machine, cached in TRITON_CACHE_DIR; not part of a kernel set)
        res["launcher_stub_signatures"] = len({tuple(m["signature"].values()) for _, _, _, m in tracer.pending})
        if a.check_set:
            res["check_set"] = {"set": a.check_set, "stats": dict(ta.STATS),
                                "errors": dict(tracer.check_errors.most_common(20))}
        if a.build:
            want = [p for p, k in zip(tracer.pending, [tracer.first[(n, digest_of(m))] for n, _, _, m in tracer.pending])
                    if a.build_cases is None or k < a.build_cases]
            res["build"] = build(want, os.path.abspath(a.build), a.workers, tracer.target, a.build_budget_s)
            res["build"]["cases_covered"] = a.build_cases or len(order)
            if a.wheel:
                from pathlib import Path

                from ck_core.kernel_wheel import write_wheel

                whl = write_wheel(Path(a.build), "sm90", Path(a.wheel), preset="fa-suite")
                res["build"]["wheel"] = str(whl)
                res["build"]["wheel_bytes"] = os.path.getsize(whl)
        from ck_core.bench import with_header

        os.makedirs(os.path.dirname(os.path.abspath(a.out)) or ".", exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(with_header(res, device="CPU (launches specialised for sm90, not run)"), f, indent=1)
        long = ("cases_in_order", "entries", "entry_details")
        print(json.dumps({k: v for k, v in res.items() if k not in long}, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
