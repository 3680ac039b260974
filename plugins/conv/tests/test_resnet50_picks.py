"""ResNet-50's forward picks on sm90 (the H200's registries): torchvision's resnet50 at batch 64,
224x224, bf16, channels-last, inference (benchmarks/models.py --rows resnet50:infer).

Pinned: the keys session 9 measured at 5.53 ms against cuDNN's 6.67 (1.21x, benchmarks/results/
models.json at 78df56a), each one unsplit kernel launch (split_pays keeps the one-launch keys
here: every layer has tiles enough to fill the SMs) whose Triton constexprs read channels-last
(NCHW=0, the code before the NCHW in-place kernels).  A change of these picks changes the model's
time: re-measure it (benchmarks/resnet50_layers.py, models.py --rows resnet50:infer) and update the
table with the measurement."""
from __future__ import annotations

import pytest

from ck_conv.geometry import launches
from ck_conv.keys import config_of
from ck_conv.problem import LAYOUT_FAMILIES, ConvProblem

#: (layer, C, K, input H = W, filter, stride) -> the key's name between the layout/arch parts; every
#: distinct conv of resnet50 (53 convs, 23 shapes; the first layer of a shape names it)
PICKS = [
    ("conv1", 3, 64, 224, 7, 2, "128x64x32_4x1x1_16x16x16_default_flat"),
    ("layer1.0.conv1", 64, 64, 56, 1, 1, "128x64x64_2x4x1_16x16x16_filter1x1_stride1_pad0"),
    ("layer1.0.conv2", 64, 64, 56, 3, 1, "128x64x64_2x4x1_16x16x16_filter3x3"),
    ("layer1.0.conv3", 64, 256, 56, 1, 1, "128x128x64_2x4x1_16x16x16_filter1x1_stride1_pad0"),
    ("layer1.1.conv1", 256, 64, 56, 1, 1, "128x64x64_2x4x1_16x16x16_filter1x1_stride1_pad0"),
    ("layer2.0.conv1", 256, 128, 56, 1, 1, "128x128x64_2x4x1_16x16x16_filter1x1_stride1_pad0"),
    ("layer2.0.conv2", 128, 128, 56, 3, 2, "128x128x64_2x4x1_16x16x16_filter3x3"),
    ("layer2.0.conv3", 128, 512, 28, 1, 1, "128x128x64_2x4x1_16x16x16_filter1x1_stride1_pad0"),
    ("layer2.0.downsample", 256, 512, 56, 1, 2, "128x128x64_2x4x1_16x16x16_filter1x1_pad0"),
    ("layer2.1.conv1", 512, 128, 28, 1, 1, "128x128x64_2x4x1_16x16x16_filter1x1_stride1_pad0"),
    ("layer2.1.conv2", 128, 128, 28, 3, 1, "128x128x64_2x4x1_16x16x16_filter3x3"),
    ("layer3.0.conv1", 512, 256, 28, 1, 1, "128x128x64_2x4x1_16x16x16_filter1x1_stride1_pad0"),
    ("layer3.0.conv2", 256, 256, 28, 3, 2, "64x128x64_2x4x1_16x16x16_filter3x3"),
    ("layer3.0.conv3", 256, 1024, 14, 1, 1, "64x128x64_2x4x1_16x16x16_filter1x1_stride1_pad0"),
    ("layer3.0.downsample", 512, 1024, 28, 1, 2, "64x128x64_2x4x1_16x16x16_filter1x1_pad0"),
    ("layer3.1.conv1", 1024, 256, 14, 1, 1, "64x128x64_2x4x1_16x16x16_filter1x1_stride1_pad0"),
    ("layer3.1.conv2", 256, 256, 14, 3, 1, "64x128x64_2x4x1_16x16x16_filter3x3"),
    ("layer4.0.conv1", 1024, 512, 14, 1, 1, "64x128x64_2x4x1_16x16x16_filter1x1_stride1_pad0"),
    ("layer4.0.conv2", 512, 512, 14, 3, 2, "64x128x64_2x4x1_16x16x16_filter3x3"),
    ("layer4.0.conv3", 512, 2048, 7, 1, 1, "64x128x64_2x4x1_16x16x16_filter1x1_stride1_pad0"),
    ("layer4.0.downsample", 1024, 2048, 14, 1, 2, "64x128x64_2x4x1_16x16x16_filter1x1_pad0"),
    ("layer4.1.conv1", 2048, 512, 7, 1, 1, "64x128x64_2x4x1_16x16x16_filter1x1_stride1_pad0"),
    ("layer4.1.conv2", 512, 512, 7, 3, 1, "64x128x64_2x4x1_16x16x16_filter3x3"),
]


def resnet50_problem(C, K, H, F, S, N=64, dtype="bf16") -> ConvProblem:
    in_l, wei_l, out_l = LAYOUT_FAMILIES["nhwgc"][2]
    pad = F // 2
    return ConvProblem(N=N, G=1, C=C, K=K, input_spatial=(H, H), filter=(F, F), stride=(S, S), dilation=(1, 1),
                       pad_left=(pad, pad), pad_right=(pad, pad), direction="forward", dtype=dtype,
                       in_layout=in_l, wei_layout=wei_l, out_layout=out_l, split_k=0)


@pytest.fixture(scope="module")
def disp():
    from ck_core import api as core

    return core.dispatcher_for("conv", "sm90", "triton", directions=("forward",), dtypes=("bf16",), ndims=(2,),
                               layouts=("nhwgc",))


@pytest.mark.parametrize("layer,C,K,H,F,S,body", PICKS, ids=[p[0] for p in PICKS])
def test_resnet50_forward_picks(disp, layer, C, K, H, F, S, body):
    key = disp.select(resnet50_problem(C, K, H, F, S))
    assert key.name == f"conv_fwd_bf16_nhwgc_gkyxc_nhwgk_2d_compv3_intrawave_{body}.sm90.triton", (layer, key.name)
    cfg = config_of(key)
    assert cfg.split == 1 and launches(cfg) == 1, (layer, key.name)
    assert cfg.triton_meta().get("NCHW") == 0, (layer, cfg.triton_meta())   # channels-last code
