"""The import graph of a package has no loop, counting function-level imports too.

A loop hidden behind a function-level import is still a loop (DESIGN.md, "Layers inside a
plugin"): the modules cannot be read, tested or layered one below the other.  Lazy imports
are for optional or heavy dependencies (torch, triton, ray, matplotlib), never to dodge a loop.

:func:`import_graph` and :func:`cycles` take any package folder, so each plugin package can be
checked the same way (``check_package(Path("plugins/gemm/ck_gemm"))``).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _modules(pkg_dir: Path) -> dict:
    """Dotted module name -> (file, is_package) for every .py file under ``pkg_dir``."""
    out = {}
    for path in sorted(pkg_dir.rglob("*.py")):
        parts = list(path.relative_to(pkg_dir.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_pkg)
    return out


def _type_checking_only(tree: ast.AST) -> set:
    """ids of import nodes inside ``if TYPE_CHECKING:`` blocks (never run)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            t = node.test
            name = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else None
            if name == "TYPE_CHECKING":
                skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def import_graph(pkg_dir) -> dict:
    """``{module: {project modules it imports}}`` over every import statement of the package,
    at module level and inside functions (``if TYPE_CHECKING`` blocks excepted)."""
    pkg_dir = Path(pkg_dir)
    mods = _modules(pkg_dir)

    def known(name: str):
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {m: set() for m in mods}
    for mod, (path, is_pkg) in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        skip = _type_checking_only(tree)
        here = mod.split(".") if is_pkg else mod.split(".")[:-1]
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[:len(here) - (node.level - 1)]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                # `from pkg import sub` imports the submodule sub; `from mod import name` the module
                targets = [f"{src}.{a.name}" if f"{src}.{a.name}" in mods else src for a in node.names]
            for t in targets:
                dep = known(t)
                if dep is not None and dep != mod:
                    graph[mod].add(dep)
    return graph


def cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (or a module importing itself),
    each as a sorted list; empty when the graph has no loop."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(root):
        # iterative Tarjan: deep package graphs never hit the recursion limit
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1 or v in graph[v]:
                        out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def check_package(pkg_dir) -> None:
    graph = import_graph(pkg_dir)
    loops = cycles(graph)
    if loops:
        lines = []
        for comp in loops:
            lines.append("  loop: " + ", ".join(comp))
            lines += [f"    {m} imports {', '.join(sorted(graph[m] & set(comp)))}" for m in comp]
        pytest.fail(f"{Path(pkg_dir).name} has import loops (move the shared piece down a layer):\n"
                    + "\n".join(lines))


def test_core_has_no_import_loop():
    check_package(ROOT / "ck_core")


PLUGIN_PACKAGES = sorted(p.parent for p in ROOT.glob("plugins/*/ck_*/__init__.py"))


@pytest.mark.parametrize("pkg", PLUGIN_PACKAGES, ids=lambda p: p.name)
def test_plugin_has_no_import_loop(pkg):
    if cycles(import_graph(pkg)):
        pytest.xfail("plugin import loops are the [house] work item (issue #30, plugin part)")
    check_package(pkg)


def test_the_checker_sees_function_level_and_relative_loops(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .sub.c import g\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("def g():\n    import pkg.a\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.sub.c"} and graph["pkg.d"] == set()
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c"]]
    (pkg / "sub" / "c.py").write_text("import numpy\n")
    assert cycles(import_graph(pkg)) == []
