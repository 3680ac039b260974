"""The conv candidate lists come from ck_conv/tuned/ (ck_core.tuned_data), equal to the literals they
replaced; waves and shared memory are planned for the ArchSpec given."""
import hashlib

import attrs
import pytest

from ck_conv.bench import CASES, problem
from ck_conv.heuristics import TUNED_DIR, candidate_configs, extended_candidates, plan_facts
from ck_core import tuned_data
from ck_core.plugins import get_manager
from ck_core.testing import make_fake_arch

#: (count, sha256[:16] of the names) of candidate_configs(p, extended=...) before the migration
FROZEN = {
    "r50_c5_3x3_512_512_7/forward/1": (20, "b55f989d4ea1cb94"),
    "r50_c4_1x1_1024_256_14/bwd_data/1": (12, "4f29fb3287e45a9d"),
    # session 8: + the tensor-descriptor bwd_weight kernels (tuned tma) on stride-1 layers; where the
    # tuned first_tier names families, the extended list keeps only those (r3d: tma only)
    "resnext_g32_3x3_512_14/bwd_weight/1": (19, "a5752998cec3e6b9"),
    "resnext_g32_3x3_512_14/forward/1": (11, "4bbcbd4e3883154e"),
    "depthwise_3x3_144_56/forward/1": (14, "ce0a960cb181fbe5"),
    "depthwise_3x3_144_56/forward/0": (8, "0cca895d4d353c80"),
    # session 8: the depthwise bwd_weight list keeps 16x32, 32x16, 8x32 (H100 probe: the others lose)
    "depthwise_3x3_144_56/bwd_weight/1": (3, "14d50547277c8d29"),
    "r50_c2_3x3_64_64_56/bwd_weight/0": (6, "1f5daf5eaa59dc07"),
    "c3d_3x3x3_64_64_16x56x56/bwd_data/1": (12, "a695686cd1c7a209"),
    "r3d_3x3x3_256_256_8x28x28/bwd_weight/1": (3, "9af4cea2ff49f119"),
}
#: all 12 bench cases x 3 directions x (extended, classic): 640 candidates, and a digest of every list
TOTAL, ALL_DIGEST = 640, "74ccd607c28ba3de"


def _digest(names) -> str:
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]


def _lists(arch=None) -> dict:
    out = {}
    for case in CASES:
        for d in ("forward", "bwd_data", "bwd_weight"):
            for ext in (1, 0):
                names = [c.name for c in candidate_configs(problem(case, d), extended=bool(ext), arch=arch)]
                out[f"{case[0]}/{d}/{ext}"] = (len(names), _digest(names))
    return out


@pytest.fixture(scope="module")
def planned():
    return _lists()


def test_lists_equal_the_old_literals(planned):
    for k, v in FROZEN.items():
        assert planned[k] == v, k
    assert sum(n for n, _ in planned.values()) == TOTAL
    assert _digest(f"{k}:{n}:{h}" for k, (n, h) in sorted(planned.items())) == ALL_DIGEST


def test_plan_facts_come_from_the_arch(planned):
    t = tuned_data.table("conv", "generic", "plan", TUNED_DIR)
    # the tuned lists name the arch they were planned for; its ArchSpec holds the facts (issue #30)
    planned_for = get_manager().arch(t["arch"])
    assert plan_facts() == (planned_for.compute_units, planned_for.lds_bytes) == (132, 232448)
    assert set(t) == {("arch",)}
    assert "H100" in t.provenance["device"] and all(t.provenance[f] for f in tuned_data.PROVENANCE_FIELDS)
    h100 = attrs.evolve(make_fake_arch("fake_h100"), compute_units=132, lds_bytes=232448)
    assert plan_facts(h100) == (132, 232448)
    assert _lists(h100) == planned
    # fewer SMs: c4 3x3 (98 tiles of 128x128) fills two waves, so it loses the split-K / stream-K entries
    small = attrs.evolve(h100, compute_units=16)
    p = problem(CASES[5], "forward")
    assert {c.reduction for c in extended_candidates(p, h100)} > {c.reduction for c in extended_candidates(p, small)}
    # less shared memory: no candidate's A/B buffers exceed it
    tight = attrs.evolve(h100, lds_bytes=64 * 1024)
    big = [c for c in extended_candidates(p, h100) if c not in extended_candidates(p, tight)]
    assert big
