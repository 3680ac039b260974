"""Fit a learned ranker on a recorded oracle's training shapes and export it as tuned data.

    python -m ck_core.select_train <op> benchmarks/results/selection/<op>_sm90.jsonl.gz \\
        --write <the op plugin>/tuned

Needs the ``train`` extra (lightgbm, scikit-learn); the exported model is evaluated with numpy
alone (:mod:`ck_core.ranker`).  Two model kinds are fitted on the training split -- gradient-boosted
trees and a linear model over the same features (the analytic cost model with fitted
coefficients) -- and the one with the better geomean on a validation part of the training
shapes is exported (the held-out split is never looked at here; ``ck select report`` scores it).
The target is each candidate's log time over the shape's best; a failed or wrong kernel counts
as ``FAILED`` (e^3 = 20x slower), so the ranker learns to avoid it.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from datetime import date
from pathlib import Path

import numpy as np

from . import ranker, select_data

log = logging.getLogger(__name__)

FAILED = 3.0


def target(shape, clip: float = FAILED) -> np.ndarray:
    """Each measured candidate's log(time / the shape's best), capped at ``clip`` (failed: ``clip``)."""
    y = np.log(shape.ms / shape.best)
    return np.where(np.isfinite(y), np.minimum(y, clip), clip)


def _twin(key) -> tuple:
    """A key's algorithm without its pipeline depth (fields named ``*stage*``)."""
    import attrs

    a = key.algorithm
    fields = attrs.asdict(a, recurse=False) if attrs.has(type(a)) else dict(vars(a))
    return tuple(sorted((k, repr(v)) for k, v in fields.items() if "stage" not in k))


def disturbed(keys, ms: np.ndarray, ratio: float) -> np.ndarray:
    """Which of one shape's rows to KEEP for training: False where a candidate was timed more than
    ``ratio`` times slower than the fastest of its twins -- the same kernel but for its pipeline
    depth (every algorithm field equal except those named ``*stage*``).  A stage more or less
    moves a kernel's time by tens of percent; 10x to 100x off (a 4-stage kernel at 51-114 us
    where the 3-stage one takes 3-4 us) is a disturbed single-launch timing, not the kernel.
    Only training uses this: scores stay computed against the recorded times."""
    keep = np.ones(len(ms), bool)
    if not ratio:
        return keep
    twins: dict = {}
    for i, k in enumerate(keys):
        twins.setdefault(_twin(k), []).append(i)
    for idx in twins.values():
        if len(idx) < 2:
            continue
        t = ms[idx]
        order = np.argsort(t)
        others = np.where(np.arange(len(idx)) == order[0], t[order[1]], t[order[0]])   # fastest twin but itself
        keep[idx] = ~(t > ratio * others)
    return keep


def design(op, arch, shapes, names=None, clip: float = FAILED, disturbed_ratio: float = 0.0, drop=()):
    """``(X, y, group sizes, feature names)`` over every measured candidate of ``shapes``; ``y``
    is capped at ``clip`` (a kernel that much slower than the best is as good as failed: the
    fit spends its splits on the contenders).  ``disturbed_ratio``: leave out rows
    :func:`disturbed` marks (0: keep all).  ``drop``: feature names left out (with ``names`` None)."""
    Xs, ys, groups = [], [], []
    for s in shapes:
        cols = op.features(s.problem, list(s.keys), arch)
        names = names or [n for n in sorted(cols) if n not in set(drop)]
        X = ranker.matrix(cols, names, f"{op.name} features")
        keep = disturbed(s.keys, s.ms, disturbed_ratio)
        Xs.append(X[keep])
        ys.append(target(s, clip)[keep])
        groups.append(int(keep.sum()))
    return np.vstack(Xs), np.concatenate(ys), groups, names


#: how far (in log2 units) past the training sizes a ranker still answers
MARGIN = 0.5


def domain(op, arch, shapes) -> dict:
    """``{feature: [lo, hi]}`` over the problem sizes of ``shapes``: the problem-level (one value
    per shape) features named ``log_*``, widened by ``MARGIN``, and the problem-class indicators
    named ``is_*`` (e.g. a kernel family), exactly: a ranker fitted on one class of problems does
    not answer for another.  Other categorical features (a GQA ratio, a head dim) are not
    bounded: held-out model configs differ in exactly those."""
    seen: dict = {}
    varies = set()
    for s in shapes:
        cols = op.features(s.problem, list(s.keys), arch)
        for name, v in cols.items():
            v = np.asarray(v, dtype=np.float64)
            if len(v) and np.all(v == v[0]):
                seen.setdefault(name, []).append(float(v[0]))
            else:
                varies.add(name)
    out = {}
    for n, v in sorted(seen.items()):
        if n in varies or len(v) != len(shapes):
            continue
        if n.startswith("log_"):
            out[n] = [min(v) - MARGIN, max(v) + MARGIN]
        elif n.startswith("is_"):
            out[n] = [min(v), max(v)]
    return out


def kernel_domain(op, arch, shapes) -> dict:
    """``{feature: [v, v]}`` for the kernel-form indicators (features named ``v_*``) that took one
    value ``v`` over every training candidate, e.g. the indicator of a kernel form that no shape
    measured: the model learned nothing about that form, so a candidate list holding one is not
    ranked (:func:`ck_core.ranker.covers`; the op's heuristic orders it)."""
    values: dict = {}
    for s in shapes:
        for name, v in op.features(s.problem, list(s.keys), arch).items():
            if name.startswith("v_") and len(v):
                values.setdefault(name, set()).update(np.unique(np.asarray(v, dtype=np.float64)).tolist())
    return {n: [min(v), max(v)] for n, v in sorted(values.items()) if len(v) == 1}


def fit_linear(X, y, names, ridge: float = 1e-3) -> dict:
    mu, sd = X.mean(0), X.std(0) + 1e-9
    Z = (X - mu) / sd
    A = Z.T @ Z + ridge * len(Z) * np.eye(Z.shape[1])
    w = np.linalg.solve(A, Z.T @ (y - y.mean()))
    coef = w / sd
    return {"kind": "linear", "features": list(names), "coef": [float(c) for c in coef],
            "intercept": float(y.mean() - (mu / sd) @ w)}


def fit_gbdt(X, y, names, trees: int = 60, leaves: int = 16, seed: int = 0, depth: int = 5,
             lr: float = 0.12, min_child: int = 10, subsample: float = 0.8, colsample: float = 0.9,
             l2: float = 0.0) -> dict:
    import lightgbm as lgb

    # shallow trees: inference walks every level for every candidate (selection <= 1 ms)
    model = lgb.LGBMRegressor(n_estimators=trees, num_leaves=leaves, max_depth=depth, learning_rate=lr,
                              min_child_samples=min_child, subsample=subsample, subsample_freq=1,
                              colsample_bytree=colsample, reg_lambda=l2, random_state=seed, verbose=-1,
                              n_jobs=1)   # small fits; threads only contend on a shared host
    model.fit(X, y)
    return export_lightgbm(model.booster_, names)


def fit(kind: str, X, y, names, seed: int = 0, **gbdt) -> dict:
    """One model of ``kind`` (``gbdt``: :func:`fit_gbdt` with ``gbdt``'s options; ``linear``)."""
    if kind == "linear":
        return fit_linear(X, y, names)
    if kind != "gbdt":
        raise ValueError(f"model kind {kind!r} is not one of {ranker.KINDS}")
    return fit_gbdt(X, y, names, seed=seed, **gbdt)


def export_lightgbm(booster, names) -> dict:
    """A LightGBM booster as flat node arrays (see :class:`ck_core.ranker.Model`)."""
    feature, threshold, left, right, value, roots = [], [], [], [], [], []
    depth = 1

    def add(node, d):
        nonlocal depth
        depth = max(depth, d)
        i = len(feature)
        feature.append(-1), threshold.append(0.0), left.append(i), right.append(i), value.append(0.0)
        if "leaf_value" in node:
            value[i] = float(node["leaf_value"])
            return i
        if node.get("decision_type", "<=") != "<=":
            raise ValueError(f"unsupported split {node.get('decision_type')}")
        feature[i] = int(node["split_feature"])
        threshold[i] = float(node["threshold"])
        left[i] = add(node["left_child"], d + 1)
        right[i] = add(node["right_child"], d + 1)
        return i

    dump = booster.dump_model()
    for t in dump["tree_info"]:
        roots.append(add(t["tree_structure"], 1))
    return {"kind": "gbdt", "features": list(names), "base": 0.0,
            "trees": {"feature": feature, "threshold": threshold, "left": left, "right": right,
                      "value": [round(v, 7) for v in value], "roots": roots, "depth": depth - 1}}


def quality(spec: dict, op, arch, shapes) -> dict:
    model = ranker.Model(spec)
    return select_data.summary(select_data.evaluate(shapes, select_data.ranker_selector(model, op, arch)))


def train(op, arch, oracle, kinds=("gbdt", "linear"), seed: int = 0, validation: float = 0.2,
          clip: float = FAILED, disturbed_ratio: float = 0.0, drop=(), **gbdt):
    """Fit each kind on part of the training split, keep the best on the rest, refit it on all.
    ``gbdt``: :func:`fit_gbdt`'s tree options (trees, leaves, depth, lr, min_child, ...);
    ``disturbed_ratio``: training rows :func:`disturbed` marks are left out (0: none); ``drop``:
    feature names the model does not use."""
    shapes = oracle.split("train")
    if len(shapes) < 10:
        from .errors import ConfigError

        raise ConfigError(f"only {len(shapes)} training shapes in the oracle; collect more first")
    rng = np.random.default_rng(seed)
    # validation by family where families repeat, so the choice rewards generalising
    fams = sorted({s.family for s in shapes})
    held = set(rng.choice(fams, size=max(1, int(len(fams) * validation)), replace=False))
    val = [s for s in shapes if s.family in held]
    part = [s for s in shapes if s.family not in held]
    if len(val) < 5 or len(part) < 5:
        idx = rng.permutation(len(shapes))
        cut = int(len(shapes) * (1 - validation))
        part, val = [shapes[i] for i in idx[:cut]], [shapes[i] for i in idx[cut:]]
    X, y, _, names = design(op, arch, part, clip=clip, disturbed_ratio=disturbed_ratio, drop=drop)
    report = {}
    for kind in kinds:
        report[kind] = quality(fit(kind, X, y, names, seed=seed, **gbdt), op, arch, val)
        log.info("%s: validation %s", kind, report[kind])
    best = max(report, key=lambda k: (report[k]["geomean"], report[k]["p10"]))
    X, y, _, names = design(op, arch, shapes, clip=clip, disturbed_ratio=disturbed_ratio, drop=drop)
    spec = fit(best, X, y, names, seed=seed, **gbdt)
    spec["domain"] = domain(op, arch, shapes)
    kd = kernel_domain(op, arch, shapes)
    if kd:
        spec["kernel_domain"] = kd
    spec["validation"] = {k: {m: round(v, 4) for m, v in r.items()} for k, r in report.items()}
    spec["train_shapes"] = len(shapes)
    return spec


def splice(path: Path, op: str, arch: str, entry, provenance: dict):
    """Put the ranker table last in an existing data file, leaving the other tables' text as it
    is (shipped files are hand-formatted); None when the file is absent or not of that shape."""
    from . import tuned_data

    from . import fileio

    if not path.is_file():
        return None
    text = fileio.read_text(path, "tuned data", tuned_data.MAX_FILE_BYTES)
    doc = fileio.loads_json(text, path, "tuned data")
    tail = "\n }\n}"
    marker = f',\n  "{ranker.TABLE}": {{'
    cut = text.find(marker)
    if cut < 0:
        cut = text.rstrip().rfind(tail)
    if cut < 0 or not text[:cut].rstrip().endswith("}"):
        return None
    old = doc["tables"].get(ranker.TABLE, {})
    entries = {json.dumps(e["key"]): e for e in old.get("entries", [])}
    entries[json.dumps(list(entry[0]))] = {"key": list(entry[0]), "value": entry[1]}
    table = {"key": list(ranker.FIELDS), "provenance": provenance, "entries": list(entries.values())}
    block = tuned_data._dumps({ranker.TABLE: table})[1:-1].rstrip()
    block = "\n".join(" " + line if line else line for line in block.split("\n"))
    out = text[:cut] + "," + block + tail + "\n"
    tuned_data.parse(path, out, op, arch)
    want = dict(doc["tables"], **{ranker.TABLE: table})
    if json.loads(out)["tables"] != want:
        return None
    path.write_text(out)
    tuned_data.clear_cache()
    return path


def main(argv=None) -> int:
    from . import tuned_data
    from .plugins import get_manager

    ap = argparse.ArgumentParser(prog="python -m ck_core.select_train", description=__doc__.split("\n")[0])
    ap.add_argument("op")
    ap.add_argument("data", nargs="+", help="oracle files (benchmarks/selection_collect.py)")
    ap.add_argument("--kinds", default="gbdt,linear")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write", metavar="FOLDER", help="tuned-data folder to write (default: the user's store)")
    ap.add_argument("--trees", type=int, default=60)
    ap.add_argument("--leaves", type=int, default=16)
    ap.add_argument("--depth", type=int, default=5, help="most splits on a tree path (inference walks them all)")
    ap.add_argument("--lr", type=float, default=0.12, help="the trees' learning rate")
    ap.add_argument("--clip", type=float, default=FAILED,
                    help="cap of the target log(time / best): slower kernels count as equally bad")
    ap.add_argument("--l2", type=float, default=0.0, help="the trees' L2 regularisation of leaf values")
    ap.add_argument("--drop", default="", help="feature names the model leaves out, comma-separated")
    ap.add_argument("--min-child", type=int, default=10, help="fewest training rows a tree leaf holds")
    ap.add_argument("--disturbed", type=float, default=0.0, metavar="RATIO",
                    help="leave out training rows timed more than RATIO x their stages-twin (0: keep all)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    mgr = get_manager()
    op = mgr.op(args.op)
    oracle = select_data.load(args.data, mgr)
    h = oracle.header
    arch = mgr.arch(h["arch"])
    spec = train(op, arch, oracle, tuple(args.kinds.split(",")), args.seed, clip=args.clip,
                 disturbed_ratio=args.disturbed, drop=tuple(filter(None, args.drop.split(","))), trees=args.trees,
                 leaves=args.leaves, depth=args.depth, lr=args.lr, min_child=args.min_child, l2=args.l2)
    if h.get("candidates", "all") != "all":   # the oracle measured the op's shortlist: rank that
        spec["candidates"] = h["candidates"]
    try:
        import lightgbm
        lib = f"lightgbm {lightgbm.__version__}"
    except ImportError:
        lib = "numpy"
    source = (f"{spec['kind']} ranker ({lib}) fitted on the {spec['train_shapes']} training shapes of "
              f"{', '.join(Path(d).name for d in args.data)} (collected {h.get('date')} by {h.get('command')}); "
              f"validation {spec['validation']}")
    command = " ".join(["python -m ck_core.select_train", *(argv or sys.argv[1:])])
    entry = ((h.get("backend", "triton"),), spec)
    path = None
    if args.write:
        path = splice(Path(args.write) / f"{h['arch']}.json", args.op, h["arch"], entry,
                      dict(command=command, date=date.today().isoformat(), device=h.get("device", "?"),
                           source=source))
    if path is None:
        path = tuned_data.write(args.op, h["arch"], ranker.TABLE, [entry], command=command,
                                device=h.get("device", "?"), source=source, fields=ranker.FIELDS,
                                folder=Path(args.write) if args.write else None)
    print(f"{spec['kind']} ranker written to {path}; validation {spec['validation']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
