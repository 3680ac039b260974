"""An independent attention implementation in torch (CPU, float64), for tests.

Written from the semantics in the ck_fmha docstrings, sharing no code with the
NumPy references: masks come from torch.tril/triu, GQA from repeat_interleave,
the plain path goes through scaled_dot_product_attention, gradients through
autograd.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def T(x):
    return torch.as_tensor(np.asarray(x, dtype=np.float64))


def _q_spans(p):
    if p.mode == "group":
        s = p.seqstart_q
        return [(s[b], s[b + 1]) for b in range(p.batch)]
    return [(0, p.seqlen_q)] * p.batch


def _k_spans(p):
    lens = list(p.seqlens_k) if p.seqlens_k is not None else None
    if p.mode == "group" and p.seqstart_k is not None:
        s = p.seqstart_k
        spans = [(s[b], s[b + 1]) for b in range(p.batch)]
    else:
        spans = [(0, p.seqlen_k)] * p.batch
    if lens is not None:
        spans = [(a, a + l) for (a, _), l in zip(spans, lens)]
    return spans


def per_batch(p, x, spans, col_major=False):
    """public tensor -> list of [H, S, D] torch tensors"""
    x = T(x) if not isinstance(x, torch.Tensor) else x
    out = []
    for b, (a, e) in enumerate(spans):
        if p.mode == "group":
            xb = x[:, :, a:e].permute(0, 2, 1) if col_major else x[a:e].permute(1, 0, 2)
        else:
            xb = x[b]
            if col_major:
                xb = xb.permute(0, 2, 1)
            elif p.layout == "bshd":
                xb = xb.permute(1, 0, 2)
            xb = xb[:, : e - a]
        out.append(xb)
    return out


def visible(p, sq, sk):
    ones = torch.ones(sq, sk, dtype=torch.bool)
    if p.mask == "none":
        return ones
    off = (sk - sq) if p.mask == "bottom_right" else 0
    vis = ones.clone()
    right_ok = torch.tril(ones, diagonal=off + p.window_right) if p.window_right >= 0 else ones
    vis &= right_ok
    if p.window_left >= 0:
        vis &= torch.triu(ones, diagonal=off - p.window_left)
    if p.sink_tokens:
        sink_cols = torch.zeros(sq, sk, dtype=torch.bool)
        sink_cols[:, : p.sink_tokens] = True
        vis |= sink_cols & right_ok
    return vis


def alibi(p, slopes, sq, sk):
    slopes = T(slopes).reshape(-1, 1, 1)
    i = torch.arange(sq, dtype=torch.float64).reshape(1, -1, 1)
    j = torch.arange(sk, dtype=torch.float64).reshape(1, 1, -1)
    causal = p.mask in ("top_left", "bottom_right") and p.window_left < 0 and p.window_right == 0
    if causal:
        return slopes * j.expand(1, sq, sk)
    off = 0 if p.mask in ("top_left", "generic") else sk - sq
    return -slopes * (i - j + off).abs()


def _scores(p, qb, kb, b, qspan, bias, slopes):
    ratio = p.nhead_q // p.nhead_k
    kk = kb.repeat_interleave(ratio, dim=0)
    scale = p.scale if p.scale is not None else p.hdim_q ** -0.5
    s = scale * qb @ kk.transpose(-1, -2)
    if p.logits_soft_cap > 0:
        s = p.logits_soft_cap * torch.tanh(s / p.logits_soft_cap)
    add = _additive(p, b, qspan, s.shape[1], s.shape[2], bias, slopes)
    return s + add if add is not None else s


def _additive(p, b, qspan, sq, sk, bias, slopes):
    if p.bias == "elementwise":
        bt = bias if isinstance(bias, torch.Tensor) else T(bias)
        if p.mode == "group":
            return bt[:, qspan[0]:qspan[0] + sq, :sk]
        return bt[b if bt.shape[0] > 1 else 0][:, :sq, :sk]
    if p.bias == "alibi":
        sl = T(slopes)
        return alibi(p, sl[b] if sl.ndim == 2 else sl, sq, sk)
    return None


def forward_batches(p, q, k, v, bias=None, slopes=None, sink=None, randval=None):
    """-> lists of o [H, sq, dv] and lse [H, sq] per batch (torch, differentiable)."""
    qsp, ksp = _q_spans(p), _k_spans(p)
    qs = per_batch(p, q, qsp)
    ks = per_batch(p, k, ksp)
    vs = per_batch(p, v, ksp, col_major=p.vlayout == "c")
    if p.dtype == "fp8":
        qs = [x * p.scale_q for x in qs]
        ks = [x * p.scale_k for x in ks]
        vs = [x * p.scale_v for x in vs]
    ratio = p.nhead_q // p.nhead_k
    os_, lses = [], []
    for b in range(p.batch):
        qb, kb, vb = qs[b], ks[b], vs[b]
        sq, sk = qb.shape[1], kb.shape[1]
        if sk == 0 or sq == 0:  # nothing to attend to: o = 0, lse = -inf
            os_.append(torch.zeros(p.nhead_q, sq, vb.shape[-1], dtype=torch.float64) + 0 * qb.sum())
            lses.append(torch.full((p.nhead_q, sq), float("-inf"), dtype=torch.float64))
            continue
        vis = visible(p, sq, sk)
        plain = (p.logits_soft_cap == 0 and sink is None and randval is None and not qb.requires_grad)
        if plain and sq > 0 and sk > 0:
            add = _additive(p, b, qsp[b], sq, sk, bias, slopes)
            fmask = torch.zeros(sq, sk, dtype=torch.float64).masked_fill(~vis, float("-inf"))
            if add is not None:
                fmask = fmask + add
            vv = vb.repeat_interleave(ratio, dim=0)
            kk = kb.repeat_interleave(ratio, dim=0)
            scale = p.scale if p.scale is not None else p.hdim_q ** -0.5
            o = F.scaled_dot_product_attention(qb[None], kk[None], vv[None], attn_mask=fmask[None],
                                               scale=scale)[0]
            o = torch.nan_to_num(o, nan=0.0)
            s = scale * qb @ kk.transpose(-1, -2) + fmask
            lse = torch.logsumexp(s, dim=-1)
            os_.append(o)
            lses.append(lse)
            continue
        s = _scores(p, qb, kb, b, qsp[b], bias, slopes)
        s = s.masked_fill(~vis, float("-inf"))
        if sink is not None:  # a virtual key column holding the sink logit, value vector 0
            col = T(sink).reshape(-1, 1, 1).expand(p.nhead_q, sq, 1)
            s = torch.cat([s, col], dim=-1)
        any_vis = torch.isfinite(s).any(-1, keepdim=True)
        s_safe = torch.where(any_vis, s, torch.zeros_like(s))
        pr = torch.softmax(s_safe, dim=-1) * any_vis
        lse = torch.where(any_vis[..., 0], torch.logsumexp(s_safe, -1), torch.full_like(s_safe[..., 0], float("-inf")))
        if sink is not None:
            pr = pr[..., :-1]
        if randval is not None:
            keep = _randval_batch(p, randval, b, qsp[b], sq, sk) <= int(np.floor((1 - p.p_drop) * 255))
            pr = pr * keep / (1 - p.p_drop)
        os_.append(pr @ vb.repeat_interleave(ratio, dim=0))
        lses.append(lse)
    return os_, lses


def _randval_batch(p, randval, b, qspan, sq, sk):
    rv = torch.as_tensor(np.asarray(randval).astype(np.int64))
    if p.mode == "group":
        return rv[:, qspan[0]:qspan[0] + sq, :sk]
    return rv[b, :, :sq, :sk]


def assemble_o(p, os_):
    if p.mode == "group":
        return torch.cat([o.permute(1, 0, 2) for o in os_], dim=0)
    o = torch.stack(os_)
    return o.permute(0, 2, 1, 3) if p.layout == "bshd" else o


def assemble_lse(p, lses):
    if p.mode == "group":
        return torch.cat(lses, dim=1)
    return torch.stack(lses)


def forward(p, q, k, v, bias=None, slopes=None, sink=None, randval=None):
    os_, lses = forward_batches(p, q, k, v, bias, slopes, sink, randval)
    return assemble_o(p, os_).detach().numpy(), assemble_lse(p, lses).detach().numpy()


def backward(p, q, k, v, do, bias=None, slopes=None, randval=None):
    """autograd grads (dq, dk, dv, dbias) of sum(o * do), public layouts, numpy float64."""
    qt, kt, vt = (T(x).requires_grad_(True) for x in (q, k, v))
    bt = T(bias).requires_grad_(True) if bias is not None else None
    os_, _ = forward_batches(p, qt, kt, vt, bt, slopes, None, randval)
    o = assemble_o(p, os_)
    (o * T(do)).sum().backward()
    g = lambda t: None if t is None else (t.grad.numpy() if t.grad is not None else np.zeros(t.shape))
    return g(qt), g(kt), g(vt), g(bt)


def rope_interleaved(x, cos, sin):
    """GPT-J RoPE via complex multiplication; x [..., S, r], cos/sin [S, r/2]."""
    xc = torch.view_as_complex(T(x).reshape(*x.shape[:-1], -1, 2).contiguous())
    rot = torch.polar(torch.ones_like(T(cos)), torch.atan2(T(sin), T(cos)))
    return torch.view_as_real(xc * rot).reshape(x.shape)


def rope_half(x, cos, sin):
    """GPT-NeoX RoPE via rotate_half; x [..., S, r], cos/sin [S, r/2]."""
    x = T(x)
    c = torch.cat([T(cos), T(cos)], -1)
    s = torch.cat([T(sin), T(sin)], -1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * c + torch.cat([-x2, x1], -1) * s
