"""23 -- several registries side by side: forward (fwd + split-KV), KV-cache (paged, append-KV,
batch prefill) and training (the three backward families); each problem goes to the registry of its
family, and the merged registry answers everything.

    python examples/fmha/23_multi_registry.py [--backend numpy|triton]
(The CK dispatcher's python/09_multi_registry.py.)
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

from ck_core import Dispatcher  # noqa: E402
from ck_fmha.problem import FmhaProblem  # noqa: E402

args, disp = _fmha.setup(__doc__)
GROUPS = {"forward": ("fwd", "fwd_splitkv", "fwd_splitkv_combine"),
          "kvcache": ("fwd_pagedkv", "fwd_appendkv", "batch_prefill"),
          "training": ("bwd_dot_do_o", "bwd_dq_dk_dv", "bwd_convert_dq")}
regs = {}
for name, fams in GROUPS.items():
    regs[name] = disp.registry.filter(lambda f, fams=fams: f["family"] in fams)
    regs[name].name = name
merged = regs["forward"].merge(regs["kvcache"]).merge(regs["training"])
print(", ".join(f"{n}: {len(r)}" for n, r in regs.items()) + f"; merged: {len(merged)}")
DISP = {n: Dispatcher(r, backend=args.backend) for n, r in regs.items()}


def pick(p) -> str:
    return next(n for n, fams in GROUPS.items() if p.family in fams)


B = _fmha.sizes(args, dict(batch=2, nhead_q=4, hdim_q=128), dict(batch=4, nhead_q=16, hdim_q=128))
L = _fmha.sizes(args, 40, 1024)
problems = [FmhaProblem(seqlen_q=L, seqlen_k=L, mask="b", **B),
            FmhaProblem(family="fwd_splitkv", num_splits=2, seqlen_q=1, seqlen_k=4 * L, **B),
            FmhaProblem(family="fwd_pagedkv", paged_kv=True, page_size=16, seqlen_q=1, seqlen_k=4 * L,
                        seqlens_k=(L,) * B["batch"], **B),
            FmhaProblem(family="bwd_dq_dk_dv", seqlen_q=L, seqlen_k=L, **B)]
ok = True
for p in problems:
    name = pick(p)
    ok &= ex.check(DISP[name], p, args.rng, label=f"{name} registry: {p.family}")
    ok &= {st.key.name for st in DISP[name].plan(p).stages} <= {k.name for k in merged}
ex.finish(ok)
