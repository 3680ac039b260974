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
