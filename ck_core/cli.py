"""The ``ck`` command line (also ``python -m ck_core``).

Op-specific problem fields and enumeration options are passed as
``--<field> <value>`` pairs and handed to the op plugin, so a new op needs
no CLI code.
"""
from __future__ import annotations

import argparse
import itertools
import json
import logging
import sys
import time
from typing import Optional, Sequence

import attrs
import numpy as np

from . import __version__, knobs
from .progress import busy
from .cliargs import non_negative_int, positive_int
from .errors import CkError, ConfigError, InvalidProblem

log = logging.getLogger(__name__)


def _convert(text: str):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    if "," in text:
        return [_convert(t) for t in text.split(",") if t]
    return text


def _extras(tokens: Sequence[str]) -> dict:
    out, i = {}, 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--") or len(tok) < 3:
            raise ConfigError(f"unexpected argument {tok!r}; options look like --name value")
        name = tok[2:].replace("-", "_")
        if "=" in name:
            name, val = name.split("=", 1)
            i += 1
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            # one value, or several (``--variants standard preshuffle``): a list, as with commas
            j = i + 1
            while j < len(tokens) and not tokens[j].startswith("--"):
                j += 1
            if j - i > 2:
                out[name] = [v for t in tokens[i + 1:j] for v in _as_list(_convert(t))]
                i = j
                continue
            val = tokens[i + 1]
            i += 2
        else:
            val, i = "true", i + 1
        out[name] = _convert(val)
    return out


def _as_list(v) -> list:
    return v if isinstance(v, list) else [v]


def _print_table(rows: list[dict], cols: Sequence[str], out=sys.stdout) -> None:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) if rows else len(c) for c in cols}
    out.write("  ".join(c.ljust(widths[c]) for c in cols) + "\n")
    for r in rows:
        out.write("  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols) + "\n")


# -- commands ------------------------------------------------------------------

def cmd_plugins(args, extra):
    from .plugins import get_manager

    mgr = get_manager()
    if args.json:
        print(json.dumps({"loaded": mgr.loaded, "ops": sorted(mgr.ops()), "archs": sorted(mgr.archs()),
                          "backends": sorted(mgr.backends())}, indent=1))
        return 0
    _print_table(mgr.loaded, ("name", "group", "distribution", "module"))
    print(f"\nops: {', '.join(sorted(mgr.ops()))}")
    print(f"archs: {', '.join(sorted(mgr.archs()))}")
    rows = []
    for name, b in sorted(mgr.backends().items()):
        ok, why = b.available()
        rows.append({"backend": name, "available": "yes" if ok else f"no ({why})",
                     "distribution": b.distribution})
    print()
    _print_table(rows, ("backend", "available", "distribution"))
    return 0


def cmd_archs(args, extra):
    from .plugins import get_manager

    archs = [a.summary() for a in sorted(get_manager().archs().values(), key=lambda a: a.name)]
    if args.json:
        print(json.dumps(archs, indent=1))
        return 0
    for a in archs:
        a["target"] = ",".join(map(str, a["triton_target"] or ()))
        a["lds_KiB"] = a["lds_bytes"] // 1024
        a["dtypes"] = ",".join(a["dtypes"])
    _print_table(archs, ("name", "vendor", "family", "warp_size", "lds_KiB", "compute_units",
                         "target", "dtypes", "distribution"))
    return 0


def _check_names(args) -> None:
    """Unknown op, arch or backend names fail here, before seconds of enumeration."""
    from .plugins import get_manager

    mgr = get_manager()
    mgr.op(args.op)
    mgr.arch(args.arch)
    mgr.backend(args.backend)


def _registry_from_args(args, extra):
    from .filters import compile_filter, load_filter_file
    from .registry import Registry

    _check_names(args)
    with busy(f"enumerating {args.op} kernels for {args.arch}/{args.backend}"):
        reg = Registry.from_enumeration(args.op, args.arch, args.backend, **extra)
    with busy(f"filtering {len(reg)} kernels"):
        if args.filter:
            reg = reg.filter(compile_filter(args.filter))
        if args.filter_file:
            reg = reg.filter(load_filter_file(args.filter_file))
    return reg


def cmd_list(args, extra):
    t0 = time.perf_counter()
    reg = _registry_from_args(args, extra)
    secs = time.perf_counter() - t0
    if args.count:
        if args.json:
            print(json.dumps({"op": args.op, "arch": args.arch, "backend": args.backend,
                              "count": len(reg), "seconds": round(secs, 4), **extra}))
        else:
            print(len(reg))
        return 0
    if args.json:
        print(json.dumps(reg.to_dict(), indent=1))
        return 0
    for k in reg:
        print(getattr(k.signature, "ck_name", k.name) if args.ck_names else k.name)
    return 0


def _check_output(path) -> None:
    """Refuse an output file in a missing folder before the work that would fill it."""
    from pathlib import Path

    target = Path(path).expanduser()
    if target.is_dir():
        raise ConfigError(f"cannot write {path}: it is a folder; give a file name inside it")
    if not target.parent.is_dir():
        raise ConfigError(f"cannot write {path}: folder {target.parent} does not exist; create it first")


def cmd_export(args, extra):
    _check_output(args.output)
    reg = _registry_from_args(args, extra)
    with busy(f"writing {len(reg)} kernels"):
        path = reg.export_json(args.output)
    print(f"wrote {len(reg)} kernels to {path}")
    return 0


def cmd_import(args, extra):
    from .registry import Registry

    with busy(f"reading and checking {args.file}"):
        reg = Registry.import_json(args.file)
    ops: dict[str, int] = {}
    for k in reg:
        ops[k.op] = ops.get(k.op, 0) + 1
    if args.run:
        from .cli_help import imported_run_setup

        op, problem, backend = imported_run_setup(reg, ops, args, extra, _problem)
        args.arch, args.backend = reg.arch, backend
        return _run_and_report(args, op, problem, reg)
    print(f"{args.file}: registry {reg.name!r}, arch {reg.arch}, {len(reg)} kernels")
    for op, n in sorted(ops.items()):
        print(f"  {op}: {n}")
    return 0


def _problem(op, extra):
    # a problem class may take shorthand flags (e.g. a window as one list): it expands them
    expand = getattr(op.problem_type, "expand_cli", None)
    if expand is not None:
        extra = expand(dict(extra))
    fields = {f.name for f in attrs.fields(op.problem_type)}
    pdict = {k: v for k, v in extra.items() if k in fields}
    rest = {k: v for k, v in extra.items() if k not in fields}
    for k, v in pdict.items():
        if isinstance(v, list):
            pdict[k] = tuple(v)
    needed = [f.name for f in attrs.fields(op.problem_type) if f.default is attrs.NOTHING]
    missing = [n for n in needed if n not in pdict]
    if missing:
        raise InvalidProblem(f"a {op.name} problem needs {', '.join('--' + n for n in missing)} "
                             f"(required: {', '.join('--' + n for n in needed)})")
    return op.problem_type.from_dict(pdict), rest


def narrowed_options(op, problem, options: dict) -> dict:
    """The enumeration options of a registry for ``problem``: the op's narrowing
    (``OpSpec.problem_options``: only the keys that can run it, as the public API
    enumerates) under the ones the user gave."""
    narrow = op.problem_options(problem) if op.problem_options else {}
    return {**narrow, **options}


def _seconds_for(dispatcher, problem, inputs, repeat):
    backend = dispatcher.backend_spec
    if backend.timer is not None:
        return backend.timer(lambda: dispatcher.run_dict(problem, inputs), repeat)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        dispatcher.run_dict(problem, inputs)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _problem_registry(args, extra):
    """``(op spec, Problem, Registry)`` of ``ck run`` / ``ck tune``: the problem the command line
    describes and the keys of ``--arch`` / ``--backend`` enumerated for it (narrowed to its options)."""
    from .plugins import get_manager
    from .registry import Registry

    op = get_manager().op(args.op)
    problem, options = _problem(op, extra)
    _check_names(args)
    with busy(f"enumerating {args.op} kernels for {args.arch}/{args.backend}"):
        reg = Registry.from_enumeration(args.op, args.arch, args.backend,
                                        **narrowed_options(op, problem, options))
    return op, problem, reg


def cmd_run(args, extra):
    op, problem, reg = _problem_registry(args, extra)
    return _run_and_report(args, op, problem, reg)


def _run_and_report(args, op, problem, reg):
    """Dispatch ``problem`` over ``reg``, validate, time and print (text, --json or --csv)."""
    from .dispatcher import Dispatcher
    from .validate import compare_all

    if args.kfilter:
        reg = reg.filter(args.kfilter)
    tuning = None
    if args.tuned:
        from .winners import Winners
        tuning = Winners()
    disp = Dispatcher(reg, backend=args.backend, tuning=tuning)
    with busy(f"selecting among {len(reg)} kernels"):
        plan = disp.plan(problem)
    rng = np.random.default_rng(args.seed)
    inputs = op.make_inputs(problem, rng)
    bk = disp.backend_spec
    moved = {k: bk.to_backend(v) for k, v in inputs.items()}
    with busy(f"running {len(plan.stages)} stage(s) (a first call compiles)"):
        t_first = time.perf_counter()
        outs = disp.run_dict(problem, moved)
        t_first = time.perf_counter() - t_first
    result = {"problem": problem.to_dict(), "arch": args.arch, "backend": args.backend,
              "plan": plan.describe(), "candidates": len(reg.candidates(problem, args.backend))}
    if not args.no_validate:
        with busy("computing the float64 reference"):
            ref = op.reference(problem, inputs)
        tol = op.tolerance(problem) if op.tolerance else {}
        dtypes = {k: getattr(problem, "dtype_c", getattr(problem, "dtype", "fp32")) for k in ref}
        report = compare_all({k: bk.to_numpy(outs[k]) for k in ref}, ref, dtypes, tol)
        result["validation"] = [attrs.asdict(v) for v in report.verdicts]
        result["passed"] = report.passed
    if args.repeat is None and bk.timer is None:
        secs = t_first   # host code (numpy): its time is no kernel's, so not worth repeating by default
    else:
        repeat = args.repeat or 3
        with busy(f"timing {repeat} runs"):
            secs = _seconds_for(disp, problem, moved, repeat)
    result["seconds"] = secs
    if op.flops:
        result["tflops"] = op.flops(problem) / secs / 1e12
    if args.json:
        print(json.dumps(result, indent=1))
    elif args.csv:
        from .cli_help import write_run_csv
        write_run_csv(result, sys.stdout)
    else:
        print(f"problem : {problem}")
        print(f"arch    : {args.arch}   backend: {args.backend}   candidates: {result['candidates']}")
        for st in plan.stages:
            print(f"kernel  : [{st.name}] {st.key.name}")
        if not args.no_validate:
            for v in report.verdicts:
                print(f"verdict : {v}")
        extra_t = f"  ({result['tflops']:.3f} TFLOPS)" if "tflops" in result else ""
        print(f"time    : {secs * 1e3:.3f} ms{extra_t}")
    if not args.no_validate and not result["passed"]:
        return 1
    return 0


def _build_preset(args):
    """`ck build --preset NAME --arch A [--out DIR] [--wheel DIR]`: the kernels the shipped
    selection picks for the preset's problems, compiled into the cache (or DIR)."""
    from pathlib import Path

    from . import presets

    if args.op or args.filter or args.filter_file or args.limit:
        raise ConfigError("--preset names the kernels itself: drop the op, --filter, --filter-file and --limit")
    out = Path(args.out).expanduser() if args.out else None
    if args.wheel and out is None:
        raise ConfigError("--wheel packs a built set: give --out DIR too (the set is built there)")
    with busy(f"selecting the kernels of preset {args.preset!r} on {args.arch}"):
        preset = presets.load(args.preset)
        keys, sel = presets.keys(preset, args.arch)
    print(f"preset {args.preset}: {len(keys)} kernels picked for {sel['problems']} problems"
          + (f" ({sel['unsupported']} unsupported on {args.arch})" if sel["unsupported"] else ""))
    if args.list_keys:
        for k in keys:
            print(k.name)
        return 0
    from .build import build_registry
    from .registry import Registry

    reg = Registry(args.arch, keys, name=f"preset:{Path(args.preset).stem}")
    report = build_registry(reg, max_workers=args.workers,
                            cache_root=str(out / "kernels") if out else None)
    print(report.summary())
    for name, err in sorted(report.failed.items()):
        print(f"FAILED {name}: {err}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"preset": args.preset, "arch": args.arch, "selection": sel, "keys": [k.name for k in keys],
                       "built": report.built, "failed": report.failed, "seconds": report.seconds,
                       "workers": report.workers}, f, indent=1, default=str)
    if args.wheel:
        from .kernel_wheel import write_wheel

        whl = write_wheel(out / "kernels", args.arch, Path(args.wheel).expanduser(), preset=args.preset)
        print(f"wrote {whl} (pip install it: launches find its kernels read-only)")
    return 0 if report.ok or args.keep_going else 1


def cmd_build(args, extra):
    if args.json:
        _check_output(args.json)
    if args.preset:
        return _build_preset(args)
    if not args.op:
        raise ConfigError("ck build needs an op (ck build fmha --arch sm90 --backend triton) "
                          "or --preset NAME (ck build --preset default --arch sm90)")
    reg = _registry_from_args(args, extra)
    if args.limit:
        from .registry import Registry
        reg = Registry(reg.arch, itertools.islice(reg, args.limit), name=reg.name)   # lists no further
    report = reg.build(max_workers=args.workers)
    print(report.summary())
    for name, err in sorted(report.failed.items()):
        print(f"FAILED {name}: {err}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"built": report.built, "failed": report.failed, "seconds": report.seconds,
                       "workers": report.workers}, f, indent=1, default=str)
    if report.ok or args.keep_going:
        return 0
    # 4: nothing could compile here (no toolchain); 5: kernels that failed to compile
    missing = all(str(e).startswith("ToolchainMissing") for e in report.failed.values())
    return 4 if missing else 5


def cmd_cache(args, extra):
    from .cache import KernelCache

    cache = KernelCache()
    if args.action == "clear":
        from .backends.ck_backend import source_dir
        from .cache import remove_path

        n = cache.clear()
        src = source_dir()  # the ck backend's generated CK Tile sources live beside the kernels
        had_src = src.exists()
        if had_src:
            remove_path(src)
        print(f"removed {n} cached kernels from {cache.root}"
              + (f" and the generated CK sources in {src}" if had_src else ""))
    else:
        print(json.dumps(cache.stats(), indent=1))
    return 0


class _RetiredDb(argparse.Action):
    """``ck tune --db PATH``: the single-file tuning table it wrote is retired."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is retired: `ck tune` records winners in the tuned-data store "
                     f"(CK_TUNED_DIR, default <cache dir>/tuning.d); to write another store, run "
                     f"CK_TUNED_DIR={values} ck tune ...")


def cmd_tune(args, extra):
    from .dispatcher import Dispatcher
    from .tuning import tune
    from .winners import Winners

    op, problem, reg = _problem_registry(args, extra)
    if args.kfilter:
        reg = reg.filter(args.kfilter)
    disp = Dispatcher(reg, backend=args.backend)
    with busy(f"selecting among {len(reg)} kernels"):
        disp.plan(problem)  # refuses a problem that cannot run (or fit) before its inputs are drawn
    inputs = op.make_inputs(problem, np.random.default_rng(0))
    bk = disp.backend_spec
    moved = {k: bk.to_backend(v) for k, v in inputs.items()}
    timer = (lambda fn: bk.timer(fn, args.repeat)) if bk.timer else (
        lambda fn: _seconds_for_fn(fn, args.repeat))
    table = Winners(command=" ".join(["ck", *sys.argv[1:]]))   # the user's tuned-data store
    with busy(f"timing the candidates of {len(reg)} kernels" + (f" (top {args.top})" if args.top else "")):
        results = tune(disp, problem, moved, timer, table, top=args.top)
    table.save()
    rows = [{"rank": i + 1, "kernel": n, "ms": f"{s * 1e3:.4f}"} for i, (n, s) in enumerate(results[: args.show])]
    _print_table(rows, ("rank", "ms", "kernel"))
    print(f"winner recorded in {table.path}")
    for warning in tuning_warnings(bk, args.backend, results, args.repeat):
        print(f"ck: warning: {warning}", file=sys.stderr)
    return 0


def tuning_warnings(backend_spec, backend: str, results, repeat: int) -> list:
    """What makes a recorded winner meaningless: a backend that times host code (numpy runs every
    key through the same implementation), or top times closer than the timing noise."""
    import math

    out = []
    if backend_spec.timer is None:
        out.append(f"backend {backend!r} runs the kernels' host reference code, not GPU kernels: its times "
                   f"are host noise, and the winner recorded for it says nothing about speed; tune on a GPU "
                   f"(--backend triton)")
    finite = sorted(s for _, s in results if math.isfinite(s))
    if len(finite) >= 2 and finite[1] - finite[0] < 0.03 * finite[0]:
        out.append(f"the two fastest differ by {100 * (finite[1] - finite[0]) / finite[0]:.1f}%, within "
                   f"timing noise at --repeat {repeat}: treat them as equal, or time again with a larger --repeat")
    return out


def _seconds_for_fn(fn, repeat):
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def cmd_bench(args, extra):
    from .bench import run_bench

    return run_bench(args.op, args, extra)


def cmd_knobs(args, extra):
    rows = [{"name": k.name, "default": k.default, "doc": k.doc} for k in knobs.all_knobs().values()]
    _print_table(rows, ("name", "default", "doc"))
    return 0


def cmd_demo(args, extra):
    from .demo import run_demo

    return run_demo(args)


def build_parser() -> argparse.ArgumentParser:
    from .errors import EXIT_CODES

    p = argparse.ArgumentParser(
        prog="ck", allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="ck-dispatcher: declare, enumerate, build, select, launch and validate GPU kernels "
                    "(also installed as `ckd`, a name no other package's command takes)",
        epilog="exit codes:\n" + "\n".join(f"  {code:>3}  {text}" for code, text in EXIT_CODES.items()))
    p.add_argument("--version", action="version", version=f"ck-dispatcher {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0, help="-v info, -vv debug logging")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("plugins", allow_abbrev=False, help="loaded plugins, ops, archs, backends")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_plugins)
    s = sub.add_parser("archs", allow_abbrev=False, help="installed architectures")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_archs)

    def reg_args(s, out=False, op_optional=False):
        s.add_argument("op", nargs="?" if op_optional else None, help="gemm, conv, fmha, ... (ck plugins lists them)")
        s.add_argument("--arch", required=True, help="gfx942, sm90, ... (ck archs lists them)")
        s.add_argument("--backend", default=knobs.get("CK_BACKEND") or "numpy",
                       help="numpy (default, CK_BACKEND), triton or ck")
        s.add_argument("--filter", help="safe expression over kernel fields, e.g. \"c.tile_m == 128\"")
        s.add_argument("--filter-file", help="file of filter expressions, one a line")

    def run_args(s):   # what ck run and ck import --run share: the candidates, inputs, timing, check, output
        s.add_argument("--kernel-filter", dest="kfilter",
                       help="restrict the candidates with a filter expression (problem fields take --<field>)")
        s.add_argument("--seed", type=non_negative_int, default=None,
                       help="seed of the random inputs (default: fresh ones each run)")
        s.add_argument("--repeat", type=positive_int, default=None,
                       help="timed runs, the median printed (default 3; 0 extra on the numpy backend: its "
                            "first run's time is printed)")
        s.add_argument("--tuned", action="store_true",
                       help="use the measured winners of the tuned-data store (CK_TUNED_DIR)")
        s.add_argument("--no-validate", action="store_true", help="skip the float64 reference check")
        s.add_argument("--json", action="store_true", help="print the result as JSON")
        s.add_argument("--csv", action="store_true", help="one CSV row per stage (header first)")

    s = sub.add_parser("list", allow_abbrev=False, help="enumerate kernels: ck list <op> --arch A [--count] [--json]")
    reg_args(s)
    s.add_argument("--count", action="store_true", help="print the number of kernels only")
    s.add_argument("--list", action="store_true", help="print names (the default)")
    s.add_argument("--ck-names", action="store_true",
                   help="print CK's own kernel names where the op has them (FMHA)")
    s.add_argument("--json", action="store_true", help="the registry (or, with --count, the count) as JSON")
    s.set_defaults(fn=cmd_list)

    s = sub.add_parser("export", allow_abbrev=False, help="write a registry to JSON")
    reg_args(s)
    s.add_argument("-o", "--output", required=True, help="the JSON file to write")
    s.set_defaults(fn=cmd_export)
    s = sub.add_parser("import", allow_abbrev=False, help="read and check a registry JSON; --run a problem on it")
    s.add_argument("file", help="a registry JSON written by ck export")
    s.add_argument("--run", action="store_true",
                   help="dispatch the problem given as --<field> value over the imported kernels")
    s.add_argument("--backend", default=None, help="default: the backend the file's kernels name")
    run_args(s)
    s.set_defaults(fn=cmd_import)

    s = sub.add_parser("run", allow_abbrev=False, help="dispatch, run and validate one problem")
    s.add_argument("op", help="gemm, conv, fmha, ... (ck plugins lists them)")
    s.add_argument("--arch", required=True, help="gfx942, sm90, ... (ck archs lists them)")
    s.add_argument("--backend", default=knobs.get("CK_BACKEND") or "numpy",
                   help="numpy (default, CK_BACKEND), triton or ck")
    run_args(s)
    s.set_defaults(fn=cmd_run)

    s = sub.add_parser("build", allow_abbrev=False, help="compile a registry in parallel through its backend")
    reg_args(s, op_optional=True)   # --preset names its own ops
    s.add_argument("--preset", help="build a prebuilt kernel set: a shipped preset name (default, "
                   "fmha-serving, training) or a preset .json file; no op needed")
    s.add_argument("--out", help="with --preset: build into DIR/kernels instead of the kernel cache")
    s.add_argument("--wheel", help="with --preset and --out: also write an installable ck-kernels-<arch> "
                   "wheel of the set into this folder")
    s.add_argument("--list-keys", action="store_true", help="with --preset: print the kernels it picks, build nothing")
    s.add_argument("--workers", type=positive_int, default=None,
                   help="compile processes (default CK_BUILD_WORKERS or the CPU count)")
    s.add_argument("--limit", type=positive_int, default=None, help="build only the first N kernels")
    s.add_argument("--keep-going", action="store_true", help="exit 0 even if some kernels failed")
    s.add_argument("--json", help="write the build report here")
    s.set_defaults(fn=cmd_build)

    s = sub.add_parser("cache", allow_abbrev=False, help="kernel cache: info | clear")
    s.add_argument("action", choices=("info", "clear"))
    s.set_defaults(fn=cmd_cache)

    s = sub.add_parser("tune", allow_abbrev=False, help="time the candidates of a problem, store the winner")
    s.add_argument("op", help="gemm, conv, fmha, ... (ck plugins lists them)")
    s.add_argument("--arch", required=True, help="gfx942, sm90, ... (ck archs lists them)")
    s.add_argument("--backend", default=knobs.get("CK_BACKEND") or "numpy",
                   help="numpy (default, CK_BACKEND), triton or ck")
    s.add_argument("--kernel-filter", dest="kfilter", help="restrict the candidates with a filter expression")
    s.add_argument("--top", type=positive_int, default=None, help="time only the heuristic's first N")
    s.add_argument("--show", type=positive_int, default=10, help="rows of the timing table to print")
    s.add_argument("--repeat", type=positive_int, default=5, help="timed runs per candidate (median)")
    s.add_argument("--db", action=_RetiredDb, metavar="PATH",
                   help="retired (an error): winners go to the tuned-data store, CK_TUNED_DIR "
                        "(default <cache dir>/tuning.d); set CK_TUNED_DIR=FOLDER to write another store")
    s.set_defaults(fn=cmd_tune)

    s = sub.add_parser("bench", allow_abbrev=False, help="benchmark against a peer: ck bench gemm --vs torch")
    s.add_argument("op")
    s.add_argument("--vs", default="torch", help="the peer to compare with (torch, sdpa ...)")
    s.add_argument("--arch", default=None, help="default: the GPU's arch plugin")
    s.add_argument("--backend", default=None, help="default: triton")
    s.add_argument("--csv", help="write the rows to this CSV file")
    s.add_argument("--json", help="write the results JSON here (default: ck-results/<op>.json under the current directory)")
    s.add_argument("--quick", action="store_true", help="a few cases only")
    s.add_argument("--suite", default="core",
                   help="core: the fixed regression cases; broad: shapes drawn from real workloads (fixed seed)")
    s.add_argument("-q", "--quiet", action="store_true",
                   help="no progress on stderr (default: a bar on a terminal, a line every 30 s elsewhere)")
    s.set_defaults(fn=cmd_bench)

    from .sweep.cli import add_parser as add_sweep_parser
    add_sweep_parser(sub)
    from .select_report import add_parser as add_select_parser
    add_select_parser(sub)

    s = sub.add_parser("knobs", allow_abbrev=False, help="the CK_* environment variables")
    s.set_defaults(fn=cmd_knobs)

    s = sub.add_parser("demo", allow_abbrev=False, help="the main job: dispatched, validated GEMM and FMHA")
    s.add_argument("--backend", default=None,
                   help="default: triton where a GPU runs it, else numpy (the CPU reference)")
    s.set_defaults(fn=cmd_demo)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    from . import cli_help

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    cli_help.attach_op_help(parser, argv)
    args, rest = parser.parse_known_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.DEBUG if args.verbose > 1 else logging.INFO,
                            format="%(levelname)s %(name)s: %(message)s")
    try:
        extra = _extras(rest)
        cli_help.preflight(parser, args, extra)
        return args.fn(args, extra)
    except CkError as exc:
        print(f"ck: error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", 2)
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print("ck: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        print("ck: error: out of memory; make the problem or the kernel set smaller", file=sys.stderr)
        return 3
    except Exception as exc:  # a bug of ours: one line for the user, the traceback under -v
        log.debug("internal error", exc_info=True)
        print(f"ck: internal error: {type(exc).__name__}: {exc} (please report it; -vv shows "
              f"the traceback)", file=sys.stderr)
        return 70
