"""Paged-KV, batch-prefill and append-KV references."""
import attrs
import numpy as np
import pytest

import torch_ref
from helpers import rand, relerr, seqstart
from ck_fmha import reference as R
from ck_fmha.reference import layout as L
from ck_fmha.paged import gather_paged_kv, pack_paged_kv
from ck_fmha.problem import FmhaProblem
from ck_fmha.reference.rope import make_rotary_tables

TOL = 1e-12


def _kv_lists(rng, p, dtype):
    ks = [rand(rng, (p.nhead_k, n, p.hdim_q), dtype).astype(np.float64) for n in p.seqlens_k]
    vs = [rand(rng, (p.nhead_k, n, p.hdim_v), dtype).astype(np.float64) for n in p.seqlens_k]
    return ks, vs


def _dense_problem(p, **over):
    """The same attention with K/V contiguous (family fwd)."""
    kw = dict(family="fwd", paged_kv=False, page_size=0, kv_layout="linear", kv_lookup="vllm")
    if p.is_group:
        kw.update(seqstart_k=seqstart(p.seqlens_k), seqlens_k=None, seqlen_k=None)
    else:
        kw.update(seqlen_k=max(max(p.seqlens_k), 1))
    kw.update(over)
    return attrs.evolve(p, **kw)


def _dense_kv(pd, ks, vs):
    return L.merge_k(pd, ks, pd.hdim_q, pd.nhead_k), L.merge_k(pd, vs, pd.hdim_v, pd.nhead_k)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("mode", ["batch", "group"])
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_pagedkv_equals_fwd_on_gathered(layout, mode, page_size):
    rng = np.random.default_rng(page_size * 7 + len(layout) + len(mode))
    lens_k = [13, 0, 5]
    kw = dict(family="fwd_pagedkv", batch=3, nhead_q=4, nhead_k=2, hdim_q=16, dtype="fp32",
              paged_kv=True, page_size=page_size, seqlens_k=lens_k, layout=layout, mask="b:4,0",
              bias="alibi")
    if mode == "group":
        kw.update(mode="group", seqstart_q=seqstart([3, 2, 6]))
    else:
        kw.update(seqlen_q=4, seqlen_k=16)
    p = FmhaProblem(**kw)
    ks, vs = _kv_lists(rng, p, "fp32")
    kc, vc, tables = pack_paged_kv(p, ks, vs, rng)
    q = rand(rng, L.merge_q(p, [np.zeros((4, n, 16)) for n in p.seqlens_q_list()], 16).shape)
    slopes = rng.uniform(0.1, 0.5, (4,)).astype(np.float32)
    got = R.fwd_pagedkv(p, q, kc, vc, block_table=tables["block_table"], alibi_slopes=slopes)
    pd = _dense_problem(p)
    kd, vd = _dense_kv(pd, ks, vs)
    ref = R.fwd(pd, q, kd, vd, alibi_slopes=slopes)
    assert relerr(got.o, ref.o) < TOL and relerr(got.lse, ref.lse) < TOL
    # and the dense problem itself against torch
    to, tl = torch_ref.forward(pd, q, kd, vd, slopes=slopes)
    assert relerr(ref.o, to) < 1e-10


PREFILL = [(ps, lay, look) for ps in (1, 16, 1024) for lay in ("linear", "vectorized")
           for look in ("vllm", "sglang") if not (lay == "vectorized" and ps == 1)]


@pytest.mark.parametrize("page_size,kv_layout,kv_lookup", PREFILL)
def test_batch_prefill_equals_fwd_on_gathered(page_size, kv_layout, kv_lookup):
    rng = np.random.default_rng(page_size + len(kv_layout) * 3 + len(kv_lookup))
    lens_q, lens_k = [5, 0, 9, 2], [21, 4, 33, 0]
    p = FmhaProblem(family="batch_prefill", mode="group", batch=4, nhead_q=8, nhead_k=2, hdim_q=16,
                    hdim_v=32, dtype="fp16", seqstart_q=seqstart(lens_q), seqlens_k=lens_k,
                    paged_kv=True, page_size=page_size, kv_layout=kv_layout, kv_lookup=kv_lookup,
                    mask="b", lse=True)
    ks, vs = _kv_lists(rng, p, "fp16")
    kc, vc, tables = pack_paged_kv(p, ks, vs, rng, dtype=np.float16)
    if kv_layout == "vectorized":  # CK's swizzle: K [np, Hk, D/8, P, 8], V [np, Hk, P/8, Dv, 8]
        assert kc.shape[1:] == (2, 2, page_size, 8) and vc.shape[1:] == (2, page_size // 8, 32, 8)
    else:
        assert kc.shape[1:] == (page_size, 2, 16)
    gk, gv = gather_paged_kv(p, kc, vc, **tables)
    for a, b in zip(gk + gv, ks + vs):
        assert np.array_equal(a, b)
    q = rand(rng, (sum(lens_q), 8, 16), "fp16")
    got = R.batch_prefill(p, q, kc, vc, **tables)
    pd = _dense_problem(p)
    kd, vd = _dense_kv(pd, ks, vs)
    ref = R.fwd(pd, q, kd.astype(np.float16), vd.astype(np.float16))
    assert relerr(got.o, ref.o) < TOL and relerr(got.lse, ref.lse) < TOL


def test_vectorized_layout_element_positions():
    # K[page, h, d//vec, slot, d%vec] and V[page, h, slot//vec, d, slot%vec] hold (slot, h, d)
    p = FmhaProblem(family="batch_prefill", mode="group", batch=1, nhead_q=1, hdim_q=16, dtype="fp16",
                    seqstart_q=[0, 1], seqlens_k=[16], paged_kv=True, page_size=16, kv_layout="vectorized")
    k = np.arange(16 * 16, dtype=np.float64).reshape(1, 16, 16)  # [Hk, L, D], value = 16*t + d
    kc, vc, tables = pack_paged_kv(p, [k], [k], np.random.default_rng(0), extra_pages=0)
    pg = int(tables["block_table"][0, 0])
    t, d = 5, 11
    assert kc[pg, 0, d // 8, t, d % 8] == 16 * t + d
    assert vc[pg, 0, t // 8, d, t % 8] == 16 * t + d


def _rope_case(rope, paged, layout="bhsd"):
    rng = np.random.default_rng(len(rope) + 2 * paged + len(layout))
    B, H, Hk, D, n, rd = 2, 4, 2, 32, 3, 16
    lens = [5, 0]
    kw = dict(family="fwd_appendkv", batch=B, nhead_q=H, nhead_k=Hk, hdim_q=D, dtype="fp32",
              seqlen_knew=n, seqlens_k=lens, rope=rope, rotary_dim=rd if rope != "none" else 0,
              layout=layout)
    if paged:
        kw.update(paged_kv=True, page_size=4, seqlen_k=12)
    else:
        kw.update(seqlen_k=12)
    p = FmhaProblem(**kw)
    q = rand(rng, L.merge_q(p, [np.zeros((H, n, D))] * B, D).shape)
    knew = rand(rng, (B, Hk, n, D) if layout == "bhsd" else (B, n, Hk, D))
    vnew = rand(rng, knew.shape)
    cos, sin = make_rotary_tables(32, rd if rope != "none" else 2)
    cos, sin = cos.astype(np.float32), sin.astype(np.float32)
    return rng, p, q, knew, vnew, cos, sin


@pytest.mark.parametrize("rope", ["interleaved", "half_rotated", "none"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_appendkv_rope_matches_torch_formula(rope, layout):
    rng, p, q, knew, vnew, cos, sin = _rope_case(rope, False, layout)
    kc = rand(rng, (2, 2, 12, 32) if layout == "bhsd" else (2, 12, 2, 32))
    vc = rand(rng, kc.shape)
    tabs = dict(rotary_cos=cos, rotary_sin=sin) if rope != "none" else {}
    out = R.fwd_appendkv(p, q, knew, vnew, kc, vc, **tabs)
    rd = p.rotary_dim
    rot = {"interleaved": torch_ref.rope_interleaved, "half_rotated": torch_ref.rope_half}.get(rope)
    to_bhsd = (lambda x: x) if layout == "bhsd" else (lambda x: np.swapaxes(x, 1, 2))
    qb, knb, vnb = to_bhsd(q), to_bhsd(knew), to_bhsd(vnew)
    kcb, vcb = to_bhsd(kc), to_bhsd(vc)
    outq, outk, outv = to_bhsd(out.q), to_bhsd(out.k_cache), to_bhsd(out.v_cache)
    for b, L0 in enumerate(p.seqlens_k):
        pos = np.arange(L0, L0 + p.seqlen_knew)
        want_k = knb[b].astype(np.float64)
        want_q = qb[b].astype(np.float64)
        if rot is not None:
            want_k = want_k.copy()
            want_q = want_q.copy()
            want_k[..., :rd] = rot(want_k[..., :rd], cos[pos], sin[pos]).numpy()
            want_q[..., :rd] = rot(want_q[..., :rd], cos[pos], sin[pos]).numpy()
        assert relerr(outk[b][:, pos], want_k) < 1e-6
        assert relerr(outq[b], want_q) < 1e-6
        assert np.array_equal(outv[b][:, pos], vnb[b])
        keep = np.setdiff1d(np.arange(12), pos)
        assert np.array_equal(outk[b][:, keep], kcb[b][:, keep])
        assert np.array_equal(outv[b][:, keep], vcb[b][:, keep])
        if rot is not None:  # channels past rotary_dim pass through untouched
            assert np.array_equal(outk[b][:, pos, rd:], knb[b][..., rd:])


def test_appendkv_paged_equals_dense():
    rng, p, q, knew, vnew, cos, sin = _rope_case("half_rotated", True)
    ks = [rand(rng, (2, n, 32)).astype(np.float64) for n in p.seqlens_k]
    vs = [rand(rng, (2, n, 32)).astype(np.float64) for n in p.seqlens_k]
    # reserve room for the new tokens in the page tables
    room = attrs.evolve(p, seqlens_k=[l + p.seqlen_knew for l in p.seqlens_k])
    kc, vc, tables = pack_paged_kv(room, [np.pad(k, ((0, 0), (0, 3), (0, 0))) for k in ks],
                                   [np.pad(v, ((0, 0), (0, 3), (0, 0))) for v in vs], rng)
    out = R.fwd_appendkv(p, q, knew, vnew, kc, vc, rotary_cos=cos, rotary_sin=sin, **tables)
    pd = attrs.evolve(p, paged_kv=False, page_size=0)
    kd = L.merge_k(attrs.evolve(pd, family="fwd", rope="none", rotary_dim=0, seqlen_knew=0), ks, 32, 2)
    dense = R.fwd_appendkv(pd, q, knew, vnew, kd, kd.copy(), rotary_cos=cos, rotary_sin=sin)
    gk, _ = gather_paged_kv(attrs.evolve(room, family="fwd_pagedkv", rope="none", rotary_dim=0,
                                         seqlen_knew=0), out.k_cache, out.v_cache, **tables)
    for b in range(p.batch):
        n = p.seqlens_k[b] + p.seqlen_knew
        assert relerr(gk[b], dense.k_cache[b][:, :n]) < 1e-12
    assert np.array_equal(out.q, dense.q)


def test_appendkv_one_shot_attention():
    rng, p, q, knew, vnew, cos, sin = _rope_case("interleaved", False)
    kc = rand(rng, (2, 2, 12, 32))
    vc = rand(rng, kc.shape)
    got = R.attention_forward(p, q, kc, vc, knew=knew, vnew=vnew, rotary_cos=cos, rotary_sin=sin)
    app = R.fwd_appendkv(p, q, knew, vnew, kc, vc, rotary_cos=cos, rotary_sin=sin)
    pf = FmhaProblem(batch=2, nhead_q=4, nhead_k=2, hdim_q=32, dtype="fp32", seqlen_q=3, seqlen_k=12,
                     seqlens_k=[8, 3])
    to, tl = torch_ref.forward(pf, app.q, app.k_cache, app.v_cache)
    assert relerr(got.o, to) < 1e-10 and relerr(got.lse, tl) < 1e-10
