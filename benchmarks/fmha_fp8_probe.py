"""Probe the fp8 (e4m3) Triton forward on the GPU: V layouts, tiles and variants against SDPA bf16.

    python benchmarks/fmha_fp8_probe.py --out $OUT/fp8.json

Shapes (D=128, Hq=Hk=16): B=8 S=4096 and B=16 S=1024, causal (top-left) and not.  Per shape:

* ``row/...``  the previous fp8 path: V channel-contiguous as given (``fp8_v_trans=False``; Hopper's
  fp8 wgmma needs V K-major, so the kernel transposes every V tile through shared memory)
* ``key/...``  V key-contiguous, made once ahead of time (``ck_fmha.backends.triton.v_key_major``) and passed
  in: the kernel alone, for a few BLOCK_M/BLOCK_N/warps/stages tiles, ``ptr`` and ``tma_host``
* ``key+copy/...`` the default call on a channel-contiguous V: ``fwd`` makes the transposed copy
  itself (end to end, for the launcher's default config)
* ``vcopy/triton`` and ``vcopy/torch``: that copy alone (``v_key_major`` impl='triton' / 'torch')
* ``ours_bf16`` (default config) and torch SDPA bf16 with the cuDNN and flash backends on the same
  (fp8-representable) values

TFLOPS count 4*B*H*S^2*D (half of it when causal); times are medians of CUDA-graph replays
(``triton.testing.do_bench_cudagraph``; plain ``do_bench`` if capture fails).  ``rel_err``: rel l2
of o[0, :2, :256] against a float64 softmax on the same values.  The kernels are compiled first by
parallel worker processes (the parent then hits Triton's disk cache); a config that fails is
recorded with its error and skipped; the JSON is rewritten after every row; ``--budget-s`` stops
timing once spent.  Sized to finish in well under 2 minutes on an H100.

``--smoke``: tiny shapes on the CPU in Triton's interpreter (no timings worth reading), to check the
script itself without a GPU: ``TRITON_INTERPRET=1 python benchmarks/fmha_fp8_probe.py --smoke``.
"""
import argparse
import json
import math
import multiprocessing as mp
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (os.path.join(ROOT, "plugins", "fmha"), ROOT):
    if p not in sys.path:
        sys.path.insert(0, p)

SHAPES = [(8, 16, 4096, 128), (16, 16, 1024, 128)]     # (B, H, S, D)
DEVICE = "cuda"
# (label, v layout, BLOCK_M, BLOCK_N, warps, stages, variant)
ROW = [("row", 128, 64, 4, 2, "tma_host"), ("row", 128, 64, 4, 2, "ptr")]
KEY = [(bm, bn, w, s, v) for v in ("tma_host", "ptr")
       for (bm, bn, w, s) in ((128, 64, 4, 2), (128, 64, 4, 3), (128, 128, 8, 2), (128, 128, 8, 3),
                              (64, 128, 4, 3))]
DEFAULT = (128, 64, 4, 2, "tma_host")


def _cfg(c):
    from ck_fmha.backends.triton import TritonFmhaConfig
    return TritonFmhaConfig(*c)


def _name(c):
    bm, bn, w, s, v = c
    return f"{v}/m{bm}n{bn}w{w}s{s}"


def plan():
    """-> rows: dict(shape, causal, kind, cfg) in timing order."""
    rows = []
    for shape in SHAPES:
        for causal in (False, True):
            base = dict(shape=shape, causal=causal)
            rows.append(dict(base, kind="sdpa_cudnn", cfg=None))
            rows.append(dict(base, kind="sdpa_flash", cfg=None))
            rows.append(dict(base, kind="ours_bf16", cfg=None))
            for r in ROW:
                rows.append(dict(base, kind="row", cfg=r[1:]))
            for c in KEY:
                rows.append(dict(base, kind="key", cfg=c))
            rows.append(dict(base, kind="key+copy", cfg=DEFAULT))
            if not causal:
                rows.append(dict(base, kind="vcopy/triton", cfg=None))
                rows.append(dict(base, kind="vcopy/torch", cfg=None))
    return rows


_INPUTS = {}


def inputs(shape, seed=0):
    import torch
    if shape not in _INPUTS:
        _INPUTS.clear()
        torch.cuda.empty_cache()
        b, h, s, d = shape
        g = torch.Generator(device=DEVICE).manual_seed(seed)
        f8 = torch.float8_e4m3fn
        q, k, v = (torch.randn(b, h, s, d, device=DEVICE, generator=g).to(f8) for _ in range(3))
        from ck_fmha.backends.triton import v_key_major
        _INPUTS[shape] = dict(q=q, k=k, v=v, vk=v_key_major(v, "bhsd"),
                              bf=tuple(x.to(torch.bfloat16) for x in (q, k, v)))
    return _INPUTS[shape]


def callable_for(row):
    """A zero-argument callable running the row's op (allocations inside, as a caller would)."""
    from ck_fmha.backends.triton import fwd, v_key_major
    x = inputs(row["shape"])
    causal, kind, cfg = row["causal"], row["kind"], row["cfg"]
    if kind.startswith("sdpa"):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        be = SDPBackend.CUDNN_ATTENTION if kind == "sdpa_cudnn" else SDPBackend.FLASH_ATTENTION
        q, k, v = x["bf"]

        def f():
            with sdpa_kernel([be]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return f
    if kind == "ours_bf16":
        q, k, v = x["bf"]
        return lambda: fwd(q, k, v, causal=causal)
    if kind == "vcopy/triton":
        return lambda: v_key_major(x["v"], "bhsd", impl="triton")
    if kind == "vcopy/torch":
        return lambda: v_key_major(x["v"], "bhsd", impl="torch")
    c = _cfg(cfg)
    if kind == "row":
        return lambda: fwd(x["q"], x["k"], x["v"], causal=causal, config=c, fp8_v_trans=False)
    if kind == "key":
        return lambda: fwd(x["q"], x["k"], x["vk"], causal=causal, config=c, fp8_v_trans=True)
    if kind == "key+copy":
        return lambda: fwd(x["q"], x["k"], x["v"], causal=causal, config=c, fp8_v_trans=True)
    raise ValueError(kind)


def _warm(rows):
    """Worker: run each row once (compiles into Triton's disk cache)."""
    import torch
    errs = []
    for r in rows:
        try:
            callable_for(r)()
            torch.cuda.synchronize()
            errs.append(None)
        except Exception as e:   # reported again (with the timing) by the parent
            errs.append(f"{type(e).__name__}: {str(e)[:200]}")
    return errs


def precompile(rows, workers, timeout_s):
    # one representative per compiled kernel: (causal, kind, cfg); the smaller shape specialises the same
    seen, uniq = set(), []
    for r in rows:
        if r["kind"].startswith("sdpa") or r["kind"] == "vcopy/torch" or not r["kind"]:
            continue
        k = (r["causal"], r["kind"].replace("+copy", ""), r["cfg"])
        if k not in seen:
            seen.add(k)
            uniq.append(dict(r, shape=SHAPES[-1]))
    shards = [uniq[i::workers] for i in range(workers) if uniq[i::workers]]
    t0 = time.time()
    try:
        with mp.get_context("spawn").Pool(len(shards)) as pool:
            res = pool.map_async(_warm, shards).get(timeout=timeout_s)
        n_err = sum(1 for e in res for x in e if x)
        msg = f"precompiled {len(uniq)} kernels in {time.time() - t0:.1f}s with {len(shards)} workers, {n_err} errors"
    except Exception as e:   # timed out / pool trouble: the timing pass compiles what is missing
        msg = f"precompile incomplete after {time.time() - t0:.1f}s: {type(e).__name__}: {str(e)[:200]}"
    print("#", msg, flush=True)
    return msg


def flops(shape, causal):
    b, h, s, d = shape
    return 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)


_REF = {}


def ref_slice(shape, causal, nq=256, nh=2):
    """float64 attention of batch 0, heads [0, nh), queries [0, nq) on the fp8 values."""
    import torch
    nq = min(nq, shape[2])
    key = (shape, causal)
    if key not in _REF:
        x = inputs(shape)
        q = x["q"][0, :nh, :nq].double()
        k = x["k"][0, :nh].double()
        v = x["v"][0, :nh].double()
        s = q @ k.transpose(-1, -2) / math.sqrt(shape[3])
        if causal:
            i = torch.arange(nq, device=s.device)[:, None]
            j = torch.arange(k.shape[1], device=s.device)[None, :]
            s = s.masked_fill(j > i, float("-inf"))
        _REF[key] = torch.softmax(s, -1) @ v
    return _REF[key]


def rel_err(o, shape, causal, nq=256, nh=2):
    ref = ref_slice(shape, causal, nq, nh)
    got = o[0, :nh, :ref.shape[-2]].double()
    return float((got - ref).norm() / ref.norm())


def launched_kernel(fn):
    """(variant, V_TRANS) the fmha_fwd_kernel launch of ``fn`` really used (launchers may fall back)."""
    from ck_fmha.backends.triton import kernels as K
    from ck_fmha.backends.triton import launch as ops
    real = K.fmha_fwd_kernel
    seen = {}

    class Spy:
        def __getitem__(self, grid):
            def launch(*a, **kw):
                seen.update(USE_TMA=kw.get("USE_TMA"), V_TRANS=kw.get("V_TRANS"), BLOCK_M=kw.get("BLOCK_M"),
                            BLOCK_N=kw.get("BLOCK_N"), num_warps=kw.get("num_warps"),
                            num_stages=kw.get("num_stages"))
                return real[grid](*a, **kw)
            return launch
    ops.K.fmha_fwd_kernel = Spy()
    try:
        out = fn()
    finally:
        ops.K.fmha_fwd_kernel = real
    if seen:
        seen["variant"] = {0: "ptr", 1: "tma", 2: "tma_host"}.get(seen.pop("USE_TMA"))
    return out, seen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="fp8_probe.json")
    ap.add_argument("--rep-ms", type=int, default=20, help="do_bench_cudagraph rep (ms of back-to-back calls)")
    ap.add_argument("--budget-s", type=float, default=100.0, help="stop timing once this much time has passed")
    ap.add_argument("--workers", type=int, default=min(12, os.cpu_count() or 4))
    ap.add_argument("--no-precompile", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="tiny CPU shapes under TRITON_INTERPRET=1 (script check)")
    args = ap.parse_args()
    t_start = time.time()
    import torch
    import triton
    from triton.testing import do_bench, do_bench_cudagraph
    bench_graph, bench_plain = do_bench_cudagraph, do_bench

    if args.smoke:
        global DEVICE
        if os.environ.get("TRITON_INTERPRET") != "1":
            sys.exit("--smoke runs the kernels in Triton's interpreter: set TRITON_INTERPRET=1")
        DEVICE = "cpu"
        SHAPES[:] = [(1, 2, 64, 32)]
        args.no_precompile = True
        torch.cuda.get_device_name = lambda *a: "cpu (smoke)"
        torch.cuda.synchronize = lambda *a: None
        torch.cuda.empty_cache = lambda *a: None

        def one_call(fn, **kw):   # wall clock of one call
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        bench_graph = bench_plain = one_call
        KEY[:] = [r for r in KEY if r[1] == 64]   # keep the interpreter run short

    rows = plan()
    res = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               timing="median of CUDA-graph replays (triton.testing.do_bench_cudagraph), do_bench if capture fails",
               tflops="4*B*H*S^2*D, halved when causal", rel_err="rel l2 of o[0, :2, :256] vs float64 softmax",
               rows=[])

    def dump():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    if not args.no_precompile:
        res["precompile"] = precompile(rows, args.workers, timeout_s=max(20.0, args.budget_s * 0.45))
    dump()

    for r in rows:
        b, h, s, d = r["shape"]
        out = dict(shape=dict(B=b, H=h, S=s, D=d), causal=r["causal"], kind=r["kind"],
                   cfg=_name(r["cfg"]) if r["cfg"] else None)
        if time.time() - t_start > args.budget_s:
            out["skipped"] = "budget"
            res["rows"].append(out)
            continue
        try:
            fn = callable_for(r)
            o, launch = launched_kernel(fn)
            torch.cuda.synchronize()
            if launch:
                out["launched"] = launch
            if r["kind"] not in ("vcopy/triton", "vcopy/torch"):
                out["rel_err"] = round(rel_err(o, r["shape"], r["causal"]), 5)
            try:
                ms = bench_graph(fn, rep=args.rep_ms, return_mode="median")
                out["timer"] = "cudagraph"
            except Exception as e:
                torch.cuda.synchronize()
                out["graph_error"] = f"{type(e).__name__}: {str(e)[:160]}"
                ms = bench_plain(fn, warmup=10, rep=args.rep_ms, return_mode="median")
                out["timer"] = "do_bench"
            out["ms"] = round(ms, 4)
            if r["kind"].startswith("vcopy"):
                nbytes = 2 * inputs(r["shape"])["v"].numel()     # one read + one write of fp8 V
                out["GBps"] = round(nbytes / ms / 1e6, 1)
            else:
                out["tflops"] = round(flops(r["shape"], r["causal"]) / ms / 1e9, 1)
        except Exception as e:
            out["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            out["trace"] = traceback.format_exc()[-800:]
            try:
                torch.cuda.synchronize()
            except Exception:
                pass
        res["rows"].append(out)
        val = out.get("tflops", out.get("GBps"))
        unit = "TFLOPS" if "tflops" in out else "GB/s"
        print(f"B{b} S{s} {'causal' if r['causal'] else 'full  '} {r['kind']:12s} {out['cfg'] or '':24s} "
              + (f"{val:7.1f} {unit} {out['ms']:.3f} ms err {out.get('rel_err', '-')} {out.get('launched', '')}"
                 if "ms" in out else out.get("error", out.get("skipped", ""))), flush=True)
        dump()

    # summary: best key-contiguous fp8 config vs cuDNN per (shape, causal)
    summ = []
    for shape in SHAPES:
        for causal in (False, True):
            sel = [x for x in res["rows"] if x["shape"]["S"] == shape[2] and x["shape"]["B"] == shape[0]
                   and x["causal"] == causal and "tflops" in x]
            by = lambda k: [x for x in sel if x["kind"] == k]  # noqa: E731
            best = {k: max(by(k), key=lambda x: x["tflops"]) for k in ("row", "key", "key+copy", "sdpa_cudnn",
                                                                      "ours_bf16") if by(k)}
            summ.append(dict(B=shape[0], S=shape[2], causal=causal,
                             **{k: dict(cfg=v["cfg"], tflops=v["tflops"]) for k, v in best.items()}))
    res["summary"] = summ
    res["wall_s"] = round(time.time() - t_start, 1)
    dump()
    for x in summ:
        print("summary", json.dumps(x), flush=True)
    print(f"# wall {res['wall_s']} s -> {args.out}", flush=True)


if __name__ == "__main__":
    main()
