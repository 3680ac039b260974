"""Sequence-length-aware FMHA selection: max_seq_q limits, padded-tile ranking, decode splits."""
import attrs
import pytest

from ck_core.plugins import get_manager
from ck_core.testing import make_fake_arch
from ck_fmha import seqtune
from ck_fmha.keys import ck_keys, ck_rank, ck_supports
from ck_fmha.problem import FmhaProblem


@pytest.fixture(scope="module")
def bwd_keys():
    arch = get_manager().arch("gfx950")
    return [k for k in ck_keys(arch, "ck", {"families": ["bwd_dq_dk_dv"]})
            if k.signature.dtype == "fp16" and k.signature.hdim_q == 64 and k.signature.mask == "no"
            and k.signature.bias == "no" and not k.signature.dropout and not k.signature.dbias]


def _bwd(sq, sk=None, mode="batch"):
    kw = dict(family="bwd_dq_dk_dv", batch=2, nhead_q=4, nhead_k=4, hdim_q=64, hdim_v=64, dtype="fp16",
              deterministic=True)
    if mode == "group":
        return FmhaProblem(mode="group", seqstart_q=(0, sq), seqstart_k=(0, sk or sq), **{**kw, "batch": 1})
    return FmhaProblem(seqlen_q=sq, seqlen_k=sk or sq, **kw)


def test_a_max_seq_q_kernel_refuses_longer_queries(bwd_keys):
    short = [k for k in bwd_keys if k.signature.max_seq_q]
    assert short, "gfx950 has max_seq_q bwd kernels"
    k = short[0]
    limit = k.signature.max_seq_q
    assert ck_supports(k.signature, _bwd(limit)) is None
    why = ck_supports(k.signature, _bwd(limit + 1, 4096))
    assert why and f"seqlen_q <= {limit}" in why
    assert ck_supports(k.signature, _bwd(4096)) is not None


def test_short_queries_rank_the_fitting_specialisation_first(bwd_keys):
    p = _bwd(24, 1000)
    ok = [k for k in bwd_keys if ck_supports(k.signature, p) is None]
    assert any(k.signature.max_seq_q for k in ok) and any(not k.signature.max_seq_q for k in ok)
    top = ck_rank(p, ok)[0].signature
    assert top.max_seq_q and top.max_seq_q >= 24
    long = _bwd(3000)
    ranked = ck_rank(long, [k for k in bwd_keys if ck_supports(k.signature, long) is None])
    assert not any(k.signature.max_seq_q for k in ranked)


def test_waste_counts_padded_rows():
    assert seqtune.waste(128, 128) == 1.0
    assert seqtune.waste(129, 128) == 2.0
    assert seqtune.waste(100, 64) == 1.3
    assert seqtune.waste(None, 64) == 1.0


def test_split_count_follows_the_archspec_and_the_kv_length():
    """The Dispatcher's split count (the only one: seqtune and the Triton configs have none of their own)."""
    from ck_fmha.heuristics import split_count

    small, big = make_fake_arch("cu32"), make_fake_arch("cu256")
    small, big = attrs.evolve(small, compute_units=32), attrs.evolve(big, compute_units=256)
    s_small, s_big = (split_count(8, 65536, a.compute_units) for a in (small, big))
    assert 1 < s_small < s_big                                           # more SMs: more splits
    assert split_count(64 * 8, 65536, big.compute_units) < s_big        # more programs: fewer splits
    assert split_count(8, 65536, big.compute_units, query_rows=4 * 64) < s_big   # query rows add programs
    assert split_count(8, 200, big.compute_units) == 1                  # too short to split
    assert split_count(132 * 4, 4096, 132) == 1                          # machine already full
    for sk in (4096, 5000, 131072):                                      # every split keeps >= 256 keys
        assert sk / split_count(1, sk, 304) >= 256
    assert split_count(1, 1 << 30, 1 << 20) == 128                       # capped


def test_one_split_count():
    import ck_fmha.backends.triton as triton_backend
    import ck_fmha.backends.triton.configs as configs

    assert not hasattr(seqtune, "split_count") and not hasattr(seqtune, "decode_splits")
    assert not hasattr(configs, "num_splits_heuristic") and not hasattr(triton_backend, "num_splits_heuristic")
