"""Host cost of the first call of a NEW shape in a warm process, measured on the CPU (no GPU).

    python benchmarks/first_call_host.py [--shapes 40] [--seed 0] [--out OUT.json]

FlashAttention's public functions (ck_fmha.flash_attn) run their GPU path on meta tensors as on an
sm90 GPU (benchmarks/fa_trace.py's set-up): the Problem, selection, the plan, the launchers'
argument work and each launch's specialisation (Triton's binder under the kernels' policy, the
in-process lookup of the loaded kernel) run; the kernel launch itself and a kernel's first load
from the cache (once per specialisation per process) do not.  Each family (dtype, head dim, mask,
ALiBi, dropout, GQA) is warmed with one shape, then called with new batch sizes and lengths: the
wall and thread-CPU time of that first forward and of its backward.  The target (issue #27): a new
shape costs <= 5 ms over a warm call, of which selection <= 1 ms (benchmarks/select_time.py fmha).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _setup():
    sys.path.insert(0, HERE)
    import fa_trace

    fa_trace._env()
    from triton.backends.compiler import GPUTarget

    from ck_core import device as ck_device
    from ck_core.backends import triton_artifacts as ta
    from ck_core.backends import triton_backend

    target = GPUTarget("cuda", 90, 32)
    ta.current_target = lambda: target
    triton_backend._device_target = lambda: ("cuda", 90)
    real = ck_device.device_target
    ck_device.device_target = lambda d: ("cuda", 90) if getattr(d, "type", str(d)) == "meta" else real(d)
    loaded = {}

    def launch(name, fn, grid, args, kwargs, cache_root=None, extra=None):
        """kernel_for_call up to the launch: the binder always, the specialisation's material on a miss."""
        kw = ta._jit_kwargs(fn, kwargs, extra)
        bound, spec, opts = ta._bind(fn, target, args, kw)
        memo = (name, fn, str(spec), str(opts))
        if memo not in loaded:
            loaded[memo] = ta.specialise(fn, args, kwargs, target, extra)
        return None

    ta.launch = launch
    return loaded


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", type=int, default=40, help="new shapes per family")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    loaded = _setup()
    import torch

    from ck_fmha.flash_attn import flash_attn_func

    rng = random.Random(a.seed)
    families = [(torch.bfloat16, 128, True, False, 0.0, 8), (torch.float16, 64, False, False, 0.0, 8),
                (torch.bfloat16, 96, True, True, 0.0, 2), (torch.float16, 59, False, False, 0.17, 8),
                (torch.bfloat16, 256, True, False, 0.0, 1)]

    def call(dt, d, causal, alibi, p, hk, b, sq, sk):
        q = torch.empty(b, sq, 8, d, dtype=dt, device="meta", requires_grad=True)
        k = torch.empty(b, sk, hk, d, dtype=dt, device="meta", requires_grad=True)
        v = torch.empty(b, sk, hk, d, dtype=dt, device="meta", requires_grad=True)
        slopes = torch.empty(b, 8, dtype=torch.float32, device="meta") if alibi else None
        t0, c0 = time.perf_counter(), time.thread_time()
        o = flash_attn_func(q, k, v, p, causal=causal, alibi_slopes=slopes)
        t1, c1 = time.perf_counter(), time.thread_time()
        torch.autograd.grad(o, (q, k, v), torch.empty_like(o))
        t2, c2 = time.perf_counter(), time.thread_time()
        return (t1 - t0, c1 - c0, t2 - t1, c2 - c1)

    rows = []
    for fam in families:
        call(*fam, 2, 1000, 1000)             # the family warm: registry, keys, kernels
        warm = [call(*fam, 2, 1000, 1000) for _ in range(3)]
        for _ in range(a.shapes):
            b, sq, sk = rng.randint(1, 16), rng.randint(1, 4096), rng.randint(1, 4096)
            if fam[2] and sq > sk:
                sq, sk = sk, sq
            new = call(*fam, b, sq, sk)
            rows.append({"family": f"{str(fam[0])[6:]} d{fam[1]} {'causal' if fam[2] else 'full'}"
                                   f"{' alibi' if fam[3] else ''}{' dropout' if fam[4] else ''} hk{fam[5]}",
                         "shape": [b, sq, sk], "fwd_ms": new[0] * 1e3, "fwd_cpu_ms": new[1] * 1e3,
                         "bwd_ms": new[2] * 1e3, "bwd_cpu_ms": new[3] * 1e3,
                         "warm_fwd_cpu_ms": min(w[1] for w in warm) * 1e3,
                         "warm_bwd_cpu_ms": min(w[3] for w in warm) * 1e3})

    def stats(key):
        xs = sorted(r[key] for r in rows)
        return {"median": round(statistics.median(xs), 3), "p90": round(xs[int(0.9 * len(xs))], 3),
                "max": round(xs[-1], 3)}

    res = {"what": "first call of a new shape of a warm family through flash_attn_func on meta tensors "
                   "(sm90 path, launches specialised not run): host ms, wall and thread CPU",
           "shapes": len(rows), "fwd_ms": stats("fwd_ms"), "fwd_cpu_ms": stats("fwd_cpu_ms"),
           "bwd_ms": stats("bwd_ms"), "bwd_cpu_ms": stats("bwd_cpu_ms"),
           "warm_fwd_cpu_ms": stats("warm_fwd_cpu_ms"), "warm_bwd_cpu_ms": stats("warm_bwd_cpu_ms"),
           "specialisations": len(loaded), "rows": rows}
    print(json.dumps({k: v for k, v in res.items() if k != "rows"}, indent=1))
    if a.out:
        from ck_core.bench import with_header

        with open(a.out, "w") as f:
            json.dump(with_header(res, device="CPU (host path on meta tensors; no kernel runs)"), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
