"""Backward references (three stages) against torch autograd."""
import attrs
import numpy as np
import pytest

import torch_ref
from helpers import make_extras, make_qkv, rand, relerr, seqstart
from ck_fmha import reference as R
from ck_fmha.problem import FmhaProblem, expected_shapes

TOL = 1e-6  # dq passes through float32 dq_acc and the fp32 convert; dk/dv are float64

BWD_CASES = {
    "plain": dict(batch=2, nhead_q=3, seqlen_q=5, seqlen_k=9, hdim_q=16),
    "causal_br_gqa_empty_rows": dict(batch=2, nhead_q=8, nhead_k=2, seqlen_q=9, seqlen_k=6, hdim_q=16,
                                     mask="b"),
    "window_tl_bshd": dict(batch=2, nhead_q=2, seqlen_q=11, seqlen_k=7, hdim_q=24, hdim_v=16,
                           mask="t:2,1", layout="bshd"),
    "bias_full_dbias": dict(batch=2, nhead_q=2, seqlen_q=5, seqlen_k=7, hdim_q=16, bias="e", dbias=True,
                            mask="t"),
    "bias_bcast_dbias": dict(batch=3, nhead_q=4, nhead_k=1, seqlen_q=6, seqlen_k=5, hdim_q=8, bias="e",
                             dbias=True, _bias=dict(bias_heads=1, bias_batch=1)),
    "alibi": dict(batch=2, nhead_q=4, seqlen_q=7, seqlen_k=7, hdim_q=16, bias="alibi", mask="b:3,1"),
    "dropout": dict(batch=2, nhead_q=4, nhead_k=2, seqlen_q=9, seqlen_k=10, hdim_q=16, p_drop=0.25,
                    seed=42, offset=9, store_randval=True, mask="b"),
    "softcap": dict(batch=1, nhead_q=2, seqlen_q=6, seqlen_k=9, hdim_q=16, logits_soft_cap=2.0,
                    _scale=2.5),
    "sink_tokens": dict(batch=1, nhead_q=2, seqlen_q=10, seqlen_k=10, hdim_q=8, mask="b:1,0", sink_tokens=2),
    "group_empty_gqa16_bias": dict(mode="group", batch=4, nhead_q=16, nhead_k=1, hdim_q=8, bias="e",
                                   dbias=True, mask="b", _lens=([4, 0, 7, 3], [6, 5, 0, 3])),
    "group_dropout_window": dict(mode="group", batch=3, nhead_q=2, hdim_q=16, p_drop=0.4, seed=3,
                                 store_randval=True, mask="t:3,0", _lens=([5, 2, 0], [5, 6, 1])),
    "group_deterministic": dict(mode="group", batch=2, nhead_q=2, hdim_q=16, deterministic=True,
                                mask="t", _lens=([7, 9], [9, 11])),
}


def build(case, rng, **over):
    kw = dict(BWD_CASES[case])
    kw.update(over)
    bias_kw = kw.pop("_bias", {})
    scale = kw.pop("_scale", 1.0)
    lens = kw.pop("_lens", None)
    kw.setdefault("dtype", "fp32")
    if lens is not None:
        kw.update(seqstart_q=seqstart(lens[0]), seqstart_k=seqstart(lens[1]))
    p = FmhaProblem(family="bwd_dq_dk_dv", **kw)
    q, k, v = make_qkv(rng, p, scale)
    do = rand(rng, expected_shapes(p)["do"])
    return p, q, k, v, do, make_extras(rng, p, **bias_kw)


@pytest.mark.parametrize("case", sorted(BWD_CASES))
def test_bwd_three_stages_match_autograd(case):
    rng = np.random.default_rng(len(case) * 1009 + 7)
    p, q, k, v, do, ex = build(case, rng)
    fw = R.fwd(p, q, k, v, **ex)
    d = R.bwd_dot_do_o(attrs.evolve(p, family="bwd_dot_do_o"), fw.o, do)
    assert d.dtype == np.float32 and d.shape == fw.lse.shape
    main = R.bwd_dq_dk_dv(p, q, k, v, fw.lse, do, d, kn0=4, **ex)
    assert main.dq.dtype == np.float32 and main.dq.shape[1:] == np.shape(q)
    dq = R.bwd_convert_dq(attrs.evolve(p, family="bwd_convert_dq"), main.dq)
    tdq, tdk, tdv, tdb = torch_ref.backward(p, q, k, v, do, bias=ex.get("bias"),
                                           slopes=ex.get("alibi_slopes"), randval=fw.randval)
    assert relerr(dq, tdq) < TOL
    assert relerr(main.dk, tdk) < TOL  # through the float32 D of bwd_dot_do_o
    assert relerr(main.dv, tdv) < 1e-10
    if p.dbias:
        assert main.dbias.shape == np.shape(ex["bias"])
        assert relerr(main.dbias, tdb) < TOL
    one = R.attention_backward(p, q, k, v, fw.o, fw.lse, do, **ex)
    assert np.array_equal(one.dk, main.dk) and relerr(one.dq, tdq) < TOL


def test_dot_do_o_matches_torch_rowsum():
    rng = np.random.default_rng(11)
    p, q, k, v, do, ex = build("window_tl_bshd", rng)
    o = rand(rng, np.shape(do))
    d = R.bwd_dot_do_o(p, o, do)
    want = (torch_ref.T(o) * torch_ref.T(do)).sum(-1).permute(0, 2, 1).numpy()  # bshd -> [B,H,S]
    assert relerr(d, want) < 1e-6


@pytest.mark.parametrize("case", ["plain", "group_deterministic", "causal_br_gqa_empty_rows"])
def test_deterministic_only_changes_accumulation(case):
    rng = np.random.default_rng(21)
    p, q, k, v, do, ex = build(case, rng)
    fw = R.fwd(p, q, k, v, **ex)
    d = R.bwd_dot_do_o(p, fw.o, do)
    det = attrs.evolve(p, deterministic=True)
    nondet = attrs.evolve(p, deterministic=False)
    a = R.bwd_dq_dk_dv(det, q, k, v, fw.lse, do, d, kn0=4, **ex)
    b = R.bwd_dq_dk_dv(nondet, q, k, v, fw.lse, do, d, kn0=4, **ex)
    assert a.dq.shape[0] == -(-max(p.seqlens_k_list()) // 4) and b.dq.shape[0] == 1
    assert np.array_equal(a.dk, b.dk) and np.array_equal(a.dv, b.dv)
    assert relerr(R.bwd_convert_dq(det, a.dq), R.bwd_convert_dq(nondet, b.dq)) < 1e-6
    # same inputs, same bits
    a2 = R.bwd_dq_dk_dv(det, q, k, v, fw.lse, do, d, kn0=4, **ex)
    assert np.array_equal(a.dq, a2.dq)


def test_convert_dq_rounds_to_dtype():
    p = FmhaProblem(family="bwd_convert_dq", batch=1, nhead_q=1, seqlen_q=3, hdim_q=8, dtype="fp16",
                    deterministic=True)
    acc = np.random.default_rng(3).standard_normal((3, 1, 1, 3, 8)).astype(np.float32)
    dq = R.bwd_convert_dq(p, acc)
    assert dq.dtype == np.float16
    assert np.array_equal(dq, ((acc[0] + acc[1]) + acc[2]).astype(np.float16))
    bf = R.bwd_convert_dq(attrs.evolve(p, dtype="bf16"), acc)
    assert bf.dtype == np.float32 and np.allclose(bf, acc.sum(0), rtol=1e-2)


def test_backward_requires_bias_tensor():
    from ck_core.errors import InvalidProblem

    rng = np.random.default_rng(2)
    p, q, k, v, do, ex = build("bias_full_dbias", rng)
    fw = R.fwd(p, q, k, v, **ex)
    with pytest.raises(InvalidProblem, match="pass bias="):
        R.bwd_dq_dk_dv(p, q, k, v, fw.lse, do, R.bwd_dot_do_o(p, fw.o, do))
