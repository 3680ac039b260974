"""What the FMHA examples share: a dispatcher over CK's receipt-0 kernel space, sizes per device."""
import _common as ex

from ck_fmha.problem import FmhaProblem


def setup(doc: str, add=None):
    """(args, dispatcher): every legal fmha kernel (CK receipt 0) for the arch and backend."""
    args = ex.parse_args(doc, add)
    disp = ex.dispatcher("fmha", args, receipt=0)
    print(f"{len(disp.registry)} fmha kernels (receipt 0)")
    return args, disp


def sizes(args, cpu: dict, gpu: dict) -> dict:
    """Small shapes on the CPU (the reference is float64 NumPy), real ones on a GPU."""
    return gpu if args.gpu else cpu


def run(disp, args, label: str, **fields) -> bool:
    return ex.check(disp, FmhaProblem(**fields), args.rng, label=label)
