"""GPU check of the GEMM tail (issue #29): column-major A / row-major B layouts and pre-shuffled weights.

    python benchmarks/gemm_tail_check.py --out /tmp/gemm_tail.json       (under 2 minutes on an H100/H200)
    python benchmarks/gemm_tail_check.py --dry-run --out /tmp/t.json     (tiny shapes on the CPU: the script only)

Section ``layouts``: ``Dispatcher.run`` on operands stored as the layout says (what the broad suite
times: crr / ccr with M not a multiple of 16, whose pointer kernels now read A by cp.async vectors
through the launcher's A_VEC fact, rrr, and the rcr twin of each) against ``torch.matmul`` on the
logical views; eager and CUDA-graph medians, ratio = torch / ours.

Section ``preshuffle``: ``ck_gemm.linear(x, ck_gemm.preshuffle(w, m=M))`` vs ``ck_gemm.linear(x, w)`` vs
``F.linear`` at the shapes where the pre-shuffled keys were slower (Llama-7B qkv at M = 1, 16, 512;
4096 x 4096 at M = 1), bf16; ``ratio_*_vs_plain`` >= 1 is the target where the selector packs.

Every row is checked against fp32 first (relative error under 2e-2; a wrong row gets no times).  The
JSON is rewritten after every row, so a run cut by ``--budget-s`` still leaves its numbers.
"""
from __future__ import annotations


import argparse
import datetime as dt
import json
import math
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "plugins" / "gemm"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

#: (dtype, layout, M, N, K): the broad suite's slow layout rows, then their rcr twins and rrr
LAYOUT_CASES = [("bf16", "crr", 22, 4608, 3584), ("bf16", "rcr", 22, 4608, 3584),
                ("fp16", "ccr", 404, 3584, 3584), ("fp16", "crr", 404, 3584, 3584), ("fp16", "rcr", 404, 3584, 3584),
                ("fp16", "rrr", 700, 4096, 11008), ("fp16", "ccr", 100, 4096, 4096)]
#: (name, M, N, K) of the pre-shuffle section
PRESHUFFLE_CASES = [("llama7b:qkv", 1, 12288, 4096), ("llama7b:qkv", 16, 12288, 4096),
                    ("llama7b:qkv", 512, 12288, 4096), ("llama7b:o", 1, 4096, 4096)]
TOL = 2e-2


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _rel(got, want) -> float:
    return float((got.float() - want).norm() / want.norm().clamp_min(1e-30))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON results file")
    ap.add_argument("--budget-s", type=float, default=100.0, help="skip the rows left once this is spent")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU, correctness only")
    args = ap.parse_args(argv)
    if args.dry_run:
        import os
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ.setdefault("CK_BACKEND", "triton")

    import torch
    import torch.nn.functional as F

    import ck_gemm
    from ck_core import Dispatcher, Registry
    from ck_core.plugins import get_manager
    from ck_gemm.bench import _gpu_arch
    from ck_gemm.problem import GemmProblem

    if not torch.cuda.is_available() and not args.dry_run:
        print("no CUDA device: this check times kernels on a GPU (--dry-run checks the script on the CPU)",
              file=sys.stderr)
        return 2
    dev = torch.device("cpu" if args.dry_run else "cuda")
    if args.dry_run:
        def times(fn):
            return {}
    else:
        from ck_core.bench import eager_and_graph_ms as times
    arch = "sm90" if args.dry_run else _gpu_arch(get_manager(), None).name
    from ck_core.bench import RESULT_SCHEMA

    out = {"schema": dict(RESULT_SCHEMA), "kind": "gemm_tail_check",
           "device": "cpu (dry run)" if args.dry_run else torch.cuda.get_device_name(0), "arch": arch,
           "date": dt.datetime.now(dt.timezone.utc).isoformat(),
           "command": " ".join([Path(sys.argv[0]).name] + (sys.argv[1:] if argv is None else list(argv))),
           "commit": _commit(), "torch": torch.__version__, "layouts": [], "preshuffle": [], "skipped_for_time": 0}
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

    def timed(row, fns, want, peer, names=None):
        bad = {}
        for key, fn in fns.items():
            err = _rel(fn(), want)
            row[f"{key}_rel_err"] = round(err, 6)
            if not err < TOL:
                bad[key] = err
        if bad:
            row["status"] = "wrong"
            return
        for key, fn in fns.items():
            for mode, v in times(fn).items():
                row[f"{key}_{mode}"] = v
        row["status"] = "ok"
        for key in fns:
            for mode in ("eager", "graph"):
                if key != peer and f"{key}_{mode}_ms" in row and f"{peer}_{mode}_ms" in row:
                    row[f"ratio_{key}_{mode}"] = round(row[f"{peer}_{mode}_ms"] / row[f"{key}_{mode}_ms"], 4)

    g = torch.Generator(device=dev).manual_seed(20261129)
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}
    disps = {}
    layout_cases = LAYOUT_CASES
    ps_cases = PRESHUFFLE_CASES
    if args.dry_run:   # the interpreter: fp16 only (its bf16 dot is wrong), tiny sizes
        layout_cases = [("fp16", lay, 22, 40, 36) for lay in ("crr", "ccr", "rrr", "rcr")]
        ps_cases = [("tiny", 1, 40, 24), ("tiny", 20, 40, 24)]
    for dtype, layout, m, n, k in layout_cases:
        if over():
            continue
        row = {"case": f"{dtype} {layout} {m}x{n}x{k}", "dtype": dtype, "layout": layout, "m": m, "n": n, "k": k}
        try:
            if (dtype, layout) not in disps:
                disps[dtype, layout] = Dispatcher(Registry.from_enumeration(
                    "gemm", arch, "triton", dtypes=[dtype], layouts=[layout]), backend="triton")
            disp = disps[dtype, layout]
            p = GemmProblem(m=m, n=n, k=k, dtype=dtype, layout=layout)
            a = torch.randn(*((m, k) if layout[0] == "r" else (k, m)), device=dev, generator=g).to(tdt[dtype])
            b = torch.randn(*((k, n) if layout[1] == "r" else (n, k)), device=dev, generator=g).to(tdt[dtype])
            al = a if layout[0] == "r" else a.t()
            bl = b if layout[1] == "r" else b.t()
            row["kernel"] = disp.select(p).name
            timed(row, {"ours": lambda: disp.run(p, a, b), "torch": lambda: torch.matmul(al, bl)},
                  al.float() @ bl.float(), "torch")
        except Exception as exc:  # noqa: BLE001 - a failed row is recorded, the check goes on
            row["status"], row["error"] = "error", f"{type(exc).__name__}: {str(exc)[:300]}"
        out["layouts"].append(row)
        print(json.dumps(row), flush=True)
        save()
    ps_dtype = torch.float16 if args.dry_run else torch.bfloat16
    for name, m, n, k in ps_cases:
        if over():
            continue
        row = {"case": f"{name} {m}x{n}x{k}", "m": m, "n": n, "k": k}
        try:
            w = ((torch.rand(n, k, device=dev, generator=g) * 2 - 1) / math.sqrt(k)).to(ps_dtype)
            x = (torch.rand(m, k, device=dev, generator=g) * 2 - 1).to(ps_dtype)
            pw = ck_gemm.preshuffle(w, m=m)
            row["tile"] = list(pw.tile)
            with torch.no_grad():
                timed(row, {"preshuffled": lambda: ck_gemm.linear(x, pw), "plain": lambda: ck_gemm.linear(x, w),
                            "cublas": lambda: F.linear(x, w)}, x.float() @ w.float().T, "cublas")
            for mode in ("eager", "graph"):
                if f"preshuffled_{mode}_ms" in row:
                    row[f"ratio_{mode}_vs_plain"] = round(row[f"plain_{mode}_ms"] / row[f"preshuffled_{mode}_ms"], 4)
        except Exception as exc:  # noqa: BLE001
            row["status"], row["error"] = "error", f"{type(exc).__name__}: {str(exc)[:300]}"
        out["preshuffle"].append(row)
        print(json.dumps(row), flush=True)
        save()
    save()
    bad = [r["case"] for r in out["layouts"] + out["preshuffle"] if r.get("status") != "ok"]
    print(f"wrote {path} in {out['seconds']} s; not ok: {bad or 'none'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
