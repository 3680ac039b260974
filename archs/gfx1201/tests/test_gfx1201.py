"""ck-arch-gfx1201: the record, its Triton target, CK's rules, and the GEMM space the core enumerates."""
from __future__ import annotations

from importlib import metadata

import pytest

from ck_core import ArchSpec, KernelKey, PluginManager, Registry, enumerate_keys
from ck_arch_gfx1201 import arch_spec, plugin
from ck_arch_gfx1201.facts import FACTS

NAME = "gfx1201"
TARGET = ("hip", "gfx1201", 32)
WARP_SIZE = 32
LDS_BYTES = 65536
#: a 4-wave (wave64) / 8-wave (wave32) layout of this arch, for the rule examples
WAVES = (2, 4, 1)
#: an int8 rrr tile whose row-major B load (one byte per lane) cannot fill a wave
BAD_COVER_TILE = (64, 64, 8)


@pytest.fixture(scope="module")
def spec():
    return arch_spec()


@pytest.fixture(scope="module")
def gemm():
    return pytest.importorskip("ck_gemm.kernel")


@pytest.fixture(scope="module")
def mgr():
    gemm_plugin = pytest.importorskip("ck_gemm.plugin")
    return PluginManager(plugins=[gemm_plugin, plugin], autoload=False)


@pytest.fixture(scope="module")
def keys(mgr):
    return enumerate_keys("gemm", NAME, manager=mgr)


def _key(gemm, body):
    sig, alg = gemm.parse_name(body)
    return KernelKey("gemm", sig, alg, NAME, "numpy")


def test_record_is_consistent(spec):
    assert isinstance(spec, ArchSpec)
    assert (spec.name, spec.vendor, spec.warp_size, spec.lds_bytes) == (NAME, "amd", WARP_SIZE, LDS_BYTES)
    assert spec.compute_units > 0 and spec.description
    assert set(spec.warp_tiles) == set(spec.dtypes)
    for dtype, tiles in spec.warp_tiles.items():
        assert tiles and all(len(t) == 3 and min(t) > 0 for t in tiles), dtype
    assert all(len(w) == 3 and min(w) > 0 for w in spec.wave_layouts)
    assert set(spec.pipeline_lds_limit) == set(spec.pipelines) == {"mem", "compv3", "compv4"}
    assert all(0 < v <= spec.lds_bytes for v in spec.pipeline_lds_limit.values())
    assert set(spec.extras["fmha"]["hdims"]) <= set(spec.extras["fmha"]["dtypes"])
    assert spec.peak["fp16_tflops"] > 0 and spec.peak["mem_gbs"] > 0
    assert spec.summary()["name"] == NAME
    assert FACTS["name"] == NAME


def test_triton_target(spec):
    assert spec.triton_target == TARGET
    pytest.importorskip("triton")
    target = spec.gpu_target()
    assert (target.backend, target.arch, target.warp_size) == TARGET


def test_entry_point_when_installed():
    eps = [ep for ep in metadata.entry_points(group="ck_core.archs") if ep.name == NAME]
    if not eps:
        pytest.skip(f"ck-arch-{NAME} is not pip-installed here")
    assert eps[0].value == f"ck_arch_{NAME}.plugin"
    assert eps[0].dist.name == f"ck-arch-{NAME}"


def test_gemm_enumeration_is_legal(spec, gemm, keys):
    assert keys
    assert {k.signature.dtype for k in keys} == set(spec.dtypes)
    for k in keys:
        assert k.arch == NAME
        assert gemm.rules_violation(k.signature, k.algorithm, spec) is None, k.name
        assert spec.reject(k) is None, k.name


def test_registry_and_names(mgr, keys):
    reg = Registry.from_enumeration("gemm", NAME, manager=mgr, dtypes=["fp16"], layouts=["rcr"])
    assert len(reg) == sum(1 for k in keys if k.signature.dtype == "fp16" and k.signature.layout == "rcr")
    for k in keys[:: max(1, len(keys) // 200)]:
        assert KernelKey.from_name(k.name, manager=mgr) == k


def test_rule_interwave_needs_mem(spec, gemm):
    w = "x".join(map(str, WAVES))
    wt = "x".join(map(str, spec.warp_tiles["fp16"][0]))
    bad = _key(gemm, f"gemm_fp16_rcr_compv4_cshuffle_interwave_npad_128x128x64_{w}_{wt}")
    assert "interwave" in spec.reject(bad)
    ok = _key(gemm, f"gemm_fp16_rcr_mem_cshuffle_interwave_npad_128x128x64_{w}_{wt}")
    assert spec.reject(ok) is None


def test_rule_load_cover(spec, gemm):
    w = "x".join(map(str, WAVES))
    wt = "x".join(map(str, spec.warp_tiles["int8"][0]))
    tm, tn, tk = BAD_COVER_TILE
    bad = _key(gemm, f"gemm_int8_rrr_compv3_default_intrawave_npad_{tm}x{tn}x{tk}_{w}_{wt}")
    assert "B load distribution" in spec.reject(bad)
    # the same tile reads B along K when B is column-major: every lane has work
    ok = _key(gemm, f"gemm_int8_rcr_compv3_default_intrawave_npad_{tm}x{tn}x{tk}_{w}_{wt}")
    assert spec.reject(ok) is None


def test_rule_cshuffle_epilogue(spec, gemm):
    w = "x".join(map(str, WAVES))
    wt = "x".join(map(str, spec.warp_tiles["fp16"][0]))
    # a 192-wide C row splits into 24 vectors, which no power-of-two wave divides
    bad = _key(gemm, f"gemm_fp16_rcr_compv3_cshuffle_intrawave_npad_128x192x64_{w}_{wt}")
    assert "cshuffle" in spec.reject(bad)
    ok = _key(gemm, f"gemm_fp16_rcr_compv3_default_intrawave_npad_128x192x64_{w}_{wt}")
    assert spec.reject(ok) is None


def test_rules_ignore_other_ops(spec):
    class Other:
        op = "conv"

    assert spec.reject(Other()) is None
