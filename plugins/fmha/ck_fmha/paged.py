"""Paged KV caches: layouts, lookup tables, gather and pack.

Page layouts (``P`` = page_size, ``vec`` = 16 bytes / element = CK's kVectorSize)

* fwd_pagedkv / fwd_splitkv / fwd_appendkv: ``[num_pages, Hk, P, D]`` for
  ``layout="bhsd"``, ``[num_pages, P, Hk, D]`` for ``"bshd"``.
* batch_prefill, ``kv_layout="linear"``: K and V ``[num_pages, P, Hk, D]``.
* batch_prefill, ``kv_layout="vectorized"`` (CK's swizzled layout,
  ``block_attention_kvcache_layout_enum.hpp``):
  K ``[num_pages, Hk, D/vec, P, vec]`` and V ``[num_pages, Hk, P/vec, Dv, vec]``.

Lookup tables

* ``kv_lookup="vllm"``: ``block_table[B, max_pages]`` (int32); key position
  ``t`` of batch ``b`` lives in page ``block_table[b, t // P]`` at slot ``t % P``.
* ``kv_lookup="sglang"``: ``kv_indptr[B+1]``, ``kv_page_indices[nnz]``,
  ``kv_last_page_lens[B]``; batch ``b`` owns pages
  ``kv_page_indices[kv_indptr[b]:kv_indptr[b+1]]`` and holds
  ``(n_pages - 1) * P + last_page_len`` keys.

The logical key length of each batch is always ``problem.seqlens_k[b]``.
"""
from __future__ import annotations

import numpy as np

from ck_core.errors import InvalidProblem

from .problem import FmhaProblem


def _pages_of(p: FmhaProblem, b: int, tables: dict) -> np.ndarray:
    n = -(-p.seqlens_k[b] // p.page_size)
    if p.family == "batch_prefill" and p.kv_lookup == "sglang":
        ip = np.asarray(tables["kv_indptr"])
        pages = np.asarray(tables["kv_page_indices"])[ip[b]:ip[b + 1]]
        if len(pages) < n:
            raise InvalidProblem(f"batch {b} owns {len(pages)} pages in kv_page_indices but seqlens_k[{b}]="
                                 f"{p.seqlens_k[b]} needs {n}")
        return pages[:n].astype(np.int64)
    if "block_table" not in tables or tables["block_table"] is None:
        raise InvalidProblem("a paged KV problem needs block_table (or kv_indptr/kv_page_indices with "
                             "kv_lookup='sglang')")
    return np.asarray(tables["block_table"])[b, :n].astype(np.int64)


def _page_view(p: FmhaProblem, cache: np.ndarray, is_v: bool) -> np.ndarray:
    """Cache -> [num_pages, P, Hk, D] float64 regardless of layout."""
    c = np.asarray(cache, dtype=np.float64)
    if p.family == "batch_prefill":
        if p.kv_layout == "linear":
            return c
        npg, hk = c.shape[0], c.shape[1]
        if is_v:  # [np, Hk, P/vec, D, vec] -> [np, P/vec, vec, Hk, D]
            return c.transpose(0, 2, 4, 1, 3).reshape(npg, p.page_size, hk, c.shape[3])
        # K: [np, Hk, D/vec, P, vec] -> [np, P, Hk, D/vec, vec]
        return c.transpose(0, 3, 1, 2, 4).reshape(npg, p.page_size, hk, c.shape[2] * c.shape[4])
    if p.layout == "bshd":
        return c
    return c.transpose(0, 2, 1, 3)


def gather_paged_kv(p: FmhaProblem, k_cache, v_cache, **tables):
    """Paged K/V -> per-batch contiguous lists of float64 [Hk, seqlens_k[b], D]."""
    kp, vp = _page_view(p, k_cache, False), _page_view(p, v_cache, True)
    ks, vs = [], []
    for b in range(p.batch):
        L = p.seqlens_k[b]
        pages = _pages_of(p, b, tables)
        t = np.arange(L)
        pg, slot = pages[t // p.page_size], t % p.page_size
        ks.append(kp[pg, slot].transpose(1, 0, 2))
        vs.append(vp[pg, slot].transpose(1, 0, 2))
    return ks, vs


def _to_layout(p: FmhaProblem, pages: np.ndarray, is_v: bool) -> np.ndarray:
    """[np, P, Hk, D] -> the family's page layout."""
    if p.family == "batch_prefill":
        if p.kv_layout == "linear":
            return pages
        npg, P, hk, d = pages.shape
        vec = p.kv_vector
        if is_v:
            return pages.reshape(npg, P // vec, vec, hk, d).transpose(0, 3, 1, 4, 2).copy()
        return pages.reshape(npg, P, hk, d // vec, vec).transpose(0, 2, 3, 1, 4).copy()
    if p.layout == "bshd":
        return pages
    return pages.transpose(0, 2, 1, 3).copy()


def pack_paged_kv(p: FmhaProblem, ks, vs, rng=None, extra_pages: int = 1, dtype=np.float64):
    """Scatter per-batch K/V [Hk, L_b, D] into shuffled pages; inverse of :func:`gather_paged_kv`.

    Returns ``(k_cache, v_cache, tables)`` where ``tables`` holds
    ``block_table`` (vllm) or ``kv_indptr``/``kv_page_indices``/``kv_last_page_lens``
    (sglang).  Unused slots and ``extra_pages`` spare pages are filled with noise
    so a wrong gather shows.  ``rng`` (a numpy Generator) shuffles page order.
    """
    rng = rng if rng is not None else np.random.default_rng(0)
    P = p.page_size
    need = [-(-p.seqlens_k[b] // P) for b in range(p.batch)]
    total = sum(need) + extra_pages
    order = rng.permutation(total)
    hk, dq, dv = p.nhead_k, p.hdim_q, p.hdim_v
    kpages = rng.standard_normal((total, P, hk, dq)) * 100
    vpages = rng.standard_normal((total, P, hk, dv)) * 100
    owned, cur = [], 0
    for b in range(p.batch):
        pages = order[cur:cur + need[b]]
        cur += need[b]
        owned.append(pages)
        L = p.seqlens_k[b]
        t = np.arange(L)
        kpages[pages[t // P], t % P] = np.asarray(ks[b], dtype=np.float64).transpose(1, 0, 2)
        vpages[pages[t // P], t % P] = np.asarray(vs[b], dtype=np.float64).transpose(1, 0, 2)
    tables: dict = {}
    if p.family == "batch_prefill" and p.kv_lookup == "sglang":
        tables["kv_indptr"] = np.concatenate([[0], np.cumsum(need)]).astype(np.int32)
        tables["kv_page_indices"] = np.concatenate(owned + [np.zeros(0, np.int64)]).astype(np.int32)
        tables["kv_last_page_lens"] = np.array(
            [(L - (n - 1) * P) if n else 0 for L, n in zip(p.seqlens_k, need)], dtype=np.int32)
    else:
        width = max(max(need, default=0), 1) + 1
        bt = np.full((p.batch, width), total - 1, dtype=np.int32)  # padding points at a noise page
        for b, pages in enumerate(owned):
            bt[b, : len(pages)] = pages
        tables["block_table"] = bt
    return (_to_layout(p, kpages, False).astype(dtype), _to_layout(p, vpages, True).astype(dtype), tables)
