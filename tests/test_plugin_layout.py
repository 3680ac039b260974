"""The three op plugins share one module set (docs/PLUGIN_LAYOUT.md, issue #13 item 8).

Every plugin has the REQUIRED modules; anything else it has is either a SHARED name (the same
role wherever it appears) or one of its few op-specific modules, named here so that a new module
has to be placed deliberately (and the doc updated) rather than appear anywhere.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"gemm": ROOT / "plugins/gemm/ck_gemm", "conv": ROOT / "plugins/conv/ck_conv",
            "fmha": ROOT / "plugins/fmha/ck_fmha"}

REQUIRED = {
    "", "api", "problem", "keys", "plugin", "reference", "bench", "bench_broad", "sweep",
    "backends", "backends.triton", "backends.triton.kernels", "backends.triton.launch",
}
SHARED = {
    "space", "keyspace", "heuristics", "features", "plan", "footprint",
    "backends.triton.keys", "backends.triton.configs", "backends.triton.aot",
    "backends.ck", "backends.ck.template", "nn",
}
OWN = {
    "gemm": {"ck_rules"},
    "conv": {"backends.triton.dw_codegen", "backends.triton.buffers", "backends.triton.warm", "geometry"},
    "fmha": {"codegen", "codegen.ck_facts", "codegen.culls", "codegen.decode_families", "codegen.enumerate",
             "codegen.spec", "codegen.sweep", "demo",
             "device_errors",
             "flash_attn", "integrations", "integrations.transformers", "masks", "paged", "philox",
             "problem_rules", "problem_tensors",
             "bench_broad_cases", "bench_broad_timing", "bench_broad_summary",
             "reference.forward", "reference.backward", "reference.layout", "reference.rope",
             "backends.triton.gluon_fwd", "backends.triton.gluon_bwd", "backends.triton.warm",
             "backends.triton.smem", "backends.triton.guards", "backends.triton.launch_bwd", "backends.triton.launch_decode",
             "backends.triton.implement", "decode", "prefill",
             "seqtune"},
}


def modules(pkg: Path) -> set[str]:
    out = set()
    for f in pkg.rglob("*.py"):
        parts = list(f.relative_to(pkg).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.add(".".join(parts))
    return out


@pytest.mark.parametrize("op", sorted(PACKAGES))
def test_required_modules(op):
    missing = REQUIRED - modules(PACKAGES[op])
    assert not missing, f"ck_{op} lacks {sorted(missing)} (docs/PLUGIN_LAYOUT.md)"


@pytest.mark.parametrize("op", sorted(PACKAGES))
def test_no_unplaced_modules(op):
    extra = modules(PACKAGES[op]) - REQUIRED - SHARED - OWN[op]
    assert not extra, (f"ck_{op} has {sorted(extra)}, which docs/PLUGIN_LAYOUT.md does not place; use a "
                       "module name of the common set, or add it to the doc and to OWN here")


def test_every_op_specific_module_exists():
    # a stale OWN entry would let a removed module come back unnoticed
    for op, own in OWN.items():
        assert own <= modules(PACKAGES[op]), f"ck_{op}: OWN names {sorted(own - modules(PACKAGES[op]))}"


def test_relative_imports_stay_inside_the_package():
    # an import that climbs out of its plugin package (too many dots after a move) fails only at run time
    for op, pkg in PACKAGES.items():
        for f in pkg.rglob("*.py"):
            depth = len(f.relative_to(pkg).parts) - 1  # packages between the file and ck_<op>
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level:
                    assert node.level - 1 <= depth, f"{f.relative_to(ROOT)}:{node.lineno} imports above ck_{op}"


def test_layout_doc_names_every_module():
    doc = (ROOT / "docs/PLUGIN_LAYOUT.md").read_text()
    for name in REQUIRED | SHARED | set().union(*OWN.values()):
        if name:
            assert f"`{name.replace('.', '/')}" in doc, f"docs/PLUGIN_LAYOUT.md does not describe {name}"


def _module_level_imports(op: str) -> dict[str, set[str]]:
    """Module -> the plugin modules it imports at import time (imports inside functions are the
    deliberate way to defer torch or break a cycle, so they do not count)."""
    pkg, top = PACKAGES[op], f"ck_{op}"
    mods = {(f"{top}.{m}" if m else top): m for m in modules(pkg)}
    graph = {}
    for name, rel in mods.items():
        f = pkg / (rel.replace(".", "/") + ".py") if (pkg / (rel.replace(".", "/") + ".py")).is_file() \
            else pkg / rel.replace(".", "/") / "__init__.py"
        is_pkg = f.name == "__init__.py"
        base = name.split(".") if is_pkg else name.split(".")[:-1]
        deps = set()
        for stmt in ast.parse(f.read_text()).body:
            for node in ast.walk(stmt) if isinstance(stmt, (ast.If, ast.Try)) else [stmt]:
                if isinstance(node, ast.ImportFrom):
                    src = node.module or ""
                    if node.level:
                        src = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
                    for a in node.names:
                        deps.add(f"{src}.{a.name}" if f"{src}.{a.name}" in mods else src)
                elif isinstance(node, ast.Import):
                    deps.update(a.name for a in node.names)
        graph[name] = deps & set(mods) - {name}
    return graph


@pytest.mark.parametrize("op", sorted(PACKAGES))
def test_no_import_cycles(op):
    graph = _module_level_imports(op)
    state = {}

    def visit(m, path):
        state[m] = "open"
        for d in sorted(graph[m]):
            assert state.get(d) != "open", f"import cycle: {' -> '.join(path[path.index(d):] + [d])}"
            if d not in state:
                visit(d, path + [d])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


_IMPORT_EACH_FIRST = r"""
import importlib, os, sys
import numpy, torch, triton, attrs, ck_core  # third-party and core preloaded: only the plugin's order matters
failed = []
for name in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:   # a child that has loaded none of the plugin's modules: `name` is imported first
        try:
            importlib.import_module(name)
        except BaseException as e:
            print(f"{name}: {type(e).__name__}: {e}", flush=True)
            os._exit(1)
        os._exit(0)
    if os.waitpid(pid, 0)[1]:
        failed.append(name)
sys.exit(1 if failed else 0)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_every_module_imports_first():
    """Each plugin module imported first into an interpreter that has none of the plugin loaded:
    a cycle that the static graph misses (an import inside an ``if`` or at a function's first call
    at import time) fails here as a partially initialised module."""
    names = [f"ck_{op}.{m}" if m else f"ck_{op}" for op in sorted(PACKAGES) for m in sorted(modules(PACKAGES[op]))]
    r = subprocess.run([sys.executable, "-c", _IMPORT_EACH_FIRST, *names], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]


def test_key_spaces_are_chosen_by_arch_and_backend_not_by_type():
    """Issue #13 item 8: a key's space (and launcher) follows ``key.backend``/``key.arch``; no
    ``isinstance`` of a key, signature or algorithm picks it in the plugins' hook modules or the core."""
    files = [PACKAGES[op] / "plugin.py" for op in PACKAGES] + [ROOT / "ck_core/dispatcher.py"]
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and node.args:
                kind = ast.unparse(node.args[1])
                assert not any(w in kind for w in ("Key", "Spec", "Sig", "Alg", "Instance")), \
                    f"{f.relative_to(ROOT)}:{node.lineno}: isinstance(..., {kind}) chooses a key space by type"
