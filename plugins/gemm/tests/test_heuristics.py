"""The GEMM heuristic's rules on the sm90 registry (what decides outside the ranker's domain)."""
import attrs
import pytest

from ck_core import Registry
from ck_core.plugins import get_manager
from ck_gemm import heuristics
from ck_gemm.problem import GemmProblem

pytest.importorskip("triton")


def _cands(p):
    reg = Registry.from_enumeration("gemm", "sm90", "triton", dtypes=[p.dtype], layouts=[p.layout])
    return reg.candidates(p, backend="triton")


def test_a_split_without_k_steps_does_not_fill_the_machine():
    # K = 10: one K tile, so a split-K key launches as many working programs as its twin, plus a
    # second launch (the 16x64x256 sk2 key won here and ran 0.01-0.09x cuBLAS)
    arch = get_manager().arch("sm90")
    p = GemmProblem(m=104, n=3, k=10, dtype="bf16", layout="rrr")
    first = heuristics.heuristic(p, _cands(p), arch)[0]
    assert first.algorithm.split_k == 1, first.name


@pytest.mark.parametrize("m,n,k", [(18, 57344, 8192), (21, 32000, 4096), (29, 128256, 8192)])
def test_skinny_problems_stream_b_once_when_it_does_not_fit_l2(m, n, k):
    arch = get_manager().arch("sm90")
    p = GemmProblem(m=m, n=n, k=k, dtype="bf16", layout="rcr")
    cands = _cands(p)
    first = heuristics.heuristic(p, cands, arch)[0]
    # one M tile (B read once from HBM), no split-K of tiles past 64x64, no spilling pointer kernel
    assert first.algorithm.tile_m >= m and first.algorithm.tile_m <= 64, first.name
    assert not (first.algorithm.split_k > 1 and first.algorithm.tile_m * first.algorithm.tile_n > 64 * 64)
    # an arch without an L2 fact keeps the old behaviour: the tuned 16-row key (nearest row) first
    no_l2 = attrs.evolve(arch, extras={k: v for k, v in arch.extras.items() if k != "memory"})
    assert heuristics.heuristic(p, cands, no_l2)[0].algorithm.tile_m < m


def test_b_that_fits_l2_keeps_the_tuned_short_tiles():
    # 22 x 8192 x 3584 bf16: B is 56 MiB (> L2 50 MiB) but 20 x 4096 x 4096 (32 MiB) fits: there the
    # tuned 16-row key stays first (the oracle's best there is a 16-row tile too)
    arch = get_manager().arch("sm90")
    p = GemmProblem(m=20, n=4096, k=4096, dtype="bf16", layout="rcr")
    assert heuristics.heuristic(p, _cands(p), arch)[0].algorithm.tile_m == 16


def test_a_wide_k_pointer_tile_on_unaligned_k_goes_last():
    # 92 x 7 x 1413 fp16: K rows of 2826 B (not 16-byte aligned): the 16x64x256 pointer key ran
    # 103 us there on the H100, its 16x64x128 twin 12 us; it must not be first, even when tuned
    arch = get_manager().arch("sm90")
    p = GemmProblem(m=92, n=7, k=1413, dtype="fp16", layout="rcr")
    ranked = heuristics.heuristic(p, _cands(p), arch)
    assert ranked[0].algorithm.tile_k * 2 <= 256, ranked[0].name
    wide = [i for i, k in enumerate(ranked) if k.algorithm.tile_k == 256]
    assert wide and min(wide) > len(ranked) // 2
    # K aligned: the same key is an ordinary candidate again
    q = GemmProblem(m=16, n=4096, k=4096, dtype="bf16", layout="rcr")
    assert heuristics.heuristic(q, _cands(q), arch)[0].algorithm.tile_k == 256
