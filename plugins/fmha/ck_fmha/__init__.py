"""ck-fmha: fused multi-head attention for ck-dispatcher (nine CK families).

Torch entry points (Triton kernels on the GPU; autograd runs the backward plan's
three stages)::

    from ck_fmha import attention
    o = attention(q, k, v, causal=True)          # q: [B, H, S, D] (layout="bshd" for [B, S, H, D])
    o.sum().backward()

    # fp8 e4m3 forward (no autograd), per-tensor descales as FlashAttention-3 / CK; o in bf16
    o = attention(q8, k8, v8, causal=True, q_descale=sq, k_descale=sk, v_descale=sv)
"""


def attention(q, k, v, causal=False, scale=None, window=(-1, -1), softcap=0.0, layout="bhsd",
              deterministic=True, **features):
    """Attention on torch tensors with autograd, through the Dispatcher (:mod:`ck_fmha.api`); ``features``:
    ``bias``, ``alibi_slopes``, ``dropout_p``, ``seed``, ``offset``; ``return_lse=True`` -> ``(o, lse)``;
    ``align='bottom_right'`` (FlashAttention's mask alignment); group mode: ``layout='thd'`` with
    ``cu_seqlens_q``, ``cu_seqlens_k``, ``max_seqlen_q``, ``max_seqlen_k``; for fp8 q/k/v
    (``torch.float8_e4m3fn``; forward only) ``q_descale``, ``k_descale``, ``v_descale``, ``out_dtype``."""
    try:
        from .api import attention as _attention
    except ImportError as exc:
        from ck_core.deps import missing

        raise missing(exc, "ck_fmha.attention", "ck-fmha") from exc
    _check_keywords(_attention, features, skip=3)
    return _attention(q, k, v, causal=causal, scale=scale, window=window, softcap=softcap, layout=layout,
                      deterministic=deterministic, **features)


def attention_forward(q, k, v, **kw):
    """Forward only (no autograd record), through the Dispatcher; returns o or (o, lse) with
    return_lse=True; keywords as :func:`attention`."""
    import torch

    from .api import attention as _attention

    _check_keywords(_attention, kw, skip=3)
    with torch.no_grad():
        return _attention(q, k, v, **kw)


def _check_keywords(fn, given: dict, skip: int) -> None:
    """An unknown keyword is an error that names the known ones (a typo must not be dropped, nor
    surface as a bare TypeError)."""
    if not given or given.keys() <= _known(fn, skip):   # the warm path: one set comparison
        return
    from ck_core.errors import InvalidProblem

    known = _known(fn, skip)
    bad = sorted(set(given) - known)
    raise InvalidProblem(f"unknown keyword(s) {bad}; known: {', '.join(sorted(known))}")


_KNOWN: dict = {}


def _known(fn, skip: int) -> frozenset:
    k = _KNOWN.get(fn)
    if k is None:
        import inspect

        k = _KNOWN[fn] = frozenset(n for n in list(inspect.signature(fn).parameters)[skip:] if not n.startswith("_"))
    return k


def check_errors():
    """Raise ``DeviceLengthError`` if a decode/appendkv/prefill kernel found a run-time ``seqlens_k``
    outside its capacity since the last check (one host synchronisation; see :mod:`ck_fmha.device_errors`)."""
    from .device_errors import check_errors as _check

    _check()


__all__ = ["attention", "attention_forward", "check_errors"]
