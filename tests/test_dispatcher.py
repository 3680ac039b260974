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


# -- selection families (OpSpec.selection_family): a new size of a known family reuses its pick --------

class _OneOp:
    """A manager whose ``op()`` answers one (evolved) OpSpec; everything else the real manager's."""

    def __init__(self, mgr, op):
        self._mgr, self._op = mgr, op

    def op(self, name):
        return self._op

    def __getattr__(self, name):
        return getattr(self._mgr, name)


def _with_family(d, family, **over):
    import attrs

    d.mgr = _OneOp(d.mgr, attrs.evolve(d.mgr.op("gemm"), selection_family=family, **over))
    return d


def test_size_bucket_keeps_powers_of_two_and_tile_multiples_apart():
    from ck_core.dispatcher import size_bucket

    assert [size_bucket(n) for n in range(1, 17)] == list(range(1, 17))   # small sizes: exact
    assert size_bucket(17) == size_bucket(18) != size_bucket(19)
    for k in range(5, 20):
        assert size_bucket(2 ** k) != size_bucket(2 ** k + 1)          # "n <= 2**k" never splits a bucket
        assert size_bucket(2 ** k) != size_bucket(2 ** k - 1)          # nor "n >= 2**k"
        assert size_bucket(2 ** k - 1) == size_bucket(2 ** k - 2 ** (k - 4) + 1)
        assert size_bucket(2 ** k + 1) == size_bucket(2 ** k + 2 ** (k - 3))
        assert size_bucket(2 ** k + 2 ** (k - 3)) != size_bucket(2 ** k + 2 ** (k - 3) + 1)
    seen = [size_bucket(n) for n in range(1, 5000)]
    runs = [b for i, b in enumerate(seen) if i == 0 or b != seen[i - 1]]
    assert len(runs) == len(set(runs)) < 120   # contiguous buckets, 8 per octave


def test_a_new_problem_of_a_known_family_reuses_the_pick_once_it_supports_it(reg):
    d = _with_family(Dispatcher(reg), lambda p, arch, backend: ("family", p.n, p.k))
    first = d.select(GemmProblem(m=256, n=256, k=64))
    assert (d.selections, d.family_hits) == (1, 0)
    for m in (512, 768, 1024):   # (multiples of any tile: the pick supports them)
        assert d.select(GemmProblem(m=m, n=256, k=64)) is first
    assert (d.selections, d.family_hits) == (1, 3)
    d.select(GemmProblem(m=256, n=512, k=64))                 # another family: selected in full
    assert (d.selections, d.family_hits) == (2, 3)
    d.clear_cache()
    d.select(GemmProblem(m=768, n=256, k=64))
    assert (d.selections, d.family_hits) == (3, 3)


def test_a_family_pick_that_cannot_run_the_problem_is_passed_over(reg):
    d = Dispatcher(reg)
    op = d.mgr.op("gemm")
    refused = set()

    def supports(key, problem):   # the family's first pick cannot run m=300
        if problem.m == 300 and key.name in refused:
            return "not this size"
        return op.supports(key, problem)

    d = _with_family(d, lambda p, arch, backend: "one family", supports=supports)
    first = d.select(GemmProblem(m=256, n=256, k=64))
    refused.add(first.name)
    other = d.select(GemmProblem(m=300, n=256, k=64))
    assert other != first and supports(other, GemmProblem(m=300, n=256, k=64)) is None
    assert (d.selections, d.family_hits) == (2, 0)


def test_no_family_without_the_op_hook_or_with_a_rank_hook(reg, fake_arch, monkeypatch):
    d = Dispatcher(reg)
    if d.mgr.op("gemm").selection_family is None:
        for m in (256, 257):
            d.select(GemmProblem(m=m, n=256, k=64))
        assert (d.selections, d.family_hits) == (2, 0)
    monkeypatch.setenv("CK_AUTOTUNE", "1")
    d = _with_family(Dispatcher(reg), lambda p, arch, backend: "one family")
    assert d._family(GemmProblem(m=256, n=256, k=64), d.mgr.op("gemm")) is None
