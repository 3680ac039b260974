"""The NumPy reference against PyTorch's CPU convolutions and autograd."""
from __future__ import annotations

import numpy as np
import pytest

from ck_conv.problem import ConvProblem
from ck_conv.reference import (conv_bwd_data, conv_bwd_weight, conv_fwd, from_canonical,
                               random_operands, rel_error, to_canonical)

torch = pytest.importorskip("torch")
F = torch.nn.functional

# (N, G, C, K, spatial, filter, stride, dilation, pad_left, pad_right, layout family)
CASES = [
    (2, 1, 3, 5, (11,), (3,), (1,), (1,), (1,), (1,), "nhwgc"),
    (1, 2, 4, 6, (13,), (4,), (3,), (2,), (2,), (0,), "ngchw"),
    (2, 2, 6, 4, (7, 9), (3, 3), (2, 1), (1, 1), (1, 0), (0, 2), "nhwgc"),
    (1, 3, 3, 6, (8, 7), (2, 3), (1, 2), (2, 1), (0, 1), (1, 1), "gnhwc"),
    (3, 1, 5, 3, (6, 5), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0), "ngchw"),
    (1, 4, 4, 4, (9, 9), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), "nhwgc"),   # depthwise
    (1, 2, 4, 2, (5, 6, 7), (3, 2, 3), (2, 1, 2), (1, 2, 1), (1, 0, 2), (0, 1, 1), "nhwgc"),
    (2, 1, 3, 3, (4, 5, 3), (1, 3, 1), (1, 2, 1), (1, 1, 1), (0, 1, 0), (0, 1, 0), "ngchw"),
]


def _problem(case, direction="forward"):
    n, g, c, k, sp, fl, st, dl, pl, pr, fam = case
    from ck_conv.problem import LAYOUT_FAMILIES
    lay = LAYOUT_FAMILIES[fam][len(sp)]
    return ConvProblem(N=n, G=g, C=c, K=k, input_spatial=sp, filter=fl, stride=st, dilation=dl,
                       pad_left=pl, pad_right=pr, direction=direction, dtype="fp32",
                       in_layout=lay[0], wei_layout=lay[1], out_layout=lay[2])


def _torch_x(p, x):
    a = to_canonical(x, p.in_layout, "in", p.ndim)  # N G C sp
    return torch.from_numpy(np.ascontiguousarray(a).reshape((p.N, p.C) + p.input_spatial)).double()


def _torch_w(p, w):
    a = to_canonical(w, p.wei_layout, "wei", p.ndim)  # G K C flt
    return torch.from_numpy(np.ascontiguousarray(a).reshape((p.K, p.c_per_group) + p.filter)).double()


def _torch_y(p, y):
    a = to_canonical(y, p.out_layout, "out", p.ndim)
    return torch.from_numpy(np.ascontiguousarray(a).reshape((p.N, p.K) + p.output_spatial)).double()


def _torch_fwd(p, xt, wt):
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[p.ndim]
    pad = []
    for pl, pr in reversed(list(zip(p.pad_left, p.pad_right))):
        pad += [pl, pr]
    return conv(F.pad(xt, pad), wt, stride=p.stride, dilation=p.dilation, groups=p.G)


def _back(p, t, kind, shape_layout):
    a = t.detach().numpy()
    if kind == "out":
        a = a.reshape((p.N, p.G, p.k_per_group) + p.output_spatial)
    elif kind == "in":
        a = a.reshape((p.N, p.G, p.c_per_group) + p.input_spatial)
    else:
        a = a.reshape((p.G, p.k_per_group, p.c_per_group) + p.filter)
    return from_canonical(a, shape_layout, kind, p.ndim)


@pytest.mark.parametrize("case", CASES, ids=[f"{len(c[4])}d-{i}" for i, c in enumerate(CASES)])
def test_three_directions_match_torch(case):
    p = _problem(case)
    ops = random_operands(p, seed=hash(case) % 1000)
    x, w = ops["x"], ops["w"]
    dy = np.random.default_rng(1).standard_normal(p.output_shape)
    xt = _torch_x(p, x).requires_grad_(True)
    wt = _torch_w(p, w).requires_grad_(True)
    yt = _torch_fwd(p, xt, wt)
    yt.backward(_torch_y(p, dy))

    y = conv_fwd(p, x, w)
    assert y.shape == p.output_shape
    assert rel_error(y, _back(p, yt, "out", p.out_layout)) < 1e-12
    dx = conv_bwd_data(p.with_direction("bwd_data"), dy, w)
    assert rel_error(dx, _back(p, xt.grad, "in", p.in_layout)) < 1e-12
    dw = conv_bwd_weight(p.with_direction("bwd_weight"), x, dy)
    assert rel_error(dw, _back(p, wt.grad, "wei", p.wei_layout)) < 1e-12


def test_comparison_can_fail():
    """A wrong answer (perturbed weight, swapped stride) is caught by the same check."""
    p = _problem(CASES[2])
    ops = random_operands(p, seed=3)
    good = conv_fwd(p, ops["x"], ops["w"])
    w2 = ops["w"].copy()
    w2.flat[0] += 0.5
    assert rel_error(conv_fwd(p, ops["x"], w2), good) > 1e-4
    import attrs
    q = attrs.evolve(p, stride=(1, 2))
    yt = _torch_fwd(q, _torch_x(q, ops["x"]), _torch_w(q, ops["w"]))
    assert _back(q, yt, "out", q.out_layout).shape != good.shape or \
        rel_error(_back(q, yt, "out", q.out_layout), good) > 1e-3


def test_rel_error_nan_is_inf():
    assert rel_error(np.array([np.nan, 1.0]), np.array([1.0, 1.0])) == float("inf")


def _random_case(rng, nd):
    g = int(rng.integers(1, 4))
    sp = tuple(int(v) for v in rng.integers(3, 9, size=nd))
    fl = tuple(int(rng.integers(1, min(4, s) + 1)) for s in sp)
    st = tuple(int(v) for v in rng.integers(1, 4, size=nd))
    dl = tuple(int(v) for v in rng.integers(1, 3, size=nd))
    pl = tuple(int(v) for v in rng.integers(0, 3, size=nd))
    pr = tuple(int(v) for v in rng.integers(0, 3, size=nd))
    for d in range(nd):  # keep the output non-empty
        while sp[d] + pl[d] + pr[d] < dl[d] * (fl[d] - 1) + 1:
            sp = sp[:d] + (sp[d] + 2,) + sp[d + 1:]
    fam = ("nhwgc", "ngchw", "gnhwc")[int(rng.integers(0, 3))]
    return (int(rng.integers(1, 3)), g, g * int(rng.integers(1, 4)), g * int(rng.integers(1, 4)), sp, fl, st, dl,
            pl, pr, fam)


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_random_shapes_match_torch(nd, ck_rng):
    for _ in range(3):
        test_three_directions_match_torch(_random_case(ck_rng, nd))
