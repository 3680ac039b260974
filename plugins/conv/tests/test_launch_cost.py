"""Selection pays for launches (issue #26): a split that adds launches (an ``atomic`` split's memset
and cast, ``twostage``'s reduce kernel) is chosen only where the reduction steps it saves outweigh
them (the tuned ``launch_cost`` table), so tiny problems run one launch and long reductions keep
their splits."""
from __future__ import annotations

import attrs
import pytest

from ck_conv.geometry import launches
from ck_conv.heuristics import heuristic_config, launch_cost, preferred_split, split_pays
from ck_conv.keys import config_of
from ck_conv.problem import ConvProblem
from ck_core.plugins import get_manager

TINY = dict(N=2, G=1, C=16, K=16, input_spatial=(8, 8), filter=(3, 3), pad_left=(1, 1), pad_right=(1, 1))


@pytest.fixture(scope="module")
def sm90():
    return get_manager().arch("sm90")


def test_launches_count_what_the_launcher_launches():
    p = ConvProblem(**TINY, direction="forward", dtype="fp16", split_k=0)
    c = heuristic_config(p)
    assert launches(attrs.evolve(c, split=1)) == 1
    assert launches(attrs.evolve(c, split=2, reduction="atomic")) == 3          # memset, kernel, cast
    assert launches(attrs.evolve(c, split=2, reduction="atomic", dtype="fp32")) == 2   # no cast
    assert launches(attrs.evolve(c, split=2, reduction="twostage")) == 2
    assert launches(attrs.evolve(c, split=4, reduction="fixup")) == 1
    assert launches(attrs.evolve(c, split=4, reduction="atomicfix")) == 1


def test_the_launch_cost_is_tuned_data():
    launch_us, step_us = launch_cost()
    assert 0 < launch_us < 100 and 0 < step_us < 100


@pytest.mark.parametrize("direction", ["forward", "bwd_data", "bwd_weight"])
@pytest.mark.parametrize("layout", ["ngchw", "nhwgc"])
def test_a_tiny_problem_selects_a_one_launch_key(sm90, direction, layout):
    from ck_conv.problem import LAYOUT_FAMILIES
    from ck_core import api as core

    in_l, wei_l, out_l = LAYOUT_FAMILIES[layout][2]
    p = ConvProblem(**TINY, direction=direction, dtype="fp16", split_k=0, in_layout=in_l, wei_layout=wei_l,
                    out_layout=out_l)
    disp = core.dispatcher_for("conv", "sm90", "triton", directions=(direction,), dtypes=("fp16",), ndims=(2,),
                               layouts=(layout,))
    key = disp.select(p)
    assert launches(config_of(key)) == 1, key.name


@pytest.mark.parametrize("name,direction,shape", [
    ("ResNet-50 layer1 bwd_weight", "bwd_weight", dict(N=8, G=1, C=64, K=64, input_spatial=(56, 56))),
    ("c5 forward", "forward", dict(N=1, G=1, C=512, K=512, input_spatial=(7, 7))),
    ("c5 bwd_data", "bwd_data", dict(N=1, G=1, C=512, K=512, input_spatial=(7, 7))),
])
def test_long_reductions_keep_their_splits(sm90, name, direction, shape):
    p = ConvProblem(**shape, filter=(3, 3), pad_left=(1, 1), pad_right=(1, 1), direction=direction,
                    dtype="bf16", split_k=0)
    c = attrs.evolve(heuristic_config(p), split=1, reduction="atomic")
    sp = preferred_split(c, p, sm90.compute_units, sm90.lds_bytes)
    assert sp > 1 and launches(c, sp) == 3 and split_pays(c, p, sp, sm90.compute_units), name


def test_a_split_pays_when_launches_are_free(monkeypatch):
    from ck_conv import heuristics

    p = ConvProblem(**TINY, direction="forward", dtype="fp16", split_k=0)
    c = attrs.evolve(heuristic_config(p), split=1, reduction="atomic")
    assert not split_pays(c, p, 2, 132)
    monkeypatch.setattr(heuristics, "launch_cost", lambda: (0.0, 0.25))
    assert split_pays(c, p, 2, 132)


def test_a_large_bwd_weight_problem_still_selects_a_split(sm90):
    from ck_core import api as core

    p = ConvProblem(N=8, G=1, C=64, K=64, input_spatial=(56, 56), filter=(3, 3), pad_left=(1, 1), pad_right=(1, 1),
                    direction="bwd_weight", dtype="bf16", split_k=0, in_layout="NHWGC", wei_layout="GKYXC",
                    out_layout="NHWGK")
    disp = core.dispatcher_for("conv", "sm90", "triton", directions=("bwd_weight",), dtypes=("bf16",), ndims=(2,),
                               layouts=("nhwgc",))
    assert config_of(disp.select(p)).split > 1
