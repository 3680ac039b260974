"""`ck demo`: the main job -- dispatched, validated cases of every installed op plugin.

Each plugin contributes its cases through the ``ck_demo_cases`` hook.  Uses
the triton backend on a GPU it can run, else the numpy backend on the CPU.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

from .device import cpu_arch
from .dispatcher import Dispatcher
from .errors import CkError, ToolchainMissing
from .plugins import get_manager
from .registry import Registry
from .validate import compare_all


def _no_gpu_here() -> bool:
    """True where no GPU device node exists (Linux): then asking torch (a second to import)
    whether a GPU is visible is skipped."""
    if not sys.platform.startswith("linux"):
        return False
    return not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg"))


def _pick_backend(mgr, requested):
    """(backend, the arch it runs here or None for the CPU's stand-in arch).  A backend asked
    for that cannot run here is refused once, with the reason (not once per case)."""
    if requested:
        spec = mgr.backend(requested)
        cpu = cpu_arch(mgr)
        ok, why = spec.can_execute(cpu)
        if ok:
            return requested, None
        for arch in mgr.archs().values():
            if arch is not cpu and spec.can_execute(arch)[0]:
                return requested, arch.name
        raise ToolchainMissing(f"ck demo --backend {requested}: {why} (or run `ck demo` without "
                               f"--backend: it takes the numpy backend where no GPU is)")
    if _no_gpu_here() or os.environ.get("TRITON_INTERPRET") == "1":   # the interpreter is no GPU
        return "numpy", None
    for arch in mgr.archs().values():
        if "triton" in mgr.backends():
            ok, _ = mgr.backend("triton").can_execute(arch)
            if ok:
                return "triton", arch.name
    return "numpy", None


def _validated(disp, op, problem, rng):
    inputs = op.make_inputs(problem, rng)
    bk = disp.backend_spec
    t0 = time.perf_counter()
    outs = disp.run_dict(problem, {k: bk.to_backend(v) for k, v in inputs.items()})
    secs = time.perf_counter() - t0
    ref = op.reference(problem, inputs)
    tol = op.tolerance(problem) if op.tolerance else {}
    dtypes = {k: getattr(problem, "dtype_c", getattr(problem, "dtype", "fp32")) for k in ref}
    return compare_all({k: bk.to_numpy(outs[k]) for k in ref}, ref, dtypes, tol), secs


def _brief(problem) -> str:
    """The problem's fields that differ from their defaults."""
    import attrs

    parts = []
    for f in attrs.fields(type(problem)):
        v = getattr(problem, f.name)
        d = f.default
        if isinstance(d, attrs.Factory) or d is attrs.NOTHING or v != d:
            parts.append(f"{f.name}={v}")
    return f"{type(problem).__name__}({', '.join(parts)})"


def run_demo(args) -> int:
    mgr = get_manager()
    backend, gpu_arch = _pick_backend(mgr, args.backend)
    arch = gpu_arch or cpu_arch(mgr).name
    rng = np.random.default_rng()
    ok = True
    print(f"ck-dispatcher demo: backend={backend} arch={arch}")
    cases = [c for found in mgr.hook.ck_demo_cases() for c in found or ()]
    cases.sort(key=lambda c: c.order)
    if not cases:
        print("no op plugin with demo cases is installed: pip install -e plugins/gemm plugins/fmha")
        return 1
    for case in cases:
        op_name, problem, opts = case.op, case.problem, dict(case.options)
        op = mgr.op(op_name)
        try:
            if op.problem_options:   # only the part of the space that can run the case
                opts = {**op.problem_options(problem), **opts}
            reg = Registry.from_enumeration(op_name, arch, backend, **opts)
            disp = Dispatcher(reg, backend=backend)
            plan = disp.plan(problem)
            report, secs = _validated(disp, op, problem, rng)
        except CkError as exc:
            print(f"[{op_name}] error: {exc}")
            ok = False
            continue
        print(f"\n[{op_name}] {_brief(problem)}")
        print(f"  registry: {len(reg)} kernels for {arch}/{backend}")
        for st in plan.stages:
            print(f"  stage {st.name:>16}: {st.key.name}")
        for v in report.verdicts:
            print(f"  {v}")
        print(f"  host time {secs * 1e3:.2f} ms")
        ok &= report.passed
    print("\nall validated: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1
