"""ck-fmha: fused multi-head attention for ck-dispatcher (nine CK families).

Torch entry points (Triton kernels on the GPU; autograd runs the backward plan's
three stages)::

    from ck_fmha import attention
    o = attention(q, k, v, causal=True)          # q: [B, H, S, D] (layout="bshd" for [B, S, H, D])
    o.sum().backward()
"""


def attention(q, k, v, causal=False, scale=None, window=(-1, -1), softcap=0.0, layout="bhsd",
              deterministic=True, **features):
    """Attention on torch tensors with autograd (see ck_fmha.triton.ops.attention); ``features``:
    ``bias``, ``alibi_slopes``, ``dropout_p``, ``seed``, ``offset``."""
    from .triton.ops import attention as _attention

    return _attention(q, k, v, causal=causal, scale=scale, window=window, softcap=softcap, layout=layout,
                      deterministic=deterministic, **features)


def attention_forward(q, k, v, **kw):
    """Forward only; returns o or (o, lse) with return_lse=True (ck_fmha.triton.ops.fwd)."""
    from .triton.ops import fwd

    return fwd(q, k, v, **kw)


__all__ = ["attention", "attention_forward"]
