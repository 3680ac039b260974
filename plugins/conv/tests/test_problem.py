"""ConvProblem: defaults, derived sizes, (de)serialisation, and errors that say how to fix."""
from __future__ import annotations

import numpy as np
import pytest

from ck_core.errors import InvalidProblem
from ck_conv.problem import ConvProblem

BASE = dict(N=2, G=2, C=8, K=4, input_spatial=(9, 9), filter=(3, 3), stride=(2, 2), pad_left=(1, 1),
            pad_right=(1, 1))


def test_defaults_and_derived():
    p = ConvProblem(**BASE)
    assert (p.in_layout, p.wei_layout, p.out_layout) == ("NHWGC", "GKYXC", "NHWGK")
    assert p.output_spatial == (5, 5)
    assert p.input_shape == (2, 9, 9, 2, 4) and p.weight_shape == (2, 2, 3, 3, 4)
    assert p.output_shape == (2, 5, 5, 2, 2)
    assert p.gemm_mnk == (50, 2, 36) and p.flops == 2 * 50 * 2 * 36 * 2
    assert p.dilation == (1, 1) and p.specialization == "filter3x3"
    q = ConvProblem(N=1, C=4, K=4, input_spatial=(5, 6, 7), filter=(1, 1, 1), stride=2)
    assert q.in_layout == "NDHWGC" and q.stride == (2, 2, 2) and q.specialization == "filter1x1_pad0"
    assert q.output_spatial == (3, 3, 4)
    r = ConvProblem(N=1, C=4, K=4, input_spatial=(7,), filter=(3,), dilation=(2,), pad_left=(0,), pad_right=(3,))
    assert r.output_spatial == (6,) and r.in_layout == "NWGC"


def test_asymmetric_padding_and_dilation_size():
    p = ConvProblem(N=1, C=1, K=1, input_spatial=(10, 4), filter=(3, 2), stride=(3, 1), dilation=(2, 3),
                    pad_left=(2, 0), pad_right=(0, 1))
    # (10 + 2 + 0 - 2*2 - 1)//3 + 1 = 3 ; (4 + 0 + 1 - 3*1 - 1)//1 + 1 = 2
    assert p.output_spatial == (3, 2)


def test_layout_families():
    p = ConvProblem(**BASE, in_layout="NGCHW")
    assert (p.wei_layout, p.out_layout, p.input_shape) == ("GKCYX", "NGKHW", (2, 2, 4, 9, 9))
    g = ConvProblem(**BASE, in_layout="GNHWC")
    assert g.out_layout == "GNHWK" and g.input_shape == (2, 2, 9, 9, 4)


def test_round_trip_and_ck_convention():
    p = ConvProblem(**BASE, direction="bwd_weight", dtype="bf16", split_k=4)
    d = p.to_dict()
    assert d["op"] == "conv" and d["input_spatial"] == [9, 9]
    assert ConvProblem.from_dict(d) == p
    assert ConvProblem.from_ck(G=2, N=2, K=2, C=4, input_spatial=(9, 9), filter=(3, 3), stride=(2, 2),
                               pad_left=(1, 1), pad_right=(1, 1)) == ConvProblem(**BASE)
    assert hash(p) == hash(ConvProblem.from_dict(d))


@pytest.mark.parametrize("change, hint", [
    (dict(C=9), "not divisible by G"),
    (dict(K=5), "not divisible by G"),
    (dict(N=0), "positive"),
    (dict(input_spatial=(9, 0)), "positive"),
    (dict(filter=(3, 3, 3)), "one filter size per spatial dimension"),
    (dict(stride=(1, 1, 1)), "one per spatial dimension"),
    (dict(pad_left=(-1, 0)), ">= 0"),
    (dict(input_spatial=(2, 2), pad_left=(0, 0), pad_right=(0, 0)), "output size"),
    (dict(dtype="fp64"), "unknown dtype"),
    (dict(direction="backward"), "unknown direction"),
    (dict(in_layout="NCHW"), "unknown input layout"),
    (dict(in_layout="NDHWGC"), "for 3D"),
    (dict(in_layout="NHWGC", out_layout="NGKHW"), "does not match"),
    (dict(wei_layout="GKXC"), "for 1D"),
    (dict(split_k=-1), "split_k must be an integer >= 0"),
    (dict(input_spatial=(1, 2, 3, 4), filter=(1, 1, 1, 1)), "1, 2 or 3"),
])
def test_bad_input_raises_with_hint(change, hint):
    with pytest.raises(InvalidProblem, match=hint):
        ConvProblem(**{**BASE, **change})


def test_from_dict_unknown_field():
    with pytest.raises(InvalidProblem, match="unknown ConvProblem fields"):
        ConvProblem.from_dict({**ConvProblem(**BASE).to_dict(), "bias": True})


def test_mismatched_tensor_shapes():
    p = ConvProblem(**BASE)
    p.check_shapes(x=np.zeros(p.input_shape), w=np.zeros(p.weight_shape))
    with pytest.raises(InvalidProblem, match="needs"):
        p.check_shapes(x=np.zeros((2, 9, 9, 8)))
    from ck_conv.reference import conv_fwd
    with pytest.raises(InvalidProblem):
        conv_fwd(p, np.zeros(p.input_shape), np.zeros((2, 2, 3, 3, 3)))
