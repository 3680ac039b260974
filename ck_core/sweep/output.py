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
import platform
import sys
from pathlib import Path
from typing import Iterable

from ..errors import ConfigError

STATUSES = ("ok", "wrong", "compile_failed", "unsupported", "timeout", "error")
TAIL = ("arch", "backend", "status", "verified", "rel_err", "latency_ms", "tflops", "bandwidth_gb_s",
        "peer", "peer_latency_ms", "peer_tflops", "speedup_vs_peer", "first_call_ms", "compile_s", "error")


def columns(spec) -> list:
    """The CSV header of an op's sweep: the seed's order, problem then kernel then results."""
    cols = ["problem_name", *spec.problem_fields, "kernel", *spec.kernel_fields, *TAIL]
    return list(dict.fromkeys(cols))


def row_id(row: dict) -> tuple:
    return (row.get("kernel", ""), row.get("problem_name", ""))


def _parse(text: str):
    if text == "":
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def read_rows(path) -> list:
    """Rows already written to a CSV, JSON or partial JSONL file (missing file: none)."""
    p = Path(path)
    if not p.exists():
        return []
    if p.suffix == ".csv":
        with open(p, newline="") as f:
            return [{k: _parse(v) for k, v in r.items()} for r in csv.DictReader(f)
                    if r.get("status")]  # a half-written last line has no status
    if p.suffix == ".jsonl":
        out = []
        for line in p.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # the line a kill cut short
                pass
        return out
    try:
        return list(json.loads(p.read_text()).get("results", []))
    except (json.JSONDecodeError, AttributeError) as exc:
        raise ConfigError(f"{p} is not a sweep JSON file ({exc}); remove it or drop --resume") from None


class RowSink:
    """Appends rows to the CSV (and the partial JSONL when only JSON is asked for)."""

    def __init__(self, cols: list, csv_path=None, json_path=None, resume: bool = False):
        self.cols = cols
        self.rows: list = []
        self.csv_path = Path(csv_path) if csv_path else None
        self.json_path = Path(json_path) if json_path and json_path != "-" else None
        self.partial = (Path(str(self.json_path) + ".partial.jsonl")
                        if self.json_path and not self.csv_path else None)
        if resume:
            seen = set()
            for src in (self.csv_path, self.partial, self.json_path):
                for r in (read_rows(src) if src else ()):
                    if row_id(r) not in seen:
                        seen.add(row_id(r))
                        self.rows.append(r)
        self.done = {row_id(r) for r in self.rows}
        self._csv = self._jsonl = None
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
