"""ck_fmha.flash_attn (FlashAttention's API) on the CPU: Triton interpreter, tiny odd shapes, against a
float64 reference written here from FlashAttention's documented semantics (bottom-right masks, ALiBi
-slope * |i + sk - sq - j|, softcap, dropout keep mask from CK's uint8 random values, RoPE)."""
from __future__ import annotations

import math
import os

if os.environ.get("CK_TEST_GPU") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

if os.environ.get("TRITON_INTERPRET") != "1":  # pragma: no cover
    pytest.skip("these tests run the kernels in the Triton interpreter", allow_module_level=True)

from ck_fmha import flash_attn as fa  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")]

TOL = 3e-3  # fp16 operands, fp32 accumulation, relative to the float64 reference


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def ref_seq(q, k, v, *, causal=False, window=(-1, -1), slopes=None, softcap=0.0, scale=None, keep=None, p=0.0):
    """One sequence, float64: q [Sq, H, D], k/v [Sk, Hk, D] -> (out [Sq, H, Dv], lse [H, Sq])."""
    q, k, v = q.double(), k.double(), v.double()
    sq, h, d = q.shape
    sk, hk = k.shape[0], k.shape[1]
    k = k.repeat_interleave(h // hk, dim=1)
    v = v.repeat_interleave(h // hk, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k) * (d ** -0.5 if scale is None else scale)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    diag = torch.arange(sq).view(-1, 1) + sk - sq          # key index on the bottom-right diagonal
    j = torch.arange(sk).view(1, -1)
    if slopes is not None:
        s = s - slopes.double().view(-1, 1, 1) * (diag - j).abs()
    left, right = window
    if causal:
        right = 0
    ok = torch.ones(sq, sk, dtype=torch.bool)
    if right >= 0:
        ok &= j <= diag + right
    if left >= 0:
        ok &= j >= diag - left
    s = s.masked_fill(~ok, float("-inf"))
    lse = torch.logsumexp(s, -1)
    prob = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
    if keep is not None:
        prob = prob * keep / (1 - p)
    return torch.einsum("hqk,khd->qhd", prob, v), lse


def ref_batch(q, k, v, **kw):
    outs, lses = zip(*(ref_seq(q[i], k[i], v[i], **{n: (x[i] if n in ("slopes", "keep") and x is not None
                                                        and x.dim() > (1 if n == "slopes" else 3) else x)
                                                     for n, x in kw.items()}) for i in range(q.shape[0])))
    return torch.stack(outs), torch.stack(lses)


def rnd(*shape, seed, dtype=torch.float16, grad=False):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(*shape, generator=g).to(dtype)
    return t.requires_grad_(grad)


def check_grads(out, ref_out, pairs):
    g = rnd(*out.shape, seed=99).double()
    grads = torch.autograd.grad(out, [a for a, _ in pairs], g.to(out.dtype))
    ref_grads = torch.autograd.grad(ref_out, [b for _, b in pairs], g)
    for name, x, r in zip("qkv", grads, ref_grads):
        assert rel(x, r) < 2 * TOL, name


BATCH_CASES = [
    # b, sq, sk, h, hk, d, causal, window, alibi, softcap
    (2, 13, 13, 2, 2, 16, False, (-1, -1), False, 0.0),
    (2, 11, 19, 4, 2, 24, True, (-1, -1), False, 0.0),      # GQA, bottom-right causal, odd hdim
    (1, 19, 11, 4, 1, 16, True, (-1, -1), False, 0.0),      # MQA, sq > sk: top rows see nothing
    (2, 17, 17, 2, 2, 16, False, (4, 2), True, 0.0),        # sliding window + ALiBi
    (2, 9, 21, 2, 1, 16, True, (5, -1), False, 30.0),       # causal + left window + softcap
    (2, 7, 12, 2, 2, 16, True, (-1, -1), True, 0.0),        # causal ALiBi: lse in FlashAttention's form
    (2, 9, 14, 2, 1, 20, True, (-1, -1), False, 0.0),       # head dim not a multiple of 8: padded to 24
]


@pytest.mark.parametrize("case", BATCH_CASES, ids=lambda c: "-".join(map(str, c)))
def test_flash_attn_func_vs_reference(case):
    b, sq, sk, h, hk, d, causal, window, alibi, softcap = case
    q, k, v = rnd(b, sq, h, d, seed=1, grad=True), rnd(b, sk, hk, d, seed=2, grad=True), rnd(b, sk, hk, d, seed=3, grad=True)
    slopes = torch.rand(b, h, generator=torch.Generator().manual_seed(4)) * 0.3 if alibi else None
    out, lse, s_dmask = fa.flash_attn_func(q, k, v, causal=causal, window_size=window, alibi_slopes=slopes,
                                           softcap=softcap, return_attn_probs=True)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    ro, rl = ref_batch(qd, kd, vd, causal=causal, window=window, slopes=slopes, softcap=softcap)
    assert out.shape == (b, sq, h, d) and lse.shape == (b, h, sq) and lse.dtype == torch.float32
    assert s_dmask.numel() == 0
    assert rel(out, ro) < TOL
    live = torch.isfinite(rl)
    assert torch.allclose(lse[live].double(), rl[live].detach(), atol=1e-3, rtol=1e-3)
    if not live.all():   # rows that see no key: zero output (FlashAttention's convention)
        assert out.permute(0, 2, 1, 3)[~live].abs().max() == 0
    check_grads(out, ro, [(q, qd), (k, kd), (v, vd)])


def test_packed_variants_equal_unpacked():
    b, s, h, d = 2, 10, 2, 16
    qkv = rnd(b, s, 3, h, d, seed=5, grad=True)
    out = fa.flash_attn_qkvpacked_func(qkv, causal=True, softmax_scale=0.2)
    q, k, v = (t.detach().double().requires_grad_() for t in qkv.unbind(2))
    ro, _ = ref_batch(q, k, v, causal=True, scale=0.2)
    assert rel(out, ro) < TOL
    g = rnd(*out.shape, seed=6)
    (dqkv,) = torch.autograd.grad(out, qkv, g)
    rq = torch.autograd.grad(ro, (q, k, v), g.double())
    assert rel(dqkv, torch.stack(rq, 2)) < 2 * TOL

    kv = qkv.detach()[:, :, 1:].clone().requires_grad_()
    qq = qkv.detach()[:, :, 0].clone()
    out2 = fa.flash_attn_kvpacked_func(qq, kv, causal=True, softmax_scale=0.2)
    assert rel(out2, ro) < TOL
    (dkv,) = torch.autograd.grad(out2, kv, g)
    assert rel(dkv, torch.stack(rq[1:], 2)) < 2 * TOL


def _cu(lens):
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)


@pytest.mark.parametrize("causal,window,alibi", [(True, (-1, -1), False), (False, (3, 1), True)])
def test_varlen_ragged_vs_reference(causal, window, alibi):
    lq, lk, h, hk, d = [5, 0, 12, 7], [9, 4, 6, 7], 4, 2, 16
    cu_q, cu_k = _cu(lq), _cu(lk)
    q = rnd(sum(lq), h, d, seed=7, grad=True)
    k, v = rnd(sum(lk), hk, d, seed=8, grad=True), rnd(sum(lk), hk, d, seed=9, grad=True)
    slopes = torch.rand(h, generator=torch.Generator().manual_seed(10)) * 0.5 if alibi else None
    out, lse, _ = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=causal,
                                            window_size=window, alibi_slopes=slopes, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (h, sum(lq))
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    ro = []
    for i in range(len(lq)):
        sq_, sk_ = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        o_i, l_i = ref_seq(qd[sq_], kd[sk_], vd[sk_], causal=causal, window=window, slopes=slopes)
        ro.append(o_i)
        live = torch.isfinite(l_i)
        assert torch.allclose(lse[:, sq_][live].double(), l_i[live].detach(), atol=1e-3, rtol=1e-3)
    ro = torch.cat(ro)
    assert rel(out, ro) < TOL
    check_grads(out, ro, [(q, qd), (k, kd), (v, vd)])

    # the packed varlen forms give the same result
    kv = torch.stack([k.detach(), v.detach()], 1)
    assert torch.equal(fa.flash_attn_varlen_kvpacked_func(q.detach(), kv, cu_q, cu_k, max(lq), max(lk),
                                                          causal=causal, window_size=window, alibi_slopes=slopes),
                       out.detach())


def test_varlen_qkvpacked():
    lens, h, d = [6, 11, 3], 2, 16
    cu = _cu(lens)
    qkv = rnd(sum(lens), 3, h, d, seed=11)
    out = fa.flash_attn_varlen_qkvpacked_func(qkv, cu, max(lens), causal=True)
    ro = torch.cat([ref_seq(*qkv[cu[i]:cu[i + 1]].unbind(1), causal=True)[0] for i in range(len(lens))])
    assert rel(out, ro) < TOL


def test_varlen_paged_alibi_causal_lse():
    """The paged varlen forward with ALiBi under a causal mask: o and the LSE in FlashAttention's
    bottom-right ALiBi form (the problem's vertical form differs by a per-row constant)."""
    lq, lk, h, hk, d, page = [2, 5], [11, 6], 2, 1, 16, 4
    pool_k, pool_v = rnd(9, page, hk, d, seed=21), rnd(9, page, hk, d, seed=22)
    table = torch.tensor([[3, 0, 7], [8, 2, 5]], dtype=torch.int32)
    q = rnd(sum(lq), h, d, seed=23)
    slopes = torch.tensor([0.5, 0.125])
    out, lse, _ = fa.flash_attn_varlen_func(q, pool_k, pool_v, _cu(lq), _cu(lk), max(lq), max(lk), causal=True,
                                            alibi_slopes=slopes, block_table=table, return_attn_probs=True)
    cu_q = _cu(lq)
    for i in range(2):
        kk = pool_k[table[i].long()].reshape(-1, hk, d)[:lk[i]]
        vv = pool_v[table[i].long()].reshape(-1, hk, d)[:lk[i]]
        ro, rl = ref_seq(q[cu_q[i]:cu_q[i + 1]], kk, vv, causal=True, slopes=slopes)
        assert rel(out[cu_q[i]:cu_q[i + 1]], ro) < TOL
        assert torch.allclose(lse[:, cu_q[i]:cu_q[i + 1]].double(), rl, atol=1e-3, rtol=1e-3)


def test_varlen_paged_block_table():
    lq, lk, h, hk, d, page = [3, 7], [20, 9], 2, 1, 16, 8
    nblocks = 3
    pool_k, pool_v = rnd(7, page, hk, d, seed=12), rnd(7, page, hk, d, seed=13)
    table = torch.tensor([[4, 0, 6], [2, 5, 1]], dtype=torch.int32)
    q = rnd(sum(lq), h, d, seed=14, grad=True)
    out = fa.flash_attn_varlen_func(q, pool_k, pool_v, _cu(lq), _cu(lk), max(lq), max(lk), causal=True,
                                    block_table=table)
    cu_q = _cu(lq)
    ro = []
    for i in range(2):
        kk = pool_k[table[i].long()].reshape(nblocks * page, hk, d)[:lk[i]]
        vv = pool_v[table[i].long()].reshape(nblocks * page, hk, d)[:lk[i]]
        ro.append(ref_seq(q.detach()[cu_q[i]:cu_q[i + 1]], kk, vv, causal=True)[0])
    assert rel(out, torch.cat(ro)) < TOL
    with pytest.raises(NotImplementedError, match="block_table"):
        out.sum().backward()
    with pytest.raises(NotImplementedError, match="dropout_p"):
        fa.flash_attn_varlen_func(q, pool_k, pool_v, _cu(lq), _cu(lk), max(lq), max(lk), dropout_p=0.1,
                                  block_table=table)


def test_dropout_randvals_are_the_mask():
    b, sq, sk, h, d, p = 2, 9, 13, 2, 16, 0.3
    q, k, v = rnd(b, sq, h, d, seed=15, grad=True), rnd(b, sk, h, d, seed=16, grad=True), rnd(b, sk, h, d, seed=17, grad=True)
    torch.manual_seed(123)
    out, lse, s_dmask = fa.flash_attn_func(q, k, v, p, causal=True, return_attn_probs=True)
    assert s_dmask.shape == (b, h, sq, sk) and s_dmask.dtype == torch.uint8
    keep = (s_dmask <= math.floor(255 * (1 - p))).double()
    assert 0.5 < keep.mean() < 0.9
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    ro, rl = ref_batch(qd, kd, vd, causal=True, keep=keep, p=p)
    assert rel(out, ro) < TOL
    assert torch.allclose(lse.double(), rl.detach(), atol=1e-3, rtol=1e-3)   # lse before dropout
    check_grads(out, ro, [(q, qd), (k, kd), (v, vd)])
    torch.manual_seed(123)
    assert torch.equal(fa.flash_attn_func(q, k, v, p, causal=True), out)     # torch's seed repeats it
    assert not torch.equal(fa.flash_attn_func(q, k, v, p, causal=True), out)


def test_varlen_dropout_randvals():
    lq, lk, h, d, p = [4, 9], [7, 5], 2, 16, 0.25
    cu_q, cu_k = _cu(lq), _cu(lk)
    q, k, v = rnd(sum(lq), h, d, seed=18), rnd(sum(lk), h, d, seed=19), rnd(sum(lk), h, d, seed=20)
    out, _, s_dmask = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk), p, return_attn_probs=True)
    assert s_dmask.shape == (h, sum(lq), max(lk))
    thresh = math.floor(255 * (1 - p))
    for i in range(2):
        keep = (s_dmask[:, cu_q[i]:cu_q[i + 1], :lk[i]] <= thresh).double()
        ro, _ = ref_seq(q[cu_q[i]:cu_q[i + 1]], k[cu_k[i]:cu_k[i + 1]], v[cu_k[i]:cu_k[i + 1]], keep=keep, p=p)
        assert rel(out[cu_q[i]:cu_q[i + 1]], ro) < TOL


def test_deterministic_backward_repeats():
    q, k, v = rnd(1, 12, 2, 16, seed=21, grad=True), rnd(1, 12, 2, 16, seed=22, grad=True), rnd(1, 12, 2, 16, seed=23, grad=True)
    out = fa.flash_attn_func(q, k, v, causal=True, deterministic=True)
    g = rnd(*out.shape, seed=24)
    a = torch.autograd.grad(out, (q, k, v), g, retain_graph=True)
    b = torch.autograd.grad(out, (q, k, v), g)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


# --- KV cache ---------------------------------------------------------------------------------------


def rope_ref(x, cos, sin, pos, interleaved):
    """x [S, H, D] float64 rotated at integer positions pos [S] over the first 2 * cos.shape[1] channels."""
    x = x.double().clone()
    r = 2 * cos.shape[1]
    c, s = cos.double()[pos][:, None, :], sin.double()[pos][:, None, :]
    if interleaved:
        x1, x2 = x[..., 0:r:2].clone(), x[..., 1:r:2].clone()
        x[..., 0:r:2], x[..., 1:r:2] = x1 * c - x2 * s, x1 * s + x2 * c
    else:
        x1, x2 = x[..., : r // 2].clone(), x[..., r // 2: r].clone()
        x[..., : r // 2], x[..., r // 2: r] = x1 * c - x2 * s, x1 * s + x2 * c
    return x


KV_CASES = [
    # paged, batch_idx, causal, window, alibi, rotary (None | "interleaved" | "half"), num_splits, new
    (False, False, True, (-1, -1), False, "interleaved", 0, 3),
    (False, True, False, (-1, -1), False, "half", 1, 2),         # q rows all at position cache_seqlens
    (True, False, True, (6, -1), False, "half", 3, 4),
    (True, False, False, (-1, -1), True, None, 0, 0),            # ALiBi: the one-pass kernel
    (False, True, True, (-1, -1), True, "interleaved", 1, 1),
    # a contiguous cache of 24 (not a power of two) on the one-pass kernel (ALiBi; num_splits=1):
    # FlashAttention's suite failed these with R08-page-pow2
    (False, False, False, (-1, -1), True, "interleaved", 0, 4),
    (False, False, True, (-1, -1), False, None, 1, 2),
]


@pytest.mark.parametrize("case", KV_CASES, ids=lambda c: "-".join(map(str, c)))
def test_kvcache_vs_reference(case):
    paged, batch_idx, causal, window, alibi, rotary, num_splits, new = case
    b, sq, h, hk, d, cap, page = 2, 4, 4, 2, 16, 24, 8
    q = rnd(b, sq, h, d, seed=30)
    if paged:
        table = torch.tensor([[5, 1, 3], [0, 4, 2]], dtype=torch.int32)
        kc, vc = rnd(6, page, hk, d, seed=31), rnd(6, page, hk, d, seed=32)
        logical = lambda c: c[table.long()].reshape(b, cap, hk, d)  # noqa: E731
    else:
        table = None
        kc, vc = rnd(3, cap, hk, d, seed=31), rnd(3, cap, hk, d, seed=32)
        rows = torch.tensor([2, 0]) if batch_idx else torch.arange(b)
        logical = lambda c: c[rows]  # noqa: E731
    seqlens = torch.tensor([9, 17], dtype=torch.int32)
    k_new, v_new = (rnd(b, new, hk, d, seed=33), rnd(b, new, hk, d, seed=34)) if new else (None, None)
    cos = sin = None
    if rotary:
        ang = torch.rand(cap, 4, generator=torch.Generator().manual_seed(35)) * 2 * math.pi
        cos, sin = ang.cos().half(), ang.sin().half()
    slopes = torch.rand(b, h, generator=torch.Generator().manual_seed(36)) * 0.3 if alibi else None
    k_before, v_before = logical(kc).clone(), logical(vc).clone()
    out, lse = fa.flash_attn_with_kvcache(
        q, kc, vc, k_new, v_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens,
        cache_batch_idx=torch.tensor([2, 0], dtype=torch.int32) if batch_idx else None, block_table=table,
        causal=causal, window_size=window, rotary_interleaved=rotary == "interleaved", alibi_slopes=slopes,
        num_splits=num_splits, return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (b, h, sq)
    k_after, v_after = logical(kc), logical(vc)
    for i in range(b):
        n0 = int(seqlens[i])
        kk, vv = k_before[i].double(), v_before[i].double()
        qq = q[i].double()
        if new:
            pos = torch.arange(n0, n0 + new)
            kn = rope_ref(k_new[i], cos, sin, pos, rotary == "interleaved") if rotary else k_new[i].double()
            kk[n0:n0 + new], vv[n0:n0 + new] = kn, v_new[i].double()
            if rotary:
                qpos = torch.arange(n0, n0 + sq) if (causal or window != (-1, -1)) else torch.full((sq,), n0)
                qq = rope_ref(q[i], cos, sin, qpos, rotary == "interleaved")
        n = n0 + new
        assert rel(k_after[i][:n], kk[:n]) < 1e-3 and torch.equal(v_after[i][:n].double(), vv[:n])
        assert torch.equal(k_after[i][n:], k_before[i][n:])          # nothing written past the append
        ro, rl = ref_seq(qq, kk[:n], vv[:n], causal=causal, window=window,
                         slopes=None if slopes is None else slopes[i])
        assert rel(out[i], ro) < TOL, i
        live = torch.isfinite(rl)
        assert torch.allclose(lse[i][live].double(), rl[live], atol=1e-3, rtol=1e-3)


def test_head_dim_not_a_multiple_of_8():
    """FlashAttention pads such head dims to a multiple of 8 (CK's kernels need it): varlen with its
    gradients, the paged varlen forward, and the KV cache (new rows appended with RoPE, written back
    into the caller's caches at the caller's head dim)."""
    d, h, hk = 12, 2, 1
    lq, lk = [4, 7], [9, 5]
    cu_q, cu_k = _cu(lq), _cu(lk)
    q = rnd(sum(lq), h, d, seed=60, grad=True)
    k, v = rnd(sum(lk), hk, d, seed=61, grad=True), rnd(sum(lk), hk, d, seed=62, grad=True)
    out = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=True)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    ro = torch.cat([ref_seq(qd[cu_q[i]:cu_q[i + 1]], kd[cu_k[i]:cu_k[i + 1]], vd[cu_k[i]:cu_k[i + 1]],
                            causal=True)[0] for i in range(2)])
    assert out.shape == q.shape and rel(out, ro) < TOL
    check_grads(out, ro, [(q, qd), (k, kd), (v, vd)])

    page = 4
    pool_k, pool_v = rnd(6, page, hk, d, seed=63), rnd(6, page, hk, d, seed=64)
    table = torch.tensor([[3, 0, 5], [1, 4, 2]], dtype=torch.int32)
    out = fa.flash_attn_varlen_func(q.detach(), pool_k, pool_v, cu_q, cu_k, max(lq), max(lk), causal=True,
                                    block_table=table)
    for i in range(2):
        kk = pool_k[table[i].long()].reshape(-1, hk, d)[:lk[i]]
        vv = pool_v[table[i].long()].reshape(-1, hk, d)[:lk[i]]
        assert rel(out[cu_q[i]:cu_q[i + 1]], ref_seq(q[cu_q[i]:cu_q[i + 1]].detach(), kk, vv, causal=True)[0]) < TOL

    b, sq, cap, new = 2, 3, 16, 2
    qc, kc, vc = rnd(b, sq, h, d, seed=65), rnd(b, cap, hk, d, seed=66), rnd(b, cap, hk, d, seed=67)
    k_new, v_new = rnd(b, new, hk, d, seed=68), rnd(b, new, hk, d, seed=69)
    ang = torch.rand(cap, 2, generator=torch.Generator().manual_seed(70)) * 2 * math.pi
    cos, sin = ang.cos().half(), ang.sin().half()
    seqlens = torch.tensor([5, 11], dtype=torch.int32)
    k_before, v_before = kc.clone(), vc.clone()
    out, lse = fa.flash_attn_with_kvcache(qc, kc, vc, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                          cache_seqlens=seqlens, causal=True, return_softmax_lse=True)
    assert out.shape == qc.shape and kc.shape == (b, cap, hk, d)
    for i in range(b):
        n0 = int(seqlens[i])
        kk, vv = k_before[i].double(), v_before[i].double()
        kk[n0:n0 + new] = rope_ref(k_new[i], cos, sin, torch.arange(n0, n0 + new), True)
        vv[n0:n0 + new] = v_new[i].double()
        assert rel(kc[i][:n0 + new], kk[:n0 + new]) < 1e-3 and torch.equal(kc[i][n0 + new:], k_before[i][n0 + new:])
        assert torch.equal(vc[i][:n0 + new].double(), vv[:n0 + new])
        qq = rope_ref(qc[i], cos, sin, torch.arange(n0, n0 + sq), True)
        ro, rl = ref_seq(qq, kk[:n0 + new], vv[:n0 + new], causal=True)
        assert rel(out[i], ro) < TOL
        assert torch.allclose(lse[i].double(), rl, atol=1e-3, rtol=1e-3)


def test_kvcache_rotary_tables_only_cover_the_cache():
    """FlashAttention asks only that cos/sin cover the cache (rows >= its length): query rows past the
    table (causal, q longer than the appended keys, the cache nearly full) are not rotated and never
    read out of bounds; the table of exactly the cache's length is accepted (it asked for more)."""
    b, sq, h, hk, d, cap, new = 2, 5, 4, 2, 24, 19, 2
    q = rnd(b, sq, h, d, seed=60)
    kc, vc = rnd(b, cap, hk, d, seed=61), rnd(b, cap, hk, d, seed=62)
    k_new, v_new = rnd(b, new, hk, d, seed=63), rnd(b, new, hk, d, seed=64)
    ang = torch.rand(cap, 8, generator=torch.Generator().manual_seed(65)) * 2 * math.pi
    cos, sin = ang.cos().half(), ang.sin().half()
    seqlens = torch.tensor([cap - new, 6], dtype=torch.int32)   # row 0: q positions 17..21 of a table of 19
    k_before, v_before = kc.clone(), vc.clone()
    out = fa.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens,
                                     causal=True, rotary_interleaved=False)
    # the identity rotation past the table, written out here
    cos_x = torch.cat([cos.double(), torch.ones(sq, 8, dtype=torch.float64)])
    sin_x = torch.cat([sin.double(), torch.zeros(sq, 8, dtype=torch.float64)])
    for i in range(b):
        n0 = int(seqlens[i])
        kk, vv = k_before[i].double(), v_before[i].double()
        kk[n0:n0 + new] = rope_ref(k_new[i], cos, sin, torch.arange(n0, n0 + new), False)
        vv[n0:n0 + new] = v_new[i].double()
        assert rel(kc[i][:n0 + new], kk[:n0 + new]) < 1e-3 and torch.equal(kc[i][n0 + new:], k_before[i][n0 + new:])
        assert torch.equal(vc[i][:n0 + new].double(), vv[:n0 + new])
        qq = rope_ref(q[i], cos_x, sin_x, torch.arange(n0, n0 + sq), False)
        ro, _ = ref_seq(qq, kk[:n0 + new], vv[:n0 + new], causal=True)
        assert rel(out[i], ro) < TOL, i
    with pytest.raises(ValueError, match="must cover the KV cache"):   # FlashAttention's own check
        fa.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, rotary_cos=cos[:-1], rotary_sin=sin[:-1],
                                   cache_seqlens=torch.tensor([0, 0], dtype=torch.int32), causal=True)


def test_kvcache_leftpad():
    b, sq, h, d, cap = 2, 3, 2, 16, 20
    q, kc, vc = rnd(b, sq, h, d, seed=40), rnd(b, cap, h, d, seed=41), rnd(b, cap, h, d, seed=42)
    seqlens, leftpad = torch.tensor([15, 11], dtype=torch.int32), torch.tensor([4, 0], dtype=torch.int32)
    slopes = torch.rand(h, generator=torch.Generator().manual_seed(43)) * 0.3
    out = fa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, cache_leftpad=leftpad, causal=True,
                                     alibi_slopes=slopes)
    for i in range(b):
        keys = slice(int(leftpad[i]), int(seqlens[i]))
        ro, _ = ref_seq(q[i], kc[i, keys], vc[i, keys], causal=True, slopes=slopes)
        assert rel(out[i], ro) < TOL


def test_kvcache_unsupported_and_invalid_arguments():
    q, kc = rnd(2, 1, 2, 16, seed=50), rnd(2, 16, 2, 16, seed=51)
    table = torch.zeros(2, 2, dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="cache_batch_idx"):
        fa.flash_attn_with_kvcache(q, kc, kc, block_table=table, cache_batch_idx=torch.tensor([0, 1]))
    with pytest.raises(NotImplementedError, match="cache_leftpad"):
        fa.flash_attn_with_kvcache(q, kc, kc, block_table=table, cache_leftpad=torch.tensor([0, 1]))
    with pytest.raises(NotImplementedError, match="num_splits"):
        fa.flash_attn_with_kvcache(q, kc, kc, alibi_slopes=torch.ones(2), num_splits=2)
    with pytest.raises(ValueError, match="rotary_cos"):
        fa.flash_attn_with_kvcache(q, kc, kc, rotary_cos=torch.ones(16, 4), rotary_sin=torch.ones(16, 4))
    with pytest.raises(ValueError, match="cache_seqlens"):
        fa.flash_attn_with_kvcache(q, kc, kc, k=q, v=q)
    assert issubclass(fa.FlashAttnNotImplemented, NotImplementedError)
