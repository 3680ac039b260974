"""05 -- dropout: Philox dropout (seed, offset), the stored random values, reproducibility.

    python examples/fmha/05_dropout.py [--backend numpy|triton]
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

import attrs  # noqa: E402
import numpy as np  # noqa: E402

from ck_fmha.problem import FmhaProblem  # noqa: E402

args, disp = _fmha.setup(__doc__)
B = _fmha.sizes(args, dict(batch=2, nhead_q=4, seqlen_q=33, seqlen_k=47, hdim_q=64),
                dict(batch=4, nhead_q=16, seqlen_q=1024, seqlen_k=1024, hdim_q=128))
ok = True
for p_drop in (0.1, 0.5):
    ok &= _fmha.run(disp, args, f"dropout p={p_drop}", p_drop=p_drop, seed=1234, offset=7, store_randval=True,
                    dtype="fp16", **B)
# the same seed and offset drop the same elements; another seed drops others
p = FmhaProblem(p_drop=0.3, seed=99, offset=0, dtype="fp16", **B)
op, bk = disp.mgr.op("fmha"), disp.backend_spec
x = {k: bk.to_backend(v) for k, v in op.make_inputs(p, args.rng).items()}
o1, o2 = (bk.to_numpy(disp.run_dict(p, x)["o"]) for _ in range(2))
o3 = bk.to_numpy(disp.run_dict(attrs.evolve(p, seed=100), x)["o"])
same, differs = np.array_equal(o1, o2), not np.array_equal(o1, o3)
print(f"same seed twice: identical={same}; another seed: differs={differs}")
ex.finish(ok and same and differs)
