"""FMHA's two key spaces (CK's codegen rules, the Triton templates) are chosen by a key's arch and
backend: the enumeration, the legality check, supports() and the ranking agree on that choice."""
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
    assert not _first("gfx942", "numpy").body.startswith("fmha_triton_")
    assert _first("gfx942", "triton").body.startswith("fmha_triton_")
    assert _first("sm90", "numpy").body.startswith("fmha_triton_")


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
