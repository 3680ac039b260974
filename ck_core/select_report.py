"""``ck select report <op>``: selection quality on recorded oracle shapes.

For each shape of the chosen split (held-out by default) every selector picks
among the measured candidates; the score is the oracle's best time over the
pick's time (1.0 = the pick is the fastest measured kernel).  Selectors: the
learned ranker (the shipped one, or ``--ranker FOLDER``), the op's heuristic
(the old default), the roofline feature alone (the analytic estimate without
fitting) where the op's features have one, and a seeded random pick (the floor).
Writes a per-shape CSV and a PNG of the sorted scores.
"""
from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from typing import Optional

import numpy as np

from . import ranker, select_data
from .errors import ConfigError

DEFAULT_DIR = Path("benchmarks/results/selection")


def data_dirs() -> list:
    """Where recorded oracles are looked for: the current directory's ``benchmarks/results/selection``,
    then the source checkout's this package was installed from (``pip install -e``), so the report
    runs from any directory."""
    dirs = [Path.cwd() / DEFAULT_DIR, Path(__file__).resolve().parents[1] / DEFAULT_DIR]
    return [d for i, d in enumerate(dirs) if d not in dirs[:i]]


def default_data(op: str) -> list:
    for d in data_dirs():
        found = sorted(d.glob(f"{op}_*.jsonl*"))
        if found:
            return found
    raise ConfigError(f"no recorded oracle for {op} under {' or '.join(str(d) + '/' for d in data_dirs())}; "
                      f"pass --data FILE (written by benchmarks/selection_collect.py)")


def load_model(op, arch: str, backend: str, folder: Optional[str] = None):
    if folder is None:
        return ranker.model_for(op, arch, backend)
    from . import tuned_data

    t = tuned_data.table(op.name, arch, ranker.TABLE, shipped=folder)
    spec = t.get((backend,))
    if spec is None:
        raise ConfigError(f"{folder}/{arch}.json has no {ranker.TABLE!r} entry for backend {backend}")
    return ranker.Model(spec, f"ranker in {folder}")


def selectors(op, arch, model, probe) -> dict:
    """The selectors to compare; ``probe``: one oracle shape (which features the op has)."""
    out = {}
    if model is not None:
        out["ranker"] = select_data.ranker_selector(model, op, arch)
    if op.heuristic is not None:
        out["heuristic"] = select_data.heuristic_selector(op, arch)
    if op.features is not None and "log_roofline" in op.features(probe.problem, list(probe.keys), arch):
        def roofline(problem, keys):
            cols = op.features(problem, keys, arch)
            return keys[int(np.argmin(cols["log_roofline"]))]
        out["roofline"] = roofline
    out["random"] = select_data.random_selector(0)
    return out


def selection_ms(op, arch, model, shapes) -> Optional[float]:
    """Mean milliseconds the ranker takes to order one new problem's candidates (the best of three
    rounds: a busy machine's noise is not the ranker's cost)."""
    if model is None or not shapes:
        return None
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for s in shapes:
            ranker.rank(model, op, s.problem, list(s.keys), arch)   # None outside its domain: still timed
        best = min(best, (time.perf_counter() - t) / len(shapes))
    return best * 1e3


def report(op_name: str, data=None, split: str = "heldout", ranker_folder: Optional[str] = None,
           csv_path: Optional[str] = None, png_path: Optional[str] = None, manager=None) -> dict:
    from .plugins import get_manager

    mgr = manager or get_manager()
    op = mgr.op(op_name)
    oracle = select_data.load(data or default_data(op_name), mgr)
    h = oracle.header
    arch = mgr.arch(h["arch"])
    shapes = oracle.split(split) if split != "all" else list(oracle.shapes)
    if not shapes:
        raise ConfigError(f"the oracle has no {split!r} shapes")
    model = load_model(op, h["arch"], h.get("backend", "triton"), ranker_folder)
    sels = selectors(op, arch, model, shapes[0])
    picks = {name: [fn(s.problem, list(s.keys)) for s in shapes] for name, fn in sels.items()}
    scores = {name: [select_data.score(s, k) for s, k in zip(shapes, ks)] for name, ks in picks.items()}
    out = {"op": op_name, "arch": h["arch"], "backend": h.get("backend"), "split": split, "shapes": len(shapes),
           "families": len({s.family for s in shapes}), "oracle": {k: h.get(k) for k in ("device", "date", "command")},
           "ranker": (dict(kind=model.kind, **{k: v for k, v in model.meta.items() if k in ("train_shapes",)})
                      if model else None),
           "selection_ms": selection_ms(op, arch, model, shapes[:200]),
           "summary": {name: select_data.summary(sc) for name, sc in scores.items()}}
    if csv_path:
        with open(csv_path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["family", "bucket", "candidates", "best_ms", "best_kernel"]
                       + [f"{n}_{c}" for n in sels for c in ("kernel", "ms", "score")])
            for i, s in enumerate(shapes):
                b = int(np.argmin(s.ms))
                row = [s.family, json.dumps(s.problem.bucket(), default=str), len(s.keys), f"{s.ms[b]:.5g}",
                       s.keys[b].name]
                for n in sels:
                    k = picks[n][i]
                    ms = next((t for kk, t in zip(s.keys, s.ms) if kk.name == k.name), float("nan"))
                    row += [k.name, f"{ms:.5g}", f"{scores[n][i]:.4f}"]
                w.writerow(row)
        out["csv"] = csv_path
    if png_path:
        plot(scores, out, png_path)
        out["png"] = png_path
    return out


def plot(scores: dict, info: dict, path: str) -> None:
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("--png needs matplotlib (pip install 'ck-core[plot]')") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, sc in scores.items():
        s = np.sort(np.asarray(sc))
        g = info["summary"][name]
        ax.plot(np.linspace(0, 100, len(s)), s, label=f"{name}: geomean {g['geomean']:.3f}, P10 {g['p10']:.3f}")
    ax.set_xlabel(f"{info['split']} shapes, sorted (%)")
    ax.set_ylabel("oracle best time / picked kernel's time")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(f"{info['op']} selection on {info['shapes']} {info['split']} shapes ({info['arch']}, "
                 f"{info['oracle'].get('device') or '?'})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_table(res: dict) -> str:
    lines = [f"{res['op']} on {res['arch']}/{res['backend']}: {res['shapes']} {res['split']} shapes "
             f"({res['families']} families); oracle from {res['oracle'].get('device')}, {res['oracle'].get('date')}",
             f"{'selector':10s} {'geomean':>8s} {'P10':>7s} {'worst':>7s} {'best pick':>9s}"]
    for name, s in res["summary"].items():
        lines.append(f"{name:10s} {s['geomean']:8.4f} {s['p10']:7.4f} {s['worst']:7.4f} {s['best_pick']:9.1%}")
    if res.get("selection_ms") is not None:
        lines.append(f"ranker: {res['ranker']['kind']}, {res['selection_ms']:.3f} ms per new problem")
    return "\n".join(lines)


def cmd_select(args, extra) -> int:
    from .progress import busy

    if args.png:   # before the scoring, not after it
        from .deps import require

        require("matplotlib", "ck select report --png")

    with busy(f"scoring the {args.op} ranker on the {args.split} shapes"):
        res = report(args.op, args.data, args.split, args.ranker, args.csv, args.png)
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        print(format_table(res))
    return 0


def add_parser(sub) -> None:
    s = sub.add_parser("select", allow_abbrev=False,
                       help="selection quality: ck select report <op> [--data F] [--csv F] [--png F]")
    s.add_argument("action", choices=("report",))
    s.add_argument("op")
    s.add_argument("--data", nargs="+", help=f"oracle files (default: {DEFAULT_DIR}/<op>_*.jsonl* of the "
                   "current directory, else of the checkout ck_core runs from)")
    s.add_argument("--split", default="heldout", choices=("heldout", "train", "all"))
    s.add_argument("--ranker", help="tuned-data folder holding the ranker to score (default: the shipped one)")
    s.add_argument("--csv", help="per-shape rows")
    s.add_argument("--png", help="plot of the sorted scores")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_select)
