"""The im2col-over-(tap, channel) kernels (``_flat`` forward / bwd_weight: RGB stems) and the
depthwise bwd_weight kernel's one-launch ``_atomicfix`` reduction, under TRITON_INTERPRET=1 on
small odd shapes, against a float64 reference written here (zero-padded strided slices and
einsum; no code shared with the kernels or ck_conv.reference)."""
from __future__ import annotations

import itertools

import attrs
import numpy as np
import pytest

from ck_conv.keys import ConvKernelConfig
from ck_conv.problem import ConvProblem

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
from ck_conv.backends.triton.launch import run  # noqa: E402
from ck_conv.geometry import split_plan  # noqa: E402

TD = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
TOL = {"fp16": 3e-3, "bf16": 2e-2, "fp32": 1e-5}


def _taps_slices(p: ConvProblem, x):
    """For each filter tap (row-major), the [N, *out, G, C] input values it multiplies (zero
    outside the image); x is [N, *in, G, C] float64."""
    nd = p.ndim
    pads = [(0, 0)] + [(pl, pr + s * o) for pl, pr, s, o in zip(p.pad_left, p.pad_right, p.stride,
                                                                  p.output_spatial)] + [(0, 0), (0, 0)]
    xp = np.pad(x, pads)
    for tap in itertools.product(*[range(f) for f in p.filter]):
        sl = tuple(slice(t * d, t * d + s * o, s) for t, d, s, o in zip(tap, p.dilation, p.stride,
                                                                       p.output_spatial))
        yield tap, xp[(slice(None),) + sl]
    assert nd == len(p.filter)


def reference64(p: ConvProblem, ops: dict) -> np.ndarray:
    f64 = {k: v.double().numpy() for k, v in ops.items()}
    if p.direction == "forward":
        x, w = f64["x"], f64["w"]           # [N, *in, G, C], [G, K, *flt, C]
        y = np.zeros((p.N,) + tuple(p.output_spatial) + (p.G, p.k_per_group))
        for tap, xs in _taps_slices(p, x):
            y += np.einsum("...gc,gkc->...gk", xs, w[(slice(None), slice(None)) + tap])
        return y
    x, dy = f64["x"], f64["dy"]             # [N, *in, G, C], [N, *out, G, K]
    dw = np.zeros((p.G, p.k_per_group) + tuple(p.filter) + (p.c_per_group,))
    for tap, xs in _taps_slices(p, x):
        dw[(slice(None), slice(None)) + tap] = np.einsum("pgk,pgc->gkc", dy.reshape(-1, p.G, p.k_per_group),
                                                         xs.reshape(-1, p.G, p.c_per_group))
    return dw


def _operands(p: ConvProblem, seed: int):
    g = torch.Generator().manual_seed(seed)
    shapes = {"x": p.input_shape, "w": p.weight_shape, "dy": p.output_shape}
    names = ("x", "w") if p.direction == "forward" else ("x", "dy")
    return {n: (torch.rand(shapes[n], generator=g, dtype=torch.float64) * 2 - 1).to(TD[p.dtype]) for n in names}


def _rel(out, ref) -> float:
    out = out.double().numpy()
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def _check(p: ConvProblem, cfg: ConvKernelConfig, seed: int = 3) -> float:
    assert cfg.why_not(p) is None, cfg.why_not(p)
    ops = _operands(p, seed)
    ref = reference64(p, ops)
    out = run(p, ops, cfg)
    assert tuple(out.shape) == ref.shape
    err = _rel(out, ref)
    assert err < TOL[p.dtype], (cfg.name, err)
    return err


def _split(p: ConvProblem, cfg: ConvKernelConfig, split: int):
    split = split_plan(attrs.evolve(cfg, split=split), attrs.evolve(p, split_k=0))[0]
    return attrs.evolve(p, split_k=split), attrs.evolve(cfg, split=split)


def _flat(p: ConvProblem, tile, warps=4, **kw) -> ConvKernelConfig:
    return ConvKernelConfig(direction=p.direction, dtype=p.dtype, ndim=p.ndim, tile=tile, waves=(warps, 1, 1),
                            warp_tile=(16, 16, 16), flat=True, **kw)


STEMS = {
    # RGB stem 7x7 stride 2 (odd image, asymmetric padding), an audio stem (C = 1, filter 10,
    # stride 5), a 3D stem 3x5x5 and a 3x3 with dilation and C = 4 in two groups
    "rgb7x7": dict(N=2, G=1, C=3, K=20, input_spatial=(13, 11), filter=(7, 7), stride=(2, 2), pad_left=(3, 3),
                   pad_right=(2, 3)),
    "audio": dict(N=3, G=1, C=1, K=24, input_spatial=(67,), filter=(10,), stride=(5,)),
    "3d": dict(N=1, G=1, C=3, K=17, input_spatial=(4, 9, 7), filter=(3, 5, 5), stride=(1, 2, 2),
               pad_left=(1, 2, 2), pad_right=(1, 2, 1)),
    "grouped_dil": dict(N=2, G=2, C=8, K=10, input_spatial=(7, 9), filter=(3, 3), dilation=(2, 1), pad_left=(2, 1),
                        pad_right=(1, 1)),
}


@pytest.mark.parametrize("shape", list(STEMS))
def test_flat_forward(shape):
    p = ConvProblem(**STEMS[shape], direction="forward", dtype="fp16")
    _check(p, _flat(p, (32, 16, 32)))
    _check(p, _flat(p, (16, 32, 16), warps=2))


@pytest.mark.parametrize("shape", list(STEMS))
def test_flat_bwd_weight_unsplit(shape):
    p = ConvProblem(**STEMS[shape], direction="bwd_weight", dtype="fp16", split_k=1)
    _check(p, _flat(p, (16, 32, 32)))


@pytest.mark.parametrize("reduction", ["atomic", "relaxed", "twostage", "fixup", "atomicfix"])
def test_flat_bwd_weight_split_reductions(reduction):
    from ck_conv.backends.triton import launch

    p0 = ConvProblem(**STEMS["rgb7x7"], direction="bwd_weight", dtype="fp16")
    p, cfg = _split(p0, _flat(p0, (16, 64, 16), reduction=reduction), 3)
    assert cfg.split == 3
    _check(p, cfg)
    # fixup / atomicfix leave their counters and accumulator zeroed for the next launch
    assert all(float(c.abs().sum()) == 0 for c in (*launch._COUNTERS.values(), *launch._ACCUM.values())
               if c.device.type != "meta")


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_flat_other_dtypes(dtype):
    for d in ("forward", "bwd_weight"):
        p = ConvProblem(**STEMS["grouped_dil"], direction=d, dtype=dtype, split_k=1)
        _check(p, _flat(p, (16, 16, 16)))


def test_flat_check_can_fail():
    """A perturbed input disagrees with the reference beyond tolerance."""
    p = ConvProblem(**STEMS["rgb7x7"], direction="bwd_weight", dtype="fp16", split_k=1)
    ops = _operands(p, 5)
    ref = reference64(p, ops)
    ops["x"][0, 4, 4, 0, 1] += 4.0
    assert _rel(run(p, ops, _flat(p, (16, 32, 32))), ref) > TOL["fp16"]


def test_flat_applicability():
    p = ConvProblem(**STEMS["rgb7x7"], direction="bwd_data", dtype="fp16")
    assert "forward and bwd_weight" in _flat(p, (16, 16, 16)).why_not(p)
    p = ConvProblem(**STEMS["rgb7x7"], direction="forward", dtype="fp16")
    assert _flat(p, (16, 16, 8)).why_not(p)                   # no tensor-core dot below 16
    assert "do not split" in attrs.evolve(_flat(p, (16, 16, 16)), split=2).why_not(p)
    assert attrs.evolve(_flat(p, (16, 16, 16)), tap_mask=True).why_not(p)
    name = _flat(p, (32, 64, 32)).name
    assert name.endswith("_flat") and ConvKernelConfig.from_name(name) == _flat(p, (32, 64, 32))


DW = {
    "2d_s2": dict(N=2, G=37, C=37, K=37, input_spatial=(9, 7), filter=(3, 3), stride=(2, 2), pad_left=(1, 1),
                  pad_right=(1, 0)),
    "5x5": dict(N=1, G=21, C=21, K=21, input_spatial=(8, 9), filter=(5, 5), pad_left=(2, 2), pad_right=(2, 2)),
    "3d": dict(N=2, G=5, C=5, K=5, input_spatial=(3, 5, 4), filter=(3, 1, 3), pad_left=(1, 0, 1),
               pad_right=(0, 0, 1)),
}


@pytest.mark.parametrize("shape", list(DW))
@pytest.mark.parametrize("reduction", ["atomic", "atomicfix"])
def test_depthwise_bwd_weight_reductions(shape, reduction):
    from ck_conv.backends.triton import launch

    p0 = ConvProblem(**DW[shape], direction="bwd_weight", dtype="fp16")
    base = ConvKernelConfig(direction="bwd_weight", dtype="fp16", ndim=p0.ndim, pipeline="mem", tile=(16, 16, 1),
                            waves=(4, 1, 1), warp_tile=(1, 1, 1), specialization="depthwise", reduction=reduction)
    for split in (1, 3):
        p, cfg = _split(p0, base, split)
        _check(p, cfg)
    assert all(float(c.abs().sum()) == 0 for c in (*launch._COUNTERS.values(), *launch._ACCUM.values())
               if c.device.type != "meta")


def _tma(p: ConvProblem, tile, warps=4, spec="default", **kw) -> ConvKernelConfig:
    return ConvKernelConfig(direction="bwd_weight", dtype=p.dtype, ndim=p.ndim, tile=tile, waves=(warps, 1, 1),
                            warp_tile=(16, 16, 16), specialization=spec, tma=True, **kw)


TMA = {
    # stride 1 only; channel rows 16-byte multiples; odd image sizes and padding beyond the filter reach
    "3x3": dict(N=2, G=1, C=24, K=40, input_spatial=(7, 19), filter=(3, 3), pad_left=(1, 2), pad_right=(1, 0)),
    "3d_3x1x1": dict(N=1, G=1, C=16, K=24, input_spatial=(5, 3, 21), filter=(3, 1, 1), pad_left=(1, 0, 0),
                     pad_right=(1, 0, 0)),
    "1d_dil": dict(N=3, G=1, C=8, K=16, input_spatial=(37,), filter=(5,), dilation=(2,), pad_left=(3,),
                   pad_right=(2,)),
    "grouped": dict(N=2, G=3, C=96, K=48, input_spatial=(5, 18), filter=(3, 3), pad_left=(1, 1), pad_right=(1, 1)),
}


@pytest.mark.parametrize("shape", list(TMA))
def test_tma_bwd_weight(shape):
    p0 = ConvProblem(**TMA[shape], direction="bwd_weight", dtype="fp16")
    base = _tma(p0, (16, 16, 16))
    _check(attrs.evolve(p0, split_k=1), base)
    p, cfg = _split(p0, attrs.evolve(base, reduction="atomicfix"), 3)
    assert cfg.split == 3
    _check(p, cfg)


@pytest.mark.parametrize("reduction", ["atomic", "twostage", "fixup"])
def test_tma_bwd_weight_1x1_linear_and_reductions(reduction):
    p0 = ConvProblem(N=3, G=1, C=40, K=24, input_spatial=(5, 7), filter=(1, 1), direction="bwd_weight",
                     dtype="bf16")
    assert p0.specialization == "filter1x1_stride1_pad0"
    p, cfg = _split(p0, _tma(p0, (16, 32, 16), spec="filter1x1_stride1_pad0", reduction=reduction), 4)
    _check(p, cfg)
    _check(p, attrs.evolve(cfg, specialization="default"))   # the 5-D boxes on a 1x1 problem too


def test_tma_applicability():
    p = ConvProblem(**TMA["3x3"], direction="bwd_weight", dtype="fp16")
    assert _tma(p, (16, 16, 16)).why_not(p) is None
    assert "stride 1" in _tma(p, (16, 16, 16)).why_not(attrs.evolve(p, stride=(2, 1)))
    odd = ConvProblem(**dict(TMA["3x3"], C=5), direction="bwd_weight", dtype="fp16")
    assert "16-byte" in _tma(odd, (16, 16, 16)).why_not(odd)
    g = ConvProblem(**TMA["grouped"], direction="bwd_weight", dtype="fp16")
    assert "cross groups" in _tma(g, (64, 64, 16)).why_not(g)
    assert "forward" not in (_tma(p, (16, 16, 16)).why_not(p) or "")
    name = attrs.evolve(_tma(p, (64, 128, 64), reduction="atomicfix"), split=8).name
    assert name.endswith("_atomicfix_tma_sp8")
    assert ConvKernelConfig.from_name(name).tma


@pytest.mark.parametrize("shape, direction, family", [
    (dict(N=8, G=1, C=3, K=64, input_spatial=(224, 224), filter=(7, 7), stride=(2, 2), pad_left=(3, 3),
          pad_right=(3, 3)), "bwd_weight", "flat"),
    (dict(N=8, G=1, C=3, K=64, input_spatial=(224, 224), filter=(7, 7), stride=(2, 2), pad_left=(3, 3),
          pad_right=(3, 3)), "forward", "flat"),
    (dict(N=32, G=672, C=672, K=672, input_spatial=(14, 14), filter=(5, 5), stride=(2, 2), pad_left=(2, 2),
          pad_right=(2, 2)), "bwd_weight", "dw"),   # first_tier: the classic depthwise tiles (atomicfix lost on 5x5)
    (dict(N=32, G=1, C=128, K=128, input_spatial=(128, 128), filter=(3, 3), pad_left=(1, 1), pad_right=(1, 1)),
     "bwd_weight", "tma"),
    (dict(N=32, G=1, C=24, K=144, input_spatial=(56, 56), filter=(1, 1)), "bwd_weight", "tma"),
])
def test_new_families_reach_the_shortlist(shape, direction, family):
    """The Dispatcher's shortlist (the ranker's candidates) holds the family the tuned first_tier
    names for the problem's class, each a key of the sm90 triton key space (so a registry from the
    enumeration holds it), and no other family."""
    from ck_core.plugins import get_manager
    from ck_conv.heuristics import family_of
    from ck_conv.keys import config_of
    from ck_conv.heuristics import shortlist
    from ck_conv.keyspace import key_space

    arch = get_manager().arch("sm90")
    p = ConvProblem(**shape, direction=direction, dtype="fp16", split_k=0 if direction == "bwd_weight" else 1)
    tier = next(iter(shortlist(p, arch, "triton")))
    fams = [family_of(config_of(k)) for k in tier]
    assert set(fams) == {family}, fams
    space = key_space(arch, "triton", {"directions": [direction], "dtypes": ["fp16"], "ndims": [p.ndim]})
    new = [k for k, f in zip(tier, fams) if f == family]
    assert all(k in space and config_of(k).why_not(p) is None for k in new)
    if family != "flat" or direction == "bwd_weight":   # split keys among them
        assert any(config_of(k).split > 1 for k in new)
