"""What the CLI explains: per-op help, did-you-mean for unknown flags, dependency checks up front.

Everything here comes from the op's :class:`~ck_core.records.OpSpec` (its problem
class's fields and their ``help`` metadata, its ``options`` help) so the core names
no plugin.
"""
from __future__ import annotations

import difflib
import importlib.util
import re
from typing import Iterable, Optional, Sequence

import attrs

from .errors import ConfigError, ToolchainMissing

#: commands whose first positional is an op name and which take --<field>/--<option> pairs
OP_COMMANDS = ("run", "list", "tune", "export", "build")
#: backends whose kernel space itself needs their toolchain (triton's shared-memory model culls keys)
_SPACE_NEEDS_TOOLCHAIN = ("triton",)


def field_help(problem_type: type) -> dict:
    """One line per field: its ``attrs.field(metadata={"help": ...})`` (how a problem class
    documents its fields), else its line of the class docstring's ``Fields`` section."""
    docs = field_docs(problem_type)
    return {f.name: (f.metadata.get("help") or docs.get(f.name, "")).strip()
            for f in attrs.fields(problem_type)}


def field_docs(problem_type: type) -> dict:
    """One line per field from a numpy-style ``Fields`` section of the class docstring (the
    fallback for a problem class whose fields carry no ``help`` metadata).

    A line ``name, other   text`` documents both names; indented continuation lines
    are ignored (the first line is the summary).
    """
    doc = problem_type.__doc__ or ""
    m = re.search(r"\n\s*Fields\n\s*-+\n(.*?)(?:\n\s*\n|\Z)", doc, flags=re.S)
    if not m:
        return {}
    out, indent = {}, None
    for line in m.group(1).splitlines():
        stripped = line.strip()
        lead = len(line) - len(line.lstrip())
        indent = lead if indent is None else indent
        if not stripped or lead > indent:
            continue
        parts = re.split(r"\s{2,}", stripped, maxsplit=1)
        names = [n.strip() for n in parts[0].split(",")]
        text = parts[1] if len(parts) > 1 else ""
        for n in names:
            if n:
                out[n] = text
    return out


def _default(f) -> str:
    if f.default is attrs.NOTHING:
        return "required"
    if isinstance(f.default, attrs.Factory):
        return "default: computed"
    if f.default is None:
        return "optional"
    return f"default: {f.default!r}"


def _entry(name: str, width: int, text: str, columns: int) -> str:
    """``  --name   text``, the text wrapped under itself to the terminal's width."""
    import textwrap

    head = f"  --{name:<{width}} "
    return textwrap.fill(text, width=max(columns, len(head) + 40), initial_indent=head,
                         subsequent_indent=" " * len(head), break_on_hyphens=False,
                         break_long_words=False).replace("\xa0", " ")


def op_help(op, command_flags: Iterable[str] = (), command: str = "run") -> str:
    """The op's problem fields and enumeration options, one line each.

    A field whose flag the command itself takes (``--seed``, ``--filter``) is marked: the
    command's meaning wins there.
    """
    taken = {f.replace("-", "_") for f in command_flags}
    docs = field_help(op.problem_type)
    fields = [f for f in attrs.fields(op.problem_type)]
    width = max([len(f.name) for f in fields] + [len(o) for o in getattr(op, "options", {}) or {}] + [8]) + 4
    where = "" if command in ("run", "tune") else " (for ck run / ck tune)"
    import shutil
    import textwrap

    columns = shutil.get_terminal_size((100, 24)).columns - 2   # as argparse wraps its own help
    lines = [textwrap.fill(f"{op.name}: {op.description}".rstrip(": "), width=max(columns, 60)), "",
             f"problem fields{where} ({op.problem_type.__name__}; lists as 1,2,3):"]
    for f in fields:
        text = docs.get(f.name, "")
        # one unbreakable piece: a wrapped line must not start with the flag's name
        note = "[here: the command's own option; see shorthands] ".replace(" ", "\xa0") if f.name in taken else ""
        lines.append(_entry(f.name, width, f"{note}{_default(f)}; {text}".rstrip("; "), columns))
    short = getattr(op.problem_type, "cli_shorthands", None) or {}
    if short:
        lines += ["", "shorthands (the problem class expands them into fields):"]
        for name, text in short.items():
            lines.append(_entry(name, width, text, columns))
    opts = getattr(op, "options", None) or {}
    if opts:
        lines += ["", "enumeration options (which kernels the registry holds):"]
        for name, text in opts.items():
            lines.append(_entry(name, width, text, columns))
    return "\n".join(lines)


def attach_op_help(parser, argv: Sequence[str]) -> None:
    """Give ``ck <cmd> <op> --help`` the op's fields and options as the epilog."""
    import argparse

    argv = list(argv)
    if not ({"-h", "--help"} & set(argv)):
        return
    pos = [a for a in argv if not a.startswith("-")]
    if len(pos) < 2 or pos[0] not in OP_COMMANDS:
        return
    from .plugins import get_manager

    mgr = get_manager()
    if pos[1] not in mgr.ops():
        return
    sub = _subparser(parser, pos[0])
    if sub is not None:
        sub.formatter_class = argparse.RawDescriptionHelpFormatter
        sub.epilog = op_help(mgr.op(pos[1]), command_flags(parser, pos[0]), pos[0])


def _subparser(parser, name):
    for action in parser._actions:
        choices = getattr(action, "choices", None)
        if isinstance(choices, dict) and name in choices:
            return choices[name]
    return None


def did_you_mean(word: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(known), n=3, cutoff=0.6)
    return f"; did you mean {', '.join('--' + c for c in close)}?" if close else ""


def check_flags(extra: dict, op, command_flags: Iterable[str], problem_fields: bool) -> None:
    """Unknown --flags get a ConfigError with the closest known names.

    Only ops that declare their enumeration options can be checked fully; for
    the others the op's enumeration still rejects what it does not know.
    """
    opts = getattr(op, "options", None) or {}
    if not opts:
        return
    known = set(opts) | {f.replace("-", "_") for f in command_flags}
    if problem_fields:
        known |= {f.name for f in attrs.fields(op.problem_type)}
    unknown = [k for k in extra if k not in known]
    if unknown:
        k = unknown[0]
        raise ConfigError(f"unknown option --{k} for {op.name}{did_you_mean(k, known)} "
                          f"(`ck run {op.name} --help` lists the fields and options)")


def command_flags(parser, cmd: str) -> list:
    sub = _subparser(parser, cmd)
    if sub is None:
        return []
    return [s[2:] for a in sub._actions for s in a.option_strings if s.startswith("--")]


def require_backend(mgr, backend: Optional[str], arch: Optional[str], execute: bool) -> None:
    """Fail within a second when the backend cannot do what the command needs.

    Without this, a missing optional dependency shows up only after the whole
    kernel space was enumerated (for triton: minutes of failed imports).
    """
    if not backend or backend not in mgr.backends():
        return
    spec = mgr.backend(backend)
    if execute and arch and arch in mgr.archs():
        if backend == "triton" and importlib.util.find_spec("torch") is None:
            raise ToolchainMissing("the triton backend runs kernels through torch, which is not "
                                   "installed: pip install 'ck-core[torch]' (or use --backend numpy)")
        ok, why = spec.can_execute(mgr.arch(arch))
        if not ok:
            raise ToolchainMissing(f"backend {backend!r} cannot run {arch} kernels here: {why}")
    elif backend in _SPACE_NEEDS_TOOLCHAIN:
        ok, why = spec.available()
        if not ok:
            raise ToolchainMissing(f"backend {backend!r}: {why}")


def preflight(parser, args, extra: dict) -> None:
    """Checks that take a second, before any command spends minutes: flags, backend."""
    from .plugins import get_manager

    mgr = get_manager()
    cmd = getattr(args, "cmd", None)
    op_name = getattr(args, "op", None)
    if cmd in OP_COMMANDS and op_name is not None:
        if op_name not in mgr.ops():
            raise ConfigError(f"unknown op {op_name!r}{did_you_mean(op_name, mgr.ops())} "
                              f"(installed: {', '.join(sorted(mgr.ops()))})".replace("--", ""))
        op = mgr.op(op_name)
        expand = getattr(op.problem_type, "expand_cli", None)
        given = expand(dict(extra)) if (expand and cmd in ("run", "tune")) else extra
        check_flags(given, op, command_flags(parser, cmd), problem_fields=cmd in ("run", "tune"))
    arch = getattr(args, "arch", None)
    if arch and arch not in mgr.archs():
        raise ConfigError(f"unknown arch {arch!r}{did_you_mean(arch, mgr.archs())} "
                          f"(installed: {', '.join(sorted(mgr.archs()))})".replace("--", ""))
    require_backend(mgr, getattr(args, "backend", None), arch, execute=cmd in ("run", "tune"))


def write_run_csv(result: dict, out) -> None:
    """`ck run --csv`: one row per plan stage, the problem's fields and the verdict on each."""
    import csv

    problem = {k: (",".join(map(str, v)) if isinstance(v, (list, tuple)) else v)
               for k, v in result["problem"].items()}
    cols = list(problem) + ["arch", "backend", "candidates", "stage", "kernel", "passed", "seconds", "tflops"]
    w = csv.DictWriter(out, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    for st in result["plan"]:
        w.writerow({**problem, **{k: result.get(k, "") for k in cols[len(problem):]},
                    "stage": st["stage"], "kernel": st["kernel"]})


def imported_run_setup(reg, ops: dict, args, extra: dict, make_problem):
    """`ck import FILE --run --<field> v ...`: the op, problem and backend to run on ``reg``."""
    from .plugins import get_manager

    if len(ops) != 1:
        raise ConfigError(f"{args.file} holds kernels of {len(ops)} ops ({', '.join(sorted(ops)) or 'none'}); "
                          "--run needs a registry of one op")
    (op_name,) = ops
    op = get_manager().op(op_name)
    fields = [f.name for f in attrs.fields(op.problem_type)]
    expand = getattr(op.problem_type, "expand_cli", None)
    rest = [k for k in (expand(dict(extra)) if expand else extra) if k not in fields]
    if rest:
        k = sorted(rest)[0]
        raise ConfigError(f"unknown {op_name} problem field --{k}{did_you_mean(k, fields)}; the kernels "
                          "come from the file, so enumeration options do not apply")
    problem, _ = make_problem(op, extra)
    backends = sorted({k.backend for k in reg})
    backend = args.backend or (backends[0] if len(backends) == 1 else "numpy")
    require_backend(get_manager(), backend, reg.arch, execute=True)
    return op, problem, backend
