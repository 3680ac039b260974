"""First-call latency of NEW shapes through the public APIs, and whether they compiled (GPU).

    python benchmarks/new_shape_latency.py --out OUT.json [--preset NAME]

In a fresh process with an empty kernel cache (``CK_CACHE_DIR`` in a temporary folder,
``CK_KERNEL_SETS=none``): for each op, the shapes of one family (same dtype, head dim / layout /
filter; only sizes change: batch, heads, sequence lengths, M, odd and unit sizes) are called one
after another through ``ck_fmha.attention`` (forward and backward), ``ck_gemm.matmul`` and
``ck_conv.conv2d``.  Per call: wall time of the first call (synchronised), the kernels compiled /
loaded (``triton_artifacts.STATS``), the keys the Dispatcher ran, and the relative error against
torch in float64 (each call's output checked: an unspecialised kernel must stay correct).  With
kernels specialised on sizes, every new shape of a known key compiled again (seconds); now a
new shape of a key already loaded compiles nothing.  ``--preset NAME``: run
``ck build --preset NAME`` into the empty cache first (reported: its time), then the calls.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default=None)
    ap.add_argument("--arch", default="sm90", help="--preset: the arch to build it for (the device's)")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of this script (TRITON_INTERPRET=1, tiny shapes)")
    a = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="ck-new-shape-")
    os.environ["CK_CACHE_DIR"] = tmp
    os.environ["CK_KERNEL_SETS"] = "none"

    import torch

    import ck_conv
    import ck_fmha
    import ck_gemm
    from ck_core.backends import triton_artifacts as ta
    from ck_core.plugins import get_manager

    from ck_core.hookspecs import hookimpl

    runs = []

    class _Log:   # the kernels each call launched
        @hookimpl
        def ck_after_run(self, launched):
            runs.append(list(launched))

    get_manager().pm.register(_Log(), name="new-shape-latency-log")

    dev = a.device
    small = dev == "cpu"
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    out = {"device": torch.cuda.get_device_name() if dev == "cuda" else dev, "rows": []}
    if a.preset:
        from ck_core import presets

        t0 = time.perf_counter()
        rep, sel, keys = presets.build(a.preset, a.arch)
        out["preset"] = {"name": a.preset, "keys": len(keys), "seconds": round(time.perf_counter() - t0, 1),
                         "failed": len(rep.failed)}
    g = torch.Generator(device=dev).manual_seed(1234)

    def timed(name, fn, ref):
        before = dict(ta.STATS)
        n_runs = len(runs)
        sync()
        t0 = time.perf_counter()
        got = fn()
        sync()
        secs = time.perf_counter() - t0
        err = _rel(got, ref()) if ref is not None else None
        row = {"call": name, "first_call_s": round(secs, 4), "rel_err": err,
               "compiled": ta.STATS["compiled"] - before["compiled"], "loaded": ta.STATS["loaded"] - before["loaded"],
               "keys": [k for r in runs[n_runs:] for k in r]}
        out["rows"].append(row)
        print(json.dumps(row), flush=True)

    # attention: fp16, head dim 64, causal; only sizes change (odd lengths, one head, batch 1, GQA)
    shapes = ((1, 2, 2, 40), (1, 1, 1, 17)) if small else (
        (2, 16, 16, 1024), (1, 8, 8, 1000), (3, 1, 1, 77), (4, 32, 8, 2048), (1, 16, 16, 4097), (5, 12, 12, 333))
    for b, hq, hk, s in shapes:
        q = torch.randn(b, hq, s, 64, device=dev, dtype=torch.float16, generator=g, requires_grad=True)
        k = torch.randn(b, hk, s, 64, device=dev, dtype=torch.float16, generator=g, requires_grad=True)
        v = torch.randn(b, hk, s, 64, device=dev, dtype=torch.float16, generator=g, requires_grad=True)
        do = torch.randn(b, hq, s, 64, device=dev, dtype=torch.float16, generator=g)

        def ref_o(q=q, k=k, v=v, hq=hq, hk=hk):
            kk, vv = (x.detach().double().repeat_interleave(hq // hk, dim=1) for x in (k, v))
            return torch.nn.functional.scaled_dot_product_attention(q.detach().double(), kk, vv, is_causal=True)

        holder = {}

        def fwd(q=q, k=k, v=v):
            holder["o"] = ck_fmha.attention(q, k, v, causal=True)
            return holder["o"].detach()

        timed(f"attention fwd b{b} h{hq}/{hk} s{s} d64 causal", fwd, ref_o)

        def bwd(q=q, do=do):
            holder["o"].backward(do)
            return q.grad.detach()

        def ref_dq(q=q, k=k, v=v, do=do, hq=hq, hk=hk):
            qq = q.detach().double().requires_grad_(True)
            kk, vv = (x.detach().double().repeat_interleave(hq // hk, dim=1) for x in (k, v))
            torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, is_causal=True).backward(do.double())
            return qq.grad

        timed(f"attention bwd b{b} h{hq}/{hk} s{s} d64 causal", bwd, ref_dq)

    # GEMM: bf16 x @ W^T (rcr), N and K of a model; M token counts (1, odd, large)
    nk = 64 if small else 4096
    gdt = torch.float16 if small else torch.bfloat16   # (the CPU interpreter computes bf16 dots wrongly)
    w = torch.randn(nk, nk, device=dev, dtype=gdt, generator=g) / 64
    for m in ((16, 1, 7) if small else (512, 1, 7, 1000, 4096, 333)):
        x = torch.randn(m, nk, device=dev, dtype=gdt, generator=g)
        timed(f"matmul {gdt} rcr {m}x{nk}x{nk}", lambda x=x: ck_gemm.matmul(x, w.t()),
              lambda x=x: x.double() @ w.double().t())

    # conv: fp16 channels-last 3x3 pad 1, 64 -> 64 channels; batch and image size change
    wc = torch.randn(64, 64, 3, 3, device=dev, dtype=torch.float16, generator=g) / 24
    for n, hw in (((1, 5), (1, 6)) if small else ((8, 56), (1, 57), (3, 28), (16, 14), (2, 100))):
        x = torch.randn(n, 64, hw, hw, device=dev, dtype=torch.float16, generator=g).to(memory_format=torch.channels_last)
        timed(f"conv2d fp16 N{n} 64->64 {hw}x{hw} 3x3", lambda x=x: ck_conv.conv2d(x, wc, padding=1),
              lambda x=x: torch.nn.functional.conv2d(x.double(), wc.double(), padding=1))

    out["stats"] = dict(ta.STATS)
    from ck_core.bench import with_header   # the results header (schema, device, date, command, commit)

    out.pop("commit", None)
    out = with_header(out, out.get("command"), out.get("device"))
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
