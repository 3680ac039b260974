"""Torch entry point of attention, through the Dispatcher: ``attention`` (forward and autograd).

A call builds an :class:`FmhaProblem` from the tensors and options and runs it
through the Dispatcher of q's device (:func:`ck_core.api.dispatcher_on`): the
forward plan, and under autograd the backward plan (dot_do_o -> dq_dk_dv ->
convert_dq).  What runs is exactly the plan's keys.  Forward and backward are the
torch custom ops ``ck::attention`` and ``ck::attention_bwd`` (fake
implementations for ``torch.compile``).  Problems are cached per call signature,
so a warm call is a few dict lookups and the launches.  Group mode (``layout='thd'``)
builds its problem from the shapes and ``max_seqlen_q/k`` alone: the offsets
``cu_seqlens_q/k`` stay on the device (no host synchronisation, one plan per shape): the
kernels check them themselves (see :mod:`ck_fmha.device_errors`).
"""
from __future__ import annotations

from typing import Optional

import attrs
import torch

from ck_core import api as core
from ck_core import warm
from ck_core.errors import InvalidProblem
from ck_core.plugins import get_manager
from ck_core.warm import grad_sig, tensor_sig

from .device_errors import raise_pending
from .problem import FmhaProblem

_FAMILIES = ("fwd", "bwd_dot_do_o", "bwd_dq_dk_dv", "bwd_convert_dq")
_FP8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e4m3fnuz") if hasattr(torch, n))
_PROBLEMS: dict = {}   # call signature -> (forward problem, Dispatcher)
_BWD: dict = {}        # (forward problem, deterministic, dbias) -> backward problem


def _clear() -> None:
    _PROBLEMS.clear()
    _BWD.clear()


core.on_clear(_clear)


def _dims(t: torch.Tensor, layout: str) -> tuple:
    """(batch, heads, seqlen, hdim) of a q/k/v tensor; batch and seqlen None in 'thd'."""
    if t.dim() != (3 if layout == "thd" else 4):
        raise InvalidProblem(f"layout {layout!r} takes {'[T, H, D]' if layout == 'thd' else '4-D'} tensors, "
                             f"got shape {tuple(t.shape)}")
    if layout == "bhsd":
        return tuple(t.shape)
    if layout == "bshd":
        b, s, h, d = t.shape
        return b, h, s, d
    if layout == "thd":
        return None, t.shape[1], None, t.shape[2]
    raise InvalidProblem(f"layout {layout!r} is not one of 'bhsd', 'bshd', 'thd'")


def _mask_fields(causal, window, align) -> dict:
    from .backends.triton.launch import mask_params

    mode, br, left, right = mask_params(causal, window, align)
    if mode == 0:
        return {"mask": "none"}
    return {"mask": "bottom_right" if br else "top_left", "window_left": left if mode & 2 else -1,
            "window_right": right if mode & 1 else -1}


def _token(dtype) -> str:
    return "fp8" if dtype in _FP8 else core.dtype_token(dtype)


def _problem(q, k, v, bias, alibi, cu_q, cu_k, lens, causal, scale, window, softcap, layout, dropout_p, seed,
             offset, align, descales) -> FmhaProblem:
    """(forward problem, Dispatcher) of a call, cached per signature: shapes and options (group
    mode: also ``lens`` = (max_seqlen_q, max_seqlen_k), never the offsets' values)."""
    sig = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, causal, scale, window, softcap,
           layout, dropout_p, seed, offset, align, descales, None if bias is None else bias.shape,
           None if alibi is None else alibi.shape, lens)
    if cu_q is not None:
        sig += (getattr(cu_q, "shape", cu_q), getattr(cu_q, "dtype", None), getattr(cu_k, "shape", cu_k),
                getattr(cu_k, "dtype", None))
    hit = _PROBLEMS.get(sig)
    if hit is not None:
        return hit
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise InvalidProblem(f"{name} must be a torch tensor, got {type(t).__name__}")
    b, hq, sq, dq = _dims(q, layout)
    bk, hk, sk, dk = _dims(k, layout)
    bv, hv, sv, dv = _dims(v, layout)
    if dk != dq or hv != hk:
        raise InvalidProblem(f"k has head dim {dk} (q: {dq}) or v has {hv} heads (k: {hk})")
    # one validation for every backend, before any: a mismatch read past k/v on a GPU
    if layout == "thd":
        if v.shape[0] != k.shape[0]:
            raise InvalidProblem(f"k holds {k.shape[0]} tokens and v {v.shape[0]}; they must agree")
    elif bk != b or bv != b or sv != sk:
        raise InvalidProblem(f"q has batch {b}, k batch {bk} with {sk} keys, v batch {bv} with {sv}; k and v "
                             f"must share q's batch and one key length")
    nb = b if b is not None else (cu_q.numel() - 1 if isinstance(cu_q, torch.Tensor) else -1)   # group: batch
    if alibi is not None and (not isinstance(alibi, torch.Tensor) or tuple(alibi.shape) not in ((hq,), (nb, hq))
                              or not alibi.is_floating_point()):
        raise InvalidProblem(f"alibi_slopes must be a float tensor [{hq}] or [batch, {hq}] (one slope per query "
                             f"head), got {getattr(alibi, 'shape', type(alibi).__name__)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise InvalidProblem(f"q/k/v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise InvalidProblem(f"q is on {q.device}, k on {k.device}, v on {v.device}; put them on one device")
    kw = dict(family="fwd", nhead_q=hq, nhead_k=hk, hdim_q=dq, hdim_v=dv, dtype=_token(q.dtype), scale=scale,
              logits_soft_cap=softcap, p_drop=dropout_p, seed=seed, offset=offset,
              # the fp8 forward has no backward: no LSE asked of the kernel (CK's fp8 kernels store
              # none; the numpy reference and the Triton kernel return one all the same)
              lse=descales is None,
              **_mask_fields(causal, window, align))
    if layout == "thd":
        kw.update(_group_fields(q, k, cu_q, cu_k, lens))
    else:
        kw.update(batch=b, seqlen_q=sq, seqlen_k=sk, layout=layout)
    if bias is not None:
        kw["bias"] = "elementwise"
    elif alibi is not None:
        kw["bias"] = "alibi"
    if descales is not None:
        kw.update(scale_q=descales[0], scale_k=descales[1], scale_v=descales[2])
    p = FmhaProblem(**kw)
    hit = _PROBLEMS[sig] = (p, _dispatcher(q, p))
    return hit


def _group_fields(q, k, cu_q, cu_k, lens) -> dict:
    """Group mode's problem fields from the shapes and the caller's maxima (the offsets' values stay
    on the device: the launchers clamp them into these bounds and flag a difference)."""
    for name, t in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.numel() < 2 or t.dtype.is_floating_point \
                or t.dtype == torch.bool:
            raise InvalidProblem(f"layout 'thd' (group mode) needs {name}: an int32 tensor of batch+1 >= 2 offsets, "
                                 f"got {getattr(t, 'shape', type(t).__name__)}")
    if cu_q.numel() != cu_k.numel():
        raise InvalidProblem(f"cu_seqlens_q has {cu_q.numel()} offsets and cu_seqlens_k {cu_k.numel()}; "
                             "give batch+1 of each")
    if lens is None or None in lens:
        raise InvalidProblem("layout 'thd' (group mode) needs max_seqlen_q and max_seqlen_k (the longest query "
                             "and key sequence, as in FlashAttention's varlen API): the offsets stay on the device")
    return dict(mode="group", batch=cu_q.numel() - 1, seqlen_q=lens[0], seqlen_k=lens[1], runtime_seqstarts=True,
                packed_q=q.shape[0], packed_k=k.shape[0])


def _dispatcher(q, p):
    """The Dispatcher of q's device for this dtype and head-dim family (each family's registry is
    enumerated once, on its first call)."""
    return core.dispatcher_on("fmha", q, families=_FAMILIES, dtypes=(p.dtype,), hdims=((p.hdim_q, p.hdim_v),))


def _to_backend(disp, tensors: dict) -> dict:
    if disp.backend != "numpy":
        return tensors
    return {n: core._numpy(t) for n, t in tensors.items()}


def _from_backend(x, like: torch.Tensor, dtype) -> torch.Tensor:
    import numpy as np

    if not isinstance(x, torch.Tensor):
        x = torch.from_numpy(np.ascontiguousarray(x))
    return x.to(device=like.device, dtype=dtype)


def _inputs(q, k, v, bias, alibi, cu_q=None, cu_k=None) -> dict:
    t = {"q": q, "k": k, "v": v}
    if cu_q is not None:
        t.update(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    if bias is not None:
        t["bias"] = bias
    if alibi is not None:
        t["alibi_slopes"] = alibi
    return t


#: the first field of attention's warm-call signatures (ck_core.warm)
_ATTENTION = "ck_fmha.attention"


def _fwd(q, k, v, bias, alibi, cu_q, cu_k, lens, causal, scale, window, softcap, layout, dropout_p, seed, offset,
         align, descales, out_dtype, sig_out=None):
    # q, k, v (and a bias in batch mode: a padding mask's; no ALiBi, not fp8): a known signature replays the
    # recorded launches (group mode: the kernel, which checks the offsets and poisons its outputs itself,
    # with the offsets as two more inputs).  ``sig_out`` (a list): gets the call's signature (or None), from which autograd's
    # backward keys its own
    sig = None
    if alibi is None and descales is None and (bias is None or cu_q is None):
        sig = (_ATTENTION, get_manager(), tensor_sig(q), tensor_sig(k), tensor_sig(v), causal, scale, window,
               softcap, layout, dropout_p, seed, offset, align)
        if bias is not None:
            if not isinstance(bias, torch.Tensor):
                raise InvalidProblem(f"bias must be a torch tensor, got {type(bias).__name__}")
            sig += ("bias", tensor_sig(bias))
        if cu_q is None:
            if sig_out is not None:
                sig_out.append(sig)
            f = warm.get(sig)
            if f is not None:
                return f(q, k, v) if bias is None else f(q, k, v, bias)
        elif isinstance(cu_q, torch.Tensor) and isinstance(cu_k, torch.Tensor):
            # (one offsets tensor for q and k, as self-attention passes, is one input of the replay)
            sig += (tensor_sig(cu_q), tensor_sig(cu_k), lens, cu_q.data_ptr() == cu_k.data_ptr())
            if sig_out is not None:
                sig_out.append(sig)
            f = warm.get(sig)
            if f is not None:
                return f(q, k, v, cu_q, cu_k)
        else:
            sig = None
    p, disp = _problem(q, k, v, bias, alibi, cu_q, cu_k, lens, causal, scale, window, softcap, layout, dropout_p,
                       seed, offset, align, descales)
    tensors = _inputs(q, k, v, bias, alibi, cu_q, cu_k)
    if sig is not None and cu_q is not None and disp.backend != "numpy":
        f, (o, lse) = _group_closure(disp, p, tensors)
        if f is not None:
            warm.put(sig, f)
        return o, lse
    if sig is not None and disp.backend != "numpy":
        f, (o, lse) = _first_closure(disp, p, tensors)
        if f is not None:
            warm.put(sig, f)
        return o, lse
    o, lse = disp.run(p, **_to_backend(disp, tensors))
    if disp.backend == "numpy":
        return _from_backend(o, q, _out_dtype(q, out_dtype)), _from_backend(lse, q, torch.float32)
    return o, lse


def forward_closure(q, k, v, *, causal=False, scale=None, window=(-1, -1), softcap=0.0, layout="bhsd", align=None):
    """The warm closure ``f(q, k, v) -> (o, lse)`` that calls of :func:`attention` on tensors like these with
    these options (batch mode; no bias, ALiBi, dropout or fp8; normalised as :func:`attention` does)
    run (a recorded launch, or the cached plan where the plan does not record: e.g. a split-KV decode's
    two launches and workspace), or None before the first such call.  For integrations with warm paths
    of their own (the transformers adapter's decoding steps): call it with tensors of this signature."""
    sig = (_ATTENTION, get_manager(), tensor_sig(q), tensor_sig(k), tensor_sig(v), causal,
           None if scale is None else float(scale), tuple(window), float(softcap or 0.0), layout, 0.0, 0, 0, align)
    return warm.get(sig)


def _first_closure(disp, p, tensors):
    """(closure ``f(q, k, v) -> (o, lse)`` or None, (o, lse)): the first call of a signature, its launches
    recorded as it runs, so that a new shape launches its kernel once (not once to run and once more to
    record: a decode loop's every step is a new shape).  The closure replays those launches where they read
    only q, k, v, o, lse and the device flag (:func:`ck_fmha.backends.triton.warm.replayer`), else it is
    :func:`_warm_closure`'s.  None while a CUDA graph is being captured (the next call records again)."""
    from ck_core.backends import triton_replay

    from .backends.triton import warm as recorded

    q = tensors["q"]
    if q.is_cuda and torch.cuda.is_current_stream_capturing():
        return None, disp.run(p, **tensors)
    if p.store_randval or not all(triton_replay.replayable(t) for t in tensors.values()):
        o, lse = disp.run(p, **tensors)
        return _warm_closure(disp, p, tensors), (o, lse)
    with recorded.recording() as recs:
        o, lse = disp.run(p, **tensors)
    plan = disp.plan(p)
    f = None
    if len(plan.stages) == 1 and getattr(disp.impl(plan.stages[0].key), "warm", None) is not None:
        f = recorded.replayer(tensors, {"o": o, "lse": lse}, recs)
    if f is None:
        return _warm_closure(disp, p, tensors), (o, lse)
    f = disp.observe(p, f)
    if "bias" in tensors:
        def replay(q, k, v, bias):
            out = f(q, k, v, bias)
            return out["o"], out["lse"]
    else:
        def replay(q, k, v):
            out = f(q, k, v)
            return out["o"], out["lse"]

    return replay, (o, lse)


def _group_closure(disp, p, tensors):
    """(closure ``f(q, k, v, cu_seqlens_q, cu_seqlens_k) -> (o, lse)`` or None, (o, lse)): one run of the
    group-mode forward ``p`` with its launch recorded (the kernel, which checks the offsets itself:
    ``kernels._group_offsets_bad``); the closure replays them on new tensors of the signature,
    where the replay reproduces the run (checked once: a host synchronisation).  None without replayable
    tensors and while a CUDA graph is being captured (then the next call records again)."""
    from ck_core.backends import triton_replay

    from .backends.triton import warm as recorded

    q = tensors["q"]
    if not triton_replay.replayable(q) or (q.is_cuda and torch.cuda.is_current_stream_capturing()):
        return None, disp.run(p, **tensors)
    with recorded.recording() as recs:
        o, lse = disp.run(p, **tensors)
    want = {"o": o, "lse": lse}
    same = tensors["cu_seqlens_q"].data_ptr() == tensors["cu_seqlens_k"].data_ptr()
    inputs = {n: x for n, x in tensors.items() if not (same and n == "cu_seqlens_k")}
    f = recorded.replayer(inputs, want, recs, scratch=True)
    f = None if f is None else recorded.verified(f, inputs, want)
    if f is None:   # (bad offsets, rows outside every sequence): this signature keeps the general path
        return (lambda q, k, v, cu_seqlens_q, cu_seqlens_k: disp.run(
            p, q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)), (o, lse)
    f = disp.observe(p, f)

    if same:
        def replay(q, k, v, cu_seqlens_q, cu_seqlens_k):
            out = f(q, k, v, cu_seqlens_q)
            return out["o"], out["lse"]
    else:
        def replay(q, k, v, cu_seqlens_q, cu_seqlens_k):
            out = f(q, k, v, cu_seqlens_q, cu_seqlens_k)
            return out["o"], out["lse"]

    return replay, (o, lse)


def _warm_closure(disp, p, tensors):
    """``f(q, k, v) -> (o, lse)`` repeating a call with this signature: the launcher's recorded
    launch (:meth:`Dispatcher.warm`), else the cached Problem on the cached Dispatcher."""
    if "bias" in tensors:   # (the launcher's own warm form takes q, k, v alone)
        return lambda q, k, v, bias: disp.run(p, q=q, k=k, v=v, bias=bias)
    fast = disp.warm(p, tensors)
    if fast is not None:
        def replay(q, k, v):
            out = fast(q, k, v)
            return out["o"], out["lse"]
        return replay
    return lambda q, k, v: disp.run(p, q=q, k=k, v=v)


def _out_dtype(q, out_dtype):
    if q.dtype in _FP8:
        return out_dtype or torch.bfloat16
    return q.dtype


def _args(causal, window, align, descales):
    """Custom-op argument forms (str / list) of the mask and descale options."""
    return (str(causal), list(window), "" if align is None else str(align),
            [] if descales is None else [float(x) for x in descales])


def _unlens(max_seqlen_q: int, max_seqlen_k: int):
    """The custom ops' -1 (batch mode: no maxima) back to None."""
    return None if max_seqlen_q < 0 else (max_seqlen_q, max_seqlen_k)


def _unargs(causal, window, align, descales):
    c = {"True": True, "False": False}.get(causal, causal)
    return c, tuple(window), (align or None), (tuple(descales) or None)


@torch.library.custom_op("ck::attention", mutates_args=())
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Optional[torch.Tensor],
                 alibi_slopes: Optional[torch.Tensor], cu_seqlens_q: Optional[torch.Tensor],
                 cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int, causal: str,
                 scale: Optional[float], window: list[int], softcap: float, layout: str, deterministic: bool,
                 dropout_p: float, seed: int, offset: int, align: str, descales: list[float],
                 out_dtype: Optional[torch.dtype]) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse) of attention through the Dispatcher (the custom op ``ck::attention``)."""
    c, w, a, ds = _unargs(causal, window, align, descales)
    return _fwd(q, k, v, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, _unlens(max_seqlen_q, max_seqlen_k), c,
                scale, w, softcap, layout, dropout_p, seed, offset, a, ds, out_dtype)


@attention_op.register_fake
def _(q, k, v, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, window,
      softcap, layout, deterministic, dropout_p, seed, offset, align, descales, out_dtype):
    dv = v.shape[-1]
    o = q.new_empty(q.shape[:-1] + (dv,), dtype=_out_dtype(q, out_dtype))
    if layout == "thd":
        lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    else:
        b, h, s, _ = _dims(q, layout)
        lse = q.new_empty((b, h, s), dtype=torch.float32)
    return o, lse


_ATTENTION_BWD = "ck_fmha.attention backward"


def _bwd(q, k, v, o, lse, do, bias, alibi, cu_q, cu_k, lens, causal, scale, window, softcap, layout, deterministic,
         dropout_p, seed, offset, align, want_dbias, fsig=None) -> list:
    """[dq, dk, dv] (+ dbias): the backward plan through the Dispatcher.  ``fsig``: the signature of the
    forward call (:func:`_fwd`) that made ``o`` and ``lse`` (eager autograd): it pins q, k, v, the
    options and so o's and lse's layout, and with the gradient's keys the backward's warm call."""
    sig = None
    if fsig is not None and not dropout_p and bias is None:   # (a forward with a bias warms its forward alone)
        sig = (_ATTENTION_BWD, fsig, grad_sig(do), deterministic)
        f = warm.get(sig)
        if f is not None:
            do = do if do.is_contiguous() else do.contiguous()
            return f(q, k, v, o, lse, do) if cu_q is None else f(q, k, v, o, lse, do, cu_q, cu_k)
    elif bias is None and alibi is None and not dropout_p:   # as _fwd's warm calls
        sig = (_ATTENTION_BWD, get_manager(), tensor_sig(q), tensor_sig(k), tensor_sig(v), tensor_sig(o),
               tensor_sig(lse), tensor_sig(do), causal, scale, window, softcap, layout, deterministic, align)
        if cu_q is None:
            f = warm.get(sig)
            if f is not None:
                return f(q, k, v, o, lse, do if do.is_contiguous() else do.contiguous())
        elif isinstance(cu_q, torch.Tensor) and isinstance(cu_k, torch.Tensor):   # group mode: as _fwd's
            sig += (tensor_sig(cu_q), tensor_sig(cu_k), lens, cu_q.data_ptr() == cu_k.data_ptr())
            f = warm.get(sig)
            if f is not None:
                return f(q, k, v, o, lse, do if do.is_contiguous() else do.contiguous(), cu_q, cu_k)
        else:
            sig = None
    fp, disp = _problem(q, k, v, bias, alibi, cu_q, cu_k, lens, causal, scale, window, softcap, layout, dropout_p,
                        seed, offset, align, None)
    p = _BWD.get((fp, deterministic, want_dbias))
    if p is None:
        p = _BWD[fp, deterministic, want_dbias] = attrs.evolve(fp, family="bwd_dq_dk_dv", lse=False,
                                                                deterministic=deterministic, dbias=want_dbias)
    t = _inputs(q, k, v, bias, alibi, cu_q, cu_k)
    t.update(o=o, lse=lse, do=do if do.is_contiguous() else do.contiguous())
    out = disp.run(p, **_to_backend(disp, t))
    grads = list(out[2:])   # (o, lse, dq, dk, dv[, dbias]): o and lse were passed in
    if disp.backend == "numpy":
        return [_from_backend(g, x, x.dtype) for g, x in zip(grads, (q, k, v, bias))]
    if sig is not None:
        warm.put(sig, _bwd_closure(disp, p, t, grads) if cu_q is None else _bwd_group_closure(disp, p, t, grads))
    return grads


def _bwd_group_closure(disp, p, t, grads):
    """:func:`_bwd_closure` of group mode: ``f(q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k) -> [dq, dk,
    dv]``, the recorded launches (each checks the offsets itself) replayed where that
    reproduces ``grads``; else the cached Problem on the cached Dispatcher."""
    from ck_core.backends import triton_replay

    from .backends.triton import warm as recorded

    def again(q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k):
        return list(disp.run(p, q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, o=o, lse=lse,
                             do=do)[2:])

    if not triton_replay.replayable(t["q"]) or list(t) != ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "o",
                                                           "lse", "do"] \
            or t["q"].is_cuda and torch.cuda.is_current_stream_capturing():   # (the check below syncs)
        return again
    same = t["cu_seqlens_q"].data_ptr() == t["cu_seqlens_k"].data_ptr()
    inputs = {n: x for n, x in t.items() if not (same and n == "cu_seqlens_k")}
    with recorded.recording() as recs:
        out = disp.run(p, **t)
    f = recorded.replayer(inputs, dict(zip(("dq", "dk", "dv"), out[2:5])), recs, scratch=True)
    if f is None or recorded.verified(f, inputs, dict(zip(("dq", "dk", "dv"), grads))) is None:   # (a sync, once)
        return again
    f = disp.observe(p, f)

    def replay(q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k):
        out = f(q, k, v, cu_seqlens_q, o, lse, do) if same else f(q, k, v, cu_seqlens_q, cu_seqlens_k, o, lse, do)
        return [out["dq"], out["dk"], out["dv"]]

    return replay


def _bwd_closure(disp, p, t, grads):
    """``f(q, k, v, o, lse, do) -> [dq, dk, dv]`` repeating a backward with this signature: the
    plan's launches, recorded in one more run and replayed (intermediates allocated again), where
    that run reproduces ``grads`` (a torch operation between launches, which a replay would not
    repeat, would show here); else the cached Problem on the cached Dispatcher."""
    from ck_core.backends import triton_replay

    from .backends.triton import warm as recorded

    def again(q, k, v, o, lse, do):
        return list(disp.run(p, q=q, k=k, v=v, o=o, lse=lse, do=do)[2:])

    if not triton_replay.replayable(t["q"]) or list(t) != ["q", "k", "v", "o", "lse", "do"] \
            or t["q"].is_cuda and torch.cuda.is_current_stream_capturing():   # (the check below syncs)
        return again
    with recorded.recording() as recs:
        out = disp.run(p, **t)
    f = recorded.replayer(t, dict(zip(("dq", "dk", "dv"), out[2:5])), recs, scratch=True)
    if f is None:
        return again
    if recorded.verified(f, t, dict(zip(("dq", "dk", "dv"), grads))) is None:   # (a host sync, once)
        return again
    f = disp.observe(p, f)

    def replay(q, k, v, o, lse, do):
        out = f(q, k, v, o, lse, do)
        return [out["dq"], out["dk"], out["dv"]]

    return replay


@torch.library.custom_op("ck::attention_bwd", mutates_args=())
def attention_bwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                     do: torch.Tensor, bias: Optional[torch.Tensor], alibi_slopes: Optional[torch.Tensor],
                     cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor],
                     max_seqlen_q: int, max_seqlen_k: int, causal: str, scale: Optional[float], window: list[int],
                     softcap: float, layout: str, deterministic: bool, dropout_p: float, seed: int, offset: int,
                     align: str, want_dbias: bool) -> list[torch.Tensor]:
    """[dq, dk, dv] (+ dbias) of attention (the custom op ``ck::attention_bwd``)."""
    c, w, a, _ = _unargs(causal, window, align, [])
    return _bwd(q, k, v, o, lse, do, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                _unlens(max_seqlen_q, max_seqlen_k), c, scale, w, softcap, layout, deterministic, dropout_p, seed,
                offset, a, want_dbias)


@attention_bwd_op.register_fake
def _(q, k, v, o, lse, do, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
      window, softcap, layout, deterministic, dropout_p, seed, offset, align, want_dbias):
    out = [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)]
    return out + ([torch.empty_like(bias)] if want_dbias else [])


_OPTS = ("causal", "scale", "window", "softcap", "layout", "deterministic", "dropout_p", "seed", "offset", "align")


def _setup(ctx, inputs, output):
    q, k, v, bias, alibi, cu_q, cu_k = inputs[:7]
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, bias, alibi, cu_q, cu_k)
    ctx.opts = inputs[7:19]   # max_seqlen_q, max_seqlen_k, then causal .. offset, align (positions of _OPTS)
    ctx.fp8 = q.dtype in _FP8


def _backward(ctx, do, _dlse):
    if ctx.fp8:
        raise InvalidProblem("the fp8 forward has no backward; dequantise to fp16/bf16 to train")
    q, k, v, o, lse, bias, alibi, cu_q, cu_k = ctx.saved_tensors
    want_db = bias is not None and ctx.needs_input_grad[3]
    grads = attention_bwd_op(q, k, v, o, lse, do, bias, alibi, cu_q, cu_k, *ctx.opts, want_db)
    dbias = grads[3] if want_db else None
    return (grads[0], grads[1], grads[2], dbias) + (None,) * 17


attention_op.register_autograd(_backward, setup_context=_setup)


class _Eager(torch.autograd.Function):
    """The same forward and backward plans as the custom ops, for eager autograd: a custom op's
    dispatch costs hundreds of microseconds of host time per call, an autograd.Function a few."""

    @staticmethod
    def forward(ctx, q, k, v, bias, alibi, cu_q, cu_k, lens, opts):
        (causal, scale, window, softcap, layout, deterministic, dropout_p, seed, offset, align) = opts
        box = []
        o, lse = _fwd(q, k, v, bias, alibi, cu_q, cu_k, lens, causal, scale, window, softcap, layout, dropout_p,
                      seed, offset, align, None, None, box)
        ctx.save_for_backward(q, k, v, o, lse, bias, alibi, cu_q, cu_k)
        ctx.opts = (lens,) + opts
        ctx.fsig = box[0] if box else None
        ctx.mark_non_differentiable(lse)
        # no zeros for the LSE's gradient (it has none): a materialised one is a fill launch per step
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse, bias, alibi, cu_q, cu_k = ctx.saved_tensors
        if do is None:   # o took no part in the loss (only the LSE did, which has no gradient)
            return (None,) * 9
        want_db = bias is not None and ctx.needs_input_grad[3]
        grads = _bwd(q, k, v, o, lse, do, bias, alibi, cu_q, cu_k, *ctx.opts, want_db, ctx.fsig)
        return grads[0], grads[1], grads[2], (grads[3] if want_db else None), None, None, None, None, None


_eager_apply = warm.autograd_apply(_Eager, 0, 7)   # (q, k, v, bias, alibi, cu_q, cu_k: the tensor arguments)


def attention(q, k, v, causal=False, scale=None, window=(-1, -1), softcap=0.0, layout="bhsd", deterministic=True,
              bias=None, alibi_slopes=None, dropout_p=0.0, seed=0, offset=0, q_descale=None, k_descale=None,
              v_descale=None, out_dtype=None, return_lse=False, align=None, alibi_align=None, cu_seqlens_q=None,
              cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None):
    """Attention with autograd through the Dispatcher; arguments as ``ck_fmha.attention``.

    ``deterministic`` is a problem field: True plans a separate dQ pass, False lets the heuristic
    pick a kernel that accumulates dQ with fp32 atomics where that measured faster.  ``alibi_align``
    must agree with the mask (the problem derives the ALiBi form from it; under a causal mask, where
    the problem runs the vertical form, the returned LSE is that of the form asked for: see
    :func:`_alibi_lse_shift`).  Group mode (``layout='thd'``) takes ``cu_seqlens_q/k`` (int32
    [batch+1], on q's device) and ``max_seqlen_q/k`` (the longest sequences) as FlashAttention's
    varlen API does; the offsets are read on the device only.  Offsets that do not fit the packed
    tensors and the maxima give NaN outputs and the flag of :mod:`ck_fmha.device_errors`
    (``ck_fmha.check_errors()``)."""
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
        bad = [f"{n} is {type(t).__name__}" for n, t in (("q", q), ("k", k), ("v", v)) if not isinstance(t, torch.Tensor)]
        raise InvalidProblem(f"attention takes torch tensors q, k, v: {', '.join(bad)}")
    fp8 = q.dtype in _FP8
    descales = None
    if fp8:
        descales = tuple(1.0 if x is None else float(x) for x in (q_descale, k_descale, v_descale))
        if out_dtype not in (None, torch.bfloat16):
            raise InvalidProblem(f"the fp8 forward writes o in bf16 here, not {out_dtype}")
    elif q_descale is not None or k_descale is not None or v_descale is not None or out_dtype is not None:
        raise InvalidProblem("q_descale/k_descale/v_descale/out_dtype belong to the fp8 forward; "
                             f"q is {q.dtype} (pass float8_e4m3fn q/k/v, or drop them)")
    shift = None
    if alibi_align is not None:
        _check_alibi_align(alibi_slopes, alibi_align, causal, window, align)
        if alibi_slopes is not None and alibi_align != "vertical":
            shift = _alibi_lse_shift(alibi_slopes, alibi_align, causal, window, align, q, k, layout, cu_seqlens_q,
                                     cu_seqlens_k, return_lse)
    lens = None
    if layout != "thd":
        cu_seqlens_q = cu_seqlens_k = None
    else:
        raise_pending()
        if max_seqlen_q is not None and max_seqlen_k is not None:
            lens = (int(max_seqlen_q), int(max_seqlen_k))
            if q.dim() == 3 and (q.shape[0] == 0 or lens[0] == 0 or lens[1] == 0):
                return _empty_group(q, k, v, bias, return_lse)
    scale = None if scale is None else float(scale)
    softcap, dropout_p = float(softcap or 0.0), float(dropout_p or 0.0)
    window = window if type(window) is tuple else tuple(window)
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                        or (bias is not None and bias.requires_grad))
    if not grad and not torch.compiler.is_compiling():   # no autograd record to keep: skip the op wrapper
        o, lse = _fwd(q, k, v, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, lens, causal, scale, window, softcap,
                      layout, dropout_p, seed, offset, align, descales, out_dtype)
    elif not torch.compiler.is_compiling() and not fp8:
        o, lse = _eager_apply(q, k, v, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, lens,
                              (causal, scale, window, softcap, layout, bool(deterministic), dropout_p, int(seed),
                               int(offset), align))
    else:
        c, w, a, ds = _args(causal, window, align, descales)
        ml = (-1, -1) if lens is None else lens
        o, lse = attention_op(q, k, v, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, *ml, c, scale, w, softcap,
                              layout, bool(deterministic), dropout_p, int(seed), int(offset), a, ds, out_dtype)
    if lens is not None and q.device.type == "cpu":
        raise_pending()   # the offsets' flag is free to read on the CPU: report bad ones at once
    if shift is not None:
        lse = lse - shift
    return (o, lse) if return_lse else o


def _empty_group(q, k, v, bias, return_lse):
    """Group mode without a query (or without a key) in any sequence: as FlashAttention, zero rows
    (``o`` [total_q, H, Dv]: empty when there are no queries, LSE -inf) and zero gradients; no
    kernel runs (a grid over no rows)."""
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise InvalidProblem(f"layout 'thd' takes {name} as [total_k, H_k, D], got "
                                 f"{getattr(t, 'shape', type(t).__name__)}")
    total, hq = q.shape[0], q.shape[1]
    o = q.new_zeros((total, hq, v.shape[-1]), dtype=_out_dtype(q, None))
    if torch.is_grad_enabled():   # zero gradients of the inputs' shapes through autograd
        zero = sum((t.sum() * 0).to(o.dtype) for t in (q, k, v, bias) if t is not None and t.requires_grad)
        o = o + zero
    lse = torch.full((hq, total), float("-inf"), dtype=torch.float32, device=q.device)
    return (o, lse) if return_lse else o


def plan_keys(q, k, v, causal=False, window=(-1, -1), layout="bhsd", deterministic=True, align=None,
              cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None) -> dict:
    """Which kernels :func:`attention` runs for these tensors (no bias, ALiBi, dropout or soft cap):
    ``{"fwd": [{"stage", "kernel"}, ...], "bwd": [...]}`` from the Dispatcher's plans (the backward's
    only for fp16/bf16).  Nothing is launched; the problems are the ones the call caches."""
    window = window if type(window) is tuple else tuple(window)
    lens = None
    if layout != "thd":
        cu_seqlens_q = cu_seqlens_k = None
    elif max_seqlen_q is not None and max_seqlen_k is not None:
        lens = (int(max_seqlen_q), int(max_seqlen_k))
    fp8 = q.dtype in _FP8
    fp, disp = _problem(q, k, v, None, None, cu_seqlens_q, cu_seqlens_k, lens, causal, None, window, 0.0, layout, 0.0,
                        0, 0, align, (1.0, 1.0, 1.0) if fp8 else None)
    out = {"fwd": disp.plan(fp).describe()}
    if not fp8:
        bp = attrs.evolve(fp, family="bwd_dq_dk_dv", lse=False, deterministic=bool(deterministic), dbias=False)
        out["bwd"] = disp.plan(bp).describe()
    return out


def _alibi_lse_shift(slopes, alibi_align, causal, window, align, q, k, layout, cu_q, cu_k, want=True):
    """What the returned LSE must lose to be the LSE of the ALiBi form ``alibi_align`` asks for
    (FlashAttention's is 'bottom_right'), or None where the run already used that form.

    Under a causal mask the problem runs ALiBi in the vertical form ``slope * j`` (CK's choice).
    The form ``-slope * |i + a - j|`` (a = sk - sq bottom-right, 0 top-left) is that less the row
    constant ``slope * (i + a)`` on every key the mask leaves visible (j <= i + m, m the mask's
    offset) exactly when a >= m: softmax cancels the constant, so o agrees, and the LSE is
    ``lse - slope * (i + a)``.  Where a < m the forms differ inside the row and the call is refused.
    Device ops only; in group mode the lengths are on the device, so there ``alibi_align`` must be
    the mask's own alignment (another form is a row constant only for some lengths)."""
    m = _mask_fields(causal, window, align)
    if not (m["mask"] != "none" and m["window_left"] < 0 and m["window_right"] == 0):
        return None   # not causal: the problem already runs the form the mask implies
    if layout == "thd":
        if alibi_align != m["mask"]:
            raise InvalidProblem(f"under a {m['mask']} causal mask group-mode attention takes alibi_align="
                                 f"{m['mask']!r} (or None): another form is a per-row shift of the one the kernel "
                                 "runs only for some sequence lengths, and those are on the device")
        if not want:
            return None
        cu_k = cu_k.to(device=q.device, dtype=torch.long)
        return group_alibi_shift(slopes, alibi_align, cu_k[1:] - cu_k[:-1], cu_q, q.shape[0])
    sq, sk = [_dims(q, layout)[2]], [_dims(k, layout)[2]]
    a = [y - x if alibi_align == "bottom_right" else 0 for x, y in zip(sq, sk)]
    mo = [y - x if m["mask"] == "bottom_right" else 0 for x, y in zip(sq, sk)]
    bad = [i for i, (x, y) in enumerate(zip(a, mo)) if x < y]
    if bad:
        i = bad[0]
        raise InvalidProblem(f"alibi_align={alibi_align!r} under a {m['mask']} causal mask with seqlen_q={sq[i]}, "
                             f"seqlen_k={sk[i]} (batch {i}) is not the vertical form plus a row constant, which is "
                             f"what a causal ALiBi problem runs; pass alibi_align={m['mask']!r} or None")
    if not want:
        return None
    s = slopes.to(device=q.device, dtype=torch.float32)
    pos = torch.arange(sq[0], device=q.device, dtype=torch.float32) + a[0]
    return (s[None, :, None] if s.dim() == 1 else s[:, :, None]) * pos   # [B|1, H, Sq]


def group_alibi_shift(slopes, form, seqlens_k, cu_q, total_q):
    """[H, total_q]: what a causal group-mode problem's ALiBi (the vertical form slope * j, which the
    problem derives from a causal mask) adds to each row's LSE over the form -slope * |i + a - j| of
    the mask's alignment (a = seqlen_k - seqlen_q bottom-right, 0 top-left): slope * (i + a), a row
    constant on every visible key, so o agrees and the LSE does not.  Device ops only (the lengths
    stay on the device)."""
    cu = cu_q.to(device=seqlens_k.device, dtype=torch.long)
    t = torch.arange(total_q, device=cu.device)
    b = torch.searchsorted(cu[1:], t, right=True).clamp_(max=seqlens_k.shape[0] - 1)
    pos = t - cu[b]
    if form == "bottom_right":
        pos = pos + seqlens_k.long()[b] - (cu[b + 1] - cu[b])
    s = slopes.to(device=cu.device, dtype=torch.float32)
    return s[:, None] * pos.to(torch.float32)[None] if s.dim() == 1 else s[b].t() * pos.to(torch.float32)[None]


def _check_alibi_align(alibi, alibi_align, causal, window, align) -> None:
    """An explicit ALiBi form must be the one the mask implies (see ``triton_keys._alibi_align``)."""
    if alibi is None or alibi_align is None:
        return
    m = _mask_fields(causal, window, align)
    if m["mask"] == "none":
        implied = "bottom_right"
    elif m["mask"] != "none" and m["window_left"] < 0 and m["window_right"] == 0:
        implied = "vertical"
    else:
        implied = m["mask"]
    # under a causal mask the three forms differ by a per-row constant, which softmax cancels
    if alibi_align != implied and implied != "vertical":
        raise InvalidProblem(f"alibi_align={alibi_align!r} does not match the mask, which implies {implied!r}")
