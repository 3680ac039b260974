"""The import contract (docs/PLUGIN_LAYOUT.md, "Layers"): a package's modules import each other
without a loop, counting every import of a project module wherever it is written, at module level
or inside a function (a function-level import only defers a loop, it does not remove it).  Imports
of optional heavy dependencies (torch, triton, transformers) are not project modules and do not
count.  Importing ``a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py`` first, so a module
also depends on the packages above the module it imports.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: package directory -> its import name
PACKAGES = {
    "plugins/gemm/ck_gemm": "ck_gemm",
    "plugins/conv/ck_conv": "ck_conv",
    "plugins/fmha/ck_fmha": "ck_fmha",
}


def module_graph(pkg_dir: Path, top: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (anywhere in its source)."""
    mods: dict[str, tuple[Path, bool]] = {}
    for f in sorted(pkg_dir.rglob("*.py")):
        parts = list(f.relative_to(pkg_dir).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mods[".".join([top] + (parts[:-1] if is_pkg else parts))] = (f, is_pkg)

    def with_parents(name: str) -> set[str]:
        parts = name.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & set(mods)

    graph = {}
    for name, (f, is_pkg) in mods.items():
        base = name.split(".") if is_pkg else name.split(".")[:-1]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.ImportFrom):
                src = node.module or ""
                if node.level:
                    src = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
                for a in node.names:
                    sub = f"{src}.{a.name}"
                    deps |= with_parents(sub if sub in mods else src)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    deps |= with_parents(a.name)
        # a package's own __init__ runs before its submodules: that edge is no import
        graph[name] = deps - {name} - {p for p in with_parents(name) if p != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import loop of ``graph`` as [m0, m1, ..., m0], or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == "open":
                return stack[stack.index(d):] + [d]
            if d not in state:
                got = visit(d)
                if got:
                    return got
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            got = visit(m)
            if got:
                return got
    return None


def test_find_cycle_finds_a_function_level_loop(tmp_path):
    pkg = tmp_path / "pk"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import c\n")
    (pkg / "c.py").write_text("import torch\n\ndef g():\n    from pk import a\n")
    cycle = find_cycle(module_graph(pkg, "pk"))
    assert cycle and cycle[0] == cycle[-1] and {"pk.a", "pk.sub.b", "pk.c"} <= set(cycle)
    (pkg / "c.py").write_text("import torch\n")
    assert find_cycle(module_graph(pkg, "pk")) is None


@pytest.mark.parametrize("pkg", sorted(PACKAGES))
def test_no_import_cycle(pkg):
    cycle = find_cycle(module_graph(ROOT / pkg, PACKAGES[pkg]))
    assert cycle is None, (f"import loop in {PACKAGES[pkg]}: {' -> '.join(cycle)}; move the shared part down a "
                           "layer (docs/PLUGIN_LAYOUT.md) instead of deferring the import")


def test_core_has_no_import_loop():
    cycle = find_cycle(module_graph(ROOT / "ck_core", "ck_core"))
    assert cycle is None, f"import loop in ck_core: {' -> '.join(cycle)}; move the shared part down a layer"

