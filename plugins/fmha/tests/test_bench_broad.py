"""The broad FMHA benchmark suite: its cases cover what it claims, and its reference is right."""
import math

import pytest

torch = pytest.importorskip("torch")

from ck_fmha import bench_broad as bb  # noqa: E402


def test_cases_are_deterministic_and_cover_the_distributions():
    a, b = bb.cases(), bb.cases()
    assert a == b
    attn = [c for c in bb.seeded_cases() if c["kind"] == "attn"]
    assert {c["d"] for c in attn} == set(bb.HDIMS)
    assert {c["mask"] for c in attn} == set(bb.MASKS)
    assert any(c["hk"] == 1 for c in attn) and any(c["hk"] == c["hq"] for c in attn)
    assert sum(c["s"] % 128 != 0 for c in attn) > len(attn) // 2
    assert min(c["s"] for c in attn) >= 100 and max(c["s"] for c in attn) <= 32768
    assert {c["kind"] for c in a} == {"attn", "varlen", "decode", "fp8"}
    held = sum(c["split"] == "heldout" for c in a) / len(a)
    assert 0.2 <= held <= 0.45
    first = bb.seeded_cases()
    assert 0.2 <= sum(c["split"] == "heldout" for c in first) / len(first) <= 0.45
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


# -- issue #28's strata ------------------------------------------------------------------------------

def test_the_seeded_cases_and_their_split_are_unchanged():
    # the model strata come after the suite's first cases, from their own generator: earlier runs'
    # rows (and which of them are held out) stay what they were
    cs = bb.cases()
    first = bb.seeded_cases()
    assert cs[:len(first)] == first and bb.cases(models=False) == first
    assert all("model" not in c for c in first) and all("model" in c for c in cs[len(first):])


def test_every_head_dim_and_page_size_is_a_stratum():
    cs = bb.cases()
    attn = [c for c in cs if c["kind"] == "attn"]
    assert {c["d"] for c in attn} == set(bb.HDIM_STRATA)
    for d in bb.HDIM_STRATA:   # each head dim: model cases, and a training one
        assert any(c["d"] == d and "model" in c and c["split"] == "train" for c in attn), d
    strata = {bb._stratum(c) for c in cs if c["kind"] == "decode"}
    assert strata == {f"page{p}" for p in bb.PAGE_STRATA} | {"small_cache"}
    model_dec = [c for c in cs if c["kind"] == "decode" and "model" in c]
    assert {c["page"] for c in model_dec} == set(bb.PAGE_STRATA)
    for p in bb.PAGE_STRATA:   # one cache above 32 MiB and one below for every page size
        sizes = [bb._cache_bytes(c) for c in model_dec if c["page"] == p]
        assert max(sizes) > bb.SMALL_CACHE >= min(sizes), p
    assert {c["dtype"] for c in attn} >= {"fp16", "bf16"}
    assert {c["mask"] for c in attn if "model" in c} == {"full", "causal", "window"}
    assert any(c["hk"] == 1 for c in attn if "model" in c) and any(1 < c["hk"] < c["hq"] for c in attn
                                                                     if "model" in c)
    assert any(c["kind"] == "varlen" and "model" in c for c in cs)
    assert len({c["case"] for c in cs}) == len(cs)


def test_held_out_cases_are_absent_from_the_training_list():
    cs = bb.cases()

    def shape(c):
        return tuple((k, str(v)) for k, v in sorted(c.items()) if k not in ("split", "case", "model"))

    train = {shape(c) for c in cs if c["split"] == "train"}
    held = [c for c in cs if c["split"] == "heldout"]
    assert held and not [c["case"] for c in held if shape(c) in train]
    for name in bb.HELD_OUT_MODELS:   # whole model configs are held out
        assert all(c["split"] == "heldout" for c in cs if c.get("model") == name)
        assert any(c.get("model") == name for c in cs), name


def test_quick_covers_every_stratum_once_and_stays_small():
    cs = bb.cases()
    q = bb.quick_cases(cs)
    assert q == bb.quick_cases(bb.cases())
    got = {bb._stratum(c) for c in q if c["kind"] == "attn"}
    assert got == {f"d{d}" for d in bb.HDIM_STRATA}
    assert {bb._stratum(c) for c in q if c["kind"] == "decode"} == \
        {f"page{p}" for p in bb.PAGE_STRATA} | {"small_cache"}
    assert any(c["kind"] == "varlen" for c in q)
    assert len(q) <= 24
    # the work of one GPU's quick run: attention of at most ~1.5 TFLOP forward a case
    assert max(bb._flops(c, "fwd") for c in q if c["kind"] != "decode") < 1.5e12


def _synthetic_rows():
    rows = []
    for d, r in ((64, 1.2), (64, 0.8), (64, 0.5), (128, 2.0)):
        rows.append(dict(group="fwd", kind="attn", d=d, stratum=f"d{d}", status="ok", ratio=r, ratio_eager=r / 2,
                         floor=0.85, peer_kind="cudnn", peer_target=1.0, split="train", mask="full"))
    rows.append(dict(group="fwd_bwd", kind="attn", d=64, stratum="d64", status="ok", ratio=0.79, ratio_eager=0.7,
                     floor=0.8, peer_kind="flex", peer_target=1.2, split="heldout", mask="window"))
    rows.append(dict(group="fwd_bwd", kind="attn", d=64, stratum="d64", status="wrong", rel_err=0.5, split="train"))
    rows.append(dict(group="decode", kind="decode", stratum="page16", status="ok", ratio=0.7, floor=0.8,
                     peer_kind="copy", peer_target=0.8, split="train"))
    rows.append(dict(group="decode", kind="decode", stratum="small_cache", status="ok", ratio=0.3, floor=None,
                     peer_kind="copy", peer_target=0.8, split="train"))
    return rows


def test_strata_summary_math_on_synthetic_rows():
    s = bb._summary(_synthetic_rows())
    d64 = s["fwd/d64"]
    assert d64["n"] == 3 and d64["graph_geomean"] == pytest.approx((1.2 * 0.8 * 0.5) ** (1 / 3), abs=1e-4)
    assert d64["graph_min"] == 0.5 and d64["eager_min"] == 0.25
    assert d64["eager_geomean"] == pytest.approx((0.6 * 0.4 * 0.25) ** (1 / 3), abs=1e-4)
    assert d64["below_floor"] == 2 and d64["below_target"] == 2 and d64["peers"] == {"cudnn": 3}
    assert s["fwd/d128"]["graph_geomean"] == 2.0 and s["fwd/d128"]["below_floor"] == 0
    fb = s["fwd_bwd/d64"]
    assert fb["n"] == 2 and fb["wrong"] == 1 and fb["below_floor"] == 1 and fb["peers"] == {"flex": 1}
    assert s["decode/page16"]["below_floor"] == 1
    assert s["decode/small_cache"]["below_floor"] == 0 and s["decode/small_cache"]["graph_min"] == 0.3
    assert "fwd/d32" not in s    # a stratum without rows is absent, never a zero
    assert s["fwd/all"]["n"] == 4 and s["fwd/all"]["below_floor"] == 0   # rows without below_floor flags


def test_the_rows_peer_is_the_first_that_ran_with_its_target():
    row = dict(group="fwd", cudnn_error="RuntimeError: no", flash_graph_ms=2.0, flash_eager_ms=3.0,
               ratio_flash_graph=2.0, ratio_flash_eager=1.5, flex_graph_ms=1.0, ratio_flex_graph=1.0)
    bb._choose_peer(row, 4e9, ["cudnn", "flash", "flex"])
    assert row["peer_kind"] == "flash" and row["peer_target"] == 1.2 and row["ratio"] == 2.0
    assert row["ratio_eager"] == 1.5 and row["floor"] == 0.85 and row["below_floor"] is False
    row = dict(group="fwd_bwd", cudnn_graph_ms=1.0, ratio_cudnn_graph=0.7, ratio_cudnn_eager=0.6)
    bb._choose_peer(row, 1e9, ["cudnn", "flash"])
    assert row["peer_kind"] == "cudnn" and row["peer_target"] == 0.9 and row["below_floor"] is True


def test_rows_on_the_cpu_pick_the_peer_that_ran_and_a_wrong_row_is_never_data(monkeypatch):
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("runs the kernels in the Triton interpreter")
    import ck_fmha

    # timings faked (the CPU has no CUDA graphs): the peers still run, each refusal is recorded
    from ck_fmha import bench_broad_timing

    monkeypatch.setattr(bench_broad_timing, "eager_and_graph_ms",
                        lambda fn: (fn(), {"eager_ms": 2.0, "graph_ms": 1.0})[1])
    c = dict(kind="attn", model="t", b=1, hq=4, hk=2, s=37, d=40, mask="causal", window=None, dtype="fp16",
             split="train")
    c["case"] = bb.case_name(c)
    rows = bb._attn_rows(c, "cpu")
    assert [r["group"] for r in rows] == ["fwd", "fwd_train", "fwd_bwd"]
    for r in rows:
        assert r["status"] == "ok" and r["rel_err"] < 2e-2, r
        assert "cudnn_error" in r    # SDPA's cuDNN backend refuses CPU tensors: flash is the peer
        assert r["peer_kind"] == "flash" and r["peer_target"] == 1.2 and r["ratio"] == 1.0
        assert "flex_graph_ms" not in r   # FlexAttention is only timed where both SDPA backends refused
    real = ck_fmha.attention
    monkeypatch.setattr(ck_fmha, "attention", lambda *a, **k: real(*a, **k) * 1.1)
    bad = bb._attn_rows(c, "cpu")
    assert all(r["status"] == "wrong" and "ratio" not in r and "ours_graph_ms" not in r for r in bad)
