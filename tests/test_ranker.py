"""The learned ranker's plumbing: numpy inference, the Dispatcher's order
(store > hook > ranker > heuristic), caching, and CK_AUTOTUNE's first-call tuning."""
import json
import types
from pathlib import Path

import numpy as np
import pytest

from ck_core import plugins, ranker, tuned_data
from ck_core.dispatcher import Dispatcher
from ck_core.errors import ConfigError
from ck_core.hookspecs import hookimpl
from ck_core.registry import Registry
from ck_core.testing import arch_plugin

pytest.importorskip("ck_gemm")
from ck_gemm.problem import GemmProblem  # noqa: E402


@pytest.fixture
def user_store(tmp_path, monkeypatch):
    monkeypatch.setenv("CK_TUNING_DB", str(tmp_path / "tuning.json"))
    tuned_data.clear_cache()
    yield tmp_path / "tuning.d"
    tuned_data.clear_cache()


def _write_ranker(arch, spec, backend="numpy", folder=None):
    tuned_data.write("gemm", arch, ranker.TABLE, [((backend,), spec)], command="test", device="cpu",
                     source="a hand-made model", fields=ranker.FIELDS, folder=folder)


def _linear(**coef):
    return {"kind": "linear", "features": list(coef), "coef": list(coef.values()), "intercept": 0.0}


def _tree_spec():
    # one tree: x0 <= 0.5 ? (x1 <= 2 ? 1.0 : 2.0) : 3.0, plus a single-leaf tree of 0.25
    return {"kind": "gbdt", "features": ["a", "b"], "base": 0.5,
            "trees": {"feature": [0, 1, -1, -1, -1, -1], "threshold": [0.5, 2.0, 0, 0, 0, 0],
                      "left": [1, 2, 2, 3, 4, 5], "right": [4, 3, 2, 3, 4, 5],
                      "value": [0, 0, 1.0, 2.0, 3.0, 0.25], "roots": [0, 5], "depth": 2}}


def test_tree_model_matches_a_hand_evaluation(ck_rng):
    m = ranker.Model(_tree_spec())
    X = ck_rng.uniform(-1, 4, size=(257, 2))
    want = np.where(X[:, 0] <= 0.5, np.where(X[:, 1] <= 2.0, 1.0, 2.0), 3.0) + 0.25 + 0.5
    assert np.array_equal(m.predict(X), want)


@pytest.mark.parametrize("breakage", [
    lambda s: s.update(kind="forest"),
    lambda s: s["trees"].update(left=[1, 2, 2, 3, 4, 99]),
    lambda s: s["trees"].update(feature=[0, 7, -1, -1, -1, -1]),
    lambda s: s["trees"].update(value=[0, 0]),
    lambda s: s.update(features=[]),
    lambda s: s["trees"].pop("roots"),
])
def test_a_malformed_model_is_a_config_error(breakage):
    spec = json.loads(json.dumps(_tree_spec()))
    breakage(spec)
    with pytest.raises(ConfigError, match="select_train"):
        ranker.Model(spec)


@pytest.fixture
def gemm_reg(ck_manager, fake_arch):
    return Registry.from_enumeration("gemm", fake_arch.name, dtypes=["fp16"], layouts=["rcr"])


def test_dispatcher_order_store_hook_ranker_heuristic(gemm_reg, user_store, fake_arch, monkeypatch):
    p = GemmProblem(m=1000, n=1000, k=256)
    heur = Dispatcher(gemm_reg).select(p)
    # the ranker: smallest tiles first (the heuristic prefers large ones)
    _write_ranker(fake_arch.name, _linear(tile_m=1.0, tile_n=1.0, tile_k=0.01))
    d = Dispatcher(gemm_reg)
    got = d.select(p)
    cands = gemm_reg.candidates(p, backend="numpy")
    small = min(k.algorithm.tile_m * k.algorithm.tile_n for k in cands)
    assert got.algorithm.tile_m * got.algorithm.tile_n == small and got != heur
    assert "learned ranker" in d._rule
    # a plugin that answers ck_rank_candidates overrides the ranker
    mod = types.ModuleType("biggest")
    mod.ck_rank_candidates = hookimpl(lambda problem, candidates, arch:
                                      sorted(candidates, key=lambda k: -k.algorithm.tile_m * k.algorithm.tile_n))
    mgr = plugins.PluginManager(plugins=[arch_plugin(fake_arch), mod])
    monkeypatch.setattr(plugins, "_MANAGER", mgr)
    reg2 = Registry(gemm_reg.arch, list(gemm_reg), name="hooked")
    hooked = Dispatcher(reg2).select(p)
    assert hooked.algorithm.tile_m * hooked.algorithm.tile_n > small
    # a measured winner in the store beats both
    from ck_core.winners import Winners

    w = Winners(command="test", device="cpu")
    w.record(fake_arch.name, "numpy", p, cands[-1].name, 1e-3)
    w.save()
    assert Dispatcher(reg2, tuning=Winners()).select(p) == cands[-1]


def test_ranker_runs_once_per_problem_and_not_on_the_warm_path(gemm_reg, user_store, fake_arch, monkeypatch):
    _write_ranker(fake_arch.name, _linear(tile_m=1.0))
    d = Dispatcher(gemm_reg)
    calls = []
    real = ranker.rank
    monkeypatch.setattr(ranker, "rank", lambda *a: calls.append(1) or real(*a))
    p = GemmProblem(m=77, n=130, k=64)
    first = d.select(p)
    for _ in range(3):
        assert d.select(p) is first
    assert len(calls) == 1


def test_a_ranker_needing_a_feature_the_op_lacks_says_retrain(gemm_reg, user_store, fake_arch):
    _write_ranker(fake_arch.name, _linear(no_such_feature=1.0))
    with pytest.raises(ConfigError, match="retrain"):
        Dispatcher(gemm_reg).select(GemmProblem(m=64, n=64, k=64))


def test_autotune_times_the_top_k_and_records_the_winner_in_the_user_store(gemm_reg, user_store, fake_arch,
                                                                         monkeypatch):
    monkeypatch.setenv("CK_AUTOTUNE", "1")
    monkeypatch.setenv("CK_AUTOTUNE_TOP", "3")
    p = GemmProblem(m=96, n=160, k=64)
    ranked = Dispatcher(gemm_reg).rank(p)
    top = ranked[:3]
    shipped = Path(plugins.get_manager().op("gemm").tuning_data or ".")
    before = {f: f.read_bytes() for f in shipped.glob("*.json")} if shipped.is_dir() else {}
    from ck_core import autotune

    fake = {top[0].name: None, top[1].name: 5e-3, top[2].name: 2e-3}   # the first one fails
    timed = []

    def time_it(disp, key, problem, inputs):
        timed.append(key.name)
        if fake[key.name] is None:
            raise RuntimeError("launch failed")
        return fake[key.name]
    monkeypatch.setattr(autotune, "_time", time_it)
    d = Dispatcher(gemm_reg)
    assert d.select(p) == top[2] and timed == [k.name for k in top]
    doc = json.loads((user_store / "gemm" / f"{fake_arch.name}.json").read_text())
    entry = doc["tables"]["kernels"]["entries"][0]["value"]
    assert entry["kernel"] == top[2].name and entry["seconds"] == 2e-3
    assert [r["seconds"] for r in entry["results"]] == [None, 5e-3, 2e-3]
    # package data untouched; a new Dispatcher finds the winner in the store without timing
    assert before == ({f: f.read_bytes() for f in shipped.glob("*.json")} if shipped.is_dir() else {})
    from ck_core.winners import Winners

    d2 = Dispatcher(gemm_reg, tuning=Winners())
    monkeypatch.setattr(autotune, "first_call", lambda *a: pytest.fail("tuned twice"))
    assert d2.select(p) == top[2] and d2._rule == "tuning table"
    # the same bucket, another shape: the store answers
    assert d2.select(GemmProblem(m=100, n=150, k=60)) == top[2]


def test_autotune_with_every_candidate_failing_keeps_the_ranked_order(gemm_reg, user_store, monkeypatch):
    monkeypatch.setenv("CK_AUTOTUNE", "1")
    d = Dispatcher(gemm_reg)
    p = GemmProblem(m=50, n=70, k=90)
    want = Dispatcher(gemm_reg).rank(p)[0]

    def broken(key):
        def fn(problem, tensors):
            raise RuntimeError("no")
        return fn
    monkeypatch.setattr(d, "impl", broken)
    assert d.select(p) == want
    assert not (user_store / "gemm").exists()


def test_a_problem_outside_the_rankers_domain_gets_the_heuristic(gemm_reg, user_store, fake_arch):
    spec = dict(_linear(tile_m=1.0, tile_n=1.0), domain={"log_m": [0.0, 6.0]})
    _write_ranker(fake_arch.name, spec)
    inside, outside = GemmProblem(m=40, n=1000, k=256), GemmProblem(m=1000, n=1000, k=256)
    d = Dispatcher(gemm_reg)
    d.select(inside)
    assert "learned ranker" in d._rule
    d.select(outside)
    assert "heuristic" in d._rule
    _write_ranker(fake_arch.name, dict(spec, domain={"log_m": [0.0, 6.0], "log_n": "wide"}))
    with pytest.raises(ConfigError, match="domain"):
        Dispatcher(gemm_reg).select(inside)


def test_a_candidate_outside_the_kernel_domain_is_not_ranked():
    """kernel_domain bounds every candidate (a form no training shape measured), domain the problem."""
    m = ranker.Model(dict(_linear(a=1.0, v_new=1.0), domain={"log_m": [0.0, 6.0]},
                          kernel_domain={"v_new": [0.0, 0.0]}))
    cols = {"log_m": np.array([3.0, 3.0, 3.0]), "a": np.array([1.0, 2.0, 3.0])}
    assert ranker.covers(m, dict(cols, v_new=np.zeros(3)))
    assert not ranker.covers(m, dict(cols, v_new=np.array([0.0, 1.0, 0.0])))   # one unseen kernel form
    assert not ranker.covers(m, cols)                                           # the feature is missing
    with pytest.raises(ConfigError, match="kernel_domain"):
        ranker.Model(dict(_linear(a=1.0), kernel_domain={"v_new": 0.0}))


def test_select_train_bounds_kernel_forms_no_shape_measured():
    from ck_core import select_train

    def features(problem, keys, arch):
        k = np.array(keys, dtype=np.float64)
        return {"log_m": np.full(len(k), float(problem)), "v_seen": k % 2, "v_never": np.zeros(len(k)),
                "tile": k}

    op = types.SimpleNamespace(features=features)
    shapes = [types.SimpleNamespace(problem=p, keys=ks) for p, ks in ((1, (0, 1, 2)), (2, (4, 6)))]
    assert select_train.kernel_domain(op, None, shapes) == {"v_never": [0.0, 0.0]}
