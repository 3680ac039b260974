"""Kernel names (stable, parseable), the enumerated space per arch facts, heuristics."""
from __future__ import annotations

import attrs
import pytest

from ck_core.errors import MissingKernel
from ck_conv.heuristics import candidate_configs, heuristic_config
from ck_conv.keys import ConvKernelConfig, cull_reason
from ck_conv.space import enumerate_configs
from ck_conv.problem import ConvProblem

GFX942_FP16 = ((32, 32, 8), (16, 16, 16), (32, 32, 16), (16, 16, 32), (4, 64, 16), (64, 4, 16))


def test_example_name_parses_and_round_trips():
    n = "conv_fwd_fp16_nhwgc_gkyxc_nhwgk_2d_compv3_intrawave_128x128x32_2x2x1_32x32x16_default"
    c = ConvKernelConfig.from_name(n)
    assert (c.direction, c.tile, c.waves, c.warp_tile, c.specialization) == \
        ("forward", (128, 128, 32), (2, 2, 1), (32, 32, 16), "default")
    assert c.name == n
    odd = ConvKernelConfig(direction="bwd_weight", dtype="bf16", ndim=3, layout="ngchw", pipeline="mem",
                           scheduler="interwave", tile=(64, 64, 64), waves=(1, 4, 1), warp_tile=(16, 16, 16),
                           specialization="filter1x1_stride1_pad0", vector=(8, 8, 8), pad=(True, False, True))
    assert odd.name.endswith("_filter1x1_stride1_pad0_vec8_8_8_pad101")
    assert ConvKernelConfig.from_name(odd.name) == odd


@pytest.mark.parametrize("bad", [
    "gemm_fp16_rcr",
    "conv_fwd_fp16_nhwgc_gkyxc_nhwgk_2d_compv9_intrawave_1x1x1_1x1x1_1x1x1_default",
    "conv_fwd_fp16_nhwgc_gkxc_nhwgk_2d_compv3_intrawave_128x128x32_2x2x1_32x32x16_default",
])
def test_bad_names(bad):
    with pytest.raises(MissingKernel):
        ConvKernelConfig.from_name(bad)


def test_enumeration_respects_arch_facts():
    culled = []
    cfgs = enumerate_configs(warp_size=64, lds_bytes=65536, warp_tiles={"fp16": GFX942_FP16},
                             dtypes=("fp16",), ndims=(2,), culled=culled)
    assert cfgs and culled
    names = [c.name for c in cfgs]
    assert len(set(names)) == len(names)
    assert all(ConvKernelConfig.from_name(n).name == n for n in names[::97])
    for c in cfgs:
        if c.specialization == "depthwise":
            continue
        assert c.warp_tile in GFX942_FP16
        assert c.lds_bytes() <= 65536
        assert c.tile[0] % (c.waves[0] * c.warp_tile[0]) == 0
        if c.direction != "forward":
            assert c.pipeline in ("compv3", "mem")
    # a smaller LDS culls more; a tile that breaks the warp-tile rule is culled with a reason
    fewer = enumerate_configs(warp_size=64, lds_bytes=32768, warp_tiles={"fp16": GFX942_FP16},
                              dtypes=("fp16",), ndims=(2,))
    assert len(fewer) < len(cfgs)
    bad = ConvKernelConfig(direction="forward", dtype="fp16", ndim=2, tile=(16, 64, 64), waves=(2, 2, 1),
                           warp_tile=(16, 16, 16))
    assert "multiple" in cull_reason(bad, warp_size=64, lds_bytes=65536, warp_tiles=GFX942_FP16, max_threads=1024)
    wrong_tile = ConvKernelConfig(direction="forward", dtype="fp16", ndim=2, warp_tile=(16, 8, 16))
    assert "warp tile" in cull_reason(wrong_tile, warp_size=64, lds_bytes=65536, warp_tiles=GFX942_FP16,
                                      max_threads=1024)


@pytest.mark.parametrize("direction", ["forward", "bwd_data", "bwd_weight"])
@pytest.mark.parametrize("shape", [
    dict(N=32, C=64, K=64, input_spatial=(56, 56), filter=(3, 3), pad_left=1, pad_right=1),
    dict(N=32, C=1024, K=256, input_spatial=(14, 14), filter=(1, 1)),
    dict(N=32, G=144, C=144, K=144, input_spatial=(56, 56), filter=(3, 3), pad_left=1, pad_right=1),
    dict(N=8, G=32, C=512, K=512, input_spatial=(4, 14, 14), filter=(3, 3, 3), stride=2),
])
def test_heuristic_and_candidates_support_the_problem(shape, direction):
    p = ConvProblem(**shape, direction=direction, split_k=0 if direction == "bwd_weight" else 1)
    h = heuristic_config(p)
    assert h.why_not(p) is None
    cands = candidate_configs(p)
    assert all(c.why_not(p) is None for c in cands)
    from ck_conv.heuristics import TUNED_DIR, family_of, problem_class
    from ck_core.tuned_data import table

    tier = table("conv", "generic", "first_tier", TUNED_DIR)
    cls = problem_class(p)
    if cls in tier:   # the tuned first tier keeps its families only (the heuristic pick may go)
        assert {family_of(c) for c in cands} <= set(tier[cls])
    else:
        assert cands[0] == h
    assert len({c.name for c in cands}) == len(cands)


@pytest.mark.parametrize("direction", ["forward", "bwd_weight"])
def test_only_ungrouped_few_channel_layers_are_stems(direction):
    """A grouped layer with few channels per group (ResNeXt 32x8d: C/G = 8) is no stem: the flat
    im2col family (the stem tier) ran it at 0.07x cuDNN where the grouped GEMM kernels reach 0.66x."""
    from ck_conv.heuristics import family_of, problem_class

    kw = dict(input_spatial=(56, 56), filter=(3, 3), pad_left=1, pad_right=1, direction=direction,
              split_k=0 if direction == "bwd_weight" else 1)
    stem = ConvProblem(N=8, C=3, K=64, stride=2, **kw)
    grouped = ConvProblem(N=8, G=32, C=256, K=256, stride=2, **kw)
    assert problem_class(stem) == "stem_" + direction
    assert problem_class(grouped) is None
    assert "flat" not in {family_of(c) for c in candidate_configs(grouped)[:1]}


def test_specialisation_and_direction_mismatch_reasons():
    p = ConvProblem(N=1, C=8, K=8, input_spatial=(5, 5), filter=(3, 3))
    one = ConvKernelConfig(direction="forward", dtype="fp16", ndim=2, specialization="filter1x1_stride1_pad0")
    assert "1x1" in one.why_not(p)
    assert "direction" in ConvKernelConfig(direction="bwd_data", dtype="fp16", ndim=2).why_not(p)
    assert "depthwise" in ConvKernelConfig(direction="forward", dtype="fp16", ndim=2,
                                           specialization="depthwise").why_not(p)


def test_hopper_enumeration_keeps_shared_memory_in_bounds():
    """On an NVIDIA arch every A/B buffer the Triton pipeline keeps must fit (227 KB on sm90)."""
    from ck_conv import keys as plugin, keyspace
    from ck_core.records import ArchSpec
    sm90 = ArchSpec(name="sm90x", vendor="nvidia", family="hopper", warp_size=32, lds_bytes=232448,
                    compute_units=132, dtypes=("fp16",), warp_tiles={"fp16": ((16, 64, 16), (16, 128, 16))},
                    wave_layouts=((2, 2, 1), (2, 4, 1)), pipelines=("multistage",))
    keys = keyspace.enumerate_keys(sm90, "triton", {"ndims": [2], "directions": ["bwd_data"]})
    assert keys
    for k in keys:
        c = plugin.config_of(k)
        if c.specialization != "depthwise":
            assert (c.tile[0] + c.tile[1]) * c.tile[2] * 2 * c.smem_buffers <= 232448
    assert not any(plugin.config_of(k).tile == (256, 128, 64) and k.algorithm.pipeline == "compv3"
                   and plugin.config_of(k).smem_buffers == 5   # 3-stage realisations of it fit
                   and k.algorithm.specialization == "filter1x1_stride1_pad0" for k in keys)


def test_realisation_knobs_round_trip_and_validate():
    from ck_core.errors import InvalidProblem
    from ck_conv.heuristics import extended_candidates
    from ck_conv.keys import is_extended
    n = ("conv_bwd_weight_fp16_nhwgc_gkyxc_nhwgk_2d_compv3_intrawave_16x16x64_2x2x1_16x16x16_filter3x3"
         "_st4_fixup_gm8_tapmask")
    c = ConvKernelConfig.from_name(n)
    assert (c.stages, c.reduction, c.group_merge, c.tap_mask) == (4, "fixup", 8, True)
    assert c.name == n and c.num_stages == 4 and c.smem_buffers == 2 and is_extended(c)
    assert c.triton_meta()["GM"] == 8
    plain = ConvKernelConfig.from_name(n.split("_st4")[0])
    assert not is_extended(plain) and plain.reduction == "atomic" and "_st" not in plain.name
    for red in ("relaxed", "twostage"):
        assert ConvKernelConfig.from_name(n.replace("fixup", red)).reduction == red
    with pytest.raises(InvalidProblem):
        ConvKernelConfig(direction="forward", dtype="fp16", ndim=2, group_merge=3)
    grouped = ConvProblem(N=2, G=32, C=512, K=512, input_spatial=(14, 14), filter=(3, 3), pad_left=1, pad_right=1,
                          direction="bwd_weight", split_k=0)
    assert c.why_not(grouped) is None
    assert "grouped" in c.why_not(ConvProblem(N=2, C=16, K=16, input_spatial=(8, 8), filter=(3, 3),
                                              direction="bwd_weight"))
    fwd = ConvKernelConfig(direction="forward", dtype="fp16", ndim=2, group_merge=2)
    assert fwd.why_not(grouped.with_direction("forward")) is None  # block-diagonal merging (session 3)
    g24 = attrs.evolve(grouped.with_direction("forward"), C=32 * 24, K=32 * 24)
    assert "whole groups" in attrs.evolve(fwd, tile=(128, 128, 32)).why_not(g24)
    r3 = ConvProblem(N=1, C=8, K=8, input_spatial=(4, 6, 6), filter=(4, 3, 3))
    assert "31 taps" in ConvKernelConfig(direction="forward", dtype="fp16", ndim=3, tap_mask=True).why_not(r3)
    one = ConvProblem(N=1, C=8, K=8, input_spatial=(6, 6), filter=(1, 1))
    assert "nothing to mask" in ConvKernelConfig(direction="forward", dtype="fp16", ndim=2,
                                                 tap_mask=True).why_not(one)
    # extended candidates: applicable, distinct, parse back; none for depthwise
    for d in ("forward", "bwd_data", "bwd_weight"):
        q = grouped.with_direction(d, split_k=0 if d == "bwd_weight" else 1)
        ext = extended_candidates(q)
        assert all(x.why_not(q) is None and is_extended(x) and ConvKernelConfig.from_name(x.name) == x for x in ext)
        assert len({x.name for x in ext}) == len(ext)
        assert set(ext) <= set(candidate_configs(q)) and not set(ext) & set(candidate_configs(q, extended=False))
    assert any(x.group_merge > 1 for x in extended_candidates(grouped))
    dw = ConvProblem(N=2, G=8, C=8, K=8, input_spatial=(8, 8), filter=(3, 3), direction="bwd_weight")
    # depthwise bwd_weight: the per-tap kernel's one-launch (atomicfix) tiles (session 8)
    ext = extended_candidates(dw)
    assert ext and all(x.specialization == "depthwise" and x.reduction == "atomicfix" and x.why_not(dw) is None
                       for x in ext)


def test_realisation_knobs_survive_kernel_keys():
    from ck_conv import keys as plugin
    c = ConvKernelConfig.from_name("conv_fwd_fp16_nhwgc_gkyxc_nhwgk_2d_compv4_intrawave_128x128x64_2x4x1_16x16x16"
                                   "_filter3x3_st3_fixup_tapmask")
    key = plugin.key_of(c, "sm90")
    assert plugin.config_of(key) == c and key.algorithm.reduction == "fixup" and key.algorithm.stages == 3
    sig, alg = plugin.parse_name(c.name)
    assert plugin.format_name(sig, alg) == c.name


def test_session3_knobs_round_trip_and_validate():
    from ck_conv import keys as plugin
    from ck_conv.keys import is_extended
    bd = ConvProblem(N=2, C=64, K=64, input_spatial=(9, 9), filter=(3, 3), pad_left=1, pad_right=1,
                     direction="bwd_data")
    for n in ("conv_bwd_data_fp16_nhwgc_gkyxc_nhwgk_2d_compv3_intrawave_64x128x128_2x4x1_16x16x16_filter3x3_st4"
              "_streamk_tapmask",
              "conv_fwd_fp16_nhwgc_gkyxc_nhwgk_2d_compv4_intrawave_128x128x64_2x4x1_16x16x16_filter3x3_streamk",
              "conv_fwd_fp16_nhwgc_gkyxc_nhwgk_2d_mem_intrawave_4x1024x1_4x1x1_1x1x1_depthwise_flat"):
        c = ConvKernelConfig.from_name(n)
        assert c.name == n and is_extended(c)
        sig, alg = plugin.parse_name(n)
        assert plugin.format_name(sig, alg) == n and plugin.config_of(plugin.key_of(c, "sm90")) == c
    c = ConvKernelConfig.from_name("conv_bwd_data_fp16_nhwgc_gkyxc_nhwgk_2d_compv3_intrawave_64x128x64_2x2x1_16x16x16"
                                   "_filter3x3_tapmask")
    # no table loads: the forward's pipeline depth, every stage a buffer
    assert c.why_not(bd) is None and c.num_stages == 3 and c.smem_buffers == 3
    assert c.triton_meta()["STREAMK"] == 0
    sk = attrs.evolve(c, tap_mask=False, reduction="streamk")
    assert "tap mask" in sk.why_not(bd)
    assert "bwd_weight" in attrs.evolve(sk, direction="bwd_weight").why_not(bd.with_direction("bwd_weight"))
    one = ConvProblem(N=2, C=64, K=64, input_spatial=(9, 9), filter=(1, 1), direction="bwd_data")
    assert attrs.evolve(sk, specialization="filter1x1_stride1_pad0").why_not(one) is None
    dw = ConvProblem(N=2, G=144, C=144, K=144, input_spatial=(8, 8), filter=(3, 3), pad_left=1, pad_right=1)
    flat = ConvKernelConfig.from_name("conv_fwd_fp16_nhwgc_gkyxc_nhwgk_2d_mem_intrawave_4x1024x1_4x1x1_1x1x1"
                                      "_depthwise_flat")
    assert flat.why_not(dw) is None and flat.triton_meta()["BLOCK_F"] == 1024
    assert "powers of two" in attrs.evolve(flat, tile=(3, 1024, 1)).why_not(dw)
    assert "forward and bwd_data" in attrs.evolve(flat, direction="bwd_weight").why_not(
        dw.with_direction("bwd_weight"))
    # on other specialisations _flat is the im2col kernel over (tap, channel): forward / bwd_weight
    assert "forward and bwd_weight" in attrs.evolve(c, flat=True).why_not(bd)


def test_candidate_count_stays_reasonable():
    """ck bench conv compiles every candidate of its 36 (case, direction) pairs."""
    from ck_conv.bench import CASES, problem
    n = sum(len(candidate_configs(problem(c, d))) for c in CASES for d in ("forward", "bwd_data", "bwd_weight"))
    assert n < 500
