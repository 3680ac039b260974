"""benchmarks/selection_collect.py end to end on the CPU (numpy backend, tiny shapes), and the
numpy-only parts of training on what it wrote."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from ck_core import ranker, select_data, select_train
from ck_core.plugins import get_manager

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "selection_collect.py"
pytest.importorskip("ck_gemm")


@pytest.fixture(scope="module")
def collect():
    spec = importlib.util.spec_from_file_location("selection_collect", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gemm_shapes_hold_out_whole_models(collect):
    cases = collect.gemm_cases(400)
    held = [c for c in cases if c["split"] == "heldout"]
    assert len(held) >= 0.25 * len(cases)
    for model in collect.HELD_OUT_MODELS:
        rows = [c for c in cases if c["family"].startswith(f"llm:{model}:")]
        assert rows and all(c["split"] == "heldout" for c in rows)
    assert collect.gemm_cases(50) == collect.gemm_cases(50)   # a fixed seed
    assert {c["family"].split(":")[0] for c in cases} == {"llm", "skinny", "odd", "batched"}


def test_collect_on_the_cpu_then_load_score_and_fit(collect, tmp_path):
    assert collect.main(["--backend", "numpy", "--shapes", "12", "--max-dim", "24", "--reps", "1", "--cap", "6",
                         "--out", str(tmp_path)]) == 0
    path = tmp_path / "gemm_sm90.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["op"] == "gemm" and lines[0]["backend"] == "numpy" and "command" in lines[0]
    mgr = get_manager()
    oracle = select_data.load(path, mgr)
    assert len(oracle.shapes) == 12
    for s in oracle.shapes:
        assert 2 <= len(s.keys) <= 6 and np.isfinite(s.ms).all() and s.heuristic in [k.name for k in s.keys]
    op, arch = mgr.op("gemm"), mgr.arch("sm90")
    scores = select_data.evaluate(oracle.shapes, select_data.heuristic_selector(op, arch))
    assert all(0 < x <= 1 for x in scores)
    # the linear cost model fits with numpy alone and ranks through ck_core.ranker
    X, y, groups, names = select_train.design(op, arch, oracle.shapes)
    assert X.shape == (sum(groups), len(names)) and (y >= 0).all()
    model = ranker.Model(select_train.fit_linear(X, y, names))
    assert np.allclose(model.predict(X), X @ model.coef + model.intercept)
    picks = select_data.evaluate(oracle.shapes, select_data.ranker_selector(model, op, arch))
    assert all(0 < x <= 1 for x in picks)


def test_class_blocks_keep_every_shape_and_group_each_class(collect):
    cases = collect.gemm_cases(300)
    out = collect.class_blocks(cases, collect.gemm_problem, 20)
    assert sorted(map(id, out)) == sorted(map(id, cases))
    classes = [collect.spec_class(collect.gemm_problem(c)) for c in out]
    switches = sum(a != b for a, b in zip(classes, classes[1:]))
    assert switches < len(set(classes)) + len(cases) // 20
    assert collect.class_blocks(cases, collect.gemm_problem, 0) == cases
