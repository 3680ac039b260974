"""Measured kernel winners (``ck tune``'s) in the tuned-data store.

Same public API as :class:`ck_core.tuning.TuningTable` (``lookup`` / ``record``
/ ``save``), so the Dispatcher takes either.  Winners live in the ``kernels``
table of the (op, arch) data files, keyed by (backend, problem bucket): an op
plugin may ship some (its ``tuning_data`` folder), ``ck tune`` writes the
user's store, which overrides them.  A winner recorded in the older single-file
tuning table (``CK_TUNING_DB``) is still found after the store's.
"""
from __future__ import annotations

import json
import math
import platform
from collections import defaultdict
from pathlib import Path
from typing import Optional

from . import tuned_data
from .tuning import TuningTable

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


class Winners:
    def __init__(self, path=None, *, command: str = "ck tune", device: Optional[str] = None):
        self.legacy = TuningTable(path)
        self.command = command
        self.device = device
        self.path: Path = tuned_data.user_dir()
        self._pending: dict = defaultdict(dict)

    def lookup(self, arch: str, backend: str, problem) -> Optional[str]:
        t = tuned_data.table(problem.op, arch, TABLE, check=check_record)
        hit = t.get((backend, bucket_key(problem))) if len(t) else None   # no table: no bucket to compute
        if isinstance(hit, dict) and isinstance(hit.get("kernel"), str):
            return hit["kernel"]
        return self.legacy.lookup(arch, backend, problem)

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
