"""One benchmark worker: runs (kernel, shape) tasks through the Dispatcher's launchers.

A worker owns one device (a process per GPU locally, an actor per GPU on Ray).
Per shape it keeps the inputs, the reference and the peer's time, so each of
them is made once however many kernels run the shape.  A task's kernel runs
the plan's stages it supports; the other stages run the kernels the engine
chose for them.  The result is the measurement part of a row; errors become a
status, never an exception.
"""
from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from typing import Optional

import numpy as np

from ..errors import CompileError, InvalidProblem, MissingKernel, UnsupportedProblem

log = logging.getLogger(__name__)

#: inputs kept per worker (host + device copies) before the least recently used shape is dropped
CACHE_BYTES = 4 << 30


def apply_env(env: Optional[dict]) -> None:
    if env:
        os.environ.update(env)


def _nbytes(d: dict) -> int:
    return sum(int(getattr(v, "nbytes", 0)) for v in d.values())


class _ShapeState:
    __slots__ = ("problem", "host", "dev", "nbytes", "reference", "peer")

    def __init__(self, problem, host, dev):
        self.problem, self.host, self.dev = problem, host, dev
        self.nbytes = 2 * _nbytes(host)
        self.reference = None      # (kind, outputs) once computed
        self.peer = None           # (name, seconds) once timed


class BenchWorker:
    """Times and checks tasks for one op, arch and backend on the device it was given."""

    def __init__(self, op: str, arch: str, backend: str, verify: bool = False, repeat: int = 10,
                 seed: int = 0, f64_flops: float = 4e9, env: Optional[dict] = None):
        apply_env(env)
        from ..dispatcher import Dispatcher
        from ..plugins import get_manager
        from ..registry import Registry
        from .spec import get_spec

        self.mgr = get_manager()
        self.op = self.mgr.op(op)
        self.spec = get_spec(self.mgr, op)
        self.bk = self.mgr.backend(backend)
        self.backend = backend
        self.verify, self.repeat, self.seed, self.f64_flops = verify, repeat, seed, f64_flops
        self.registry = Registry(arch, manager=self.mgr)
        self.disp = Dispatcher(self.registry, backend=backend)
        self.shapes: "OrderedDict[str, _ShapeState]" = OrderedDict()
        self.references: dict = {}

    # -- per shape -------------------------------------------------------------
    def _problem(self, fields: dict):
        make = self.spec.make_problem or self.op.problem_type.from_dict
        return make(dict(fields))

    def _state(self, name: str, fields: dict) -> _ShapeState:
        st = self.shapes.get(name)
        if st is not None:
            self.shapes.move_to_end(name)
            return st
        problem = self._problem(fields)
        host = self.op.make_inputs(problem, np.random.default_rng(self.seed))
        dev = {k: self.bk.to_backend(v) for k, v in host.items()}
        if self.spec.device_inputs is not None:
            dev = self.spec.device_inputs(problem, dev)
        st = _ShapeState(problem, host, dev)
        st.reference = self.references.get(name)
        self.shapes[name] = st
        while len(self.shapes) > 1 and sum(s.nbytes for s in self.shapes.values()) > CACHE_BYTES:
            self.shapes.popitem(last=False)
        return st

    def _reference(self, name: str, st: _ShapeState):
        if st.reference is None:
            flops = self.op.flops(st.problem) if self.op.flops else 0.0
            if flops <= self.f64_flops:
                st.reference = ("f64", self.op.reference(st.problem, st.host))
            elif self.spec.device_reference is not None and self.backend != "numpy":
                out = self.spec.device_reference(st.problem, st.dev) or {}
                st.reference = ("fp32" if out else "skipped", out)   # stays on the device
            else:
                st.reference = ("skipped", {})
            self.references[name] = st.reference
        return st.reference

    def _time(self, fn) -> float:
        if self.bk.timer is not None:
            return float(self.bk.timer(fn, self.repeat))
        fn()
        times = []
        for _ in range(max(1, self.repeat)):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    def _peer(self, st: _ShapeState):
        if st.peer is None:
            st.peer = ("", None)
            made = self.spec.peer(st.problem, st.dev) if self.spec.peer is not None else None
            if made:
                name, fn = made
                try:
                    st.peer = (name, self._time(fn))
                except Exception as exc:  # a peer that cannot run the shape leaves the column empty
                    log.warning("peer %s failed on %s: %s", name, st.problem, exc)
                    st.peer = (name, None)
        return st.peer

    # -- per task ------------------------------------------------------------------
    def run(self, task: dict) -> dict:
        try:
            return self._run(task)
        except (UnsupportedProblem, InvalidProblem, MissingKernel) as exc:
            return {"status": "unsupported", "error": f"{type(exc).__name__}: {exc}"[:500]}
        except CompileError as exc:
            return {"status": "compile_failed", "error": f"{type(exc).__name__}: {exc}"[:500]}
        except Exception as exc:  # one kernel's crash is its row, never the sweep's end
            return {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:500]}

    def _run(self, task: dict) -> dict:
        from ..key import KernelKey
        from ..validate import compare_all

        st = self._state(task["problem_name"], task["fields"])
        keys = [KernelKey.from_dict(d, manager=self.mgr) for d in task["stages"]]
        for k in keys:
            if k not in self.registry:
                self.registry.add(k)
        steps = self.op.plan(st.problem) if self.op.plan else [(self.op.name, st.problem)]
        runners = [(self.disp.impl(k), sub) for (_, sub), k in zip(steps, keys)]

        def launch():
            tensors = dict(st.dev)
            for fn, sub in runners:
                tensors.update(fn(sub, tensors))
            return tensors

        t0 = time.perf_counter()
        outs = launch()
        if self.bk.synchronize is not None:
            self.bk.synchronize()
        # the first call of a kernel in a process: JIT specialisation and loading included
        row = {"status": "ok", "verified": "", "first_call_ms": (time.perf_counter() - t0) * 1e3}
        if self.verify:
            kind, ref = self._reference(task["problem_name"], st)
            row["verified"] = kind
            if ref:
                tol = self.op.tolerance(st.problem) if self.op.tolerance else {}
                dt = getattr(st.problem, "dtype_c", getattr(st.problem, "dtype", "fp32"))
                if kind == "fp32":
                    passed, rel, text = device_check(outs, ref, dt, tol)
                else:
                    report = compare_all({k: self.bk.to_numpy(outs[k]) for k in ref}, ref,
                                         {k: dt for k in ref}, tol)
                    passed, rel = report.passed, max(v.rel_l2 for v in report.verdicts)
                    text = str(report).replace("\n", "; ")
                row["rel_err"] = rel
                if not passed:
                    row.update(status="wrong", error=text[:500])
                    return row
        del outs
        secs = self._time(launch)
        row["latency_ms"] = secs * 1e3
        flops = self.op.flops(st.problem) if self.op.flops else None
        moved = (self.spec.bytes_moved or self.op.bytes_moved)
        if flops:
            row["tflops"] = flops / secs / 1e12
        if moved is not None:
            row["bandwidth_gb_s"] = moved(st.problem) / secs / 1e9
        peer, psecs = self._peer(st)
        if peer:
            row["peer"] = peer
        if psecs:
            row["peer_latency_ms"] = psecs * 1e3
            row["speedup_vs_peer"] = psecs / secs
            if flops:
                row["peer_tflops"] = flops / psecs / 1e12
        return row


def device_check(outs: dict, ref: dict, dtype: str, tolerances: dict):
    """The element-wise check of :func:`ck_core.validate.compare` done where the tensors are
    (large outputs would cost more to copy to the host and compare there than to compute).
    Returns (passed, worst relative L2 error, a description)."""
    from ..dtypes import ATOL, RTOL

    passed, worst, notes = True, 0.0, []
    for name, r in ref.items():
        if name not in outs:
            return False, float("inf"), f"the kernel produced no output {name!r}"
        o = outs[name].float()
        r = r.float()
        if tuple(o.shape) != tuple(r.shape):
            return False, float("inf"), f"{name}: shape {tuple(o.shape)} != reference {tuple(r.shape)}"
        rtol, atol = tolerances.get(name, (None, None))
        rtol = RTOL.get(dtype, 1e-2) if rtol is None else rtol
        atol = ATOL.get(dtype, 1e-2) if atol is None else atol
        diff = (o - r).abs()
        bad = int(((diff > atol + rtol * r.abs()) | ~o.isfinite()).sum())
        rel = float(diff.norm() / r.norm().clamp_min(1e-30))
        worst = max(worst, rel)
        if bad:
            passed = False
            notes.append(f"{name}: {bad}/{o.numel()} elements off (rel_l2={rel:.2e}, rtol={rtol:g}, atol={atol:g})")
    return passed, worst, "; ".join(notes) or "PASS"
