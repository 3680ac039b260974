"""Triton kernels under TRITON_INTERPRET=1 on tiny odd shapes, against the NumPy reference."""
from __future__ import annotations

import attrs
import numpy as np
import pytest

from ck_conv.kernels import ConvKernelConfig, candidate_configs, heuristic_config
from ck_conv.problem import LAYOUT_FAMILIES, ConvProblem
from ck_conv.reference import random_operands, reference, rel_error

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
from ck_conv.launch import run  # noqa: E402

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
    ops = random_operands(p, seed=7)
    tt = {k: torch.from_numpy(v).to(TD[p.dtype]) for k, v in ops.items()}
    ref = reference(p, {k: v.float().numpy() for k, v in tt.items()})
    out = run(p, tt, config, split=split)
    assert tuple(out.shape) == ref.shape
    err = rel_error(out.float().numpy(), ref)
    assert err < TOL[p.dtype], (p, err)
    return err


@pytest.mark.parametrize("direction", ["forward", "bwd_data", "bwd_weight"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_heuristic_kernel_matches_reference(shape, direction):
    p = ConvProblem(**SHAPES[shape], direction=direction, dtype="fp16",
                    split_k=3 if direction == "bwd_weight" else 1)
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
    assert rel_error(run(p, tt).float().numpy(), ref) > TOL["fp16"]


# ---- the realisation knobs: split reductions, tap bits, stages, merged groups ------------

SPLIT_SHAPE = dict(N=1, G=2, C=40, K=36, input_spatial=(5, 7), filter=(3, 3), stride=(2, 1), pad_left=(1, 0),
                   pad_right=(0, 2), dilation=(1, 2))


def _counters_zero():
    """Counters and the atomicfix accumulator are left zeroed for the next launch."""
    from ck_conv import launch
    return all(float(c.abs().sum()) == 0 for c in (*launch._COUNTERS.values(), *launch._ACCUM.values()))


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
    p = ConvProblem(**SHAPES[shape], direction=direction, split_k=2 if direction == "bwd_weight" else 1)
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
    from ck_conv.kernels import extended_candidates
    for d in ("forward", "bwd_weight"):
        p = ConvProblem(N=1, G=2, C=32, K=32, input_spatial=(5, 6), filter=(3, 3), pad_left=1, pad_right=1,
                        direction=d, split_k=2 if d == "bwd_weight" else 1)
        ext = extended_candidates(p)
        assert ext and all(c.why_not(p) is None for c in ext)
        for c in ext[::3]:
            _check(p, attrs.evolve(c, tile=tuple(min(t, 32) for t in c.tile)), 2 if d == "forward" else None)
