import json
import math

import attrs
import numpy as np
import pytest

from ck_core.errors import CkError, InvalidProblem, UnsupportedProblem
from ck_fmha.problem import RULES, FmhaProblem, check_tensors, expected_shapes, parse_mask_spec


def P(**kw):
    base = dict(family="fwd", batch=2, nhead_q=4, seqlen_q=5, seqlen_k=7, hdim_q=64)
    base.update(kw)
    return FmhaProblem(**base)


GROUP = dict(mode="group", seqstart_q=[0, 3, 3, 8], seqstart_k=[0, 4, 9, 9], batch=3,
             seqlen_q=None, seqlen_k=None)


# ----------------------------------------------------------------- construction
def test_defaults_resolve():
    p = P(nhead_q=8, mask="t")
    assert p.nhead_k == 8 and p.hdim_v == 64
    assert p.scale is None and p.softmax_scale == pytest.approx(1 / math.sqrt(64))
    assert (p.window_left, p.window_right) == (-1, 0) and p.is_causal
    assert p.mask_spec == "t(-1:0)"
    g = P(**GROUP)
    assert g.seqlen_q == 5 and g.seqlen_k == 5 and g.total_q == 8 and g.total_k == 9
    assert g.seqlens_q_list() == [3, 0, 5] and g.seqlens_k_list() == [4, 5, 0]


def test_scale_follows_evolve():
    p = P()
    q = attrs.evolve(p, hdim_q=128, hdim_v=128)
    assert q.softmax_scale == pytest.approx(128 ** -0.5)
    assert attrs.evolve(p, scale=0.5).softmax_scale == 0.5


def test_evolve_revalidates():
    with pytest.raises(InvalidProblem, match="R04"):
        attrs.evolve(P(), hdim_q=60)


def test_round_trip_json():
    p = FmhaProblem(family="batch_prefill", mode="group", batch=3, nhead_q=8, nhead_k=2,
                    seqstart_q=[0, 2, 2, 9], seqlens_k=[17, 0, 33], hdim_q=128, dtype="bf16",
                    mask="b", window_left=7, window_right=0, bias="alibi", p_drop=0.1, seed=2**63 + 5,
                    offset=7, lse=True, paged_kv=True, page_size=16, kv_layout="vectorized",
                    kv_lookup="sglang", sink_logits=True)
    d = json.loads(json.dumps(p.to_dict()))
    q = FmhaProblem.from_dict(d)
    assert q == p and hash(q) == hash(p)
    assert isinstance(d["seqstart_q"], list)


@pytest.mark.parametrize("spec,fields", [
    ("0", {"mask": "none"}),
    ("t", {"mask": "top_left", "window_left": -1, "window_right": 0}),
    ("b", {"mask": "bottom_right", "window_left": -1, "window_right": 0}),
    ("t:3,0", {"mask": "top_left", "window_left": 3, "window_right": 0}),
    ("b:-1,2", {"mask": "bottom_right", "window_left": -1, "window_right": 2}),
    ("xt:8", {"mask": "top_left", "window_left": 4, "window_right": 3}),
    ("xb:0", {"mask": "bottom_right", "window_left": -1, "window_right": 0}),
    ("g:4,2", {"mask": "generic", "window_left": 3, "window_right": 1}),
])
def test_mask_specs(spec, fields):
    assert parse_mask_spec(spec) == fields
    p = FmhaProblem.from_dict({"seqlen_q": 4, "mask": spec})
    for k, v in fields.items():
        assert getattr(p, k) == v


def test_from_dict_rejects_unknown_key():
    with pytest.raises(InvalidProblem, match="unknown FmhaProblem field"):
        FmhaProblem.from_dict({"seqlen_q": 3, "hdim": 64})


def test_bad_mask_spec():
    with pytest.raises(InvalidProblem, match="R16"):
        parse_mask_spec("t:3")
    with pytest.raises(InvalidProblem, match="R16"):
        P(mask="diagonal")


# ----------------------------------------------------------------- the rules
BAD = {
    "R01-family": (dict(family="fwd_magic"), InvalidProblem, "use one of"),
    "R02-fwd-dtype": (dict(dtype="int8"), InvalidProblem, "use one of"),
    "R03-bwd-dtype": (dict(family="bwd_dq_dk_dv", dtype="fp8"), UnsupportedProblem, "use one of"),
    "R04-hdim-div8": (dict(hdim_q=60), InvalidProblem, "pad the head dim to 64"),
    "R06-softcap-no-bias": (dict(logits_soft_cap=30.0, bias="alibi"), UnsupportedProblem, "drop the bias"),
    "R07-prefill-paged": (dict(family="batch_prefill", **GROUP | dict(seqstart_k=None)), InvalidProblem, "set paged_kv=True"),
    "R08-page-pow2": (dict(family="fwd_pagedkv", paged_kv=True, page_size=24, seqlens_k=[3, 4]),
                      InvalidProblem, "use 16 or 32"),
    "R09-prefill-group": (dict(family="batch_prefill", paged_kv=True, page_size=16, seqlens_k=[3, 4]),
                          InvalidProblem, "set mode='group'"),
    "R10-appendkv-batch": (dict(family="fwd_appendkv", mode="group", seqstart_q=[0, 1, 2],
                                seqstart_k=[0, 1, 2], seqlen_q=None, seqlen_k=None, seqlen_knew=1,
                                seqlens_k=[0, 0]), InvalidProblem, "set mode='batch'"),
    "R11-vlayout-row": (dict(family="fwd_splitkv", vlayout="c"), UnsupportedProblem, "set vlayout='r'"),
    "R12-pagedkv-paged": (dict(family="fwd_pagedkv"), InvalidProblem, "set paged_kv=True"),
    "R13-combine-splits": (dict(family="fwd_splitkv", num_splits=2, p_drop=0.2), UnsupportedProblem,
                           "p_drop=0"),
    "R14-group-seqstart": (dict(mode="group", seqstart_q=[0, 4, 2], seqstart_k=[0, 1, 2],
                                seqlen_q=None, seqlen_k=None), InvalidProblem, "non-decreasing"),
    "R15-gqa": (dict(nhead_q=6, nhead_k=4), InvalidProblem, "use nhead_q=4 or 8"),
    "R16-mask-window": (dict(mask="none", window_left=3), InvalidProblem, "set mask='top_left'"),
    "R17-dropout": (dict(p_drop=1.0), InvalidProblem, "must be in [0, 1)"),
    "R18-sizes": (dict(batch=0), InvalidProblem, "must be >= 1"),
    "R19-qscale": (dict(scale_q=2.0), InvalidProblem, "needs dtype='fp8'"),
    "R20-rope": (dict(family="fwd_appendkv", seqlen_knew=2, seqlens_k=[1, 2], rope="interleaved",
                      rotary_dim=7), InvalidProblem, "must be even"),
    "R21-seqlens-k": (dict(seqlens_k=[3, 9]), InvalidProblem, "raise seqlen_k"),
    "R22-prefill-layout": (dict(family="batch_prefill", **GROUP | dict(seqstart_k=None), paged_kv=True,
                                page_size=1, seqlens_k=[1, 2, 3], kv_layout="vectorized"),
                           InvalidProblem, "use kv_layout='linear'"),
    "R23-skip-min-seqlen": (dict(skip_min_seqlen_q=2), UnsupportedProblem, "use mode='group'"),
    "R24-softcap": (dict(logits_soft_cap=-1.0), InvalidProblem, "0 disables"),
    "R25-sink": (dict(sink_tokens=4), InvalidProblem, "set mask="),
    "R26-dbias": (dict(family="bwd_dq_dk_dv", dbias=True), InvalidProblem, "set bias='elementwise'"),
    "R27-fp8": (dict(dtype="fp8", scale_q=0.5, bias="alibi"), UnsupportedProblem, "use dtype='bf16'"),
}


def test_fp8_rejects_dropout_too():
    with pytest.raises(UnsupportedProblem, match=r"^\[R27-fp8\] fp8 attention with p_drop=0.1"):
        P(dtype="fp8", p_drop=0.1)


def test_every_rule_has_a_case():
    assert set(RULES) - {"R05-hdim-192-128"} == set(BAD)


@pytest.mark.parametrize("rule", sorted(BAD))
def test_rule_rejects(rule):
    kw, cls, hint = BAD[rule]
    with pytest.raises(cls) as ei:
        P(**kw)
    msg = str(ei.value)
    assert msg.startswith(f"[{rule}]"), msg
    assert hint in msg, msg
    assert isinstance(ei.value, CkError)


def test_rule_r05_is_a_warning():
    p = P(hdim_q=192, hdim_v=128, p_drop=0.1)
    assert any("R05" in w for w in p.warnings)
    assert P(hdim_q=192, hdim_v=128).warnings == ()


@pytest.mark.parametrize("kw", [
    dict(seqstart_q=[0, 3], seqstart_k=[0, 3, 5]),        # wrong length
    dict(seqstart_q=[1, 3, 5], seqstart_k=[0, 3, 5]),     # does not start at 0
    dict(seqstart_q=[0, 3, 5], seqstart_k=[0, 6, 5]),     # k decreasing
])
def test_seqstart_rules(kw):
    with pytest.raises(InvalidProblem, match="R14"):
        P(mode="group", batch=2, seqlen_q=None, seqlen_k=None, **kw)


def test_valid_feature_problems():
    # a selection of legal, feature-rich problems builds without error
    FmhaProblem(family="fwd_appendkv", batch=2, nhead_q=8, nhead_k=1, seqlen_knew=3, seqlens_k=[0, 5],
                seqlen_k=16, rope="half_rotated", rotary_dim=32, hdim_q=64)
    FmhaProblem(family="fwd", hdim_q=192, hdim_v=128, seqlen_q=3, dtype="fp8", scale_q=0.5, scale_k=2,
                scale_v=0.25)
    FmhaProblem(family="bwd_dq_dk_dv", seqlen_q=3, bias="e", dbias=True, deterministic=True, p_drop=0.3)
    FmhaProblem(family="fwd_splitkv", num_splits=4, seqlen_q=1, seqlen_k=100, mask="b:32,0", sink_tokens=4)
    FmhaProblem(family="batch_prefill", mode="group", batch=1, seqstart_q=[0, 4], seqlens_k=[2000],
                paged_kv=True, page_size=1024, kv_layout="vectorized", kv_lookup="sglang")


# ----------------------------------------------------------------- tensors
def _arr(shape, dtype=np.float16):
    return np.zeros(shape, dtype=dtype)


def test_check_tensors_accepts_good_shapes():
    p = P(nhead_q=4, nhead_k=2, hdim_v=32, bias="e", lse=True)
    check_tensors(p, q=_arr((2, 4, 5, 64)), k=_arr((2, 2, 7, 64)), v=_arr((2, 2, 7, 32)),
                  o=_arr((2, 4, 5, 32)), lse=_arr((2, 4, 5), np.float32), bias=_arr((1, 4, 5, 7)))
    pb = attrs.evolve(p, layout="bshd")
    check_tensors(pb, q=_arr((2, 5, 4, 64)), k=_arr((2, 7, 2, 64)), v=_arr((2, 7, 2, 32)))
    g = P(**GROUP)
    check_tensors(g, q=_arr((8, 4, 64)), k=_arr((9, 4, 64)), lse=_arr((4, 8), np.float32))


def test_check_tensors_names_tensor_expected_actual():
    p = P()
    with pytest.raises(InvalidProblem) as ei:
        check_tensors(p, q=_arr((2, 4, 5, 64)), k=_arr((2, 4, 6, 64)))
    msg = str(ei.value)
    assert "'k'" in msg and "(2, 4, 6, 64)" in msg and "(2, 4, 7, 64)" in msg


def test_check_tensors_dtype():
    with pytest.raises(InvalidProblem, match=r"'q' has dtype float32; expected float16"):
        check_tensors(P(), q=_arr((2, 4, 5, 64), np.float32))
    with pytest.raises(InvalidProblem, match="'randval' has dtype"):
        check_tensors(P(p_drop=0.2), randval=_arr((2, 4, 5, 7), np.int32))
    with pytest.raises(InvalidProblem, match="'block_table' has dtype"):
        check_tensors(P(family="fwd_pagedkv", paged_kv=True, page_size=4, seqlens_k=[3, 5]),
                      block_table=_arr((2, 2), np.float32))


def test_check_tensors_group_shape_mismatch():
    g = P(**GROUP)
    with pytest.raises(InvalidProblem, match=r"'q' has shape \(9, 4, 64\); expected \(8, 4, 64\)"):
        check_tensors(g, q=_arr((9, 4, 64)))


def test_check_tensors_unknown_name():
    with pytest.raises(InvalidProblem, match="not read or written"):
        check_tensors(P(), knew=_arr((1,)))


def test_check_paged_tables():
    p = FmhaProblem(family="fwd_pagedkv", batch=2, nhead_q=2, seqlen_q=3, seqlens_k=[5, 9],
                    paged_kv=True, page_size=4, hdim_q=16)
    kc = _arr((6, 2, 4, 16))
    check_tensors(p, k_cache=kc, v_cache=kc, block_table=np.array([[0, 1, 9], [2, 3, 4]], np.int32))
    with pytest.raises(InvalidProblem, match="outside"):
        check_tensors(p, k_cache=kc, block_table=np.array([[0, 7, 0], [2, 3, 4]], np.int32))
    with pytest.raises(InvalidProblem, match="at least 3 columns"):
        check_tensors(p, k_cache=kc, block_table=np.array([[0, 1], [2, 3]], np.int32))
    s = FmhaProblem(family="batch_prefill", mode="group", batch=2, nhead_q=2, seqstart_q=[0, 1, 3],
                    seqlens_k=[5, 9], paged_kv=True, page_size=4, hdim_q=16, kv_lookup="sglang")
    kc2 = _arr((6, 4, 2, 16))
    ok = dict(kv_indptr=np.array([0, 2, 5], np.int32), kv_page_indices=np.arange(5, dtype=np.int32),
              kv_last_page_lens=np.array([1, 1], np.int32))
    check_tensors(s, k_cache=kc2, v_cache=kc2, **ok)
    with pytest.raises(InvalidProblem, match="holds 6 keys"):
        check_tensors(s, k_cache=kc2, **(ok | dict(kv_last_page_lens=np.array([2, 1], np.int32))))


def test_expected_shapes_cover_families():
    p = FmhaProblem(family="fwd_splitkv", batch=2, nhead_q=4, seqlen_q=3, seqlen_k=10, num_splits=3,
                    hdim_q=32)
    sh = expected_shapes(p)
    assert sh["o_acc"] == (3, 2, 4, 3, 32) and sh["lse_acc"] == (3, 2, 4, 3)
    v = FmhaProblem(family="batch_prefill", mode="group", batch=1, seqstart_q=[0, 4], seqlens_k=[64],
                    paged_kv=True, page_size=16, kv_layout="vectorized", hdim_q=64, dtype="fp16")
    sh = expected_shapes(v, k_cache=np.zeros((5, 1, 8, 16, 8)))
    assert sh["k_cache"] == (5, 1, 8, 16, 8) and sh["v_cache"] == (5, 1, 2, 64, 8)
