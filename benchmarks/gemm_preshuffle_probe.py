"""Probe: pre-shuffled weights and row-major B on the GPU, through the public API.

    python benchmarks/gemm_preshuffle_probe.py --out /tmp/preshuffle.json      (~60-90 s on an H100/H200)

Section ``preshuffle``: inference linear layers of Llama-7B (N x K of q/k/v/o fused or not, gate/up,
down) at M = 1 .. 4096 tokens, bf16: ``ck_gemm.linear(x, ck_gemm.preshuffle(w))`` (B packed once in
the Dispatcher's tile order) vs ``ck_gemm.linear(x, w)`` (the plain weight) vs
``torch.nn.functional.linear`` (cuBLAS), each eager (host overhead included) and replayed in a CUDA
graph (kernel time), medians.  The weight is packed for the row's M (``preshuffle(w, m=M)``).

Section ``rrr``: ``ck_gemm.matmul(a, b)`` with B stored K x N row-major (layout rrr) vs the same
product with B as the transposed view of an N x K tensor (rcr) vs ``torch.matmul`` on the rrr operands,
for LLM shapes with M = 300 .. 1000 and a few others.

Correct before fast: every row is first checked against an fp32 product of the same inputs (relative
Frobenius error under 2e-2); a wrong row records ``status: wrong`` and no times.  The JSON is
rewritten after every row, so a run cut by ``--budget-s`` (or a crash) still leaves its numbers.
"""
from __future__ import annotations


import argparse
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "plugins" / "gemm"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

#: Llama-7B linear layers (out_features N, in_features K)
LLAMA7B = {"qkv": (12288, 4096), "o": (4096, 4096), "gate_up": (22016, 4096), "down": (4096, 11008)}
MS = (1, 16, 128, 512, 4096)
#: (M, N, K) of the rrr section: LLM layers at M 300 .. 1000, then a square and a skinny one
RRR = [(300, 4096, 4096), (512, 11008, 4096), (700, 4096, 11008), (1000, 12288, 4096), (384, 14336, 4096),
       (2048, 2048, 2048), (64, 4096, 4096)]
TOL = 2e-2


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _times(fn) -> dict:
    from ck_core.bench import eager_and_graph_ms

    return eager_and_graph_ms(fn)


def _rel(got, want) -> float:
    return float((got.float() - want).norm() / want.norm().clamp_min(1e-30))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON results file")
    ap.add_argument("--budget-s", type=float, default=240.0, help="skip the rows left once this is spent")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--quick", action="store_true", help="M in (1, 512) and two layers only")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny shapes on the CPU, correctness only (checks this script without a GPU)")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F

    import ck_gemm
    from ck_core.hookspecs import hookimpl
    from ck_core.plugins import get_manager

    if not torch.cuda.is_available() and not args.dry_run:
        print("no CUDA device: this probe times kernels on a GPU (--dry-run checks it on the CPU)", file=sys.stderr)
        return 2
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    dev = torch.device("cpu" if args.dry_run else "cuda")
    times = (lambda fn: {}) if args.dry_run else _times
    launched: list = []   # the kernels of each Dispatcher run (ck_after_run), so a row names what ran

    class Log:
        @hookimpl
        def ck_after_run(self, launched):
            runs.append(tuple(launched))

    runs = launched
    get_manager().pm.register(Log())
    from ck_core.bench import RESULT_SCHEMA

    out = {"schema": dict(RESULT_SCHEMA), "kind": "gemm_preshuffle_probe",
           "device": "cpu (dry run)" if args.dry_run else torch.cuda.get_device_name(0),
           "date": dt.datetime.now(dt.timezone.utc).isoformat(),
           "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]), "commit": _commit(),
           "dtype": args.dtype, "torch": torch.__version__, "preshuffle": [], "rrr": [], "skipped_for_time": 0}
    t_start = time.perf_counter()
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)

    def save():
        out["seconds"] = round(time.perf_counter() - t_start, 1)
        path.write_text(json.dumps(out, indent=1))

    def over() -> bool:
        if time.perf_counter() - t_start > args.budget_s:
            out["skipped_for_time"] += 1
            return True
        return False

    g = torch.Generator(device=dev).manual_seed(20261129)
    layers = dict(list(LLAMA7B.items())[:2]) if args.quick else LLAMA7B
    ms = (1, 512) if args.quick else MS
    rrr = RRR[:3] if args.quick else RRR
    if args.dry_run:
        layers, ms, rrr = {"tiny": (40, 24)}, (1, 5), [(7, 32, 16)]
    # -- pre-shuffled weights --------------------------------------------------------------------
    for name, (n, k) in layers.items():
        w = (torch.rand(n, k, device=dev, generator=g) * 2 - 1).to(tdt) / k ** 0.5
        for m in ms:
            if over():
                continue
            row = {"layer": name, "m": m, "n": n, "k": k, "case": f"llama7b:{name} {args.dtype} {m}x{n}x{k}"}
            try:
                x = (torch.rand(m, k, device=dev, generator=g) * 2 - 1).to(tdt)
                t0 = time.perf_counter()
                pw = ck_gemm.preshuffle(w, m=m)
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                row["pack_s"], row["tile"] = round(time.perf_counter() - t0, 4), list(pw.tile)
                want = x.float() @ w.float().T
                with torch.no_grad():
                    fns = {"preshuffled": lambda: ck_gemm.linear(x, pw), "plain": lambda: ck_gemm.linear(x, w),
                           "cublas": lambda: F.linear(x, w)}
                    bad = {}
                    for key, fn in fns.items():
                        del launched[:]
                        err = _rel(fn(), want)
                        row[f"{key}_rel_err"] = err
                        if key != "cublas":
                            row[f"{key}_kernel"] = launched[-1][0] if launched and launched[-1] else "?"
                        if not err < TOL:
                            bad[key] = err
                    if bad:
                        row["status"] = "wrong"
                    else:
                        for key, fn in fns.items():
                            for mode, v in times(fn).items():
                                row[f"{key}_{mode}"] = v
                        row["status"] = "ok"
                        for mode in ("eager_ms", "graph_ms"):
                            if f"preshuffled_{mode}" in row and f"cublas_{mode}" in row:
                                row[f"ratio_{mode[:-3]}_vs_cublas"] = row[f"cublas_{mode}"] / row[f"preshuffled_{mode}"]
                                row[f"ratio_{mode[:-3]}_vs_plain"] = row[f"plain_{mode}"] / row[f"preshuffled_{mode}"]
            except Exception as exc:  # noqa: BLE001 - a failed row is recorded, the probe goes on
                row["status"] = "error"
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            out["preshuffle"].append(row)
            print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
            save()
    # -- row-major B (rrr) vs its rcr twin vs cuBLAS -----------------------------------------------
    for m, n, k in rrr:
        if over():
            continue
        row = {"m": m, "n": n, "k": k, "case": f"rrr {args.dtype} {m}x{n}x{k}"}
        try:
            a = (torch.rand(m, k, device=dev, generator=g) * 2 - 1).to(tdt)
            b_kn = ((torch.rand(k, n, device=dev, generator=g) * 2 - 1) / k ** 0.5).to(tdt)   # K x N row-major
            b_nk = b_kn.t().contiguous().t()                                                   # same values, rcr
            want = a.float() @ b_kn.float()
            fns = {"rrr": lambda: ck_gemm.matmul(a, b_kn), "rcr": lambda: ck_gemm.matmul(a, b_nk),
                   "cublas": lambda: torch.matmul(a, b_kn)}
            bad = {}
            with torch.no_grad():
                for key, fn in fns.items():
                    del launched[:]
                    err = _rel(fn(), want)
                    row[f"{key}_rel_err"] = err
                    if key != "cublas":
                        row[f"{key}_kernel"] = launched[-1][0] if launched and launched[-1] else "?"
                    if not err < TOL:
                        bad[key] = err
                if bad:
                    row["status"] = "wrong"
                else:
                    for key, fn in fns.items():
                        for mode, v in times(fn).items():
                            row[f"{key}_{mode}"] = v
                    row["status"] = "ok"
                    for mode in ("eager_ms", "graph_ms"):
                        if f"rrr_{mode}" in row and f"cublas_{mode}" in row:
                            row[f"ratio_rrr_{mode[:-3]}_vs_cublas"] = row[f"cublas_{mode}"] / row[f"rrr_{mode}"]
                            row[f"ratio_rcr_{mode[:-3]}_vs_cublas"] = row[f"cublas_{mode}"] / row[f"rcr_{mode}"]
        except Exception as exc:  # noqa: BLE001
            row["status"] = "error"
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        out["rrr"].append(row)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
        save()
    # summaries: geomeans of the ratios that ran
    from ck_core.bench import geomean

    out["summary"] = {
        "preshuffled_vs_cublas_graph": geomean(r.get("ratio_graph_vs_cublas") for r in out["preshuffle"]),
        "preshuffled_vs_plain_graph": geomean(r.get("ratio_graph_vs_plain") for r in out["preshuffle"]),
        "preshuffled_vs_cublas_eager": geomean(r.get("ratio_eager_vs_cublas") for r in out["preshuffle"]),
        "rrr_vs_cublas_graph": geomean(r.get("ratio_rrr_graph_vs_cublas") for r in out["rrr"]),
        "rcr_vs_cublas_graph": geomean(r.get("ratio_rcr_graph_vs_cublas") for r in out["rrr"]),
        "rows_wrong_or_failed": sum(r.get("status") != "ok" for r in out["preshuffle"] + out["rrr"]),
    }
    save()
    print(json.dumps(out["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
