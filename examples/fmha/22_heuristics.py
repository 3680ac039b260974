"""22 -- heuristic strategies: kernel pools by tile height (small tiles for decode-like problems, large
for long prefills) chosen per problem, next to the built-in heuristic over the whole space.

    python examples/fmha/22_heuristics.py [--backend numpy|triton]
(The CK dispatcher's python/08_heuristics.py.)
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

from ck_core import Dispatcher  # noqa: E402
from ck_fmha.problem import FmhaProblem  # noqa: E402

args, disp = _fmha.setup(__doc__)
full = disp.registry.filter(lambda f: f["family"] == "fwd")
tiles = sorted({_fmha.tile_m(k.fields) for k in full})
POOLS = {"small_tiles": full.filter(lambda f: _fmha.tile_m(f) == tiles[0]),
         "large_tiles": full.filter(lambda f: _fmha.tile_m(f) == tiles[-1])}
for name, pool in POOLS.items():
    print(f"pool {name}: {len(pool)} kernels")
DISP = {name: Dispatcher(pool, backend=args.backend) for name, pool in POOLS.items()}


def by_length(p):
    """Few query rows (decode, short prompts): small tiles waste less; long prefills: large tiles."""
    return "small_tiles" if p.seqlen_q <= tiles[0] else "large_tiles"


problems = ([FmhaProblem(batch=8, nhead_q=32, seqlen_q=1, seqlen_k=4096, hdim_q=128),
             FmhaProblem(batch=4, nhead_q=16, seqlen_q=2048, seqlen_k=2048, hdim_q=128, mask="b")]
            if args.gpu else
            [FmhaProblem(batch=2, nhead_q=4, seqlen_q=1, seqlen_k=77, hdim_q=128),
             FmhaProblem(batch=2, nhead_q=4, seqlen_q=150, seqlen_k=150, hdim_q=128, mask="b")])
ok = True
for p in problems:
    pool = by_length(p)
    ok &= ex.check(DISP[pool], p, args.rng, label=f"by_length -> {pool}: Sq={p.seqlen_q} Sk={p.seqlen_k}",
                   show_plan=False)
    print(f"    picked {DISP[pool].select(p).name[:100]}")
    ok &= ex.check(disp, p, args.rng, label=f"built-in heuristic: Sq={p.seqlen_q} Sk={p.seqlen_k}",
                   show_plan=False)
    print(f"    picked {disp.select(p).name[:100]}")
if len(tiles) == 1:   # e.g. gfx1100: CK's receipt 0 has one tile height there
    print(f"note: {args.arch} has one tile height ({tiles[0]}): both pools hold the same kernels")
ex.finish(ok and (len(tiles) > 1 or args.arch != ex.CPU_ARCH))
