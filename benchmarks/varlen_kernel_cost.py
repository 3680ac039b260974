"""Device time of the group-mode (varlen) kernels, for comparing two checkouts (issue #26, session 11: the
kernels now check ``cu_seqlens`` themselves -- every program scans all the offsets before its work -- in
place of the guard and poisoning launches; this measures what that scan costs the kernels).

Times the launchers directly (``ops.fwd`` / ``ops_bwd.bwd`` with fixed Triton configs and device offsets
passed as the Dispatcher passes run-time ones, ``_trusted_varlen=True``), so that both trees run the same
tiles and only the kernels differ: the old tree's kernels read the offsets unchecked, the new ones check
them.  Many short sequences are where a per-program scan weighs most.  bf16, H=16, D=128, CUDA events
(``triton.testing.do_bench``, median).  Under 2 minutes on an H200 for both trees::

    git worktree add --detach /tmp/old 711f99a &&
      python3 benchmarks/varlen_kernel_cost.py --out new.json &&
      python3 benchmarks/varlen_kernel_cost.py --tree /tmp/old --out old.json

``--cpu`` runs a tiny case in the Triton interpreter (a smoke test of the script, no timing meaning).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: (sequences, length of each, causal)
CASES = [(512, 128, False), (512, 128, True), (64, 1024, False), (64, 1024, True), (8, 4096, True)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tree", default=None, help="another checkout's packages (e.g. `git worktree add /tmp/old REV`)")
    ap.add_argument("--cpu", action="store_true", help="a tiny case in the interpreter (smoke test)")
    a = ap.parse_args()
    tree = Path(a.tree).resolve() if a.tree else ROOT
    sys.path[:0] = [str(tree), *(str(tree / "plugins" / op) for op in ("gemm", "conv", "fmha")),
                    *sorted(str(d) for d in (tree / "archs").glob("*") if d.is_dir())]
    if a.cpu:
        import os

        os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import triton

    from ck_fmha.backends.triton import TritonFmhaConfig
    from ck_fmha.backends.triton import launch as ops
    from ck_fmha.backends.triton import launch_bwd as ops_bwd

    dev = "cpu" if a.cpu else "cuda"
    h, d = (2, 16) if a.cpu else (16, 128)
    cases = [(3, 17, True)] if a.cpu else CASES
    fcfg = TritonFmhaConfig(16, 16, 4, 1) if a.cpu else TritonFmhaConfig(128, 64, 8, 2)
    bcfg = (TritonFmhaConfig(16, 16, 4, 1),) * 2 if a.cpu else (TritonFmhaConfig(64, 128, 8, 3),
                                                                TritonFmhaConfig(128, 64, 8, 3))
    rows = []
    for n, s, causal in cases:
        g = torch.Generator(device=dev).manual_seed(n * 7 + s)
        total = n * s
        q, k, v, do = (torch.randn(total, h, d, device=dev, generator=g).to(torch.bfloat16) for _ in range(4))
        cu = torch.arange(0, total + 1, s, dtype=torch.int32, device=dev)
        kw = dict(layout="thd", cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=s, max_seqlen_k=s,
                  causal="bottom_right" if causal else False, _trusted_varlen=True)

        def fwd():
            return ops.fwd(q, k, v, config=fcfg, return_lse=True, **kw)

        o, lse = fwd()

        def bwd():
            return ops_bwd.bwd(q, k, v, o, lse, do, config=bcfg, deterministic=False, **kw)

        bwd()
        if a.cpu:
            fwd_ms = bwd_ms = float("nan")
        else:
            fwd_ms = triton.testing.do_bench(fwd, warmup=25, rep=200, return_mode="median")
            bwd_ms = triton.testing.do_bench(bwd, warmup=10, rep=200, return_mode="median")
        flops = 4 * n * s * s * h * d * (0.5 if causal else 1.0)
        rows.append(dict(case=f"n{n} s{s} h{h} d{d} {'causal' if causal else 'full'}", fwd_ms=fwd_ms, bwd_ms=bwd_ms,
                         fwd_tflops=flops / fwd_ms / 1e9 if fwd_ms == fwd_ms else None,
                         finite=bool(torch.isfinite(o).all())))
        print(rows[-1], flush=True)
    res = dict(command=" ".join(sys.argv), tree=str(tree), launcher=ops.__file__, device=torch.cuda.get_device_name() if dev == "cuda"
               else "cpu (interpreter)", torch=torch.__version__, triton=triton.__version__, rows=rows)
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
