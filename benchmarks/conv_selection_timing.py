"""Time conv's key space and a new problem's selection through the public API's Dispatcher (CPU).

    python benchmarks/conv_selection_timing.py [OUT]     # default ck-results/conv_selection.json

Rows: ``ck list conv --arch sm90 --backend triton --count`` (a fresh process); per direction,
the public API's registry load (``ck_core.api.dispatcher_for``), the first selection of a
problem of a new specialisation (lists that specialisation's algorithms once), the first
selection of each further new problem (median and max over random problems), and a warm call.
"""
import datetime
import json
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _problem(rng, direction):
    from ck_conv.problem import ConvProblem

    kind = rng.choice(["3x3", "1x1", "dw", "grouped", "stem"])
    n, hw = rng.choice([1, 8, 32]), rng.choice([7, 14, 28, 56, 57, 112])
    if kind == "3x3":
        kw = dict(C=rng.choice([64, 128, 256, 512]), K=rng.choice([64, 128, 256]), filter=(3, 3), pad_left=(1, 1),
                  pad_right=(1, 1))
    elif kind == "1x1":
        kw = dict(C=rng.choice([64, 256, 1024]), K=rng.choice([64, 256, 2048]), filter=(1, 1))
    elif kind == "dw":
        c, f = rng.choice([32, 96, 144, 384]), rng.choice([3, 5])
        kw = dict(G=c, C=c, K=c, filter=(f, f), pad_left=(f // 2,) * 2, pad_right=(f // 2,) * 2,
                  stride=(rng.choice([1, 2]),) * 2)
    elif kind == "grouped":
        g = rng.choice([8, 32])
        c = g * rng.choice([4, 8, 16])
        kw = dict(G=g, C=c, K=c, filter=(3, 3), pad_left=(1, 1), pad_right=(1, 1))
    else:
        kw = dict(C=3, K=64, filter=(7, 7), stride=(2, 2), pad_left=(3, 3), pad_right=(3, 3))
        hw = 224
    return ConvProblem(N=n, input_spatial=(hw, hw), direction=direction, dtype="fp16", **kw)


def main(problems: int = 40):
    t0 = time.perf_counter()
    count = subprocess.run([sys.executable, "-m", "ck_core", "list", "conv", "--arch", "sm90", "--backend",
                            "triton", "--count"], capture_output=True, text=True, check=True).stdout.split()[-1]
    rows = [{"what": "ck list conv --arch sm90 --backend triton --count", "kernels": int(count),
             "seconds": round(time.perf_counter() - t0, 3)}]
    from ck_core import api

    rng = random.Random(1)
    for backend in ("triton", "numpy"):
        for direction in ("forward", "bwd_data", "bwd_weight"):
            t0 = time.perf_counter()
            disp = api.dispatcher_for("conv", "sm90", backend, directions=(direction,), dtypes=("fp16",),
                                      ndims=(2,), layouts=("nhwgc",))
            load = time.perf_counter() - t0
            firsts, times = {}, []
            for _ in range(problems):
                p = _problem(rng, direction)
                t0 = time.perf_counter()
                disp.plan(p)
                dt = time.perf_counter() - t0
                if p.specialization not in firsts:   # this specialisation's algorithms listed now
                    firsts[p.specialization] = dt
                else:
                    times.append(dt)
            t0 = time.perf_counter()
            disp.plan(p)
            warm = time.perf_counter() - t0
            rows.append({"what": f"public API {backend} {direction} fp16 2D", "registry_load_ms": round(load * 1e3, 2),
                         "first_of_a_specialisation_ms": {k: round(v * 1e3, 1) for k, v in firsts.items()},
                         "new_problem_ms_median": round(statistics.median(times) * 1e3, 3),
                         "new_problem_ms_max": round(max(times) * 1e3, 2), "new_problems": len(times),
                         "warm_plan_us": round(warm * 1e6, 2)})
            print(rows[-1])
    from ck_core.bench import with_header

    res = {"kind": "table", "title": "conv key space and new-problem selection (Dispatcher.plan through the "
                                     "public API's cached Dispatcher, sm90 registry)",
           "date": datetime.date.today().isoformat(), "device": f"CPU ({platform.machine()}, 2 shared cores)",
           "command": "python benchmarks/conv_selection_timing.py", "rows": rows}
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "ck-results/conv_selection.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(with_header(res), indent=1))
    print(rows[0])


if __name__ == "__main__":
    main()
