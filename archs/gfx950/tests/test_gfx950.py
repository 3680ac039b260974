"""ck-arch-gfx950: the checks every arch plugin passes (``ck_core.testing``), then gfx950's own facts."""
from ck_core.testing import check_arch_plugin
from ck_arch_gfx950 import arch_spec, plugin
from ck_arch_gfx950.facts import FACTS


def test_arch_plugin():
    check_arch_plugin(arch_spec(), plugin=plugin, name="gfx950", vendor="amd", target=("hip", "gfx950", 64),
                      warp_size=64, lds_bytes=163840, pipelines=("mem", "compv3", "compv4"), ops=("gemm",))


def test_gfx950_facts():
    spec = arch_spec()
    assert FACTS["name"] == "gfx950" and spec.rules == ()  # pure data: CK's GEMM rules live in ck-gemm
    assert (spec.family, spec.compute_units) == ("cdna4", 256)
    assert set(spec.dtypes) == {"fp16", "bf16", "fp32", "fp8", "bf8", "int8"}
    assert spec.extras["fmha"]["supports_trload"] and spec.extras["fmha"]["supports_v3"]
