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
