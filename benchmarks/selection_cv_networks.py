"""Leave-one-network-out cross-validation of a ranker inside an oracle's training split.

    python benchmarks/selection_cv_networks.py conv benchmarks/results/selection/conv_sm90.jsonl.gz --clip 0.5 --seeds 0,1,2

Each network (the part of a shape's family before ``:``) of the training split is held out in
turn, the ranker (``ck_core.select_train``'s gradient-boosted trees or linear model, the same
features) is fitted on the other networks and scored on it; the pooled scores give geomean and
P10.  The held-out split is never read: this is how the shipped conv ranker's features, clip
and model kind were chosen (see benchmarks/results/selection/README.md).  Needs the ``train``
extra.
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from ck_core import ranker, select_data, select_train
from ck_core.plugins import get_manager


def cross_validate(op, arch, shapes, kind="gbdt", clip=select_train.FAILED, seed=0, drop=(), **gbdt) -> dict:
    nets = sorted({s.family.split(":")[0] for s in shapes})
    names = [n for n in select_train.design(op, arch, shapes[:1])[3] if n not in drop]
    scores, by_dir = [], {}
    for net in nets:
        fit = [s for s in shapes if s.family.split(":")[0] != net]
        val = [s for s in shapes if s.family.split(":")[0] == net]
        X, y, _, _ = select_train.design(op, arch, fit, names=names, clip=clip)
        spec = (select_train.fit_gbdt(X, y, names, seed=seed, **gbdt) if kind == "gbdt"
                else select_train.fit_linear(X, y, names))
        got = select_data.evaluate(val, select_data.ranker_selector(ranker.Model(spec), op, arch))
        scores += got
        for s, v in zip(val, got):
            by_dir.setdefault(s.family.split(":")[-1], []).append(v)
    out = select_data.summary(scores)
    out.update({d: select_data.summary(v)["geomean"] for d, v in sorted(by_dir.items())})
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("op")
    ap.add_argument("data")
    ap.add_argument("--kind", default="gbdt", choices=("gbdt", "linear"))
    ap.add_argument("--clip", type=float, default=select_train.FAILED)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--trees", type=int, default=60)
    ap.add_argument("--leaves", type=int, default=16)
    ap.add_argument("--depth", type=int, default=5)
    ap.add_argument("--drop", default="", help="features left out, comma-separated")
    args = ap.parse_args(argv)
    mgr = get_manager()
    oracle = select_data.load(args.data, mgr)
    op, arch = mgr.op(args.op), mgr.arch(oracle.header["arch"])
    shapes = oracle.split("train")
    runs = [cross_validate(op, arch, shapes, args.kind, args.clip, int(seed), tuple(filter(None, args.drop.split(","))),
                           trees=args.trees, leaves=args.leaves, depth=args.depth)
            for seed in args.seeds.split(",")]
    for r in runs:
        print(json.dumps(r))
    print(json.dumps({"mean_geomean": round(float(np.mean([r["geomean"] for r in runs])), 4),
                      "mean_p10": round(float(np.mean([r["p10"] for r in runs])), 4)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
