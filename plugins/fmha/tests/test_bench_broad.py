"""The broad FMHA benchmark suite: its cases cover what it claims, and its reference is right."""
import math

import pytest

torch = pytest.importorskip("torch")

from ck_fmha import bench_broad as bb  # noqa: E402


def test_cases_are_deterministic_and_cover_the_distributions():
    a, b = bb.cases(), bb.cases()
    assert a == b
    attn = [c for c in a if c["kind"] == "attn"]
    assert {c["d"] for c in attn} == set(bb.HDIMS)
    assert {c["mask"] for c in attn} == set(bb.MASKS)
    assert any(c["hk"] == 1 for c in attn) and any(c["hk"] == c["hq"] for c in attn)
    assert sum(c["s"] % 128 != 0 for c in attn) > len(attn) // 2
    assert min(c["s"] for c in attn) >= 100 and max(c["s"] for c in attn) <= 32768
    assert {c["kind"] for c in a} == {"attn", "varlen", "decode", "fp8"}
    held = sum(c["split"] == "heldout" for c in a) / len(a)
    assert 0.2 <= held <= 0.45
    assert len({c["case"] for c in a}) == len(a)
    assert bb.cases(seed=1) != a


@pytest.mark.parametrize("mask,win", [("full", None), ("causal", None), ("window", 4)])
def test_reference_matches_naive_attention(mask, win):
    g = torch.Generator().manual_seed(7)
    s, d = 11, 8
    q = torch.randn(2, 4, s, d, dtype=torch.float64, generator=g)
    k = torch.randn(2, 2, s, d, dtype=torch.float64, generator=g)
    v = torch.randn(2, 2, s, d, dtype=torch.float64, generator=g)
    do = torch.randn_like(q)
    # one head per chunk: the chunked path and the GQA index_add are both exercised
    outs, grads = bb._reference(dict(mask=mask, window=win, s=s), q, k, v, do=do, bidx=[1],
                                max_bytes=s * s * 4 * 3)
    qq, kk, vv = (t[1].clone().requires_grad_(True) for t in (q, k, v))
    sc = qq @ kk.repeat_interleave(2, 0).transpose(-1, -2) / math.sqrt(d)
    i = torch.arange(s)
    rel = i[None, :] - i[:, None]
    keep = {"full": torch.ones(s, s, dtype=torch.bool), "causal": rel <= 0,
            "window": (rel <= 0) & (rel >= -(win or 0))}[mask]
    o = torch.softmax(sc.masked_fill(~keep, float("-inf")), -1) @ vv.repeat_interleave(2, 0)
    want = torch.autograd.grad(o, (qq, kk, vv), do[1])
    assert bb._rel(outs[0], o.detach()) < 1e-5
    for got, ref in zip(grads[0], want):
        assert bb._rel(got, ref) < 1e-5


def test_flops_count_causal_and_window():
    c = dict(kind="attn", b=1, hq=1, s=1000, d=64, mask="full", window=None)
    full = bb._flops(c, "fwd")
    assert full == 4.0 * 1000 * 1000 * 64
    assert bb._flops(dict(c, mask="causal"), "fwd") == full / 2
    assert bb._flops(dict(c, mask="window", window=99), "fwd") == pytest.approx(full * 100 / 1000)
    assert bb._flops(c, "bwd") == 3.5 * full


def test_pick_selects_cases_by_index_or_name_in_order():
    cs = bb.cases()
    got = bb.pick(cs, "3, d256 full,3")
    assert got[0] is cs[3]
    assert all("d256 full" in c["case"] for c in got[1:]) and len(got) > 2
    assert len({c["case"] for c in got}) == len(got)   # a case named twice runs once
    from ck_core.errors import ConfigError

    with pytest.raises(ConfigError, match="--list"):
        bb.pick(cs, "d999")
    with pytest.raises(ConfigError):
        bb.pick(cs, str(len(cs)))


def test_plan_keys_name_the_kernels_the_call_runs():
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("runs the kernels in the Triton interpreter")
    import ck_fmha.api as api

    g = torch.Generator().manual_seed(11)
    q = torch.randn(1, 4, 21, 32, generator=g).half()
    k, v = (torch.randn(1, 2, 21, 32, generator=g).half() for _ in range(2))
    got = bb._kernels(lambda: api.plan_keys(q, k, v, causal=True))
    assert len(got["fwd"]) == 1 and "fwd" in got["fwd"][0]
    assert any("bwd_dq_dk_dv" in n for n in got["bwd"])
    # the plan the call itself caches is the one reported
    fp, disp = api._problem(q, k, v, None, None, None, None, None, True, None, (-1, -1), 0.0, "bhsd", 0.0, 0, 0,
                            None, None)
    assert got["fwd"] == [s.key.name for s in disp.plan(fp).stages]
    assert bb._kernels(lambda: 1 / 0).startswith("ZeroDivisionError")
