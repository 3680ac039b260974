"""Triton kernels under TRITON_INTERPRET=1 on tiny odd shapes, against the NumPy reference."""
from __future__ import annotations

import attrs
import numpy as np
import pytest

from ck_conv.heuristics import candidate_configs, heuristic_config
from ck_conv.keys import ConvKernelConfig
from ck_conv.problem import LAYOUT_FAMILIES, ConvProblem
from ck_conv.reference import random_operands, reference, rel_error

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
from ck_conv.backends.triton.launch import run  # noqa: E402
from ck_conv.geometry import split_plan  # noqa: E402

TD = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
TOL = {"fp16": 2e-3, "bf16": 1.5e-2, "fp32": 1e-5}

SHAPES = {
    "2d_strided_dilated": dict(N=2, G=2, C=6, K=10, input_spatial=(5, 7), filter=(3, 3), stride=(2, 1),
                               pad_left=(1, 0), pad_right=(0, 2), dilation=(1, 2)),
    "1d": dict(N=1, G=1, C=5, K=3, input_spatial=(7,), filter=(2,), stride=(3,), pad_left=(2,), pad_right=(1,)),
    "3d": dict(N=2, G=1, C=4, K=6, input_spatial=(3, 4, 5), filter=(2, 3, 1), stride=(1, 2, 2),
               pad_left=(1, 1, 0), pad_right=(0, 1, 1)),
    "1x1_s1": dict(N=2, G=1, C=20, K=18, input_spatial=(3, 5), filter=(1, 1)),
    "1x1_s2": dict(N=2, G=1, C=20, K=18, input_spatial=(5, 5), filter=(1, 1), stride=(2, 2)),
    "depthwise": dict(N=2, G=5, C=5, K=5, input_spatial=(6, 5), filter=(3, 3), stride=(2, 1),
                      pad_left=(1, 1), pad_right=(1, 1)),
    "depthwise_3d": dict(N=1, G=3, C=3, K=3, input_spatial=(3, 4, 4), filter=(3, 1, 3), pad_left=(1, 0, 1),
                         pad_right=(1, 0, 0)),
}


def _check(p, config=None, split=None):
    """Run ``config`` (heuristic_config's pick when None), its split set to ``split`` or the problem's
    split_k (the split is part of the kernel), against the NumPy reference."""
    cfg = config or heuristic_config(attrs.evolve(p, split_k=0))
    want = split or p.split_k
    if want and cfg.reduction != "streamk":
        # a short reduction has fewer parts than asked (the launcher used to cut silently):
        # name the split that runs
        want = split_plan(attrs.evolve(cfg, split=want), p)[0]
    if want:
        p, cfg = attrs.evolve(p, split_k=want), attrs.evolve(cfg, split=want)
    ops = random_operands(p, seed=7)
    tt = {k: torch.from_numpy(v).to(TD[p.dtype]) for k, v in ops.items()}
    ref = reference(p, {k: v.float().numpy() for k, v in tt.items()})
    out = run(p, tt, cfg)
    assert tuple(out.shape) == ref.shape
    err = rel_error(out.float().numpy(), ref)
    assert err < TOL[p.dtype], (p, err)
    return err


@pytest.mark.parametrize("direction", ["forward", "bwd_data", "bwd_weight"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_heuristic_kernel_matches_reference(shape, direction):
    # split_k=0: heuristic_config does not split; the split kernels have tests of their own
    p = ConvProblem(**SHAPES[shape], direction=direction, dtype="fp16", split_k=0)
    _check(p)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("direction", ["forward", "bwd_data", "bwd_weight"])
def test_other_dtypes(dtype, direction):
    _check(ConvProblem(**SHAPES["2d_strided_dilated"], direction=direction, dtype=dtype))


@pytest.mark.parametrize("direction", ["forward", "bwd_data"])
def test_split_reduction(direction):
    p = ConvProblem(N=2, G=2, C=40, K=36, input_spatial=(5, 7), filter=(3, 3), stride=(2, 1), pad_left=(1, 0),
                    pad_right=(0, 2), direction=direction)
    cfg = attrs.evolve(heuristic_config(p), tile=(16, 16, 16))
    for split in (2, 5):
        _check(p, cfg, split)


def test_bwd_weight_split_k_and_non_table_path():
    p = ConvProblem(**SHAPES["3d"], direction="bwd_weight", split_k=1)
    _check(p)
    _check(attrs.evolve(p, split_k=4))


@pytest.mark.parametrize("direction", ["forward", "bwd_data", "bwd_weight"])
def test_channels_first_layout(direction):
    lay = LAYOUT_FAMILIES["ngchw"][2]
    p = ConvProblem(**SHAPES["2d_strided_dilated"], direction=direction, in_layout=lay[0], wei_layout=lay[1],
                    out_layout=lay[2])
    _check(p)


def test_candidates_all_compute_the_same():
    p = ConvProblem(N=1, G=1, C=24, K=20, input_spatial=(5, 6), filter=(3, 3), pad_left=1, pad_right=1)
    cands = candidate_configs(p)
    assert len(cands) > 3
    for c in cands[:4]:
        _check(p, c)


def test_wrong_kernel_is_refused():
    from ck_core.errors import UnsupportedProblem
    p = ConvProblem(**SHAPES["2d_strided_dilated"])
    k = ConvKernelConfig(direction="forward", dtype="fp16", ndim=2, specialization="filter1x1_stride1_pad0")
    with pytest.raises(UnsupportedProblem):
        run(p, {"x": torch.zeros(p.input_shape, dtype=torch.float16),
                "w": torch.zeros(p.weight_shape, dtype=torch.float16)}, k)


def test_check_can_fail():
    """A kernel fed a perturbed weight disagrees with the reference beyond tolerance."""
    p = ConvProblem(**SHAPES["1x1_s1"])
    ops = random_operands(p, seed=1)
    tt = {k: torch.from_numpy(v).half() for k, v in ops.items()}
    ref = reference(p, {k: v.float().numpy() for k, v in tt.items()})
    tt["w"][0, 0, 0, 0, 0] += 1.0
    assert rel_error(run(p, tt, heuristic_config(p)).float().numpy(), ref) > TOL["fp16"]


# ---- the realisation knobs: split reductions, tap bits, stages, merged groups ------------

SPLIT_SHAPE = dict(N=1, G=2, C=40, K=36, input_spatial=(5, 7), filter=(3, 3), stride=(2, 1), pad_left=(1, 0),
                   pad_right=(0, 2), dilation=(1, 2))


def _counters_zero():
    """Counters and the atomicfix accumulator are left zeroed for the next launch."""
    from ck_conv.backends.triton import launch
    # meta-device buffers come from `ck build`'s traced launches (jit_calls): they hold no values
    return all(float(c.abs().sum()) == 0 for c in (*launch._COUNTERS.values(), *launch._ACCUM.values())
               if c.device.type != "meta")


@pytest.mark.parametrize("reduction", ["relaxed", "twostage", "fixup", "atomicfix"])
@pytest.mark.parametrize("direction", ["forward", "bwd_data"])
def test_split_reduction_modes(direction, reduction):
    p = ConvProblem(**SPLIT_SHAPE, direction=direction)
    cfg = attrs.evolve(heuristic_config(p), tile=(16, 16, 16), reduction=reduction)
    _check(p, cfg, 3)
    assert _counters_zero()  # the last program of each tile resets its counter


@pytest.mark.parametrize("reduction", ["atomic", "relaxed", "twostage", "fixup", "atomicfix"])
def test_bwd_weight_reduction_modes_with_tap_bits(reduction):
    p = ConvProblem(**SPLIT_SHAPE, direction="bwd_weight", split_k=3)
    _check(p, attrs.evolve(heuristic_config(p), reduction=reduction, tap_mask=True))
    _check(p, attrs.evolve(heuristic_config(p), tile=(16, 16, 32), reduction=reduction, stages=4))
    assert _counters_zero()


@pytest.mark.parametrize("shape", ["2d_strided_dilated", "1d", "3d"])
@pytest.mark.parametrize("direction", ["forward", "bwd_weight"])
def test_tap_mask_matches_reference(shape, direction):
    p = ConvProblem(**SHAPES[shape], direction=direction, split_k=0)   # these pixels make one BLOCK_K chunk
    cfg = attrs.evolve(heuristic_config(p), tap_mask=True)
    assert cfg.why_not(p) is None
    _check(p, cfg)
    _check(p, attrs.evolve(cfg, reduction="fixup"), 2 if direction == "forward" else None)


def test_tap_bits_closed_form_covers_every_tap_position():
    """Forward tap bits on a problem where rows see every clipping pattern (padding
    larger than the filter reach on both sides, dilation 2, taps up to 27)."""
    p = ConvProblem(N=1, G=1, C=8, K=8, input_spatial=(3, 4, 3), filter=(3, 3, 3), pad_left=(2, 1, 3),
                    pad_right=(3, 2, 1), dilation=(1, 2, 1), stride=(1, 1, 2))
    _check(p, attrs.evolve(heuristic_config(p), tile=(16, 16, 16), tap_mask=True))


@pytest.mark.parametrize("gm", [2, 4])
def test_merged_groups_bwd_weight(gm):
    # G not a multiple of gm, several k / c tiles per group, odd channel counts
    p = ConvProblem(N=1, G=5, C=5 * 18, K=5 * 20, input_spatial=(5, 6), filter=(3, 2), stride=(2, 1),
                    pad_left=(1, 0), pad_right=(1, 1), direction="bwd_weight", split_k=2)
    cfg = attrs.evolve(heuristic_config(p), tile=(16, 16, 16), group_merge=gm, reduction="fixup", tap_mask=True)
    _check(p, cfg)
    if gm == 2:
        _check(attrs.evolve(p, split_k=1), attrs.evolve(cfg, tap_mask=False, reduction="atomic"))
    else:
        _check(p, attrs.evolve(cfg, reduction="atomicfix"))
    assert _counters_zero()


def test_merged_groups_other_dtypes_and_1x1():
    p = ConvProblem(N=2, G=4, C=64, K=32, input_spatial=(4, 5), filter=(1, 1), direction="bwd_weight", split_k=2,
                    dtype="bf16")
    _check(p, attrs.evolve(heuristic_config(p), tile=(16, 16, 16), group_merge=2, reduction="fixup"))
    p = ConvProblem(**SPLIT_SHAPE, direction="bwd_weight", split_k=2, dtype="fp32")
    _check(p, attrs.evolve(heuristic_config(p), tile=(16, 16, 16), group_merge=2, reduction="fixup"))


def test_extended_candidates_compute_the_same():
    from ck_conv.heuristics import extended_candidates
    for d in ("forward", "bwd_weight"):
        p = ConvProblem(N=1, G=2, C=32, K=32, input_spatial=(5, 6), filter=(3, 3), pad_left=1, pad_right=1,
                        direction=d, split_k=0)
        ext = extended_candidates(p)
        assert ext and all(c.why_not(p) is None for c in ext)
        for c in ext[::3]:
            _check(p, attrs.evolve(c, tile=tuple(min(t, 32) for t in c.tile)), 2 if d == "forward" else None)


# ---- session 3: bwd_data tap bits, stream-K, flat-row depthwise -----------------------

#: bwd_data shapes whose residue classes see every case: strides with several classes,
#: dilation, classes no tap reaches (stride 3 > filter 2 / 1), 1D and 3D
BWD_TM_SHAPES = {
    "2d_strided_dilated": SHAPES["2d_strided_dilated"],
    "3d": SHAPES["3d"],
    "1d_empty_classes": SHAPES["1d"],
    "2d_stride3_pad": dict(N=1, G=1, C=8, K=12, input_spatial=(7, 8), filter=(1, 2), stride=(3, 3),
                           pad_left=(1, 0), pad_right=(0, 1)),
}


@pytest.fixture
def odd_sms(monkeypatch):
    """A 5-SM "GPU", so stream-K chunks cut output tiles unevenly."""
    from ck_conv.backends.triton import launch
    monkeypatch.setattr(launch, "_num_sms", lambda device: 5)


def test_class_rows_match_the_residue_table():
    """The arithmetic runs of _class_rows enumerate exactly the classic table's (tap, offsets)."""
    import itertools

    from ck_conv.geometry import _class_rows, _residue_table
    for sd, pad, dil, flt in itertools.product([(1, 1, 1), (1, 2, 3), (2, 3, 1)], [(0, 1, 2), (2, 0, 1)],
                                               [(1, 1, 1), (2, 3, 1), (1, 2, 2)], [(1, 3, 3), (3, 2, 1)]):
        Ho, Wo = 9, 11
        for row, c in zip(_residue_table(sd, pad, dil, flt), _class_rows(sd, pad, dil, flt, Ho, Wo)):
            nz, ny, nx, oz, oy, ox, dz, dy, dx, t0, tz, ty, tx, l0, lz, ly, lx = c
            got = [(t0 + a * tz + b * ty + e * tx, oz - a * dz, oy - b * dy, ox - e * dx)
                   for a in range(nz) for b in range(ny) for e in range(nx)]
            assert got == row, (sd, pad, dil, flt)
            assert [l0 + a * lz + b * ly + e * lx for a in range(nz) for b in range(ny) for e in range(nx)] == \
                [(a * Ho + b) * Wo + e for _, a, b, e in row]


@pytest.mark.parametrize("shape", list(BWD_TM_SHAPES))
def test_bwd_data_tap_bits(shape, odd_sms):
    p = ConvProblem(**BWD_TM_SHAPES[shape], direction="bwd_data")
    cfg = attrs.evolve(heuristic_config(p), tile=(16, 16, 16), tap_mask=True)
    assert cfg.why_not(p) is None and cfg.num_stages == 3  # no table stages
    _check(p, cfg)
    _check(p, attrs.evolve(cfg, reduction="fixup"), 2)
    _check(p, attrs.evolve(cfg, reduction="streamk"), 3)
    assert _counters_zero()


def test_bwd_data_tap_bits_odd_channels_and_dtypes(odd_sms):
    p = ConvProblem(**SPLIT_SHAPE, direction="bwd_data")  # K = 18 per group: EVEN_K off at BLOCK_K 16
    cfg = attrs.evolve(heuristic_config(p), tile=(16, 16, 16), tap_mask=True, reduction="streamk")
    _check(p, cfg, 2)
    for dt in ("bf16", "fp32"):
        q = attrs.evolve(p, dtype=dt)
        _check(q, attrs.evolve(cfg, dtype=dt), 1)
    assert _counters_zero()


@pytest.mark.parametrize("direction", ["forward", "bwd_data"])
def test_streamk_1x1(direction, odd_sms):
    """Stream-K on the plain-GEMM path (SPEC 1) and, bwd_data, on 1x1 stride 2 (classes
    without taps: idle steps that still write their zeros)."""
    p = ConvProblem(N=2, G=2, C=2 * 40, K=2 * 36, input_spatial=(3, 5), filter=(1, 1), direction=direction)
    cfg = attrs.evolve(heuristic_config(p), tile=(16, 16, 16), reduction="streamk")
    assert cfg.why_not(p) is None
    _check(p, cfg, 3)
    q = attrs.evolve(p, input_spatial=(5, 5), stride=(2, 2))
    _check(q, attrs.evolve(heuristic_config(q), tile=(16, 16, 16), reduction="streamk"), 2)
    assert _counters_zero()


@pytest.mark.parametrize("shape", ["2d_strided_dilated", "3d"])
def test_forward_streamk(shape, odd_sms):
    p = ConvProblem(**SHAPES[shape], direction="forward")
    cfg = attrs.evolve(heuristic_config(p), tile=(16, 16, 16), reduction="streamk")
    for tm, per_sm in ((False, 1), (True, 3)):
        _check(p, attrs.evolve(cfg, tap_mask=tm), per_sm)
    _check(ConvProblem(**SPLIT_SHAPE), attrs.evolve(cfg, ndim=2, tap_mask=True), 5)  # odd C: EVEN_C off
    assert _counters_zero()


#: depthwise with G not a power of two (G = 144 in the benchmark), strides, dilation, 1D / 3D
DW_SHAPES = {
    "g18_s2": dict(N=2, G=18, C=18, K=18, input_spatial=(6, 5), filter=(3, 3), stride=(2, 1), pad_left=(1, 1),
                   pad_right=(1, 1)),
    "g36": dict(N=1, G=36, C=36, K=36, input_spatial=(4, 5), filter=(3, 3), pad_left=1, pad_right=1),
    "g5_sw2_dil": dict(N=2, G=5, C=5, K=5, input_spatial=(6, 5), filter=(3, 3), stride=(1, 2), pad_left=(1, 1),
                       pad_right=(1, 0), dilation=(2, 1)),
    "3d": SHAPES["depthwise_3d"],
    "1d_g24": dict(N=1, G=24, C=24, K=24, input_spatial=(9,), filter=(5,), stride=(2,), pad_left=(2,),
                   pad_right=(1,), dilation=(2,)),
}


@pytest.mark.parametrize("direction", ["forward", "bwd_data"])
@pytest.mark.parametrize("shape", list(DW_SHAPES))
def test_depthwise_flat_rows(shape, direction):
    p = ConvProblem(**DW_SHAPES[shape], direction=direction)
    base = heuristic_config(p)
    # spans over several pixels and rows past the end; on G = 5, spans of part of a row
    cfg = attrs.evolve(base, tile=(4, 16, 1) if shape == "g5_sw2_dil" else (2, 128, 1), flat=True)
    assert cfg.why_not(p) is None
    _check(p, cfg)


def test_depthwise_flat_other_dtypes():
    for dt in ("bf16", "fp32"):
        p = ConvProblem(**DW_SHAPES["g18_s2"], direction="bwd_data", dtype=dt)
        _check(p, attrs.evolve(heuristic_config(p), tile=(2, 32, 1), flat=True))


def test_new_extended_candidates_compute_the_same(odd_sms):
    from ck_conv.heuristics import extended_candidates
    # c5-like: few output tiles, 18 reduction steps: tap bits, fixup and stream-K candidates
    p = ConvProblem(N=1, G=1, C=128, K=128, input_spatial=(3, 4), filter=(3, 3), pad_left=1, pad_right=1,
                    direction="bwd_data")
    ext = extended_candidates(p)
    kinds = {(c.tap_mask, c.reduction) for c in ext}
    assert {(True, "atomic"), (True, "fixup"), (True, "streamk")} <= kinds
    for c in (ext[0], [c for c in ext if c.reduction == "streamk"][-1]):
        _check(p, attrs.evolve(c, tile=(16, 64, 64)), 2)
    q = ConvProblem(**DW_SHAPES["g36"])
    flat = [c for c in candidate_configs(q) if c.flat]
    assert len(flat) >= 4 and all(c.why_not(q) is None for c in flat)
    _check(q, attrs.evolve(flat[0], tile=(2, 128, 1)))


@pytest.mark.parametrize("direction", ["forward", "bwd_data"])
def test_block_diagonal_group_merge(direction, odd_sms):
    """gm groups as one block-diagonal GEMM: a reduction block of one and of two groups,
    strided 3x3 (several bwd_data classes), split / stream-K, and 1x1."""
    p = ConvProblem(N=1, G=4, C=4 * 8, K=4 * 16, input_spatial=(4, 5), filter=(3, 3), stride=(1, 2), pad_left=1,
                    pad_right=1, direction=direction)
    red = 8 if direction == "forward" else 16
    base = attrs.evolve(heuristic_config(p), tap_mask=True)
    _check(p, attrs.evolve(base, tile=(16, 16, 2 * red), group_merge=4))
    _check(p, attrs.evolve(base, tile=(16, 32, 2 * red), group_merge=2, reduction="streamk"), 3)
    q = ConvProblem(N=2, G=4, C=4 * 8, K=4 * 8, input_spatial=(3, 5), filter=(1, 1), direction=direction)
    _check(q, attrs.evolve(heuristic_config(q), tile=(16, 16, 16), group_merge=2))
    odd = attrs.evolve(p, C=4 * 24, K=4 * 24)
    assert "whole groups" in attrs.evolve(base, tile=(16, 16, 32), group_merge=2).why_not(odd)
    assert "multiple" in attrs.evolve(base, tile=(16, 16, 32), group_merge=8).why_not(p)
    assert _counters_zero()


# ---- row-reuse depthwise forward (_rows / _rows_wexp) ----------------------------------

#: stride-1 depthwise forward shapes: odd H / W, G not a power of two (5, 18), rows past
#: the end (H % RH != 0), spans over several pixels and parts of pixels, 5x5 pad 2,
#: asymmetric padding (Ho != Hi, Wo != Wi), an even filter, 1D and a 1-deep 3D filter
DW_ROWS_SHAPES = {
    "g18": dict(N=2, G=18, C=18, K=18, input_spatial=(7, 9), filter=(3, 3), pad_left=1, pad_right=1),
    "g5": dict(N=2, G=5, C=5, K=5, input_spatial=(7, 9), filter=(3, 3), pad_left=1, pad_right=1),
    "g18_5x5": dict(N=2, G=18, C=18, K=18, input_spatial=(7, 9), filter=(5, 5), pad_left=2, pad_right=2),
    "g5_asym": dict(N=1, G=5, C=5, K=5, input_spatial=(6, 7), filter=(3, 5), pad_left=(0, 2), pad_right=(1, 0)),
    "g8_2x2": dict(N=2, G=8, C=8, K=8, input_spatial=(5, 6), filter=(2, 2), pad_left=(1, 0), pad_right=(0, 1)),
    "1d_g24": dict(N=2, G=24, C=24, K=24, input_spatial=(11,), filter=(3,), pad_left=(1,), pad_right=(1,)),
    "3d_1deep": dict(N=1, G=6, C=6, K=6, input_spatial=(3, 5, 4), filter=(1, 3, 3), pad_left=(0, 1, 1),
                     pad_right=(0, 1, 1)),
}


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("shape", list(DW_ROWS_SHAPES))
def test_depthwise_rows(shape, rows):
    p = ConvProblem(**DW_ROWS_SHAPES[shape])
    base = heuristic_config(p)
    for tile in ((4, 64, 1), (2, 16, 1), (8, 256, 1)):
        cfg = attrs.evolve(base, tile=tile, rows=rows)
        assert cfg.why_not(p) is None, cfg.why_not(p)
        assert ConvKernelConfig.from_name(cfg.name) == cfg
        _check(p, cfg)


def test_depthwise_rows_other_dtypes_and_layouts():
    for dt in ("bf16", "fp32"):
        p = ConvProblem(**DW_ROWS_SHAPES["g18"], dtype=dt)
        _check(p, attrs.evolve(heuristic_config(p), tile=(4, 32, 1), rows=2))
    p = ConvProblem(**DW_ROWS_SHAPES["g5"], in_layout="NGCHW")
    _check(p, attrs.evolve(heuristic_config(p), tile=(2, 64, 1), rows=2))


def test_depthwise_rows_weight_table_follows_the_weights():
    """The cached expanded table is rebuilt when the weights change in place."""
    p = ConvProblem(**DW_ROWS_SHAPES["g18"])
    cfg = attrs.evolve(heuristic_config(p), tile=(4, 64, 1), rows=2)
    ops = random_operands(p, seed=3)
    tt = {k: torch.from_numpy(v).to(torch.float16) for k, v in ops.items()}
    run(p, tt, cfg)
    tt["w"].mul_(-0.5)
    ref = reference(p, {k: v.float().numpy() for k, v in tt.items()})
    assert rel_error(run(p, tt, cfg).float().numpy(), ref) < TOL["fp16"]


def test_depthwise_rows_applicability():
    ok = ConvProblem(**DW_ROWS_SHAPES["g18"])
    cfg = attrs.evolve(heuristic_config(ok), tile=(4, 1024, 1), rows=1)
    assert cfg.why_not(ok) is None and cfg.name.endswith("_depthwise_rows")
    assert attrs.evolve(cfg, rows=2).name.endswith("_depthwise_rows_wexp")
    assert "stride 1" in cfg.why_not(attrs.evolve(ok, stride=(2, 1)))
    assert "dilation 1" in cfg.why_not(attrs.evolve(ok, dilation=(1, 2)))
    assert "forward only" in attrs.evolve(cfg, direction="bwd_data").why_not(ok.with_direction("bwd_data"))
    assert "powers of two" in attrs.evolve(cfg, tile=(4, 1000, 1)).why_not(ok) or \
        "power of two" in attrs.evolve(cfg, tile=(4, 1000, 1)).why_not(ok)
    assert "rows in" in attrs.evolve(cfg, tile=(3, 1024, 1)).why_not(ok)
    assert "1-deep" in attrs.evolve(cfg, ndim=3).why_not(ConvProblem(**DW_SHAPES["3d"]))
    assert "depthwise" in attrs.evolve(cfg, specialization="default").why_not(
        ConvProblem(N=1, G=1, C=8, K=8, input_spatial=(5, 5), filter=(3, 3), pad_left=1, pad_right=1))
    # the bench's depthwise layer gets row-reuse candidates, bwd_data and strided layers none
    from ck_conv.bench import CASES, problem
    (case,) = [c for c in CASES if c[0] == "depthwise_3x3_144_56"]
    assert sum(c.rows > 0 for c in candidate_configs(problem(case, "forward"))) >= 4
    assert not any(c.rows for c in candidate_configs(problem(case, "bwd_data")))
