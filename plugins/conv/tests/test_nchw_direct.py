"""The implicit-GEMM forward and bwd_data kernels read and write torch's default memory format in
place (NGCHW / GKCYX / NGKHW, issue #26): no layout copies, every variant of the kernels (taps, 1x1,
strided 1x1, tap bits, split reductions, stream-K, merged groups, odd channels, 1D / 3D) against the
float64 reference, over outputs poisoned with NaN."""
from __future__ import annotations

import math

import attrs
import numpy as np
import pytest

from ck_conv.heuristics import heuristic_config
from ck_conv.problem import LAYOUT_FAMILIES, ConvProblem
from ck_conv.reference import random_operands, reference, rel_error

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
from ck_conv.backends.triton import launch as L  # noqa: E402
from ck_conv.geometry import split_plan  # noqa: E402

TD = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
TOL = {"fp16": 2e-3, "bf16": 1.5e-2, "fp32": 1e-5}


@pytest.fixture
def poisoned(monkeypatch):
    """Every float tensor torch.empty makes starts as NaN: an element a kernel does not write shows."""
    real = torch.empty

    def empty(*a, **k):
        t = real(*a, **k)
        return t.fill_(math.nan) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", empty)


@pytest.fixture
def odd_sms(monkeypatch):
    """A 5-SM "GPU", so stream-K chunks cut output tiles unevenly."""
    monkeypatch.setattr(L, "_num_sms", lambda device: 5)


@pytest.fixture
def copies(monkeypatch):
    """Counts the layout copies the forward makes (to_channels_last / from_channels_last)."""
    n = {"to": 0, "from": 0}
    to, frm = L.to_channels_last, L.from_channels_last

    def to_cl(*a):
        n["to"] += 1
        return to(*a)

    def from_cl(*a):
        n["from"] += 1
        return frm(*a)

    monkeypatch.setattr(L, "to_channels_last", to_cl)
    monkeypatch.setattr(L, "from_channels_last", from_cl)
    return n


def _nchw(shape: dict, dtype="fp16", direction="forward", **kw) -> ConvProblem:
    nd = len(shape["input_spatial"])
    i, w, o = LAYOUT_FAMILIES["ngchw"][nd]
    return ConvProblem(**shape, direction=direction, dtype=dtype, in_layout=i, wei_layout=w, out_layout=o, **kw)


def _check(p, cfg, split=None):
    if split:
        if cfg.reduction != "streamk":
            split = split_plan(attrs.evolve(cfg, split=split), p)[0]
            assert split > 1, "the reduction is too short to split"
        p, cfg = attrs.evolve(p, split_k=split), attrs.evolve(cfg, split=split)
    assert cfg.why_not(p) is None and cfg.triton_meta().get("NCHW") == 1
    ops = random_operands(p, seed=int(np.random.default_rng().integers(1 << 30)))
    tt = {k: torch.from_numpy(v).to(TD[p.dtype]) for k, v in ops.items()}
    ref = reference(p, {k: v.double().numpy() for k, v in tt.items()})
    out = L.run(p, tt, cfg)
    assert tuple(out.shape) == ref.shape and out.is_contiguous()
    err = rel_error(out.double().numpy(), ref)
    assert err < TOL[p.dtype], (p, cfg.name, err)


SHAPES = {
    "2d_strided_dilated": dict(N=2, G=2, C=6, K=10, input_spatial=(5, 7), filter=(3, 3), stride=(2, 1),
                               pad_left=(1, 0), pad_right=(0, 2), dilation=(1, 2)),
    "1d": dict(N=3, G=1, C=5, K=3, input_spatial=(7,), filter=(2,), stride=(3,), pad_left=(2,), pad_right=(1,)),
    "3d": dict(N=2, G=1, C=4, K=6, input_spatial=(3, 4, 5), filter=(2, 3, 1), stride=(1, 2, 2),
               pad_left=(1, 1, 0), pad_right=(0, 1, 1)),
    "1x1_s1": dict(N=2, G=1, C=20, K=18, input_spatial=(3, 5), filter=(1, 1)),
    "1x1_s2": dict(N=2, G=1, C=20, K=18, input_spatial=(5, 5), filter=(1, 1), stride=(2, 2)),
}


DIRECTIONS = ["forward", "bwd_data"]


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_nchw_reads_and_writes_in_place(shape, direction, poisoned, copies):
    p = _nchw(SHAPES[shape], direction=direction)
    _check(p, heuristic_config(attrs.evolve(p, split_k=0)))
    assert copies == {"to": 0, "from": 0}


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_nchw_other_dtypes_and_tap_bits(dtype, direction, poisoned):
    p = _nchw(SHAPES["2d_strided_dilated"], dtype=dtype, direction=direction)
    _check(p, attrs.evolve(heuristic_config(attrs.evolve(p, split_k=0)), tap_mask=True))


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("reduction", ["atomic", "fixup", "twostage", "streamk"])
def test_nchw_split_reductions(reduction, direction, poisoned, odd_sms):
    # odd channels: EVEN_C / EVEN_K off; 18 / 20 channels x 9 taps in 16-wide blocks: steps to split
    p = _nchw(dict(N=2, G=2, C=18, K=20, input_spatial=(4, 5), filter=(3, 3), stride=(2, 1), pad_left=(1, 0),
                   pad_right=(0, 2)), direction=direction)
    cfg = attrs.evolve(heuristic_config(attrs.evolve(p, split_k=0)), tile=(16, 16, 16), reduction=reduction,
                       tap_mask=reduction == "streamk")   # bwd_data stream-K: the tap-bit kernel
    _check(p, cfg, 3)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_nchw_merged_groups(direction, poisoned, odd_sms):
    p = _nchw(dict(N=1, G=4, C=4 * 8, K=4 * 16, input_spatial=(4, 5), filter=(3, 3), stride=(1, 2), pad_left=1,
                   pad_right=1), direction=direction)
    red = 8 if direction == "forward" else 16
    base = attrs.evolve(heuristic_config(attrs.evolve(p, split_k=0)), tap_mask=True)
    _check(p, attrs.evolve(base, tile=(16, 16, 2 * red), group_merge=4))
    q = _nchw(dict(N=2, G=4, C=4 * 8, K=4 * 8, input_spatial=(3, 5), filter=(1, 1)), direction=direction)
    _check(q, attrs.evolve(heuristic_config(attrs.evolve(q, split_k=0)), tile=(16, 16, 16), group_merge=2))


@pytest.mark.parametrize("shape", ["2d_strided_dilated", "1d", "3d"])
def test_nchw_im2col_forward(shape, poisoned, copies):
    """The im2col forward over the flattened (tap, channel) axis (few channels per group)."""
    from ck_conv.heuristics import flat_candidates

    p = _nchw(SHAPES[shape])
    cfg = next(c for c in flat_candidates(p) if c.why_not(p) is None)
    assert cfg.flat and cfg.direction == "forward"
    _check(p, cfg)
    assert copies == {"to": 0, "from": 0}


def _per_tap(p, **kw):
    """The per-tap bwd_weight kernel (not the tensor-descriptor, im2col or merged-group ones)."""
    return attrs.evolve(heuristic_config(attrs.evolve(p, split_k=0)), tma=False, flat=False, group_merge=1, **kw)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_nchw_bwd_weight_reads_and_writes_in_place(shape, poisoned, copies):
    p = _nchw(SHAPES[shape], direction="bwd_weight")
    _check(p, _per_tap(p))
    assert copies == {"to": 0, "from": 0}


@pytest.mark.parametrize("reduction", ["atomic", "fixup", "atomicfix", "twostage"])
def test_nchw_bwd_weight_splits_and_tap_bits(reduction, poisoned):
    p = _nchw(dict(N=3, G=2, C=6, K=10, input_spatial=(7, 9), filter=(3, 3), stride=(2, 1), pad_left=(1, 0),
                   pad_right=(0, 2), dilation=(1, 2)), direction="bwd_weight")
    _check(p, _per_tap(p, reduction=reduction, tap_mask=reduction == "atomic", tile=(16, 16, 16)), 3)


def test_the_public_api_copies_large_nchw_calls_to_channels_last(monkeypatch, ck_rng):
    """Above the tuned in-place bound an NCHW call runs on channels-last copies (the result still NCHW,
    forward and gradients right); at or below it the kernels read NCHW in place."""
    from ck_conv import api
    from ck_core import api as core

    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 31)))
    x = (torch.rand(2, 6, 5, 7, generator=g) * 2 - 1).requires_grad_()
    w = (torch.rand(4, 3, 3, 3, generator=g) * 2 - 1).requires_grad_()
    one = torch.rand(1, 1, 5, 7, generator=g)   # one channel: channels-last is the same memory
    macs = 2 * 5 * 7 * 4 * 3 * 9
    seen = []
    real = api._forward

    def spy(x, w, *a, **k):
        seen.append(api._is_channels_last(x))
        return real(x, w, *a, **k)

    monkeypatch.setattr(api, "_forward", spy)
    core.clear()
    for limit, cl in ((macs, False), (macs - 1, True)):
        core.clear()   # the warm closures of the last bound
        monkeypatch.setattr(api, "_IN_PLACE", [limit])
        seen.clear()
        y = api.conv2d(x, w, padding=1, groups=2)
        assert y.is_contiguous()
        y.backward(torch.ones_like(y))
        xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
        want = torch.nn.functional.conv2d(xd, wd, padding=1, groups=2)
        want.backward(torch.ones_like(want))
        rel = lambda a, b: float((a.detach().double() - b).norm() / b.norm())  # noqa: E731
        assert rel(y, want.detach()) < 1e-5 and rel(x.grad, xd.grad) < 1e-5 and rel(w.grad, wd.grad) < 1e-5
        x.grad = w.grad = None
        with torch.no_grad():
            api.conv2d(x, w, padding=1, groups=2)
        assert seen and seen[-1] is cl, (limit, seen)
        monkeypatch.setattr(api, "_IN_PLACE", [0])
        assert api.conv2d(one, torch.rand(2, 1, 3, 3, generator=g)).shape == (1, 2, 3, 5)   # no endless copying
    core.clear()
