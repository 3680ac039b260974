"""Ragged-length Gluon forward on the H100: correctness vs cuDNN SDPA and CUDA-graph timings.

For forward rows of the broad FMHA suite whose lengths are not multiples of 128 (issue #16), times
the kernel-direct default choice (``ops.fwd`` with no config: the Gluon kernel where its tables
and scope allow), the Triton kernel's tuned config (``gluon=False``), and cuDNN SDPA, all through
``ck_core.bench.eager_and_graph_ms``.  ``--base PATH``: a copy of the previous ``gluon_fwd.py``
(whole tiles only) timed against the new one on whole-tile shapes (a regression check).

    python3 benchmarks/gluonrag_probe.py --out $OUT/gluonrag.json [--base ../../plugins/.../gluon_fwd.py]
    python3 benchmarks/gluonrag_probe.py --only api --out $OUT/api.json   # the public API, fwd and fwd+bwd

benchmarks/results/gluonrag_probe_h100_2026-11-27.json: the first form on an H100 (kernel-direct
default choice vs the Triton tuned config vs cuDNN; the --only api form has not run yet).
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import time

#: (dtype, b, hq, hk, s, d, causal): ragged rows of the broad suite (baseline/fmha_broad.json)
RAGGED = [
    ("fp16", 19, 32, 8, 3418, 64, True),
    ("fp16", 2, 16, 1, 5918, 64, False),
    ("fp16", 20, 32, 8, 1201, 64, True),
    ("bf16", 2, 16, 1, 3168, 64, True),
    ("fp16", 5, 32, 1, 10966, 64, True),
    ("fp16", 2, 8, 1, 8528, 128, True),
    ("bf16", 9, 16, 2, 360, 128, True),
    ("fp16", 3, 16, 2, 18996, 128, False),
    ("bf16", 4, 16, 4, 1201, 128, False),
]
#: whole tiles: the new kernel against the previous one (--base)
WHOLE = [
    ("bf16", 4, 16, 16, 4096, 128, False),
    ("bf16", 4, 16, 16, 4096, 128, True),
    ("fp16", 8, 16, 16, 2048, 64, True),
    ("fp16", 4, 16, 16, 4096, 64, False),
]


def _rel(a, b):
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--base", default="")
    ap.add_argument("--deadline-s", type=float, default=150.0)
    ap.add_argument("--only", default="", help="ragged|whole|api (api: the public ck_fmha.attention, "
                    "forward and a training step, vs cuDNN, with the kernels its plans name)")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ck_core.bench import eager_and_graph_ms
    from ck_fmha.backends.triton import gluon_fwd, launch as ops, tuning
    from ck_fmha.backends.triton.configs import GLUON_VARIANTS

    t0 = time.time()
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}
    res = dict(device=torch.cuda.get_device_name(), date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               command="benchmarks/gluonrag_probe.py", rows=[])

    def dump():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    def inputs(dtype, b, hq, hk, s, d):
        g = torch.Generator(device="cuda").manual_seed(b * 1000003 + s)
        return [torch.randn(b, h, s, d, generator=g, device="cuda", dtype=torch.float32).to(dt[dtype])
                for h in (hq, hk, hk)]

    def cudnn(q, k, v, causal):
        def f():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
        return f

    calls = []
    real = gluon_fwd.fwd

    def counted(*a, **kw):
        calls.append((kw.get("tile"), kw.get("pingpong"), kw.get("persistent")))
        return real(*a, **kw)

    gluon_fwd.fwd = counted
    base = None
    if args.base:
        spec = importlib.util.spec_from_file_location("ck_fmha.backends.triton._gluon_fwd_base", args.base)
        base = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(base)

    if args.only == "api":
        return api(args, res, dump, inputs, cudnn, t0)
    rag = [("ragged", c) for c in RAGGED] if args.only != "whole" else []
    whole = [("whole", c) for c in WHOLE] if args.only != "ragged" and base is not None else []
    cases = rag[:4] + whole[:2] + rag[4:] + whole[2:]   # (a deadline still leaves some of each)
    for kind, (dtype, b, hq, hk, s, d, causal) in cases:
        if time.time() - t0 > args.deadline_s:
            res.setdefault("skipped_for_time", []).append([kind, dtype, b, hq, hk, s, d, causal])
            continue
        row = dict(kind=kind, dtype=dtype, b=b, hq=hq, hk=hk, s=s, d=d, causal=causal)
        try:
            q, k, v = inputs(dtype, b, hq, hk, s, d)
            peer = cudnn(q, k, v, causal)
            ref = peer()
            cfg = tuning.default_fwd_config(d, d, "sm90", causal=causal, seqlen=s)
            ck = lambda: ops.fwd(q, k, v, causal=causal)   # noqa: E731  (the default choice)
            calls.clear()
            row["err_vs_cudnn"] = _rel(ck(), ref)
            row["gluon"] = bool(calls)
            row["default_cfg"] = str(calls[0]) if calls else "triton"
            row["ck"] = eager_and_graph_ms(ck)
            row["cudnn"] = eager_and_graph_ms(peer)
            if kind == "ragged":
                tc = tuning.default_fwd_config(d, d, "sm90", causal=causal, seqlen=s, gluon=False)
                tri = lambda: ops.fwd(q, k, v, causal=causal, config=tc)   # noqa: E731
                row["triton_cfg"] = str(tc)
                row["triton_err_vs_cudnn"] = _rel(tri(), ref)
                row["triton"] = eager_and_graph_ms(tri)
            elif row["gluon"] and cfg.variant in GLUON_VARIANTS:
                v_ = gluon_fwd.GLUON_VARIANTS[cfg.variant]
                tile = (cfg.BLOCK_M, cfg.BLOCK_N, cfg.num_warps, cfg.num_stages)
                old = lambda: base.fwd(q, k, v, causal=causal, tile=tile, **v_)   # noqa: E731
                row["base_err_vs_cudnn"] = _rel(old(), ref)
                row["base"] = eager_and_graph_ms(old)
            for n in ("ck", "triton", "base"):
                if n in row and "graph_ms" in row[n] and "graph_ms" in row["cudnn"]:
                    row[f"ratio_{n}_cudnn_graph"] = row["cudnn"]["graph_ms"] / row[n]["graph_ms"]
            flops = 4 * b * hq * s * s * d * (0.5 if causal else 1.0)
            if "graph_ms" in row["ck"]:
                row["ck_tflops"] = flops / row["ck"]["graph_ms"] / 1e9
            del q, k, v, ref
        except Exception as exc:  # a failing row is reported, the others still run
            row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
        res["rows"].append(row)
        print(json.dumps({k_: (round(x, 4) if isinstance(x, float) else x) for k_, x in row.items()
                          if not isinstance(x, dict)}), flush=True)
        dump()
    rs = [r["ratio_ck_cudnn_graph"] for r in res["rows"] if r["kind"] == "ragged" and "ratio_ck_cudnn_graph" in r]
    ts = [r["ratio_triton_cudnn_graph"] for r in res["rows"] if "ratio_triton_cudnn_graph" in r]
    if rs:
        res["geomean_ragged_ck_vs_cudnn"] = math.exp(sum(map(math.log, rs)) / len(rs))
    if ts:
        res["geomean_ragged_triton_vs_cudnn"] = math.exp(sum(map(math.log, ts)) / len(ts))
    dump()
    print({k_: v for k_, v in res.items() if k_.startswith("geomean")})


def api(args, res, dump, inputs, cudnn, t0):
    """The public API (Dispatcher: selection, plans) on the ragged rows: forward and forward+backward."""
    import torch

    import ck_fmha
    import ck_fmha.api   # noqa: F401  (plan_keys)
    from ck_core.bench import eager_and_graph_ms

    for dtype, b, hq, hk, s, d, causal in sorted(RAGGED, key=lambda c: c[1] * c[2] * c[4] ** 2 * c[5]):
        if time.time() - t0 > args.deadline_s:
            res.setdefault("skipped_for_time", []).append([dtype, b, hq, hk, s, d, causal])
            continue
        row = dict(kind="api", dtype=dtype, b=b, hq=hq, hk=hk, s=s, d=d, causal=causal)
        try:
            q, k, v = inputs(dtype, b, hq, hk, s, d)
            row["kernels"] = ck_fmha.api.plan_keys(q, k, v, causal=causal)
            ours = lambda: ck_fmha.attention(q, k, v, causal=causal)   # noqa: E731
            peer = cudnn(q, k, v, causal)
            row["err_vs_cudnn"] = _rel(ours(), peer())
            row["fwd"], row["fwd_cudnn"] = eager_and_graph_ms(ours), eager_and_graph_ms(peer)
            qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
            do = torch.randn_like(q)
            ours_t = lambda: torch.autograd.grad(ck_fmha.attention(qg, kg, vg, causal=causal), (qg, kg, vg), do)  # noqa: E731
            peer_f = cudnn(qg, kg, vg, causal)
            peer_t = lambda: torch.autograd.grad(peer_f(), (qg, kg, vg), do)   # noqa: E731
            row["grad_err_vs_cudnn"] = max(_rel(a, b_) for a, b_ in zip(ours_t(), peer_t()))
            row["train"], row["train_cudnn"] = eager_and_graph_ms(ours_t), eager_and_graph_ms(peer_t)
            for n in ("fwd", "train"):
                if "graph_ms" in row[n] and "graph_ms" in row[n + "_cudnn"]:
                    row[f"ratio_{n}_cudnn_graph"] = row[n + "_cudnn"]["graph_ms"] / row[n]["graph_ms"]
            del q, k, v, qg, kg, vg, do
        except Exception as exc:  # a failing row is reported, the others still run
            row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
        res["rows"].append(row)
        print(json.dumps({k_: (round(x, 4) if isinstance(x, float) else x) for k_, x in row.items()
                          if not isinstance(x, dict) or k_ == "kernels"}), flush=True)
        dump()
    for n in ("fwd", "train"):
        rs = [r[f"ratio_{n}_cudnn_graph"] for r in res["rows"] if f"ratio_{n}_cudnn_graph" in r]
        if rs:
            res[f"geomean_api_{n}_vs_cudnn"] = math.exp(sum(map(math.log, rs)) / len(rs))
    dump()
    print({k_: v for k_, v in res.items() if k_.startswith("geomean")})


if __name__ == "__main__":
    main()
