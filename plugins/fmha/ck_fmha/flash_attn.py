"""FlashAttention's public Python API (flash-attn 2.x) on ck-fmha's kernels.

Drop-in for ``from flash_attn import ...``: the same functions, arguments, tensor layouts
([B, S, H, D]; varlen [total, H, D] with ``cu_seqlens``) and return conventions
(``out``, or ``(out, softmax_lse, S_dmask)`` with ``return_attn_probs=True``; ``softmax_lse`` is fp32
[B, H, Sq], or [H, total_q] in varlen mode).  As in FlashAttention's CK (ROCm) backend, ``S_dmask`` is
the uint8 dropout random values (CK's ``store_randval``): [B, H, Sq, Sk], or [H, total_q, max_seqlen_k]
in varlen mode; an element is kept iff ``S_dmask <= floor(255 * (1 - dropout_p))``.  Without dropout
it is an empty tensor.

Head dims that are not a multiple of 8 are zero-padded to one (and the output sliced back), as
FlashAttention does; with ``flash_attn_with_kvcache`` that means padded copies of the caches.

Masks are FlashAttention's: causal and ``window_size`` aligned to the bottom-right corner of each
sequence's score matrix; ALiBi adds ``-slope * |i + seqlen_k - seqlen_q - j|``.  Dropout draws its
Philox seed from torch's default generator, so ``torch.manual_seed`` makes it repeatable.

What the kernels do not do raises :class:`FlashAttnNotImplemented` (a ``NotImplementedError``) naming
the argument; nothing computes something else silently.
"""
from __future__ import annotations

import torch

from ck_core.errors import InvalidProblem, UnsupportedProblem

from . import attention as _attention
from . import decode, prefill
from .backends.triton import launch as ops

__all__ = ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
           "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache",
           "FlashAttnNotImplemented"]


class FlashAttnNotImplemented(UnsupportedProblem, NotImplementedError):
    """A FlashAttention argument (or combination) that ck-fmha's kernels do not implement."""


def _window(window_size):
    # FlashAttention's tests pass a 2-element tensor here
    left, right = (int(w) for w in window_size)
    return left, right


def _mask(causal, window_size):
    return dict(causal="bottom_right" if causal else False, window=_window(window_size), align="bottom_right")


def _seed(dropout_p: float) -> int:
    # one draw from torch's default generator: torch.manual_seed(n) repeats the dropout pattern
    return int(torch.empty((), dtype=torch.int64).random_()) if dropout_p > 0 else 0


def _pad8(*tensors):
    """The tensors with their last (head) dim zero-padded to a multiple of 8, as FlashAttention does
    before its kernels (CK's rule R04): zero channels change no logit and give zero output columns."""
    extra = -next(t for t in tensors if t is not None).shape[-1] % 8
    return tuple(None if t is None else torch.nn.functional.pad(t, (0, extra)) for t in tensors)


def _check_cu(*cus) -> None:
    """cu_seqlens as FlashAttention takes them: int32 tensors (a float or int64 one is refused, not
    converted: a cast would truncate offsets silently)."""
    for name, t in zip(("cu_seqlens_q", "cu_seqlens_k"), cus):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
            raise InvalidProblem(f"{name} must be an int32 tensor (as FlashAttention's), got "
                                 f"{getattr(t, 'dtype', type(t).__name__)}; build it with dtype=torch.int32")


def _attn(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
          return_attn_probs, varlen=None):
    """Batch ('bshd') or group mode ('thd', ``varlen`` = (cu_q, cu_k, max_q, max_k))."""
    d = q.shape[-1]
    if d % 8:   # padded through autograd, so the gradients come back at the caller's head dim
        scale = d ** -0.5 if softmax_scale is None else softmax_scale
        res = _attn(*_pad8(q, k, v), dropout_p, scale, causal, window_size, softcap, alibi_slopes,
                    deterministic, return_attn_probs, varlen)
        return (res[0][..., :d], *res[1:]) if return_attn_probs else res[..., :d]
    dropout_p = float(dropout_p or 0.0)
    seed = _seed(dropout_p)
    group = {}
    if varlen is not None:
        cu_q, cu_k, max_q, max_k = varlen
        _check_cu(cu_q, cu_k)
        group = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                     max_seqlen_q=int(max_q), max_seqlen_k=int(max_k))
    out, lse = _attention(q, k, v, scale=softmax_scale, softcap=float(softcap or 0.0),
                          layout="thd" if varlen is not None else "bshd", deterministic=bool(deterministic),
                          alibi_slopes=alibi_slopes, alibi_align="bottom_right" if alibi_slopes is not None else None,
                          dropout_p=dropout_p, seed=seed, offset=0, return_lse=True, **group,
                          **_mask(causal, window_size))
    if not return_attn_probs:
        return out
    if dropout_p == 0.0:
        return out, lse, torch.empty(0, dtype=torch.uint8, device=q.device)
    if varlen is None:
        b, sq, h, _ = q.shape
        s_dmask = ops.dropout_randval(b, h, sq, k.shape[1], dropout_p=dropout_p, seed=seed, device=q.device)
    else:
        s_dmask = ops.dropout_randval(group["cu_seqlens_q"].numel() - 1, q.shape[1], group["max_seqlen_q"],
                                      group["max_seqlen_k"], dropout_p=dropout_p, seed=seed, device=q.device,
                                      cu_seqlens_q=group["cu_seqlens_q"], cu_seqlens_k=group["cu_seqlens_k"],
                                      total_q=q.shape[0])
    return out, lse, s_dmask


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q [B, Sq, H, D], k/v [B, Sk, Hk, D] (H a multiple of Hk) -> out [B, Sq, H, D]."""
    return _attn(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                 return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """kv [B, Sk, 2, Hk, D]."""
    k, v = kv.unbind(2)
    return _attn(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                 return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """qkv [B, S, 3, H, D]."""
    q, k, v = qkv.unbind(2)
    return _attn(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                 return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """q [total_q, H, D], k/v [total_k, Hk, D] with int32 ``cu_seqlens_q/k`` [B+1].  With ``block_table``
    [B, max_blocks], k/v are page pools [num_blocks, page_size, Hk, D] and sequence b's keys are its first
    ``cu_seqlens_k[b+1] - cu_seqlens_k[b]`` slots (forward only)."""
    if block_table is None:
        return _attn(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                     return_attn_probs, varlen=(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k))
    if dropout_p:
        raise FlashAttnNotImplemented("dropout_p > 0 with block_table: the paged forward is for inference")
    d = q.shape[-1]
    if d % 8:   # padded copies of the page pools (this forward does not write them)
        res = flash_attn_varlen_func(*_pad8(q, k, v), cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                     softmax_scale=d ** -0.5 if softmax_scale is None else softmax_scale,
                                     causal=causal, window_size=window_size, softcap=softcap,
                                     alibi_slopes=alibi_slopes, deterministic=deterministic,
                                     return_attn_probs=return_attn_probs, block_table=block_table)
        return (res[0][..., :d], *res[1:]) if return_attn_probs else res[..., :d]
    _check_cu(cu_seqlens_q, cu_seqlens_k)
    cu_k = cu_seqlens_k
    out, lse = _PagedForward.apply(q, k, v, dict(
        seqlens_k=cu_k[1:] - cu_k[:-1], cu_seqlens_q=cu_seqlens_q.to(torch.int32), max_seqlen_q=int(max_seqlen_q),
        max_seqlen_k=int(max_seqlen_k), block_table=block_table, scale=softmax_scale, softcap=float(softcap or 0.0),
        alibi_slopes=alibi_slopes, alibi_align="bottom_right" if alibi_slopes is not None else None,
        **_mask(causal, window_size)))
    if return_attn_probs:
        return out, lse, torch.empty(0, dtype=torch.uint8, device=q.device)
    return out


class _PagedForward(torch.autograd.Function):
    """batch_prefill under autograd: a backward through a paged cache raises instead of returning nothing."""

    @staticmethod
    def forward(ctx, q, k_pages, v_pages, kw):
        seqlens_k = kw.pop("seqlens_k")
        out, lse = prefill.batch_prefill(q, k_pages, v_pages, seqlens_k, return_lse=True, **kw)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, *_):
        raise FlashAttnNotImplemented("block_table: there is no backward through a paged KV cache")


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """kv [total_k, 2, Hk, D]."""
    k, v = kv.unbind(1)
    return _attn(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                 return_attn_probs, varlen=(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k))


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """qkv [total, 3, H, D]."""
    q, k, v = qkv.unbind(1)
    return _attn(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                 return_attn_probs, varlen=(cu_seqlens, cu_seqlens, max_seqlen, max_seqlen))


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """Decode / chunked prefill over a KV cache (no backward).  k_cache/v_cache: [B_cache, S_cache, Hk, D],
    or page pools [num_blocks, page_size, Hk, D] with ``block_table`` [B, max_blocks].  New ``k``/``v``
    [B, S_new, Hk, D] are written into the caches in place at ``cache_seqlens`` (RoPE applied to them and
    to q when ``rotary_cos``/``rotary_sin`` [S_ro, rotary_dim / 2] are given).  ``num_splits``: 0 picks
    the split-KV heuristic, 1 runs one pass, n > 1 splits the keys n ways."""
    b, sq, hq, d = q.shape
    if (k is None) != (v is None):
        raise InvalidProblem("pass both k and v (the new keys and values) or neither")
    if d % 8:
        # as FlashAttention's CK backend: padded copies of q and the caches, the appended rows copied back
        kcp, vcp = _pad8(k_cache, v_cache)
        res = flash_attn_with_kvcache(
            *_pad8(q), kcp, vcp, *_pad8(k, v), rotary_cos=rotary_cos, rotary_sin=rotary_sin,
            cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
            block_table=block_table, softmax_scale=d ** -0.5 if softmax_scale is None else softmax_scale,
            causal=causal, window_size=window_size, softcap=softcap, rotary_interleaved=rotary_interleaved,
            alibi_slopes=alibi_slopes, num_splits=num_splits, return_softmax_lse=return_softmax_lse)
        if k is not None:
            k_cache.copy_(kcp[..., :d])
            v_cache.copy_(vcp[..., :d])
        return (res[0][..., :d], res[1]) if return_softmax_lse else res[..., :d]
    if (rotary_cos is None) != (rotary_sin is None):
        raise InvalidProblem("pass both rotary_cos and rotary_sin or neither")
    if rotary_cos is not None and k is None:
        raise InvalidProblem("rotary_cos/rotary_sin rotate the appended k (and q); pass k and v as well")
    cache_len = block_table.shape[1] * k_cache.shape[1] if block_table is not None else k_cache.shape[1]
    if rotary_cos is not None and rotary_cos.shape[0] < cache_len:   # FlashAttention's own check
        raise InvalidProblem(f"rotary_cos/rotary_sin have {rotary_cos.shape[0]} rows; they must cover the KV "
                             f"cache's {cache_len} positions")
    if block_table is not None and cache_batch_idx is not None:
        raise FlashAttnNotImplemented("cache_batch_idx with block_table (index the block_table rows instead)")
    if block_table is not None and cache_leftpad is not None:
        raise FlashAttnNotImplemented("cache_leftpad with block_table")
    num_splits = int(num_splits or 0)
    if num_splits > 1 and (alibi_slopes is not None or cache_leftpad is not None):
        raise FlashAttnNotImplemented("num_splits > 1 with alibi_slopes or cache_leftpad: the split-KV kernel "
                                      "has no ALiBi and reads no left padding; pass num_splits=0 or 1")
    page = block_table.shape[1] * k_cache.shape[1] if block_table is not None else k_cache.shape[1]
    if cache_seqlens is None:
        if k is not None:
            raise InvalidProblem("k/v are appended at cache_seqlens; pass cache_seqlens")
        seqlens = torch.full((b,), page, dtype=torch.int32, device=q.device)
    elif isinstance(cache_seqlens, int):
        seqlens = torch.full((b,), cache_seqlens, dtype=torch.int32, device=q.device)
    else:
        seqlens = cache_seqlens.to(torch.int32)
    # one lookup for every kernel: a paged cache's block_table, or a contiguous cache seen as pages
    # (so that cache_batch_idx is a block table)
    kl, vl = k_cache, v_cache
    if block_table is not None:
        table = block_table.to(torch.int32)
    elif cache_batch_idx is not None:
        table, kl, vl = _rows_as_pages(cache_batch_idx.to(torch.int32).reshape(b), k_cache, v_cache)
    else:
        table = None
    mask = _mask(causal, window_size)
    if k is not None:
        local = mask["window"] != (-1, -1)
        q, seqlens = _append(q, k, v, kl, vl, seqlens, table, rotary_cos, rotary_sin,
                             rotary_interleaved, q_at_own_positions=bool(causal) or local)
    if cache_leftpad is None:   # the left-padded path indexes the caches' rows itself
        k_cache, v_cache = kl, vl
    out, lse = _attend(q, k_cache, v_cache, seqlens, table, page, cache_leftpad, cache_batch_idx, mask,
                       softmax_scale, float(softcap or 0.0), alibi_slopes, num_splits)
    return (out, lse) if return_softmax_lse else out


def _rows_as_pages(batch_idx, k_cache, v_cache):
    """A contiguous cache [B_cache, S, Hk, D] as a page pool (views of the same memory, so writes land
    in the caller's cache) and the block table that maps row b to cache row ``batch_idx[b]``.  The
    page size is the largest power of two dividing S (pages are powers of two: problem rule R08)."""
    s = k_cache.shape[1]
    ps = s & -s
    n = s // ps
    pools = []
    for c in (k_cache, v_cache):
        if c.stride(0) != s * c.stride(1):
            raise FlashAttnNotImplemented("cache_batch_idx with a cache whose rows are not dense [S, Hk, D] "
                                          "blocks (make the cache contiguous)")
        pools.append(c.unflatten(1, (n, ps)).flatten(0, 1))
    table = batch_idx[:, None] * n + torch.arange(n, dtype=torch.int32, device=batch_idx.device)[None, :]
    return table, pools[0], pools[1]


def _append(q, k, v, k_cache, v_cache, seqlens, table, cos, sin, interleaved, q_at_own_positions):
    """Write k/v into the caches at ``seqlens`` (RoPE on k and q); -> (q to attend with, new seqlens).

    FlashAttention rotates query row i at position seqlens + i under a causal or local mask, and every
    query row at position seqlens otherwise: then q is passed as one row of Sq*H heads."""
    b, sq, hq, d = q.shape
    rope = "none" if cos is None else ("interleaved" if interleaved else "half_rotated")
    rdim = 0 if cos is None else 2 * cos.shape[-1]
    q_in = q if q_at_own_positions or rope == "none" else q.reshape(b, 1, sq * hq, d)
    q_rot, _, _ = decode.appendkv(q_in, k, v, k_cache, v_cache, seqlens, rotary_cos=cos, rotary_sin=sin, rope=rope,
                               rotary_dim=rdim, block_table=table, layout="bshd")
    return (q if rope == "none" else q_rot.reshape(b, sq, hq, d)), seqlens + k.shape[1]


def _attend(q, k_cache, v_cache, seqlens, table, page, leftpad, batch_idx, mask, scale, softcap, alibi_slopes,
            num_splits):
    """Attention of q [B, Sq, H, D] over the caches' first ``seqlens`` keys -> (out, lse [B, H, Sq])."""
    b, sq, hq, d = q.shape
    common = dict(scale=scale, softcap=softcap, **mask)
    if leftpad is not None:
        return _attend_leftpad(q, k_cache, v_cache, seqlens, leftpad.to(torch.int32), batch_idx, common,
                               alibi_slopes)
    if alibi_slopes is None and num_splits != 1:
        splits = None if num_splits == 0 else num_splits
        if table is not None:
            return decode.paged_decode(q, k_cache, v_cache, table, seqlens, max_seqlen_k=page, num_splits=splits,
                                    return_lse=True, layout="bshd", **common)
        return decode.splitkv_decode(q, k_cache, v_cache, seqlens_k=seqlens, num_splits=splits, return_lse=True,
                                  layout="bshd", **common)
    # one pass (num_splits=1, or ALiBi, which only the one-pass kernel adds): group-mode queries over pages
    if table is None:   # each cache row one page, or for any other length power-of-two pages (rule R08)
        rows = torch.arange(b, dtype=torch.int32, device=q.device)
        s = k_cache.shape[1]
        if s & (s - 1):
            table, k_cache, v_cache = _rows_as_pages(rows, k_cache, v_cache)
        else:
            table = rows.reshape(b, 1)
    cu_q = torch.arange(0, (b + 1) * sq, sq, dtype=torch.int32, device=q.device)
    out, lse = prefill.batch_prefill(q.reshape(b * sq, hq, d), k_cache, v_cache, seqlens, cu_seqlens_q=cu_q,
                                 max_seqlen_q=sq, max_seqlen_k=page, block_table=table, return_lse=True,
                                 alibi_slopes=alibi_slopes,
                                 alibi_align="bottom_right" if alibi_slopes is not None else None, **common)
    lse = lse.reshape(hq, b, sq)
    return out.reshape(b, sq, hq, -1), lse.permute(1, 0, 2).contiguous()


def _attend_leftpad(q, k_cache, v_cache, seqlens, leftpad, batch_idx, common, alibi_slopes):
    """Keys [leftpad, seqlens) of each row, packed into group mode (a copy: the kernels read each
    sequence from its first slot); positions, masks and ALiBi count from the first valid key."""
    b, sq, hq, d = q.shape
    rows = batch_idx.long() if batch_idx is not None else torch.arange(b, device=q.device)
    pos = torch.arange(k_cache.shape[1], device=q.device)
    valid = (pos[None, :] >= leftpad[:, None]) & (pos[None, :] < seqlens[:, None])
    kp, vp = k_cache[rows][valid], v_cache[rows][valid]
    cu_k = torch.zeros(b + 1, dtype=torch.int32, device=q.device)
    cu_k[1:] = torch.cumsum(valid.sum(1), 0)
    cu_q = torch.arange(0, (b + 1) * sq, sq, dtype=torch.int32, device=q.device)
    # through the Dispatcher (group mode over the packed keys), as every other path here
    out, lse = _attention(q.reshape(b * sq, hq, d), kp, vp, layout="thd", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                          max_seqlen_q=sq, max_seqlen_k=k_cache.shape[1], return_lse=True,
                          alibi_slopes=alibi_slopes,
                          alibi_align="bottom_right" if alibi_slopes is not None else None, **common)
    return out.reshape(b, sq, hq, -1), lse.reshape(hq, b, sq).permute(1, 0, 2).contiguous()
