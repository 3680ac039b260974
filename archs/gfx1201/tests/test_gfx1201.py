"""ck-arch-gfx1201: the checks every arch plugin passes (``ck_core.testing``), then gfx1201's own facts."""
from ck_core.testing import check_arch_plugin
from ck_arch_gfx1201 import arch_spec, plugin
from ck_arch_gfx1201.facts import FACTS


def test_arch_plugin():
    check_arch_plugin(arch_spec(), plugin=plugin, name="gfx1201", vendor="amd", target=("hip", "gfx1201", 32),
                      warp_size=32, lds_bytes=65536, pipelines=("mem", "compv3", "compv4"), ops=("gemm",))


def test_gfx1201_facts():
    spec = arch_spec()
    assert FACTS["name"] == "gfx1201" and spec.rules == ()  # pure data: CK's GEMM rules live in ck-gemm
    assert (spec.family, spec.compute_units) == ("rdna4", 64)
    assert set(spec.dtypes) == {"fp16", "bf16", "fp8", "bf8", "int8"}
    assert spec.extras["gemm"]["tile_k_bytes"] == (128, 256)
