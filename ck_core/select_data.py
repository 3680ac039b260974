"""Recorded selection oracles and how a selector scores against them (numpy only).

An oracle file (``benchmarks/selection_collect.py`` writes them; ``.jsonl`` or
``.jsonl.gz``) holds a header line (op, arch, backend, device, date, command),
``{"kernel": i, "name": ...}`` lines naming kernel indices, and one line per
measured shape: ``family``, ``split`` (train / heldout), ``problem`` (its
``to_dict``), ``times`` (``[[kernel index, ms or null], ...]``, null = failed)
and the kernel the old heuristic picked over the shape's full candidate set.

A selector is ``(problem, keys) -> key``; its score on a shape is the oracle's
best time over the chosen kernel's time (1.0 = the best measured kernel; a
failed or unmeasured pick scores 0), summarised as geomean, P10 and worst.
"""
from __future__ import annotations

import gzip
import io
import json
import math
import zlib
from pathlib import Path
from typing import Callable, Iterable, Optional

import attrs
import numpy as np

from . import fileio
from .errors import CkError, ConfigError

#: most bytes an oracle file may hold once decompressed
MAX_BYTES = fileio.LIMITS["oracle"]


@attrs.frozen(eq=False)
class Shape:
    family: str
    split: str
    problem: object
    keys: tuple          # the measured kernels (KernelKeys)
    ms: np.ndarray       # their times, inf where the kernel failed
    heuristic: Optional[str]  # the old heuristic's pick over the full candidate set

    @property
    def best(self) -> float:
        return float(self.ms.min())


@attrs.frozen(eq=False)
class Oracle:
    header: dict
    shapes: tuple

    def split(self, which: str) -> list:
        return [s for s in self.shapes if s.split == which]


_HINT = "pass an oracle file benchmarks/selection_collect.py wrote"


def _lines(path: Path) -> Iterable[str]:
    raw = fileio.read_bytes(path, "oracle file", MAX_BYTES, hint=_HINT)
    if path.suffix == ".gz":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as f:
                raw = f.read(MAX_BYTES + 1)
        except (OSError, EOFError, zlib.error) as exc:
            raise ConfigError(f"oracle file {path} is not gzip data ({exc}); {_HINT}") from None
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"oracle file {path} is over {MAX_BYTES >> 20} MiB once decompressed; {_HINT}")
    return fileio.decode(raw, path, "oracle file", hint=_HINT).splitlines()


def _bad(path, n, why):
    return ConfigError(f"oracle file {path} line {n + 1}: {why}; {_HINT}")


def load(paths, manager=None, limit: Optional[int] = None) -> Oracle:
    """Read one or more oracle files of one op (later files' headers are ignored)."""
    from .key import KernelKey
    from .plugins import get_manager

    mgr = manager or get_manager()
    header: dict = {}
    shapes = []
    for path in [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]:
        names: dict = {}
        keys: dict = {}
        for n, line in enumerate(_lines(path)):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError):
                raise _bad(path, n, "not JSON") from None
            if not isinstance(rec, dict):
                raise _bad(path, n, f"a {type(rec).__name__}, not an object")
            if "op" in rec and "arch" in rec and not header:
                header = rec
                op = mgr.op(rec["op"])
            elif "kernel" in rec and "name" in rec:
                if isinstance(rec["kernel"], bool) or not isinstance(rec["kernel"], int):
                    raise _bad(path, n, "a kernel index is not an integer")
                names[rec["kernel"]] = rec["name"]
            elif "times" in rec:
                if not header:
                    raise ConfigError(f"oracle file {path} has no header line before its rows")
                if limit is not None and len(shapes) >= limit:
                    break
                ks, ms = [], []
                try:
                    for idx, t in rec["times"]:
                        name = names[idx]
                        if not isinstance(name, str):
                            raise TypeError(f"kernel {idx!r:.20} is named by a {type(name).__name__}")
                        if name not in keys:
                            keys[name] = KernelKey.from_name(name, mgr)
                        ks.append(keys[name])
                        ms.append(math.inf if t is None else float(t))
                    if any(m != m or m <= 0 for m in ms):
                        raise ValueError("a time is not a positive number (null marks a failed kernel)")
                    if not ks or not math.isfinite(min(ms)):
                        continue  # nothing ran: no oracle for this shape
                    heur = rec.get("heuristic")
                    shapes.append(Shape(str(rec.get("family", "?")), str(rec.get("split", "train")),
                                        op.problem_type.from_dict(rec["problem"]), tuple(ks),
                                        np.asarray(ms), names.get(heur) if heur is not None else None))
                except KeyError as exc:
                    raise _bad(path, n, f"names no kernel {exc.args[0]!r:.40} or lacks a field") from None
                except (TypeError, ValueError, CkError) as exc:
                    raise _bad(path, n, f"malformed row ({str(exc)[:200]})") from None
    if not header:
        raise ConfigError(f"no oracle rows in {paths}")
    return Oracle(header, tuple(shapes))


def score(shape: Shape, chosen) -> float:
    """Best time over the chosen kernel's time (0 when the pick failed or was not measured)."""
    name = chosen if isinstance(chosen, str) else chosen.name
    for k, t in zip(shape.keys, shape.ms):
        if k.name == name:
            return shape.best / t if math.isfinite(t) else 0.0
    return 0.0


def summary(scores) -> dict:
    s = np.asarray(list(scores), dtype=np.float64)
    if not len(s):
        return {"n": 0}
    pos = np.maximum(s, 1e-6)
    return {"n": int(len(s)), "geomean": float(np.exp(np.log(pos).mean())), "p10": float(np.percentile(s, 10)),
            "worst": float(s.min()), "best_pick": float((s >= 0.999).mean())}


def evaluate(shapes, selector: Callable) -> list:
    """Per shape: ``selector(problem, keys)`` (a key or a name) scored against the oracle."""
    return [score(s, selector(s.problem, list(s.keys))) for s in shapes]


# -- the selectors a report compares ---------------------------------------------------------

def heuristic_selector(op, arch):
    """The op's own heuristic (what the Dispatcher picked before the ranker)."""
    return lambda problem, keys: op.heuristic(problem, keys, arch)[0]


def ranker_selector(model, op, arch):
    """The Dispatcher's new default without a store entry: the ranker, or the op's heuristic
    where the problem lies outside the ranker's training domain."""
    from . import ranker

    def pick(problem, keys):
        ranked = ranker.rank(model, op, problem, keys, arch)
        if ranked is None:
            ranked = op.heuristic(problem, keys, arch) if op.heuristic else keys
        return ranked[0]
    return pick


def random_selector(seed: int = 0):
    rng = np.random.default_rng(seed)
    return lambda problem, keys: keys[int(rng.integers(len(keys)))]
