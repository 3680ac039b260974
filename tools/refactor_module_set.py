#!/usr/bin/env python3
"""Move the three op plugins (gemm, conv, fmha) onto one module set (issue #13, item 8).

Run from the repository root on a clean checkout::

    python3 tools/refactor_module_set.py            # apply: git mv + rewrite references
    python3 tools/refactor_module_set.py --dry-run  # print what it would do, change nothing

What it does, in order:

1. Checks every module of each plugin package against the layout tables below (MOVES, KEEP,
   NEW_PACKAGES).  A module the tables do not name, a move whose source and target both exist, or
   one with neither, stops the script (exit 2) before anything changes.
2. ``git mv``s the files of each MOVES entry and creates the new packages' ``__init__.py``.
3. Rewrites every ``from ... import`` in the repository's Python files (absolute and relative,
   including the relative imports inside moved modules whose package depth changed; a moved
   module imported by name keeps its local name through ``as``), then every dotted module name
   (``ck_fmha.triton.ops.fwd`` in code, strings such as monkeypatch targets, ``python -m``
   lines, docs) and every path (``ck_gemm/triton/NOTES.md``) in the repository's text files.
   ``Path(__file__)...parent`` chains in moved modules follow the depth change.
4. Prints each change.  A second run finds nothing to do and says so (idempotent).

Left alone on purpose: ``benchmarks/results/`` and ``tuned/*.json`` (they record what ran, with
the names it had then), this script, and docs/PLUGIN_LAYOUT.md.

The target layout is described in docs/PLUGIN_LAYOUT.md; tests/test_plugin_layout.py checks it.
"""
from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
from pathlib import Path

# ---- the layout tables ---------------------------------------------------------------------
# Paths are relative to the plugin package (plugins/<op>/ck_<op>/).  MOVES: old -> new.
PLUGINS = {"gemm": "plugins/gemm/ck_gemm", "conv": "plugins/conv/ck_conv", "fmha": "plugins/fmha/ck_fmha"}

MOVES = {
    "gemm": {
        "kernel.py": "keys.py",
        "triton_launch.py": "backends/triton/keys.py",
        "triton/__init__.py": "backends/triton/__init__.py",
        "triton/NOTES.md": "backends/triton/NOTES.md",
        "triton/kernels.py": "backends/triton/kernels.py",
        "triton/launch.py": "backends/triton/launch.py",
        "triton/aot.py": "backends/triton/aot.py",
        "triton/configs.py": "backends/triton/configs.py",
        "triton/tuning.py": "backends/triton/tuning.py",
        "ck_template.py": "backends/ck/template.py",
    },
    "conv": {
        "kernels.py": "keys.py",
        "triton_kernels.py": "backends/triton/kernels.py",
        "launch.py": "backends/triton/launch.py",
        "dw_codegen.py": "backends/triton/dw_codegen.py",
    },
    "fmha": {
        # the torch entry points leave __init__; a new __init__ re-exports api.__all__ lazily
        "__init__.py": "api.py",
        "stages.py": "plan.py",
        "bench_suite.py": "bench.py",
        "reference.py": "reference/__init__.py",
        # not fwd/bwd: the package re-exports a function named fwd, which would hide the submodule
        "reference_fwd.py": "reference/forward.py",
        "reference_bwd.py": "reference/backward.py",
        "_layout.py": "reference/layout.py",
        "rope.py": "reference/rope.py",
        "triton_keys.py": "backends/triton/keys.py",
        "triton/__init__.py": "backends/triton/__init__.py",
        "triton/NOTES.md": "backends/triton/NOTES.md",
        "triton/kernels.py": "backends/triton/kernels.py",
        "triton/ops.py": "backends/triton/launch.py",
        "triton/configs.py": "backends/triton/configs.py",
        "triton/gluon_fwd.py": "backends/triton/gluon_fwd.py",
        "triton/gluon_bwd.py": "backends/triton/gluon_bwd.py",
    },
}

# Modules of branches that were open when this script was written: moved if present, else skipped.
PENDING_MOVES = {
    "fmha": {"triton_rank.py": "heuristics.py"},  # branch fmhapath: the Triton keys' ranking
}

# Modules that stay where they are (relative to the plugin package, without .py); an entry need
# not exist (conv keyspace, fmha footprint, gemm features come with branches still open).
KEEP = {
    "gemm": {"api", "bench", "bench_broad", "ck_rules", "heuristics", "plugin", "problem", "reference", "space",
             "sweep"},
    "conv": {"__init__", "api", "bench", "bench_broad", "heuristics", "keyspace", "plugin", "problem", "reference",
             "space", "sweep", "backends/triton/keys"},
    "fmha": {"bench_broad", "codegen/__init__", "codegen/ck_facts", "codegen/enumerate", "codegen/spec",
             "codegen/sweep", "demo", "flash_attn", "footprint", "integrations/__init__", "integrations/transformers", "keys",
             "masks", "paged", "philox", "plugin", "problem", "sweep", "heuristics", "features", "seqtune",
             "decode", "prefill", "device_errors"},
}
KEEP["gemm"] |= {"__init__", "features"}

# New packages: path -> docstring of their __init__.py.
NEW_PACKAGES = {
    "gemm": {"backends": "Backends of the GEMM op: one subpackage per backend that has kernels of its own.",
             "backends/ck": "The ck backend of GEMM: CK Tile C++ rendering of GEMM kernel keys."},
    "conv": {"backends": "Backends of the conv op: one subpackage per backend that has kernels of its own.",
             "backends/triton": "The triton backend of grouped convolution: kernels and their launchers."},
    "fmha": {"backends": "Backends of the FMHA op: one subpackage per backend that has kernels of its own."},
}

# Files whose __init__ is regenerated after the move (fmha: the API moved to api.py).
REEXPORT_INIT = {"fmha": "api.py"}

# Never rewritten: the record of what ran, and this move's own documentation.
SKIP_PREFIXES = ("benchmarks/results/",)
SKIP_FILES = {"tools/refactor_module_set.py", "docs/PLUGIN_LAYOUT.md"}
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".sh", ".cfg", ".ini", ".rst", ".yaml", ".yml", ".json"}


class Unmappable(Exception):
    pass


# ---- module names --------------------------------------------------------------------------
def _pkg_name(op):
    return PLUGINS[op].rsplit("/", 1)[1]


def module_of(op, rel):
    """Dotted module name of a .py path relative to the plugin package."""
    parts = rel[:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([_pkg_name(op)] + parts)


def module_map():
    """Old dotted module -> new dotted module (identities left out), and the same for paths."""
    mods, paths = {}, {}
    for op, moves in MOVES.items():
        pkg = _pkg_name(op)
        for old, new in moves.items():
            paths[f"{pkg}/{old}"] = f"{pkg}/{new}"
            if old == "__init__.py":
                continue  # the package keeps its name; what moved is only its body
            if old.endswith(".py"):
                a, b = module_of(op, old), module_of(op, new)
                if a != b:
                    mods[a] = b
        # whole directories that moved together (ck_gemm/triton -> ck_gemm/backends/triton)
        dirs = {}
        for old, new in moves.items():
            if "/" in old:
                d_old, d_new = old.rsplit("/", 1)[0], new.rsplit("/", 1)[0]
                dirs.setdefault(d_old, set()).add(d_new)
        for d_old, d_new in dirs.items():
            if len(d_new) == 1:
                paths[f"{pkg}/{d_old}"] = f"{pkg}/{d_new.pop()}"
    for b in mods.values():
        if map_dotted(b, mods) is not None:
            raise Unmappable(f"layout table: new module {b} starts with an old module name (a re-run would move it again)")
    return mods, paths


def map_dotted(name, mods):
    """Longest old-module prefix of ``name`` replaced by its new module; None if no prefix moved."""
    parts = name.split(".")
    for i in range(len(parts), 1, -1):
        head = ".".join(parts[:i])
        if head in mods:
            return ".".join([mods[head]] + parts[i:])
    return None


# ---- git -----------------------------------------------------------------------------------
def git(*args, capture=False):
    r = subprocess.run(["git", *args], check=True, text=True, capture_output=capture)
    return r.stdout if capture else None


def tracked_files():
    return [f for f in git("ls-files", "-z", capture=True).split("\0") if f]


# ---- step 1: plan and check ----------------------------------------------------------------
def plugin_files(root):
    out = []
    for dp, dn, fn in os.walk(root):
        dn[:] = [d for d in dn if d != "__pycache__" and not d.endswith(".egg-info")]
        for f in fn:
            rel = os.path.relpath(os.path.join(dp, f), root).replace(os.sep, "/")
            out.append(rel)
    return out


def plan_moves():
    todo, problems = [], []
    for op, root in PLUGINS.items():
        if not os.path.isdir(root):
            problems.append(f"{root}: no such package")
            continue
        for old, new in MOVES[op].items():
            src, dst = f"{root}/{old}", f"{root}/{new}"
            s, d = os.path.exists(src), os.path.exists(dst)
            reexport = old == "__init__.py" and op in REEXPORT_INIT
            if reexport and s and d:
                # done before: __init__ is the regenerated one when api.py exists
                continue
            if s and d:
                problems.append(f"{op}: both {old} and {new} exist; merge them by hand, then re-run")
            elif not s and not d:
                problems.append(f"{op}: neither {old} nor {new} exists; update MOVES in this script")
            elif s:
                todo.append((op, src, dst))
        known_py = {k + ".py" for k in KEEP[op]} | {n for n in MOVES[op].values() if n.endswith(".py")}
        known_py |= {f"{p}/__init__.py" for p in NEW_PACKAGES[op]}
        known_py |= {o for o in MOVES[op] if o.endswith(".py")}
        known_other = {o for o in MOVES[op] if not o.endswith(".py")} | {n for n in MOVES[op].values()}
        for rel in plugin_files(root):
            if rel.endswith(".py"):
                if rel not in known_py:
                    problems.append(f"{op}: {root}/{rel} is in no layout table (MOVES/KEEP); "
                                    "say where it belongs, then re-run")
            elif rel.startswith(("tuned/",)) or rel in ("sweep_shapes.toml",) or rel in known_other:
                continue
            else:
                # a data file beside a moved module would be left behind
                d = rel.rsplit("/", 1)[0] if "/" in rel else ""
                if any(o.startswith(d + "/") for o in MOVES[op] if d):
                    problems.append(f"{op}: {root}/{rel} sits in a directory that moves; add it to MOVES")
    return todo, problems


# ---- step 2: moves -------------------------------------------------------------------------
def apply_moves(todo, dry):
    moved = {}
    for op, src, dst in todo:
        print(f"git mv {src} {dst}")
        moved[dst] = src
        if not dry:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            git("mv", src, dst)
    for op, root in PLUGINS.items():
        for pkg, doc in NEW_PACKAGES[op].items():
            init = f"{root}/{pkg}/__init__.py"
            if not os.path.exists(init):
                print(f"create {init}")
                if not dry:
                    os.makedirs(os.path.dirname(init), exist_ok=True)
                    Path(init).write_text(f'"""{doc}"""\n')
                    git("add", init)
    return moved


def write_reexport_init(dry):
    """fmha: __init__.py moved to api.py; the package re-exports api.__all__ on first use."""
    for op, api_rel in REEXPORT_INIT.items():
        root = PLUGINS[op]
        init, api = f"{root}/__init__.py", f"{root}/{api_rel}"
        if os.path.exists(init) and not dry:
            continue
        if dry:
            print(f"create {init} (lazy re-export of {api_rel}'s __all__)")
            continue
        tree = ast.parse(Path(api).read_text())
        names = None
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
                names = ast.literal_eval(node.value)
        if not names:
            raise Unmappable(f"{api} has no literal __all__; the new {init} could not be written")
        doc = ast.get_docstring(tree, clean=False) or f"ck-{op}."
        mod = api_rel[:-3]
        listed = ", ".join(f'"{n}"' for n in names)
        text = (f'"""{doc}"""\n\n__all__ = [{listed}]\n\n\n'
                "def __getattr__(name):\n"
                "    # the torch entry points load torch; importing the package must not\n"
                "    if name in __all__:\n"
                f"        from . import {mod}\n\n"
                f"        return getattr({mod}, name)\n"
                f"    raise AttributeError(f\"module {{__name__!r}} has no attribute {{name!r}}\")\n")
        ast.parse(text)  # fails loudly if the docstring broke the quoting
        Path(init).write_text(text)
        git("add", init)
        print(f"create {init} (lazy re-export of {api_rel}'s __all__: {', '.join(names)})")


# ---- step 3: imports -----------------------------------------------------------------------
def check_shadowing(mods):
    """``from pkg import sub`` gives the package's attribute: a submodule whose name the package's
    __init__ binds to something else (a re-exported function ``fwd`` beside ``fwd.py``) cannot be
    imported that way.  Runs before the moves, on the __init__ files where they are now."""
    for new in sorted(set(mods.values())):
        parent, leaf = new.rsplit(".", 1)
        for op, root in PLUGINS.items():
            pkg = _pkg_name(op)
            if parent != pkg and not parent.startswith(pkg + "."):
                continue
            rel = "/".join(parent.split(".")[1:] + ["__init__.py"])
            src = {v: k for k, v in MOVES[op].items()}.get(rel, rel)
            init = Path(root, rel) if Path(root, rel).is_file() else Path(root, src)
            if init.is_file() and _binds_other(init, leaf):
                raise Unmappable(f"{init} binds the name {leaf!r}, which would hide the module {new}; "
                                 "choose another module name in MOVES")


def _binds_other(init, leaf):
    """Whether ``leaf`` is bound to something other than the submodule itself."""
    for node in ast.parse(Path(init).read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == leaf:
            return True
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == leaf for t in node.targets):
            return True
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                if (a.asname or a.name) == leaf and not (node.level == 1 and node.module is None):
                    return True
    return False


def _all_modules():
    """Every module that exists after the moves (dotted), per plugin package."""
    out = set()
    for op, root in PLUGINS.items():
        for rel in plugin_files(root):
            if rel.endswith(".py"):
                out.add(module_of(op, rel))
    return out


def _resolve(level, module, file_mod, is_pkg):
    """Absolute module of a relative import in module ``file_mod``."""
    base = file_mod.split(".")
    if not is_pkg:
        base = base[:-1]
    if level - 1 > len(base) - 1:
        return None
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _relativize(target, file_mod, is_pkg):
    """(level, module or None) of ``target`` as seen from ``file_mod``'s package."""
    pkg = file_mod.split(".") if is_pkg else file_mod.split(".")[:-1]
    t = target.split(".")
    common = 0
    while common < min(len(pkg), len(t)) and pkg[common] == t[common]:
        common += 1
    level = len(pkg) - common + 1
    rest = t[common:]
    return level, (".".join(rest) or None)


def _owned(file_mod):
    return file_mod is not None and file_mod.split(".")[0] in {_pkg_name(op) for op in PLUGINS}


def _line_offsets(src):
    offs, n = [0], 0
    for line in src.splitlines(keepends=True):
        n += len(line)
        offs.append(n)
    return offs


def group_names(absmod, names, mods):
    """``from absmod import names`` after the move: {target module: [(name, asname)]}.

    A name that is a moved module goes to its new parent, under its new name, bound to the old
    local name (``from ck_fmha.backends.triton import launch as ops``); any other name stays with
    ``absmod``'s new module."""
    base = map_dotted(absmod, mods) or absmod
    groups = {}
    for name, asname in names:
        full_new = map_dotted(f"{absmod}.{name}", mods) if name != "*" else None
        if full_new and full_new != f"{base}.{name}":
            parent, leaf = full_new.rsplit(".", 1)
            groups.setdefault(parent, []).append((leaf, asname or (name if leaf != name else None)))
        else:
            groups.setdefault(base, []).append((name, asname))
    return groups


def _from_lines(groups, level_of, indent):
    stmts = []
    for tgt, names in groups.items():
        items = ", ".join(n if not a else f"{n} as {a}" for n, a in names)
        stmts.append(f"from {level_of(tgt)} import {items}")
    return ("\n" + indent).join(stmts)


def rewrite_imports(path, old_mod, new_mod, old_is_pkg, new_is_pkg, mods, existing):
    """Rewrite the ``from X import ...`` statements of one file; returns the number of changes.

    Relative imports resolve against the file's old place (``old_mod``) and are written for its
    new one, so a module that moved deeper (``reference.py`` -> ``reference/__init__.py``) keeps
    importing the same modules."""
    src = Path(path).read_text()
    try:
        tree = ast.parse(src)
    except SyntaxError as e:
        raise Unmappable(f"{path}: cannot parse ({e})")
    offs = _line_offsets(src)
    edits = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            if not _owned(old_mod):
                continue
            absmod = _resolve(node.level, node.module, old_mod, old_is_pkg)
            if absmod is None:
                raise Unmappable(f"{path}:{node.lineno}: relative import beyond the top-level package")
        else:
            absmod = node.module
            if absmod.split(".")[0] not in {_pkg_name(op) for op in PLUGINS}:
                continue
        groups = group_names(absmod, [(a.name, a.asname) for a in node.names], mods)
        base = map_dotted(absmod, mods) or absmod
        for tgt in groups:
            if tgt not in existing and not any(m.startswith(tgt + ".") for m in existing):
                raise Unmappable(f"{path}:{node.lineno}: import of {tgt}, which is no module after the move "
                                 "(add the missing module to the layout tables)")
        if node.level:
            rel_new = {t: _relativize(t, new_mod, new_is_pkg) for t in groups}
        start = offs[node.lineno - 1] + node.col_offset
        end = offs[node.end_lineno - 1] + node.end_col_offset
        old_text = src[start:end]
        if len(groups) == 1 and groups.get(base) == [(a.name, a.asname) for a in node.names]:
            # only the module part can change: replace it in place (keeps parentheses and comments)
            if node.level:
                lvl, m = rel_new[base]
                new_from = "." * lvl + (m or "")
            else:
                new_from = base
            m_old = re.match(r"from\s+([.\w]+)\s+import", old_text) or re.match(r"from\s+(\.+)\s*import", old_text)
            if m_old is None:
                raise Unmappable(f"{path}:{node.lineno}: unexpected import text {old_text[:60]!r}")
            if m_old.group(1) == new_from:
                continue
            new_text = old_text[: m_old.start(1)] + new_from + old_text[m_old.end(1):]
            first, _, rest = new_text.partition("\n")
            if rest and "(" in old_text.split("\n", 1)[0]:
                # continuation lines aligned under the opening parenthesis follow it
                col = node.col_offset + old_text.index("(") + 1
                shift = len(new_from) - len(m_old.group(1))
                lines = [(" " * (col + shift) + ln[col:]) if len(ln) - len(ln.lstrip(" ")) == col else ln
                         for ln in rest.split("\n")]
                new_text = first + "\n" + "\n".join(lines)
        else:
            def level_of(tgt):
                if node.level:
                    lvl, m = rel_new[tgt]
                    return "." * lvl + (m or "")
                return tgt

            new_text = _from_lines(groups, level_of, " " * node.col_offset)
            if new_text == old_text:
                continue
        edits.append((start, end, old_text, new_text, node.lineno))
    if not edits:
        return 0
    for start, end, old_text, new_text, line in sorted(edits, reverse=True):
        src = src[:start] + new_text + src[end:]
        print(f"{path}:{line}: {' '.join(old_text.split())}  ->  {' '.join(new_text.split())}")
    Path(path).write_text(src)
    return len(edits)


_DOTTED = re.compile(r"\b(?:ck_gemm|ck_conv|ck_fmha)(?:\.[A-Za-z_]\w*)+")
_FROM_TEXT = re.compile(r"\bfrom[ \t]+((?:ck_gemm|ck_conv|ck_fmha)(?:\.\w+)*)[ \t]+import[ \t]+(\([^)]*\)|[\w \t,]+)")
_PATH = re.compile(r"\b(?:ck_gemm|ck_conv|ck_fmha)(?:/[\w.-]+)+/?")


def rewrite_text(path, mods, paths):
    """Dotted module names and package paths in any text file."""
    try:
        src = Path(path).read_text()
    except (UnicodeDecodeError, FileNotFoundError):
        return 0
    n = [0]

    def dotted(m):
        new = map_dotted(m.group(0), mods)
        if new is None:
            return m.group(0)
        n[0] += 1
        return new

    def pathrep(m):
        text = m.group(0)
        slash = text.endswith("/")
        key = text.rstrip("/")
        for old in sorted(paths, key=len, reverse=True):
            if key == old:
                n[0] += 1
                return paths[old] + ("/" if slash else "")
        return text

    def from_import(m):
        names = []
        for item in m.group(2).strip("()").replace("\n", " ").split(","):
            parts = item.split()
            if not parts:
                continue
            if len(parts) == 1 or (len(parts) == 3 and parts[1] == "as"):
                names.append((parts[0], parts[2] if len(parts) == 3 else None))
            else:
                return m.group(0)  # not an import we can read: leave it (the dotted pass still runs)
        groups = group_names(m.group(1), names, mods)
        if list(groups) == [m.group(1)]:
            return m.group(0)
        n[0] += 1
        start = src.rfind("\n", 0, m.start()) + 1
        indent = re.match(r"[ \t]*", src[start:]).group(0)
        return _from_lines(groups, lambda t: t, indent)

    out = _FROM_TEXT.sub(from_import, src)
    out = _PATH.sub(pathrep, _DOTTED.sub(dotted, out))
    for op, root in PLUGINS.items():
        # a plugin's own docs name its files relative to the package: `kernel.py`, `triton/`
        if path.endswith(".md") and path.startswith(root.rsplit("/", 1)[0] + "/"):
            pkg = _pkg_name(op)
            rel = {o[len(pkg) + 1:]: v[len(pkg) + 1:] for o, v in paths.items() if o.startswith(pkg + "/")}

            def plugin_rel(m, rel=rel):
                key = m.group(1).rstrip("/")
                if key not in rel or not ("/" in m.group(1) or "." in m.group(1)):  # `triton` is a backend
                    return m.group(0)
                n[0] += 1
                return "`" + rel[key] + ("/" if m.group(1).endswith("/") else "") + "`"

            out = re.sub(r"`([\w./-]+)`", plugin_rel, out)
    if out != src:
        print(f"{path}: {n[0]} module name(s) / path(s) rewritten")
        Path(path).write_text(out)
    return n[0]


_FILE_PARENTS = re.compile(r"Path\(__file__\)\.resolve\(\)((?:\.parent)+)")


def fix_file_paths(path, depth_delta):
    """``Path(__file__).resolve().parent...`` in a module that moved up or down."""
    src = Path(path).read_text()
    if depth_delta == 0:
        return 0
    bare = [m.start() for m in re.finditer(r"(?<![.\w])__file__", src)]
    hits = list(_FILE_PARENTS.finditer(src))
    if len(bare) != len(hits):
        raise Unmappable(f"{path}: uses __file__ in a form this script cannot shift by {depth_delta} package level(s)")

    def rep(m):
        k = m.group(1).count(".parent") + depth_delta
        if k < 1:
            raise Unmappable(f"{path}: __file__ path would climb below the package")
        return "Path(__file__).resolve()" + ".parent" * k

    out = _FILE_PARENTS.sub(rep, src)
    if out != src:
        print(f"{path}: Path(__file__) parents shifted by {depth_delta:+d}")
        Path(path).write_text(out)
    return 1


# ---- main ----------------------------------------------------------------------------------
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="print the moves and checks, change nothing")
    ap.add_argument("--allow-dirty", action="store_true", help="apply even with uncommitted changes")
    args = ap.parse_args(argv)
    top = git("rev-parse", "--show-toplevel", capture=True).strip()
    os.chdir(top)
    for op, pending in PENDING_MOVES.items():
        for old, new in pending.items():
            if os.path.exists(f"{PLUGINS[op]}/{old}") or os.path.exists(f"{PLUGINS[op]}/{new}"):
                MOVES[op][old] = new
            else:
                print(f"note: {op}: {old} is not here (its branch is not merged yet); skipped")
    try:
        mods, paths = module_map()
        check_shadowing(mods)
        todo, problems = plan_moves()
        if problems:
            for p in problems:
                print(f"error: {p}", file=sys.stderr)
            return 2
        if todo and not args.dry_run and not args.allow_dirty and git("status", "--porcelain", capture=True).strip():
            print("error: uncommitted changes; commit or stash them first (or pass --allow-dirty), so that "
                  "the move is one reviewable diff", file=sys.stderr)
            return 2
        moved = apply_moves(todo, args.dry_run)
        if args.dry_run:
            if REEXPORT_INIT and any(src.endswith("ck_fmha/__init__.py") for _, src, _ in todo):
                write_reexport_init(True)
            print(f"dry run: {len(todo)} move(s) planned; imports and text not examined")
            return 0
        write_reexport_init(False)
        existing = _all_modules()
        changes = len(todo)
        # moved files: their imports resolve against their old place, are written for the new one
        files = [f for f in tracked_files() if os.path.isfile(f)]
        files += [f for f in moved if f not in files]
        for f in files:
            if f in SKIP_FILES or f.startswith(SKIP_PREFIXES) or "/tuned/" in f:
                continue
            if f.endswith(".py"):
                old_f = moved.get(f, f)
                mod_new = mod_old = None
                for op, root in PLUGINS.items():
                    if f.startswith(root + "/"):
                        mod_new = module_of(op, f[len(root) + 1:])
                    if old_f.startswith(root + "/"):
                        mod_old = module_of(op, old_f[len(root) + 1:])
                is_pkg_old = old_f.endswith("__init__.py")
                is_pkg_new = f.endswith("__init__.py")
                changes += rewrite_imports(f, mod_old, mod_new, is_pkg_old, is_pkg_new, mods, existing)
                if f in moved:
                    changes += fix_file_paths(f, f.count("/") - moved[f].count("/"))
            if Path(f).suffix in TEXT_SUFFIXES or Path(f).name in ("run.sh",):
                changes += rewrite_text(f, mods, paths)
        leftover = [f"{PLUGINS[op]}/{o}" for op in PLUGINS for o in MOVES[op] if os.path.exists(f"{PLUGINS[op]}/{o}")
                    and not (o == "__init__.py" and op in REEXPORT_INIT)]
        if leftover:
            raise Unmappable(f"still present after the moves: {leftover}")
        for op, root in PLUGINS.items():
            for d in ("triton",):
                p = Path(root) / d
                if p.is_dir() and not any(x.name != "__pycache__" for x in p.iterdir()):
                    for c in p.rglob("*"):
                        if c.is_file():
                            c.unlink()
                    for c in sorted(p.rglob("*"), reverse=True):
                        c.rmdir()
                    p.rmdir()
    except Unmappable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("nothing to do: the plugins already have the common module set" if changes == 0
          else f"done: {len(todo)} move(s), {changes} change(s) in all; review with `git status` / `git diff -M`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
