"""Selection time of fresh conv problems through the public API's Dispatcher (CPU), and their shortlists.

    TRITON_INTERPRET=1 python benchmarks/conv_select_fresh.py bwd_weight [--shortlists out.json]

40 random layers of one direction from the recorded conv oracle; each signature's registry and
each layer are selected once first, then the same layers with a batch never seen (N + 3) are
timed: the cost of a new problem of a known signature.  ``--shortlists`` writes each timed
problem's shortlist and pick (compare two versions' files: a speed-up must not change them).
"""
import argparse
import json
import random
import statistics
import time
from pathlib import Path

import attrs

from ck_core import select_data
from ck_core.api import dispatcher_for
from ck_core.plugins import get_manager

DATA = Path(__file__).resolve().parent / "results" / "selection" / "conv_sm90.jsonl.gz"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("direction", choices=("forward", "bwd_data", "bwd_weight"))
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--shortlists", metavar="JSON")
    args = ap.parse_args(argv)
    mgr = get_manager()
    oracle = select_data.load(DATA, mgr)
    probs = [s.problem for s in oracle.shapes if s.problem.direction == args.direction]
    random.Random(args.seed).shuffle(probs)
    probs = probs[:args.layers]

    def disp(p):
        return dispatcher_for("conv", "sm90", "triton", directions=(p.direction,), dtypes=(p.dtype,),
                              ndims=(p.ndim,), layouts=(p.layout_family,))
    for p in probs:
        disp(p).select(p)
    fresh = [attrs.evolve(p, N=p.N + 3) for p in probs]
    times = []
    for p in fresh:
        d = disp(p)
        t = time.perf_counter()
        d.select(p)
        times.append(time.perf_counter() - t)
    print(f"{args.direction}: median {statistics.median(times) * 1e3:.3f} ms, mean {statistics.mean(times) * 1e3:.3f} ms "
          f"over {len(fresh)} new problems")
    if args.shortlists:
        op = mgr.op("conv")
        out = {repr(p): {"shortlist": [k.name for k in disp(p)._shortlist(p, op)], "pick": disp(p).select(p).name}
               for p in fresh}
        Path(args.shortlists).write_text(json.dumps(out, indent=0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
