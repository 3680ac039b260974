"""Every enumerated GEMM key of every installed arch: name -> key -> name, and JSON."""
import pytest

from ck_core import KernelKey, MissingKernel, get_manager
from ck_core.registry import enumerate_keys
from ck_gemm.keys import format_name, parse_name

ARCHS = sorted(a for a, s in get_manager().archs().items())


@pytest.mark.parametrize("arch", ARCHS)
def test_every_gemm_name_round_trips(arch):
    keys = enumerate_keys("gemm", arch)
    assert keys, f"no GEMM kernels for {arch}"
    names = set()
    for key in keys:
        body = format_name(key.signature, key.algorithm)
        sig, alg = parse_name(body)
        assert (sig, alg) == (key.signature, key.algorithm), body
        names.add(body)
    assert len(names) == len(keys)  # names are identities: no two keys share one
    for key in keys[:: max(1, len(keys) // 200)]:
        assert KernelKey.from_name(key.name) == key
        assert KernelKey.from_dict(key.to_dict()) == key


@pytest.mark.parametrize("bad", ["gemm_fp16", "gemm_fp99_rcr_mem_cshuffle_intrawave_npad_1x1x1_1x1x1_1x1x1",
                                 "gemm_fp16_rcr_mem_cshuffle_intrawave_npad_1x1_1x1x1_1x1x1",
                                 "gemm_fp16_rcr_mem_cshuffle_intrawave_npad_1x1x1_1x1x1_1x1x1_zzz",
                                 "gemm_fp16_rcr_mem_cshuffle_intrawave_pq_1x1x1_1x1x1_1x1x1"])
def test_bad_names_are_clear_errors(bad):
    with pytest.raises(MissingKernel):
        parse_name(bad)


def test_name_without_arch_backend_tail():
    with pytest.raises(MissingKernel, match="<body>.<arch>.<backend>"):
        KernelKey.from_name("gemm_fp16_rcr")
