"""benchmarks/selection_collect.py end to end on the CPU (numpy backend, tiny shapes), and the
numpy-only parts of training on what it wrote."""
import importlib.util
import json
import sys
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
    # worker processes (conv) find the script's functions under its module name
    sys.modules.setdefault("selection_collect", mod)
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


def test_conv_cases_hold_out_whole_networks_and_cover_the_families(collect):
    from ck_conv.bench_broad import HELD_OUT_NETS

    cases = collect.conv_cases(600)
    assert collect.conv_cases(40) == cases[:40]   # a fixed seed, drawn without replacement
    held = [c for c in cases if c["split"] == "heldout"]
    assert len(held) >= 0.25 * len(cases)
    assert all(c["split"] == "heldout" for c in cases if c["net"] in HELD_OUT_NETS)
    assert {c["net"] for c in cases} >= {"resnet50", "resnext50", "mobilenet_v2", "unet", "audio1d", "video3d"}
    assert {c["direction"] for c in cases} == {"forward", "bwd_data", "bwd_weight"}
    assert {c["N"] for c in cases} >= {1, 8, 32} and {c["dtype"] for c in cases} == {"fp16", "bf16"}


def test_conv_reference_and_operands_agree_with_the_ops_float64_reference(collect):
    """The collector's operands (views of cuDNN's channels-last tensors in our layouts) and its
    fp32 torch result, checked on the CPU against the op's own float64 reference."""
    pytest.importorskip("torch")
    op = get_manager().op("conv")
    seen = set()
    for c in collect.conv_cases(60, max_dim=5):
        p = collect.conv_problem(c)
        if (p.direction, p.ndim, p.G > 1) in seen:
            continue
        seen.add((p.direction, p.ndim, p.G > 1))
        ops, ref, peer = collect.conv_case(p, 7, "cpu")
        mine = op.reference(p, {k: v.float().numpy().astype(np.float64) for k, v in ops.items()})
        (name, r), = ref.items()
        err = np.linalg.norm(mine[name] - r.double().numpy()) / np.linalg.norm(mine[name])
        assert err < 1e-5, (c["family"], err)
    assert len(seen) >= 6


def test_conv_shortlists_collect_on_the_cpu_then_train(collect, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))   # the worker processes import the script by name
    assert collect.main(["--op", "conv", "--backend", "numpy", "--shapes", "10", "--max-dim", "5", "--reps", "1",
                         "--rounds", "1", "--workers", "2", "--out", str(tmp_path)]) == 0
    path = tmp_path / "conv_sm90.jsonl"
    header = json.loads(path.read_text().splitlines()[0])
    assert header["op"] == "conv" and header["candidates"] == "shortlist"
    mgr = get_manager()
    oracle = select_data.load(path, mgr)
    assert len(oracle.shapes) == 10
    op, arch = mgr.op("conv"), mgr.arch("sm90")
    for s in oracle.shapes:
        assert len(s.keys) >= 2 and np.isfinite(s.ms).all() and s.heuristic in [k.name for k in s.keys]
    X, y, groups, names = select_train.design(op, arch, oracle.shapes)
    model = ranker.Model(select_train.fit_linear(X, y, names))
    picks = select_data.evaluate(oracle.shapes, select_data.ranker_selector(model, op, arch))
    assert all(0 < x <= 1 for x in picks)


_CLASS_CHECK = r'''
import json, random, sys
sys.path.insert(0, sys.argv[1])
import selection_collect as sc
from ck_core import Registry
from ck_core.backends import triton_artifacts as ta
from ck_core.backends.triton_backend import build_for_problem
from ck_core.plugins import get_manager

mgr = get_manager(); op = mgr.op("gemm"); arch = mgr.arch("sm90"); tgt = arch.gpu_target()
rng = random.Random(int(sys.argv[2]))
by = {}
for c in sc.gemm_cases(600, seed=int(sys.argv[2])):
    by.setdefault(sc.spec_class(sc.gemm_problem(c)), []).append(c)
regs = {}
checked = 0
def material(k, p):
    return [json.dumps(ta.specialise(f, a, kw, tgt)[3], sort_keys=True, default=str)
            for _, f, a, kw in op.render(k, "triton").jit_calls(p)]
for cls, cs in by.items():
    pa, others = sc.gemm_problem(cs[0]), [sc.gemm_problem(c) for c in cs[1:12]]
    if not others:
        continue
    reg = regs.setdefault((pa.dtype, pa.layout), list(Registry.from_enumeration(
        "gemm", "sm90", "triton", dtypes=[pa.dtype], layouts=[pa.layout])))
    keys = [k for k in reg if all(op.supports(k, p) is None for p in [pa] + others)]
    split = [k for k in keys if k.algorithm.split_k > 1]
    for k in rng.sample(keys, min(2, len(keys))) + split[:1]:
        want = material(k, pa)
        for p in others:
            assert material(k, p) == want, (k.name, pa, p)
            checked += 1
    if split:
        pair = (split[0], pa, others[-1])
# the compile pool's unit of work: a key built for one problem's specialisation, then loaded
k, pa, pb = pair
assert build_for_problem(k, op, arch, pa)
assert ta.STATS["compiled"] == 2, ta.STATS          # the split-K kernel and its reduction
assert build_for_problem(k, op, arch, pb) and ta.STATS["loaded"] == 2, ta.STATS
print("checked", checked)
'''


def test_shapes_of_one_class_share_every_kernels_specialisation(tmp_path, ck_rng):
    """The collector compiles each (kernel, class) once, for the class's first shape: Triton's
    own binder must give every shape of the class the same specialisation (on the CPU: the sm90
    target, meta tensors, no interpreter)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CK_CACHE_DIR"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", _CLASS_CHECK, str(SCRIPT.parent), str(int(ck_rng.integers(1 << 20)))],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.split()[-1]) >= 30
