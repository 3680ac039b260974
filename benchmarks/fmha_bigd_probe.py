"""Probe Triton FMHA tiles for head dims above 128 on the GPU (issue 16: d 160/192/256 pad to 256).

Candidates per kernel -- the forward, the dK/dV kernel alone (dQ skipped), the dQ pass (after
the current dK/dV tile) -- each compiled first in a pool of worker processes (Triton's on-disk
cache is shared), then timed one at a time in this process: CUDA-graph-free ``do_bench``
medians, plain and causal, next to cuDNN SDPA on the same tensors.  Writes every row and the
winners (the first candidate of each list is the tile the tables chose before; the winners go into
ck_fmha/tuned/sm90.json by hand, with this file's rows as their provenance).

    python benchmarks/fmha_bigd_probe.py --out $OUT/bigd_probe.json
"""
import argparse
import json
import multiprocessing as mp
import os
import time

B, H, S = 2, 16, 4096

FWD = [(128, 64, 8, 2, "tma"), (128, 64, 8, 2, "tma_host"), (128, 64, 8, 2, "ptr"), (64, 64, 4, 2, "tma"),
       (128, 32, 8, 3, "tma"), (64, 64, 4, 3, "tma"), (128, 128, 8, 1, "tma"), (64, 32, 4, 3, "tma")]
KV = [(32, 64, 4, 1), (64, 64, 8, 1), (64, 64, 8, 2), (32, 64, 8, 2), (32, 64, 4, 2), (32, 128, 8, 1),
      (16, 64, 4, 2), (64, 32, 4, 2), (16, 128, 8, 2), (64, 64, 4, 2)]
DQ = [(64, 32, 4, 1), (64, 64, 8, 1), (64, 64, 8, 2), (64, 32, 4, 2), (128, 32, 8, 2), (128, 64, 8, 1),
      (32, 64, 4, 2), (64, 32, 8, 3)]


def _cfg(c):
    from ck_fmha.backends.triton.configs import TritonFmhaConfig

    return TritonFmhaConfig(*c[:4], c[4] if len(c) > 4 else "ptr")


_INPUTS = {}


def _inputs(d, causal):
    import torch

    from ck_fmha.backends.triton import launch as ops

    key = (d, causal)
    if key not in _INPUTS:
        g = torch.Generator(device="cuda").manual_seed(d + causal)
        q, k, v = (torch.randn(B, H, S, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        o, lse = ops.fwd(q, k, v, causal=causal, return_lse=True)
        do = torch.randn_like(o)
        delta = ops.bwd_dot_do_o(o, do)
        _INPUTS[key] = (q, k, v, do, lse, delta)
    return _INPUTS[key]


def _callable(task):
    from ck_fmha.backends.triton import launch as ops

    kind, d, causal, c = task
    q, k, v, do, lse, delta = _inputs(d, causal)
    if kind == "fwd":
        return lambda: ops.fwd(q, k, v, causal=causal, config=_cfg(c))
    if kind == "kv":
        return lambda: ops.bwd_dq_dk_dv(q, k, v, do, lse, delta, causal=causal, choice=(("triton", _cfg(c)), ("none",)))
    return lambda: ops.bwd_dq_dk_dv(q, k, v, do, lse, delta, causal=causal,
                                    choice=(("triton", _cfg(KV[0])), ("triton", _cfg(c))))


def _warm(task):
    import torch

    t0 = time.time()
    try:
        _callable(task)()
        torch.cuda.synchronize()
        return task, None, time.time() - t0
    except Exception as exc:  # noqa: BLE001 - one failing config never sinks the probe
        return task, f"{type(exc).__name__}: {str(exc)[:200]}", time.time() - t0


def _peer_ms(d, causal):
    import torch
    import torch.nn.functional as F
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v, do, _, _ = _inputs(d, causal)
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))

    def fwd():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)

    def step():
        return torch.autograd.grad(fwd(), (qg, kg, vg), do)

    return (triton.testing.do_bench(fwd, warmup=10, rep=50, return_mode="median"),
            triton.testing.do_bench(step, warmup=10, rep=50, return_mode="median"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bigd_probe.json")
    ap.add_argument("--hdims", default="256")
    ap.add_argument("--compile-budget-s", type=float, default=150)
    ap.add_argument("--workers", type=int, default=14)
    a = ap.parse_args()
    import torch
    import triton

    t0 = time.time()
    tasks = [(kind, d, causal, c) for d in map(int, a.hdims.split(",")) for causal in (False, True)
             for kind, cands in (("kv", KV), ("dq", DQ), ("fwd", FWD)) for c in cands]
    ok, errors = set(), {}
    with mp.get_context("spawn").Pool(a.workers) as pool:
        it = pool.imap_unordered(_warm, tasks)
        for _ in tasks:
            try:
                task, err, secs = it.next(timeout=max(1.0, a.compile_budget_s - (time.time() - t0)))
            except (mp.TimeoutError, StopIteration):
                break
            if err:
                errors[task] = err
            else:
                ok.add(task)
        pool.terminate()
    print(f"compiled {len(ok)}/{len(tasks)} in {time.time() - t0:.0f} s, {len(errors)} failed", flush=True)
    rows, winners = [], {}
    for task in tasks:
        if task in errors:
            rows.append(dict(kind=task[0], d=task[1], causal=task[2], cfg=list(task[3]), error=errors[task]))
    for d in map(int, a.hdims.split(",")):
        for causal in (False, True):
            peer_fwd, peer_step = _peer_ms(d, causal)
            best = {}
            for kind, cands in (("kv", KV), ("dq", DQ), ("fwd", FWD)):
                for c in cands:
                    task = (kind, d, causal, c)
                    if task not in ok:
                        continue
                    ms = triton.testing.do_bench(_callable(task), warmup=10, rep=60, return_mode="median")
                    rows.append(dict(kind=kind, d=d, causal=causal, cfg=list(c), ms=round(ms, 4)))
                    print(json.dumps(rows[-1]), flush=True)
                    if kind not in best or ms < best[kind][1]:
                        best[kind] = (c, ms)
            first = {"fwd": FWD[0], "kv": KV[0], "dq": DQ[0]}
            cur = {r["kind"]: r["ms"] for r in rows if r.get("d") == d and r.get("causal") == causal
                   and "ms" in r and tuple(r["cfg"]) == first[r["kind"]]}
            winners[f"{d}/{causal}"] = dict(best={k: [list(v[0]), v[1]] for k, v in best.items()}, current=cur,
                                            cudnn_fwd_ms=round(peer_fwd, 4), cudnn_fwd_bwd_ms=round(peer_step, 4))
            print(json.dumps(winners[f"{d}/{causal}"]), flush=True)
            with open(a.out, "w") as f:
                json.dump(dict(rows=rows, winners=winners, shape=dict(b=B, h=H, s=S, dtype="bf16"),
                               device=torch.cuda.get_device_name(0)), f, indent=1)
            _INPUTS.clear()
            torch.cuda.empty_cache()


if __name__ == "__main__":
    os.environ.setdefault("TRITON_PRINT_AUTOTUNING", "0")
    main()
