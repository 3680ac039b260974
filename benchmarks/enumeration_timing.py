"""Time FMHA and GEMM enumeration per arch in fresh processes (cold caches).

    python benchmarks/enumeration_timing.py [OUT]   # default ck-results/enumeration.json
"""
import datetime
import json
import platform
import subprocess
import sys
from pathlib import Path

CODE = """
import time, sys
t0 = time.perf_counter()
from ck_core import enumerate_keys
t1 = time.perf_counter()
n = len(enumerate_keys(sys.argv[1], sys.argv[2], **({'receipt': 0} if sys.argv[1] == 'fmha' else {})))
t2 = time.perf_counter()
print(n, round(t2 - t1, 3), round(t1 - t0, 3))
"""


def main():
    rows = []
    for op in ("fmha", "gemm"):
        for arch in ("gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1201", "sm90"):
            best = None
            for _ in range(3):
                out = subprocess.run([sys.executable, "-c", CODE, op, arch], capture_output=True, text=True,
                                     check=True).stdout.split()
                n, secs, imp = int(out[0]), float(out[1]), float(out[2])
                best = min(best or secs, secs)
            rows.append({"op": op, "arch": arch, "kernels": n, "seconds (best of 3, cold process)": best,
                         "import_s": imp})
    from ck_core.bench import with_header

    res = {"kind": "table", "title": "enumeration time (all families, receipt 0 for FMHA; default GEMM space)",
           "date": datetime.date.today().isoformat(), "device": f"CPU ({platform.machine()}, 2 cores)",
           "command": "python benchmarks/enumeration_timing.py", "rows": rows}
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "ck-results/enumeration.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(with_header(res), indent=1))
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
