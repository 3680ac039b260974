"""Selection of a new problem takes fast paths (the trees' sibling layout, the op's vectorised
``supports_many``, memoised problem properties) and must pick exactly what the plain paths pick.

Three checks with the shipped rankers: the trees' fast walk lands on the same leaves as the
node-array walk; ``supports_many`` agrees with ``supports`` key for key; and a few hundred new
problems per op pick the same key as (a) the plain paths in this process and (b) the recorded
picks of the code before the fast paths (while the rankers are the ones they were made with).
"""
import hashlib
import importlib.util
import json
import random
import statistics
import time
from pathlib import Path

import numpy as np
import pytest

from ck_core import ranker, tuned_data
from ck_core.dispatcher import Dispatcher
from ck_core.plugins import get_manager
from ck_core.registry import Registry

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "benchmarks" / "results" / "selection" / "select_picks_sm90.json"
KINDS = ("gemm", "conv:forward", "conv:bwd_data", "conv:bwd_weight")


def _select_time():
    spec = importlib.util.spec_from_file_location("select_time", ROOT / "benchmarks" / "select_time.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def st():
    pytest.importorskip("ck_gemm")
    pytest.importorskip("ck_conv")
    return _select_time()


_REGISTRIES: dict = {}


def _dispatcher(p):
    """A fresh Dispatcher (empty selection caches) over a registry shared per signature."""
    mgr = get_manager()
    if p.op == "gemm":
        opts = dict(dtypes=(p.dtype,), layouts=(p.layout,), dtypes_c=(p.dtype_c,), num_ds=(0,), d_ops=("add",),
                    activations=("none",))
    else:
        opts = dict(directions=(p.direction,), dtypes=(p.dtype,), ndims=(p.ndim,), layouts=(p.layout_family,))
    key = (p.op, tuple(sorted(opts.items())))
    reg = _REGISTRIES.get(key)
    if reg is None:   # what ck_core.api.dispatcher_for enumerates
        opts = {**dict(mgr.op(p.op).api_options), **opts}
        reg = mgr.hook.ck_api_registry(op=p.op, arch=mgr.arch("sm90"), backend="triton", options=opts)
        if reg is None:
            reg = Registry.from_enumeration(p.op, "sm90", "triton", manager=mgr, **opts)
        _REGISTRIES[key] = reg
    from ck_core.api import _tuning_table

    return Dispatcher(reg, backend="triton", tuning=_tuning_table(), check_backend=False)


def _for(disps: dict, p):
    """The Dispatcher in ``disps`` for ``p``'s signature (a fresh one the first time)."""
    sig = (p.op, p.dtype, getattr(p, "layout", None), getattr(p, "direction", None), getattr(p, "ndim", None),
           getattr(p, "layout_family", None))
    d = disps.get(sig)
    if d is None:
        d = disps[sig] = _dispatcher(p)
    return d


def _picks(problems, disps=None) -> list:
    disps = {} if disps is None else disps
    return [_for(disps, p).select(p).name for p in problems]


def _model(op_name):
    mgr = get_manager()
    return ranker.model_for(mgr.op(op_name), "sm90", "triton")


@pytest.mark.parametrize("op_name", ["gemm", "conv", "fmha"])
def test_the_sibling_layout_walks_to_the_same_leaves_as_the_node_arrays(op_name):
    pytest.importorskip(f"ck_{op_name}")
    model = _model(op_name)
    assert model is not None and model.kind == "gbdt" and model._layout is not None
    rng = np.random.default_rng()
    nf = len(model.features)
    # values on, just above and just below the model's own thresholds (ties decide left), and noise
    thr = model.threshold[model.feature >= 0]
    for rows in (1, 2, 37, 143):
        X = rng.choice(thr, size=(rows, nf)) + rng.choice([0.0, 0.0, 1e-12, -1e-12, 0.5, -3.0], size=(rows, nf))
        X[rng.random((rows, nf)) < 0.05] = np.nan
        assert np.array_equal(model.predict(X), model._walk(X))


def test_the_layout_handles_shared_subtrees_and_trees_deeper_than_the_walk(ck_rng):
    # node 1's children are shared by two parents (0 and 4); tree 2 (root 6) is one leaf;
    # depth 1 stops the walk at level 1 on an internal node, whose value counts
    spec = {"kind": "gbdt", "features": ["a", "b"], "base": 0.125,
            "trees": {"feature": [0, 1, -1, -1, 1, -1, -1], "threshold": [0.5, 2.0, 0, 0, 1.0, 0, 0],
                      "left": [1, 2, 2, 3, 2, 5, 6], "right": [4, 3, 2, 3, 3, 5, 6],
                      "value": [0.5, 0.75, 1.0, 2.0, 3.0, 7.0, 0.25], "roots": [0, 6], "depth": 3}}
    X = ck_rng.uniform(-1, 4, size=(301, 2))
    X[::7, 0] = 0.5
    X[::11, 1] = 2.0
    for depth in (1, 2, 3, 9):
        spec["trees"]["depth"] = depth
        m = ranker.Model(spec)
        assert m._layout is not None
        assert np.array_equal(m.predict(X), m._walk(X))
    spec["trees"]["left"][5] = 2     # a leaf that does not point at itself: the node-array walk
    m = ranker.Model(spec)
    assert m._layout is None and np.array_equal(m.predict(X), m._walk(X))


#: (arch, backend, enumeration options, problem dtypes, problem layouts)
_SPACES = [("sm90", "triton", dict(num_ds=(0, 1, 2), activations=("none", "relu"), split_ks=(1, 2)),
            ("fp16", "bf16"), ("rcr", "rrr", "crr", "ccr")),
           ("gfx942", "numpy", dict(num_ds=(0, 1), activations=("none", "relu"), split_ks=(1, 2), dtypes=("fp16",),
                                    layouts=("rcr", "rrr"), tiles_mn=(64, 128), pipelines=("compv3",)),
            ("fp16",), ("rcr", "rrr"))]


@pytest.mark.parametrize("arch,backend,options,dtypes,layouts", _SPACES, ids=["sm90-triton", "gfx942-numpy"])
def test_gemm_supports_many_agrees_with_supports_key_by_key(arch, backend, options, dtypes, layouts):
    pytest.importorskip("ck_gemm")
    from ck_gemm.keys import supports, supports_many
    from ck_gemm.problem import GemmProblem

    mgr = get_manager()
    keys = tuple(Registry.from_enumeration("gemm", arch, backend, manager=mgr, **options))
    if backend == "triton":
        assert len({k.algorithm.variant for k in keys}) > 3
    assert any(k.algorithm.split_k > 1 for k in keys) and any(k.algorithm.pad_m for k in keys)
    rng = random.Random()
    for _ in range(30):
        m, n, k = (rng.choice([1, 3, 16, 17, 64, 100, 128, 255, 256, 1000, 4096, rng.randint(1, 5000)])
                   for _ in range(3))
        dtype = rng.choice(dtypes)
        p = GemmProblem(m=m, n=n, k=k, batch=rng.choice([1, 3]), dtype=dtype, dtype_c=rng.choice([dtype, "fp32"]),
                        layout=rng.choice(layouts), num_d=rng.choice(options["num_ds"]),
                        activation=rng.choice(["none", "relu"]))
        want = [supports(key, p) is None for key in keys]
        assert list(supports_many(keys, p)) == want
        assert any(want) or p.dtype_c == "fp32"


def _recorded():
    return json.loads(RECORDED.read_text())


@pytest.mark.parametrize("what", KINDS)
def test_new_problems_pick_the_same_key_through_the_plain_paths(st, what, monkeypatch):
    mgr = get_manager()
    probs = list(dict.fromkeys(st.problems(what, 120, random.randrange(1 << 30), mgr)))
    fast = _picks(probs)
    op = mgr.op(what.split(":")[0])
    model = _model(op.name)
    monkeypatch.setattr(model, "_layout", None)     # the node-array walk
    many = op.supports_many
    object.__setattr__(op, "supports_many", None)   # supports() key by key (the OpSpec is frozen)
    try:
        plain = _picks(probs)
    finally:
        object.__setattr__(op, "supports_many", many)
    assert len(fast) >= 100 and fast == plain


@pytest.mark.parametrize("what", KINDS)
def test_new_problems_pick_what_the_code_before_the_fast_paths_picked(st, what):
    rec = _recorded()
    op_name = what.split(":")[0]
    tuned_data.clear_cache()
    if st.ranker_fingerprint(op_name) != rec["rankers"][op_name]:
        pytest.skip(f"the {op_name} ranker is not the one {RECORDED.name} was recorded with; "
                    f"the plain-path comparison above still runs")
    kind = rec["kinds"][what]
    probs = list(dict.fromkeys(st.problems(what, rec["problems"], rec["seed"], get_manager())))
    assert hashlib.sha256("\n".join(map(repr, probs)).encode()).hexdigest() == kind["problems_sha256"], \
        "benchmarks/select_time.py draws other problems now: re-record the picks at the old commit"
    want = [kind["kernels"][i] for i in kind["picks"]]
    got = _picks(probs)
    assert len(got) == len(want) >= 290
    diff = [(repr(p), w, g) for p, w, g in zip(probs, want, got) if w != g]
    assert not diff, f"{len(diff)} picks changed, e.g. {diff[:3]}"


#: most milliseconds (median) Dispatcher.select may take for a new problem here: the target is 1 ms;
#: on the shared 2-core machine at load ~6 GEMM took 1.1-1.6 ms and conv bwd_weight ~2.4 ms (a
#: guard with headroom for a loaded host, not the target)
SELECT_MS = {"gemm": 2.5, "conv:forward": 3.0, "conv:bwd_data": 3.0, "conv:bwd_weight": 4.0}


@pytest.mark.timing
@pytest.mark.parametrize("what", KINDS)
def test_select_of_a_new_problem_is_fast(st, what):
    mgr = get_manager()
    probs = list(dict.fromkeys(st.problems(what, 80, random.randrange(1 << 30), mgr)))
    disps: dict = {}
    # each signature's registry and per-key caches warm (as in a running model): a twin of each problem
    _picks([st.attrs.evolve(p, m=p.m + 1000) if p.op == "gemm" else st.attrs.evolve(p, N=p.N + 1000)
            for p in probs], disps)
    times = []
    for p in probs:
        d = _for(disps, p)
        t = time.perf_counter()
        d.select(p)
        times.append(time.perf_counter() - t)
    med = statistics.median(times) * 1e3
    assert med < SELECT_MS[what], f"{what}: median {med:.3f} ms per new problem"
