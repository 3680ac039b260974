"""The tuning table: measured winners per (arch, backend, op, shape bucket).

Stored as JSON (``CK_TUNING_DB`` or ``<cache dir>/tuning.json``), written
atomically.  ``Dispatcher`` consults it before any heuristic.  The op plugins'
tuned tables (per (op, arch) data files with provenance, overlaid by the user's
store) are read through :mod:`ck_core.tuned_data`, re-exported here; the measured winners in that store are
:class:`ck_core.winners.Winners` (which builds on this module).
"""
from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Callable, Optional, Sequence

from . import fileio, knobs
from .errors import ConfigError
from .tuned_data import FORMAT as DATA_FORMAT, Table, clear_cache, table, tables, user_dir, write  # noqa: F401

log = logging.getLogger(__name__)


def default_path() -> Path:
    return knobs.tuning_db()


FORMAT = "ck-dispatcher.tuning/1"
_TMP = ".ck-tuning-tmp-"
#: a tuning table larger than this is not one this code wrote
MAX_FILE_BYTES = fileio.LIMITS["tuning"]


def _entries_of(data, path) -> dict:
    """The ``entries`` of a parsed tuning file, every field type-checked."""
    def bad(why):
        return ConfigError(f"tuning table {path} is malformed ({why}); delete it or point "
                           f"CK_TUNING_DB at a tuning table written by `ck tune`")

    if not isinstance(data, dict):
        raise bad(f"the top level is a {type(data).__name__}, not an object")
    if data.get("format", FORMAT) != FORMAT:
        raise bad(f"format {str(data.get('format'))[:40]!r}, expected {FORMAT!r}")
    unknown = sorted(str(k)[:40] for k in data if k not in ("format", "entries"))
    if unknown:
        raise bad(f"unknown field(s) {unknown}")
    entries = data.get("entries", {})
    if not isinstance(entries, dict):
        raise bad("'entries' is not an object")
    for k, e in entries.items():
        if not isinstance(e, dict) or not isinstance(e.get("kernel"), str):
            raise bad(f"entry {k[:60]!r} is not an object with a 'kernel' name")
        secs = e.get("seconds")
        if secs is not None and (isinstance(secs, bool) or not isinstance(secs, (int, float))
                                 or not math.isfinite(secs) or secs < 0):
            raise bad(f"entry {k[:60]!r}: 'seconds' is not a finite number >= 0")
        if not isinstance(e.get("results", []), list) or not isinstance(e.get("problem", {}), dict):
            raise bad(f"entry {k[:60]!r}: 'results' must be a list and 'problem' an object")
    return entries


class TuningTable:
    def __init__(self, path=None):
        self.path = Path(path) if path else default_path()
        self.entries: dict[str, dict] = {}
        if os.path.lexists(self.path):
            data = fileio.read_json(self.path, "tuning table", MAX_FILE_BYTES,
                                    hint="delete it or point CK_TUNING_DB at a tuning table written by `ck tune`")
            self.entries = _entries_of(data, self.path)

    @staticmethod
    def _key(arch: str, backend: str, problem) -> str:
        return f"{arch}|{backend}|{problem.op}|{problem.bucket()}"

    def lookup(self, arch: str, backend: str, problem) -> Optional[str]:
        if not self.entries:   # no table: no bucket to compute (a new problem's selection asks)
            return None
        e = self.entries.get(self._key(arch, backend, problem))
        return e["kernel"] if e else None

    def record(self, arch: str, backend: str, problem, kernel: str, seconds: float,
               results: Optional[list] = None) -> None:
        self.entries[self._key(arch, backend, problem)] = {
            "kernel": kernel, "seconds": seconds, "problem": problem.to_dict(),
            "results": results or [],
        }

    def save(self) -> Path:
        from .cache import atomic_write, ensure_folder, sweep_orphans

        if not ensure_folder(self.path.parent, "tuning table folder"):
            raise ConfigError(f"cannot write the tuning table {self.path}: its folder is not writable; "
                              f"point CK_TUNING_DB at a writable path")
        sweep_orphans(self.path.parent, prefix=_TMP)   # a killed `ck tune`'s leftovers
        atomic_write(self.path, json.dumps({"format": FORMAT, "entries": self.entries}, indent=1).encode(),
                     prefix=_TMP)
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

