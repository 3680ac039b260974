#!/usr/bin/env python3
"""Benchmark the Triton FMHA kernels against torch SDPA (cuDNN and flash
backends) in the same process on the same inputs, and decode kernels against
a device copy of the same number of bytes.

    ck bench fmha --vs sdpa --json $OUT/fmha.json         # (or python -m ck_fmha.bench --sweep --out ...)

Forward flops = 4*B*H*Sq*Sk*D (halved for causal); backward = 2.5x forward.
Group ``fwd_fp8``: our fp8 e4m3 forward (per-tensor descales, bf16 o) against SDPA
cuDNN / flash in bf16 on the same shape and the same (fp8-representable) values:
a cross-precision comparison, labelled as such in ``peer_name``.
Timings: triton.testing.do_bench medians (CUDA events, warm-up first).
``--sweep`` first times a few meta-parameter candidates per head dim on
(8,16,4096) and uses the best for the matrix.  Kernels are compiled ahead of
the timing in a pool of worker processes (shared triton cache).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import multiprocessing as mp
import os
import sys
import time
import traceback

import torch

from ck_core.progress import Progress

# ---------------------------------------------------------------------------
# cases
# ---------------------------------------------------------------------------
SHAPES = [(16, 16, 1024), (8, 16, 4096), (2, 16, 16384), (32, 32, 512)]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

# (BLOCK_M, BLOCK_N, num_warps, num_stages, variant); first H100 sweep (2026-11-22)
# kept the leaders, this list adds the host-descriptor variant
FWD_CANDS = {
    64: [(128, 128, 4, 3, "ptr"), (128, 128, 4, 3, "tma"), (128, 128, 4, 3, "tma_host"),
         (128, 64, 4, 3, "tma"), (128, 64, 4, 3, "tma_host"), (128, 64, 4, 2, "tma_host"),
         (128, 128, 8, 3, "tma_host"), (64, 64, 4, 3, "tma_host")],
    128: [(128, 64, 4, 2, "tma"), (128, 64, 4, 2, "tma_host"), (128, 128, 8, 3, "ptr"),
          (128, 128, 8, 3, "tma"), (128, 128, 8, 3, "tma_host"), (128, 64, 8, 3, "ptr"),
          (128, 64, 8, 3, "tma_host"), (128, 64, 4, 3, "tma_host")],
}
BWD_KV_CANDS = {
    64: [(32, 128, 4, 3), (64, 64, 4, 3), (64, 128, 8, 3), (32, 64, 4, 3)],
    128: [(64, 64, 4, 3), (64, 128, 8, 2), (64, 64, 4, 2), (32, 64, 4, 3)],
}
BWD_Q_CANDS = {
    64: [(64, 64, 4, 3), (128, 32, 4, 3), (64, 64, 4, 4)],
    128: [(128, 64, 8, 2), (64, 64, 4, 3), (128, 32, 4, 3)],
}
DEC_CANDS = [(64, 2), (64, 3), (128, 3)]  # (BLOCK_N, num_stages)


def _cfg(t, variant="ptr"):
    from ck_fmha.backends.triton import TritonFmhaConfig
    if len(t) == 5:
        variant = t[4]
    return TritonFmhaConfig(t[0], t[1], t[2], t[3], variant)


def fwd_tasks(cfg_for, arch):
    tasks = []
    for dname in DTYPES:
        for d in (64, 128):
            for causal in (False, True):
                for (b, h, s) in SHAPES:
                    tasks.append(dict(group="fwd", dtype=dname, d=d, causal=causal, b=b, hq=h, hk=h, s=s,
                                      cfg=cfg_for(d, causal, s)))
    for causal in (False, True):
        tasks.append(dict(group="fwd_gqa", dtype="bf16", d=128, causal=causal, b=4, hq=32, hk=4, s=4096,
                          cfg=cfg_for(128, causal, 4096)))
    # fp8 e4m3 forward (descales 1, bf16 o) vs SDPA in bf16 on the same shape
    for causal in (False, True):
        for (b, h, s) in ((8, 16, 4096), (2, 16, 16384)):
            from ck_fmha import heuristics as T
            tasks.append(dict(group="fwd_fp8", dtype="fp8", d=128, causal=causal, b=b, hq=h, hk=h, s=s,
                              cfg=T.default_fwd_config(128, 128, arch, causal, s, fp8=True)))
    return tasks


def _bwd_det(d, causal, s, arch):
    """Deterministic backward unless ``arch``'s tables configure the fused dK/dV+dQ Gluon kernel for the
    case (it is then the faster one; ``deterministic=False`` elsewhere resolves to the deterministic path
    on Hopper)."""
    from ck_fmha import heuristics as T
    return T.gluon_fused_tile(d, causal, arch) is None or s < T.gluon_fused_min_seqlen(arch)


def bwd_tasks(cfg_for, det, arch):
    tasks = []
    for dname in DTYPES:
        for d in (64, 128):
            for causal in (False, True):
                for (b, h, s) in SHAPES:
                    tasks.append(dict(group="bwd", dtype=dname, d=d, causal=causal, b=b, hq=h, hk=h, s=s,
                                      cfg=cfg_for(d, causal), det=_bwd_det(d, causal, s, arch)))
    for causal in (False, True):
        tasks.append(dict(group="bwd_gqa", dtype="bf16", d=128, causal=causal, b=4, hq=32, hk=4, s=4096,
                          cfg=cfg_for(128, causal), det=True))
    return tasks


def dec_tasks(cfg_for, splits_mult=1):
    tasks = []
    for b in (8, 1):
        for sk in (4096, 16384, 65536, 131072):
            for page in (0, 16, 64, 256):
                tasks.append(dict(group="decode", dtype="bf16", d=128, b=b, hq=32, hk=8, sq=1, sk=sk, page=page,
                                  cfg=cfg_for(page), splits_mult=splits_mult))
    return tasks


# ---------------------------------------------------------------------------
# callables
# ---------------------------------------------------------------------------

def make_inputs(t, seed=0):
    """q, k, v in the task's dtype; fp8 tasks get bf16 tensors holding fp8-representable values
    (the SDPA peer runs on them, ours casts them to float8_e4m3fn once)."""
    torch.manual_seed(seed)
    if t["dtype"] == "fp8":
        q, k, v = make_inputs(dict(t, dtype="bf16"), seed)
        return tuple(x.to(torch.float8_e4m3fn).to(torch.bfloat16) for x in (q, k, v))
    dt = DTYPES[t["dtype"]]
    if t["group"] == "decode":
        q = torch.randn(t["b"], t["hq"], t["sq"], t["d"], device="cuda", dtype=dt)
        k = torch.randn(t["b"], t["hk"], t["sk"], t["d"], device="cuda", dtype=dt)
        v = torch.randn(t["b"], t["hk"], t["sk"], t["d"], device="cuda", dtype=dt)
        return q, k, v
    q = torch.randn(t["b"], t["hq"], t["s"], t["d"], device="cuda", dtype=dt)
    k = torch.randn(t["b"], t["hk"], t["s"], t["d"], device="cuda", dtype=dt)
    v = torch.randn(t["b"], t["hk"], t["s"], t["d"], device="cuda", dtype=dt)
    return q, k, v


def ours_callable(t, inputs=None):
    from ck_core.device import current_arch
    from ck_fmha.backends.triton import bwd, fwd
    from ck_fmha.decode import paged_decode, splitkv_decode
    from ck_fmha.heuristics import split_count
    q, k, v = inputs or make_inputs(t)
    g = t["group"]
    if t["dtype"] == "fp8":
        q8, k8, v8 = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
        return lambda: fwd(q8, k8, v8, causal=t["causal"], config=t["cfg"], q_descale=1.0, k_descale=1.0,
                           v_descale=1.0)
    if g.startswith("fwd"):
        return lambda: fwd(q, k, v, causal=t["causal"], config=t["cfg"])
    if g.startswith("bwd"):
        from ck_fmha.heuristics import default_fwd_config

        o, lse = fwd(q, k, v, causal=t["causal"], return_lse=True,
                     config=default_fwd_config(q.shape[-1], v.shape[-1], current_arch(q).name, t["causal"],
                                               q.shape[-2]))
        do = torch.randn_like(o)
        return lambda: bwd(q, k, v, o, lse, do, causal=t["causal"], config=t["cfg"], deterministic=t["det"])
    # decode
    ns = None
    if t.get("splits_mult", 1) != 1:
        # the Dispatcher's count (ck_fmha.decode) scaled, to time the neighbours of its choice
        ns = split_count(t["b"] * t["hk"], t["sk"], current_arch(q).compute_units,
                         query_rows=(t["hq"] // t["hk"]) * t["sq"]) * t["splits_mult"]
    sl = torch.full((t["b"],), t["sk"], dtype=torch.int32, device="cuda")
    if t["page"] == 0:
        return lambda: splitkv_decode(q, k, v, seqlens_k=sl, config=t["cfg"], num_splits=ns)
    page = t["page"]
    npg = t["sk"] // page
    table = torch.randperm(t["b"] * npg, device="cuda").view(t["b"], npg).to(torch.int32)
    kc = torch.empty(t["b"] * npg, page, t["hk"], t["d"], device="cuda", dtype=q.dtype)
    vc = torch.empty_like(kc)
    kc[table.long().flatten()] = k.view(t["b"], t["hk"], npg, page, t["d"]).permute(0, 2, 3, 1, 4).reshape(-1, page, t["hk"], t["d"])
    vc[table.long().flatten()] = v.view(t["b"], t["hk"], npg, page, t["d"]).permute(0, 2, 3, 1, 4).reshape(-1, page, t["hk"], t["d"])
    return lambda: paged_decode(q, kc, vc, table, sl, config=t["cfg"], num_splits=ns)


def peer_callable(t, backend, inputs):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
    q, k, v = inputs
    gqa = t["hq"] != t["hk"]
    note = ""
    kw = {}
    if gqa:
        kw["enable_gqa"] = True
    g = t["group"]

    def run_fwd(kk, vv, kw):
        with sdpa_kernel([be]):
            return F.scaled_dot_product_attention(q, kk, vv, is_causal=t["causal"], **kw)

    kk, vv = k, v
    try:
        run_fwd(kk, vv, kw)
        torch.cuda.synchronize()
    except Exception:
        if not gqa:
            raise
        kk = k.repeat_interleave(t["hq"] // t["hk"], dim=1)
        vv = v.repeat_interleave(t["hq"] // t["hk"], dim=1)
        kw = {}
        note = "k/v expanded to H_q heads (backend has no enable_gqa)"
        run_fwd(kk, vv, kw)
    if g.startswith("fwd"):
        def f():
            with sdpa_kernel([be]):
                return F.scaled_dot_product_attention(q, kk, vv, is_causal=t["causal"], **kw)
        return f, note
    qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, kk, vv))
    with sdpa_kernel([be]):
        out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=t["causal"], **kw)
    do = torch.randn_like(out)

    def b():
        return torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True)
    return b, note


def flops(t):
    f = 4.0 * t["b"] * t["hq"] * t["s"] * t["s"] * t["d"]
    if t["causal"]:
        f *= 0.5
    if t["group"].startswith("bwd"):
        f *= 2.5
    return f


def dec_bytes(t):
    es = 2
    kv = t["b"] * t["hk"] * t["sk"] * t["d"] * 2 * es
    qo = 2 * t["b"] * t["hq"] * t["sq"] * t["d"] * es
    return kv + qo


def bench_ms(fn, graph=False):
    import triton
    if graph:  # many tiny launches (decode): time CUDA-graph replays, as serving stacks run them
        fn()
        torch.cuda.synchronize()
        return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


# ---------------------------------------------------------------------------
# parallel pre-compilation
# ---------------------------------------------------------------------------

def _warm_worker(tasks):
    os.environ.setdefault("TRITON_PRINT_AUTOTUNING", "0")
    out = []
    for t in tasks:
        try:
            fn = ours_callable(t)
            fn()
            torch.cuda.synchronize()
            out.append(None)
        except Exception as e:  # recorded; the timing pass reports it again
            out.append(f"{type(e).__name__}: {str(e)[:200]}")
        torch.cuda.empty_cache()
    return out


def _key(t):
    # compile-relevant part of a task (dedupe the warm-up work)
    c = t["cfg"]
    cs = repr(c)
    return (t["group"].split("_")[0], t["dtype"], t["d"], t.get("causal"), t["hq"] == t["hk"], t.get("page"), cs,
            t.get("det"), t.get("s", 0) % 128 == 0)


def precompile(tasks, workers):
    seen, uniq = set(), []
    for t in tasks:
        k = _key(t)
        if k not in seen:
            seen.add(k)
            # smallest shape of this key keeps the warm-up cheap
            uniq.append(t)
    shards = [uniq[i::workers] for i in range(workers)]
    shards = [s for s in shards if s]
    t0 = time.time()
    ctx = mp.get_context("spawn")
    with ctx.Pool(len(shards)) as pool:
        res = pool.map(_warm_worker, shards)
    errs = [e for r in res for e in r if e]
    print(f"# precompiled {len(uniq)} kernels in {time.time() - t0:.1f}s with {len(shards)} workers;"
          f" {len(errs)} errors", flush=True)
    for e in errs[:5]:
        print("#   ", e, flush=True)


# ---------------------------------------------------------------------------
# sweeps
# ---------------------------------------------------------------------------

def sweep(workers, log):
    best = {}
    # forward: every candidate at every benchmark shape
    cand_tasks = []
    for d in (64, 128):
        for causal in (False, True):
            for (b, h, sl) in SHAPES:
                for c in FWD_CANDS[d]:
                    cand_tasks.append(dict(group="fwd", dtype="bf16", d=d, causal=causal, b=b, hq=h, hk=h,
                                           s=sl, cfg=_cfg(c)))
    # backward: (dkdv, dq) pairs, deterministic dQ pass, causal and not
    for d in (64, 128):
        for causal in (False, True):
            for ckv in BWD_KV_CANDS[d]:
                for cq in BWD_Q_CANDS[d]:
                    cand_tasks.append(dict(group="bwd", dtype="bf16", d=d, causal=causal, b=8, hq=16, hk=16,
                                           s=4096, cfg=(_cfg(ckv), _cfg(cq)), det=True))
    # decode
    for page in (0, 16):
        for bn, st in DEC_CANDS:
            for mult in (1, 2, 4):
                cand_tasks.append(dict(group="decode", dtype="bf16", d=128, b=8, hq=32, hk=8, sq=1, sk=65536,
                                       page=page, cfg=_cfg((16, bn, 4, st)), splits_mult=mult))
    precompile(cand_tasks, workers)
    results = {}
    for t in cand_tasks:
        g = t["group"]
        key = (g, t["d"], t.get("causal"), t.get("page"), t.get("s"))
        try:
            fn = ours_callable(t)
            ms = bench_ms(fn, graph=g == "decode")
        except Exception as e:
            log.append(dict(sweep=True, case=str(key), cfg=repr(t["cfg"]), error=f"{type(e).__name__}: {str(e)[:300]}"))
            continue
        if g == "decode":
            val = dec_bytes(t) / ms / 1e6  # GB/s
        else:
            val = flops(t) / ms / 1e9  # TFLOPS
        log.append(dict(sweep=True, case=str(key), cfg=repr(t["cfg"]), det=t.get("det"),
                        splits_mult=t.get("splits_mult"), value=round(val, 1), ms=ms))
        print(f"sweep {key} {t['cfg']} det={t.get('det')} x{t.get('splits_mult')} -> {val:.1f}", flush=True)
        prev = results.get(key)
        if prev is None or val > prev[0]:
            results[key] = (val, t["cfg"], t.get("det"), t.get("splits_mult"))
        torch.cuda.empty_cache()
    for key, (val, cfg, det, mult) in results.items():
        best[key] = dict(cfg=cfg, det=det, mult=mult, value=val)
    return best


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------

def _save(args, t_start, best, rows, log):
    summary = {}
    for g in sorted({r["group"] for r in rows}):
        rs = [r for r in rows if r["group"] == g and "error" not in r]
        summary[g] = dict(n=len(rs), geomean_ratio=geomean([r.get("ratio") for r in rs]),
                          geomean_ratio_vs_flash=geomean([r.get("ratio_vs_flash") for r in rs]),
                          geomean_ours=geomean([r.get("ours") for r in rs]),
                          geomean_peer=geomean([r.get("peer") for r in rs]))
    doc = dict(
        device=torch.cuda.get_device_name(0), torch=torch.__version__,
        triton=__import__("triton").__version__,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command=" ".join([os.path.basename(sys.executable)] + sys.argv),
        elapsed_s=round(time.time() - t_start, 1),
        best_configs={str(k): dict(cfg=repr(v["cfg"]), det=v["det"], mult=v["mult"], value=round(v["value"], 1))
                      for k, v in best.items()},
        summary=summary, rows=rows, sweep=log,
    )
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    return summary


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def main(argv=None, progress=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="fmha_triton_raw.json")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--groups", default="fwd,bwd,decode")
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--quick", action="store_true", help="one shape per group")
    args = ap.parse_args(argv)
    from ck_core.device import current_arch

    from ck_fmha import heuristics as C

    arch = current_arch(torch.device("cuda")).name   # whose tuned tables the defaults come from
    t_start = time.time()
    log = []
    best = sweep(args.workers, log) if args.sweep else {}
    for k, v in best.items():
        print(f"# best {k}: {v['cfg']} det={v['det']} mult={v['mult']} value={v['value']:.1f}", flush=True)

    def fwd_cfg(d, causal, s):
        b = best.get(("fwd", d, causal, None, s))
        return b["cfg"] if b else C.default_fwd_config(d, d, arch, causal=causal, seqlen=s)

    def bwd_cfg(d, causal):
        b = best.get(("bwd", d, causal, None, 4096))
        return b["cfg"] if b else C.default_bwd_configs(d, d, arch)

    det = {64: True, 128: True}

    def dec_cfg(page):
        b = best.get(("decode", 128, None, 16 if page == 16 else 0, None))
        return b["cfg"] if b else C.default_splitkv_config(128, 128, 4, arch)

    mult = (best.get(("decode", 128, None, 0, None)) or {"mult": 1})["mult"] or 1
    groups = args.groups.split(",")
    tasks = []
    if "fwd" in groups:
        tasks += fwd_tasks(fwd_cfg, arch)
    if "bwd" in groups:
        tasks += bwd_tasks(bwd_cfg, det, arch)
    if "decode" in groups:
        tasks += dec_tasks(dec_cfg, mult)
    if args.quick:
        tasks = [t for t in tasks if t.get("s") in (None, 4096) and t.get("sk") in (None, 65536)]
    precompile(tasks, args.workers)

    # bring the clocks up before the first timed row (run 2 of 2026-11-22 showed
    # a low first row: bf16 s1024 d64 at 249 TFLOPS against 378 in its sweep)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t_burn = time.time()
    while time.time() - t_burn < 2.0:
        a @ a
    torch.cuda.synchronize()
    del a
    rows = []
    copy_cache = {}
    _save(args, t_start, best, rows, log)
    # a bar on a terminal, a line every 30 s in a log (ck bench -q silences it)
    for i, t in enumerate((progress or Progress)(len(tasks), "ck bench fmha").each(tasks, _name)):
        if i % 8 == 0:
            _save(args, t_start, best, rows, log)
        g = t["group"]
        try:
            inputs = make_inputs(t)
            ours = bench_ms(ours_callable(t, inputs), graph=g == "decode")
        except Exception as e:
            rows.append(dict(group=g, case=_name(t), error=f"{type(e).__name__}: {str(e)[:300]}"))
            print("ERR", _name(t), e, flush=True)
            continue
        if g == "decode":
            nbytes = dec_bytes(t)
            if nbytes not in copy_cache:
                src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
                dst = torch.empty_like(src)
                copy_cache[nbytes] = 2 * nbytes / bench_ms(lambda: dst.copy_(src), graph=True) / 1e6
                del src, dst
            ours_bw = nbytes / ours / 1e6
            rows.append(dict(group=g, case=_name(t), ours=round(ours_bw, 1), peer=round(copy_cache[nbytes], 1),
                             peer_name="torch copy_ (read+write bytes), both CUDA-graph replays", unit="GB/s",
                             ratio=round(ours_bw / copy_cache[nbytes], 3), ours_ms=ours, cfg=repr(t["cfg"])))
            print(f"{_name(t):60s} ours {ours_bw:8.1f} GB/s  copy {copy_cache[nbytes]:8.1f}  "
                  f"ratio {ours_bw / copy_cache[nbytes]:.3f}", flush=True)
            del inputs
            torch.cuda.empty_cache()
            continue
        fl = flops(t)
        res = dict(group=g, case=_name(t), unit="TFLOPS", ours=round(fl / ours / 1e9, 1), ours_ms=ours,
                   cfg=repr(t["cfg"]))
        if t.get("det") is not None:
            res["deterministic"] = bool(t["det"])
        for peer in ("cudnn", "flash"):
            try:
                fn, note = peer_callable(t, peer, inputs)
                ms = bench_ms(fn)
                res[peer] = round(fl / ms / 1e9, 1)
                if note:
                    res[peer + "_note"] = note
            except Exception as e:
                res[peer] = None
                res[peer + "_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        res["peer"] = res.get("cudnn")
        res["peer_name"] = "torch SDPA cuDNN backend"
        if t["dtype"] == "fp8":
            res["peer_name"] = "torch SDPA cuDNN backend in bf16, same shape and values (ours: fp8 e4m3)"
        res["ratio"] = round(res["ours"] / res["cudnn"], 3) if res.get("cudnn") else None
        res["ratio_vs_flash"] = round(res["ours"] / res["flash"], 3) if res.get("flash") else None
        rows.append(res)
        print(f"{_name(t):60s} ours {res['ours']:7.1f}  cudnn {res.get('cudnn')}  flash {res.get('flash')}  "
              f"ratio {res['ratio']}", flush=True)
        del inputs
        torch.cuda.empty_cache()

    summary = _save(args, t_start, best, rows, log)
    print("\n# summary (geomean ratio ours/peer)")
    for g, s in summary.items():
        print(f"#  {g:10s} n={s['n']:3d} ratio={s['geomean_ratio']}  vs_flash={s['geomean_ratio_vs_flash']}")
    print(f"# elapsed {time.time() - t_start:.0f}s")


def _name(t):
    if t["group"] == "decode":
        return f"decode {t['dtype']} b{t['b']} hq{t['hq']} hk{t['hk']} sk{t['sk']} d{t['d']} page{t['page']}"
    return (f"{t['group']} {t['dtype']} b{t['b']} hq{t['hq']} hk{t['hk']} s{t['s']} d{t['d']} "
            f"{'causal' if t['causal'] else 'full'}")


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)


def bench(peer: str, options: dict) -> dict:
    """``ck bench fmha --vs sdpa``: the suite above, rows in the common format."""
    import json
    import tempfile

    from ck_core.errors import UnsupportedProblem

    if peer not in ("sdpa", "torch", "cudnn"):
        raise UnsupportedProblem(f"fmha benchmarks compare with 'sdpa' (torch SDPA cuDNN/flash), not {peer!r}")
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "fmha.json")
        argv = ["--out", out, "--workers", str(options.get("workers") or min(os.cpu_count() or 2, 12))]
        if options.get("quick"):
            argv.append("--quick")
        if options.get("groups"):
            argv += ["--groups", str(options["groups"])]
        main(argv, progress=options.get("progress"))
        with open(out) as f:
            raw = json.load(f)
    keep = ("group", "case", "ours", "peer", "peer_name", "unit", "ratio", "ratio_vs_flash", "flash")
    return {"rows": [{k: r[k] for k in keep if k in r} for r in raw["rows"]],
            "notes": raw.get("notes", ""), "extra": {"summary": [dict(group=k, **{kk: vv for kk, vv in v.items()
                                                                              if kk != "note"})
                                                                 for k, v in raw.get("summary", {}).items()]}}
