"""Sweep rows on disk: CSV streamed row by row, JSON with a metadata block.

Rows are appended and flushed as they arrive, so a killed sweep leaves every
finished row behind; ``--resume`` reads them back and skips their
(kernel, problem_name) pairs.  With ``--json`` and no ``--csv`` the rows stream
to ``<json>.partial.jsonl`` until the JSON is written.
"""
from __future__ import annotations

import csv
import datetime as _dt
import json
import math
import os
import platform
import sys
from pathlib import Path
from typing import Iterable, Optional

from ..errors import ConfigError
from ..fileio import _kind

STATUSES = ("ok", "wrong", "compile_failed", "unsupported", "timeout", "error")
TAIL = ("arch", "backend", "status", "verified", "rel_err", "latency_ms", "tflops", "bandwidth_gb_s",
        "peer", "peer_latency_ms", "peer_tflops", "speedup_vs_peer", "first_call_ms", "compile_s", "error")


def columns(spec) -> list:
    """The CSV header of an op's sweep: the seed's order, problem then kernel then results."""
    cols = ["problem_name", *spec.problem_fields, "kernel", *spec.kernel_fields, *TAIL]
    return list(dict.fromkeys(cols))


def row_id(row: dict) -> tuple:
    return (row.get("kernel", ""), row.get("problem_name", ""))


_IDS = ("kernel", "problem_name", "error")
#: result columns that hold a measurement: absent, empty, or a finite number >= 0
NUMBERS = ("rel_err", "latency_ms", "tflops", "bandwidth_gb_s", "peer_latency_ms", "peer_tflops",
           "speedup_vs_peer", "first_call_ms", "compile_s")
#: most rows a resumed file may hold, and most bytes of one text field
MAX_ROWS = 1 << 21
MAX_FIELD = 1 << 16
_RESUME_HINT = "remove it, or drop --resume to measure every row again"


def _parse(text: str):
    if text == "":
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def check_row(row, cols) -> Optional[str]:
    """Why a resumed row cannot stand as a measurement (None: it can).  A resume file is
    untrusted input: its rows are taken only if they have the shape this sweep writes."""
    if not isinstance(row, dict):
        return f"a {type(row).__name__}, not a row object"
    for k, v in row.items():
        if not isinstance(k, str):
            return f"column name {k!r:.40} is not a string (a line with more fields than the header?)"
        if v is not None and not isinstance(v, (str, int, float, bool)):
            return f"column {k[:40]!r} holds a {type(v).__name__}"
        if isinstance(v, str) and len(v) > MAX_FIELD:
            return f"column {k[:40]!r} is longer than {MAX_FIELD} characters"
    for k in ("kernel", "problem_name"):
        if not isinstance(row.get(k, ""), str):
            return f"{k!r} is not a string"
    status = row.get("status")
    if status not in STATUSES:
        return f"status {status!r:.40} is not one of {', '.join(STATUSES)}"
    for k in NUMBERS:
        v = row.get(k)
        if v is None or v == "":
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            return f"{k} {v!r:.40} is not a finite number >= 0"
    if status == "ok" and row.get("problem_name"):
        lat = row.get("latency_ms")
        if isinstance(lat, bool) or not isinstance(lat, (int, float)) or not lat > 0:
            return "an 'ok' row without a positive latency_ms"
    return None


def _csv_rows(p: Path, text: str, bad: list) -> list:
    lines = text.splitlines(keepends=True)
    reader = csv.DictReader(lines)
    out = []
    while True:
        try:
            r = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            n = reader.line_num + 1   # the line being read when the reader gave up
            if n >= len(lines):   # the line a kill cut short
                break
            raise ConfigError(f"sweep CSV {p} line {n}: {exc}; {_RESUME_HINT}") from None
        if not r.get("status"):
            if reader.line_num < len(lines):   # only the last line may be one a kill cut short
                bad.append(f"{p} line {reader.line_num}: a row without a status")
            continue
        # the identity columns stay text (a shape named "12" is not the number 12; no kernel is "")
        out.append({k: (v if k in _IDS else _parse(v)) if isinstance(v, str) else v for k, v in r.items()})
    return out


def read_rows(path, bad: Optional[list] = None) -> list:
    """Rows already written to a CSV, JSON or partial JSONL file (missing file: none).

    The file must be a regular file of bounded size and UTF-8 text (else a ConfigError naming
    it); entries that are not rows at all (not objects, a broken JSONL line) are left out and
    described in ``bad``.  The rows are not validated here: :class:`RowSink` does that."""
    from ..fileio import loads_json, read_text

    bad = [] if bad is None else bad
    p = Path(path)
    if not os.path.lexists(p):
        return []
    text = read_text(p, "sweep file to resume", "resume", hint=_RESUME_HINT)
    if p.suffix == ".csv":
        rows = _csv_rows(p, text, bad)
    elif p.suffix == ".jsonl":
        rows = []
        lines = text.splitlines()
        for n, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except (ValueError, RecursionError):
                if n != len(lines) - 1:   # the last line may be one a kill cut short
                    bad.append(f"{p} line {n + 1}: not JSON")
    else:
        doc = loads_json(text, p, "sweep JSON file", hint=_RESUME_HINT, max_depth=16)
        if not isinstance(doc, dict) or not isinstance(doc.get("results", []), list):
            raise ConfigError(f"{p} is not a sweep JSON file (no 'results' list); {_RESUME_HINT}")
        rows = list(doc.get("results", []))
    if len(rows) > MAX_ROWS:
        raise ConfigError(f"{p} holds {len(rows)} rows, more than a sweep writes ({MAX_ROWS}); {_RESUME_HINT}")
    return rows


class RowSink:
    """Appends rows to the CSV (and the partial JSONL when only JSON is asked for).

    With ``resume``, the rows of the earlier run's files are read and checked
    (:func:`check_row`); the engine then confirms each against the row it would write
    (:meth:`resumed`) and :meth:`start` drops every row it did not confirm: a bad or foreign
    row is reported (:attr:`rejected`) and measured again, never taken as measured."""

    def __init__(self, cols: list, csv_path=None, json_path=None, resume: bool = False):
        self.cols = cols
        self.rows: list = []
        self.rejected: list = []   # (file, row id or None, why)
        self.csv_path = Path(csv_path) if csv_path else None
        self.json_path = Path(json_path) if json_path and json_path != "-" else None
        self.partial = (Path(str(self.json_path) + ".partial.jsonl")
                        if self.json_path and not self.csv_path else None)
        for out in (self.csv_path, self.partial, self.json_path):
            if out is not None and os.path.lexists(out) and not out.is_file():
                try:
                    kind = _kind(os.stat(out).st_mode)
                except OSError:
                    kind = "a dangling link"
                raise ConfigError(f"sweep output {out} is {kind}, not a regular file; pass another path")
        self._kept: set = set()
        self._resuming = resume
        if resume:
            seen = set()
            for src in (self.csv_path, self.partial, self.json_path):
                if not src:
                    continue
                bad: list = []
                for r in read_rows(src, bad):
                    why = check_row(r, cols)
                    if why is not None:
                        self.rejected.append((str(src), None, why))
                    elif row_id(r) not in seen:
                        seen.add(row_id(r))
                        self.rows.append(r)
                self.rejected.extend((str(src), None, why) for why in bad)
        self._by_id = {row_id(r): r for r in self.rows}
        self.done = set(self._by_id)
        self._csv = self._jsonl = None

    def resumed(self, rid: tuple, base: dict) -> bool:
        """Whether the earlier run measured ``rid`` (kernel, problem name) with these problem and
        kernel columns (``base``, the row this sweep would write); a resumed row that disagrees
        is rejected, to be measured again."""
        row = self._by_id.get(rid)
        if row is None:
            return False
        known = set(self.cols) | set(base)
        why = next((f"unknown column {k[:40]!r}" for k in row if k not in known), None)
        if why is None:
            why = next((f"{k} is {row.get(k)!r:.40}, this sweep's is {v!r:.40}" for k, v in base.items()
                        if _norm(row.get(k)) != _norm(v)), None)
        if why is not None:
            self._reject(rid, why)
            return False
        self._kept.add(rid)
        return True

    @property
    def kept(self) -> int:
        """How many rows of the earlier run stand (confirmed by :meth:`resumed`)."""
        return len(self._kept)

    def _reject(self, rid, why) -> None:
        row = self._by_id.pop(rid, None)
        if row is not None:
            self.rows = [r for r in self.rows if r is not row]
            self.done.discard(rid)
        self.rejected.append(("", rid, why))

    def start(self) -> None:
        """Drop the resumed rows the engine did not confirm, then open the outputs and write the
        rows kept (rewriting the CSV drops a torn last line of a killed run)."""
        if self._resuming:
            for rid in [rid for rid in self._by_id if rid not in self._kept]:
                self._reject(rid, "not a (kernel, shape) pair of this sweep's kernel set and matrix")
            self._resuming = False
        if self.csv_path:
            self.csv_path.parent.mkdir(parents=True, exist_ok=True)
            self._rewrite_csv()
        if self.partial:
            self.partial.parent.mkdir(parents=True, exist_ok=True)
            self._jsonl = open(self.partial, "w")
            for r in self.rows:
                self._jsonl.write(json.dumps(r, default=str) + "\n")
            self._jsonl.flush()

    def _rewrite_csv(self) -> None:
        # rewritten once at the start (drops a torn last line of a killed run), then appended
        self._csv = open(self.csv_path, "w", newline="")
        self._writer = csv.DictWriter(self._csv, fieldnames=self.cols, extrasaction="ignore")
        self._writer.writeheader()
        for r in self.rows:
            self._writer.writerow(r)
        self._csv.flush()

    def add(self, row: dict) -> None:
        if row_id(row) in self.done:
            return
        self.done.add(row_id(row))
        self.rows.append(row)
        if self._csv:
            self._writer.writerow(row)
            self._csv.flush()
        if self._jsonl:
            self._jsonl.write(json.dumps(row, default=str) + "\n")
            self._jsonl.flush()

    def close(self) -> None:
        for f in (self._csv, self._jsonl):
            if f:
                f.close()
        self._csv = self._jsonl = None


def _norm(v) -> str:
    """A column value as the CSV round trip leaves it (None and "" alike)."""
    if v is None or v == "":
        return ""
    if isinstance(v, str):
        v = _parse(v)
    return str(v)


def versions(extra: Iterable[str] = ()) -> dict:
    from .. import __version__

    out = {"ck_core": __version__, "python": platform.python_version()}
    for name in ("numpy", "triton", "torch", *extra):
        mod = sys.modules.get(name)
        if mod is not None:
            out[name] = getattr(mod, "__version__", "?")
    return out


def write_json(path, metadata: dict, rows: list) -> None:
    doc = {"metadata": metadata, "results": rows}
    text = json.dumps(doc, indent=1, default=str)
    if path == "-":
        sys.stdout.write(text + "\n")
        return
    from ..cache import atomic_write

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(p, text.encode(), prefix=".sweep-")


def today() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
