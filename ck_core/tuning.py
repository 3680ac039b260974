"""The timing loop of ``ck tune``: time every ranked candidate, record the winner.

Measured winners live in the tuned-data store (:class:`ck_core.winners.Winners`,
table ``kernels`` of the per (op, arch) data files read through
:mod:`ck_core.tuned_data`, re-exported here).  The older single-file tuning
table (``tuning.json``) is retired: it is not read (docs/tuned-data.md).
"""
from __future__ import annotations

import logging
import math
from typing import Callable, Optional, Sequence

from .tuned_data import FORMAT as DATA_FORMAT, Table, clear_cache, table, tables, user_dir, write  # noqa: F401

log = logging.getLogger(__name__)


def tune(dispatcher, problem, inputs: dict, timer: Callable[[Callable], float],
         table=None, top: Optional[int] = None) -> list[tuple[str, float]]:
    """Time every candidate for ``problem``; failures time as infinity with a warning.

    Returns ``[(kernel name, seconds)]`` best first and records the winner in ``table`` (a
    :class:`ck_core.winners.Winners`; its ``save()`` writes the store).
    """
    cands: Sequence = dispatcher.rank(problem)
    if top:
        cands = cands[:top]
    results = []
    for key in cands:
        try:
            fn = dispatcher.impl(key)
            secs = timer(lambda: fn(problem, dict(inputs)))
        except Exception as exc:  # one failing kernel never sinks the sweep
            log.warning("tuning: %s failed (%s); timed as infinity", key.name, exc)
            secs = math.inf
        results.append((key.name, secs))
    results.sort(key=lambda r: r[1])
    if table is not None and results and math.isfinite(results[0][1]):
        table.record(dispatcher.arch.name, dispatcher.backend, problem, results[0][0], results[0][1],
                     [{"kernel": n, "seconds": s if math.isfinite(s) else None} for n, s in results])
    return results
