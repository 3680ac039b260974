"""Group k-fold cross-validation of ranker settings on an oracle's TRAINING shapes (CPU).

    python benchmarks/selection_cv.py gemm benchmarks/results/selection/gemm_sm90.jsonl.gz \\
        '{"trees": 100, "leaves": 63, "depth": 8}' '{"trees": 200, "lr": 0.08}' ...

Each argument after the data file is one setting (``ck_core.select_train.fit_gbdt``'s options
plus ``clip`` and ``features``: a list of feature names, default all).  The held-out split is
never read.  Folds hold whole groups: an LLM-style family ``kind:model:layer`` is grouped by
model (a model's layers never straddle train and test), any other family is cut into
``--parts`` random groups.  Prints each setting's pick/oracle geomean, P10 and worst over all
training shapes, each scored by the fold that did not see it.  Needs the ``train`` extra.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from ck_core import ranker, select_data, select_train
from ck_core.plugins import get_manager


def groups_of(shapes, parts: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for s in shapes:
        bits = s.family.split(":")
        out.append(bits[1] if len(bits) >= 3 else f"{s.family}#{rng.integers(parts)}")
    return out


def cross_validate(op, arch, shapes, setting: dict, folds: int = 5, parts: int = 5, seed: int = 1) -> dict:
    from sklearn.model_selection import GroupKFold

    setting = dict(setting)
    clip = setting.pop("clip", select_train.FAILED)
    names = setting.pop("features", None)
    cols = [op.features(s.problem, list(s.keys), arch) for s in shapes]
    names = names or sorted(cols[0])
    Xs = [ranker.matrix(c, names, "cv") for c in cols]
    ys = [np.log(s.ms / s.best) for s in shapes]
    ys = [np.where(np.isfinite(y), np.minimum(y, clip), clip) for y in ys]
    scores = np.zeros(len(shapes))
    split = GroupKFold(folds).split(np.zeros(len(shapes)), groups=groups_of(shapes, parts, seed))
    for fit, test in split:
        spec = select_train.fit_gbdt(np.vstack([Xs[i] for i in fit]), np.concatenate([ys[i] for i in fit]),
                                     names, **setting)
        model = ranker.Model(spec)
        for i in test:
            scores[i] = select_data.score(shapes[i], shapes[i].keys[int(np.argmin(model.predict(Xs[i])))])
    return select_data.summary(scores)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("op")
    ap.add_argument("data")
    ap.add_argument("settings", nargs="+", help="JSON objects of fit_gbdt options (+ clip, features)")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--parts", type=int, default=5, help="random groups a non-model family is cut into")
    args = ap.parse_args(argv)
    mgr = get_manager()
    oracle = select_data.load(args.data, mgr)
    op, arch = mgr.op(args.op), mgr.arch(oracle.header["arch"])
    shapes = oracle.split("train")
    for text in args.settings:
        t = time.perf_counter()
        got = cross_validate(op, arch, shapes, json.loads(text), args.folds, args.parts)
        print(text, {k: round(v, 4) for k, v in got.items()}, f"{time.perf_counter() - t:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
