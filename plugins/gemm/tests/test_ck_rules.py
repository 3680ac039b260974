"""CK Tile's warp-size GEMM rules (ck_gemm.ck_rules), on every installed AMD arch."""
from __future__ import annotations

import attrs
import pytest

from ck_core import get_manager
from ck_core.testing import make_fake_arch
from ck_gemm import ck_rules, keys as gemm, space

AMD_ARCHS = sorted(n for n, a in get_manager().archs().items() if a.vendor == "amd")
#: a 4-wave (wave64) / 8-wave (wave32) layout, for the rule examples
WAVES = {64: (2, 2, 1), 32: (2, 4, 1)}
#: an int8 rrr tile whose row-major B load (one byte per lane) cannot fill a wave
BAD_COVER_TILE = {64: (128, 128, 8), 32: (64, 64, 8)}


@pytest.fixture(params=AMD_ARCHS)
def spec(request):
    return get_manager().arch(request.param)


def _parse(spec, body):
    """(signature, algorithm) of ``body`` with the arch's wave layout and first warp tile of the dtype."""
    dtype = body.split("_")[1]
    w = "x".join(map(str, WAVES[spec.warp_size]))
    wt = "x".join(map(str, spec.warp_tiles[dtype][0]))
    return gemm.parse_name(f"{body}_{w}_{wt}")


def test_amd_archs_installed():
    assert AMD_ARCHS, "no AMD arch plugin is installed: the CK rule tests below ran on nothing"


def test_trait_table(spec):
    """CK builds an interwave scheduler for the mem pipeline only."""
    assert all(sched == "interwave" and pipe != "mem" for pipe, _, sched in ck_rules.UNSUPPORTED_TRAITS)
    for pipe, epi, sched in sorted(ck_rules.UNSUPPORTED_TRAITS):
        sig, alg = _parse(spec, f"gemm_fp16_rcr_{pipe}_{epi}_{sched}_npad_128x128x64")
        why = ck_rules.violation(sig, alg, spec.name, spec.warp_size)
        assert why and f"no {pipe} pipeline with the interwave scheduler" in why
    bad = _parse(spec, "gemm_fp16_rcr_compv4_cshuffle_interwave_npad_128x128x64")
    assert "interwave" in gemm.rules_violation(*bad, spec)
    ok = _parse(spec, "gemm_fp16_rcr_mem_cshuffle_interwave_npad_128x128x64")
    assert ck_rules.violation(*ok, spec.name, spec.warp_size) is None
    assert gemm.rules_violation(*ok, spec) is None


def test_load_cover(spec):
    tm, tn, tk = BAD_COVER_TILE[spec.warp_size]
    bad = _parse(spec, f"gemm_int8_rrr_compv3_default_intrawave_npad_{tm}x{tn}x{tk}")
    why = ck_rules.violation(*bad, spec.name, spec.warp_size)
    assert "B load distribution" in why and f"{spec.warp_size}-lane waves on {spec.name}" in why
    # the same tile reads B along K when B is column-major: every lane has work
    ok = _parse(spec, f"gemm_int8_rcr_compv3_default_intrawave_npad_{tm}x{tn}x{tk}")
    assert ck_rules.violation(*ok, spec.name, spec.warp_size) is None


def test_cshuffle_epilogue(spec):
    # a 192-wide C row splits into 24 vectors, which no power-of-two wave divides
    bad = _parse(spec, "gemm_fp16_rcr_compv3_cshuffle_intrawave_npad_128x192x64")
    why = gemm.rules_violation(*bad, spec)
    assert "cshuffle" in why and f"{spec.warp_size}-lane wave" in why and spec.name in why
    assert why == ck_rules.violation(*bad, spec.name, spec.warp_size)
    ok = _parse(spec, "gemm_fp16_rcr_compv3_default_intrawave_npad_128x192x64")
    assert gemm.rules_violation(*ok, spec) is None


def test_enumeration_applies_the_rules_per_layout(spec):
    """An enumerated algorithm comes in exactly the layouts that CK's rules allow for it."""
    # small and 192-wide tiles: the default tile table breaks no CK rule
    options = {"dtypes": ["int8"], "tiles_mn": [16, 32, 64, 192]}
    keys = space.enumerate_keys(spec, "numpy", options)
    unruled = space.enumerate_keys(attrs.evolve(spec, vendor="other"), "numpy", options)
    assert 0 < len(keys) < len(unruled)
    layouts = {}
    for k in keys:
        layouts.setdefault((k.signature.dtype, k.algorithm), set()).add(k.signature.layout)
    assert any(len(got) < len(gemm.LAYOUTS) for got in layouts.values())
    for (dtype, alg), got in layouts.items():
        legal = {lay for lay in gemm.LAYOUTS
                 if ck_rules.violation(gemm.GemmSignature(dtype, lay), alg, spec.name, spec.warp_size) is None}
        assert got == legal, (alg, got, legal)


def test_ck_rules_apply_to_amd_only():
    other = make_fake_arch()
    sig, alg = gemm.parse_name("gemm_fp16_rcr_compv3_cshuffle_intrawave_npad_128x192x64_2x2x1_32x32x8")
    assert gemm.rules_violation(sig, alg, other) is None
    amd = attrs.evolve(other, vendor="amd")
    assert "cshuffle" in gemm.rules_violation(sig, alg, amd)
