"""Prebuilt kernel sets: ``ck build --preset NAME --arch ARCH``.

A preset is data (``ck_core/presets/<name>.json``, or a JSON file given by path): groups of
problems, each a cross product of problem fields, and the options the public API narrows its
registry with for such a problem (``registry``; ``"$field"`` stands for the problem's value
of that field, e.g. ``{"dtypes": ["$dtype"]}``).  The set a preset names is what the shipped
selection picks for those problems: each problem is planned (the op's stages) and each
stage selected by the Dispatcher the public API would use (same registry options, the
tuned data and rankers), so ``ck build`` compiles exactly the keys user calls launch.
Sizes are run-time values in the kernels, so a few sizes per group (the regimes where
selection changes its pick) cover every shape; each key's build compiles its alignment
and size-derived classes (its ``jit_calls``).

Format::

    {"description": "...",
     "groups": [
        {"op": "fmha", "backend": "triton",
         "registry": {"families": ["fwd", ...], "dtypes": ["$dtype"], "hdims": [["$hdim_q", "$hdim_v"]]},
         "problems": [{"family": ["fwd"], "dtype": ["fp16", "bf16"], "hdim_q": [64, 128], ...}]}]}

Each ``problems`` entry maps a field to a list of values (the cross product is taken) or to
one value.  No text is evaluated.
"""
from __future__ import annotations

import itertools
import logging
from pathlib import Path
from typing import Optional

import attrs

from . import fileio
from .errors import CkError, ConfigError, InvalidProblem

log = logging.getLogger(__name__)

PRESET_DIR = Path(__file__).parent / "presets"
#: the most problems one preset may expand to (a typo in a list must not plan for hours)
MAX_PROBLEMS = 200_000


def names() -> list:
    """The presets shipped with ck_core."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def load(name_or_path: str) -> dict:
    """A preset by name (shipped) or by path (a ``.json`` file); ConfigError says what is wrong."""
    path = Path(name_or_path)
    if not (name_or_path.endswith(".json") or path.is_file()):
        if not name_or_path.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(f"preset {name_or_path!r}: a preset name is letters, digits, '-' and '_'; "
                              f"known: {', '.join(names())}")
        path = PRESET_DIR / f"{name_or_path}.json"
        if not path.is_file():
            raise ConfigError(f"no preset {name_or_path!r}; known: {', '.join(names())} "
                              f"(or give a path to a preset .json file)")
    data = fileio.read_json(path, "preset", "config", hint="give a preset .json file (see `ck build --help`)")
    _check(data, path)
    return data


def _check(data, path) -> None:
    if not isinstance(data, dict) or not isinstance(data.get("groups"), list) or not data["groups"]:
        raise ConfigError(f"preset {path}: expected an object with a non-empty list 'groups'")
    for i, g in enumerate(data["groups"]):
        where = f"preset {path}, group {i}"
        if not isinstance(g, dict) or not isinstance(g.get("op"), str):
            raise ConfigError(f"{where}: each group is an object naming its 'op'")
        unknown = set(g) - {"op", "backend", "registry", "problems", "comment"}
        if unknown:
            raise ConfigError(f"{where}: unknown field(s) {sorted(unknown)}; "
                              "expected op, backend, registry, problems, comment")
        if not isinstance(g.get("registry", {}), dict):
            raise ConfigError(f"{where}: 'registry' is an object of enumeration options")
        probs = g.get("problems")
        if not isinstance(probs, list) or not probs or not all(isinstance(p, dict) for p in probs):
            raise ConfigError(f"{where}: 'problems' is a non-empty list of objects (field -> values)")


def _expand(matrix: dict):
    fields = list(matrix)
    values = [v if isinstance(v, list) else [v] for v in matrix.values()]
    for combo in itertools.product(*values):
        yield dict(zip(fields, (tuple(x) if isinstance(x, list) else x for x in combo)))


def _substitute(value, problem):
    """``"$field"`` -> the problem's value of ``field`` (lists become tuples); nothing else."""
    if isinstance(value, str) and value.startswith("$"):
        got = getattr(problem, value[1:], None)
        if got is None:
            raise ConfigError(f"preset registry option {value!r}: the problem has no field {value[1:]!r}")
        return got
    if isinstance(value, (list, tuple)):
        return tuple(_substitute(v, problem) for v in value)
    return value


def problems(preset: dict, mgr):
    """``[(op, backend, registry options, problem)]`` of a preset (InvalidProblem combinations,
    e.g. a causal mask with unequal lengths where the op refuses it, are skipped with a count)."""
    out, skipped = [], 0
    for g in preset["groups"]:
        op = mgr.op(g["op"])
        for matrix in g["problems"]:
            for fields in _expand(matrix):
                if len(out) >= MAX_PROBLEMS:
                    raise ConfigError(f"the preset expands to more than {MAX_PROBLEMS} problems; narrow its lists")
                try:
                    p = op.problem_type.from_dict(fields)
                except (CkError, TypeError, ValueError) as exc:
                    skipped += 1
                    log.debug("preset problem %s skipped: %s", fields, exc)
                    continue
                opts = {k: _substitute(v, p) for k, v in g.get("registry", {}).items()}
                out.append((g["op"], g.get("backend", "triton"), opts, p))
    if skipped:
        log.info("%d preset problem(s) the op refuses were skipped", skipped)
    return out


def keys(preset: dict, arch: str, manager=None) -> tuple:
    """``(keys, report)``: the kernel keys the shipped selection picks for the preset's problems on
    ``arch`` (every stage of each problem's plan), in first-picked order, and what was refused."""
    from .api import _tuning_table
    from .dispatcher import Dispatcher
    from .plugins import get_manager
    from .registry import Registry

    mgr = manager or get_manager()
    regs: dict = {}
    picked: dict = {}
    report = {"problems": 0, "unsupported": 0, "reasons": {}}
    for op_name, backend, opts, p in problems(preset, mgr):
        rk = (op_name, backend, tuple(sorted((k, repr(v)) for k, v in opts.items())))
        disp = regs.get(rk)
        if disp is None:
            spec = mgr.arch(arch)
            reg = mgr.hook.ck_api_registry(op=op_name, arch=spec, backend=backend, options=dict(opts))
            if reg is None:
                reg = Registry.from_enumeration(op_name, arch, backend, manager=mgr, **opts)
            disp = regs[rk] = Dispatcher(reg, backend=backend, tuning=_tuning_table(), check_backend=False)
        op = mgr.op(op_name)
        report["problems"] += 1
        try:
            steps = op.plan(p) if op.plan else [(op.name, p)]
            for _, sub in steps:
                k = disp.select(sub)
                picked.setdefault(k.name, k)
        except CkError as exc:   # no key runs it here (an arch without the feature): say so, go on
            report["unsupported"] += 1
            why = type(exc).__name__
            report["reasons"][why] = report["reasons"].get(why, 0) + 1
    return list(picked.values()), report


def build(name_or_path: str, arch: str, *, max_workers: Optional[int] = None, cache_root=None,
          progress: Optional[bool] = None):
    """Compile a preset's keys for ``arch`` into the kernel cache (or ``cache_root``);
    ``(BuildReport, selection report, keys)``."""
    from .build import build_registry
    from .registry import Registry

    preset = load(name_or_path)
    ks, sel = keys(preset, arch)
    if not ks:
        raise InvalidProblem(f"preset {name_or_path!r} selects no kernel on {arch} "
                             f"({sel['unsupported']} of {sel['problems']} problems unsupported)")
    reg = Registry(arch, ks, name=f"preset:{Path(name_or_path).stem}")
    rep = build_registry(reg, max_workers=max_workers, progress=progress,
                         cache_root=str(cache_root) if cache_root else None)
    return rep, sel, ks
