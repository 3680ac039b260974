"""ck-arch-gfx1100: the checks every arch plugin passes (``ck_core.testing``), then gfx1100's own facts."""
from ck_core.testing import check_arch_plugin
from ck_arch_gfx1100 import arch_spec, plugin
from ck_arch_gfx1100.facts import FACTS


def test_arch_plugin():
    check_arch_plugin(arch_spec(), plugin=plugin, name="gfx1100", vendor="amd", target=("hip", "gfx1100", 32),
                      warp_size=32, lds_bytes=65536, pipelines=("mem", "compv3", "compv4"), ops=("gemm",))


def test_gfx1100_facts():
    spec = arch_spec()
    assert FACTS["name"] == "gfx1100" and spec.rules == ()  # pure data: CK's GEMM rules live in ck-gemm
    assert (spec.family, spec.compute_units) == ("rdna3", 96)
    assert set(spec.dtypes) == {"fp16", "bf16", "int8"}
    assert spec.extras["gemm"]["tile_k_bytes"] == (128, 256)
