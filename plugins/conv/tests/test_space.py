"""The triton conv registry holds the realisation families, each with its supports() reasons, and
the Dispatcher runs them (CPU interpreter) against an independent float64 torch reference."""
import attrs
import pytest

from ck_core import Dispatcher, Registry
from ck_conv.keys import config_of, supports
from ck_conv.problem import ConvProblem

FAMILIES = {
    "relaxed": lambda a: a.reduction == "relaxed",
    "twostage": lambda a: a.reduction == "twostage",
    "fixup": lambda a: a.reduction == "fixup",
    "atomicfix": lambda a: a.reduction == "atomicfix",
    "streamk": lambda a: a.reduction == "streamk",
    "tap mask": lambda a: a.tap_mask,
    "BK=128 deep": lambda a: a.tile_k == 128 and a.stages in (4, 5),
    "group merge": lambda a: a.group_merge > 1,
    "depthwise flat": lambda a: a.flat and a.specialization == "depthwise",
    "flat im2col": lambda a: a.flat and a.specialization != "depthwise",
    "depthwise rows": lambda a: a.rows > 0,
}


@pytest.fixture(scope="module")
def sm90_fwd():
    return Registry.from_enumeration("conv", "sm90", "triton", dtypes=["fp16"], ndims=[2],
                                     directions=["forward", "bwd_weight"])


def _conv(**kw):
    base = dict(N=2, G=1, C=12, K=10, input_spatial=(5, 7), filter=(3, 3), pad_left=(1, 1), pad_right=(1, 1),
                dtype="fp16")
    return ConvProblem(**{**base, **kw})


def test_registry_holds_every_family(sm90_fwd):
    fwd = [k.algorithm for k in sm90_fwd if k.signature.direction == "forward"]
    for name, has in FAMILIES.items():
        assert any(has(a) for a in fwd), name
    bww = [k.algorithm for k in sm90_fwd if k.signature.direction == "bwd_weight"]
    assert not any(a.reduction == "streamk" or a.rows or (a.flat and a.specialization == "depthwise") for a in bww)
    assert {a.reduction for a in bww} >= {"relaxed", "twostage", "fixup", "atomicfix"}
    # bwd_weight's own new families: the flat im2col kernel (split) and depthwise atomicfix
    assert any(a.flat and a.split > 1 for a in bww)
    assert any(a.specialization == "depthwise" and a.reduction == "atomicfix" and a.split == 1024 for a in bww)


def test_each_family_says_why_it_does_not_apply(sm90_fwd):
    keys = {name: next(k for k in sm90_fwd if k.signature.direction == "forward" and has(k.algorithm)
                       and k.algorithm.specialization in ("default", "depthwise"))
            for name, has in FAMILIES.items()}
    one_by_one = _conv(filter=(1, 1), pad_left=(0, 0), pad_right=(0, 0))
    assert "nothing to mask" in supports(keys["tap mask"], one_by_one)
    assert "grouped problem" in supports(keys["group merge"], _conv())
    assert "depthwise" in supports(keys["depthwise flat"], _conv())
    assert supports(keys["flat im2col"], _conv()) is None
    assert "forward and bwd_weight" in supports(keys["flat im2col"], _conv(direction="bwd_data")) \
        or "direction" in supports(keys["flat im2col"], _conv(direction="bwd_data"))
    dw_strided = _conv(G=6, C=6, K=6, stride=(2, 2))
    assert supports(keys["depthwise flat"], dw_strided) is None
    assert "stride 1" in supports(keys["depthwise rows"], dw_strided)
    assert supports(keys["depthwise rows"], _conv(G=6, C=6, K=6)) is None
    big = _conv(filter=(7, 7), pad_left=(3, 3), pad_right=(3, 3))
    assert "31 taps" in supports(keys["tap mask"], big)
    bww = next(k for k in sm90_fwd if k.signature.direction == "bwd_weight")
    assert "direction" in supports(bww, _conv())


torch = pytest.importorskip("torch")
pytest.importorskip("triton")


def _torch_ref(p: ConvProblem, x, w, dy=None):
    """float64 torch conv of NHWGC / GKYXC tensors (symmetric padding), or its weight gradient."""
    F = torch.nn.functional
    N, H, W, G, Cg = x.shape
    Kg = w.shape[1]
    xt = x.double().reshape(N, H, W, G * Cg).permute(0, 3, 1, 2)
    wt = w.double().permute(0, 1, 4, 2, 3).reshape(G * Kg, Cg, *w.shape[2:4]).requires_grad_(dy is not None)
    y = F.conv2d(xt, wt, stride=tuple(p.stride), padding=tuple(p.pad_left), dilation=tuple(p.dilation), groups=G)
    if dy is None:
        return y.permute(0, 2, 3, 1).reshape(N, *y.shape[2:], G, Kg)
    Ho, Wo = y.shape[2:]
    (y * dy.double().reshape(N, Ho, Wo, G * Kg).permute(0, 3, 1, 2)).sum().backward()
    return wt.grad.reshape(G, Kg, Cg, *w.shape[2:4]).permute(0, 1, 3, 4, 2)


def _pick(reg, p, has):
    ok = [k for k in reg if supports(k, p) is None and has(k.algorithm)]
    assert ok, p
    # the smallest tile (the interpreter's cost) of the family
    return min(ok, key=lambda k: (k.algorithm.tile_m * k.algorithm.tile_n * k.algorithm.tile_k, k.name))


CASES = [
    ("fixup", _conv(C=12, K=10), "forward"),
    ("tap mask", _conv(C=6, K=9, stride=(2, 1)), "forward"),
    ("streamk", _conv(C=16, K=8), "forward"),
    ("group merge", _conv(G=4, C=16, K=12), "forward"),
    ("depthwise flat", _conv(G=6, C=6, K=6, stride=(2, 1)), "forward"),
    ("depthwise rows", _conv(G=6, C=6, K=6), "forward"),
    ("twostage", _conv(C=6, K=10), "bwd_weight"),
    ("atomicfix", _conv(C=6, K=10), "bwd_weight"),
]


@pytest.mark.parametrize("family,problem,direction", CASES, ids=[c[0] + "-" + c[2] for c in CASES])
def test_family_runs_through_the_dispatcher(sm90_fwd, family, problem, direction, ck_rng):
    p = attrs.evolve(problem, direction=direction)
    key = _pick(sm90_fwd, p, FAMILIES[family])
    disp = Dispatcher(Registry("sm90", [key]), backend="triton")
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 30)))
    x = torch.randn(p.input_shape, generator=g).half()
    w = (torch.randn(p.weight_shape, generator=g) / 4).half()
    if direction == "forward":
        out, ref = disp.run(p, x, w), _torch_ref(p, x, w)
    else:
        dy = torch.randn(p.output_shape, generator=g).half()
        out, ref = disp.run(p, x=x, dy=dy), _torch_ref(p, x, w, dy)
    assert disp.select(p) == key and config_of(key).why_not(p) is None
    err = float((out.double() - ref).norm() / ref.norm())
    assert err < 3e-3, (key.name, err)


#: benchmark-style layers whose whole candidate list (classic + extended) the registry holds
COVERED = [
    ("resnet c4 3x3", dict(N=8, G=1, C=256, K=256, input_spatial=(14, 14), filter=(3, 3), pad_left=(1, 1),
                           pad_right=(1, 1)), ("forward", "bwd_data", "bwd_weight")),
    ("resnet c5 1x1", dict(N=8, G=1, C=512, K=2048, input_spatial=(7, 7), filter=(1, 1)),
     ("forward", "bwd_weight")),
    ("mobilenet dw 3x3", dict(N=8, G=96, C=96, K=96, input_spatial=(56, 56), filter=(3, 3), pad_left=(1, 1),
                              pad_right=(1, 1)), ("forward", "bwd_data", "bwd_weight")),
    ("stem 7x7 s2", dict(N=8, G=1, C=3, K=64, input_spatial=(224, 224), filter=(7, 7), stride=(2, 2),
                         pad_left=(3, 3), pad_right=(3, 3)), ("forward", "bwd_data", "bwd_weight")),
]


@pytest.fixture(scope="module")
def sm90_fp16_2d():
    return {config_of(k) for k in Registry.from_enumeration("conv", "sm90", "triton", dtypes=["fp16"], ndims=[2])}


@pytest.mark.parametrize("name,shape,directions", COVERED, ids=[c[0] for c in COVERED])
def test_the_registry_holds_the_benchmark_candidates(sm90_fp16_2d, name, shape, directions):
    from ck_conv.heuristics import candidate_configs

    held = sm90_fp16_2d
    for d in directions:
        p = ConvProblem(**shape, direction=d, dtype="fp16", split_k=0)
        missing = [c.name for c in candidate_configs(p) if c not in held]
        assert not missing, (d, missing[:3])
