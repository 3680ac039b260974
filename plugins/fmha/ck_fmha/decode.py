"""Decode entry points through the Dispatcher: ``splitkv_decode``, ``paged_decode``, ``appendkv``.

A decode step's key lengths change at every step, so they are not part of the problem: the
problem carries the key capacity (``seqlen_k``: the cache length, or ``max_seqlen_k``) and
``runtime_seqlens_k=True``, and the lengths travel as the int32 tensor ``seqlens_k``, read by the
kernel on the device.  Host lengths are checked here; device lengths by the kernels, which clamp a
bad one, poison its batch's outputs with NaN and set the flag of :mod:`ck_fmha.device_errors`
(raised by the next call where that costs no sync, else by ``ck_fmha.check_errors()``).  The problem -- and so the plan: split-KV main + combine -- is cached per
(shapes, dtypes, device, options), so a warm step is a dict lookup and the launches, with no host
synchronisation.  The split count is chosen here from :func:`ck_fmha.heuristics.split_count`
with the Dispatcher's ArchSpec (its compute units) and becomes the problem's ``num_splits``; the
Dispatcher then selects a fwd_splitkv key of that count (its name says ``_k<S>``), which the
launcher runs exactly.  One split (a cache whose batch x KV heads x query tiles already fill the
machine, or too short to split) is one launch: the plan has no combine stage and the kernel writes
o and lse itself.
"""
from __future__ import annotations

import attrs
import torch

from ck_core import api as core
from ck_core import warm
from ck_core.backends import triton_replay
from ck_core.errors import InvalidProblem, UnsupportedProblem
from ck_core.plugins import get_manager
from ck_core.warm import tensor_sig

from .api import _dims, _from_backend, _mask_fields, _to_backend, _token
from .device_errors import check_table, guard_pages, raise_pending
from .heuristics import split_count
from .problem import FmhaProblem

_FAMILIES = ("fwd_splitkv", "fwd_splitkv_combine")
_PROBLEMS: dict = {}   # call signature -> (problem, Dispatcher)
#: the first fields of the warm-call signatures (ck_core.warm) of splitkv_decode, paged_decode, appendkv
_SPLITKV, _PAGED, _APPENDKV = "ck_fmha.splitkv_decode", "ck_fmha.paged_decode", "ck_fmha.appendkv"

#: warm-call signatures whose launches could not be replayed (see _replay_closure)
_NO_REPLAY: set = set()

core.on_clear(_PROBLEMS.clear)
core.on_clear(_NO_REPLAY.clear)


def _dispatcher(q, p):
    return core.dispatcher_on("fmha", q, families=_FAMILIES, dtypes=(p.dtype,), hdims=((p.hdim_q, p.hdim_v),))


def _problem(sig, q, hk, dv, capacity, *, causal, scale, window, softcap, num_splits, layout, align, sink,
             sink_tokens, runtime_lens, page_size=0):
    hit = _PROBLEMS.get(sig)
    if hit is not None:
        return hit
    b, hq, sq, dq = _dims(q, layout)
    if layout == "thd":
        raise InvalidProblem("decode takes batch-mode q ('bhsd' or 'bshd'); for packed queries use batch_prefill")
    kw = dict(family="fwd_splitkv", batch=b, nhead_q=hq, nhead_k=hk, seqlen_q=sq, seqlen_k=capacity, hdim_q=dq,
              hdim_v=dv, dtype=_token(q.dtype), layout=layout, scale=scale, logits_soft_cap=softcap,
              sink_tokens=int(sink_tokens or 0), sink_logits=sink is not None, lse=True,
              runtime_seqlens_k=runtime_lens, **_mask_fields(causal, window, align or "bottom_right"))
    if page_size:
        kw.update(paged_kv=True, page_size=page_size)
    p = FmhaProblem(**kw, num_splits=1)
    disp = _dispatcher(q, p)
    if num_splits is None:   # the heuristic layer, with the arch facts of the Dispatcher's ArchSpec
        num_splits = split_count(b * hk, capacity, disp.arch.compute_units, query_rows=(hq // max(hk, 1)) * sq)
    elif not 1 <= int(num_splits) <= 128:
        raise InvalidProblem(f"num_splits={num_splits}: give a count in [1, 128] (the split-KV keys' range), "
                             "or None to let the Dispatcher choose")
    hit = _PROBLEMS[sig] = (attrs.evolve(p, num_splits=int(num_splits)), disp)
    return hit


def _on_device(t) -> bool:
    """``t`` lives where the host cannot read it for free (not the CPU): its checks are the kernels'."""
    return t.device.type != "cpu"


def _lens_as_is(seqlens_k, q) -> bool:
    """Whether warm calls may pass ``seqlens_k`` to the recorded launch unchanged: int32 on q's (non-CPU)
    device, which the warm signature then pins (shape, dtype, device), so :func:`_lens` would neither
    check on the host nor convert anything."""
    return isinstance(seqlens_k, torch.Tensor) and seqlens_k.dtype == torch.int32 and seqlens_k.device == q.device \
        and _on_device(seqlens_k)


def _lens(seqlens_k, q, batch: int, capacity: int):
    """The run-time key lengths as int32 on q's device.  Host (CPU) lengths are checked here, where
    that costs no synchronisation; device lengths are read by the kernel only."""
    if seqlens_k.dim() != 1 or seqlens_k.shape[0] != batch:
        raise InvalidProblem(f"seqlens_k must be [batch={batch}], got shape {tuple(seqlens_k.shape)}")
    if seqlens_k.device.type == "cpu" and batch:
        lo, hi = int(seqlens_k.min()), int(seqlens_k.max())
        if lo < 0 or hi > capacity:
            raise InvalidProblem(f"seqlens_k spans [{lo}, {hi}]; each length must be in [0, {capacity}] "
                                 "(the key capacity: the cache length, or max_seqlen_k, less the tokens appended)")
    if seqlens_k.dtype != torch.int32 or seqlens_k.device != q.device:
        seqlens_k = seqlens_k.to(device=q.device, dtype=torch.int32)
    return seqlens_k


def page_guard(num_pages: int, page_size: int, table, *, name: str = "block_table", flat: bool = False,
               appended: int = 0, record: bool = True):
    """``guard(table, seqlens_k, indptr=None) -> (table, seqlens_k)`` for the page tables of one call
    signature (:func:`ck_fmha.device_errors.guard_pages`): the host check on CPU tensors, else one launch
    (:class:`ck_fmha.backends.triton.guards.PageGuard`, recorded on its first call where ``record``)."""
    if table.device.type == "cpu":
        def guard(table, seqlens_k, indptr=None):
            return guard_pages(table, num_pages, seqlens_k, page_size, name=name, indptr=indptr, appended=appended)
        return guard
    from .backends.triton.guards import PageGuard   # (triton: an optional dependency of the CPU paths)

    return PageGuard(num_pages, page_size, name=name, flat=flat, appended=appended, record=record)


def _replay_closure(disp, p, t: dict, outputs: tuple, wsig=None):
    """(closure ``f(*t.values()) -> {output name: tensor}`` or None, the run's outputs): one run of
    ``p`` on ``t`` with its launches recorded; the closure replays them on new tensors of the same
    signature (intermediates allocated anew, as the launchers allocated them), where the recording checks out against the run
    (:func:`ck_fmha.backends.triton.warm.verified`: once per signature, a host sync).  None on the
    numpy backend, without replayable tensors, and while a CUDA graph is being captured."""
    from .backends.triton import warm as recorded

    first = next(iter(t.values()))
    if disp.backend == "numpy" or not triton_replay.replayable(first) or wsig in _NO_REPLAY or (
            first.is_cuda and torch.cuda.is_current_stream_capturing()):
        return None, disp.run(p, **_to_backend(disp, t))
    with recorded.recording() as recs:
        out = disp.run(p, **t)
    outs = out if isinstance(out, tuple) else (out,)
    want = dict(zip(outputs, outs))
    f = recorded.replayer(t, want, recs, scratch=True)
    f = None if f is None else recorded.verified(f, t, want)
    if f is None and wsig is not None:   # not again for this signature: its calls take the general path
        if len(_NO_REPLAY) > 1024:
            _NO_REPLAY.clear()
        _NO_REPLAY.add(wsig)
    return (None if f is None else disp.observe(p, f)), out


def _run(p, disp, q, tensors, return_lse):
    o, lse = disp.run(p, **_to_backend(disp, tensors))[:2]   # (o, lse[, the caches passed in])
    if disp.backend == "numpy":
        o, lse = _from_backend(o, q, q.dtype), _from_backend(lse, q, torch.float32)
    return (o, lse) if return_lse else o


def _check_kv(q, k, v, layout):
    if q.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        raise UnsupportedProblem("the split-KV / paged decode has no fp8 path; the fp8 forward is "
                                 "ck_fmha.attention(..., q_descale=, k_descale=, v_descale=) in batch or group mode")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise InvalidProblem(f"q/k/v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise InvalidProblem(f"q is on {q.device}, k on {k.device}, v on {v.device}; put them on one device")


def splitkv_decode(q, k, v, *, seqlens_k=None, causal=False, scale=None, window=(-1, -1), softcap=0.0,
                   num_splits=None, return_lse=False, layout="bhsd", config=None, align=None, sink=None,
                   sink_tokens=0):
    """Split-KV attention of short queries over a contiguous KV cache (arguments as
    :func:`ck_fmha.backends.triton.splitkv_decode`)."""
    raise_pending()
    if config is not None:
        return _direct(q, k, v, None, seqlens_k, config, dict(causal=causal, scale=scale, window=window,
                       softcap=softcap, num_splits=num_splits, return_lse=return_lse, layout=layout, align=align,
                       sink=sink, sink_tokens=sink_tokens))
    wsig = None
    if sink is None and (seqlens_k is None or isinstance(seqlens_k, torch.Tensor)) \
            and not torch.compiler.is_compiling():
        # a known signature replays the recorded launches (main + combine)
        wsig = (_SPLITKV, get_manager(), tensor_sig(q), tensor_sig(k), tensor_sig(v),
                None if seqlens_k is None else tensor_sig(seqlens_k), causal, scale, tuple(window), softcap,
                num_splits, return_lse, layout, align, sink_tokens)
        f = warm.get(wsig)
        if f is not None:
            return f(q, k, v, seqlens_k)
    _check_kv(q, k, v, layout)
    _, hk, sk, _ = _dims(k, layout)
    _, hv, skv, dv = _dims(v, layout)
    if hv != hk or skv != sk:
        raise InvalidProblem(f"k has {hk} heads / {sk} keys, v has {hv} / {skv}; they must agree")
    window = tuple(window)
    sig = ("splitkv", q.shape, k.shape, v.shape, q.dtype, q.device, causal, scale, window, softcap, num_splits,
           layout, align, sink is None, sink_tokens, seqlens_k is None)
    p, disp = _problem(sig, q, hk, dv, sk, causal=causal, scale=scale, window=window, softcap=float(softcap or 0.0),
                       num_splits=num_splits, layout=layout, align=align, sink=sink, sink_tokens=sink_tokens,
                       runtime_lens=seqlens_k is not None)
    t = {"q": q, "k": k, "v": v}
    if seqlens_k is not None:
        t["seqlens_k"] = _lens(seqlens_k, q, p.batch, sk)
    if sink is not None:
        t["sink"] = sink
    if wsig is None:
        return _run(p, disp, q, t, return_lse)
    f, out = _replay_closure(disp, p, t, ("o", "lse"), wsig)
    if f is not None:
        batch = p.batch
        if seqlens_k is None:
            def again(q, k, v, seqlens_k):
                out = f(q, k, v)
                return (out["o"], out["lse"]) if return_lse else out["o"]
        elif _lens_as_is(seqlens_k, q):
            def again(q, k, v, seqlens_k):
                out = f(q, k, v, seqlens_k)
                return (out["o"], out["lse"]) if return_lse else out["o"]
        else:
            def again(q, k, v, seqlens_k):
                out = f(q, k, v, _lens(seqlens_k, q, batch, sk))
                return (out["o"], out["lse"]) if return_lse else out["o"]
        warm.put(wsig, again)
    o, lse = out[:2]
    if disp.backend == "numpy":
        o, lse = _from_backend(o, q, q.dtype), _from_backend(lse, q, torch.float32)
    return (o, lse) if return_lse else o


def paged_decode(q, k_cache, v_cache, block_table, seqlens_k, *, max_seqlen_k=None, causal=False, scale=None,
                 window=(-1, -1), softcap=0.0, num_splits=None, return_lse=False, layout="bhsd", config=None,
                 align=None, sink=None, sink_tokens=0):
    """Split-KV attention of short queries over a paged KV cache [pages, page_size, H_k, D]
    (arguments as :func:`ck_fmha.backends.triton.paged_decode`)."""
    raise_pending()
    if k_cache.dim() != 4 or v_cache.dim() != 4:
        raise InvalidProblem(f"paged caches are [num_pages, page_size, H_k, D], got {tuple(k_cache.shape)} "
                             f"and {tuple(v_cache.shape)}")
    wsig = None
    if sink is None and isinstance(seqlens_k, torch.Tensor) and not torch.compiler.is_compiling():
        # a known signature replays the recorded launches (main + combine)
        wsig = (_PAGED, get_manager(), tensor_sig(q), tensor_sig(k_cache), tensor_sig(v_cache),
                tensor_sig(block_table), tensor_sig(seqlens_k),
                max_seqlen_k if max_seqlen_k is None or type(max_seqlen_k) is int else int(max_seqlen_k),
                causal, scale, tuple(window), softcap, num_splits, return_lse, layout, align, sink_tokens)
        f = warm.get(wsig)
        if f is not None:
            return f(q, k_cache, v_cache, block_table, seqlens_k)
    _check_kv(q, k_cache, v_cache, layout)
    _, page_size, hk, _ = k_cache.shape
    if block_table.dim() != 2:
        raise InvalidProblem(f"block_table must be [batch, max_pages], got shape {tuple(block_table.shape)}")
    capacity = int(max_seqlen_k) if max_seqlen_k is not None else block_table.shape[1] * page_size
    if config is not None:
        return _direct(q, k_cache, v_cache, block_table, seqlens_k, config, dict(
            causal=causal, scale=scale, window=window, softcap=softcap, num_splits=num_splits,
            return_lse=return_lse, layout=layout, align=align, sink=sink, sink_tokens=sink_tokens,
            max_seqlen_k=capacity))
    window = tuple(window)
    sig = ("paged", q.shape, k_cache.shape, v_cache.shape, block_table.shape, q.dtype, q.device, capacity, causal,
           scale, window, softcap, num_splits, layout, align, sink is None, sink_tokens)
    p, disp = _problem(sig, q, hk, v_cache.shape[-1], capacity, causal=causal, scale=scale, window=window,
                       softcap=float(softcap or 0.0), num_splits=num_splits, layout=layout, align=align, sink=sink,
                       sink_tokens=sink_tokens, runtime_lens=True, page_size=page_size)
    if layout == "bhsd":   # the problem's 'bhsd' pages are [pages, Hk, P, D]: the same data, viewed
        k_cache, v_cache = k_cache.transpose(1, 2), v_cache.transpose(1, 2)
    check_table(block_table, "block_table")
    bt = block_table if block_table.dtype == torch.int32 else block_table.to(torch.int32)
    n_pages = k_cache.shape[0]
    if not _on_device(bt):   # the host checks the pages it reads (free here) and refuses a bad one
        guard = page_guard(n_pages, page_size, bt, record=wsig is not None)
    else:   # the split-KV kernel checks every page index it reads (no guard launch; see its docstring)
        def guard(table, seqlens_k):
            return table, seqlens_k
    bt, lens = guard(bt, _lens(seqlens_k, q, p.batch, capacity))
    t = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "block_table": bt, "seqlens_k": lens}
    if sink is not None:
        t["sink"] = sink
    if wsig is None:
        return _run(p, disp, q, t, return_lse)
    f, out = _replay_closure(disp, p, t, ("o", "lse"), wsig)
    if f is not None:
        batch, i32 = p.batch, torch.int32

        if _on_device(bt) and block_table.dtype == i32 and _lens_as_is(seqlens_k, q):
            def again(q, k_cache, v_cache, block_table, seqlens_k):
                # (the kernel checks the pages; table and lengths go to the launch as they are)
                out = f(q, k_cache, v_cache, block_table, seqlens_k)
                return (out["o"], out["lse"]) if return_lse else out["o"]
        else:
            def again(q, k_cache, v_cache, block_table, seqlens_k):
                # (the replay reads data pointers alone: the 'bhsd' transposed views need not be made)
                bt, lens = guard(block_table if block_table.dtype == i32 else block_table.to(i32),
                                 _lens(seqlens_k, q, batch, capacity))
                out = f(q, k_cache, v_cache, bt, lens)
                return (out["o"], out["lse"]) if return_lse else out["o"]

        warm.put(wsig, again)
    o, lse = out[:2]
    if disp.backend == "numpy":
        o, lse = _from_backend(o, q, q.dtype), _from_backend(lse, q, torch.float32)
    return (o, lse) if return_lse else o


def _direct(q, k, v, block_table, seqlens_k, config, opts):
    """An explicit ``config``: that tile runs (kernel-direct, as benchmarks of one tile need), with the
    split count of the same heuristic the Dispatcher path uses."""
    from .backends.triton import launch as ops
    from .backends.triton import launch_decode as ops_dec

    layout = opts["layout"]
    b, hq, sq, _ = ops._dims(q, layout)
    if block_table is None:
        k, v = ops._last_contig(k), ops._last_contig(v)
        _, hk, cap, _ = ops._dims(k, layout)
        kv = ops._bhs_strides(k, layout) + ops._bhs_strides(v, layout)
        page = dict(page_size=0, block_table=None)
    else:
        k, v = ops._last_contig(k), ops._last_contig(v)
        _, ps, hk, _ = k.shape
        cap = opts["max_seqlen_k"]
        kv = (k.stride(0), k.stride(2), k.stride(1), v.stride(0), v.stride(2), v.stride(1))
        page = dict(page_size=ps, block_table=block_table.to(torch.int32))
    ns = opts["num_splits"]
    if ns is None:
        from ck_core.device import current_arch

        ns = split_count(b * hk, cap, current_arch(q).compute_units, query_rows=(hq // max(hk, 1)) * sq)
    lens = None if seqlens_k is None else seqlens_k.to(device=q.device, dtype=torch.int32)
    direct = int(ns) == 1   # one split: one launch writes o and lse (no combine), as the plan does
    oacc, lacc = ops_dec._splitkv_main(q, k, v, seqlens_k=lens, max_seqlen_k=cap, causal=opts["causal"],
                                   scale=opts["scale"], window=opts["window"], softcap=opts["softcap"],
                                   num_splits=ns, layout=layout, config=config, kv_strides=kv, hk=hk,
                                   align=opts["align"], sink=opts["sink"], sink_tokens=opts["sink_tokens"],
                                   direct=direct, **page)
    if direct:
        return (oacc, lacc) if opts["return_lse"] else oacc
    return ops_dec.splitkv_combine(oacc, lacc, q, layout=layout, return_lse=opts["return_lse"])


def _rope_tables(cos, sin, q, knew, k_cache, block_table, layout, seqlens_k):
    """The rotary tables as the kernel reads them: fp32, contiguous, and at least as long as the
    positions it may rotate (the capacity less the appended rows, plus the longer of q and knew).

    Converted HERE, before the launch, and not in the launcher: a recorded launch's replay (the
    warm path, and its one verification run on the caller's own tensors, which rewrites the caches
    in place) repeats launches only, so a table converted by a torch operation inside the launcher
    would be replayed as an uninitialised scratch buffer (silently wrong rotated keys in the cache).
    The tables must cover the appended keys (checked here for host lengths; FlashAttention's API asks
    that they cover the whole cache); rows past them (query rows past the cache: causal, more queries
    than appended keys; device lengths past the table) are rotated by the identity (cos 1, sin 0),
    never read out of bounds."""
    if cos.dim() != 2 or sin.shape != cos.shape:
        raise InvalidProblem(f"rotary_cos {tuple(cos.shape)} and rotary_sin {tuple(sin.shape)} must both be "
                             "[max_pos, rotary_dim / 2]")
    _, _, sq, _ = _dims(q, layout)
    sn = _dims(knew, layout)[2]
    if block_table is not None:
        capacity = block_table.shape[1] * (k_cache.shape[2] if layout == "bhsd" else k_cache.shape[1])
    else:
        capacity = _dims(k_cache, layout)[2]
    if isinstance(seqlens_k, torch.Tensor) and seqlens_k.device.type == "cpu" and seqlens_k.numel():
        last = int(seqlens_k.max()) + sn   # host lengths: the appended keys' positions are known here
        if cos.shape[0] < last:
            raise InvalidProblem(f"rotary tables have {cos.shape[0]} positions; the appended keys reach "
                                 f"position {last - 1}: pass rotary_cos/rotary_sin with at least {last} rows")
    need = max(capacity - sn, 0) + max(sn, sq)
    cos = cos.to(device=q.device, dtype=torch.float32).contiguous()
    sin = sin.to(device=q.device, dtype=torch.float32).contiguous()
    if cos.shape[0] < need:
        extra = need - cos.shape[0]
        cos = torch.cat([cos, cos.new_ones(extra, cos.shape[1])])
        sin = torch.cat([sin, sin.new_zeros(extra, sin.shape[1])])
    return cos, sin


def appendkv(q, knew, vnew, k_cache, v_cache, seqlens_k, *, rotary_cos=None, rotary_sin=None, rope="none",
             rotary_dim=0, block_table=None, layout="bhsd"):
    """fwd_appendkv through the Dispatcher: ``knew``/``vnew`` written into the caches IN PLACE at
    positions ``seqlens_k[b] ..`` (run-time lengths, read on the device), RoPE on knew and q.
    Returns ``(q_rot, k_cache, v_cache)``; arguments as :func:`ck_fmha.backends.triton.launch.appendkv_launch`.
    A device ``seqlens_k`` entry outside [0, capacity - appended] writes nothing (see :mod:`ck_fmha.device_errors`)."""
    raise_pending()
    if rope != "none" and rotary_cos is not None and rotary_sin is not None:
        rotary_cos, rotary_sin = _rope_tables(rotary_cos, rotary_sin, q, knew, k_cache, block_table, layout,
                                              seqlens_k)
    wsig = None
    if isinstance(seqlens_k, torch.Tensor) and not torch.compiler.is_compiling():
        # a known signature replays the recorded launch (the caches written in place)
        wsig = (_APPENDKV, get_manager(), tensor_sig(q), tensor_sig(knew), tensor_sig(vnew), tensor_sig(k_cache),
                tensor_sig(v_cache), tensor_sig(seqlens_k), None if rotary_cos is None else tensor_sig(rotary_cos),
                None if rotary_sin is None else tensor_sig(rotary_sin), rope, rotary_dim,
                None if block_table is None else tensor_sig(block_table), layout)
        f = warm.get(wsig)
        if f is not None:
            return f(q, knew, vnew, k_cache, v_cache, seqlens_k, rotary_cos, rotary_sin, block_table)
    if rope != "none" and (rotary_cos is None or rotary_sin is None):
        raise InvalidProblem(f"rope={rope!r} needs rotary_cos and rotary_sin [max_pos, rotary_dim/2]")
    for name, x in (("knew", knew), ("vnew", vnew), ("k_cache", k_cache), ("v_cache", v_cache)):
        if x.dtype != q.dtype or x.device != q.device:
            raise InvalidProblem(f"{name} is {x.dtype} on {x.device}; q is {q.dtype} on {q.device}: the caches "
                                 "are written in place, so every tensor must have q's dtype and device")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise InvalidProblem("the caches are written in place: their last dimension must be contiguous")
    b, hq, sq, dq = _dims(q, layout)
    if layout == "thd":
        raise InvalidProblem("appendkv takes batch-mode tensors ('bhsd' or 'bshd')")
    _, hk, sn, _ = _dims(knew, layout)
    if block_table is not None:
        if block_table.dim() != 2 or k_cache.dim() != 4:
            raise InvalidProblem("paged appendkv takes block_table [batch, max_pages] and page pools "
                                 "[pages, Hk, P, D] ('bhsd') / [pages, P, Hk, D] ('bshd')")
        page_size = k_cache.shape[2] if layout == "bhsd" else k_cache.shape[1]
        capacity = block_table.shape[1] * page_size
    else:
        page_size, capacity = 0, _dims(k_cache, layout)[2]
    sig = ("appendkv", q.shape, knew.shape, vnew.shape, k_cache.shape, v_cache.shape, q.dtype, q.device, rope,
           int(rotary_dim), layout, None if block_table is None else block_table.shape)
    hit = _PROBLEMS.get(sig)
    if hit is None:
        kw = dict(paged_kv=True, page_size=page_size) if page_size else {}
        p = FmhaProblem(family="fwd_appendkv", batch=b, nhead_q=hq, nhead_k=hk, seqlen_q=sq, seqlen_knew=sn,
                        seqlen_k=capacity, hdim_q=dq, hdim_v=vnew.shape[-1], dtype=_token(q.dtype), layout=layout,
                        rope=rope, rotary_dim=int(rotary_dim), runtime_seqlens_k=True, **kw)
        hit = _PROBLEMS[sig] = (p, core.dispatcher_on("fmha", q, families=("fwd_appendkv",), dtypes=(p.dtype,),
                                                      hdims=((p.hdim_q, p.hdim_v),)))
    p, disp = hit
    t = {"q": q, "knew": knew, "vnew": vnew, "k_cache": k_cache, "v_cache": v_cache,
         "seqlens_k": _lens(seqlens_k, q, b, capacity - sn)}
    if rope != "none":
        t.update(rotary_cos=rotary_cos, rotary_sin=rotary_sin)
    n_pages = k_cache.shape[0]
    if block_table is not None:
        bt = block_table if block_table.dtype == torch.int32 else block_table.to(torch.int32)
        guard = page_guard(n_pages, page_size, bt, appended=sn, record=wsig is not None)
        t["block_table"], t["seqlens_k"] = guard(bt, t["seqlens_k"])
    f = None
    if wsig is not None:
        f, (q_rot, kc, vc) = _replay_closure(disp, p, t, ("q_rot",), wsig)
    else:
        q_rot, kc, vc = disp.run(p, **_to_backend(disp, t))
    if f is not None and kc is k_cache and vc is v_cache and q_rot.data_ptr() != q.data_ptr():
        names, room, i32 = tuple(t), capacity - sn, torch.int32
        order = ("q", "knew", "vnew", "k_cache", "v_cache", "seqlens_k", "rotary_cos", "rotary_sin", "block_table")
        at = [order.index(n) for n in names]

        if block_table is None and _lens_as_is(seqlens_k, q):
            def again(q, knew, vnew, k_cache, v_cache, seqlens_k, rotary_cos, rotary_sin, block_table):
                given = (q, knew, vnew, k_cache, v_cache, seqlens_k, rotary_cos, rotary_sin, block_table)
                return f(*[given[i] for i in at])["q_rot"], k_cache, v_cache
        else:
            def again(q, knew, vnew, k_cache, v_cache, seqlens_k, rotary_cos, rotary_sin, block_table):
                lens = _lens(seqlens_k, q, b, room)
                if block_table is not None:
                    block_table, lens = guard(block_table if block_table.dtype == i32 else block_table.to(i32), lens)
                given = (q, knew, vnew, k_cache, v_cache, lens, rotary_cos, rotary_sin, block_table)
                return f(*[given[i] for i in at])["q_rot"], k_cache, v_cache

        warm.put(wsig, again)
    for mine, got in ((k_cache, kc), (v_cache, vc)):
        if got is not mine:   # the numpy backend (or a converted copy) returns new caches: write them back
            mine.copy_(_from_backend(got, mine, mine.dtype))
    return _from_backend(q_rot, q, q.dtype) if disp.backend == "numpy" else q_rot, k_cache, v_cache
