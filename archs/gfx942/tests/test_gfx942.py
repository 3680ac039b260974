"""ck-arch-gfx942: the checks every arch plugin passes (``ck_core.testing``), then gfx942's own facts."""
from ck_core.testing import check_arch_plugin
from ck_arch_gfx942 import arch_spec, plugin
from ck_arch_gfx942.facts import FACTS


def test_arch_plugin():
    check_arch_plugin(arch_spec(), plugin=plugin, name="gfx942", vendor="amd", target=("hip", "gfx942", 64),
                      warp_size=64, lds_bytes=65536, pipelines=("mem", "compv3", "compv4"), ops=("gemm",))


def test_gfx942_facts():
    spec = arch_spec()
    assert FACTS["name"] == "gfx942" and spec.rules == ()  # pure data: CK's GEMM rules live in ck-gemm
    assert (spec.family, spec.compute_units) == ("cdna3", 304)
    assert set(spec.dtypes) == {"fp16", "bf16", "fp32", "fp8", "bf8", "int8"}
    assert spec.extras["fmha"]["factory"] == "gfx9" and not spec.extras["fmha"]["supports_v3"]
