"""One results schema (issue #30): every committed results JSON carries the header
``ck_core.bench.result_header`` writes (schema {name, version}, device, date, command, commit), and
``ck bench`` writes where the user says, by default under ``./ck-results/``, never into the repo."""
from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from ck_core import bench

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted((ROOT / "benchmarks" / "results").rglob("*.json"))


def test_there_are_results_to_check():
    assert len(FILES) >= 10


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_committed_results_follow_the_schema(path):
    problems = bench.check_result(json.loads(path.read_text()))
    assert not problems, f"{path.relative_to(ROOT)}: {'; '.join(problems)} (write it with ck_core.bench.with_header)"


def test_check_result_names_what_is_missing():
    good = bench.with_header({"rows": []}, command="x", device="cpu")
    assert bench.check_result(good) == []
    assert good["schema"] == bench.RESULT_SCHEMA and good["commit"]
    assert "no 'commit'" in bench.check_result({k: v for k, v in good.items() if k != "commit"})
    assert any("schema" in p for p in bench.check_result({**good, "schema": "v1"}))
    assert any("newer" in p for p in bench.check_result({**good, "schema": {**bench.RESULT_SCHEMA, "version": 99}}))
    assert any("'date'" in p for p in bench.check_result({**good, "date": ""}))
    assert bench.check_result([1]) and bench.check_result(None)


def _fake_bench(monkeypatch):
    row = {"case": "c", "ours": 1.0, "peer": 1.0, "peer_name": "p", "unit": "ms", "ratio": 1.0}
    op = types.SimpleNamespace(bench=lambda peer, options: {"rows": [dict(row)]})
    import ck_core.plugins as plugins

    monkeypatch.setattr(plugins, "get_manager", lambda: types.SimpleNamespace(op=lambda name: op))
    monkeypatch.setattr(bench, "_gpu_visible", lambda: (True, ""))


def _args(**kw):
    return types.SimpleNamespace(**{"vs": "torch", "arch": None, "backend": None, "quick": True, "suite": "core",
                                    "quiet": True, "json": None, "csv": None, **kw})


def test_ck_bench_writes_under_the_current_directory_by_default(tmp_path, monkeypatch, capsys):
    _fake_bench(monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert bench.run_bench("toy", _args(), {}) == 0
    got = json.loads((tmp_path / "ck-results" / "toy.json").read_text())
    assert bench.check_result(got) == [] and got["rows"][0]["case"] == "c"
    assert not (tmp_path / "benchmarks").exists()


def test_ck_bench_json_goes_where_the_user_says(tmp_path, monkeypatch, capsys):
    _fake_bench(monkeypatch)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "elsewhere" / "r.json"
    assert bench.run_bench("toy", _args(json=str(out)), {}) == 0
    assert bench.check_result(json.loads(out.read_text())) == []
    assert not (tmp_path / "ck-results").exists()
