"""A measured winner's epilogue twins join the triton space only where they fit shared memory (session 11: the
sm90 128x256x64 4-stage C-descriptor winner with one fused D tensor was in the registry, needed more than the
232,448 B an H100/H200 block may have, failed to load on the first call of a linear layer and fell back)."""
from ck_core.key import KernelKey
from ck_core.plugins import get_manager

from ck_gemm import heuristics

WINNER = "gemm_bf16_rcr_multistage_cshuffle_intrawave_pmnk_128x256x64_8x1x1_16x256x16_s4_vtmaperscs_g16_e2.sm90.triton"
D_TWIN = WINNER.replace("_s4_", "_d1add_s4_")


def test_the_d_twin_of_a_winner_at_the_limit_is_not_legal_and_not_enumerated():
    arch = get_manager().arch("sm90")
    assert heuristics.legal(KernelKey.from_name(WINNER), arch) is None
    why = heuristics.legal(KernelKey.from_name(D_TWIN), arch)
    assert why and "shared memory" in why
    names = {k.name for k in heuristics.enumerate_keys(arch, "triton", {"dtypes": ["bf16"], "layouts": ["rcr"]})}
    assert WINNER in names and D_TWIN not in names
