"""The shortlist names only keys the key space holds: a preferred split (any integer) is snapped
to the enumeration's splits, so split kernels stay reachable (before, 48 of 83 bwd_weight layers
of the H100 oracle had no split key at all: a MobileNet depthwise bwd_weight ran on 1 program
per 32 groups, 160x slower than cuDNN)."""
from __future__ import annotations

import attrs
import pytest

from ck_conv.keys import config_of, supports
from ck_conv.heuristics import shortlist
from ck_conv.keys import conv_facts
from ck_conv.keyspace import key_space
from ck_conv.space import _splits
from ck_conv.problem import ConvProblem
from ck_core.plugins import get_manager

PROBLEMS = {
    # MobileNetV2 depthwise bwd_weight (preferred split ~263 pixels parts)
    "dw_bwd_weight": dict(N=32, G=32, C=32, K=32, input_spatial=(112, 112), filter=(3, 3), pad_left=(1, 1),
                          pad_right=(1, 1), direction="bwd_weight"),
    # an RGB stem's bwd_weight: few output tiles, a long pixel reduction
    "stem_bwd_weight": dict(N=8, G=1, C=3, K=32, input_spatial=(224, 224), filter=(3, 3), stride=(2, 2),
                            pad_left=(1, 1), pad_right=(1, 1), direction="bwd_weight"),
    "unet_bwd_weight": dict(N=1, G=1, C=320, K=320, input_spatial=(64, 64), filter=(3, 3), pad_left=(1, 1),
                            pad_right=(1, 1), direction="bwd_weight"),
    # c5 forward: fewer output tiles than SMs
    "c5_forward": dict(N=1, G=1, C=512, K=512, input_spatial=(7, 7), filter=(3, 3), pad_left=(1, 1),
                       pad_right=(1, 1), direction="forward"),
    "c5_bwd_data": dict(N=1, G=1, C=512, K=512, input_spatial=(7, 7), filter=(3, 3), pad_left=(1, 1),
                        pad_right=(1, 1), direction="bwd_data"),
}


@pytest.fixture(scope="module")
def sm90():
    return get_manager().arch("sm90")


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_every_shortlisted_split_is_a_key_of_the_space(sm90, name):
    p = ConvProblem(**PROBLEMS[name], dtype="bf16", split_k=0)
    space = key_space(sm90, "triton", {"directions": [p.direction], "dtypes": ["bf16"], "ndims": [p.ndim]})
    first = next(iter(shortlist(p, sm90, "triton")))
    split = [k for k in first if k.algorithm.split > 1]
    for k in first:   # a config the space holds unsplit, it holds with the shortlisted split
        if attrs.evolve(k, algorithm=attrs.evolve(k.algorithm, split=1)) in space:
            assert k in space, k.name
    if p.direction == "bwd_weight":
        # the long pixel reductions get split keys the registry really holds
        assert split and all(supports(k, p) is None for k in split)
    for k in split:
        assert k.algorithm.split in _splits(config_of(k), ())


def test_depthwise_bwd_weight_enumerates_splits_that_fill_a_gpu(sm90):
    p = ConvProblem(**PROBLEMS["dw_bwd_weight"], dtype="fp16", split_k=0)
    first = next(iter(shortlist(p, sm90, "triton")))
    assert max(k.algorithm.split for k in first) >= 128
    assert max(conv_facts(sm90)["triton"]["splits"]["depthwise_bwd_weight"]) >= 2 * sm90.compute_units - 8


torch = pytest.importorskip("torch")
pytest.importorskip("triton")


@pytest.mark.parametrize("split", [64, 128])
def test_depthwise_bwd_weight_with_many_splits_matches_the_reference(split):
    from ck_conv.backends.triton.launch import run
    from ck_conv.geometry import split_plan
    from ck_conv.heuristics import heuristic_config
    from ck_conv.reference import random_operands, reference, rel_error

    # 4 x 16 x 16 = 1024 output pixels: 64 and 128 parts of whole 8-pixel blocks; G = 6 (not a power
    # of two), stride 2 along W with an odd input width
    p = ConvProblem(N=4, G=6, C=6, K=6, input_spatial=(16, 31), filter=(3, 3), stride=(1, 2), pad_left=(1, 1),
                    pad_right=(1, 1), direction="bwd_weight", dtype="fp16", split_k=0)
    cfg = attrs.evolve(heuristic_config(p), split=split)
    assert split_plan(cfg, p)[0] == split and cfg.why_not(attrs.evolve(p, split_k=split)) is None
    p = attrs.evolve(p, split_k=split)
    ops = random_operands(p, seed=11)
    tt = {k: torch.from_numpy(v).to(torch.float16) for k, v in ops.items()}
    ref = reference(p, {k: v.float().numpy() for k, v in tt.items()})
    out = run(p, tt, cfg)
    assert rel_error(out.float().numpy(), ref) < 2e-3
