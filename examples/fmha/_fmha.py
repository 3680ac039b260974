"""What the FMHA examples share: a dispatcher over CK's receipt-0 kernel space, sizes per device,
one-kernel registries, timing and the sweep table."""
import statistics
import time

import _common as ex

from ck_core import Dispatcher, Registry
from ck_fmha.problem import FmhaProblem


def setup(doc: str, add=None):
    """(args, dispatcher): every legal fmha kernel (CK receipt 0) for the arch and backend."""
    args = ex.parse_args(doc, add)
    disp = ex.dispatcher("fmha", args, receipt=0)
    print(f"{len(disp.registry)} fmha kernels (receipt 0)")
    return args, disp


def sizes(args, cpu: dict, gpu: dict) -> dict:
    """Small shapes on the CPU (the reference is float64 NumPy), real ones on a GPU.  Every GPU run is
    still checked against that host reference, which costs ~0.1 s per million score elements
    (batch x heads x seqlen_q x seqlen_k) on one core: an example keeps its total to a few hundred million."""
    return gpu if args.gpu else cpu


def run(disp, args, label: str, **fields) -> bool:
    return ex.check(disp, FmhaProblem(**fields), args.rng, label=label)


def tile_m(fields: dict) -> int:
    """Query rows per tile block: ``tile[0]`` of a CK instance, ``block_m`` of a Triton key
    (the two kernel spaces spell it differently)."""
    if "block_m" in fields:
        return fields["block_m"]
    return (fields.get("tile") or [0])[0]


def alone(key, args, name: str = "") -> Dispatcher:
    """A dispatcher whose registry holds only ``key``: it has to run exactly that kernel."""
    return Dispatcher(Registry(args.arch, [key], name=name or "one"), backend=args.backend)


def inputs(disp, p, rng) -> dict:
    op, bk = disp.mgr.op("fmha"), disp.backend_spec
    return {k: bk.to_backend(v) for k, v in op.make_inputs(p, rng).items()}


def times(disp, p, x: dict, warmup: int = 1, iters: int = 3) -> list:
    """Seconds per call of ``disp.run_dict(p, x)`` after ``warmup`` calls (synchronized)."""
    bk = disp.backend_spec
    for _ in range(warmup):
        disp.run_dict(p, x)
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        disp.run_dict(p, x)
        if bk.synchronize:
            bk.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def sweep(disp, args, problems: dict) -> bool:
    """Validate and time each ``label -> FmhaProblem``; print one table row per point."""
    op, rows, ok = disp.mgr.op("fmha"), [], True
    for label, p in problems.items():
        good = ex.check(disp, p, args.rng, label=label, show_plan=False)
        med = statistics.median(times(disp, p, inputs(disp, p, args.rng)))
        rows.append({"point": label, "ms": f"{med * 1e3:.3f}", "TFLOPS": f"{op.flops(p) / med / 1e12:.4f}",
                     "valid": "PASS" if good else "FAIL"})
        ok &= good
    ex.table(rows, list(rows[0]))
    if not args.gpu:
        print("(numpy backend: the times are the host reference's, not a GPU's)")
    return ok
