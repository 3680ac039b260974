import types

import pytest

from ck_core import Dispatcher, PluginManager, Registry, hookimpl, plugins
from ck_core.testing import arch_plugin
from ck_core.tuning import tune
from ck_core.winners import Winners

pytest.importorskip("ck_gemm")
from ck_gemm import GemmProblem  # noqa: E402


@pytest.fixture
def reg(ck_manager, fake_arch):
    return Registry.from_enumeration("gemm", fake_arch.name, dtypes=["fp16"], layouts=["rcr"])


def test_select_is_cached_and_plan_single_stage(reg):
    d = Dispatcher(reg)
    p = GemmProblem(m=256, n=256, k=64)
    k1 = d.select(p)
    assert d.select(p) is k1
    plan = d.plan(p)
    assert len(plan.stages) == 1 and plan.stages[0].key == k1


def test_heuristic_prefers_unpadded_fit(reg):
    d = Dispatcher(reg)
    key = d.select(GemmProblem(m=1024, n=1024, k=256))
    assert not (key.algorithm.pad_m or key.algorithm.pad_n)


def test_rank_hook_overrides_heuristic(fake_arch, monkeypatch):
    mod = types.ModuleType("ranker")
    mod.ck_rank_candidates = hookimpl(lambda problem, candidates, arch:
                                      sorted(candidates, key=lambda k: k.algorithm.tile_m))
    mgr = PluginManager(plugins=[arch_plugin(fake_arch), mod])
    monkeypatch.setattr(plugins, "_MANAGER", mgr)
    reg = Registry.from_enumeration("gemm", fake_arch.name, dtypes=["fp16"], layouts=["rcr"])
    key = Dispatcher(reg).select(GemmProblem(m=1024, n=1024, k=256))
    assert key.algorithm.tile_m == 64


def test_reject_hook_culls(fake_arch, monkeypatch):
    mod = types.ModuleType("rejecter")
    mod.ck_reject_kernel = hookimpl(lambda key, arch: "no compv4 here"
                                    if key.algorithm.pipeline == "compv4" else None)
    mgr = PluginManager(plugins=[arch_plugin(fake_arch), mod])
    monkeypatch.setattr(plugins, "_MANAGER", mgr)
    reg = Registry.from_enumeration("gemm", fake_arch.name, dtypes=["fp16"])
    assert reg and all(k.algorithm.pipeline != "compv4" for k in reg)


def test_tuning_table_wins_and_persists(reg, tmp_path, ck_rng, monkeypatch):
    from ck_core import tuned_data

    monkeypatch.setenv("CK_TUNED_DIR", str(tmp_path / "store"))
    tuned_data.clear_cache()
    d = Dispatcher(reg)
    p = GemmProblem(m=100, n=60, k=64)
    from ck_gemm.reference import make_inputs
    inputs = make_inputs(p, ck_rng)
    table = Winners()
    fake_times = iter(range(1000, 0, -1))   # later candidates look faster
    results = tune(d, p, inputs, timer=lambda fn: (fn(), next(fake_times))[1], table=table, top=5)
    assert len(results) == 5 and results[0][1] <= results[-1][1]
    assert table.save().is_relative_to(tmp_path / "store")
    tuned_data.clear_cache()
    d2 = Dispatcher(reg, tuning=Winners())
    assert d2.select(p).name == results[0][0]
    assert d.select(p).name != results[0][0] or len(results) == 1
    tuned_data.clear_cache()


def test_failing_candidate_times_as_infinity(reg, ck_rng, caplog):
    d = Dispatcher(reg)
    p = GemmProblem(m=64, n=64, k=64)
    from ck_gemm.reference import make_inputs
    inputs = make_inputs(p, ck_rng)
    bad = d.rank(p)[0]
    d._impls[bad] = lambda problem, tensors: 1 / 0
    results = tune(d, p, inputs, timer=lambda fn: (fn(), 1.0)[1], top=3)
    assert dict(results)[bad.name] == float("inf")
    assert "failed" in caplog.text


def test_backend_unknown(reg):
    from ck_core import PluginError
    with pytest.raises(PluginError, match="unknown backend"):
        Dispatcher(reg, backend="cuda-magic")
