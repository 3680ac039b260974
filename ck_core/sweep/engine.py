"""The tile engine: kernel set x testing matrix -> compile -> benchmark/verify -> rows.

The engine decides *what* runs (which kernel on which shape, with which
kernels for the plan's other stages) and writes the rows; an executor
(:mod:`.local` or :mod:`.ray_executor`) decides *where*: it compiles keys in
parallel and hands each compiled key's tasks to the benchmark workers, so
compilation and benchmarking overlap.
"""
from __future__ import annotations

import logging
import sys
import time
from typing import Optional

import attrs

from .. import knobs
from ..errors import CkError, ConfigError, MissingKernel, UnsupportedProblem
from .matrix import Shape, load_matrix
from .output import RowSink, columns, today, versions, write_json
from .spec import SweepSpec, get_spec
from .work import Work, compile_row, rates, timeout_row  # noqa: F401  (the executors' vocabulary)

log = logging.getLogger(__name__)


@attrs.define
class Options:
    """Everything ``ck sweep`` was asked to do (the CLI fills it; tests build it directly)."""

    op: str
    arch: Optional[str] = None
    backend: str = "numpy"
    config: Optional[str] = None
    variant: Optional[str] = None
    filter: Optional[str] = None
    filter_file: Optional[str] = None
    max_kernels: int = 0
    enum_options: dict = attrs.field(factory=dict)
    category: str = "smoke"
    shapes: Optional[str] = None
    compile_only: bool = False
    verify: bool = False
    workers: Optional[int] = None
    resume: bool = False
    csv: Optional[str] = None
    json: Optional[str] = None
    plot: Optional[str] = None
    count: bool = False
    executor: str = "local"
    address: Optional[str] = None
    ray_init: dict = attrs.field(factory=dict)
    timeout: float = 120.0
    repeat: int = 10
    seed: int = 0
    f64_flops: float = 4e9
    progress: Optional[bool] = None
    command: str = ""


def _base_row(spec: SweepSpec, shape: Optional[Shape], problem, key, arch: str, backend: str) -> dict:
    row = {"problem_name": shape.name if shape else "", "kernel": key.name if key else "",
           "arch": arch, "backend": backend}
    if problem is not None and spec.problem_columns is not None:
        row.update(spec.problem_columns(problem))
    elif problem is not None:
        row.update({k: v for k, v in problem.to_dict().items() if k in spec.problem_fields})
    if key is not None and spec.kernel_columns is not None:
        row.update(spec.kernel_columns(key))
    elif key is not None:
        row.update({k: v for k, v in key.fields.items() if k in spec.kernel_fields})
    return {k: (("x".join(map(str, v))) if isinstance(v, (list, tuple)) else v) for k, v in row.items()}


def _problems(spec: SweepSpec, op, shapes: list) -> list:
    make = spec.make_problem or op.problem_type.from_dict
    out = []
    for s in shapes:
        try:
            out.append((s, make(dict(s.fields))))
        except (CkError, TypeError, ValueError) as exc:
            raise ConfigError(f"testing-matrix shape {s.name!r}: {exc}") from None
    return out


def plan_work(mgr, spec: SweepSpec, registry, shapes: list, opts: Options, sink: RowSink, emit) -> Work:
    """Pair every kernel with the shapes it supports; rows for shapes no kernel runs."""
    from ..dispatcher import Dispatcher

    op = mgr.op(spec.op)
    backend = opts.backend
    compiles = set()
    if mgr.backend(backend).compile is not None:
        compiles = {k.name for k in registry}
    tasks: dict = {k.name: [] for k in registry}
    worker = {"op": spec.op, "arch": registry.arch, "backend": backend, "verify": opts.verify,
              "repeat": opts.repeat, "seed": opts.seed, "f64_flops": opts.f64_flops}
    work = Work([k.to_dict() for k in registry], tasks, compiles, worker, opts.compile_only,
                opts.workers or knobs.build_workers(), opts.timeout)
    if opts.compile_only:
        for k in registry:
            base = _base_row(spec, None, None, k, registry.arch, backend)
            if not sink.resumed((k.name, ""), base):
                tasks[k.name].append({"base": base})
        return work
    chooser = Dispatcher(registry, backend=backend, check_backend=False)
    # a backend without a device timer runs host reference code: a shape it would spend minutes on
    # (an LLM layer in float64 NumPy) is a row that says so, not minutes of timing noise
    host = mgr.backend(backend).timer is None and op.flops is not None
    for shape, problem in _problems(spec, op, shapes):
        if host and op.flops(problem) > opts.f64_flops:
            base = _base_row(spec, shape, problem, None, registry.arch, backend)
            if not sink.resumed(("", shape.name), base):
                emit(dict(base, status="unsupported",
                          error=f"{op.flops(problem) / 1e9:.3g} GFLOP is too large for the {backend} backend's "
                                f"host code (--f64-flops {opts.f64_flops:g}); sweep it on a GPU (--backend "
                                f"triton) or raise --f64-flops"))
            continue
        steps = op.plan(problem) if op.plan else [(op.name, problem)]
        used = False
        for key in registry:
            fit = [op.supports(key, sub) is None for _, sub in steps]
            if not any(fit):
                continue
            used = True
            base = _base_row(spec, shape, problem, key, registry.arch, backend)
            if sink.resumed((key.name, shape.name), base):
                continue
            try:
                stages = [key if ok else chooser.select(sub) for ok, (_, sub) in zip(fit, steps)]
            except (MissingKernel, UnsupportedProblem) as exc:
                emit(dict(base, status="unsupported", error=f"another stage has no kernel: {exc}"[:500]))
                continue
            tasks[key.name].append({"base": base, "problem_name": shape.name, "fields": dict(shape.fields),
                                    "stages": [k.to_dict() for k in stages]})
        if not used:
            base = _base_row(spec, shape, problem, None, registry.arch, backend)
            if not sink.resumed(("", shape.name), base):
                emit(dict(base, status="unsupported", error="no kernel of the set supports this shape"))
    return work


def _bars(work: Work, enabled: bool):
    """Compile and bench counters (:class:`ck_core.progress.Progress`): bars on a terminal, a line
    every 30 s elsewhere, nothing when disabled."""
    from ..progress import Progress

    cbar = Progress(len(work.compiles), "ck sweep: compile", unit="kernel",
                    quiet=not enabled or not work.compiles, position=0)   # nothing to compile: no counter
    n = sum(len(t) for t in work.tasks.values())
    bbar = None if work.compile_only else Progress(n, "ck sweep: bench", unit="row", quiet=not enabled,
                                                   position=1)
    return cbar, bbar


def get_executor(opts: Options):
    if opts.executor == "local":
        from .local import LocalExecutor

        if opts.address:
            raise ConfigError("--address names a Ray cluster; pass --executor ray with it (or drop it)")

        return LocalExecutor()
    if opts.executor == "ray":
        from .ray_executor import RayExecutor

        return RayExecutor(address=opts.address, init=opts.ray_init)
    raise ConfigError(f"unknown executor {opts.executor!r}; use local or ray")


def run_sweep(opts: Options, out=None) -> dict:
    """Run a sweep; returns the JSON document's metadata (``count`` only with ``opts.count``)."""
    from ..plugins import get_manager
    from .kernels import select_kernels

    out = out or sys.stdout
    executor = get_executor(opts) if not opts.count else None  # a missing extra fails first, fast
    mgr = get_manager()
    spec = get_spec(mgr, opts.op)
    sel = select_kernels(mgr, spec, arch=opts.arch, backend=opts.backend, config=opts.config,
                         variant=opts.variant, filter_expr=opts.filter, filter_file=opts.filter_file,
                         max_kernels=opts.max_kernels, options=opts.enum_options)
    if opts.count:
        out.write(f"{len(sel.registry)}\n")
        return {"count": len(sel.registry), "arch": sel.arch}
    reg, arch = sel.registry, sel.arch
    if not opts.compile_only:
        ok, why = mgr.backend(opts.backend).can_execute(mgr.arch(arch))
        if not ok:
            raise UnsupportedProblem(f"backend {opts.backend} cannot run {arch} kernels here ({why}); "
                                     f"sweep with --compile-only, or on a machine with that GPU")
    shapes_path = opts.shapes or spec.shapes
    if not shapes_path and not opts.compile_only:
        raise ConfigError(f"op {opts.op} ships no testing matrix; pass --shapes FILE")
    shapes = load_matrix(shapes_path, opts.category) if not opts.compile_only else []
    sink = RowSink(columns(spec), opts.csv, opts.json, resume=opts.resume)
    t0 = time.perf_counter()
    work = plan_work(mgr, spec, reg, shapes, opts, sink, sink.add)
    sink.start()
    resumed = sink.kept
    _report_rejected(sink)
    cbar, bbar = _bars(work, opts.progress is not False)

    def emit(row):
        sink.add(row)
        bar = cbar if work.compile_only else bbar
        if bar is not None:
            bar.update(1)

    def compiled(name, ok):
        if cbar is not None and not work.compile_only:
            cbar.update(1)

    interrupted = False
    try:
        stats = executor.run(work, emit, compiled)
    except KeyboardInterrupt:  # Ctrl-C or `timeout -s INT`: keep what was measured, resumable
        interrupted, stats = True, dict(getattr(executor, "stats", {}))
        log.warning("sweep interrupted; the rows so far are written (rerun with --resume)")
    finally:
        sink.close()
        for b in (cbar, bbar):
            if b is not None:
                b.close()
    wall = time.perf_counter() - t0
    rows = sink.rows
    counts: dict = {}
    for r in rows:
        counts[r.get("status")] = counts.get(r.get("status"), 0) + 1
    ok_rows = [r for r in rows if r.get("status") == "ok" and r.get("problem_name")]
    meta = {
        "op": opts.op, "arch": arch, "backend": opts.backend, "device": _device(opts.backend),
        "category": None if opts.compile_only else opts.category,
        "shapes_file": None if opts.compile_only else str(shapes_path),
        "total_kernels": len(reg), "enumerated_kernels": sel.enumerated,
        "shapes_benchmarked": len({r["problem_name"] for r in ok_rows}),
        "total_measurements": len(ok_rows), "status_counts": counts, "resumed_rows": resumed,
        "rejected_resume_rows": len(sink.rejected),
        "executor": opts.executor, "workers": work.workers, "verify": opts.verify,
        "compile_only": opts.compile_only, "wall_s": round(wall, 3),
        "versions": versions(("ray",) if opts.executor == "ray" else ()),
        "command": opts.command, "date": today(), "interrupted": interrupted,
    }
    meta.update(stats)
    if opts.json:
        write_json(opts.json, meta, rows)
        if sink.partial is not None and sink.partial.exists():
            sink.partial.unlink()
    if opts.plot is not None:
        from .plot import plot

        meta["plots"] = plot(rows, opts.plot or _plot_prefix(opts), opts.op)
    if opts.json != "-":
        _summary(meta, out)
    return meta


def _report_rejected(sink) -> None:
    if not sink.rejected:
        return
    for src, rid, why in sink.rejected[:5]:
        what = f"row {rid!r:.120}" if rid is not None else "a row"
        log.warning("--resume: %s%s not taken as measured (%s); it is measured again",
                    what, f" of {src}" if src else "", why)
    log.warning("--resume: %d row(s) of the earlier run rejected in all; they are measured again",
                len(sink.rejected))


def _plot_prefix(opts: Options) -> str:
    base = opts.csv or (opts.json if opts.json and opts.json != "-" else None) or f"sweep_{opts.op}"
    return str(base).rsplit(".", 1)[0] if "." in str(base).rsplit("/", 1)[-1] else str(base)


def _device(backend: str) -> str:
    if backend == "numpy":
        import platform
        return f"CPU ({platform.machine()})"
    from ..bench import device_name

    return device_name()


def _summary(meta: dict, out) -> None:
    rate = meta.get("kernels_per_s")
    mps = meta.get("measurements_per_s")
    out.write(f"sweep {meta['op']} on {meta['arch']} ({meta['backend']}, {meta['executor']}): "
              f"{meta['total_kernels']} kernels, {meta['shapes_benchmarked']} shapes, "
              f"{meta['total_measurements']} measurements in {meta['wall_s']:.1f} s\n")
    out.write("  status: " + ", ".join(f"{k}={v}" for k, v in sorted(meta["status_counts"].items())) + "\n")
    if rate is not None:
        out.write(f"  compile: {meta['compiled']} kernels ({meta['cache_hits']} cached) in "
                  f"{meta['compile_s']:.1f} s = {rate:.2f} kernels/s\n")
    if mps:
        out.write(f"  bench: {mps:.2f} measurements/s\n")
