"""List the held-out oracle rows that look disturbed, for re-timing on the GPU (CPU; numpy only).

    python benchmarks/selection_list_disturbed.py --op gemm --out benchmarks/results/selection/gemm_retime.json
    python3 benchmarks/selection_retime.py benchmarks/results/selection/gemm_retime.json --out $OUT/gemm_retime.json

A recorded kernel time looks disturbed where it is more than ``--ratio`` times the time of its
stages-twin on the same shape (:func:`ck_core.select_train.disturbed`: the same kernel but for
its pipeline depth) and that twin is a contender (within ``--near`` of the shape's best), so the
row matters for selection.  Also listed: each held-out shape where the shipped ranker's pick
scores below ``--low`` (its pick, the recorded best and their stages-twins), since a disturbed
best or pick is what such a score may mean.  The held-out scores stay computed against the
recorded times; this only says which rows the GPU should measure again.  Rows are ordered by
importance (low scores first), so a re-timing run cut by its budget keeps the ones that matter.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from ck_core import ranker, select_data, select_train
from ck_core.plugins import get_manager


def listing(op, arch, oracle, model, ratio: float = 3.0, near: float = 1.5, low: float = 0.5) -> list:
    pick = select_data.ranker_selector(model, op, arch) if model else None
    rows = []
    for s in oracle.split("heldout"):
        twins: dict = {}
        for i, k in enumerate(s.keys):
            twins.setdefault(select_train._twin(k), []).append(i)
        keep = select_train.disturbed(s.keys, s.ms, ratio)
        want, why = set(), []
        for i in np.flatnonzero(~keep):
            fast = min(s.ms[j] for j in twins[select_train._twin(s.keys[i])])
            if fast <= near * s.best:
                want.add(i)
                why.append("twin")
        score = None
        if pick is not None:
            chosen = pick(s.problem, list(s.keys))
            score = select_data.score(s, chosen)
            if score < low:
                for k in (chosen.name, s.keys[int(np.argmin(s.ms))].name):
                    i = next(j for j, kk in enumerate(s.keys) if kk.name == k)
                    want.update(twins[select_train._twin(s.keys[i])])
                why.append("low score")
        if not want:
            continue
        names = [s.keys[i].name for i in sorted(want, key=lambda j: s.ms[j])]
        rows.append({"family": s.family, "problem": s.problem.to_dict(), "why": sorted(set(why)),
                     "ranker_score": None if score is None else round(score, 4),
                     "best_ms": round(s.best, 5), "keys": names,
                     "recorded_ms": {s.keys[i].name: round(float(s.ms[i]), 5) for i in sorted(want)}})
    # what matters most first (a re-timing run cut by its budget keeps those): low scores, then the
    # shapes whose flagged kernels' twins are the closest to the best
    rows.sort(key=lambda r: ("low score" not in r["why"], r["ranker_score"] if r["ranker_score"] is not None else 1.0,
                             min(r["recorded_ms"].values()) / r["best_ms"]))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--op", required=True)
    ap.add_argument("--data", nargs="+", help="oracle files (default: benchmarks/results/selection/<op>_sm90.jsonl.gz)")
    ap.add_argument("--ratio", type=float, default=3.0, help="a time this many times its stages-twin's looks disturbed")
    ap.add_argument("--near", type=float, default=1.5, help="...where the twin is within this of the shape's best")
    ap.add_argument("--low", type=float, default=0.5, help="also list shapes whose ranker pick scores below this")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    mgr = get_manager()
    oracle = select_data.load(args.data or [f"benchmarks/results/selection/{args.op}_sm90.jsonl.gz"], mgr)
    h = oracle.header
    op, arch = mgr.op(args.op), mgr.arch(h["arch"])
    model = ranker.model_for(op, arch.name, h.get("backend", "triton"))
    rows = listing(op, arch, oracle, model, args.ratio, args.near, args.low)
    doc = {"op": args.op, "arch": h["arch"], "backend": h.get("backend", "triton"),
           "oracle": {k: h.get(k) for k in ("device", "date", "command")},
           "rule": f"held-out kernels timed > {args.ratio}x their stages-twin where the twin is within "
                   f"{args.near}x of the best; shapes whose ranker pick scores < {args.low}",
           "command": " ".join(["python benchmarks/selection_list_disturbed.py", *(argv or sys.argv[1:])]),
           "rows": rows}
    from ck_core.bench import with_header

    Path(args.out).write_text(json.dumps(with_header(doc), indent=1) + "\n")
    print(f"{len(rows)} held-out shapes, {sum(len(r['keys']) for r in rows)} kernels -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
