"""``attn_implementation="ck_fmha"`` for Hugging Face transformers (5.x).

    import ck_fmha.integrations.transformers as ck_tf
    ck_tf.register()
    model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16, attn_implementation="ck_fmha")

:func:`register` adds :func:`attention_forward` to transformers' ``AttentionInterface`` and, under the same
name, FlashAttention's mask convention to its ``AttentionMaskInterface``: the model then hands over no mask
(dense batch) or the 2D padding mask [B, kv_len].  Dense batches run ``ck_fmha.flash_attn.flash_attn_func``
on the [B, H, S, D] views (no copies); padded batches are unpadded into group mode
(``flash_attn_varlen_func``), as are packed sequences (``cu_seq_lens_q/k`` keyword arguments, or
``position_ids`` restarting within one row).  Causal masks and sliding windows align to the bottom right,
so that decoding with a KV cache (queries = the last positions) is exact; GQA/MQA run without repeating
K/V; dropout and softcap are FlashAttention's.  Attention sinks (``s_aux``) and fp32 activations outside
autocast raise: the kernels run fp16/bf16.
"""
from __future__ import annotations

import logging

import torch

from ck_core import api as core
from ck_core.errors import InvalidProblem, PluginError
from ck_core.plugins import get_manager
from ck_core.warm import tensor_sig

from ..api import forward_closure
from ..flash_attn import FlashAttnNotImplemented, flash_attn_func, flash_attn_varlen_func

log = logging.getLogger(__name__)

NAME = "ck_fmha"

#: dense no-grad calls (a generation's steps): call signature -> the attention's recorded launch
_WARM: dict = {}
core.on_clear(_WARM.clear)


def register(name: str = NAME) -> str:
    """Make ``attn_implementation=name`` select ck-fmha in transformers; returns the name."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    except ImportError as e:
        raise PluginError(f"ck_fmha.integrations.transformers needs transformers 5 ({e}): "
                          "pip install 'ck-fmha[transformers]'") from None

    AttentionInterface.register(name, attention_forward)
    # the 2D padding mask (or None): group mode needs the sequence lengths, not a dense 4D mask
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name


def _dtype(query: torch.Tensor) -> torch.dtype:
    if query.dtype in (torch.float16, torch.bfloat16):
        return query.dtype
    dev = query.device.type
    if torch.is_autocast_enabled(dev) and torch.get_autocast_dtype(dev) in (torch.float16, torch.bfloat16):
        return torch.get_autocast_dtype(dev)
    raise InvalidProblem(f"ck_fmha attention runs fp16/bf16; got {query.dtype} activations outside autocast: "
                         "load the model with dtype=torch.bfloat16 (or float16), or run under torch.autocast")


def _window(sliding_window, causal: bool):
    # transformers counts the window with the current token (sliding_window=4: 3 keys back + itself)
    if sliding_window is None:
        return (-1, -1)
    w = int(sliding_window) - 1
    return (w, -1 if causal else w)


def _packed_cu_seqlens(position_ids, batch: int):
    """cu_seqlens of sequences packed into one row (positions restart), or None."""
    if position_ids is None or batch != 1 or position_ids.shape[-1] == 1:
        return None
    pos = position_ids.reshape(-1)
    starts = (pos == pos.min()).nonzero().reshape(-1)
    if starts.numel() <= 1:
        return None
    return torch.cat([starts, torch.tensor([pos.numel()], device=pos.device)]).to(torch.int32)


def _unpad(x: torch.Tensor, mask: torch.Tensor):
    """x [B, H, S, D] and a bool mask [B, S] -> ([total, H, D], flat indices, cu_seqlens, max_seqlen)."""
    lens = mask.sum(-1, dtype=torch.int32)
    idx = mask.reshape(-1).nonzero().reshape(-1)
    cu = torch.nn.functional.pad(torch.cumsum(lens, 0, dtype=torch.int32), (1, 0))
    flat = x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[3])
    return flat[idx], idx, cu, int(lens.max())


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                      sliding_window=None, softcap=None, is_causal=None, **kwargs):
    """transformers' attention-function contract: query [B, H, Sq, D], key/value [B, Hk, Sk, D] (the cache
    included) -> (out [B, Sq, H, Dv], None)."""
    fast = attention_mask is None and not dropout and kwargs.get("s_aux") is None \
        and not kwargs.get("output_attentions") and kwargs.get("cu_seq_lens_q") is None and kwargs.get("cu_seq_lens_k") is None \
        and query.dtype in (torch.float16, torch.bfloat16) and key.dtype == query.dtype \
        and value.dtype == query.dtype and not torch.compiler.is_compiling() \
        and not (torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad))
    if fast:
        pos = kwargs.get("position_ids")
        fast = pos is None or query.shape[0] != 1 or pos.shape[-1] == 1   # (no packed sequences to look for)
    if fast:   # a dense step seen before: the attention's warm closure on these tensors' bshd views
        sig = (get_manager(), tensor_sig(query), tensor_sig(key), tensor_sig(value), getattr(module, "is_causal", None),
               is_causal,
               scaling, sliding_window, softcap)
        f = _WARM.get(sig)
        if f is not None:
            return f(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2))[0], None
    if kwargs.get("s_aux") is not None:
        raise FlashAttnNotImplemented("s_aux (attention sinks) in the transformers integration")
    if kwargs.get("output_attentions"):
        log.warning("ck_fmha attention returns no attention weights (output_attentions=True)")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise InvalidProblem(f"ck_fmha takes a 2D padding mask, got shape {tuple(attention_mask.shape)}: "
                             "call ck_fmha.integrations.transformers.register() before building the model")
    dt = _dtype(query)
    q, k, v = (t.to(dt) for t in (query, key, value))
    causal = bool(module.is_causal if is_causal is None else is_causal)
    b, h, sq, d = q.shape
    kw = dict(dropout_p=float(dropout or 0.0), softmax_scale=scaling, causal=causal,
              window_size=_window(sliding_window, causal), softcap=float(softcap or 0.0))
    if attention_mask is not None:
        mask = attention_mask.to(torch.bool)
        qf, idx_q, cu_q, max_q = _unpad(q, mask[:, -sq:])
        kf, _, cu_k, max_k = _unpad(k, mask)
        vf = _unpad(v, mask)[0]
        out = flash_attn_varlen_func(qf, kf, vf, cu_q, cu_k, max_q, max_k, **kw)
        full = out.new_zeros(b * sq, h, out.shape[-1])
        full[idx_q] = out
        return full.reshape(b, sq, h, -1), None
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is None:
        cu_q = cu_k = _packed_cu_seqlens(kwargs.get("position_ids"), b)
    if cu_q is not None:
        max_q = kwargs.get("max_length_q") or int((cu_q[1:] - cu_q[:-1]).max())
        max_k = kwargs.get("max_length_k") or int((cu_k[1:] - cu_k[:-1]).max())
        flat = [t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3]) for t in (q, k, v)]
        out = flash_attn_varlen_func(*flat, cu_q.to(torch.int32), cu_k.to(torch.int32), int(max_q), int(max_k), **kw)
        return out.reshape(b, sq, h, -1), None
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    out = flash_attn_func(qt, kt, vt, **kw)
    if fast and d % 8 == 0:   # (flash_attn pads other head dims: copies, no replay of the caller's tensors)
        f = forward_closure(qt, kt, vt, causal="bottom_right" if causal else False, scale=scaling,
                            window=kw["window_size"], softcap=kw["softcap"], layout="bshd", align="bottom_right")
        if f is not None:
            if len(_WARM) > 4096:
                _WARM.clear()
            _WARM[sig] = f
    return out, None
