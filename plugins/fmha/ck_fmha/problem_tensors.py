"""The tensors of an :class:`~ck_fmha.problem.FmhaProblem`: the shape of each one its family reads
or writes (:func:`expected_shapes`) and the checks of the arrays a caller passes
(:func:`check_tensors`); the layouts are tabled in :mod:`ck_fmha.problem`.  The functions read the
problem's fields (this module sits below ``problem.py`` and does not import it).
"""
from __future__ import annotations

import numpy as np

from ck_core.dtypes import numpy_storage
from ck_core.errors import InvalidProblem


def _qkv_shape(p, heads: int, seq: int, dim: int) -> tuple:
    if p.layout == "bshd":
        return (p.batch, seq, heads, dim)
    return (p.batch, heads, seq, dim)


def expected_shapes(p, **given) -> dict:
    """Expected shape of every tensor the problem's family reads or writes.

    ``given`` lets shapes that the problem does not fix (number of pages,
    block-table width, total page-table length) be taken from the arrays.
    Entries are tuples; an entry of ``None`` in a tuple means "any".
    Broadcastable tensors (bias, alibi slopes) give a tuple of alternatives.
    """
    H, Hk, Dq, Dv = p.nhead_q, p.nhead_k, p.hdim_q, p.hdim_v
    sh: dict = {}
    if p.is_group:
        Tq, Tk = p.total_q, (p.seqstart_k[-1] if p.seqstart_k is not None else None)
        if p.runtime_seqstarts:
            Tk = None if p.paged_kv else p.packed_k
            sh["cu_seqlens_q"] = (p.batch + 1,)
            if not p.paged_kv:
                sh["cu_seqlens_k"] = (p.batch + 1,)
        sh["q"] = (Tq, H, Dq)
        sh["o"] = sh["do"] = (Tq, H, Dv)
        sh["dq"] = (Tq, H, Dq)
        if Tk is not None:
            sh["k"] = sh["dk"] = (Tk, Hk, Dq)
            sh["v"] = sh["dv"] = (Tk, Hk, Dv) if p.vlayout == "r" else (Hk, Dv, Tk)
        rows = (H, Tq)
        sh["bias"] = ((H, Tq, p.seqlen_k), (1, Tq, p.seqlen_k))
        sh["randval"] = (H, Tq, p.seqlen_k)
    else:
        sh["q"] = _qkv_shape(p, H, p.seqlen_q, Dq)
        sh["dq"] = sh["q"]
        sh["o"] = sh["do"] = _qkv_shape(p, H, p.seqlen_q, Dv)
        sh["k"] = sh["dk"] = _qkv_shape(p, Hk, p.seqlen_k, Dq)
        if p.vlayout == "r":
            sh["v"] = sh["dv"] = _qkv_shape(p, Hk, p.seqlen_k, Dv)
        else:
            sh["v"] = sh["dv"] = (p.batch, Hk, Dv, p.seqlen_k)
        rows = (p.batch, H, p.seqlen_q)
        sh["bias"] = tuple((b, h, p.seqlen_q, p.seqlen_k) for b in (p.batch, 1) for h in (H, 1))
        sh["randval"] = (p.batch, H, p.seqlen_q, p.seqlen_k)
    sh["dbias"] = sh["bias"]
    sh["lse"] = sh["d"] = rows
    sh["alibi_slopes"] = ((H,), (p.batch, H))
    sh["sink"] = (H,)
    nsplit = p.num_splits
    sh["o_acc"] = (nsplit,) + sh["o"] if p.is_group else (nsplit, p.batch, H, p.seqlen_q, Dv)
    sh["lse_acc"] = (nsplit,) + rows
    # dq accumulator: [nsplits, *q shape]; nsplits is 1 unless deterministic
    sh["dq_acc"] = (None,) + sh["dq"]
    if p.paged_kv:
        npages = np.shape(given["k_cache"])[0] if "k_cache" in given else None
        sh["k_cache"], sh["v_cache"] = _paged_cache_shapes(p, npages)
        if p.family == "batch_prefill" and p.kv_lookup == "sglang":
            sh["kv_indptr"] = (p.batch + 1,)
            sh["kv_page_indices"] = (None,)
            sh["kv_last_page_lens"] = (p.batch,)
        else:
            sh["block_table"] = (p.batch, None)
    elif p.family == "fwd_appendkv":
        sh["k_cache"] = _qkv_shape(p, Hk, p.seqlen_k, Dq)
        sh["v_cache"] = _qkv_shape(p, Hk, p.seqlen_k, Dv)
    if p.family == "fwd_appendkv":
        sh["knew"] = _qkv_shape(p, Hk, p.seqlen_knew, Dq)
        sh["vnew"] = _qkv_shape(p, Hk, p.seqlen_knew, Dv)
        if p.rope != "none":
            sh["rotary_cos"] = sh["rotary_sin"] = (None, p.rotary_dim // 2)
    return sh


def _paged_cache_shapes(p, npages) -> tuple:
    Hk, Dq, Dv, P = p.nhead_k, p.hdim_q, p.hdim_v, p.page_size
    if p.family == "batch_prefill":
        if p.kv_layout == "vectorized":
            vec = p.kv_vector
            return ((npages, Hk, Dq // vec, P, vec), (npages, Hk, P // vec, Dv, vec))
        return ((npages, P, Hk, Dq), (npages, P, Hk, Dv))
    if p.layout == "bshd":
        return ((npages, P, Hk, Dq), (npages, P, Hk, Dv))
    return ((npages, Hk, P, Dq), (npages, Hk, P, Dv))


#: largest finite OCP e4m3 value; fp8 problems hold e4m3 values (the reference reads them as given)
FP8_MAX = 448.0
_FP8_DATA = ("q", "k", "v", "k_cache", "v_cache", "knew", "vnew")
_INT_TENSORS = ("block_table", "kv_indptr", "kv_page_indices", "kv_last_page_lens", "cu_seqlens_q", "cu_seqlens_k")
_FP32_TENSORS = ("o_acc", "lse_acc", "dq_acc", "lse", "d", "alibi_slopes", "sink")


def _shape_ok(actual: tuple, expected: tuple) -> bool:
    return len(actual) == len(expected) and all(e is None or a == e for a, e in zip(actual, expected))


def check_tensors(problem, **arrays) -> None:
    """Check shapes and dtypes of the given numpy arrays against ``problem``.

    Names are those of :func:`expected_shapes` (q, k, v, o, lse, do, d, dq,
    dk, dv, dq_acc, bias, dbias, alibi_slopes, sink, randval, o_acc, lse_acc,
    k_cache, v_cache, block_table, kv_indptr, kv_page_indices,
    kv_last_page_lens, knew, vnew, rotary_cos, rotary_sin).  ``None`` values
    are skipped.  Raises :class:`InvalidProblem` naming the tensor, the
    expected and the actual shape (or dtype).
    """
    p = problem
    arrays = {k: v for k, v in arrays.items() if v is not None}
    exp = expected_shapes(p, **arrays)
    storage = numpy_storage(p.dtype)
    for name, arr in arrays.items():
        if name not in exp:
            raise InvalidProblem(f"tensor {name!r} is not read or written by a {p.family} problem "
                                 f"(mode={p.mode}, paged_kv={p.paged_kv}); known: {sorted(exp)}")
        a = np.asarray(arr)
        want = exp[name]
        alts = want if (want and isinstance(want[0], tuple)) else (want,)
        if not any(_shape_ok(a.shape, w) for w in alts):
            shown = " or ".join(str(tuple("*" if x is None else x for x in w)) for w in alts)
            raise InvalidProblem(f"tensor {name!r} has shape {a.shape}; expected {shown} "
                                 f"for {p.family} in {p.mode} mode, layout {p.layout}")
        if name in _INT_TENSORS:
            if not np.issubdtype(a.dtype, np.integer):
                raise InvalidProblem(f"tensor {name!r} has dtype {a.dtype}; expected an integer dtype (int32)")
        elif name == "randval":
            if a.dtype != np.uint8:
                raise InvalidProblem(f"tensor 'randval' has dtype {a.dtype}; expected uint8")
        elif name in _FP32_TENSORS:
            if a.dtype not in (np.float32, np.float64):
                raise InvalidProblem(f"tensor {name!r} has dtype {a.dtype}; expected float32 (float64 accepted)")
        elif name in ("rotary_cos", "rotary_sin"):
            if not np.issubdtype(a.dtype, np.floating):
                raise InvalidProblem(f"tensor {name!r} has dtype {a.dtype}; expected a float dtype")
        else:
            if a.dtype not in (storage, np.float64):
                raise InvalidProblem(f"tensor {name!r} has dtype {a.dtype}; expected {storage} "
                                     f"(storage of {p.dtype}) or float64")
            if p.dtype == "fp8" and name in _FP8_DATA and a.size and np.nanmax(np.abs(a), initial=0.0) > FP8_MAX:
                raise InvalidProblem(f"tensor {name!r} holds values outside the fp8 e4m3 range +-{FP8_MAX:g}; "
                                     "quantise it (scale into range, pass the factor as scale_q/k/v)")
    _check_paged_tables(p, arrays)


def _check_paged_tables(p, arrays: dict) -> None:
    if not p.paged_kv:
        return
    npages = arrays["k_cache"].shape[0] if "k_cache" in arrays else None
    lens = p.seqlens_k
    need = [-(-l // p.page_size) for l in lens]
    if "block_table" in arrays:
        bt = np.asarray(arrays["block_table"])
        if bt.shape[1] < max(need, default=0):
            raise InvalidProblem(f"tensor 'block_table' has shape {bt.shape}; expected at least "
                                 f"{max(need)} columns to hold seqlens_k={list(lens)} at page_size={p.page_size}")
        if npages is not None:
            for b, n in enumerate(need):
                used = bt[b, :n]
                if used.size and (used.min() < 0 or used.max() >= npages):
                    raise InvalidProblem(f"tensor 'block_table' row {b} indexes pages {used.tolist()} outside "
                                         f"[0, {npages}) of k_cache")
    if "kv_indptr" in arrays:
        ip = np.asarray(arrays["kv_indptr"])
        if ip[0] != 0 or np.any(np.diff(ip) < 0):
            raise InvalidProblem(f"tensor 'kv_indptr' {ip.tolist()} must start at 0 and be non-decreasing")
        if "kv_last_page_lens" in arrays:
            last = np.asarray(arrays["kv_last_page_lens"])
            for b in range(p.batch):
                n = int(ip[b + 1] - ip[b])
                got = 0 if n == 0 else (n - 1) * p.page_size + int(last[b])
                if got != lens[b] or (n and not (1 <= last[b] <= p.page_size)):
                    raise InvalidProblem(f"page table of batch {b} holds {got} keys ({n} pages, last page "
                                         f"{int(last[b])}) but seqlens_k[{b}]={lens[b]}; fix kv_indptr/"
                                         "kv_last_page_lens or seqlens_k")
        if "kv_page_indices" in arrays:
            idx = np.asarray(arrays["kv_page_indices"])
            if idx.shape[0] < ip[-1]:
                raise InvalidProblem(f"tensor 'kv_page_indices' has shape {idx.shape}; expected at least "
                                     f"kv_indptr[-1]={int(ip[-1])} entries")
            if npages is not None and idx.size and (idx.min() < 0 or idx.max() >= npages):
                raise InvalidProblem(f"tensor 'kv_page_indices' indexes pages outside [0, {npages})")
