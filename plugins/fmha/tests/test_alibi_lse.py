"""ck_fmha.attention (batch and group mode) and flash_attn's non-paged functions with ALiBi under a
causal mask: o and the returned LSE in the ALiBi form asked for (FlashAttention's bottom-right
-slope * |i + sk - sq - j|), against a float64 reference written here."""
from __future__ import annotations

import math
import os

if os.environ.get("CK_TEST_GPU") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import ck_fmha  # noqa: E402
from ck_core.errors import InvalidProblem  # noqa: E402
from ck_fmha.flash_attn import flash_attn_func, flash_attn_varlen_func  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")]


def _ref(q, k, v, slopes, alibi_off, mask_off):
    """One sequence, q [H, sq, D], k/v [H, sk, D], slopes [H]: float64 (o, lse) of scores
    q.k/sqrt(D) - slope * |i + alibi_off - j|, keys j <= i + mask_off; rows with no key are NaN."""
    q, k, v, slopes = q.double(), k.double(), v.double(), slopes.double()
    sq, sk = q.shape[1], k.shape[1]
    i, j = torch.arange(sq)[:, None], torch.arange(sk)[None]
    s = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1]) - slopes[:, None, None] * (i + alibi_off - j).abs()
    s = s.masked_fill(j > i + mask_off, float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.softmax(s, -1) @ v
    return o, lse


def _close(got, want, tol):
    seen = torch.isfinite(want)   # rows that see a key
    if want.dim() > seen.dim():
        seen = seen[..., None]
    err = (got.double() - want).abs().masked_fill(~seen, 0).max() / want.masked_fill(~seen, 0).abs().max()
    return float(err) < tol


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).half()


@pytest.mark.parametrize("sq,sk", [(5, 13), (9, 4)])
@pytest.mark.parametrize("per_batch", [False, True])
def test_batch_mode_bottom_right(sq, sk, per_batch):
    b, h, d = 2, 3, 16
    q, k, v = _rand(b, h, sq, d, seed=sq), _rand(b, h, sk, d, seed=sk), _rand(b, h, sk, d, seed=7)
    g = torch.Generator().manual_seed(sq * sk)
    slopes = torch.rand((b, h) if per_batch else (h,), generator=g) + 0.1
    o, lse = ck_fmha.attention(q, k, v, causal=True, align="bottom_right", alibi_slopes=slopes,
                               alibi_align="bottom_right", return_lse=True)
    for bi in range(b):
        ro, rl = _ref(q[bi], k[bi], v[bi], slopes[bi] if per_batch else slopes, sk - sq, sk - sq)
        assert _close(o[bi], ro, 2e-3) and _close(lse[bi], rl, 1e-5)


def test_batch_mode_top_left_and_refusal():
    b, h, sq, sk, d = 1, 2, 6, 11, 16
    q, k, v = _rand(b, h, sq, d, seed=1), _rand(b, h, sk, d, seed=2), _rand(b, h, sk, d, seed=3)
    slopes = torch.tensor([0.3, 0.7])
    o, lse = ck_fmha.attention(q, k, v, causal=True, alibi_slopes=slopes, alibi_align="top_left", return_lse=True)
    ro, rl = _ref(q[0], k[0], v[0], slopes, 0, 0)
    assert _close(o[0], ro, 2e-3) and _close(lse[0], rl, 1e-5)
    # bottom-right ALiBi under a top-left causal mask (sk > sq): a row shift too
    o, lse = ck_fmha.attention(q, k, v, causal=True, alibi_slopes=slopes, alibi_align="bottom_right",
                               return_lse=True)
    ro, rl = _ref(q[0], k[0], v[0], slopes, sk - sq, 0)
    assert _close(o[0], ro, 2e-3) and _close(lse[0], rl, 1e-5)
    # top-left ALiBi under a bottom-right mask with sk > sq differs inside a row: refused, not wrong
    with pytest.raises(InvalidProblem, match="alibi_align"):
        ck_fmha.attention(q, k, v, causal=True, align="bottom_right", alibi_slopes=slopes, alibi_align="top_left")


def test_group_mode_and_flash_attn():
    h, d = 2, 16
    lq, lk = [4, 7, 3], [9, 7, 1]   # sq < sk, sq == sk, sq > sk
    cu_q = torch.tensor([0, 4, 11, 14], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 16, 17], dtype=torch.int32)
    q, k, v = _rand(14, h, d, seed=4), _rand(17, h, d, seed=5), _rand(17, h, d, seed=6)
    slopes = torch.tensor([[0.2, 0.9], [0.5, 0.1], [0.4, 0.6]])
    grp = dict(layout="thd", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=7, max_seqlen_k=9)
    o, lse = ck_fmha.attention(q, k, v, causal=True, align="bottom_right", alibi_slopes=slopes,
                               alibi_align="bottom_right", return_lse=True, **grp)
    o2, lse2, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 9, causal=True, alibi_slopes=slopes,
                                         return_attn_probs=True)
    for bi in range(3):
        qs, ks = slice(int(cu_q[bi]), int(cu_q[bi + 1])), slice(int(cu_k[bi]), int(cu_k[bi + 1]))
        off = lk[bi] - lq[bi]
        ro, rl = _ref(q[qs].transpose(0, 1), k[ks].transpose(0, 1), v[ks].transpose(0, 1), slopes[bi], off, off)
        for got_o, got_l in ((o, lse), (o2, lse2)):
            assert _close(got_o[qs].transpose(0, 1), ro, 2e-3) and _close(got_l[:, qs], rl, 1e-5)
    # flash_attn_func: batch mode, [B, S, H, D]
    qb, kb, vb = _rand(2, 5, h, d, seed=8), _rand(2, 8, h, d, seed=9), _rand(2, 8, h, d, seed=10)
    ob, lb, _ = flash_attn_func(qb, kb, vb, causal=True, alibi_slopes=slopes[:2], return_attn_probs=True)
    for bi in range(2):
        ro, rl = _ref(qb[bi].transpose(0, 1), kb[bi].transpose(0, 1), vb[bi].transpose(0, 1), slopes[bi], 3, 3)
        assert _close(ob[bi].transpose(0, 1), ro, 2e-3) and _close(lb[bi], rl, 1e-5)


def test_batch_prefill_lse_form_and_refusal():
    """batch_prefill through the Dispatcher: the LSE in the asked form (device key lengths), and a
    form that is a row shift only for some lengths is refused."""
    from ck_fmha.prefill import batch_prefill

    h, d, ps = 2, 16, 4
    cu_q = torch.tensor([0, 3, 9], dtype=torch.int32)
    lens = torch.tensor([10, 4], dtype=torch.int32)   # sq < sk and sq > sk
    q, pool = _rand(9, h, d, seed=11), _rand(7, ps, h, d, seed=12)
    table = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int32)
    slopes = torch.tensor([0.25, 0.6])
    kw = dict(cu_seqlens_q=cu_q, max_seqlen_q=6, max_seqlen_k=12, block_table=table, alibi_slopes=slopes)
    o, lse = batch_prefill(q, pool, pool, lens, causal=True, align="bottom_right", alibi_align="bottom_right",
                           return_lse=True, **kw)
    for bi in range(2):
        qs = slice(int(cu_q[bi]), int(cu_q[bi + 1]))
        kv = pool[table[bi]].reshape(3 * ps, h, d)[:int(lens[bi])].transpose(0, 1)
        off = int(lens[bi]) - (qs.stop - qs.start)
        ro, rl = _ref(q[qs].transpose(0, 1), kv, kv, slopes, off, off)
        assert _close(o[qs].transpose(0, 1), ro, 2e-3) and _close(lse[:, qs], rl, 1e-5)
    with pytest.raises(InvalidProblem, match="alibi_align"):
        batch_prefill(q, pool, pool, lens, causal=True, align="bottom_right", alibi_align="top_left", **kw)
