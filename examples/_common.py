"""Plumbing shared by the examples: the command line, validation, the verdict line.

Every example takes ``--backend numpy|triton`` (default: triton when a GPU that
triton can drive is visible, numpy otherwise), ``--arch`` (default: that GPU's
arch, or gfx942 on the CPU) and ``--seed``; it ends by printing ``PASS`` or
``FAIL`` and exits 0 only on PASS.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
import time
from typing import Callable, Optional

import numpy as np

from ck_core import Dispatcher, Registry, get_manager
from ck_core.errors import MissingKernel, UnsupportedProblem
from ck_core.validate import compare_all

CPU_ARCH = "gfx942"


def _gpu_arch() -> Optional[str]:
    """The arch of a GPU the triton backend can run here, or None (cheap on a CPU-only box)."""
    import os

    mgr = get_manager()
    if os.environ.get("TRITON_INTERPRET") == "1":   # Triton's CPU interpreter is no GPU: the CPU's arch
        return None
    if "triton" not in mgr.backends() or not mgr.backend("triton").available()[0]:
        return None
    for arch in mgr.archs().values():
        if mgr.backend("triton").can_execute(arch)[0]:
            return arch.name
    return None


def parse_args(description: str, add: Optional[Callable] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--backend", choices=("numpy", "triton"), default=None,
                   help="default: triton on a GPU, numpy otherwise")
    p.add_argument("--arch", default=None, help=f"default: the GPU's arch, or {CPU_ARCH} on the CPU")
    p.add_argument("--seed", type=int, default=None, help="input seed (default: fresh each run)")
    if add:
        add(p)
    args = p.parse_args()
    gpu = _gpu_arch() if args.backend in (None, "triton") else None
    if args.backend is None:
        args.backend = "triton" if gpu else "numpy"
    args.arch = args.arch or gpu or CPU_ARCH
    if args.backend == "triton":
        mgr = get_manager()
        ready, why = mgr.backend("triton").can_execute(mgr.arch(args.arch))
        if not ready:
            # a clear word and exit 0: "needs a GPU" is not a failure of the example; the command
            # it suggests is this one on the numpy backend (tests/test_examples.py runs it)
            print(f"SKIP: --backend triton needs a GPU the triton backend can drive ({why.split(';')[0]})")
            print(f"HINT: on the CPU run: {cpu_command()}")
            sys.exit(0)
    global _DEFAULT_ARCH
    _DEFAULT_ARCH = gpu or CPU_ARCH
    args.rng = np.random.default_rng(args.seed)
    args.gpu = args.backend == "triton"
    print(f"backend={args.backend} arch={args.arch}")
    return args


#: the arch an example runs on when --arch is not given (set by parse_args)
_DEFAULT_ARCH = CPU_ARCH


def cpu_command(flag: str = "--backend", value: str = "numpy") -> str:
    """This example's command line with ``flag value`` (``--backend numpy`` unless told otherwise),
    its other arguments kept."""
    import shlex

    argv, out, skip = sys.argv[1:], [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a == flag:
            skip = True
            continue
        if not a.startswith(flag + "="):
            out.append(a)
    script = Path(sys.argv[0])
    try:
        script = script.resolve().relative_to(Path.cwd())
    except ValueError:
        pass
    return " ".join(shlex.quote(x) for x in ["python", str(script), *out, flag, value])


def dispatcher(op: str, args, filter: Optional[str] = None, **options) -> Dispatcher:
    """A dispatcher over the op's legal kernels for ``args.arch``/``args.backend``."""
    reg = Registry.from_enumeration(op, args.arch, args.backend, **options)
    if filter:
        reg = reg.filter(filter)
    return Dispatcher(reg, backend=args.backend)


def output_dtypes(problem, names) -> dict:
    dt = getattr(problem, "dtype_c", None) or getattr(problem, "dtype", "fp32")
    return {n: dt for n in names}


def check(disp: Dispatcher, problem, rng, label: str = "", inputs: Optional[dict] = None,
          show_plan: bool = True) -> bool:
    """Run ``problem`` through ``disp`` on fresh inputs and compare with the float64 reference."""
    op = disp.mgr.op(problem.op)
    inputs = inputs if inputs is not None else op.make_inputs(problem, rng)
    bk = disp.backend_spec
    t0 = time.perf_counter()
    try:
        outs = disp.run_dict(problem, {k: bk.to_backend(v) for k, v in inputs.items()})
    except (MissingKernel, UnsupportedProblem) as exc:
        if disp.registry.arch == _DEFAULT_ARCH:
            raise   # the arch the example is written for must run it: a real failure
        # an arch whose kernel space lacks this feature (e.g. CK has no fp8 FMHA for gfx1100)
        print(f"SKIP: {disp.registry.arch} has no {disp.backend} kernel for this example's "
              f"{label or problem.op} ({str(exc)[:160]}...)")
        print(f"HINT: run it for {_DEFAULT_ARCH}: {cpu_command('--arch', _DEFAULT_ARCH)}")
        sys.exit(0)
    secs = time.perf_counter() - t0
    ref = op.reference(problem, inputs)
    tol = op.tolerance(problem) if op.tolerance else {}
    # the reference may return extras (e.g. lse) the kernel was not asked to store
    ref = {k: v for k, v in ref.items() if k in outs}
    report = compare_all({k: bk.to_numpy(outs[k]) for k in ref}, ref, output_dtypes(problem, ref), tol)
    print(f"[{label or problem.op}] {secs * 1e3:8.2f} ms")
    if show_plan:
        for st in disp.plan(problem).stages:
            print(f"    stage {st.name:<16} {st.key.name}")
    for v in report.verdicts:
        print(f"    {v}")
    return report.passed


def finish(ok: bool) -> None:
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


def table(rows: list, cols: list) -> None:
    """A plain text table (the seeds' ``print_kernel_config_table``)."""
    w = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    line = "+" + "+".join("-" * (w[c] + 2) for c in cols) + "+"
    print(line)
    print("| " + " | ".join(c.ljust(w[c]) for c in cols) + " |")
    print(line)
    for r in rows:
        print("| " + " | ".join(str(r[c]).ljust(w[c]) for c in cols) + " |")
    print(line)


def gemm_config_rows(keys) -> list:
    rows = []
    for i, k in enumerate(keys, 1):
        a = k.algorithm
        rows.append({"#": i, "tile": f"{a.tile_m}x{a.tile_n}x{a.tile_k}",
                     "wave": f"{a.warp_m}x{a.warp_n}x{a.warp_k}",
                     "warp": f"{a.warp_tile_m}x{a.warp_tile_n}x{a.warp_tile_k}",
                     "pipeline": a.pipeline, "scheduler": a.scheduler, "pad": a.pad_m or a.pad_n or a.pad_k})
    return rows
