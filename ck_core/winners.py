"""Measured kernel winners (``ck tune``'s) in the tuned-data store.

The Dispatcher's tuning source (``lookup`` / ``record`` / ``save``).  Winners
live in the ``kernels`` table of the (op, arch) data files, keyed by (backend,
problem bucket): an op plugin may ship some (its ``tuning_data`` folder),
``ck tune`` writes the user's store (``CK_TUNED_DIR``), which overrides them.
The older single-file tuning table (``<cache dir>/tuning.json``) is retired: it
is not read, and one found there is named once in a warning.
"""
from __future__ import annotations

import json
import logging
import math
import os
import platform
from collections import defaultdict
from pathlib import Path
from typing import Optional

from . import knobs, tuned_data

log = logging.getLogger(__name__)

TABLE = "kernels"
FIELDS = ("backend", "bucket")


def bucket_key(problem) -> str:
    """A problem's bucket as one JSON string (buckets are tuples, possibly nested)."""
    return json.dumps(problem.bucket(), default=str, separators=(",", ":"))


def check_record(key, value) -> None:
    """One ``kernels`` record: key (backend, bucket), value {"kernel": a name, "seconds": s, ...}."""
    if len(key) != 2 or not all(isinstance(k, str) for k in key):
        raise ValueError("the key is [backend, bucket] (two strings)")
    if not isinstance(value, dict) or not isinstance(value.get("kernel"), str) or not value["kernel"] \
            or len(value["kernel"]) > 1024:
        raise ValueError("the value is {\"kernel\": a kernel name, ...}")
    secs = value.get("seconds")
    if secs is not None and (isinstance(secs, bool) or not isinstance(secs, (int, float))
                             or not math.isfinite(secs) or secs < 0):
        raise ValueError(f"seconds {secs!r:.40} is not a finite number >= 0")


_WARNED: set = set()


def warn_retired_table() -> None:
    """Say once per process, per file, that a retired ``tuning.json`` is ignored."""
    for p in knobs.retired_tuning_files():
        if p in _WARNED or not os.path.lexists(p) or os.path.isdir(p):
            continue
        _WARNED.add(p)
        log.warning("ignoring %s: the single-file tuning table is retired and not read; measured "
                    "winners live in the tuned-data store %s now. Run `ck tune` again for the problems "
                    "it held, then delete the file", p, tuned_data.user_dir())


class Winners:
    def __init__(self, *, command: str = "ck tune", device: Optional[str] = None):
        warn_retired_table()
        self.command = command
        self.device = device
        self.path: Path = tuned_data.user_dir()
        self._pending: dict = defaultdict(dict)

    def lookup(self, arch: str, backend: str, problem) -> Optional[str]:
        t = tuned_data.table(problem.op, arch, TABLE, check=check_record)
        hit = t.get((backend, bucket_key(problem))) if len(t) else None   # no table: no bucket to compute
        if isinstance(hit, dict) and isinstance(hit.get("kernel"), str):
            return hit["kernel"]
        return None

    def record(self, arch: str, backend: str, problem, kernel: str, seconds: float,
               results: Optional[list] = None) -> None:
        self._pending[(problem.op, arch)][(backend, bucket_key(problem))] = {
            "kernel": kernel, "seconds": seconds, "problem": problem.to_dict(), "results": results or []}

    def save(self) -> Path:
        """Write the recorded winners into the user's store; returns the last file written."""
        for (op, arch), entries in self._pending.items():
            backends = sorted({b for b, _ in entries})
            device = self.device or f"{platform.machine() or 'this host'}, {'/'.join(backends)} backend on {arch}"
            self.path = tuned_data.write(op, arch, TABLE, entries.items(), command=self.command, device=device,
                                         source="measured winners, best of the ranked candidates",
                                         fields=FIELDS)
        self._pending.clear()
        return self.path
