"""The recorded oracle against the peer library timed with it (conv: cuDNN), per direction.

    python benchmarks/selection_peer.py benchmarks/results/selection/conv_sm90.jsonl.gz --json OUT

For every shape with a peer time: the peer's time over our best measured kernel (the oracle:
what perfect selection among the shortlist reaches), over the old heuristic's pick and over the
shipped ranker's pick (>1: ours is faster).  Geomeans per direction and network, and the worst
shapes: the kernel holes no selection can close.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from pathlib import Path

import numpy as np


def _rows(path: Path) -> dict:
    """{problem json: peer ms} of an oracle file's rows."""
    raw = path.read_bytes()
    text = gzip.decompress(raw).decode() if path.suffix == ".gz" else raw.decode()
    out = {}
    for line in text.splitlines():
        rec = json.loads(line) if line.strip() else {}
        if "times" in rec and rec.get("peer_ms"):
            out[json.dumps(rec["problem"], sort_keys=True)] = rec["peer_ms"]
    return out


def _geo(v) -> float | None:
    v = [x for x in v if x and math.isfinite(x) and x > 0]
    return round(float(np.exp(np.mean(np.log(v)))), 4) if v else None


def report(path: Path, worst: int = 12) -> dict:
    from ck_core import ranker, select_data
    from ck_core.plugins import get_manager

    mgr = get_manager()
    oracle = select_data.load(path, mgr)
    op, arch = mgr.op(oracle.header["op"]), mgr.arch(oracle.header["arch"])
    peer = _rows(path)
    model = ranker.model_for(op, arch.name, oracle.header.get("backend", "triton"))
    pick_r = select_data.ranker_selector(model, op, arch) if model else None
    pick_h = select_data.heuristic_selector(op, arch)
    rows = []
    for s in oracle.shapes:
        pm = peer.get(json.dumps(s.problem.to_dict(), sort_keys=True))
        if not pm:
            continue
        p = s.problem
        row = {"family": s.family, "split": s.split, "direction": getattr(p, "direction", "?"),
               "case": f"N{p.N} G{p.G} C{p.C} K{p.K} {'x'.join(map(str, p.input_spatial))} "
                       f"f{'x'.join(map(str, p.filter))} s{'x'.join(map(str, p.stride))} {p.dtype}",
               "peer_ms": pm, "best_ms": s.best, "oracle": pm / s.best,
               "heuristic": pm * select_data.score(s, pick_h(p, list(s.keys))) / s.best}
        if pick_r:
            row["ranker"] = pm * select_data.score(s, pick_r(p, list(s.keys))) / s.best
        rows.append(row)
    summary = {}
    for d in ("forward", "bwd_data", "bwd_weight", "all"):
        for split in ("all", "heldout"):
            rs = [r for r in rows if d in ("all", r["direction"]) and split in ("all", r["split"])]
            summary[f"{d}/{split}"] = {"n": len(rs), **{k: _geo(r.get(k) for r in rs)
                                                        for k in ("oracle", "heuristic", "ranker")},
                                       "oracle_min": round(min((r["oracle"] for r in rs), default=0), 4),
                                       "below_0.5": sum(r["oracle"] < 0.5 for r in rs)}
    nets = sorted({r["family"].split(":")[0] for r in rows})
    by_net = {f"{n}/{d}": _geo(r["oracle"] for r in rows if r["family"] == f"{n}:{d}")
              for n in nets for d in ("forward", "bwd_data", "bwd_weight")}
    worst_rows = sorted(rows, key=lambda r: r["oracle"])[:worst]
    return {"op": op.name, "device": oracle.header.get("device"), "date": oracle.header.get("date"),
            "peer": oracle.header.get("peer"), "ratio": "peer time / ours (>1: ours faster)",
            "shapes": len(rows), "summary": summary, "oracle_by_net": {k: v for k, v in by_net.items() if v},
            "worst_oracle": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
                             for r in worst_rows]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data")
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--worst", type=int, default=12)
    a = ap.parse_args(argv)
    res = report(Path(a.data), a.worst)
    if a.json:
        from ck_core.bench import with_header

        Path(a.json).write_text(json.dumps(with_header(res), indent=1) + "\n")
    print(json.dumps(res["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
