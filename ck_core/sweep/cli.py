"""``ck sweep <op>`` (also ``python -m ck_core.sweep``): the command line of the tile engine.

Enumeration options pass through as ``--<option> <value>`` pairs (as for
``ck list``), e.g. ``ck sweep gemm --arch sm90 --backend triton --dtypes fp16,bf16``.
"""
from __future__ import annotations

import argparse
import shlex
import sys

from .. import knobs


def add_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("op", help="gemm, conv, fmha, ... (`ck plugins` lists the ops)")
    k = s.add_argument_group("kernel set")
    k.add_argument("--arch", help="target arch (default: the config's own 'arch')")
    k.add_argument("--backend", default=knobs.get("CK_BACKEND") or "numpy")
    k.add_argument("--config", help="seed-format kernel config (.json/.toml: variant, trait_config, arch, receipt)")
    k.add_argument("--filter", help="safe expression over kernel fields, e.g. \"c.hdim_q == 128\"")
    k.add_argument("--filter-file", help="a .py file defining filter_config(c), or expressions one a line")
    k.add_argument("--variant", "--family", dest="variant", help="kernel family / tile-engine variant")
    k.add_argument("--max-kernels", type=int, default=0, help="keep only the first N kernels")
    k.add_argument("--count", action="store_true", help="print the number of kernels and stop")
    sh = s.add_argument_group("shapes")
    sh.add_argument("--category", default="smoke", choices=("smoke", "full", "nightly"))
    sh.add_argument("--shapes", help="testing matrix (TOML) instead of the op's own")
    m = s.add_argument_group("run")
    m.add_argument("--compile-only", action="store_true")
    m.add_argument("--verify", action="store_true",
                   help="check every row against the reference (float64 on small shapes, fp32 on the GPU)")
    m.add_argument("--workers", type=int, default=None, help="compile workers (default CK_BUILD_WORKERS or #CPUs)")
    m.add_argument("--timeout", type=float, default=120.0, help="seconds per benchmark task before 'timeout'")
    m.add_argument("--repeat", type=int, default=10, help="timed repetitions (median)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--f64-flops", type=float, default=4e9,
                   help="largest problem (FLOPs) checked against the float64 reference")
    m.add_argument("--executor", choices=("local", "ray"), default="local")
    m.add_argument("--address", help="Ray cluster address (--executor ray; default: a local instance)")
    o = s.add_argument_group("output")
    o.add_argument("--resume", action="store_true", help="skip rows already in the output files")
    o.add_argument("--csv", help="CSV file, written row by row")
    o.add_argument("--json", help="JSON file ('-' for stdout) with metadata and results")
    o.add_argument("--plot", nargs="?", const="", default=None,
                   help="PNG files (matplotlib): PREFIX_best.png, PREFIX_heatmap.png")
    o.add_argument("-q", "--quiet", "--no-progress", dest="no_progress", action="store_true",
                   help="no progress on stderr (default: bars on a terminal, a line every 30 s elsewhere)")


def options_from_args(args, extra: dict):
    from .engine import Options

    return Options(op=args.op, arch=args.arch, backend=args.backend, config=args.config, variant=args.variant,
                   filter=args.filter, filter_file=args.filter_file, max_kernels=args.max_kernels,
                   enum_options=extra, category=args.category, shapes=args.shapes,
                   compile_only=args.compile_only, verify=args.verify, workers=args.workers,
                   resume=args.resume, csv=args.csv, json=args.json, plot=args.plot, count=args.count,
                   executor=args.executor, address=args.address, timeout=args.timeout, repeat=args.repeat,
                   seed=args.seed, f64_flops=args.f64_flops, progress=False if args.no_progress else None,
                   command=" ".join(["ck", "sweep"] + [shlex.quote(a) for a in sys.argv[2:]]))


def cmd_sweep(args, extra) -> int:
    from .engine import run_sweep

    if args.plot is not None and not args.count:   # before the sweep, not after it
        from ..deps import require

        require("matplotlib", "ck sweep --plot")
    if args.executor == "ray":
        from ..deps import require

        require("ray", "ck sweep --executor ray")

    meta = run_sweep(options_from_args(args, extra))
    if meta.get("interrupted"):
        return 130
    return 0 if meta.get("count") is not None or not meta.get("status_counts", {}).get("wrong") else 1


def add_parser(sub) -> None:
    """Register ``sweep`` on the ``ck`` subcommand parser."""
    s = sub.add_parser("sweep", allow_abbrev=False,
                       help="tile engine: kernel set x testing matrix -> compile, bench, verify -> CSV/JSON/PNG")
    add_arguments(s)
    s.set_defaults(fn=cmd_sweep)
