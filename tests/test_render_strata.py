"""benchmarks/render_md.py shows the broad suites' strata (issues #28 / #29): a stratum table under each
suite's split table, and one README cell per suite; a run without strata says so."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _render_md():
    spec = importlib.util.spec_from_file_location("render_md", ROOT / "benchmarks" / "render_md.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _data(summary):
    return {"suite": "broad", "date": "2026-11-29", "device": "H200", "command": "x", "rows": [],
            "skipped_for_time": [], "summary": summary}


def test_strata_are_told_apart_from_splits():
    rm = _render_md()
    for key in ("fwd/all", "fwd/heldout", "fwd_bwd/nowindow", "all", "train", "fp8", "forward/train"):
        assert not rm.is_stratum(key), key
    for key in ("fwd/d64", "decode/page16", "decode/small_cache", "layout/crr", "llm/mid_m", "forward/1x1",
                "all/depthwise", "kind/linear_train"):
        assert rm.is_stratum(key), key


def test_broad_section_renders_a_stratum_table():
    rm = _render_md()
    summ = {"fwd/all": {"n": 3, "ratio_geomean": 1.1},
            "fwd/d40": {"n": 2, "graph_geomean": 0.9, "graph_min": 0.7, "below_floor": 1,
                        "peers": {"cudnn": 1, "flex": 1}},
            "fwd_bwd/d224": {"n": 1, "graph_geomean": 1.3, "graph_min": 1.3, "below_floor": 0}}
    text = rm.broad_section("fmha", _data(summ))
    split_table, strata = text.split("Strata (issues #28 / #29)")
    assert "| fwd/all |" in split_table and "d40" not in split_table
    assert "| fwd/d40 | 2 | 0.900 | 0.700 | 1 | cudnn 1, flex 1 |" in strata
    assert "| fwd_bwd/d224 |" in strata
    # a run of the earlier suites (no strata) renders as before: no stratum table
    assert "Strata" not in rm.broad_section("fmha", _data({"fwd/all": {"n": 3}}))


def test_readme_cell_lists_each_stratum_and_the_rows_below_the_floor():
    rm = _render_md()
    summ = {"fwd/all": {"n": 3}, "fwd/d40": {"graph_geomean": 0.9, "graph_min": 0.7, "below_floor": 1},
            "fwd_bwd/d40": {"graph_geomean": 0.8, "graph_min": 0.5, "below_floor": 2},
            "fwd_train/d40": {"graph_geomean": 5.0, "graph_min": 5.0, "below_floor": 9},
            "decode/page1": {"graph_geomean": 0.6, "graph_min": 0.6, "below_floor": 1}}
    cell = rm._strata(_data(summ), ("fwd/", "fwd_bwd/", "decode/page"), "below_floor")
    assert cell == ("fwd/d40 0.900x (min 0.700x); fwd_bwd/d40 0.800x (min 0.500x); decode/page1 0.600x "
                    "(min 0.600x); rows below the floor: 4")
    assert rm._strata(_data({"fwd/all": {"n": 1}}), ("fwd/",), None).startswith("no strata")
