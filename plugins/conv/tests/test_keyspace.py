"""The conv enumeration as a KeySpace: nothing lost against the listed enumeration, and a new
problem is selected from the op's shortlist without listing every candidate."""
import random
import statistics
import time

import attrs
import pytest

from ck_core import Dispatcher, Registry
from ck_core.plugins import get_manager
from ck_conv.keys import config_of, supports
from ck_conv.keyspace import key_space
from ck_conv.problem import ConvProblem

#: small sub-spaces (a few tiles and pipelines: every family and split, quick to list)
SMALL = [
    dict(directions=["forward"], dtypes=["fp16"], ndims=[2], tiles=[(64, 64, 64), (128, 32, 64), (16, 16, 16)],
         pipelines=["compv3", "mem"]),
    dict(directions=["bwd_data", "bwd_weight"], dtypes=["bf16"], ndims=[1, 2], layouts=["nhwgc", "ngchw"],
         tiles=[(64, 64, 64), (64, 16, 32), (8, 32, 1), (4, 1024, 1)], pipelines=["compv3", "mem"]),
]


def _random_problem(rng: random.Random, direction: str, dtype: str = "fp16", ndim: int = 2,
                    layout: str = "NHWGC") -> ConvProblem:
    kind = rng.choice(["kxk", "1x1", "depthwise", "grouped", "stem"])
    n = rng.choice([1, 2, 3, 8])
    sp = tuple(rng.choice([5, 7, 9, 14, 17, 28, 33]) for _ in range(ndim))
    if kind == "depthwise":
        g = rng.choice([8, 24, 96])
        c = k = g
    elif kind == "grouped":
        g = rng.choice([2, 4, 8, 32])
        c, k = g * rng.choice([1, 4, 8, 16]), g * rng.choice([4, 8, 16])
    else:
        g, c, k = 1, rng.choice([3, 5, 16, 64, 130]), rng.choice([8, 24, 64, 256])
    f = 1 if kind == "1x1" else rng.choice([3, 5, 7])
    stride, pad = rng.choice([1, 2]), (0 if kind == "1x1" else f // 2)
    from ck_conv.problem import LAYOUT_FAMILIES, family_of

    in_l, w_l, out_l = LAYOUT_FAMILIES[family_of(layout) if layout in ("NHWGC", "NGCHW") else "nhwgc"][ndim]
    return ConvProblem(N=n, G=g, C=c, K=k, input_spatial=sp, filter=(f,) * ndim, stride=(stride,) * ndim,
                       pad_left=(pad,) * ndim, pad_right=(pad,) * ndim, direction=direction, dtype=dtype,
                       in_layout=in_l, wei_layout=w_l, out_layout=out_l)


@pytest.fixture(scope="module")
def sm90():
    return get_manager().arch("sm90")


@pytest.mark.parametrize("options", SMALL)
@pytest.mark.parametrize("backend", ["numpy", "triton"])
def test_space_counts_holds_and_filters_like_its_listing(sm90, options, backend):
    space = key_space(sm90, backend, dict(options))
    keys = list(space)
    assert keys and len(set(keys)) == len(keys)
    assert space.count() == len(keys)
    members = set(keys)
    # membership agrees with the listing, for members and for near misses of them
    rng = random.Random(7)
    for k in rng.sample(keys, min(200, len(keys))):
        assert k in space
        for alg in (attrs.evolve(k.algorithm, split=k.algorithm.split * 2 + 1),
                    attrs.evolve(k.algorithm, tile_m=k.algorithm.tile_m * 2),
                    attrs.evolve(k.algorithm, stages=(k.algorithm.stages + 1) % 6)):
            near = attrs.evolve(k, algorithm=alg)
            assert (near in space) == (near in members), near.name
    # a problem's candidates are exactly the filtered listing, in its order
    dirs, dts = options["directions"], options["dtypes"]
    for i in range(12):
        d = rng.choice(dirs)
        p = _random_problem(rng, d, rng.choice(dts), rng.choice(options["ndims"]),
                            rng.choice(["NHWGC", "NGCHW"]) if "layouts" in options else "NHWGC")
        want = [k for k in keys if supports(k, p) is None]
        assert space.candidates(p, supports) == want, p


def test_registry_of_a_space_filters_removes_and_exports(sm90):
    reg = Registry.from_enumeration("conv", "sm90", "triton", **SMALL[0])
    listed = list(reg)
    assert len(reg) == len(listed)
    k = listed[3]
    assert k in reg and k.name in reg and reg.get(k.name) == k
    reg.remove(k)
    assert k not in reg and k.name not in reg and len(reg) == len(listed) - 1
    reg.add(k)
    assert k in reg and len(reg) == len(listed)
    small = reg.filter("c.tile_m == 64 and c.reduction == 'fixup'")
    assert list(small) == [x for x in listed if x.algorithm.tile_m == 64 and x.algorithm.reduction == "fixup"]
    assert len(small.to_dict()["kernels"]) == len(small) > 0
    p = _random_problem(random.Random(3), "forward")
    assert small.candidates(p, "triton") == [x for x in small if supports(x, p) is None]


@pytest.mark.parametrize("direction", ["forward", "bwd_data", "bwd_weight"])
def test_selection_of_random_problems_is_a_supporting_member(direction):
    reg = Registry.from_enumeration("conv", "sm90", "triton", directions=[direction], dtypes=["fp16"], ndims=[2])
    disp = Dispatcher(reg, backend="triton", check_backend=False)
    rng = random.Random(11)
    for i in range(25):
        p = _random_problem(rng, direction)
        key = disp.select(p)
        assert key in reg and supports(key, p) is None, (p, key.name)
        assert config_of(key).direction == direction


def test_select_is_rank_first_on_a_small_registry():
    reg = Registry.from_enumeration("conv", "sm90", "triton", **SMALL[0])
    rng = random.Random(5)
    for i in range(6):
        p = _random_problem(rng, "forward")
        disp = Dispatcher(reg, backend="triton", check_backend=False)
        ranked = disp.rank(p)
        assert sorted(k.name for k in ranked) == sorted(k.name for k in reg.candidates(p, "triton"))
        assert Dispatcher(reg, backend="triton", check_backend=False).select(p) == ranked[0]


@pytest.mark.timing
def test_a_new_problem_is_selected_fast():
    """Generous on purpose (CI's 2 shared cores): the figure is about 1 ms per new problem."""
    reg = Registry.from_enumeration("conv", "sm90", "triton", directions=["forward"], dtypes=["fp16"], ndims=[2])
    disp = Dispatcher(reg, backend="triton", check_backend=False)
    rng = random.Random(2)
    for i in range(10):   # the space lists each specialisation's algorithms on first use
        disp.select(_random_problem(rng, "forward"))
    times = []
    for i in range(30):
        p = _random_problem(rng, "forward")
        t0 = time.perf_counter()
        disp.select(p)
        times.append(time.perf_counter() - t0)
    assert statistics.median(times) < 0.05, sorted(times)
