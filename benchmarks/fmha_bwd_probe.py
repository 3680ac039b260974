"""Probe backward FMHA configs on the GPU: the dK/dV kernel first (dQ at its default),
then the dQ kernel with the best dK/dV; bf16, B=8 H=16 S=4096, hdim 64 and 128, causal
and not; the whole backward timed as `ck bench fmha` times it (do_bench median), with
cuDNN SDPA's backward on the same tensors as the reference point.

    python benchmarks/fmha_bwd_probe.py --out $OUT/bwd_probe.json
"""
import argparse
import json
import time

KV = {64: [(32, 128, 4, 3), (64, 64, 4, 3), (64, 128, 8, 3), (32, 64, 4, 3), (32, 128, 4, 4), (64, 64, 4, 4),
           (64, 128, 4, 3), (128, 128, 8, 2)],
      128: [(64, 64, 4, 3), (64, 128, 8, 2), (32, 128, 4, 3), (32, 128, 8, 3), (64, 128, 8, 3), (64, 64, 4, 4),
            (32, 64, 4, 4), (64, 64, 8, 3), (128, 64, 8, 2), (128, 128, 8, 2)]}
Q = {64: [(64, 64, 4, 3), (128, 32, 4, 3), (64, 64, 4, 4), (128, 64, 8, 3), (128, 64, 4, 3), (64, 128, 4, 3)],
     128: [(128, 64, 8, 2), (64, 64, 4, 3), (128, 32, 4, 3), (128, 64, 8, 3), (64, 128, 8, 2), (128, 128, 8, 2),
           (64, 32, 4, 4)]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bwd_probe.json")
    ap.add_argument("--budget-s", type=float, default=200)
    args = ap.parse_args()
    import torch

    from ck_core.device import current_arch

    from ck_fmha import bench as S
    from ck_fmha.backends.triton import tuning as C

    arch = current_arch(torch.device("cuda")).name

    t0 = time.time()
    rows = []

    def save():
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)

    for d in (128, 64):
        for causal in (False, True):
            base = dict(group="bwd", dtype="bf16", d=d, causal=causal, b=8, hq=16, hk=16, s=4096, det=True)
            kv0, q0 = C.default_bwd_configs(d, d, arch, causal)
            inputs = S.make_inputs(base)
            peer, _ = S.peer_callable(base, "cudnn", inputs) if hasattr(S, "peer_callable") else (None, None)
            t_peer = S.bench_ms(peer) if peer else None

            def t_of(kv, q):
                if time.time() - t0 > args.budget_s:
                    return None
                t = dict(base, cfg=(kv, q))
                try:
                    ms = S.bench_ms(S.ours_callable(t, inputs))
                except Exception as e:  # noqa: BLE001 - one failing config never sinks the probe
                    rows.append(dict(d=d, causal=causal, kv=repr(kv), q=repr(q), error=f"{type(e).__name__}: {str(e)[:200]}"))
                    return None
                tf = S.flops(t) / ms / 1e9
                row = dict(d=d, causal=causal, kv=repr(kv), q=repr(q), ms=ms, tflops=tf,
                           ratio=(t_peer / ms) if t_peer else None)
                rows.append(row)
                print(json.dumps(row), flush=True)
                save()
                return ms

            best_kv, best = kv0, t_of(kv0, q0)
            for c in KV[d]:
                kv = S._cfg(c)
                if kv == kv0:
                    continue
                ms = t_of(kv, q0)
                if ms is not None and (best is None or ms < best):
                    best_kv, best = kv, ms
            best_q = q0
            for c in Q[d]:
                q = S._cfg(c)
                if q == q0:
                    continue
                ms = t_of(best_kv, q)
                if ms is not None and (best is None or ms < best):
                    best_q, best = q, ms
            summ = dict(d=d, causal=causal, summary=True, best_kv=repr(best_kv), best_q=repr(best_q), best_ms=best,
                        peer_ms=t_peer, ratio=(t_peer / best) if (t_peer and best) else None)
            rows.append(summ)
            print(json.dumps(summ), flush=True)
            save()
            del inputs
            torch.cuda.empty_cache()
    save()


if __name__ == "__main__":
    main()
