"""Probe the issue-16 FMHA variants on the GPU against cuDNN SDPA (one H100, <= 6 minutes).

Three sections, each candidate compiled first in a pool of worker processes (Triton's on-disk cache is
shared), then timed one at a time in this process as CUDA-graph medians (``do_bench`` where a launch
cannot be captured), next to cuDNN SDPA on the same tensors; every candidate's output is compared with
the section's first candidate (the tile the tables chose before) and a mismatch is a ``wrong`` row.

* ``fwd``: head dims 80/96/160/192 (padded to 128/128/256/256 before) with the head-dim chunks
  (``DCHUNK``: 80 = 64 + 16, 96 = 64 + 32, 160 = 128 + 32, 192 = 128 + 64), plain and causal, at
  S = 1024 and 4096 (16k tokens, 16 heads).
* ``kv``: the dK/dV kernel alone (dQ skipped) at head dims 160/192/256, B=2 H=16 S=4096: the tables'
  tile against ``kvsplit`` (dK and dV in separate programs) tiles.
* ``gqa``: GQA / MQA backward shapes from the broad suite's *training* split and a Llama-style 4:1
  shape: the dK/dV kernel with the group split over programs (``GSPLIT``, fp32 partials), with and
  without kvsplit, against the current choice; plus the forward, dot(dO, O), the whole default
  dQ/dK/dV stage and cuDNN's forward and forward+backward (the breakdown of our fwd+bwd).

    python benchmarks/fmha_variants_probe.py --out $OUT/fmha_variants_probe.json

(CK_PROBE_SMOKE=1: a CPU check of this script in the Triton interpreter, tiny shapes, no peers.)
"""
import argparse
import json
import math
import multiprocessing as mp
import os
import time

FWD_HDIMS = (80, 96, 160, 192)
FWD_SEQS = (1024, 4096)
#: (BLOCK_M, BLOCK_N, warps, stages, variant, DCHUNK); the first of each list is what the tables gave
FWD_CANDS = {
    "small": [(128, 64, 4, 2, "tma", 0), (64, 64, 4, 2, "ptr", 0), (128, 64, 4, 2, "tma", 64),
              (128, 64, 4, 3, "tma", 64), (128, 128, 8, 2, "tma", 64), (64, 64, 4, 3, "tma", 64)],
    "big": [(128, 64, 8, 2, "tma", 0), (64, 64, 4, 2, "ptr", 0), (128, 64, 8, 2, "tma", 128),
            (128, 64, 8, 3, "tma", 128), (128, 64, 8, 2, "ptr", 128), (64, 64, 4, 2, "tma", 128),
            (64, 64, 4, 3, "tma", 128)],
}
KV_HDIMS = (160, 192, 256)
KV_B, KV_H, KV_S = 2, 16, 4096
#: (BLOCK_M, BLOCK_N, warps, stages, variant); "table" = the sm90 bwd_tuned tile (first)
KV_CANDS = ["table", (64, 64, 8, 2, "kvsplit"), (64, 32, 4, 2, "kvsplit"), (64, 64, 4, 2, "kvsplit"),
            (128, 64, 8, 2, "kvsplit"), (32, 64, 4, 2, "kvsplit"), (64, 128, 8, 2, "kvsplit"),
            (64, 64, 8, 3, "kvsplit")]
#: head dims 160/192 also with head-dim chunks (128 + 32 / 64) in the backward kernels: the dK/dV kernel
#: ("table" tile / kvsplit tiles with DCHUNK=128) and the whole dQ/dK/dV stage ("stage": the tables' dK/dV
#: and dQ tiles, padded and chunked; the dQ pass's time is the stage's less the dK/dV kernel's)
KV_CHUNK_CANDS = [("table", 128), (64, 64, 8, 2, "kvsplit", 128), (64, 32, 4, 2, "kvsplit", 128),
                  (64, 64, 4, 2, "kvsplit", 128), (64, 64, 8, 2, "ptr", 128), (64, 32, 4, 2, "ptr", 128),
                  ("stage", 0), ("stage", 128)]
#: GQA / MQA shapes (broad-suite training rows, and Llama-style 4:1)
GQA_SHAPES = [dict(b=2, hq=16, hk=1, s=3168, d=64, causal=True), dict(b=1, hq=8, hk=1, s=2156, d=160, causal=False),
              dict(b=2, hq=8, hk=1, s=8528, d=128, causal=True), dict(b=20, hq=32, hk=8, s=1201, d=64, causal=True),
              dict(b=15, hq=32, hk=4, s=195, d=96, causal=True), dict(b=2, hq=32, hk=8, s=4096, d=128, causal=True),
              dict(b=1, hq=16, hk=2, s=2048, d=128, causal=True)]
GQA_SPLITS = (2, 4, 8, 16)


def _shape_key(sh):
    return tuple(sorted(sh.items()))


def _fwd_tasks(hdims):
    out = []
    for d in hdims:
        for causal in (False, True):
            for s in FWD_SEQS:
                sh = dict(b=16384 // s, hq=16, hk=16, s=s, d=d, causal=causal)
                for c in FWD_CANDS["small" if d < 128 else "big"]:
                    out.append(("fwd", _shape_key(sh), c))
    return out


def _chunked(cands, chunk):
    """KV_CHUNK_CANDS with another chunk (head dims 80/96: 64)."""
    return [c[:-1] + (chunk,) if c[0] != "stage" or c[1] else c for c in cands]


def _tasks(kv_hdims=KV_HDIMS):
    """Every task, most wanted first (the compile budget may cut the tail)."""
    out = _fwd_tasks((160, 192))
    for sh in GQA_SHAPES:
        g = sh["hq"] // sh["hk"]
        cands = ["fwd_default", "dot_do_o", "bwd_default", "kv_default", "kv_gluon", ("table", "ptr", 1)]
        cands += [("table", "ptr", n) for n in GQA_SPLITS if n <= g]
        cands += [("table", "kvsplit", n) for n in (1,) + GQA_SPLITS[:3] if n <= g]
        for c in cands:
            out.append(("gqa", _shape_key(sh), c))
    for d in kv_hdims:
        for causal in (False, True):
            sh = dict(b=KV_B, hq=KV_H, hk=KV_H, s=KV_S, d=d, causal=causal)
            chunked = _chunked(KV_CHUNK_CANDS, 128 if d > 128 else 64)
            for c in KV_CANDS + (chunked if d not in (64, 128, 256) else [("stage", 0)]):
                out.append(("kv", _shape_key(sh), c))
    return out + _fwd_tasks((80, 96))


def _compile_key(task):
    """Tasks that run the same kernels: the forward's sequence length and batch change no specialisation."""
    sec, shk, c = task
    if sec != "fwd":
        return task
    sh = dict(shk)
    return (sec, sh["d"], sh["causal"], c)


_INPUTS = {}
#: --smoke: a CPU check of this script (Triton interpreter, tiny shapes, pointer loads, no peers)
SMOKE = os.environ.get("CK_PROBE_SMOKE") == "1"


def _dev():
    return "cpu" if SMOKE else "cuda"


def _sync():
    import torch

    if not SMOKE:
        torch.cuda.synchronize()


def _inputs(shk):
    import torch

    from ck_fmha.backends.triton import launch as ops

    if shk not in _INPUTS:
        _INPUTS.clear()
        sh = dict(shk)
        if SMOKE:
            sh.update(b=1, s=37)
        g = torch.Generator(device=_dev()).manual_seed(sh["d"] * 7 + sh["s"] + sh["causal"])
        dt = torch.float16 if SMOKE else torch.bfloat16   # (the interpreter's bf16 is not to be trusted)
        mk = lambda h: torch.randn(sh["b"], h, sh["s"], sh["d"], device=_dev(), dtype=dt,  # noqa: E731
                                   generator=g)
        q, k, v = mk(sh["hq"]), mk(sh["hk"]), mk(sh["hk"])
        o, lse = ops.fwd(q, k, v, causal=sh["causal"], return_lse=True)
        do = torch.randn_like(o)
        delta = ops.bwd_dot_do_o(o, do)
        _INPUTS[shk] = (q, k, v, o, do, lse, delta)
    return _INPUTS[shk]


def _table_kv(d, causal):
    from ck_fmha.backends.triton.tuning import default_bwd_configs

    return default_bwd_configs(d, d, "sm90", causal=causal)[0]


def _callable(task):
    """(fn, outputs-of-interest fn) of a task."""
    from ck_fmha.backends.triton import launch as ops
    from ck_fmha.backends.triton.configs import TritonFmhaConfig as C

    sec, shk, c = task
    sh = dict(shk)
    causal = sh["causal"]
    q, k, v, o, do, lse, delta = _inputs(shk)
    if sec == "fwd":
        cfg = C(*c)
        if SMOKE:
            cfg = cfg.with_(variant="ptr", BLOCK_M=32, BLOCK_N=16)
        return lambda: ops.fwd(q, k, v, causal=causal, config=cfg)
    if c == "fwd_default":
        return lambda: ops.fwd(q, k, v, causal=causal)
    if c == "dot_do_o":
        return lambda: ops.bwd_dot_do_o(o, do)
    if c == "bwd_default":
        return lambda: ops.bwd_dq_dk_dv(q, k, v, do, lse, delta, causal=causal)[2:4]
    if c == "kv_default":   # the kernel-direct choice (the heuristic's: group split included)
        return lambda: ops.bwd_dq_dk_dv(q, k, v, do, lse, delta, causal=causal, _dq="none")[2:4]
    if c == "kv_gluon":     # the Gluon dK/dV kernel (head dims 64/128, whole tiles), where it can run
        return lambda: ops.bwd_dq_dk_dv(q, k, v, do, lse, delta, causal=causal, _dq="none", _dkdv="gluon")[2:4]
    if sec == "kv" and c[0] == "stage":   # the whole stage: the tables' dK/dV and dQ tiles, chunked or not
        from ck_fmha.backends.triton.tuning import default_bwd_configs

        kvc, dqc = (x.with_(DCHUNK=c[1]) for x in default_bwd_configs(sh["d"], sh["d"], "sm90", causal=causal))
        if SMOKE:
            kvc, dqc = (x.with_(BLOCK_M=16, BLOCK_N=16) for x in (kvc, dqc))
        def stage():   # (dk, dv, dq): dk / dv compare with the section's first candidate
            r = ops.bwd_dq_dk_dv(q, k, v, do, lse, delta, causal=causal, choice=(("triton", kvc), ("triton", dqc)))
            return r[2], r[3], r[0]
        return stage
    if sec == "kv":
        if c == "table" or c[0] == "table":
            cfg = _table_kv(sh["d"], causal).with_(DCHUNK=0 if c == "table" else c[1])
        else:
            cfg = C(*c)
    else:
        t = _table_kv(sh["d"], causal)
        cfg = t.with_(variant=c[1], GSPLIT=c[2])
    if SMOKE:
        cfg = cfg.with_(BLOCK_M=16, BLOCK_N=16)
    return lambda: ops.bwd_dq_dk_dv(q, k, v, do, lse, delta, causal=causal,
                                    choice=(("triton", cfg), ("none",)))[2:4]


def _warm(task):
    import torch

    t0 = time.time()
    try:
        _callable(task)()
        _sync()
        return task, None, time.time() - t0
    except Exception as exc:  # noqa: BLE001 - one failing config never sinks the probe
        return task, f"{type(exc).__name__}: {str(exc)[:300]}", time.time() - t0


def _time_ms(fn):
    import torch
    import triton

    fn()
    _sync()
    if SMOKE:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3, "smoke"
    try:
        return triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median"), "graph"
    except Exception:  # noqa: BLE001
        return triton.testing.do_bench(fn, warmup=5, rep=30, return_mode="median"), "eager"


def _peer_ms(shk):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sh = dict(shk)
    if SMOKE:
        return {}
    q, k, v, o, do, _, _ = _inputs(shk)
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    gqa = sh["hq"] != sh["hk"]

    def fwd():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qg, kg, vg, is_causal=sh["causal"], enable_gqa=gqa)

    def step():
        return torch.autograd.grad(fwd(), (qg, kg, vg), do)

    out = {}
    for name, fn in (("cudnn_fwd", fwd), ("cudnn_fwd_bwd", step)):
        try:
            out[name], out[name + "_how"] = _time_ms(fn)
        except Exception as exc:  # noqa: BLE001
            out[name + "_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return out


def _rel(a, b):
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _flops(sh, sec):
    f = 4.0 * sh["b"] * sh["hq"] * sh["s"] ** 2 * sh["d"] * (0.5 if sh["causal"] else 1.0)
    return f * (2.0 if sec in ("kv", "gqa") else 1.0)   # dK/dV kernel: 4 products (2x the forward's 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="fmha_variants_probe.json")
    ap.add_argument("--sections", default="fwd,kv,gqa")
    ap.add_argument("--compile-budget-s", type=float, default=170)
    ap.add_argument("--deadline-s", type=float, default=340, help="stop timing (and write) after this")
    ap.add_argument("--workers", type=int, default=14)
    ap.add_argument("--limit", type=int, default=0, help="only the first N tasks of each section (smoke)")
    ap.add_argument("--kv-hdims", default=",".join(map(str, KV_HDIMS)), help="head dims of the kv section")
    a = ap.parse_args()
    import torch

    t0 = time.time()
    secs = a.sections.split(",")
    tasks = [t for t in _tasks(tuple(int(x) for x in a.kv_hdims.split(","))) if t[0] in secs]
    if a.limit:
        tasks = [t for i, t in enumerate(tasks) if sum(1 for u in tasks[:i] if u[0] == t[0]) < a.limit]
    ok, errors, csecs = set(), {}, {}
    warm, seen = [], set()
    for t in tasks:   # one warm-up per distinct kernel set
        if _compile_key(t) not in seen:
            seen.add(_compile_key(t))
            warm.append(t)
    if SMOKE:
        results = [_warm(t) for t in warm]
    with mp.get_context("spawn").Pool(a.workers) as pool:
        it = iter(results) if SMOKE else pool.imap_unordered(_warm, warm)
        for _ in warm:
            try:
                task, err, dt = (next(it) if SMOKE else
                                 it.next(timeout=max(1.0, a.compile_budget_s - (time.time() - t0))))
            except (mp.TimeoutError, StopIteration):
                break
            csecs[_compile_key(task)] = round(dt, 1)
            if err:
                errors[_compile_key(task)] = err
            else:
                ok.add(_compile_key(task))
        pool.terminate()
    errors = {t: errors[_compile_key(t)] for t in tasks if _compile_key(t) in errors}
    ok = {t for t in tasks if _compile_key(t) in ok}
    print(f"compiled {len(ok)}/{len(tasks)} in {time.time() - t0:.0f} s, {len(errors)} failed", flush=True)
    rows, peers = [], {}

    def write():
        with open(a.out, "w") as f:
            json.dump(dict(rows=rows, peers=[dict(shape=dict(k), **v) for k, v in peers.items()],
                           device="cpu (smoke)" if SMOKE else torch.cuda.get_device_name(0), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           command="python benchmarks/fmha_variants_probe.py " + " ".join(
                               f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items() if k != "out"),
                           torch=torch.__version__, elapsed_s=round(time.time() - t0, 1),
                           not_compiled=[dict(section=t[0], shape=dict(t[1]), cand=t[2]) for t in tasks
                                         if t not in ok and t not in errors]), f, indent=1)

    for task in tasks:
        if task in errors:
            rows.append(dict(section=task[0], shape=dict(task[1]), cand=task[2], error=errors[task]))
    order = []
    for t in tasks:
        if t[1] not in [x[1] for x in order]:
            order.append(t)
    for first in order:
        shk, sec = first[1], first[0]
        if time.time() - t0 > a.deadline_s:
            print("deadline: stopping", flush=True)
            break
        sh = dict(shk)
        ref = None
        for task in [t for t in tasks if t[1] == shk and t[0] == sec]:
            if task not in ok:
                continue
            fn = _callable(task)
            out = fn()
            row = dict(section=sec, shape=sh, cand=task[2], compile_s=csecs.get(_compile_key(task)))
            if not (isinstance(task[2], str) and task[2] in ("fwd_default", "dot_do_o", "bwd_default")):
                outs = out if isinstance(out, (tuple, list)) else (out,)
                if ref is None:
                    ref = [x.clone() for x in outs]
                    row["rel_err_vs_first"] = 0.0
                else:
                    row["rel_err_vs_first"] = max(_rel(x, r) for x, r in zip(outs, ref))
                if row["rel_err_vs_first"] > 1e-2 or not all(bool(x.isfinite().all()) for x in outs):
                    row["status"] = "wrong"
            del out
            ms, how = _time_ms(fn)
            row.update(ms=round(ms, 4), timing=how)
            if task[2] == "fwd_default" or sec == "fwd":
                row["tflops"] = round(_flops(sh, "fwd") / ms / 1e9, 1)
            elif task[2] not in ("dot_do_o", "bwd_default"):   # the dK/dV kernel alone
                row["tflops"] = round(_flops(sh, "kv") / ms / 1e9, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
        peers[shk] = _peer_ms(shk)
        print(json.dumps(dict(shape=sh, **peers[shk])), flush=True)
        write()
        _INPUTS.clear()
        if not SMOKE:
            torch.cuda.empty_cache()
    write()
    print(f"done in {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TRITON_PRINT_AUTOTUNING", "0")
    if SMOKE:
        os.environ["TRITON_INTERPRET"] = "1"
    main()
