"""Probe the stream-K GEMM kernels (``tma_streamk``, ``streamk``) against cuBLAS and against the
registry's best data-parallel / split-K kernels, on the shapes where the broad suite and the
selection oracle lose most (LLM layers at M ~ 18..900, N 4096..57344), a few controls, and fp8
against ``torch._scaled_mm``.

    PYTHONPATH=plugins/gemm:archs/sm90:. python3 benchmarks/gemm_streamk_probe.py --out $OUT/probe_gemmk.json

(from the root of a checkout of this branch: the PYTHONPATH puts its ck_core, ck_gemm and sm90 arch
plugin, with the stream-K keys, before whatever is installed).

Timing as `ck bench gemm` does it: CUDA-graph replays (triton.testing.do_bench_cudagraph,
median), ours and the peer on the same tensors in the same process; every config is checked
against an fp32 product first (a wrong row is reported, never timed).  Kernels are compiled
by the JIT on first use: each config compiles once per dtype (M, N, K are runtime arguments), so
the whole probe compiles about 20 kernels.  ``--budget-s`` skips what is left once it is spent;
the JSON is rewritten after every row, so a cut run still leaves its numbers.  Sized for about 5.5
minutes on one H100.
"""
import argparse
import json
import math
import sys
import time

# registry kernels the oracle / the broad run found best on these shapes (data-parallel, split-K)
DP = [
    "tri_tma_m64n128k64_g8_w4_s4_sk1",
    "tri_tma_m64n128k128_g8_w4_s3_sk1",
    "tri_tma_m64n256k64_g8_w4_s4_sk1",
    "tri_tma_cs_m64n128k64_g8_w4_s4_sk1",
    "tri_tma_persistent_cs_m128n256k64_g8_w8_s4_sk1_e2",
    "tri_tma_persistent_m128n256k64_g8_w8_s4_sk1",
]
SPLITK = [
    "tri_tma_m64n64k64_g8_w4_s4_sk4",
    "tri_tma_m64n128k64_g8_w4_s4_sk4",
    "tri_plain_m16n64k256_g1_w4_s3_sk2",
    "tri_plain_m16n64k128_g1_w4_s4_sk1",
]
# the new kernels
STREAMK = [
    "tri_tma_streamk_m128n256k64_g8_w8_s3_sk1",
    "tri_tma_streamk_m128n256k64_g8_w8_s4_sk1",
    "tri_tma_streamk_m64n256k64_g8_w4_s4_sk1",
    "tri_tma_streamk_m128n128k64_g8_w4_s4_sk1",
    "tri_tma_streamk_m128n128k64_g8_w8_s4_sk1",
    "tri_tma_streamk_m64n128k64_g8_w4_s4_sk1",
    "tri_tma_streamk_m64n128k128_g8_w4_s3_sk1",
    "tri_tma_streamk_m64n64k64_g8_w4_s4_sk1",
    "tri_streamk_m64n128k64_g8_w4_s4_sk1",
]
# skinny M: the 64-row stream-K tiles only (the 128-row ones waste half their MMA and partials)
STREAMK_SKINNY = [n for n in STREAMK if "_m64" in n] + ["tri_tma_streamk_m128n128k64_g8_w4_s4_sk1"]
SMALL_M = SPLITK + ["tri_tma_m64n128k64_g8_w4_s4_sk1", "tri_tma_m64n128k128_g8_w4_s3_sk1"]
MID_M = DP + SPLITK[:2]

# (M, N, K, what, configs): most telling first (a cut run keeps the shapes that matter most)
SHAPES = [
    (56, 4096, 4096, "llama3-8b o (broad 0.34x)", SMALL_M),
    (556, 4096, 4096, "mistral o (oracle 0.68x)", MID_M),
    (266, 16384, 5120, "llama2-13b up (oracle 0.64x)", MID_M),
    (498, 10240, 8192, "llama3-70b qkv (oracle 0.76x)", MID_M),
    (636, 32768, 4096, "mistral vocab (broad 0.69x)", MID_M),
    (18, 57344, 8192, "llama3-70b up (broad 0.54x)", SMALL_M),
    (125, 4096, 4096, "llama2-7b o (oracle 0.76x)", MID_M + SPLITK[2:3]),
    (89, 4096, 14336, "mistral down (broad 0.67x)", MID_M),
    (295, 15360, 5120, "llama2-13b qkv (broad 0.60x)", MID_M),
    (21, 32000, 4096, "llama2-7b vocab (broad 0.54x)", SMALL_M),
    (2543, 5120, 13824, "llama2-13b down (broad 0.86x)", DP[4:]),
]
# big squares: does stream-K (1-2 waves of 128x256 tiles split, the rest data-parallel) cost anything there
CONTROLS = [
    (4096, 4096, 4096, "control: square", DP[4:]),
    (8192, 8192, 8192, "control: big square", DP[4:5]),
]
# fp8 (e4m3) against torch._scaled_mm (unit scales, bf16 out): the same kernels at BLOCK_K 128
FP8 = [
    "tri_tma_persistent_cs_m128n256k128_g8_w8_s3_sk1_e2",
    "tri_tma_persistent_cs_m128n256k128_g8_w8_s4_sk1_e2",
    "tri_tma_m64n128k128_g8_w4_s4_sk1",
    "tri_tma_m128n256k128_g8_w8_s3_sk1",       # what the fp8 registry holds today (no tuned fp8 rows)
    "tri_tma_m128n256k128_g8_w8_s4_sk1",
    "tri_tma_streamk_m128n256k128_g8_w8_s3_sk1",
    "tri_tma_streamk_m64n128k128_g8_w4_s4_sk1",
]
FP8_SHAPES = [(4096, 4096, 4096), (556, 4096, 4096), (56, 4096, 4096), (8192, 8192, 8192), (2048, 28672, 4096)]
# the broad suite's worst rows (baseline 2026-11-27: 0.01x..0.6x): tiny / odd / batched shapes on which the
# ranker picked the 16x64x256 split-K key; which kernels are fast there, and is the split-K pair the problem
ODD_CFGS = [
    "tri_plain_m16n64k256_g1_w4_s3_sk2",
    "tri_plain_m16n64k256_g1_w4_s3_sk1",
    "tri_plain_m16n64k128_g1_w4_s4_sk1",
    "tri_plain_m64n64k64_g8_w4_s3_sk1",
    "tri_plain_m64n128k64_g8_w4_s3_sk2",
    "tri_streamk_m64n64k64_g8_w4_s3_sk1",
    "tri_streamk_m64n128k64_g8_w4_s4_sk1",
]
# (M, N, K, batch, layout)
ODD_SHAPES = [(245, 331, 77, 32, "rcr"), (104, 3, 10, 1, "rrr"), (92, 7, 1413, 1, "rcr"), (532, 865, 7, 1, "rcr"),
              (12, 477, 2463, 1, "rrr"), (200, 4144, 1430, 1, "rcr"), (599, 218, 1374, 8, "rcr")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="probe_gemmk.json")
    ap.add_argument("--rep-ms", type=int, default=25)
    ap.add_argument("--budget-s", type=float, default=320.0)
    ap.add_argument("--no-fp8", action="store_true")
    ap.add_argument("--no-dispatch", action="store_true", help="skip the Dispatcher.run rows")
    ap.add_argument("--quick", action="store_true",
                    help="stream-K against the best data-parallel / split-K kernels on six shapes only (~2 min)")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU check of this script: TRITON_INTERPRET=1, tiny shapes, wall-clock timing")
    args = ap.parse_args()
    global SHAPES, FP8_SHAPES, ODD_SHAPES, CONTROLS
    dev = "cuda"
    if args.quick:
        best_old = ["tri_tma_persistent_m128n256k64_g8_w8_s4_sk1", "tri_tma_m64n256k64_g8_w4_s4_sk1",
                    "tri_tma_m64n128k128_g8_w4_s3_sk1", "tri_tma_m64n64k64_g8_w4_s4_sk4",
                    "tri_tma_m64n128k64_g8_w4_s4_sk4"]
        SHAPES = [s_ for s_ in SHAPES if (s_[0], s_[1]) in ((56, 4096), (556, 4096), (266, 16384), (498, 10240),
                                                            (89, 4096), (2543, 5120))]
        SHAPES = [(m, n, k, what, best_old + ["tri_tma_streamk_m64n128k64_g8_w4_s4_sk1@2x",
                                              "tri_tma_streamk_m64n64k64_g8_w4_s4_sk1@2x",
                                              "tri_tma_streamk_m128n128k64_g8_w8_s4_sk1@2x"])
                  for m, n, k, what, _ in SHAPES]
        FP8_SHAPES, ODD_SHAPES, CONTROLS = [], [], [CONTROLS[0]]
        args.no_dispatch = True
    if args.smoke:
        import os
        os.environ["TRITON_INTERPRET"] = "1"
        dev = "cpu"
        SHAPES = [(40, 48, 80, "smoke", ["tri_tma_streamk_m16n32k16_g8_w4_s2_sk1", "tri_streamk_m16n16k16_g8_w4_s2_sk1",
                                         "tri_tma_m16n32k16_g8_w4_s2_sk1"])]
        ODD_SHAPES = [(21, 13, 37, 3, "rrr")]
        FP8_SHAPES = []
    import torch
    import triton
    from triton.testing import do_bench_cudagraph
    if args.smoke:
        def do_bench_cudagraph(fn, rep=0, return_mode=""):  # noqa: F811 - the CPU stand-in
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3
        torch.cuda.get_device_name = lambda *a: "cpu (smoke)"
        torch.cuda.synchronize = lambda *a: None
        torch.cuda.empty_cache = lambda *a: None

    from ck_gemm.backends.triton import GemmConfig, gemm

    t0 = time.time()
    res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "command": " ".join(sys.argv), "torch": torch.__version__, "triton": triton.__version__,
           "rows": [], "summary": []}

    def save():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    def emit(row):
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
        save()

    def bench(fn):
        return do_bench_cudagraph(fn, rep=args.rep_ms, return_mode="median")

    def kernel_times(fn, reps=5):
        """Device time per launch of each kernel fn runs (what a slow split-K pair spends where)."""
        from torch.profiler import ProfilerActivity, profile
        try:
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(reps):
                    fn()
                torch.cuda.synchronize()
            out = {}
            for e in prof.key_averages():
                us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
                if us and e.count:
                    out[e.key[:80]] = round(us / e.count, 2)
            return out
        except Exception as e:  # noqa: BLE001 - profiling is a bonus, never a failure
            return {"error": str(e)[:200]}

    def probe(m, n, k, what, names, dt, peer_fn, a, b, ref, peer_name, layout="rcr", batch=1,
              profile_kernels=False):
        peer = bench(peer_fn)
        rows = []
        for name in names:
            base = {"M": m, "N": n, "K": k, "dtype": str(dt).split(".")[-1], "what": what, "config": name,
                    "layout": layout, "batch": batch}
            if time.time() - t0 > args.budget_s:
                emit(dict(base, skipped="budget"))
                continue
            try:
                # "<config>@2x": a stream-K grid of two programs per SM (the launcher's num_sms)
                cfg = GemmConfig.from_name(name.split("@")[0])
                progs = {"num_sms": 2 * torch.cuda.get_device_properties(0).multi_processor_count} \
                    if name.endswith("@2x") and not args.smoke else {}
                tc = time.time()
                c = gemm(a, b, layout=layout, config=cfg, out_dtype=ref_dtype(dt), **progs)
                torch.cuda.synchronize()
                first_s = time.time() - tc
                err = ((c.float() - ref).norm() / ref.norm()).item()
                c2 = gemm(a, b, layout=layout, config=cfg, out_dtype=ref_dtype(dt), **progs)
                same = bool(torch.equal(c, c2))
                if not (err < 2e-2):
                    emit(dict(base, rel_err=err, ok=False))
                    continue
                t = bench(lambda: gemm(a, b, layout=layout, config=cfg, out_dtype=ref_dtype(dt), **progs))
            except Exception as e:  # noqa: BLE001 - one failing config never sinks the probe
                emit(dict(base, error=f"{type(e).__name__}: {e}".splitlines()[0][:300]))
                continue
            if profile_kernels and not args.smoke:
                base["kernels_us"] = kernel_times(lambda: gemm(a, b, layout=layout, config=cfg,
                                                               out_dtype=ref_dtype(dt)))
            row = dict(base, ms=t, peer_ms=peer, peer=peer_name, ratio=peer / t,
                       tflops=2 * m * n * k / t / 1e9, rel_err=err, deterministic=same, ok=True,
                       first_call_s=round(first_s, 2))
            rows.append(row)
            emit(row)
        peer2 = bench(peer_fn)
        emit({"M": m, "N": n, "K": k, "dtype": str(dt).split(".")[-1], "config": peer_name, "peer_ms": peer,
              "peer_ms_after": peer2, "drift": peer2 / peer - 1})
        if rows:
            best = max(rows, key=lambda r: r["ratio"])
            old = [r for r in rows if "streamk" not in r["config"]]
            new = [r for r in rows if "streamk" in r["config"]]
            s = {"M": m, "N": n, "K": k, "dtype": base["dtype"], "what": what, "best": best["config"],
                 "best_ratio": round(best["ratio"], 4),
                 "layout": layout, "batch": batch, "best_old": max(old, key=lambda r: r["ratio"])["config"] if old else None,
                 "best_old_ratio": round(max(r["ratio"] for r in old), 4) if old else None,
                 "best_streamk": max(new, key=lambda r: r["ratio"])["config"] if new else None,
                 "best_streamk_ratio": round(max(r["ratio"] for r in new), 4) if new else None}
            res["summary"].append(s)
            save()

    def ref_dtype(dt):
        return torch.bfloat16 if dt in (torch.float8_e4m3fn,) else dt

    def llm_shapes(shapes):
        for m, n, k, what, extra in shapes:
            dt = torch.float16 if args.smoke else torch.bfloat16  # (the interpreter mishandles bf16)
            torch.manual_seed(0)
            a = torch.randn(m, k, device=dev, dtype=dt)
            b = torch.randn(n, k, device=dev, dtype=dt)
            ref = (a.float() @ b.float().t())
            names = list(dict.fromkeys((STREAMK_SKINNY if m <= 64 else STREAMK) + extra))
            probe(m, n, k, what, names, dt, lambda: torch.matmul(a, b.t()), a, b, ref, "torch.matmul (cuBLAS)")
            del a, b, ref
            torch.cuda.empty_cache()

    llm_shapes(SHAPES)

    if not args.no_fp8 and hasattr(torch, "float8_e4m3fn"):
        for m, n, k in FP8_SHAPES:
            torch.manual_seed(0)
            a = (torch.randn(m, k, device=dev) * 0.5).to(torch.float8_e4m3fn)
            b = (torch.randn(n, k, device=dev) * 0.5).to(torch.float8_e4m3fn)
            one = torch.ones((), device=dev, dtype=torch.float32)
            ref = a.float() @ b.float().t()
            try:
                torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                peer_fn = (lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
            except Exception as e:  # noqa: BLE001
                emit({"M": m, "N": n, "K": k, "dtype": "fp8", "error": f"_scaled_mm: {e}"[:300]})
                continue
            probe(m, n, k, "fp8 e4m3, unit scales, bf16 out", FP8, torch.float8_e4m3fn, peer_fn, a, b, ref,
                  "torch._scaled_mm")
            del a, b, ref
            torch.cuda.empty_cache()

    # what the public path picks today on the same shapes (registry with the stream-K keys; the ranker
    # has never seen them): Dispatcher.run as the broad suite times it
    if not args.no_dispatch:
        from ck_core import Dispatcher, Registry
        from ck_gemm.problem import GemmProblem
        disps = {}
        for m, n, k, what, _ in SHAPES + [(m, n, k, "fp8", None) for m, n, k in FP8_SHAPES[:3]]:
            dts = "fp8" if what == "fp8" else ("fp16" if args.smoke else "bf16")
            base = {"M": m, "N": n, "K": k, "dtype": dts, "what": "dispatch: " + what, "config": "Dispatcher.run"}
            if time.time() - t0 > args.budget_s:
                emit(dict(base, skipped="budget"))
                continue
            try:
                if dts not in disps:
                    disps[dts] = Dispatcher(Registry.from_enumeration("gemm", "sm90", "triton", dtypes=[dts],
                                                                      layouts=["rcr"]), backend="triton")
                d = disps[dts]
                p = GemmProblem(m=m, n=n, k=k, dtype=dts, layout="rcr")
                torch.manual_seed(0)
                if dts == "fp8":
                    a = (torch.randn(m, k, device=dev) * 0.5).to(torch.float8_e4m3fn)
                    b = (torch.randn(n, k, device=dev) * 0.5).to(torch.float8_e4m3fn)
                    one = torch.ones((), device=dev, dtype=torch.float32)
                    peer_fn = (lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float16))
                else:
                    tdt = torch.float16 if args.smoke else torch.bfloat16
                    a = torch.randn(m, k, device=dev, dtype=tdt)
                    b = torch.randn(n, k, device=dev, dtype=tdt)
                    peer_fn = (lambda: torch.matmul(a, b.t()))
                key = d.select(p)
                out = d.run(p, a, b)
                ref = a.float() @ b.float().t()
                err = ((out.float() - ref).norm() / ref.norm()).item()
                t = bench(lambda: d.run(p, a, b))
                peer = bench(peer_fn)
                row = dict(base, kernel=key.name, rule=getattr(d, "_rule", None), ms=t, peer_ms=peer,
                           ratio=peer / t, rel_err=err, ok=err < 2e-2)
                if not args.smoke:   # eager too: what a Python caller sees (host path included)
                    eo = triton.testing.do_bench(lambda: d.run(p, a, b), warmup=10, rep=30, return_mode="median")
                    ep = triton.testing.do_bench(peer_fn, warmup=10, rep=30, return_mode="median")
                    row.update(eager_ms=eo, peer_eager_ms=ep, ratio_eager=ep / eo)
                emit(row)
                del a, b, out, ref
            except Exception as e:  # noqa: BLE001
                emit(dict(base, error=f"{type(e).__name__}: {e}".splitlines()[0][:300]))
            torch.cuda.empty_cache()

    for m, n, k, batch, layout in ODD_SHAPES:
        dt = torch.float16 if args.smoke else torch.bfloat16  # (the interpreter mishandles bf16)
        torch.manual_seed(0)
        lead = (batch,) if batch > 1 else ()
        a = torch.randn(*lead, m, k, device=dev, dtype=dt)
        b = torch.randn(*lead, *((n, k) if layout == "rcr" else (k, n)), device=dev, dtype=dt)
        bl = b.transpose(-1, -2) if layout == "rcr" else b
        ref = a.float() @ bl.float()
        probe(m, n, k, "odd / batched (broad's worst)", ODD_CFGS if not args.smoke else ODD_CFGS[:1] + ODD_CFGS[-2:], dt, lambda: torch.matmul(a, bl), a, b, ref,
              "torch.matmul (cuBLAS)", layout, batch, profile_kernels=True)
        del a, b, bl, ref
        torch.cuda.empty_cache()

    if not args.smoke:
        llm_shapes(CONTROLS)
    res["elapsed_s"] = round(time.time() - t0, 1)
    g_old = [s["best_old_ratio"] for s in res["summary"] if s["best_old_ratio"]]
    g_new = [s["best_ratio"] for s in res["summary"]]
    if g_old:
        res["geomean_best_old"] = math.exp(sum(map(math.log, g_old)) / len(g_old))
    if g_new:
        res["geomean_best_with_streamk"] = math.exp(sum(map(math.log, g_new)) / len(g_new))
    save()
    print(f"\n# {res['elapsed_s']} s")
    for s in res["summary"]:
        print(f"{s['M']:5d}x{s['N']:5d}x{s['K']:5d} {s['dtype']:14s} old {s['best_old_ratio']} ({s['best_old']}) "
              f"streamk {s['best_streamk_ratio']} ({s['best_streamk']})  {s['what']}")


if __name__ == "__main__":
    main()
