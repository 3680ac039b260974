"""The tensor-descriptor forward (``_tma`` on a forward key, stride 1): x boxes of output rows x
TMA_FWD_W columns at each tap-shifted corner (zeros outside the image), weight boxes of
[BLOCK_N, BLOCK_K]; under the interpreter against the float64 reference.  Keys of the space, on no
candidate list yet: ``benchmarks/conv_tail_check.py`` times it on ResNet's 3x3 layers first."""
from __future__ import annotations

import attrs
import pytest

from ck_conv.keys import TMA_FWD_W, ConvKernelConfig
from ck_conv.problem import LAYOUT_FAMILIES, ConvProblem


def _problem(fam="nhwgc", dtype="fp16", **kw):
    i, w, o = LAYOUT_FAMILIES[fam][2]
    return ConvProblem(**kw, direction="forward", dtype=dtype, in_layout=i, wei_layout=w, out_layout=o, split_k=1)


def _cfg(p, tile, spec="default", **kw):
    return ConvKernelConfig(direction="forward", dtype=p.dtype, ndim=2, layout=p.layout_family, tile=tile,
                            waves=(4, 1, 1), warp_tile=(16, 16, 16), specialization=spec, tma=True, **kw)


def test_names_and_reasons():
    p = _problem(N=2, G=1, C=32, K=24, input_spatial=(9, 13), filter=(3, 3), pad_left=(1, 1), pad_right=(1, 1))
    c = _cfg(p, (32, 16, 16))
    assert c.why_not(p) is None and c.triton_meta()["BW"] == TMA_FWD_W
    assert ConvKernelConfig.from_name(c.name) == c and c.name.endswith("_default_tma")
    assert "stride 1" in c.why_not(attrs.evolve(p, stride=(1, 2)))
    assert "BLOCK_K" in _cfg(p, (32, 16, 64)).why_not(p)   # 32 channels: no whole 64-channel box
    assert "fp16 / bf16" in attrs.evolve(c, dtype="fp32").why_not(attrs.evolve(p, dtype="fp32"))
    assert "split" in attrs.evolve(c, split=2).why_not(attrs.evolve(p, split_k=2))
    assert "tap-mask" in attrs.evolve(c, tap_mask=True).why_not(p)


torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from ck_conv.backends.triton.launch import run  # noqa: E402
from ck_conv.reference import random_operands, reference, rel_error  # noqa: E402

TD = {"fp16": torch.float16, "bf16": torch.bfloat16}
TOL = {"fp16": 2e-3, "bf16": 1.5e-2}


@pytest.mark.parametrize("fam,dtype,shape,tile,spec", [
    # odd output sizes (not whole row / column blocks), K not a whole N tile, 2 channel blocks
    ("nhwgc", "fp16", dict(N=2, G=1, C=32, K=24, input_spatial=(9, 13), filter=(3, 3), pad_left=(1, 1),
                           pad_right=(1, 1)), (32, 16, 16), "default"),
    # groups (a weight box past a group's K reads the next group's rows: masked out), dilation,
    # padding wider than the filter reach on one side
    ("nhwgc", "bf16", dict(N=2, G=2, C=32, K=40, input_spatial=(7, 10), filter=(3, 3), pad_left=(2, 1),
                           pad_right=(2, 1), dilation=(2, 1)), (64, 32, 16), "default"),
    # NCHW tensors (copied to channels-last for the boxes), 1x1
    ("ngchw", "fp16", dict(N=2, G=1, C=16, K=16, input_spatial=(5, 6), filter=(1, 1)), (16, 16, 16),
     "filter1x1_stride1_pad0"),
])
def test_tma_forward_matches_the_reference(fam, dtype, shape, tile, spec, ck_rng, monkeypatch):
    import math

    real = torch.empty   # the result buffer starts as NaN: an output no program stores fails
    monkeypatch.setattr(torch, "empty", lambda *a, **k: real(*a, **k).fill_(math.nan))
    p = _problem(fam, dtype, **shape)
    cfg = _cfg(p, tile, spec)
    assert cfg.why_not(p) is None
    ops = random_operands(p, seed=int(ck_rng.integers(1 << 30)))
    tt = {k: torch.from_numpy(v).to(TD[dtype]) for k, v in ops.items()}
    ref = reference(p, {k: v.double().numpy() for k, v in tt.items()})
    out = run(p, tt, cfg)
    assert tuple(out.shape) == ref.shape
    assert rel_error(out.double().numpy(), ref) < TOL[dtype]


def test_launch_shape_of_the_tensor_descriptor_forward():
    from ck_conv.geometry import reduction_shape, split_plan
    # ResNet layer1 3x3 at batch 2: 56 rows in 4 blocks of 16, 56 columns in 7 of 8; 9 taps x 1 block
    p = _problem(N=2, G=1, C=64, K=64, input_spatial=(56, 56), filter=(3, 3), pad_left=(1, 1), pad_right=(1, 1))
    c = _cfg(p, (128, 64, 64), "filter3x3")
    assert reduction_shape(c, p) == (2 * 4 * 7, 9)
    assert split_plan(c, p) == (1, 9)


def test_in_the_key_space_on_no_candidate_list():
    """The tma forward keys are keys of the space (``ck tune`` and the tuning store reach them, ``ck build``
    compiles them), but no shortlist offers them until a GPU run has measured them."""
    from ck_conv.heuristics import shortlist
    from ck_conv.keys import config_of, key_of
    from ck_conv.keyspace import key_space
    from ck_core.plugins import get_manager

    arch = get_manager().arch("sm90")
    p = _problem(dtype="bf16", N=32, G=1, C=64, K=64, input_spatial=(56, 56), filter=(3, 3), pad_left=(1, 1),
                 pad_right=(1, 1))
    space = key_space(arch, "triton", {"directions": ["forward"], "dtypes": ["bf16"], "ndims": [2]})
    c = attrs.evolve(_cfg(p, (128, 64, 64), "filter3x3"), stages=0)
    assert key_of(c, "sm90", "triton") in space and c.why_not(p) is None
    assert key_of(attrs.evolve(c, split=2), "sm90", "triton") not in space   # no split form
    assert not [k.name for tier in shortlist(p, arch, "triton") for k in tier if config_of(k).tma]
