"""ck-arch-sm90: the record, its Triton target, Hopper's rules, and the GEMM space the core enumerates."""
from __future__ import annotations

import ast
from importlib import metadata
from pathlib import Path

import pytest

from ck_core import ArchSpec, KernelKey, PluginManager, Registry, enumerate_keys
from ck_arch_sm90 import arch_spec, plugin
from ck_arch_sm90.facts import SMEM_PER_BLOCK
from ck_arch_sm90.rules import accumulator_registers, warpgroup_layout, wgmma_n, wgmma_shape

NAME = "sm90"
PACKAGE = Path(__file__).resolve().parents[1] / "ck_arch_sm90"


@pytest.fixture(scope="module")
def spec():
    return arch_spec()


@pytest.fixture(scope="module")
def gemm():
    return pytest.importorskip("ck_gemm.keys")


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
    assert (spec.name, spec.vendor, spec.family) == ("sm90", "nvidia", "hopper")
    assert (spec.warp_size, spec.compute_units, spec.lds_bytes) == (32, 132, 232448) == (32, 132, SMEM_PER_BLOCK)
    assert set(spec.dtypes) == {"fp16", "bf16", "fp32", "fp8", "bf8", "int8"}
    assert set(spec.warp_tiles) == set(spec.dtypes)
    assert spec.warp_tiles["fp16"][0] == (16, 8, 16)        # mma.sync m16n8k16
    assert (16, 256, 16) in spec.warp_tiles["bf16"]         # wgmma m64n256k16, one warp's share
    assert (16, 128, 32) in spec.warp_tiles["fp8"]          # wgmma m64n128k32 (e4m3)
    assert (16, 8, 8) in spec.warp_tiles["fp32"]            # mma.sync m16n8k8 tf32
    assert max(t[1] for t in spec.warp_tiles["int8"]) <= 224
    assert {w[0] * w[1] * w[2] for w in spec.wave_layouts} == {4, 8}
    assert spec.pipeline_lds_limit == {p: 232448 for p in spec.pipelines}
    assert spec.peak["bf16_tflops"] == pytest.approx(989.4) and spec.peak["mem_gbs"] == pytest.approx(3350)


def test_triton_target(spec):
    assert spec.triton_target == ("cuda", 90, 32)
    pytest.importorskip("triton")
    target = spec.gpu_target()
    assert (target.backend, target.arch, target.warp_size) == ("cuda", 90, 32)


def test_entry_point_when_installed():
    eps = [ep for ep in metadata.entry_points(group="ck_core.archs") if ep.name == NAME]
    if not eps:
        pytest.skip("ck-arch-sm90 is not pip-installed here")
    assert eps[0].value == "ck_arch_sm90.plugin"
    assert eps[0].dist.name == "ck-arch-sm90"


def test_uses_only_the_public_core_api():
    """A third-party plugin: ``from ck_core import ...`` of exported names, nothing deeper."""
    import ck_core

    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ck_"):
                assert node.module == "ck_core", f"{path.name} imports {node.module}"
                assert all(a.name in ck_core.__all__ for a in node.names), path.name
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("ck_") for a in node.names), path.name


def test_gemm_enumeration_is_legal_and_small(spec, gemm, keys):
    assert 500 <= len(keys) <= 4000, len(keys)
    assert {k.signature.dtype for k in keys} == set(spec.dtypes)
    for k in keys:
        assert gemm.rules_violation(k.signature, k.algorithm, spec) is None, k.name
        assert spec.reject(k) is None, k.name
        a = k.algorithm
        assert a.tile_m * a.tile_n // (a.num_warps * 32) <= 128
        assert gemm.lds_bytes(k.signature, a, nvidia=True) <= SMEM_PER_BLOCK
    # the rules leave one (wave layout, warp tile) per tile and warp count: no two keys
    # describe the same kernel
    seen = {}
    for k in keys:
        a = k.algorithm
        ident = (k.signature, a.tile_m, a.tile_n, a.tile_k, a.num_warps, a.stages, a.variant, a.split_k)
        assert ident not in seen, (k.name, seen.get(ident))
        seen[ident] = k.name


def test_registry_and_names(mgr, keys):
    reg = Registry.from_enumeration("gemm", NAME, manager=mgr, dtypes=["bf16"], layouts=["rcr"])
    assert len(reg) == sum(1 for k in keys if k.signature.dtype == "bf16" and k.signature.layout == "rcr")
    for k in keys[::7]:
        assert KernelKey.from_name(k.name, manager=mgr) == k


def test_triton_wgmma_layout():
    # Triton's warpsPerTileV3: warpgroups stack along M while the tile has rows for them
    assert warpgroup_layout(64, 4) == (4, 1)
    assert warpgroup_layout(128, 8) == (8, 1)
    assert warpgroup_layout(64, 8) == (4, 2)
    # mmaVersionToInstrShape: the widest N dividing the warpgroup's share of tile N
    assert wgmma_n("fp16", 128, 256, 8) == 256
    assert wgmma_n("fp16", 64, 256, 8) == 128
    assert wgmma_n("int8", 128, 256, 8) == 128   # s8 wgmma stops at n224


def test_rule_wgmma_shape(spec, gemm):
    ok = _key(gemm, "gemm_bf16_rcr_multistage_cshuffle_intrawave_pmnk_128x256x64_8x1x1_16x256x16_s3")
    assert spec.reject(ok) is None
    side_by_side = _key(gemm, "gemm_bf16_rcr_multistage_cshuffle_intrawave_pmnk_128x256x64_4x2x1_16x128x16_s3")
    assert "stack along M" in wgmma_shape(side_by_side)
    narrow = _key(gemm, "gemm_bf16_rcr_multistage_cshuffle_intrawave_pmnk_128x256x64_8x1x1_16x64x16_s3")
    assert "m64n256" in wgmma_shape(narrow)
    mma_sync = _key(gemm, "gemm_bf16_rcr_multistage_cshuffle_intrawave_pmnk_128x128x64_4x1x1_16x8x16_s3")
    assert "issues wgmma" in wgmma_shape(mma_sync)
    # below a warpgroup's 64 rows Hopper falls back to mma.sync
    small = _key(gemm, "gemm_bf16_rcr_multistage_cshuffle_intrawave_pmnk_32x64x64_2x2x1_16x8x16_s3")
    assert wgmma_shape(small) is None
    small_wgmma = _key(gemm, "gemm_bf16_rcr_multistage_cshuffle_intrawave_pmnk_32x64x64_4x1x1_16x64x16_s3")
    assert "multiple of 64" in wgmma_shape(small_wgmma)


def test_rule_accumulator_registers(spec, gemm):
    big = _key(gemm, "gemm_fp16_rcr_multistage_cshuffle_intrawave_pmnk_256x256x64_8x1x1_16x256x16_s3")
    assert "accumulator registers" in accumulator_registers(big)
    assert "accumulator registers" in spec.reject(big)
    fits = _key(gemm, "gemm_fp16_rcr_multistage_cshuffle_intrawave_pmnk_128x256x64_8x1x1_16x256x16_s3")
    assert accumulator_registers(fits) is None


def test_rules_ignore_other_ops(spec):
    class Other:
        op = "conv"

    assert spec.reject(Other()) is None
