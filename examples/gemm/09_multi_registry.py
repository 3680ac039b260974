"""09 -- several registries side by side: compute- and latency-oriented, picked per problem.

    python examples/gemm/09_multi_registry.py [--backend numpy|triton]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common as ex  # noqa: E402

from ck_core import Dispatcher, Registry  # noqa: E402
from ck_gemm import GemmProblem  # noqa: E402

args = ex.parse_args(__doc__)
base = Registry.from_enumeration("gemm", args.arch, args.backend, dtypes=["fp16", "bf16"], layouts=["rcr"])
compute = base.filter("c.tile_m >= 128 and c.tile_n >= 128")
compute.name = "compute"
latency = base.filter("c.tile_m <= 64")
latency.name = "latency"
both = compute.merge(latency)
dispatchers = {r.name: Dispatcher(r, backend=args.backend) for r in (compute, latency)}
print(f"compute: {len(compute)} kernels, latency: {len(latency)} kernels, merged: {len(both)}")


def pick(p) -> Dispatcher:
    """Latency registry for small outputs, compute registry otherwise."""
    return dispatchers["latency" if p.m * p.n <= 128 * 128 else "compute"]


ok = True
for m, n, k, dt in [(64, 96, 80, "fp16"), (512, 384, 128, "bf16"), (100, 30, 50, "bf16")]:
    p = GemmProblem(m=m, n=n, k=k, dtype=dt, layout="rcr")
    disp = pick(p)
    ok &= ex.check(disp, p, args.rng, label=f"{disp.registry.name} {dt} {m}x{n}x{k}")
ex.finish(ok)
