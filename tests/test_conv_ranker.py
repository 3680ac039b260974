"""The conv ranker's plumbing: conv features over the shortlist, and a shortlist-scoped ranker in
the Dispatcher (it orders the op's shortlist; the pick is the same through select and rank)."""
import math

import numpy as np
import pytest

from ck_core import ranker, tuned_data
from ck_core.dispatcher import Dispatcher
from ck_core.errors import ConfigError
from ck_core.plugins import get_manager
from ck_core.registry import Registry

pytest.importorskip("ck_conv")
from ck_conv.problem import ConvProblem  # noqa: E402


@pytest.fixture
def user_store(tmp_path, monkeypatch):
    monkeypatch.setenv("CK_TUNING_DB", str(tmp_path / "tuning.json"))
    tuned_data.clear_cache()
    yield tmp_path / "tuning.d"
    tuned_data.clear_cache()


def _problem(direction="forward", G=1, C=48, K=80, sp=(11, 13), flt=(3, 3), stride=(2, 1), N=3):
    pad = tuple(f // 2 for f in flt)
    return ConvProblem(N=N, G=G, C=C, K=K, input_spatial=sp, filter=flt, stride=stride, pad_left=pad,
                       pad_right=pad, direction=direction, dtype="bf16", split_k=0)


PROBLEMS = [_problem(d) for d in ("forward", "bwd_data", "bwd_weight")] + [
    _problem("forward", G=24, C=24, K=24, flt=(5, 5), stride=(1, 1)),      # depthwise 5x5
    _problem("bwd_weight", G=4, C=64, K=32, sp=(7, 9, 5), flt=(3, 1, 1), stride=(1, 1, 1)),
    _problem("bwd_data", C=3, K=16, sp=(37,), flt=(7,), stride=(2,))]


@pytest.fixture(scope="module")
def conv_reg():
    return Registry.from_enumeration("conv", "sm90", "numpy", dtypes=["bf16"])


def _shortlist(disp, p):
    op = disp.mgr.op("conv")
    for tier in op.shortlist(p, disp.arch, disp.backend):
        keys = disp.registry.shortlist(p, tier, disp.backend)
        if keys:
            return keys
    return []


@pytest.mark.parametrize("p", PROBLEMS, ids=lambda p: f"{p.direction}-{p.ndim}d-g{p.G}")
def test_conv_features_are_finite_one_per_candidate_and_describe_the_kernel(conv_reg, p):
    mgr = get_manager()
    op, arch = mgr.op("conv"), mgr.arch("sm90")
    keys = _shortlist(Dispatcher(conv_reg, backend="numpy"), p)
    assert len(keys) >= 2
    cols = op.features(p, keys, arch)
    for name, v in cols.items():
        assert v.shape == (len(keys),) and np.isfinite(v).all(), name
    from ck_conv.keys import config_of

    cfgs = [config_of(k) for k in keys]
    assert np.array_equal(cols["tile_m"], [math.log2(c.tile[0]) for c in cfgs])
    assert np.array_equal(cols["split"], [math.log2(c.split) for c in cfgs])
    assert cols["log_taps"][0] == math.log2(p.taps) and cols["dir_bwd_weight"][0] == (p.direction == "bwd_weight")
    # the old heuristic's first pick is marked, exactly once
    assert cols["heur_first"].sum() == 1
    assert keys[int(np.argmax(cols["heur_first"]))] == op.heuristic(p, keys, arch)[0]
    # more programs than compute units never leave occupancy above 1
    assert ((cols["occupancy"] > 0) & (cols["occupancy"] <= 1.0 + 1e-12)).all()


def _write(spec):
    tuned_data.write("conv", "sm90", ranker.TABLE, [(("numpy",), spec)], command="test", device="cpu",
                     source="a hand-made conv model", fields=ranker.FIELDS)


def test_a_shortlist_ranker_orders_the_shortlist_and_select_agrees_with_rank(conv_reg, user_store):
    p = _problem("forward", C=64, K=128, sp=(14, 14), stride=(1, 1))
    short = _shortlist(Dispatcher(conv_reg, backend="numpy"), p)
    old = Dispatcher(conv_reg, backend="numpy").select(p)
    from ck_conv.keys import config_of

    # prefer the widest M tile, then the widest N tile (the heuristic prefers 64-row tiles here)
    _write({"kind": "linear", "features": ["tile_m", "tile_n"], "coef": [-1.0, -0.01], "intercept": 0.0,
            "candidates": "shortlist"})
    d = Dispatcher(conv_reg, backend="numpy")
    got = d.select(p)
    want = min(short, key=lambda k: (-config_of(k).tile[0], -config_of(k).tile[1]))
    assert config_of(got).tile[:2] == config_of(want).tile[:2] and got in short
    assert "shortlist" in d._rule
    assert got != old   # the model really moved the pick
    ranked = Dispatcher(conv_reg, backend="numpy").rank(p)
    assert ranked[0] == got and set(ranked[:len(short)]) == set(short)
    assert len(ranked) > len(short)   # the rest of the candidates follow


def test_a_shortlist_ranker_outside_its_domain_keeps_the_heuristic(conv_reg, user_store):
    p = _problem("bwd_data")
    old = Dispatcher(conv_reg, backend="numpy").select(p)
    _write({"kind": "linear", "features": ["tile_n"], "coef": [-1.0], "intercept": 0.0, "candidates": "shortlist",
            "domain": {"log_n": [5.0, 6.0]}})
    assert Dispatcher(conv_reg, backend="numpy").select(p) == old


def test_an_unknown_candidate_scope_is_a_config_error():
    with pytest.raises(ConfigError, match="candidates"):
        ranker.Model({"kind": "linear", "features": ["a"], "coef": [1.0], "candidates": "some"})


def _dw_bwd_weight(N=8, G=32, hw=112):
    return ConvProblem(N=N, G=G, C=G, K=G, input_spatial=(hw, hw), filter=(3, 3), stride=(1, 1), pad_left=(1, 1),
                       pad_right=(1, 1), direction="bwd_weight", dtype="bf16")


def test_the_shipped_ranker_scores_splits_beyond_its_training_data():
    """The oracle saw splits up to 32; the shortlist now names up to 256 (depthwise bwd_weight):
    the split features are continuous, so unseen splits get finite scores, and on a layer whose
    unsplit launch makes one program per 16-32 groups (32 groups at 112x112) the wide splits win."""
    import attrs
    from ck_conv.keys import config_of, key_of
    from ck_conv.heuristics import shortlist

    mgr = get_manager()
    op, arch = mgr.op("conv"), mgr.arch("sm90")
    tuned_data.clear_cache()
    model = ranker.model_for(op, "sm90", "triton")
    assert model is not None and model.scope == "shortlist"
    for p in (_dw_bwd_weight(), _problem("bwd_weight", C=64, K=64, sp=(56, 56), stride=(1, 1), N=8)):
        short = list(dict.fromkeys(next(iter(shortlist(p, arch, "triton")))))
        # (bwd_weight's split-made families come without their unsplit twins: add them here)
        unsplit = list(dict.fromkeys(key_of(attrs.evolve(config_of(k), split=1), "sm90", "triton") for k in short))
        short += [k for k in unsplit if k not in short]
        wide = [key_of(attrs.evolve(config_of(k), split=s), "sm90", "triton") for k in unsplit for s in (64, 128)]
        keys = short + wide
        cols = op.features(p, keys, arch)
        assert ranker.covers(model, cols)
        pred = model.predict(ranker.matrix(cols, model.features, "conv ranker"))
        assert pred.shape == (len(keys),) and np.isfinite(pred).all()
        assert np.array_equal(cols["log_split"][len(short):], np.tile([6.0, 7.0], len(unsplit)))
        if p.G > 1:
            assert pred[len(short):].min() < pred[[keys.index(k) for k in unsplit]].min()


def test_memoised_selection_gives_the_same_shortlist_as_a_cold_start(conv_reg):
    """Selection caches per config, key and problem: a warm process lists the same shortlist
    (and picks the same key) as one that starts cold, for problems differing only in batch."""
    from ck_conv import heuristics, keys as ck_keys, problem as ck_problem

    rng = np.random.default_rng()
    probs = [_dw_bwd_weight(N=int(rng.integers(1, 40)), G=int(rng.choice([16, 32, 96])), hw=int(rng.integers(9, 60)))
             for _ in range(3)]
    probs += [_problem(d, C=int(rng.choice([16, 48, 64])), K=int(rng.choice([32, 80])), N=int(rng.integers(1, 9)),
                       sp=(int(rng.integers(5, 30)), int(rng.integers(5, 30)))) for d in ("forward", "bwd_data", "bwd_weight")]

    def lists():
        d = Dispatcher(conv_reg, backend="numpy")
        return [(_shortlist(d, p), d.select(p)) for p in probs]

    def clear():
        for memo in (ck_keys._WHY, heuristics._PREFERRED, heuristics._LISTS, heuristics._PICKS,
                     ck_problem._OUT_SPATIAL):
            memo.clear()
        for fn in (ck_keys.config_of, ck_keys.key_of, ck_keys._evolved, heuristics._closeness):
            fn.cache_clear()

    clear()
    cold = lists()
    warm = lists()
    clear()
    assert cold == warm == lists()
    assert all(k in s for s, k in cold)
    # most lists give a choice (a small-channel forward's list can hold one key: 7 seeds in 40 drew one)
    assert sum(len(s) >= 2 for s, _ in cold) >= len(cold) // 2
