"""The selection CV tool's groups and select_train's disturbed-row rule (CPU, no lightgbm)."""
import importlib.util
from pathlib import Path

import attrs
import numpy as np

from ck_core import select_train

ROOT = Path(__file__).resolve().parents[1]


def _cv_tool():
    spec = importlib.util.spec_from_file_location("selection_cv", ROOT / "benchmarks" / "selection_cv.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@attrs.frozen
class _Alg:
    tile: int
    stages: int


@attrs.frozen
class _Key:
    algorithm: _Alg


def test_disturbed_drops_a_twin_timed_far_off_and_keeps_real_spreads():
    rng = np.random.default_rng()
    base = rng.uniform(3e-3, 9e-3)
    keys = [_Key(_Alg(64, 3)), _Key(_Alg(64, 4)), _Key(_Alg(128, 3)), _Key(_Alg(128, 4)), _Key(_Alg(256, 2))]
    # 64-tile: the 4-stage twin 17x off (disturbed); 128-tile: 1.6x apart (a real spread); 256: no twin
    ms = np.array([base, 17.0 * base, 2.0 * base, 3.2 * base, 40.0 * base])
    keep = select_train.disturbed(keys, ms, 5.0)
    assert keep.tolist() == [True, False, True, True, True]
    assert select_train.disturbed(keys, ms, 0.0).all()            # 0: keep every row
    assert select_train.disturbed(keys, ms, 1.5).tolist() == [True, False, True, False, True]


def test_the_cv_groups_never_split_a_network_or_a_model():
    tool = _cv_tool()

    @attrs.frozen
    class S:
        family: str
    fams = ["resnet50:forward", "resnet50:bwd_data", "unet:forward", "llm:llama3-8b:up", "llm:llama3-8b:down",
            "llm:qwen2-7b:o", "skinny", "skinny", "attn:phi3-mini"]
    shapes = [S(f) for f in fams]
    net = tool.groups_of(shapes, "network", 3, 0)
    assert net[0] == net[1] == "resnet50" and net[3] == net[4] == "llm"
    cfg = tool.groups_of(shapes, "config", 3, 0)
    assert cfg[3] == cfg[4] == "llama3-8b" and cfg[8] == "phi3-mini" and cfg[6].startswith("skinny#")
    kf = tool.groups_of(shapes, "kfold", 3, 0)
    assert kf[3] == kf[4] == "llama3-8b" and kf[0].startswith("resnet50:forward#")
    for how, labels in (("network", net), ("config", cfg)):
        folds = list(tool.folds_of(labels, how, 5))
        assert len(folds) == len(set(labels))
        for fit, test in folds:
            assert not {labels[i] for i in fit} & {labels[i] for i in test}
            assert sorted([*fit, *test]) == list(range(len(labels)))


def test_the_retime_script_checks_and_times_listed_rows_on_the_cpu(tmp_path, monkeypatch):
    import json
    import sys

    # the script imports selection_collect from its folder: keep both out of sys.modules afterwards
    # (another test loads selection_collect under that name for its worker processes)
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    for name in ("selection_retime", "selection_collect"):
        # setitem then delitem: monkeypatch restores the entry as it was (absent or the other test's module)
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name))
        monkeypatch.delitem(sys.modules, name)
    spec = importlib.util.spec_from_file_location("selection_retime", ROOT / "benchmarks" / "selection_retime.py")
    selection_retime = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(selection_retime)

    rng = np.random.default_rng()
    m, n, k = (int(v) for v in rng.integers(3, 40, size=3))
    name = "gemm_fp16_rcr_multistage_cshuffle_intrawave_pmnk_64x64x64_4x2x1_16x32x16_s4.sm90.triton"
    problem = {"op": "gemm", "m": m, "n": n, "k": k, "batch": 1, "dtype": "fp16", "dtype_c": "fp16",
               "layout": "rcr", "num_d": 0, "d_op": "add", "activation": "none"}
    doc = {"op": "gemm", "arch": "sm90", "backend": "numpy",
           "rows": [{"family": "odd", "problem": problem, "keys": [name, "gemm_not_a_kernel"],
                     "recorded_ms": {name: 0.5}}]}
    src, out = tmp_path / "list.json", tmp_path / "out.json"
    src.write_text(json.dumps(doc))
    assert selection_retime.main([str(src), "--out", str(out), "--rounds", "1"]) == 0
    row = json.loads(out.read_text())["rows"][0]
    assert row["ms"][name] > 0 and row["recorded_ms"][name] == 0.5
    assert row["ms"]["gemm_not_a_kernel"] is None and "gemm_not_a_kernel" in row["errors"]
