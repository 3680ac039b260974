"""Forward references against an independent torch implementation."""
import attrs
import numpy as np
import pytest

import torch_ref
from helpers import make_extras, make_qkv, relerr, seqstart
from ck_fmha import reference as R
from ck_fmha.masks import default_alibi_slopes, visible
from ck_fmha.philox import dropout_randval, keep_threshold, philox4x32_10
from ck_fmha.problem import FmhaProblem

TOL = 1e-10

FWD_CASES = {
    "plain": dict(batch=2, nhead_q=3, seqlen_q=5, seqlen_k=9, hdim_q=16),
    "causal_tl_gqa": dict(batch=2, nhead_q=8, nhead_k=2, seqlen_q=7, seqlen_k=5, hdim_q=24, mask="t"),
    "causal_br_empty_rows": dict(batch=1, nhead_q=2, seqlen_q=9, seqlen_k=4, hdim_q=16, mask="b"),
    "window_tl_bshd": dict(batch=2, nhead_q=2, seqlen_q=11, seqlen_k=13, hdim_q=16, mask="t:2,1",
                           layout="bshd"),
    "window_br_gqa16_vcol": dict(batch=1, nhead_q=16, nhead_k=1, seqlen_q=6, seqlen_k=10, hdim_q=16,
                                 hdim_v=24, mask="b:3,0", vlayout="c"),
    "window_br_right_only": dict(batch=1, nhead_q=2, seqlen_q=6, seqlen_k=9, hdim_q=8, mask="b:-1,2"),
    "generic": dict(batch=2, nhead_q=2, seqlen_q=8, seqlen_k=8, hdim_q=16, mask="g:3,2"),
    "bias_full": dict(batch=2, nhead_q=2, seqlen_q=5, seqlen_k=7, hdim_q=16, bias="e", mask="b"),
    "bias_bcast": dict(batch=2, nhead_q=4, nhead_k=2, seqlen_q=5, seqlen_k=7, hdim_q=16, bias="e",
                       _bias=dict(bias_heads=1, bias_batch=1)),
    "alibi_causal_vertical": dict(batch=2, nhead_q=4, seqlen_q=6, seqlen_k=9, hdim_q=16, bias="alibi",
                                  mask="b"),
    "alibi_nomask_2d": dict(batch=2, nhead_q=3, seqlen_q=7, seqlen_k=4, hdim_q=16, bias="alibi",
                            _bias=dict(slopes_2d=True)),
    "alibi_window_tl": dict(batch=1, nhead_q=2, seqlen_q=7, seqlen_k=9, hdim_q=16, bias="alibi",
                            mask="t:2,2"),
    "softcap": dict(batch=2, nhead_q=2, seqlen_q=5, seqlen_k=6, hdim_q=16, logits_soft_cap=1.5,
                    mask="t", _scale=3.0),
    "sink_logits_window": dict(batch=2, nhead_q=4, nhead_k=2, seqlen_q=9, seqlen_k=5, hdim_q=16,
                               mask="b:1,0", sink_logits=True),
    "sink_tokens": dict(batch=1, nhead_q=2, seqlen_q=12, seqlen_k=12, hdim_q=16, mask="b:2,0",
                        sink_tokens=3),
    "custom_scale_asym": dict(batch=1, nhead_q=2, seqlen_q=3, seqlen_k=5, hdim_q=192, hdim_v=128,
                              scale=0.3),
    "fp8_qscale": dict(batch=1, nhead_q=2, seqlen_q=5, seqlen_k=7, hdim_q=32, dtype="fp8", scale_q=0.5,
                       scale_k=0.25, scale_v=2.0, mask="t"),
    "batch_seqlens_k": dict(batch=3, nhead_q=2, seqlen_q=4, seqlen_k=9, seqlens_k=[9, 3, 0], hdim_q=16,
                            mask="b"),
    "group_empty_gqa_bias": dict(mode="group", batch=4, nhead_q=4, nhead_k=2, hdim_q=16, bias="e",
                                 mask="b", _lens=([3, 0, 6, 1], [5, 4, 0, 7])),
    "group_seqlens_k_window": dict(mode="group", batch=3, nhead_q=2, hdim_q=16, mask="t:1,1",
                                   _lens=([4, 5, 2], [6, 7, 3]), seqlens_k=[6, 2, 3]),
    "group_alibi_sink": dict(mode="group", batch=3, nhead_q=8, nhead_k=1, hdim_q=8, bias="alibi",
                             sink_logits=True, _lens=([5, 1, 0], [3, 8, 2])),
}


def build(case, rng, family="fwd", **over):
    kw = dict(FWD_CASES[case])
    kw.update(over)
    bias_kw = kw.pop("_bias", {})
    scale = kw.pop("_scale", 1.0)
    lens = kw.pop("_lens", None)
    kw.setdefault("dtype", "fp32")
    if lens is not None:
        kw.update(seqstart_q=seqstart(lens[0]), seqstart_k=seqstart(lens[1]))
    p = FmhaProblem(family=family, **kw)
    q, k, v = make_qkv(rng, p, scale)
    return p, q, k, v, make_extras(rng, p, **bias_kw)


@pytest.mark.parametrize("case", sorted(FWD_CASES))
def test_fwd_matches_torch(case):
    rng = np.random.default_rng(abs(hash(case)) % 2**32)
    p, q, k, v, ex = build(case, rng)
    o, lse, _ = R.fwd(p, q, k, v, **ex)
    to, tl = torch_ref.forward(p, q, k, v, bias=ex.get("bias"), slopes=ex.get("alibi_slopes"),
                               sink=ex.get("sink"))
    assert relerr(o, to) < TOL
    assert relerr(lse, tl) < TOL


def test_fully_masked_rows_give_zero_and_minus_inf():
    p = FmhaProblem(batch=1, nhead_q=1, seqlen_q=6, seqlen_k=3, hdim_q=8, dtype="fp32", mask="b")
    rng = np.random.default_rng(1)
    q, k, v = make_qkv(rng, p)
    o, lse, _ = R.fwd(p, q, k, v)
    assert np.all(o[0, 0, :3] == 0) and np.all(np.isneginf(lse[0, 0, :3]))
    assert np.all(np.isfinite(lse[0, 0, 3:]))
    # with a sink logit the same rows give o = 0 and lse = sink
    ps = attrs.evolve(p, sink_logits=True)
    o2, lse2, _ = R.fwd(ps, q, k, v, sink=np.array([0.7], np.float32))
    assert np.all(o2[0, 0, :3] == 0) and np.allclose(lse2[0, 0, :3], 0.7)


def test_mask_semantics_examples():
    # CK block_masking.hpp diagrams: seqlen 5x8, l=1/r=3 top-left (x=4, y=2)
    p = FmhaProblem(seqlen_q=5, seqlen_k=8, hdim_q=8, mask="t:1,3")
    got = visible(p, 5, 8).astype(int)
    want = np.array([[1, 1, 1, 1, 0, 0, 0, 0],
                     [1, 1, 1, 1, 1, 0, 0, 0],
                     [0, 1, 1, 1, 1, 1, 0, 0],
                     [0, 0, 1, 1, 1, 1, 1, 0],
                     [0, 0, 0, 1, 1, 1, 1, 1]])
    assert np.array_equal(got, want)
    # causal bottom-right on 5x8 == CK's x=4/y=5 picture
    pb = FmhaProblem(seqlen_q=5, seqlen_k=8, hdim_q=8, mask="b")
    assert np.array_equal(visible(pb, 5, 8).sum(1), [4, 5, 6, 7, 8])
    # generic g:y,x equals top-left window (y-1, x-1)
    pg = FmhaProblem(seqlen_q=5, seqlen_k=8, hdim_q=8, mask="g:2,4")
    assert np.array_equal(visible(pg, 5, 8), visible(p, 5, 8))


def test_alibi_slopes_match_press():
    assert np.allclose(default_alibi_slopes(8), [2 ** -(i + 1) for i in range(8)])
    s12 = default_alibi_slopes(12)
    assert len(s12) == 12 and np.allclose(s12[:8], default_alibi_slopes(8))
    assert np.allclose(s12[8:], default_alibi_slopes(16)[0::2][:4])


# ----------------------------------------------------------------- dropout
def test_philox_known_answers():
    kat = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
           ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
           ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for ctr, key, want in kat:
        got = philox4x32_10(*ctr, *key)
        assert tuple(int(x) for x in got) == want


def _drop_problem(**kw):
    base = dict(batch=2, nhead_q=2, seqlen_q=9, seqlen_k=11, hdim_q=16, dtype="fp32", p_drop=0.3,
                seed=1234, offset=77, store_randval=True, mask="b")
    base.update(kw)
    return FmhaProblem(**base)


def test_dropout_reproducible_and_seeded():
    p = _drop_problem()
    rng = np.random.default_rng(5)
    q, k, v = make_qkv(rng, p)
    a = R.fwd(p, q, k, v)
    b = R.fwd(p, q, k, v)
    assert np.array_equal(a.o, b.o) and np.array_equal(a.randval, b.randval)
    for change in (dict(seed=1235), dict(offset=78), dict(seed=1234 + 2**32)):
        c = R.fwd(attrs.evolve(p, **change), q, k, v)
        assert not np.array_equal(a.randval, c.randval)
        assert relerr(a.o, c.o) > 1e-3
    nodrop = R.fwd(attrs.evolve(p, p_drop=0.0, store_randval=False), q, k, v)
    assert np.array_equal(a.lse, nodrop.lse)  # lse is taken before dropout


def test_dropout_matches_torch_with_same_randval():
    for mode_kw in ({}, dict(mode="group", batch=3, seqlen_q=None, seqlen_k=None,
                             seqstart_q=seqstart([4, 0, 7]), seqstart_k=seqstart([6, 3, 5]))):
        p = _drop_problem(nhead_q=4, nhead_k=2, **mode_kw)
        rng = np.random.default_rng(6)
        q, k, v = make_qkv(rng, p)
        res = R.fwd(p, q, k, v)
        to, tl = torch_ref.forward(p, q, k, v, randval=res.randval)
        assert relerr(res.o, to) < TOL and relerr(res.lse, tl) < TOL


@pytest.mark.parametrize("p_drop", [0.1, 0.5, 0.8])
def test_dropout_keep_rate(p_drop):
    rv = np.stack([dropout_randval(99, 3, b, h, 4, 64, 96) for b in range(2) for h in range(4)])
    rate = np.mean(rv <= keep_threshold(p_drop))
    assert abs(rate - (keep_threshold(p_drop) + 1) / 256) < 0.01
    assert abs(rate - (1 - p_drop)) < 1 / 256 + 0.01


def test_randval_is_a_pure_function_of_coordinates():
    # group-mode randval of batch b equals the (b, h, local i, local j) stream
    p = _drop_problem(mode="group", batch=2, seqlen_q=None, seqlen_k=None, seqstart_q=[0, 3, 8],
                      seqstart_k=[0, 4, 10], mask="none")
    rng = np.random.default_rng(7)
    q, k, v = make_qkv(rng, p)
    rv = R.fwd(p, q, k, v).randval
    assert np.array_equal(rv[1, 3:8, :6], dropout_randval(1234, 77, 1, 1, 2, 5, 6))
    # a sub-block is the corresponding window of a larger block
    big = dropout_randval(5, 6, 0, 0, 1, 20, 20)
    assert np.array_equal(big[:7, :9], dropout_randval(5, 6, 0, 0, 1, 7, 9))


# ----------------------------------------------------------------- split-KV
@pytest.mark.parametrize("case", ["plain", "causal_br_empty_rows", "window_tl_bshd",
                                  "sink_logits_window", "group_empty_gqa_bias", "alibi_causal_vertical"])
@pytest.mark.parametrize("num_splits", [1, 2, 3, 16])
def test_splitkv_combine_equals_fwd(case, num_splits):
    rng = np.random.default_rng(num_splits * 31 + len(case))
    p, q, k, v, ex = build(case, rng)
    ref = R.fwd(p, q, k, v, **ex)
    ps = attrs.evolve(p, family="fwd_splitkv", num_splits=num_splits)
    acc = R.fwd_splitkv(ps, q, k, v, **ex)
    assert acc.o_acc.dtype == np.float32 and acc.lse_acc.dtype == np.float32
    if num_splits == 16 and not p.is_group:  # more splits than keys: the last ones are empty
        assert np.all(np.isneginf(acc.lse_acc[-1])) and np.all(acc.o_acc[-1] == 0)
    out = R.fwd_splitkv_combine(attrs.evolve(ps, family="fwd_splitkv_combine"), acc.o_acc, acc.lse_acc)
    assert relerr(out.o, ref.o) < 1e-5
    assert relerr(out.lse, ref.lse) < 1e-5
    one = R.attention_forward(ps, q, k, v, split_tile=2, **ex)
    assert relerr(one.o, ref.o) < 1e-5


def test_split_ranges_follow_tiles():
    assert R.split_ranges(10, 3) == [(0, 4), (4, 8), (8, 10)]
    assert R.split_ranges(10, 3, tile=4) == [(0, 4), (4, 8), (8, 10)]
    assert R.split_ranges(10, 2, tile=4) == [(0, 8), (8, 10)]
    assert R.split_ranges(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]


def test_skip_min_seqlen_q():
    rng = np.random.default_rng(8)
    p, q, k, v, ex = build("group_empty_gqa_bias", rng, skip_min_seqlen_q=1)
    assert p.skipped_batches() == [1, 3]
    got = R.fwd(p, q, k, v, **ex)
    ref = R.fwd(attrs.evolve(p, skip_min_seqlen_q=0), q, k, v, **ex)
    rows = np.arange(p.total_q)
    skipped = (rows >= 9) & (rows < 10)  # batch 3 = row 9 (batch 1 is empty)
    assert np.all(got.o[skipped] == 0) and np.all(np.isneginf(got.lse[:, skipped]))
    assert np.array_equal(got.o[~skipped], ref.o[~skipped])
