"""Grouped bwd_weight (issue #29): the per-tap kernel's small tiles split the pixel reduction.

A ResNeXt 32x4d layer's bwd_weight (G=32, 4-32 channels per group) ran as 288 unsplit programs of
16x16 outputs, each walking every pixel (H200: 0.15x cuDNN).  The key space now holds those small
tiles with the one-launch split reductions, the preferred split of a grouped conv's small programs
counts warps per SM, and the shortlist drops their unsplit twins.  Selection is checked on the
sm90 registry (no kernel runs); the kernels under the interpreter against the float64 reference.
"""
from __future__ import annotations

import attrs
import pytest

from ck_conv.geometry import reduction_shape, split_plan
from ck_conv.heuristics import grouped_small, shortlist, underfills
from ck_conv.keys import ConvKernelConfig, config_of, supports
from ck_conv.keyspace import key_space
from ck_conv.problem import LAYOUT_FAMILIES, ConvProblem
from ck_core.plugins import get_manager


def _problem(N, G, C, K, H, F=3, S=1, dtype="bf16", fam="nhwgc", direction="bwd_weight", split_k=0):
    in_l, wei_l, out_l = LAYOUT_FAMILIES[fam][2]
    return ConvProblem(N=N, G=G, C=C, K=K, input_spatial=(H, H), filter=(F, F), stride=(S, S),
                       pad_left=(F // 2,) * 2, pad_right=(F // 2,) * 2, direction=direction, dtype=dtype,
                       in_layout=in_l, wei_layout=wei_l, out_layout=out_l, split_k=split_k)


#: ResNeXt-50 32x4d's grouped 3x3 layers (4, 8, 16, 32 channels per group), batch 8 and 32
RESNEXT = {
    "l1_b32": (32, 32, 128, 128, 56), "l2_b8": (8, 32, 256, 256, 28), "l2_s2_b32": (32, 32, 256, 256, 56, 3, 2),
    "l3_b32": (32, 32, 512, 512, 28), "l4_b32": (32, 32, 1024, 1024, 14), "g4_b8": (8, 4, 64, 64, 28),
}


@pytest.fixture(scope="module")
def sm90():
    return get_manager().arch("sm90")


@pytest.fixture(scope="module")
def disp(sm90):
    from ck_core import api as core

    return core.dispatcher_for("conv", "sm90", "triton", directions=("bwd_weight",), dtypes=("bf16",), ndims=(2,),
                               layouts=("nhwgc",))


@pytest.mark.parametrize("name", list(RESNEXT))
def test_grouped_bwd_weight_picks_fill_the_gpu(disp, sm90, name):
    p = _problem(*RESNEXT[name])
    key = disp.select(p)
    c = config_of(key)
    tiles, pixels = reduction_shape(c, p)
    warps = tiles * c.split * c.num_warps
    # the old picks: 288 unsplit programs of 2 warps (4.4 warps per SM of an H200's 132)
    assert warps >= 8 * sm90.compute_units or pixels // c.split <= 16 * c.tile[2], (key.name, warps)
    assert supports(key, p) is None
    first = next(iter(shortlist(p, sm90, "triton")))
    space = key_space(sm90, "triton", {"directions": ["bwd_weight"], "dtypes": ["bf16"], "ndims": [2]})
    held = [k for k in first if k in space]
    assert key in held
    # no unsplit launch of small programs that the split target would split stays on the list
    assert not [k.name for k in held if config_of(k).split == 1
                and underfills(p, config_of(k), sm90.compute_units)]
    # and the split ones it holds are named as their launch cuts the reduction
    for k in held:
        cfg = config_of(k)
        if cfg.split > 1:
            assert split_plan(cfg, p)[0] == cfg.split, k.name


def test_a_registry_without_splits_still_gets_the_unsplit_launches(sm90):
    # the unsplit launches the shortlist leaves out come in a tier of their own, after the others
    from ck_core import Dispatcher, Registry

    p = _problem(*RESNEXT["l2_b8"])
    reg = Registry.from_enumeration("conv", "sm90", "triton", directions=["bwd_weight"], dtypes=["bf16"], ndims=[2],
                                    specializations=["filter3x3"], split_ks=[1])
    tiers = [reg.shortlist(p, t, "triton") for t in shortlist(p, sm90, "triton")]
    first = next(t for t in tiers if t)
    assert first and all(config_of(k).split == 1 and underfills(p, config_of(k), sm90.compute_units)
                         for k in first)
    key = Dispatcher(reg, backend="triton").select(p)
    assert key in first


def test_the_space_holds_small_tiles_with_one_launch_reductions(sm90):
    space = key_space(sm90, "triton", {"directions": ["bwd_weight"], "dtypes": ["fp16"], "ndims": [2]})
    for red in ("fixup", "atomicfix", "twostage", "relaxed"):
        for tap in (False, True):
            for split in (1, 4, 16):
                c = ConvKernelConfig(direction="bwd_weight", dtype="fp16", ndim=2, tile=(16, 16, 128),
                                     waves=(1, 2, 1), warp_tile=(16, 16, 16), specialization="filter3x3",
                                     reduction=red, tap_mask=tap, split=split, stages=4)
                from ck_conv.keys import key_of
                assert key_of(c, "sm90", "triton") in space, c.name


def test_ungrouped_and_depthwise_problems_keep_their_split_rule(sm90):
    # grouped_small is the grouped per-tap rule only: G = 1 and depthwise keep the programs-per-SM target
    g1 = _problem(8, 1, 16, 16, 56)
    dw = _problem(8, 32, 32, 32, 56)
    small = ConvKernelConfig(direction="bwd_weight", dtype="bf16", ndim=2, tile=(16, 16, 64), waves=(1, 2, 1),
                             warp_tile=(16, 16, 16), specialization="filter3x3")
    assert not grouped_small(g1, small) and not grouped_small(dw, attrs.evolve(small, specialization="depthwise"))
    assert grouped_small(_problem(*RESNEXT["l2_b8"]), small)
    assert not grouped_small(_problem(*RESNEXT["l2_b8"]), attrs.evolve(small, tile=(64, 64, 64)))


# ---- the kernels, under the interpreter ---------------------------------------------------

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from ck_conv.backends.triton.launch import run  # noqa: E402
from ck_conv.reference import random_operands, reference, rel_error  # noqa: E402

TD = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
TOL = {"fp16": 2e-3, "bf16": 1.5e-2, "fp32": 1e-5}


def _counters_zero():
    from ck_conv.backends.triton import launch
    return all(float(c.abs().sum()) == 0 for c in (*launch._COUNTERS.values(), *launch._ACCUM.values())
               if c.device.type != "meta")


@pytest.fixture(autouse=True)
def _poisoned_empty(monkeypatch):
    """Every float buffer the launcher allocates starts as NaN: an element no program writes fails."""
    import math

    real = torch.empty

    def empty(*a, **k):
        t = real(*a, **k)
        return t.fill_(math.nan) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", empty)


def _check(p, cfg, split, seed):
    """Run ``cfg`` split ``split`` ways (as the launch cuts it) on fresh random operands against the
    float64 reference, over NaN-poisoned result buffers."""
    want = split_plan(attrs.evolve(cfg, split=split), p)[0]
    assert want == split, (cfg.name, want)   # the shapes below make every asked part non-empty
    p, cfg = attrs.evolve(p, split_k=split), attrs.evolve(cfg, split=split)
    assert cfg.why_not(p) is None, cfg.why_not(p)
    ops = random_operands(p, seed=seed)
    tt = {k: torch.from_numpy(v).to(TD[p.dtype]) for k, v in ops.items()}
    ref = reference(p, {k: v.double().numpy() for k, v in tt.items()})
    out = run(p, tt, cfg)
    assert tuple(out.shape) == ref.shape
    err = rel_error(out.double().numpy(), ref)
    assert err < TOL[p.dtype], (cfg.name, err)


#: odd sizes: 5 input / 7 output channels per group, 3 groups, stride 2 along W, dilation 2 along H;
#: 2 x 12 x 8 = 192 output pixels: 3 parts of 64-pixel blocks (BLOCK_K 64), 2 of 128
ODD = dict(N=2, G=3, C=15, K=21, input_spatial=(14, 17), filter=(3, 3), stride=(1, 2), dilation=(2, 1),
           pad_left=(1, 1), pad_right=(1, 0))


@pytest.mark.parametrize("reduction,tap", [("fixup", True), ("twostage", False)])
def test_small_tile_split_reductions_match_the_reference(reduction, tap, ck_rng):
    p = ConvProblem(**ODD, direction="bwd_weight", dtype="fp16", split_k=0)
    assert reduction_shape(ConvKernelConfig(direction="bwd_weight", dtype="fp16", ndim=2, tile=(16, 16, 64),
                                            waves=(1, 2, 1), warp_tile=(16, 16, 16)), p)[1] == 192
    cfg = ConvKernelConfig(direction="bwd_weight", dtype="fp16", ndim=2, tile=(16, 16, 64), waves=(1, 2, 1),
                           warp_tile=(16, 16, 16), reduction=reduction, tap_mask=tap)
    _check(p, cfg, 3, int(ck_rng.integers(1 << 30)))
    if reduction == "fixup":   # a deeper, wider tile (atomicfix: the grouped test below)
        _check(p, attrs.evolve(cfg, tile=(32, 16, 128), stages=4), 2, int(ck_rng.integers(1 << 30)))
    assert _counters_zero()   # fixup / atomicfix leave their counters and sums zeroed


@pytest.mark.parametrize("dtype,groups,fam", [("bf16", 2, "nhwgc"), ("fp32", 4, "ngchw"), ("fp16", 32, "nhwgc")])
def test_grouped_splits_other_dtypes_groups_and_layouts(dtype, groups, fam, ck_rng):
    # 4 channels per group in and 3 out (ResNeXt 32x4d's 4, odd K); 2 x 9 x 14 = 252 output pixels in
    # 4 parts (G = 32: a 3x1 filter, 1 x 9 x 14 pixels in 2 parts, to keep the interpreter's programs few)
    in_l, wei_l, out_l = LAYOUT_FAMILIES[fam][2]
    big = groups >= 32
    p = ConvProblem(N=1 if big else 2, G=groups, C=4 * groups, K=3 * groups, input_spatial=(9, 14),
                    filter=(3, 1) if big else (3, 3), pad_left=(1, 0) if big else (1, 1),
                    pad_right=(1, 0) if big else (1, 1), direction="bwd_weight", dtype=dtype, in_layout=in_l,
                    wei_layout=wei_l, out_layout=out_l, split_k=0)
    base = ConvKernelConfig(direction="bwd_weight", dtype=dtype, ndim=2, layout=fam, tile=(16, 16, 64),
                            waves=(1, 2, 1), warp_tile=(16, 16, 16), specialization=p.specialization,
                            tap_mask=True, reduction="atomicfix")
    split = 2 if big else 4
    _check(p, base, split, int(ck_rng.integers(1 << 30)))
    if big:   # merged groups (a batched dot over 16 groups) split the same pixels
        _check(p, attrs.evolve(base, group_merge=16, reduction="fixup"), split, int(ck_rng.integers(1 << 30)))
    assert _counters_zero()


def test_public_conv2d_grouped_weight_grad_runs_a_split_key(ck_rng, ck_dispatch_log, monkeypatch):
    """conv2d's autograd on a grouped layer big enough to split: the Dispatcher's bwd_weight key (a
    split key on the test arch's registry: 8 compute units) runs, and dW equals float64 torch's."""
    from ck_conv.api import conv2d
    from ck_core import api as core

    monkeypatch.setenv("CK_BACKEND", "triton")
    core.clear()
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 30)))
    # G = 4, 2 -> 3 channels per group, a 3x1 filter, 1 x 36 x 31 output pixels (1116: 2 parts of 512+)
    x = torch.randn(1, 8, 36, 31, generator=g).to(memory_format=torch.channels_last)
    w = torch.randn(12, 2, 3, 1, generator=g).requires_grad_()
    y = conv2d(x, w, padding=(1, 0), groups=4)
    dy = torch.randn(y.shape, generator=g)
    y.backward(dy)
    wd = w.detach().double().requires_grad_()
    torch.nn.functional.conv2d(x.double(), wd, padding=(1, 0), groups=4).backward(dy.double())
    assert float((w.grad.double() - wd.grad).norm() / wd.grad.norm()) < 1e-5
    runs = [r for r in ck_dispatch_log.take() if r[0].direction == "bwd_weight"]
    assert runs
    names = runs[0][2]
    assert len(names) == 1 and "_sp" in names[0], names
    assert grouped_small(runs[0][0], ConvKernelConfig.from_name(names[0].split(".")[0]))
    core.clear()
