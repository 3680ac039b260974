"""``batch_prefill`` through the Dispatcher: group-mode queries over a paged KV cache.

The key lengths and the query offsets come at run time (``runtime_seqlens_k``: the int32 tensor
``seqlens_k``, read by the kernel; ``runtime_seqstarts``: the tensor ``cu_seqlens_q``, checked by
the kernel too, see :mod:`ck_fmha.device_errors`); the problem carries ``max_seqlen_q``
and ``max_seqlen_k`` as their bounds, so no value goes to the host and the problem and its plan
are cached per (shapes, maxima, options).
"""
from __future__ import annotations

import torch

from ck_core import api as core
from ck_core import warm
from ck_core.errors import InvalidProblem
from ck_core.plugins import get_manager
from ck_core.warm import tensor_sig

from .api import _check_alibi_align, _from_backend, _mask_fields, _to_backend, _token, group_alibi_shift
from .decode import _lens, _lens_as_is, _replay_closure, page_guard
from .device_errors import raise_pending
from .problem import FmhaProblem

_PROBLEMS: dict = {}
#: the first field of batch_prefill's warm-call signatures (ck_core.warm)
_PREFILL = "ck_fmha.batch_prefill"

core.on_clear(_PROBLEMS.clear)

_OPTIONS = ("causal", "scale", "window", "softcap", "align", "bias", "alibi_slopes", "alibi_align", "dropout_p",
            "seed", "offset", "sink", "sink_tokens", "return_lse", "config", "_trusted_varlen")


def _pages(k_cache, v_cache, kv_layout):
    """(page_size, nhead_k, hdim_q, hdim_v) of the page pools."""
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise InvalidProblem("the KV page pools need a contiguous last dimension")
    if kv_layout == "linear":
        if k_cache.dim() != 4:
            raise InvalidProblem(f"linear pages are [pages, P, Hk, D], got {tuple(k_cache.shape)}")
        _, ps, hk, dq = k_cache.shape
        return ps, hk, dq, v_cache.shape[-1]
    if kv_layout == "vectorized":
        if k_cache.dim() != 5 or v_cache.dim() != 5:
            raise InvalidProblem(f"vectorized pages are K [pages, Hk, D/vec, P, vec], V [pages, Hk, P/vec, Dv, vec]; "
                                 f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
        _, hk, dchunks, ps, vec = k_cache.shape
        return ps, hk, dchunks * vec, v_cache.shape[3]
    raise InvalidProblem(f"kv_layout={kv_layout!r} is not 'linear' or 'vectorized'")


def batch_prefill(q, k_cache, v_cache, seqlens_k, *, cu_seqlens_q, max_seqlen_q, max_seqlen_k, block_table=None,
                  kv_indptr=None, kv_page_indices=None, kv_layout="linear", **kw):
    """Arguments and results as :func:`ck_fmha.backends.triton.launch.batch_prefill_launch`; an explicit
    ``config`` runs that tile (kernel-direct).  A device ``seqlens_k`` entry outside [0, capacity]
    (``max_seqlen_k``, bounded by the batch's pages) gives NaN rows and the flag of
    :mod:`ck_fmha.device_errors`."""
    raise_pending()
    for name in ("alibi_slopes", "sink"):
        # fp32 and contiguous here, not in the launcher: a replay repeats launches only, and would read
        # a copy made inside the launcher as an uninitialised scratch buffer (see decode._rope_tables)
        x = kw.get(name)
        if isinstance(x, torch.Tensor) and isinstance(q, torch.Tensor) and (
                x.dtype != torch.float32 or not x.is_contiguous() or x.device != q.device):
            kw = {**kw, name: x.to(device=q.device, dtype=torch.float32).contiguous()}
    wsig = None
    if not kw.get("_trusted_varlen") and not torch.compiler.is_compiling():
        # a known signature replays the recorded launches: the tensors' signatures and the options
        try:
            wsig = (_PREFILL, get_manager(), *[None if x is None else tensor_sig(x) for x in (
                q, k_cache, v_cache, seqlens_k, cu_seqlens_q, block_table, kv_indptr, kv_page_indices)],
                max_seqlen_q, max_seqlen_k, kv_layout,
                *[(n, tensor_sig(x) if isinstance(x, torch.Tensor) else x) for n, x in sorted(kw.items())])
            f = warm.get(wsig)   # (hashes the signature: an unhashable option raises TypeError here)
        except (AttributeError, TypeError):   # an argument of another type: the checks below say what
            wsig = f = None
        if wsig is not None:
            if f is not None:
                return f(q, k_cache, v_cache, seqlens_k, cu_seqlens_q, block_table, kv_indptr, kv_page_indices,
                         kw.get("bias"), kw.get("alibi_slopes"), kw.get("sink"))
    from .backends.triton import launch_decode as ops_dec

    unknown = sorted(set(kw) - set(_OPTIONS))
    if unknown:
        raise InvalidProblem(f"batch_prefill got unknown keyword(s) {unknown}; it takes {', '.join(_OPTIONS[:-1])}")
    if kw.get("config") is not None:
        return ops_dec.batch_prefill_launch(q, k_cache, v_cache, seqlens_k, cu_seqlens_q=cu_seqlens_q,
                                        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                        block_table=block_table, kv_indptr=kv_indptr,
                                        kv_page_indices=kv_page_indices, kv_layout=kv_layout, **kw)
    if (kv_indptr is None) == (block_table is None):
        raise InvalidProblem("pass block_table (vLLM) or kv_indptr + kv_page_indices (SGLang), not both")
    if kv_indptr is not None and kv_page_indices is None:
        raise InvalidProblem("kv_indptr needs kv_page_indices")
    if q.dim() != 3:
        raise InvalidProblem(f"batch_prefill takes packed queries [total_q, H, D], got shape {tuple(q.shape)}")
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if x.dtype != q.dtype or x.device != q.device:
            raise InvalidProblem(f"{name} is {x.dtype} on {x.device}; q is {q.dtype} on {q.device}")
    causal, window, align = kw.get("causal", False), tuple(kw.get("window", (-1, -1))), kw.get("align")
    bias, alibi, sink = kw.get("bias"), kw.get("alibi_slopes"), kw.get("sink")
    scale = kw.get("scale")
    scale = None if scale is None else float(scale)
    softcap, p_drop = float(kw.get("softcap") or 0.0), float(kw.get("dropout_p") or 0.0)
    seed, offset, sink_tokens = int(kw.get("seed", 0)), int(kw.get("offset", 0)), int(kw.get("sink_tokens") or 0)
    shift_form = None   # the ALiBi form whose LSE the caller asked for, where the kernel runs another
    if kw.get("alibi_align") is not None:
        _check_alibi_align(alibi, kw["alibi_align"], causal, window, align)
        m = _mask_fields(causal, window, align)
        if alibi is not None and kw["alibi_align"] != "vertical" and m["mask"] != "none" \
                and m["window_left"] < 0 and m["window_right"] == 0:
            if kw["alibi_align"] != m["mask"]:
                raise InvalidProblem(f"under a {m['mask']} causal mask batch_prefill takes alibi_align="
                                     f"{m['mask']!r} (or None): another form is a per-row shift of the one the "
                                     "kernel runs only for some key lengths, and those are on the device")
            shift_form = m["mask"]
    table = block_table if block_table is not None else kv_page_indices
    if not isinstance(cu_seqlens_q, torch.Tensor) or cu_seqlens_q.dim() != 1 or cu_seqlens_q.numel() < 2:
        raise InvalidProblem(f"cu_seqlens_q must be an int32 tensor of batch+1 >= 2 offsets, got "
                             f"{getattr(cu_seqlens_q, 'shape', type(cu_seqlens_q).__name__)}")
    sig = (q.shape, k_cache.shape, v_cache.shape, table.shape, q.dtype, q.device, cu_seqlens_q.shape,
           int(max_seqlen_q), int(max_seqlen_k),
           kv_layout, block_table is None, causal, scale, window, softcap, align, None if bias is None else bias.shape,
           None if alibi is None else alibi.shape, p_drop, seed, offset, sink is None, sink_tokens)
    hit = _PROBLEMS.get(sig)
    if hit is None:
        ps, hk, dq, dv = _pages(k_cache, v_cache, kv_layout)
        if dq != q.shape[-1]:
            raise InvalidProblem(f"q has head dim {q.shape[-1]}, the K pages {dq}")
        extra = {"bias": "elementwise"} if bias is not None else ({"bias": "alibi"} if alibi is not None else {})
        p = FmhaProblem(family="batch_prefill", mode="group", batch=cu_seqlens_q.numel() - 1, nhead_q=q.shape[1],
                        nhead_k=hk, hdim_q=dq, hdim_v=dv, dtype=_token(q.dtype), runtime_seqstarts=True,
                        packed_q=q.shape[0], seqlen_q=int(max_seqlen_q),
                        seqlen_k=int(max_seqlen_k), runtime_seqlens_k=True, paged_kv=True, page_size=ps,
                        kv_layout=kv_layout, kv_lookup="vllm" if block_table is not None else "sglang", scale=scale,
                        logits_soft_cap=softcap, p_drop=p_drop, seed=seed, offset=offset, sink_tokens=sink_tokens,
                        sink_logits=sink is not None, lse=True, **extra, **_mask_fields(causal, window, align))
        disp = core.dispatcher_on("fmha", q, families=("batch_prefill",), dtypes=(p.dtype,),
                                  hdims=((p.hdim_q, p.hdim_v),))
        hit = _PROBLEMS[sig] = (p, disp)
    p, disp = hit
    t = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "seqlens_k": _lens(seqlens_k, q, p.batch, p.seqlen_k),
         "cu_seqlens_q": cu_seqlens_q}
    i32 = lambda x: x if x.dtype == torch.int32 else x.to(torch.int32)   # noqa: E731
    n_pages, ps = k_cache.shape[0], p.page_size
    record = wsig is not None and shift_form is None
    if block_table is not None:
        guard = page_guard(n_pages, ps, block_table, record=record)
        t["block_table"], t["seqlens_k"] = guard(i32(block_table), t["seqlens_k"])
    else:
        t["kv_indptr"] = i32(kv_indptr)
        guard = page_guard(n_pages, ps, kv_page_indices, name="kv_page_indices", flat=True, record=record)
        t["kv_page_indices"], t["seqlens_k"] = guard(i32(kv_page_indices), t["seqlens_k"], t["kv_indptr"])
    for name, x in (("bias", bias), ("alibi_slopes", alibi), ("sink", sink)):
        if x is not None:
            t[name] = x
    if wsig is not None and shift_form is None:
        f, out = _replay_closure(disp, p, t, ("o", "lse"), wsig)
        if f is not None:
            names, batch, cap, i32 = tuple(t), p.batch, p.seqlen_k, torch.int32
            want_lse = bool(kw.get("return_lse"))
            order = ("q", "k_cache", "v_cache", "seqlens_k", "cu_seqlens_q", "block_table", "kv_indptr",
                     "kv_page_indices", "bias", "alibi_slopes", "sink")
            at = [order.index(n) for n in names]
            as_is = _lens_as_is(seqlens_k, q)   # (int32 on q's device: the signature pins it)

            def again(q, k_cache, v_cache, seqlens_k, cu_seqlens_q, block_table, kv_indptr, kv_page_indices,
                      bias, alibi_slopes, sink):
                lens = seqlens_k if as_is else _lens(seqlens_k, q, batch, cap)
                if block_table is not None:
                    block_table, lens = guard(block_table if block_table.dtype == i32 else block_table.to(i32), lens)
                else:
                    kv_indptr = kv_indptr if kv_indptr.dtype == i32 else kv_indptr.to(i32)
                    kv_page_indices, lens = guard(kv_page_indices if kv_page_indices.dtype == i32
                                                  else kv_page_indices.to(i32), lens, kv_indptr)
                given = (q, k_cache, v_cache, lens, cu_seqlens_q, block_table, kv_indptr, kv_page_indices, bias,
                         alibi_slopes, sink)
                out = f(*[given[i] for i in at])
                return (out["o"], out["lse"]) if want_lse else out["o"]

            warm.put(wsig, again)
        o, lse = out[:2]
    else:
        o, lse = disp.run(p, **_to_backend(disp, t))[:2]
    if disp.backend == "numpy":
        o, lse = _from_backend(o, q, q.dtype), _from_backend(lse, q, torch.float32)
    if shift_form is not None and kw.get("return_lse"):
        lse = lse - group_alibi_shift(alibi, shift_form, t["seqlens_k"], cu_seqlens_q, q.shape[0])
    return (o, lse) if kw.get("return_lse") else o

