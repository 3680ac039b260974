"""Cross-validation of ranker settings inside an oracle's TRAINING split (CPU; the held-out split is never read).

    python benchmarks/selection_cv.py --op gemm --groups kfold '{"trees": 100, "leaves": 63, "depth": 8, "clip": 1.0}'
    python benchmarks/selection_cv.py --op conv --groups network --seeds 0,1,2 '{"clip": 0.5}' '{"kind": "linear"}'
    python benchmarks/selection_cv.py --op fmha --groups config '{}'

Each positional argument is one setting, a JSON object: ``kind`` (``gbdt``, the default, or
``linear``), ``clip`` (cap of the target log(time / best)), ``features`` (the feature names to
use; default all) or ``drop`` (names to leave out), ``disturbed`` (drop training rows timed more
than this many times their stages-twin, :func:`ck_core.select_train.disturbed`), and
:func:`ck_core.select_train.fit_gbdt`'s tree options (``trees``, ``leaves``, ``depth``, ``lr``,
``min_child``, ...).  ``--groups`` says which training shapes are held out together:

``kfold``
    ``--folds`` group folds; an LLM-style family ``kind:model:layer`` is grouped by model (a
    model's layers never straddle fit and test), any other family is cut into ``--parts``
    random groups (how the GEMM ranker's settings were chosen);
``network``
    leave one network out: the part of a family before ``:`` (``resnet50:bwd_data`` ->
    ``resnet50``; how the conv ranker's were chosen);
``config``
    leave one model config out: the second part of a family (``llm:llama3-8b:down``,
    ``attn:phi3-mini``); families without one are cut into ``--parts`` random groups.

Every training shape is scored once, by the fit that did not see it, against the recorded
oracle (disturbed rows included); one JSON line per (setting, seed): geomean, P10, worst,
best-pick share, and geomeans per family kind (``by_kind``: the part before the first ``:``)
and per family tail (``by_tail``: the last part, e.g. the conv direction); then a mean line
when several ``--seeds`` ran (a seed changes the trees' subsampling and the random groups).
Needs the ``train`` extra (lightgbm, scikit-learn).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from ck_core import ranker, select_data, select_train
from ck_core.plugins import get_manager

GROUPS = ("kfold", "network", "config")


def groups_of(shapes, how: str, parts: int, seed: int) -> list:
    """One group label per shape (shapes of one label are held out together)."""
    rng = np.random.default_rng(seed)
    out = []
    for s in shapes:
        bits = s.family.split(":")
        if how == "network":
            out.append(bits[0])
        elif how == "config" and len(bits) >= 2:
            out.append(bits[1])
        elif how == "kfold" and len(bits) >= 3:
            out.append(bits[1])
        else:
            out.append(f"{s.family}#{rng.integers(parts)}")
    return out


def folds_of(labels: list, how: str, folds: int):
    """``(fit indices, test indices)`` pairs: ``folds`` group folds for kfold, one fold per group otherwise."""
    if how == "kfold":
        from sklearn.model_selection import GroupKFold

        yield from GroupKFold(folds).split(np.zeros(len(labels)), groups=labels)
        return
    labels = np.asarray(labels)
    for g in sorted(set(labels)):
        yield np.flatnonzero(labels != g), np.flatnonzero(labels == g)


def cross_validate(op, arch, shapes, setting: dict, how: str = "kfold", folds: int = 5, parts: int = 5,
                   seed: int = 0) -> dict:
    """Pooled out-of-fold scores of one setting (see the module doc)."""
    setting = dict(setting)
    kind = setting.pop("kind", "gbdt")
    clip = setting.pop("clip", select_train.FAILED)
    names = setting.pop("features", None)
    drop = set(setting.pop("drop", ()))
    ratio = setting.pop("disturbed", None)
    cols = [op.features(s.problem, list(s.keys), arch) for s in shapes]
    names = [n for n in (names or sorted(cols[0])) if n not in drop]
    Xs = [ranker.matrix(c, names, "cv") for c in cols]
    ys = [select_train.target(s, clip) for s in shapes]
    keep = [select_train.disturbed(s.keys, s.ms, ratio) for s in shapes]
    scores = np.zeros(len(shapes))
    # kfold keeps the original tool's grouping seed (1) at seed 0
    labels = groups_of(shapes, how, parts, seed + 1)
    for fit, test in folds_of(labels, how, folds):
        X = np.vstack([Xs[i][keep[i]] for i in fit])
        y = np.concatenate([ys[i][keep[i]] for i in fit])
        model = ranker.Model(select_train.fit(kind, X, y, names, seed=seed, **setting))
        for i in test:
            scores[i] = select_data.score(shapes[i], shapes[i].keys[int(np.argmin(model.predict(Xs[i])))])
    out = select_data.summary(scores)
    for name, part in (("by_kind", 0), ("by_tail", -1)):
        by: dict = {}
        for s, v in zip(shapes, scores):
            by.setdefault(s.family.split(":")[part], []).append(v)
        if len(by) > 1:
            out[name] = {k: round(select_data.summary(v)["geomean"], 4) for k, v in sorted(by.items())}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("settings", nargs="+", help="JSON objects (see the module doc)")
    ap.add_argument("--op", required=True)
    ap.add_argument("--data", nargs="+", help="oracle files (default: benchmarks/results/selection/<op>_sm90.jsonl.gz)")
    ap.add_argument("--groups", default="kfold", choices=GROUPS)
    ap.add_argument("--folds", type=int, default=5, help="kfold: number of folds")
    ap.add_argument("--parts", type=int, default=5, help="random groups a family without a model is cut into")
    ap.add_argument("--seeds", default="0", help="comma-separated; each reruns every setting")
    args = ap.parse_args(argv)
    mgr = get_manager()
    oracle = select_data.load(args.data or [f"benchmarks/results/selection/{args.op}_sm90.jsonl.gz"], mgr)
    op, arch = mgr.op(args.op), mgr.arch(oracle.header["arch"])
    shapes = oracle.split("train")
    for text in args.settings:
        setting = json.loads(text)
        runs = []
        for seed in [int(s) for s in args.seeds.split(",")]:
            t = time.perf_counter()
            got = cross_validate(op, arch, shapes, setting, args.groups, args.folds, args.parts, seed)
            runs.append(got)
            print(json.dumps({"setting": setting, "groups": args.groups, "seed": seed,
                              **{k: round(v, 4) if isinstance(v, float) else v for k, v in got.items()},
                              "seconds": round(time.perf_counter() - t, 1)}), flush=True)
        if len(runs) > 1:
            print(json.dumps({"setting": setting, "groups": args.groups, "seeds": args.seeds,
                              **{f"mean_{m}": round(float(np.mean([r[m] for r in runs])), 4)
                                 for m in ("geomean", "p10", "worst")}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
