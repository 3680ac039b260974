"""README.md's "Where it stands" table and BENCHMARKS.md are rendered from benchmarks/results by
benchmarks/render_md.py (issue #30): the committed text must be what the tool renders today."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _render_md():
    spec = importlib.util.spec_from_file_location("render_md", ROOT / "benchmarks" / "render_md.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_table_is_the_render_of_the_results():
    text = (ROOT / "README.md").read_text()
    assert _render_md().render_readme(text) == text, "README.md's table is stale: run python benchmarks/render_md.py"


def test_benchmarks_md_is_the_render_of_the_results():
    assert _render_md().render_benchmarks() == (ROOT / "BENCHMARKS.md").read_text(), \
        "BENCHMARKS.md is stale: run python benchmarks/render_md.py"


def test_every_row_names_whose_figure_it_is():
    rm = _render_md()
    table = rm.standing_table()
    for what, name, _get, _target, whose in rm.STANDING:
        assert whose in ("Dispatcher's pick", "fastest candidate", "kernel with its tuned config", "-"), what
        assert name is None or (ROOT / "benchmarks" / "results" / name).is_file(), name
    assert table.count("\n") == len(rm.STANDING) + 2
