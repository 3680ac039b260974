"""21 -- stress test: many distinct forward kernels (tiles, pipelines, masks, bias, LSE, dropout,
group mode), each alone in a registry so that exactly it runs, each validated with its own seed.

    python examples/fmha/21_stress_test.py [--backend numpy|triton] [--kernels 24]
(The CK dispatcher's python/07_stress_test.py.)
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

import itertools  # noqa: E402

import numpy as np  # noqa: E402

from ck_core.errors import CkError  # noqa: E402
from ck_fmha.problem import FmhaProblem  # noqa: E402

args, disp = _fmha.setup(__doc__, lambda p: p.add_argument("--kernels", type=int, default=24))
S = _fmha.sizes(args, dict(batch=2, nhead_q=2, seqlen_q=23, seqlen_k=41),
                dict(batch=2, nhead_q=8, seqlen_q=500, seqlen_k=700))
grid = itertools.product(("fp16", "bf16"), (64, 128, 32, 256), ("none", "t", "b:8,0"),
                         ("none", "alibi", "elementwise"), (False, True), (0.0, 0.2))
used, failed, n = set(), 0, 0
for i, (dtype, hdim, mask, bias, lse, p_drop) in enumerate(grid):
    if n == args.kernels:
        break
    p = FmhaProblem(dtype=dtype, hdim_q=hdim, mask=mask, bias=bias, lse=lse, p_drop=p_drop, seed=i, **S)
    try:
        fresh = [k for k in disp.rank(p) if k.name not in used]
    except CkError as e:  # a feature this arch/backend has no kernel for: skip the point, say so
        print(f"skip {dtype} d{hdim} mask={mask} bias={bias}: {type(e).__name__}")
        continue
    if not fresh:
        continue
    key = fresh[0]
    used.add(key.name)
    n += 1
    good = ex.check(_fmha.alone(key, args, f"k{n}"), p, np.random.default_rng(1000 + i),
                    label=f"{n:2d} {dtype} d{hdim} mask={mask} bias={bias} lse={lse} drop={p_drop}",
                    show_plan=False)
    print(f"    {key.name[:110]}")
    failed += not good
print(f"{n - failed}/{n} kernels passed")
ex.finish(failed == 0 and n > 0)
