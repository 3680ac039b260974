"""GPU check of one compiled FMHA kernel per padded head dim (issue #27): speed and compiles per head dim.

For head dims that fill their padded blocks (64, 128: compiled with the head dim a constant, as before)
and head dims inside a padded block (40, 56, 80, 96, 112: one kernel per padded class and alignment, the
head dim a run-time argument), FlashAttention's layout (bshd), bf16, causal: the forward and the
forward+backward of ``ck_fmha.flash_attn.flash_attn_func`` against torch's SDPA (same inputs, same
process, CUDA events), checked first against float64 torch; and per head dim the kernels compiled and
loaded (``ck_core.backends.triton_artifacts.STATS``: a head dim of a class already compiled should load
its kernels, ``compiled`` 0, where the Dispatcher picks the same tiles).  Run it on the commit before
and after to compare the ratios (timings differ between machines; ratios within a run compare).

    python benchmarks/fmha_hdim_check.py --out hdim.json [--dims 112 40 56 128 64 96 80] [--budget-s 75]
    python benchmarks/fmha_hdim_check.py --out x.json --dry-run    # tiny shapes on the CPU (interpreter)
"""
from __future__ import annotations

import argparse
import json
import time
import traceback


def _rel(a, b) -> float:
    return float((a.detach().double() - b.detach().double()).norm() / max(b.detach().double().norm(), 1e-30))


DEV = "cuda"
DTYPE = "bfloat16"


def _time(fn, reps: int) -> float:
    import torch

    if DEV != "cuda":   # (--dry-run: wall time on the CPU)
        fn()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) * 1e6 / reps
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps   # us


def one(d: int, b: int, s: int, h: int, reps: int) -> dict:
    import torch
    import torch.nn.functional as F

    from ck_core.backends import triton_artifacts as ta
    from ck_fmha.flash_attn import flash_attn_func

    g = torch.Generator(device=DEV).manual_seed(1000 + d)
    dt = getattr(torch, DTYPE)
    q, k, v = (torch.randn(b, s, h, d, device=DEV, dtype=dt, generator=g).requires_grad_() for _ in range(3))
    do = torch.randn(b, s, h, d, device=DEV, dtype=dt, generator=g)
    before = dict(ta.STATS)
    t0 = time.perf_counter()
    o = flash_attn_func(q, k, v, causal=True)
    o.backward(do)
    if DEV == "cuda":
        torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    stats = {n: ta.STATS[n] - before.get(n, 0) for n in ("compiled", "loaded", "memory")}
    # check: float64 torch (bhsd), causal top-left (square)
    qd, kd, vd = (x.detach().double().transpose(1, 2).requires_grad_() for x in (q, k, v))
    ref = F.scaled_dot_product_attention(qd, kd, vd, is_causal=True)
    ref.backward(do.double().transpose(1, 2))
    err = {"o": _rel(o.transpose(1, 2), ref), "dq": _rel(q.grad.transpose(1, 2), qd.grad),
           "dk": _rel(k.grad.transpose(1, 2), kd.grad), "dv": _rel(v.grad.transpose(1, 2), vd.grad)}
    del qd, kd, vd, ref
    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
    dot = do.transpose(1, 2)

    def ours_f():
        with torch.no_grad():
            flash_attn_func(q, k, v, causal=True)

    def ours_fb():
        flash_attn_func(q, k, v, causal=True).backward(do)

    def sdpa_f():
        with torch.no_grad():
            F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)

    def sdpa_fb():
        F.scaled_dot_product_attention(qt, kt, vt, is_causal=True).backward(dot)

    row = {"d": d, "shape_bshd": [b, s, h, d], "first_call_s": round(first_s, 2), "kernels": stats,
           "rel_err": {n: round(x, 5) for n, x in err.items()}, "ok": all(x < 2e-2 for x in err.values())}
    for name, ours, peer in (("fwd", ours_f, sdpa_f), ("fwd_bwd", ours_fb, sdpa_fb)):
        t_o, t_p = _time(ours, reps), _time(peer, reps)
        row[name] = {"ours_us": round(t_o, 1), "sdpa_us": round(t_p, 1), "sdpa_over_ours": round(t_p / t_o, 3)}
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dims", type=int, nargs="+", default=[112, 40, 56, 128, 64, 96, 80])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seqlen", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=75.0, help="start no head dim after this (under 2 minutes)")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (TRITON_INTERPRET=1)")
    a = ap.parse_args(argv)
    global DEV, DTYPE
    if a.dry_run:
        import os

        os.environ["TRITON_INTERPRET"] = "1"
        os.environ.setdefault("CK_BACKEND", "triton")
        DEV, DTYPE, a.batch, a.seqlen, a.heads, a.reps = "cpu", "float16", 1, 33, 2, 1   # (bf16: GPU only)
        a.dims = a.dims if a.dims != ap.get_default("dims") else [40, 56, 64]
    import torch

    from ck_core.bench import with_header

    t0 = time.time()
    rows, skipped = [], []
    for d in a.dims:
        if time.time() - t0 > a.budget_s:
            skipped.append(d)
            continue
        try:
            rows.append(one(d, a.batch, a.seqlen, a.heads, a.reps))
        except Exception as exc:  # noqa: BLE001 - reported per head dim
            rows.append({"d": d, "error": f"{type(exc).__name__}: {exc}"[:600],
                         "traceback": traceback.format_exc()[-2000:]})
        print(json.dumps(rows[-1]), flush=True)
    res = {"what": "fwd and fwd+bwd of flash_attn_func (bf16, bshd, causal) per head dim vs SDPA; kernels "
                   "compiled/loaded per head dim (one kernel per padded head dim class, issue #27)",
           "rows": rows, "skipped_for_budget": skipped, "seconds": round(time.time() - t0, 1)}
    with open(a.out, "w") as f:
        json.dump(with_header(res, device=torch.cuda.get_device_name() if DEV == "cuda" else "CPU (interpreter)"),
                  f, indent=1)
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
