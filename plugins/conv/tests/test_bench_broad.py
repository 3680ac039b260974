"""The broad conv benchmark suite: deterministic cases that cover what it claims."""
import pytest

from ck_conv import bench_broad as cb


def test_cases_deterministic_and_broad():
    cs = cb.cases()
    assert cs == cb.cases() and cs != cb.cases(seed=3)
    nets = {c["net"] for c in cs}
    assert {"resnet50", "resnext50", "mobilenet_v2", "efficientnet_b0", "unet", "vae", "audio1d",
            "video3d"} <= nets
    assert {len(c["spatial"]) for c in cs} == {1, 2, 3}
    assert {c["direction"] for c in cs} == set(cb.DIRECTIONS)
    assert any(c["G"] == c["C"] == c["K"] > 1 for c in cs)  # depthwise
    assert any(1 < c["G"] < c["C"] for c in cs)  # grouped
    assert any(c["C"] == 3 for c in cs)  # an RGB stem
    assert all(c["split"] == "heldout" for c in cs if c["net"] in cb.HELD_OUT_NETS)
    assert 0.15 <= sum(c["split"] == "heldout" for c in cs) / len(cs) <= 0.5


def test_every_layer_is_a_valid_problem():
    every = cb.cases(n=len(cb.LAYERS))  # drawn without replacement: each layer once
    assert len({(c["net"], c["C"], c["K"], c["spatial"], c["filter"], c["stride"]) for c in every}) == len(cb.LAYERS)
    for c in every:
        p = cb._problem(c)
        assert all(o >= 1 for o in p.output_spatial), c["case"]


@pytest.mark.slow
def test_every_case_has_an_sm90_kernel():
    from ck_core import Registry

    regs = {}
    for c in cb.cases():
        if c["dtype"] not in regs:
            regs[c["dtype"]] = Registry.from_enumeration("conv", "sm90", "triton", dtypes=[c["dtype"]])
        assert regs[c["dtype"]].candidates(cb._problem(c), "triton"), c["case"]


# -- issue #29's strata ------------------------------------------------------------------------------

def test_the_seeded_draws_are_unchanged_and_every_stratum_has_rows():
    cs = cb.cases()
    first = cb.cases(with_strata=False)
    assert cs[:len(first)] == first and len(first) == 40
    have = {s for c in cs for s in cb.strata(c)}
    assert have == {f"{d}/{k}" for d in cb.DIRECTIONS for k in cb.KINDS}
    assert len({c["case"] for c in cs}) == len(cs)   # names are unique (shards merge by name)
    q = cb.quick_cases(cs)
    assert q == cb.quick_cases(cb.cases()) and {s for c in q for s in cb.strata(c)} == have and len(q) <= 30


def test_kinds_of_layers():
    def k(C, K, G, flt, st):
        return cb.kinds(dict(C=C, K=K, G=G, filter=flt, stride=st))

    assert k(3, 64, 1, (7, 7), (2, 2)) == ["7x7", "strided", "stem"]
    assert k(144, 144, 144, (5, 5), (2, 2)) == ["5x5", "strided", "depthwise"]
    assert k(128, 128, 32, (3, 3), (1, 1)) == ["3x3", "grouped"]
    assert k(64, 256, 1, (1, 1), (1, 1)) == ["1x1"]
    assert k(512, 512, 512, (15,), (1,)) == ["1d", "depthwise"]
    assert k(64, 64, 1, (3, 3, 3), (1, 1, 1)) == ["3d"]


def test_held_out_shapes_never_train():
    cs = cb.cases()
    train = {cb._shape(c) for c in cs if c["split"] == "train"}
    assert not [c["case"] for c in cs if c["split"] == "heldout" and cb._shape(c) in train]
    assert all(c["split"] == "heldout" for c in cs if c["net"] in cb.HELD_OUT_NETS)


def test_strata_summary_math_on_synthetic_rows():
    def r(direction, C, K, G, flt, st, g, e, split="train", **kw):
        c = dict(direction=direction, C=C, K=K, G=G, filter=flt, stride=st, split=split, status="ok",
                 ratio_graph=g, ratio_eager=e, **kw)
        return dict(c, kinds=cb.kinds(c))

    rows = [r("forward", 64, 64, 1, (3, 3), (1, 1), 0.5, 0.25), r("forward", 64, 64, 1, (3, 3), (2, 2), 2.0, 1.0),
            r("bwd_data", 96, 96, 96, (3, 3), (1, 1), 0.8, 0.8, ours_gb_s=800.0, peer_gb_s=200.0),
            r("bwd_weight", 96, 96, 96, (3, 3), (1, 1), 1.25, 1.0, ours_gb_s=200.0, peer_gb_s=800.0),
            dict(direction="forward", C=3, K=8, G=1, filter=[7, 7], stride=[2, 2], split="heldout", status="wrong")]
    s = cb.summary(rows)
    assert s["forward/3x3"]["n"] == 2 and s["forward/3x3"]["graph_geomean"] == pytest.approx(1.0)
    assert s["forward/3x3"]["graph_min"] == 0.5 and s["forward/3x3"]["eager_min"] == 0.25
    assert s["forward/strided"]["n"] == 2 and s["forward/strided"]["wrong"] == 1   # the stem counts, wrong
    assert s["forward/7x7"]["graph_geomean"] is None and s["forward/stem"]["wrong"] == 1
    dw = s["all/depthwise"]
    assert dw["n"] == 2 and dw["graph_geomean"] == pytest.approx(1.0)
    assert dw["ours_gb_s_geomean"] == pytest.approx(400.0)
    assert dw["peer_gb_s_geomean"] == pytest.approx(400.0) and "ours_gb_s_geomean" not in s["forward/3x3"]
    assert "bwd_data/1d" not in s and s["all/all"]["n"] == 5
