"""Benchmark harness: ours vs a peer, same process, same inputs.

Op plugins provide ``OpSpec.bench(peer, options) -> dict`` with ``rows`` (each
``case, ours, peer, peer_name, unit, ratio`` plus free columns) and optional
``extra`` tables; ``options["progress"]`` makes a :class:`ck_core.progress.Progress`
(``progress(total, desc)``) for the suite to count its cases on.  This module stamps the result
header (:func:`result_header`: schema, device, date, command, commit), computes the geometric mean
of the ratios, prints a table and writes JSON / CSV.

Every results JSON (``ck bench``, the suites and tools under ``benchmarks/``) carries the same
header; :func:`check_result` says what one lacks (``tests/test_results_schema.py`` runs it over
the committed files).  ``ck bench`` writes ``ck-results/<op>.json`` under the current directory
unless ``--json`` names a file: never into the package or the repository by default.
"""
from __future__ import annotations

import csv
import datetime as _dt
import functools
import glob
import json
import math
import platform
import sys
from pathlib import Path
from typing import Iterable, Optional

from .errors import PluginError, ToolchainMissing, UnsupportedProblem
from .progress import Progress

ROW_KEYS = ("case", "ours", "peer", "peer_name", "unit", "ratio")
#: the header every results file carries (``schema`` names this record and its version)
RESULT_SCHEMA = {"name": "ck-dispatcher.results", "version": 1}
HEADER_KEYS = ("schema", "device", "date", "command", "commit")
#: where ``ck bench`` writes when no --json is given (relative to the current directory)
DEFAULT_RESULTS_DIR = "ck-results"


def git_commit(where: Optional[Path] = None) -> str:
    """The commit of the checkout ``where`` lies in (default: this package's), with ``+dirty`` when
    tracked files changed; ``"unknown"`` outside a git checkout (an installed wheel)."""
    import subprocess

    from . import knobs

    given = knobs.get("CK_RESULTS_COMMIT")
    if given:
        return given
    cwd = str(where or Path(__file__).resolve().parent)
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=cwd, capture_output=True,
                              text=True, timeout=10, check=False)
        if head.returncode:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10, check=False)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def result_header(command: Optional[str] = None, device: Optional[str] = None) -> dict:
    """The header of a results file: schema, device, date (UTC, ISO), command, commit."""
    return {"schema": dict(RESULT_SCHEMA), "device": device or device_name(),
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": command or " ".join([Path(sys.argv[0]).name or "python"] + sys.argv[1:]),
            "commit": git_commit()}


def with_header(doc: dict, command: Optional[str] = None, device: Optional[str] = None) -> dict:
    """``doc`` with the results header first (fields ``doc`` already has win)."""
    return {**result_header(command, device), **doc, "schema": dict(RESULT_SCHEMA)}


def check_result(doc) -> list[str]:
    """What a results document lacks to follow the schema (an empty list: nothing)."""
    if not isinstance(doc, dict):
        return [f"a results file holds a JSON object, not {type(doc).__name__}"]
    out = [f"no {k!r}" for k in HEADER_KEYS if k not in doc]
    sch = doc.get("schema")
    if "schema" in doc and (not isinstance(sch, dict) or sch.get("name") != RESULT_SCHEMA["name"]
                            or not isinstance(sch.get("version"), int)):
        out.append(f"schema is {sch!r}, not {{'name': {RESULT_SCHEMA['name']!r}, 'version': <int>}}")
    elif isinstance(sch, dict) and sch.get("version", 0) > RESULT_SCHEMA["version"]:
        out.append(f"schema version {sch['version']} is newer than this reader's {RESULT_SCHEMA['version']}")
    for k in ("device", "date", "command", "commit"):
        if k in doc and not (isinstance(doc[k], str) and doc[k].strip()):
            out.append(f"{k!r} is {doc[k]!r}, not a non-empty string")
    return out


def geomean(values: Iterable[float]) -> Optional[float]:
    vals = [v for v in values if v and v > 0 and math.isfinite(v)]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def eager_and_graph_ms(fn) -> dict:
    """Median milliseconds of ``fn`` called eagerly (host overhead included) and replayed as a
    CUDA graph (kernel time): ``{"eager_ms", "graph_ms"}``; a callable that cannot be captured
    gets ``graph_error`` instead of ``graph_ms``.  Needs torch and triton on a CUDA device."""
    import torch
    import triton

    fn()
    torch.cuda.synchronize()
    out = {"eager_ms": triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")}
    try:
        out["graph_ms"] = triton.testing.do_bench_cudagraph(fn, rep=60, return_mode="median")
    except Exception as exc:  # a peer that cannot be captured still has its eager time
        out["graph_error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
    return out


def shard(cases: list, spec: str) -> list:
    """The ``I/N`` shard of a suite's case list (cases I, I+N, I+2N, ...; ``""`` = all), so that N
    processes, one per GPU, run a broad suite together (``benchmarks/broad_multi.py`` merges them)."""
    if not spec:
        return list(cases)
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        i, n = -1, 0
    if not 0 <= i < n:
        from .errors import ConfigError

        raise ConfigError(f"--shard {spec!r}: give I/N with 0 <= I < N, e.g. 0/4")
    return list(cases)[i::n]


def broad_result(res: dict) -> dict:
    """A broad suite's run (``rows``, ``summary``, ``seed``, ``skipped_for_time``) as ``ck bench``'s result:
    the rows that ran and were right form the table and the geomeans; the others (wrong, error,
    no peer) go under ``extra.failed``, never into a ratio."""
    ok = [r for r in res["rows"] if r.get("status") == "ok" and r.get("ratio")]
    return {"rows": ok, "suite": "broad", "seed": res["seed"],
            **({"arch": res["arch"]} if "arch" in res else {}),
            "extra": {"summary": [dict(group=k, **v) for k, v in res["summary"].items()],
                      "failed": [r for r in res["rows"] if r not in ok],
                      "skipped_for_time": res["skipped_for_time"]}}


def device_name() -> str:
    try:
        import torch
        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return f"CPU ({platform.processor() or platform.machine()})"


def stamp(result: dict, command: Optional[str] = None) -> dict:
    rows = result.get("rows", [])
    for r in rows:
        missing = [k for k in ROW_KEYS if k not in r]
        if missing:
            raise PluginError(f"an op plugin's benchmark row lacks {missing}: {r}")
    groups: dict[str, list] = {}
    for r in rows:
        groups.setdefault(r.get("group", "all"), []).append(r["ratio"])
    out = {
        **result_header(command or " ".join(["ck"] + sys.argv[1:])),
        "geomean": geomean(r["ratio"] for r in rows),
        "geomean_by_group": {g: geomean(v) for g, v in groups.items()},
        "min_ratio": min((r["ratio"] for r in rows), default=None),
    }
    out.update(result)
    return out


def format_table(rows: list[dict], cols=None) -> str:
    cols = cols or [c for c in ("group", "case", "ours", "peer", "peer_name", "unit", "ratio", "ok")
                    if any(c in r for r in rows)]

    def fmt(v):
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    w = {c: max(len(c), *(len(fmt(r.get(c, ""))) for r in rows)) for c in cols}
    lines = [" | ".join(c.ljust(w[c]) for c in cols), "-|-".join("-" * w[c] for c in cols)]
    lines += [" | ".join(fmt(r.get(c, "")).ljust(w[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def write(result: dict, json_path=None, csv_path=None) -> None:
    if json_path:
        p = Path(json_path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(result, indent=1, default=str))
    if csv_path:
        Path(csv_path).parent.mkdir(parents=True, exist_ok=True)
        rows = result.get("rows", [])
        keys = list(dict.fromkeys(k for r in rows for k in r))
        with open(csv_path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)


def _gpu_visible() -> tuple[bool, str]:
    """Whether torch sees a GPU, answered from the device nodes first (importing torch and
    initialising CUDA takes seconds; a machine with neither node has no GPU to find)."""
    if sys.platform.startswith("linux") and "torch" not in sys.modules:
        nodes = glob.glob("/dev/nvidia[0-9]*") + glob.glob("/dev/kfd")
        if not nodes:
            return False, "no /dev/nvidia* or /dev/kfd device node"
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, "torch.cuda.is_available() is False"
    return True, ""


def run_bench(op_name: str, args, extra: dict) -> int:
    from .plugins import get_manager

    op = get_manager().op(op_name)
    if op.bench is None:
        raise UnsupportedProblem(f"op {op_name} has no benchmark suite")
    ok, why = _gpu_visible()
    if not ok:
        raise ToolchainMissing(f"ck bench {op_name} times kernels on a GPU and none is visible here "
                               f"({why}); run it on a machine with an NVIDIA or AMD GPU, or use "
                               f"`ck run {op_name} ...` to check results on the CPU")
    suite = getattr(args, "suite", "core") or "core"
    # the suites count their cases through this (a bar on a terminal, a line every 30 s in a log)
    progress = functools.partial(Progress, quiet=bool(getattr(args, "quiet", False)))
    result = stamp(op.bench(args.vs, dict(extra, arch=args.arch, backend=args.backend,
                                           quick=args.quick, suite=suite, progress=progress)))
    print(f"# {op_name} vs {args.vs} on {result['device']} ({result['date']})")
    print(format_table(result["rows"]))
    for name, table in result.get("extra", {}).items():
        print(f"\n## {name}")
        if isinstance(table, list) and table:
            print(format_table(table, list(dict.fromkeys(k for r in table for k in r))))
        else:
            print(json.dumps(table, indent=1))
    gm = result["geomean"]
    print(f"\ngeomean ratio: {gm:.3f}" if gm else "\nno ratio")
    name = op_name if suite == "core" else f"{op_name}_{suite}"
    path = Path(args.json) if args.json else Path(DEFAULT_RESULTS_DIR) / f"{name}.json"
    write(result, path, args.csv)
    if not getattr(args, "quiet", False):
        print(f"wrote {path}", file=sys.stderr)
    return 0
