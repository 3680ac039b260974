"""The tuning table: measured winners per (arch, backend, op, shape bucket).

Stored as JSON (``CK_TUNING_DB`` or ``<cache dir>/tuning.json``), written
atomically.  ``Dispatcher`` consults it before any heuristic.  The op plugins'
tuned tables (per (op, arch) data files with provenance, overlaid by the user's
store) are read through :mod:`ck_core.tuned_data`, re-exported here.
"""
from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Callable, Optional, Sequence

from . import knobs
from .errors import ConfigError

log = logging.getLogger(__name__)


def default_path() -> Path:
    return Path(knobs.get("CK_TUNING_DB") or knobs.cache_dir() / "tuning.json")


class TuningTable:
    def __init__(self, path=None):
        self.path = Path(path) if path else default_path()
        self.entries: dict[str, dict] = {}
        if self.path.exists():
            try:
                self.entries = json.loads(self.path.read_text()).get("entries", {})
            except (OSError, json.JSONDecodeError) as exc:
                raise ConfigError(f"tuning table {self.path} is unreadable ({exc}); delete it "
                                  f"or point CK_TUNING_DB elsewhere") from None

    @staticmethod
    def _key(arch: str, backend: str, problem) -> str:
        return f"{arch}|{backend}|{problem.op}|{problem.bucket()}"

    def lookup(self, arch: str, backend: str, problem) -> Optional[str]:
        e = self.entries.get(self._key(arch, backend, problem))
        return e["kernel"] if e else None

    def record(self, arch: str, backend: str, problem, kernel: str, seconds: float,
               results: Optional[list] = None) -> None:
        self.entries[self._key(arch, backend, problem)] = {
            "kernel": kernel, "seconds": seconds, "problem": problem.to_dict(),
            "results": results or [],
        }

    def save(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tuning-")
        with os.fdopen(fd, "w") as f:
            json.dump({"format": "ck-dispatcher.tuning/1", "entries": self.entries}, f, indent=1)
        os.replace(tmp, self.path)
        return self.path


def tune(dispatcher, problem, inputs: dict, timer: Callable[[Callable], float],
         table: Optional[TuningTable] = None, top: Optional[int] = None) -> list[tuple[str, float]]:
    """Time every candidate for ``problem``; failures time as infinity with a warning.

    Returns ``[(kernel name, seconds)]`` best first and records the winner in ``table``.
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


from .tuned_data import FORMAT as DATA_FORMAT, Table, clear_cache, table, tables, user_dir, write  # noqa: E402,F401
from .winners import Winners  # noqa: E402,F401
