"""First-call autotuning (``CK_AUTOTUNE=1``): time the ranker's top candidates once per bucket.

On the first selection of a problem whose bucket has no measured winner, the
Dispatcher times its top ``CK_AUTOTUNE_TOP`` candidates on fresh random inputs
(never the caller's tensors, which a kernel could be writing) and records the
winner in the user's tuned-data store (:class:`ck_core.winners.Winners`), so
later problems of the bucket -- in this process and the next -- find it there.
A kernel that raises counts as infinitely slow; when every one fails, nothing
is recorded and the ranked order stands.  Package data is never written.
"""
from __future__ import annotations

import logging
import math
import time

import numpy as np

from . import knobs

log = logging.getLogger(__name__)


def _seconds(disp, fn) -> float:
    bk = disp.backend_spec
    if bk.timer is not None:
        return bk.timer(fn, 5)
    fn()
    times = []
    for _ in range(3):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def _time(disp, key, problem, inputs) -> float:
    fn = disp.impl(key)
    return _seconds(disp, lambda: fn(problem, dict(inputs)))


def first_call(disp, problem, ranked: list) -> list:
    """``ranked`` with the measured winner of its top candidates first (recorded in the store)."""
    top = ranked[:max(1, knobs.get("CK_AUTOTUNE_TOP"))]
    if len(top) < 2:
        return ranked
    op = disp.mgr.op(problem.op)
    try:
        host = op.make_inputs(problem, np.random.default_rng(0))
        inputs = {k: disp.backend_spec.to_backend(v) for k, v in host.items()}
    except Exception as exc:  # no inputs, no tuning: the ranked order stands
        log.warning("autotune: no inputs for %s (%s); keeping the ranked order", problem, exc)
        return ranked
    results = []
    for key in top:
        try:
            secs = _time(disp, key, problem, inputs)
        except Exception as exc:  # one failing kernel never sinks the tuning
            log.warning("autotune: %s failed (%s); timed as infinity", key.name, exc)
            secs = math.inf
        results.append((secs, key))
    secs, best = min(results, key=lambda r: r[0])
    if not math.isfinite(secs):
        return ranked
    store = disp.tuning if disp.tuning is not None and hasattr(disp.tuning, "save") else _store()
    store.record(disp.arch.name, disp.backend, problem, best.name, secs,
                 [{"kernel": k.name, "seconds": s if math.isfinite(s) else None} for s, k in results])
    try:
        store.save()
    except Exception as exc:  # a read-only store still tunes this process
        log.warning("autotune: could not record the winner (%s)", exc)
    log.info("autotune: %s wins %s over %d candidates (%.3g ms)", best.name, problem, len(top), secs * 1e3)
    return [best] + [k for k in ranked if k is not best]


def _store():
    from .winners import Winners

    return Winners(command="CK_AUTOTUNE=1 (first call of a new problem bucket)")
