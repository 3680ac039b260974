"""Wall time and verdict of the front-door commands (`ck demo`, `ck run` of each op), as a user types them.

    python benchmarks/cli_timing.py --out cli_timing.json [--backend triton] [--arch sm90] [--repeat 3]

Each command runs in a fresh process (plugin loading, enumeration, selection, the run and its
float64 check included); the JSON holds, per command, the exit code, whether it printed PASS, and the
best and median wall seconds of ``--repeat`` runs, plus the machine (CPU count, GPU if torch sees one).
Target (issue #31): every `ck run` <= 1.5 s and `ck demo` likewise on a 2-core machine (numpy backend).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CASES = {
    "demo": ["demo"],
    "run_gemm": ["run", "gemm", "--m", "64", "--n", "64", "--k", "64"],
    "run_gemm_odd": ["run", "gemm", "--m", "1000", "--n", "513", "--k", "77", "--dtype", "bf16"],
    "run_conv": ["run", "conv", "--N", "2", "--G", "2", "--C", "8", "--K", "12", "--input_spatial", "9,11",
                 "--filter", "3,3", "--pad_left", "1,0", "--pad_right", "1,2"],
    "run_fmha": ["run", "fmha", "--batch", "2", "--nhead_q", "4", "--seqlen_q", "40", "--seqlen_k", "50",
                 "--mask", "b", "--window", "8,4"],
    "run_fmha_bwd": ["run", "fmha", "--family", "bwd_dq_dk_dv", "--batch", "1", "--nhead_q", "2",
                     "--seqlen_q", "64", "--seqlen_k", "64", "--hdim_q", "64", "--mask", "top_left"],
}


def _gpu() -> str:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    except Exception:
        return ""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the JSON file to write")
    p.add_argument("--backend", default="numpy")
    p.add_argument("--arch", default=None, help="default: sm90 for triton, gfx942 for numpy")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    arch = args.arch or ("sm90" if args.backend == "triton" else "gfx942")
    rows = {}
    for name, cmd in CASES.items():
        full = [sys.executable, "-m", "ck_core", *cmd]
        full += ["--backend", args.backend] + ([] if cmd[0] == "demo" else ["--arch", arch])
        times, rc, passed, tail = [], None, None, ""
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            r = subprocess.run(full, capture_output=True, text=True, timeout=600)
            times.append(time.perf_counter() - t0)
            rc, passed, tail = r.returncode, "PASS" in r.stdout and "FAIL" not in r.stdout, (r.stdout + r.stderr)[-600:]
        rows[name] = {"command": " ".join(["ck", *full[3:]]), "rc": rc, "passed": passed,
                      "best_s": round(min(times), 3), "median_s": round(statistics.median(times), 3),
                      "tail": "" if rc == 0 else tail}
        print(f"{name:14s} rc={rc} pass={passed} best {min(times):.2f} s  median {statistics.median(times):.2f} s",
              file=sys.stderr)
    from ck_core.bench import with_header   # the results header (schema, device, date, command, commit)

    gpu = _gpu()
    doc = {"what": "front-door command wall times (benchmarks/cli_timing.py)", "backend": args.backend, "arch": arch,
           "cpus": os.cpu_count(), "gpu": gpu, "cases": rows}
    with open(args.out, "w") as f:
        json.dump(with_header(doc, device=gpu or f"CPU ({os.cpu_count()} cores)"), f, indent=1)
    return 0 if all(r["rc"] == 0 for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
