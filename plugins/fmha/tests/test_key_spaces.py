"""FMHA's two key spaces (CK's codegen rules, the Triton templates) are chosen by a key's arch and
backend: the enumeration, the legality check, supports() and the ranking agree on that choice."""
import re

import pytest

from ck_core.key import KernelKey
from ck_core.plugins import get_manager
from ck_fmha import plugin as P
from ck_fmha.problem import FmhaProblem


def _first(arch, backend):
    mgr = get_manager()
    keys = P.enumerate_keys(mgr.arch(arch), backend, {"families": ["fwd"]} if backend != "triton" else {})
    return keys[0]


def test_the_space_follows_arch_and_backend():
    assert P._space("gfx942", "numpy") is P._CkSpace
    assert P._space("gfx942", "triton") is not P._CkSpace
    assert P._space("sm90", "numpy") is not P._CkSpace          # no CK tables for sm90
    assert hasattr(_first("gfx942", "numpy").signature, "ck_name")
    assert not hasattr(_first("gfx942", "triton").signature, "ck_name")
    assert not hasattr(_first("sm90", "numpy").signature, "ck_name")


def test_a_key_of_the_other_space_is_not_legal():
    mgr = get_manager()
    t = _first("sm90", "triton")
    stray = KernelKey("fmha", t.signature, t.algorithm, "gfx942", "numpy")   # Triton key where CK rules apply
    why = P.legal(stray, mgr.arch("gfx942"))
    assert why and "CK-rule" in why
    assert P.legal(_first("gfx942", "numpy"), mgr.arch("gfx942")) is None


def test_supports_and_ranking_follow_the_space():
    mgr = get_manager()
    p = FmhaProblem(family="fwd", batch=1, nhead_q=2, seqlen_q=64, seqlen_k=64, hdim_q=64, dtype="fp16", lse=True)
    for arch, backend in (("gfx942", "numpy"), ("sm90", "triton")):
        ks = [k for k in P.enumerate_keys(mgr.arch(arch), backend, {"families": ["fwd"]} if backend != "triton"
                                           else {}) if P.supports(k, p) is None]
        assert ks, (arch, backend)
        ranked = P.heuristic(p, ks[:50], mgr.arch(arch))
        assert sorted(k.name for k in ranked) == sorted(k.name for k in ks[:50])
    assert P.heuristic(p, [], mgr.arch("sm90")) == []


@pytest.mark.parametrize("arch,backend", [("gfx942", "numpy"), ("gfx950", "ck"), ("gfx1201", "numpy"),
                                          ("sm90", "triton"), ("gfx942", "triton"), ("sm90", "numpy")])
def test_names_follow_the_one_grammar_and_parse_back(arch, backend):
    """``fmha_<family>_<fields>.<arch>.<backend>``: tokens joined by ``_``, no dot, arch or backend in
    the body; every name parses back to its key (the arch comes from the tail)."""
    mgr = get_manager()
    opts = {} if backend == "triton" or arch == "sm90" else {"families": ["fwd", "bwd_dq_dk_dv", "batch_prefill",
                                                                          "fwd_splitkv", "fwd_appendkv"]}
    keys = P.enumerate_keys(mgr.arch(arch), backend, opts)
    assert keys
    for k in keys[::max(1, len(keys) // 400)]:
        body = k.body
        assert re.fullmatch(r"fmha_[a-z0-9_x+-]+", body), body
        assert "." not in body and arch not in body and backend not in body.split("_"), body
        assert KernelKey.from_name(k.name) == k


def test_the_old_triton_spelling_still_parses():
    k = KernelKey.from_name("fmha_triton_fwd_fp16_d128x128_m128n64_w4_s3_ptr.sm90.triton")
    assert k.name == "fmha_fwd_fp16_d128x128_m128n64_w4_s3_ptr.sm90.triton"
