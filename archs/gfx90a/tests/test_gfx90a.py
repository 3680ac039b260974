"""ck-arch-gfx90a: the checks every arch plugin passes (``ck_core.testing``), then gfx90a's own facts."""
from ck_core.testing import check_arch_plugin
from ck_arch_gfx90a import arch_spec, plugin
from ck_arch_gfx90a.facts import FACTS


def test_arch_plugin():
    check_arch_plugin(arch_spec(), plugin=plugin, name="gfx90a", vendor="amd", target=("hip", "gfx90a", 64),
                      warp_size=64, lds_bytes=65536, pipelines=("mem", "compv3", "compv4"), ops=("gemm",))


def test_gfx90a_facts():
    spec = arch_spec()
    assert FACTS["name"] == "gfx90a" and spec.rules == ()  # pure data: CK's GEMM rules live in ck-gemm
    assert (spec.family, spec.compute_units) == ("cdna2", 110)
    assert set(spec.dtypes) == {"fp16", "bf16", "fp32", "int8"}
    assert spec.extras["fmha"]["factory"] == "gfx9" and not spec.extras["fmha"]["supports_trload"]
