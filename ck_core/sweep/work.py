"""What an executor runs and the rows it reports: the vocabulary the engine and its executors
(:mod:`.local`, :mod:`.ray_executor`) share, below all three so that none imports another's caller."""
from __future__ import annotations

from typing import Optional

import attrs


@attrs.define
class Work:
    """What the executor runs: keys to compile, and per key its benchmark tasks."""

    keys: list                 # key dicts, in order
    tasks: dict                # key name -> [task dict]
    compiles: set              # names of keys whose backend compiles
    worker: dict               # BenchWorker keyword arguments
    compile_only: bool
    workers: int
    timeout: float


def rates(compiled: int, hits: int, c0: Optional[float], c1: Optional[float], b0: Optional[float],
          b1: Optional[float], rows: int) -> dict:
    """Throughput figures an executor reports (None where a stage did not run)."""
    cs = (c1 - c0) if c0 is not None and c1 is not None else None
    bs = (b1 - b0) if b0 is not None and b1 is not None else None
    return {"compiled": compiled, "cache_hits": hits, "compile_s": round(cs, 3) if cs is not None else None,
            "kernels_per_s": round(compiled / cs, 3) if cs and compiled else None,
            "bench_s": round(bs, 3) if bs is not None else None,
            "measurements_per_s": round(rows / bs, 3) if bs and rows else None}


def compile_row(task: dict, meta: Optional[dict], err: Optional[str]) -> dict:
    secs = (meta or {}).get("compile_seconds")
    return dict(task["base"], status="compile_failed" if err else "ok", error=(err or "")[:500],
                compile_s=secs if secs is not None else "")


def release(work: Work, name: str, meta: Optional[dict], err: Optional[str], emit, enqueue) -> int:
    """The tasks waiting on kernel ``name``'s compile (``err``: its failure, None when it built): in a
    compile-only run their compile rows, else compile_failed rows or each task to ``enqueue`` for
    its benchmark.  Returns how many were queued."""
    queued = 0
    for task in work.tasks.get(name, ()):
        if work.compile_only:
            emit(compile_row(task, meta, err))
        elif err:
            emit(dict(task["base"], status="compile_failed", error=err[:500]))
        else:
            queued += 1
            enqueue(task)
    return queued


def timeout_row(task: dict, seconds: float) -> dict:
    return dict(task["base"], status="timeout", error=f"no result within {seconds:g} s (--timeout)")
