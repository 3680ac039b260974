"""``attn_implementation="ck_fmha"`` for Hugging Face transformers (5.x).

    import ck_fmha.integrations.transformers as ck_tf
    ck_tf.register()
    model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16, attn_implementation="ck_fmha")

:func:`register` adds :func:`attention_forward` to transformers' ``AttentionInterface`` and, under the same
name, FlashAttention's mask convention to its ``AttentionMaskInterface``: the model then hands over no mask
(dense batch) or the 2D padding mask [B, kv_len].  Dense batches run ``ck_fmha.attention`` in the layout
the tensors have underneath (the projections' [B, S, H, D], a KV cache's [B, H, S, D]: no copies).  Padded batches run the same dense kernel with the mask as an
additive key bias (0 / -inf, [B, 1, 1, kv_len] broadcast: :func:`_key_bias`, built once per mask tensor
and shared by the layers of one forward) and their padded query rows zeroed: no unpadding, no host
synchronisation, and the positions are transformers' own (a query at cache position p sees the keys at
positions <= p that the mask keeps, as its sdpa path computes, left or right padding alike).  Packed
sequences (``cu_seq_lens_q/k`` keyword arguments, or ``position_ids`` restarting within one row) run in
group mode (``flash_attn_varlen_func``).  Causal masks and sliding windows align to the bottom right,
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

from ..api import attention as _attention
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


def _seed(dropout_p: float) -> int:
    # as FlashAttention's: one draw from torch's default generator (torch.manual_seed repeats it)
    return int(torch.empty((), dtype=torch.int64).random_()) if dropout_p > 0 else 0


def _packed_cu_seqlens(position_ids, batch: int):
    """cu_seqlens of sequences packed into one row (positions restart), or None."""
    if position_ids is None or batch != 1 or position_ids.shape[-1] == 1:
        return None
    pos = position_ids.reshape(-1)
    starts = (pos == pos.min()).nonzero().reshape(-1)
    if starts.numel() <= 1:
        return None
    return torch.cat([starts, torch.tensor([pos.numel()], device=pos.device)]).to(torch.int32)


#: the last mask's key bias: (mask tensor, its version, key length, dtype) -> (bias, kept query rows)
_BIAS: list = [None, None]


def _key_bias(mask: torch.Tensor, kv_len: int, sq: int, dtype):
    """(bias [B, 1, Sq, kv_len] of 0 / -inf: a stride-0 view of [B, 1, 1, kv_len]; the kept query rows
    [B, Sq, 1, 1]) of a 2D key mask [B, L], built on the device (no host synchronisation).  Keys past the
    mask's length (a static cache's empty slots) are dropped; the queries are the mask's last ``sq``
    positions.  The layers of one forward share one mask tensor: built once for it."""
    # (not while compiling or capturing a CUDA graph: a graph would replay the bias of its warm-up, and
    # a bias kept from a cudagraph tree's pool is refused there)
    cache = not torch.compiler.is_compiling() and not (mask.is_cuda and torch.cuda.is_current_stream_capturing())
    k = (mask, mask._version, kv_len, sq, dtype)
    hit = _BIAS[0]
    if cache and hit is not None and hit[0] is mask and hit[1:] == k[1:]:
        return _BIAS[1]
    keep = mask.to(torch.bool)
    b = keep.shape[0]
    bias = torch.zeros((b, 1, 1, kv_len), dtype=dtype, device=mask.device)
    bias.masked_fill_(~keep[:, None, None, -kv_len:], float("-inf"))
    out = (bias.expand(b, 1, sq, kv_len), keep[:, -sq:, None, None])
    _BIAS[0], _BIAS[1] = (k, out) if cache else (None, None)
    return out


def _bshd(k: torch.Tensor) -> bool:
    """Whether transformers' [B, H, S, D] key is a view of [B, S, H, D] memory (the projections' layout,
    before a cache concatenates it), not a KV cache's [B, H, S, D]: the layout to hand the kernels, so
    that neither the cache nor the projections are copied (the TMA kernels copy what is not dense)."""
    return k.stride(1) < k.stride(2)


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
        hit = _WARM.get(sig)
        if hit is not None:
            f, bshd = hit
            if bshd:
                return f(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2))[0], None
            return f(query, key, value)[0].transpose(1, 2), None
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
        if attention_mask.shape[0] != b or attention_mask.shape[1] < sq:
            raise InvalidProblem(f"the 2D padding mask has shape {tuple(attention_mask.shape)}; expected [{b}, "
                                 f">= {sq}] (batch, key positions)")
        kv_len = min(attention_mask.shape[1], k.shape[2])   # (a static cache: its slots past the mask are empty)
        bias, keep_q = _key_bias(attention_mask, kv_len, sq, dt)
        bshd = _bshd(k)
        qa, ka, va = (t.transpose(1, 2) for t in (q, k, v)) if bshd else (q, k, v)
        ka, va = (ka[:, :kv_len], va[:, :kv_len]) if bshd else (ka[:, :, :kv_len], va[:, :, :kv_len])
        out = _attention(qa, ka, va, causal="bottom_right" if causal else False, scale=scaling,
                         window=kw["window_size"], softcap=kw["softcap"], layout="bshd" if bshd else "bhsd",
                         dropout_p=kw["dropout_p"], seed=_seed(kw["dropout_p"]), bias=bias, align="bottom_right",
                         deterministic=False)
        # padded query rows: zeros (as unpadded attention leaves them), not the mean of what they may see
        return (out if bshd else out.transpose(1, 2)).masked_fill(~keep_q, 0.0), None
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is None:
        cu_q = cu_k = _packed_cu_seqlens(kwargs.get("position_ids"), b)
    if cu_q is not None:
        max_q = kwargs.get("max_length_q") or int((cu_q[1:] - cu_q[:-1]).max())
        max_k = kwargs.get("max_length_k") or int((cu_k[1:] - cu_k[:-1]).max())
        flat = [t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3]) for t in (q, k, v)]
        out = flash_attn_varlen_func(*flat, cu_q.to(torch.int32), cu_k.to(torch.int32), int(max_q), int(max_k), **kw)
        return out.reshape(b, sq, h, -1), None
    if d % 8 or v.shape[-1] % 8:   # (flash_attn pads other head dims)
        return flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **kw), None
    # the layout the tensors have underneath (:func:`_bshd`): the other would copy the whole cache on
    # every decoding step, and no step could replay its launch
    bshd = _bshd(k)
    qa, ka, va = (t.transpose(1, 2) for t in (q, k, v)) if bshd else (q, k, v)
    lay, mask = ("bshd" if bshd else "bhsd"), ("bottom_right" if causal else False)
    out = _attention(qa, ka, va, causal=mask, scale=scaling, window=kw["window_size"], softcap=kw["softcap"],
                     layout=lay, dropout_p=kw["dropout_p"], seed=_seed(kw["dropout_p"]), align="bottom_right",
                     deterministic=False)
    if fast:
        f = forward_closure(qa, ka, va, causal=mask, scale=scaling, window=kw["window_size"], softcap=kw["softcap"],
                            layout=lay, align="bottom_right")
        if f is not None:
            if len(_WARM) > 4096:
                _WARM.clear()
            _WARM[sig] = (f, bshd)
    return (out if bshd else out.transpose(1, 2)), None
