"""Differential fuzz of FMHA through the Dispatcher (issue 12).

Random problems from fixed seeds -- forward (masks incl. windows and bottom-right, GQA, soft cap,
sink tokens and sink logits, elementwise bias and ALiBi, group mode with empty sequences and
logical seqlens_k), split-KV (contiguous and paged), paged decode, batch prefill and the backward
(incl. dbias, rows with a very negative LSE) -- run on the numpy backend and on the Triton kernels
(the interpreter here; ``CK_TEST_GPU=1 pytest -m gpu`` runs the GPU variant with larger sizes).

The reference is written here from the math in float64 torch and shares no code with ck_fmha
(nor with tests/torch_ref.py): logits, masks, ALiBi, sinks and the softmax below; gradients by
autograd of that forward.  Inputs are made here too, and memory nothing may read (keys past a
logical length, bias columns past it, unused block-table entries) holds NaN.
"""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from ck_core import Dispatcher, PluginManager, Registry, plugins  # noqa: E402
from ck_core.testing import arch_plugin, make_fake_arch  # noqa: E402
from ck_fmha.problem import FmhaProblem  # noqa: E402

F64 = torch.float64
NEG = float("-inf")

# ------------------------------------------------------------------ reference (float64, from the math)


def visible(sq, sk, mask, left, right, n_sink):
    """[sq, sk] bool: key j visible from query i.  off = sk - sq aligns bottom-right;
    -left <= j - i - off <= right (a negative side is unbounded); the first n_sink keys stay
    visible past the left edge (never past the right one)."""
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    if mask == "none":
        return torch.ones(sq, sk, dtype=torch.bool)
    rel = j - i - (sk - sq if mask == "bottom_right" else 0)
    right_ok = rel <= right if right >= 0 else torch.ones(sq, sk, dtype=torch.bool)
    left_ok = rel >= -left if left >= 0 else torch.ones(sq, sk, dtype=torch.bool)
    return (right_ok & left_ok) | ((j < n_sink) & right_ok)


def attend(q, k, v, c, bias=None, slopes=None, sink=None, keep=None, p_drop=0.0):
    """One sequence: q [H, sq, Dq], k [Hk, sk, Dq], v [Hk, sk, Dv] (float64) -> o [H, sq, Dv], lse [H, sq].
    ``keep`` [H, sq, sk] (bool): dropout, kept probabilities scaled by 1 / (1 - p_drop); lse is unaffected."""
    H, sq, sk = q.shape[0], q.shape[1], k.shape[1]
    k = k.repeat_interleave(H // k.shape[0], 0)
    v = v.repeat_interleave(H // v.shape[0], 0)
    s = c["scale"] * q @ k.transpose(1, 2)
    if c["cap"] > 0:
        s = c["cap"] * torch.tanh(s / c["cap"])
    if bias is not None:
        s = s + bias
    if slopes is not None:
        i = torch.arange(sq, dtype=F64)[:, None]
        j = torch.arange(sk, dtype=F64)[None, :]
        if c["mask"] in ("top_left", "bottom_right") and c["left"] < 0 and c["right"] == 0:
            s = s + slopes[:, None, None] * j          # causal: the vertical form (same softmax)
        else:
            off = 0 if c["mask"] in ("top_left", "generic") else sk - sq
            s = s - slopes[:, None, None] * (i + off - j).abs()
    vis = visible(sq, sk, c["mask"], c["left"], c["right"], c["sink_tokens"])
    s = s.masked_fill(~vis, NEG)
    m = s.amax(-1) if sk else torch.full((H, sq), NEG, dtype=F64)
    if sink is not None:
        m = torch.maximum(m, sink[:, None])
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()
    e = torch.exp(s - m[..., None])
    z = e.sum(-1)
    if sink is not None:
        z = z + torch.exp(sink[:, None] - m)
    p = e / torch.where(z > 0, z, torch.ones_like(z))[..., None]
    with torch.no_grad():
        lse = torch.where(z > 0, torch.log(z) + m, torch.full_like(z, NEG))
    if keep is not None:
        p = p * keep / (1.0 - p_drop)
    return p @ v, lse


def reference(case, t, grads=False):
    """Outputs of the case's problem on the float64 tensors ``t`` (public layouts)."""
    c, p = case, case["problem"]
    if p.family == "fwd_appendkv":
        return reference_appendkv(case, t)
    T = {n: torch.as_tensor(np.asarray(x, dtype=np.float64)) for n, x in t.items()
         if n in ("q", "k", "v", "bias", "k_cache", "v_cache", "do", "alibi_slopes", "sink")}
    leaves = [n for n in ("q", "k", "v", "bias") if grads and n in T]
    for n in leaves:
        T[n].requires_grad_(True)
    descale = {n: getattr(p, "scale_" + n) for n in "qkv"} if p.dtype == "fp8" else {}
    os_, lses = [], []
    for b in range(p.batch):
        q_b = _q_of(p, T["q"], b) * descale.get("q", 1.0)
        k_b, v_b = _kv_of(p, T, t, b)
        k_b, v_b = k_b * descale.get("k", 1.0), v_b * descale.get("v", 1.0)
        bias_b = _bias_of(p, T.get("bias"), b, q_b.shape[1], k_b.shape[1])
        slopes = T["alibi_slopes"] if "alibi_slopes" in T else None
        if slopes is not None and slopes.dim() == 2:
            slopes = slopes[b]
        keep = dropout_keep(p, b, q_b.shape[1], k_b.shape[1]) if p.p_drop > 0 else None
        o_b, lse_b = attend(q_b, k_b, v_b, c, bias_b, slopes, T.get("sink"), keep, p.p_drop)
        os_.append(o_b)
        lses.append(lse_b)
    if p.mode == "group":
        o = torch.cat([x.transpose(0, 1) for x in os_], 0) if os_ else None
        lse = torch.cat(lses, 1)
    else:
        o = torch.stack(os_)
        lse = torch.stack(lses).detach()
        if p.layout == "bshd":
            o = o.transpose(1, 2)
    out = {"o": o.detach(), "lse": lse}
    if grads:
        g = torch.autograd.grad((o * T["do"]).sum(), [T[n] for n in leaves], allow_unused=True)
        for n, x in zip(leaves, g):
            out["d" + n] = torch.zeros_like(T[n]) if x is None else x
    return out


def _q_of(p, q, b):
    if p.mode == "group":
        a, e = p.seqstart_q[b], p.seqstart_q[b + 1]
        return q[a:e].transpose(0, 1)
    return q[b].transpose(0, 1) if p.layout == "bshd" else q[b]


def _klen(p, b):
    if p.seqlens_k is not None:
        return p.seqlens_k[b]
    if p.mode == "group":
        return p.seqstart_k[b + 1] - p.seqstart_k[b]
    return p.seqlen_k


def _kv_of(p, T, t, b):
    L = _klen(p, b)
    if p.paged_kv:
        P = p.page_size
        pos = np.arange(L)
        if "block_table" in t:
            pages = np.asarray(t["block_table"])[b, pos // P]
        else:
            ip = np.asarray(t["kv_indptr"])
            pages = np.asarray(t["kv_page_indices"])[ip[b] + pos // P]
        pages, slots = torch.as_tensor(pages, dtype=torch.long), torch.as_tensor(pos % P, dtype=torch.long)
        kc, vc = T["k_cache"], T["v_cache"]
        if p.kv_layout == "vectorized":
            kc, vc = unvectorize(kc, vc, P)
        if p.family == "batch_prefill" or p.layout == "bshd":   # [pages, P, Hk, D]
            return kc[pages, slots].transpose(0, 1), vc[pages, slots].transpose(0, 1)
        return kc[pages, :, slots].transpose(0, 1), vc[pages, :, slots].transpose(0, 1)  # [pages, Hk, P, D]
    k, v = T["k"], T["v"]
    if p.vlayout == "c":   # key-contiguous V: [B, Hk, Dv, Sk] / [Hk, Dv, Tk]
        v = v.permute(2, 0, 1) if p.mode == "group" else v.transpose(-1, -2)
        if p.layout == "bshd" and p.mode != "group":
            v = v.transpose(1, 2)
    if p.mode == "group":
        a = p.seqstart_k[b]
        return k[a:a + L].transpose(0, 1), v[a:a + L].transpose(0, 1)
    if p.layout == "bshd":
        return k[b, :L].transpose(0, 1), v[b, :L].transpose(0, 1)
    return k[b, :, :L], v[b, :, :L]


def dropout_keep(p, b, sq, sk):
    """[H, sq, sk] bool: which probabilities batch b keeps.  The random bytes are CK's Philox stream
    (ck_fmha.philox, checked against Random123's known answers there); the rule is written here: an
    element stays when its byte is at most floor((1 - p_drop) * 255)."""
    from ck_fmha.philox import dropout_randval

    rv = np.stack([dropout_randval(p.seed, p.offset, b, h, p.nhead_q, sq, sk) for h in range(p.nhead_q)])
    return torch.as_tensor(rv.astype(np.int64) <= math.floor((1.0 - p.p_drop) * 255.0))


def vectorize(kc, vc, vec):
    """Linear pages [np, P, Hk, D] -> CK's vectorized layout: K [np, Hk, D/vec, P, vec] (element
    (slot s, channel d) at [d // vec, s, d % vec]), V [np, Hk, P/vec, Dv, vec] (at [s // vec, d, s % vec])."""
    n, P, hk, dq = kc.shape
    dv = vc.shape[-1]
    k = kc.reshape(n, P, hk, dq // vec, vec).transpose(0, 2, 3, 1, 4)
    v = vc.reshape(n, P // vec, vec, hk, dv).transpose(0, 3, 1, 4, 2)
    return np.ascontiguousarray(k), np.ascontiguousarray(v)


def unvectorize(kc, vc, P):
    """The inverse of :func:`vectorize` (torch tensors, for the reference)."""
    n, hk, _, _, vec = kc.shape
    k = kc.permute(0, 3, 1, 2, 4).reshape(n, P, hk, -1)
    v = vc.permute(0, 2, 4, 1, 3).reshape(n, P, hk, -1)
    return k, v


def _rotate(x, pos, cos, sin, r, interleaved):
    """RoPE from its definition: channel pairs (2i, 2i+1) (interleaved) or (i, i + r/2) (half-rotated)
    of the first r channels turn by the angle of (position, i): (a, b) -> (a cos - b sin, a sin + b cos).
    x [..., seq, D] float64, pos [seq]."""
    c, s_ = cos[pos], sin[pos]            # [seq, r/2]
    out = x.clone()
    if interleaved:
        a, b = x[..., 0:r:2], x[..., 1:r:2]
        out[..., 0:r:2], out[..., 1:r:2] = a * c - b * s_, a * s_ + b * c
    else:
        a, b = x[..., : r // 2], x[..., r // 2: r]
        out[..., : r // 2], out[..., r // 2: r] = a * c - b * s_, a * s_ + b * c
    return out


def reference_appendkv(case, t):
    """fwd_appendkv: knew/vnew written at cache positions seqlens_k[b] .. + seqlen_knew - 1 (knew rotated),
    q rotated at positions seqlens_k[b] + i; everything else in the caches unchanged."""
    p = case["problem"]
    T = {n: torch.as_tensor(np.asarray(x, dtype=np.float64)) for n, x in t.items()
         if n in ("q", "knew", "vnew", "k_cache", "v_cache", "rotary_cos", "rotary_sin")}
    bshd, n = p.layout == "bshd", p.seqlen_knew
    seq_first = (lambda x: x.transpose(0, 1)) if bshd else (lambda x: x)   # per batch: [H, S, D] view
    q, kc, vc = T["q"].clone(), T["k_cache"].clone(), T["v_cache"].clone()
    for b in range(p.batch):
        L = p.seqlens_k[b]
        kn, vn = seq_first(T["knew"][b]), seq_first(T["vnew"][b])
        if p.rope != "none":
            inter = p.rope == "interleaved"
            kn = _rotate(kn, torch.arange(L, L + n), T["rotary_cos"], T["rotary_sin"], p.rotary_dim, inter)
            qb = _rotate(seq_first(q[b]), torch.arange(L, L + p.seqlen_q), T["rotary_cos"], T["rotary_sin"],
                         p.rotary_dim, inter)
            q[b] = seq_first(qb)
        pos = torch.arange(L, L + n)
        if p.paged_kv:
            pg = torch.as_tensor(np.asarray(t["block_table"])[b], dtype=torch.long)[pos // p.page_size]
            slot = pos % p.page_size
            if bshd:   # [pages, P, Hk, D]
                kc[pg, slot], vc[pg, slot] = kn.transpose(0, 1), vn.transpose(0, 1)
            else:      # [pages, Hk, P, D]
                kc[pg, :, slot], vc[pg, :, slot] = kn.transpose(0, 1), vn.transpose(0, 1)
        elif bshd:
            kc[b][pos], vc[b][pos] = kn.transpose(0, 1), vn.transpose(0, 1)
        else:
            kc[b][:, pos], vc[b][:, pos] = kn, vn
    return {"q_rot": q, "k_cache": kc, "v_cache": vc}


def _bias_of(p, bias, b, sq, sk):
    if bias is None:
        return None
    if p.mode == "group":
        a = p.seqstart_q[b]
        return bias[:, a:a + sq, :sk]
    return bias[b if bias.shape[0] > 1 else 0][:, :sq, :sk]


# ------------------------------------------------------------------ random cases

HDIMS = {"small": [(32, 32), (64, 64)], "medium": [(32, 32), (64, 64)], "large": [(64, 64), (128, 128), (96, 96), (192, 128)]}


def _mask(rng, fam):
    kind = rng.choice(["none", "causal_tl", "causal_br", "window_tl", "window_br", "generic"],
                      p=[.2, .15, .2, .15, .2, .1])
    if kind == "none":
        return dict(mask="none")
    if kind.startswith("causal"):
        return dict(mask="top_left" if kind.endswith("tl") else "bottom_right", window_left=-1, window_right=0)
    if kind == "generic":
        return dict(mask="generic", window_left=int(rng.integers(0, 9)), window_right=int(rng.integers(0, 6)))
    return dict(mask="top_left" if kind.endswith("tl") else "bottom_right",
                window_left=int(rng.integers(-1, 12)), window_right=int(rng.integers(-1, 5)))


def _lens(rng, n, lo, hi):
    return [int(x) for x in rng.integers(lo, hi + 1, n)]


def make_case(family, seed, size, bf16=True):
    """A random problem of ``family`` with its knobs (a dict the reference reads); ``bf16=False``
    keeps to fp16 (the Triton interpreter's bf16 dot is broken with numpy).  ``family`` may carry a
    variant: ``fam+dropout``, ``batch_prefill+vectorized`` (CK's swizzled pages), ``fam+vcol``
    (key-contiguous V), ``fwd+vcol8`` (the same in fp8); ``fwd_appendkv`` has its own maker."""
    family, _, variant = family.partition("+")
    if family == "fwd_appendkv":
        return make_appendkv_case(seed, size, bf16)
    case = _make_case(family, seed, size, bf16, variant)
    return case


def _make_case(family, seed, size, bf16, variant):
    rng = np.random.default_rng(seed)
    big = size == "large"
    sq_hi, sk_hi = {"small": (40, 70), "medium": (130, 260), "large": (300, 600)}[size]
    dims = HDIMS[size] if (big or family != "bwd_dq_dk_dv") else [(32, 32)]   # (the fake arch's LDS)
    hq, hv = dims[int(rng.integers(len(dims)))]
    hk = int(rng.integers(1, 3))
    kw = dict(family=family, nhead_k=hk, nhead_q=hk * int(rng.integers(1, 4)), hdim_q=hq, hdim_v=hv,
              batch=int(rng.integers(1, 4)), dtype="bf16" if (rng.random() < 0.2 and bf16) else "fp16")
    feat = {"cap": 0.0, "neg_logits": family == "bwd_dq_dk_dv" and rng.random() < 0.3, "bias_shape": None}
    group = family == "batch_prefill" or (family in ("fwd", "bwd_dq_dk_dv") and rng.random() < 0.5)
    split = family in ("fwd_splitkv", "fwd_pagedkv")
    paged = family in ("fwd_pagedkv", "batch_prefill") or (family == "fwd_splitkv" and rng.random() < 0.5)
    kw.update(_mask(rng, family))
    if group:
        B = kw["batch"]
        lq = _lens(rng, B, 0, sq_hi // 2)
        if max(lq) == 0:
            lq[0] = 1
        kw.update(mode="group", seqstart_q=np.cumsum([0, *lq]).tolist())
        if family == "batch_prefill":
            kw["seqlens_k"] = _lens(rng, B, 0, sk_hi)
        else:
            span = _lens(rng, B, 0, sk_hi)
            kw["seqstart_k"] = np.cumsum([0, *span]).tolist()
            if rng.random() < 0.5:   # logical key lengths inside the spans (CK's seqlen_k_ptr)
                kw["seqlens_k"] = [int(rng.integers(0, s + 1)) for s in span]
    elif split:
        kw.update(seqlen_q=int(rng.integers(1, 5)), seqlen_k=int(rng.integers(20, 3 * sk_hi)))
        if paged or rng.random() < 0.5:
            kw["seqlens_k"] = _lens(rng, kw["batch"], 1, kw["seqlen_k"])
        kw["layout"] = str(rng.choice(["bhsd", "bshd"]))
    else:
        kw.update(seqlen_q=int(rng.integers(1, sq_hi)), seqlen_k=int(rng.integers(1, sk_hi)),
                  layout=str(rng.choice(["bhsd", "bshd"])))
    if paged:
        kw.update(paged_kv=True, page_size=int(rng.choice([8, 16, 64])))
        if family == "batch_prefill" and rng.random() < 0.3:
            kw["kv_lookup"] = "sglang"
    if family in ("fwd_splitkv",):
        kw["num_splits"] = int(rng.integers(1, 6))
    # logits features
    r = rng.random()
    if r < 0.2:
        feat["cap"] = kw["logits_soft_cap"] = float(rng.choice([5.0, 20.0]))
    elif r < 0.5 and not split:
        kw["bias"] = "elementwise"
        if family == "bwd_dq_dk_dv" and rng.random() < 0.6:
            kw["dbias"] = True
        feat["bias_shape"] = (bool(rng.random() < 0.7), bool(rng.random() < 0.7))  # (per batch, per head)
    elif r < 0.65 and not split:
        kw["bias"] = "alibi"
    if family != "bwd_dq_dk_dv":
        if kw["mask"] != "none" and kw.get("window_left", -1) >= 0 and rng.random() < 0.4:
            kw["sink_tokens"] = int(rng.integers(1, 5))
        if rng.random() < 0.3:
            kw["sink_logits"] = True
    else:
        kw["deterministic"] = bool(rng.random() < 0.5)
    _apply_variant(kw, variant, np.random.default_rng(seed + 7))   # its own stream: the plain cases stay
    p = FmhaProblem(**kw)
    case = dict(problem=p, scale=p.softmax_scale, mask=p.mask, left=p.window_left,
                right=p.window_right, sink_tokens=p.sink_tokens, **feat)
    if p.mask == "generic":   # a generic window is a top-left one with explicit sides
        case["mask"] = "generic"
    return case


def _apply_variant(kw, variant, rng):
    if variant == "dropout":
        kw.update(p_drop=float(rng.choice([0.1, 0.3, 0.6])), seed=int(rng.integers(1 << 62)),
                  offset=int(rng.integers(1 << 40)))
    elif variant == "vectorized":
        kw["kv_layout"] = "vectorized"
    elif variant in ("vcol", "vcol8"):
        kw["vlayout"] = "c"
    if variant == "vcol8":   # the fp8 forward: e4m3 data with per-tensor descales, no bias
        kw.update(dtype="fp8", bias="none", scale_q=float(rng.choice([0.5, 1.0])),
                  scale_k=float(rng.choice([0.25, 1.0])), scale_v=float(rng.choice([0.5, 2.0])))
        kw.pop("dbias", None)


def make_appendkv_case(seed, size, bf16):
    """fwd_appendkv: batch mode, contiguous or paged caches, no / interleaved / half-rotated RoPE."""
    rng = np.random.default_rng(seed)
    n_hi, L_hi = {"small": (9, 40), "medium": (33, 200), "large": (130, 700)}[size]
    hk = int(rng.integers(1, 3))
    d = int(rng.choice([32, 64] if size != "large" else [64, 128]))
    B = int(rng.integers(1, 4))
    n = int(rng.integers(1, n_hi))
    rope = str(rng.choice(["none", "interleaved", "half_rotated"]))
    kw = dict(family="fwd_appendkv", batch=B, nhead_k=hk, nhead_q=hk * int(rng.integers(1, 3)), hdim_q=d,
              hdim_v=d, seqlen_knew=n, seqlen_q=int(rng.integers(1, n + 1)), seqlens_k=_lens(rng, B, 0, L_hi),
              layout=str(rng.choice(["bhsd", "bshd"])), rope=rope,
              dtype="bf16" if (bf16 and rng.random() < 0.3) else "fp16")
    if rope != "none":
        kw["rotary_dim"] = int(rng.choice([r for r in (16, 32, d) if r <= d]))
    if rng.random() < 0.5:
        kw.update(paged_kv=True, page_size=int(rng.choice([8, 16, 64])))
    else:
        kw["seqlen_k"] = max(kw["seqlens_k"]) + n + int(rng.integers(0, 5))
    p = FmhaProblem(**kw)
    return dict(problem=p, scale=p.softmax_scale, mask=p.mask, left=p.window_left, right=p.window_right,
                sink_tokens=0, cap=0.0, neg_logits=False, bias_shape=None)


# ------------------------------------------------------------------ inputs


def _store(x, dtype):
    """Round float64 -> the dtype's values, in its numpy storage (fp16: float16; bf16: float32)."""
    t = torch.as_tensor(np.asarray(x, dtype=np.float64))
    if dtype == "fp16":
        return t.to(torch.float16).numpy()
    if dtype == "fp8":
        return t.to(torch.float8_e4m3fn).to(torch.float32).numpy()
    return t.to(torch.bfloat16).to(torch.float32).numpy()


def _nan_beyond(x, p, axis_of_seq, lens, starts=None):
    """NaN in the key positions past each batch's logical length (nothing may read them)."""
    x = x.astype(np.float32 if x.dtype != np.float16 else np.float16, copy=True)
    for b, L in enumerate(lens):
        if starts is not None:
            a, e = starts[b] + L, starts[b + 1]
            idx = [slice(None)] * x.ndim
            idx[axis_of_seq] = slice(a, e)
        else:
            idx = [b] + [slice(None)] * (x.ndim - 1)
            idx[axis_of_seq] = slice(L, None)
        x[tuple(idx)] = np.nan
    return x


def make_tensors(case, rng):
    p = case["problem"]
    if p.family == "fwd_appendkv":
        return make_appendkv_tensors(case, rng)
    dt, H, Hk, Dq, Dv, B = p.dtype, p.nhead_q, p.nhead_k, p.hdim_q, p.hdim_v, p.batch
    group = p.mode == "group"
    lens = [_klen(p, b) for b in range(B)]
    t = {}
    if group:
        Tq = p.seqstart_q[-1]
        q = rng.standard_normal((Tq, H, Dq))
    else:
        q = rng.standard_normal((B, p.seqlen_q, H, Dq) if p.layout == "bshd" else (B, H, p.seqlen_q, Dq))
    if case["neg_logits"]:   # rows whose every logit is very negative: LSE << -11
        w = np.ones(Dq)
        q = -2.0 * w + 0.05 * q
    t["q"] = _store(q, dt)
    if p.paged_kv:
        P = p.page_size
        need = [-(-L // P) for L in lens]
        npages = sum(need) + 2
        perm = rng.permutation(npages - 1)          # page npages-1 is all NaN: unused table entries
        shape = ((npages, P, Hk) if (p.family == "batch_prefill" or p.layout == "bshd") else (npages, Hk, P))
        kc = _store(rng.standard_normal(shape + (Dq,)), dt)
        vc = _store(rng.standard_normal(shape + (Dv,)), dt)
        kc[npages - 1] = np.nan
        vc[npages - 1] = np.nan
        if p.kv_layout == "vectorized":
            kc, vc = vectorize(kc, vc, 16 // 2)   # 16-byte vectors of 2-byte elements
        t["k_cache"], t["v_cache"] = kc, vc
        if p.kv_lookup == "sglang":
            order, ip, last = [], [0], []
            for b, n in enumerate(need):
                order += perm[sum(need[:b]):sum(need[:b]) + n].tolist()
                ip.append(ip[-1] + n)
                last.append(lens[b] - (n - 1) * P if n else 0)
            t["kv_indptr"] = np.asarray(ip, np.int32)
            t["kv_page_indices"] = np.asarray(order + [npages - 1], np.int32)
            t["kv_last_page_lens"] = np.asarray(last, np.int32)
        else:
            cols = max(max(need), 1) + 1
            bt = np.full((B, cols), npages - 1, np.int32)
            o = 0
            for b, n in enumerate(need):
                bt[b, :n] = perm[o:o + n]
                o += n
            t["block_table"] = bt
    else:
        if group:
            Tk = p.seqstart_k[-1]
            k, v = rng.standard_normal((Tk, Hk, Dq)), rng.standard_normal((Tk, Hk, Dv))
        elif p.layout == "bshd":
            k, v = rng.standard_normal((B, p.seqlen_k, Hk, Dq)), rng.standard_normal((B, p.seqlen_k, Hk, Dv))
        else:
            k, v = rng.standard_normal((B, Hk, p.seqlen_k, Dq)), rng.standard_normal((B, Hk, p.seqlen_k, Dv))
        if case["neg_logits"]:
            k = 2.0 + 0.05 * k
        k, v = _store(k, dt), _store(v, dt)
        if p.seqlens_k is not None:
            ax = 0 if group else (1 if p.layout == "bshd" else 2)
            starts = p.seqstart_k if group else None
            k = _nan_beyond(k, p, ax, lens, starts)
            v = _nan_beyond(v, p, ax, lens, starts)
        if p.vlayout == "c":   # key-contiguous V: [B, Hk, Dv, Sk] / [Hk, Dv, Tk]
            v = np.ascontiguousarray(v.transpose(1, 2, 0) if group else
                                     (v.transpose(0, 2, 3, 1) if p.layout == "bshd" else v.swapaxes(-1, -2)))
        t["k"], t["v"] = k, v
    if p.bias == "elementwise":
        per_b, per_h = case["bias_shape"]
        if group:
            shape = (H if per_h else 1, p.seqstart_q[-1], p.seqlen_k)
        else:
            shape = (B if per_b else 1, H if per_h else 1, p.seqlen_q, p.seqlen_k)
        bias = _store(rng.standard_normal(shape), dt)
        if group:   # columns past a batch's key length are never read
            for b in range(B):
                a, e = p.seqstart_q[b], p.seqstart_q[b + 1]
                bias[:, a:e, lens[b]:] = np.nan
        t["bias"] = bias
    if p.bias == "alibi":
        t["alibi_slopes"] = rng.uniform(0.05, 0.9, (B, H) if rng.random() < 0.3 else (H,)).astype(np.float32)
    if p.sink_logits:
        t["sink"] = rng.uniform(-1, 3, (H,)).astype(np.float32)
    if p.family == "bwd_dq_dk_dv":
        fwd = reference(case, t)
        t["o"] = _store(fwd["o"].numpy(), dt)
        t["lse"] = fwd["lse"].numpy().astype(np.float32)
        t["do"] = _store(rng.standard_normal(t["o"].shape), dt)
    return t


def make_appendkv_tensors(case, rng):
    """Caches full of values (an append in the wrong place shows), new K/V, q and random RoPE angles."""
    p = case["problem"]
    dt, B, H, Hk, D, n = p.dtype, p.batch, p.nhead_q, p.nhead_k, p.hdim_q, p.seqlen_knew
    bshd = p.layout == "bshd"
    shp = (lambda h, s_: (B, s_, h, D)) if bshd else (lambda h, s_: (B, h, s_, D))
    t = {"q": _store(rng.standard_normal(shp(H, p.seqlen_q)), dt),
         "knew": _store(rng.standard_normal(shp(Hk, n)), dt), "vnew": _store(rng.standard_normal(shp(Hk, n)), dt)}
    if p.paged_kv:
        P = p.page_size
        need = [-(-(L + n) // P) for L in p.seqlens_k]
        npages = sum(need) + 1
        perm = rng.permutation(npages)
        page = (npages, P, Hk, D) if bshd else (npages, Hk, P, D)
        t["k_cache"] = _store(rng.standard_normal(page), dt)
        t["v_cache"] = _store(rng.standard_normal(page), dt)
        bt = np.full((B, max(need) + 1), perm[-1], np.int32)
        o = 0
        for b, k in enumerate(need):
            bt[b, :k] = perm[o:o + k]
            o += k
        t["block_table"] = bt
    else:
        t["k_cache"] = _store(rng.standard_normal(shp(Hk, p.seqlen_k)), dt)
        t["v_cache"] = _store(rng.standard_normal(shp(Hk, p.seqlen_k)), dt)
    if p.rope != "none":
        ang = rng.uniform(0, 2 * math.pi, (max(p.seqlens_k) + max(n, p.seqlen_q) + 3, p.rotary_dim // 2))
        t["rotary_cos"], t["rotary_sin"] = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    return t


# ------------------------------------------------------------------ comparison

TOL = {"fp16": 2e-2, "bf16": 8e-2, "fp8": 1.5e-1}


def _grad_floor(case, t):
    """A small fraction of each gradient's natural size, from the inputs' magnitudes: the scale below
    which an error is rounding (a gradient that cancels to ~0, e.g. a row with one visible key, where
    dS = dP - rowsum(dO * O) is the difference of two rounded numbers), not a wrong result."""
    if t is None or "do" not in t:
        return {}
    mx = {n: float(np.nanmax(np.abs(np.asarray(t[n], np.float64)), initial=0.0))
          for n in ("q", "k", "v", "do") if n in t}
    dv = case["problem"].hdim_v
    ds = mx["do"] * mx["v"] * math.sqrt(dv)          # |dP|, |dS| / P
    return {"dq": 0.02 * case["scale"] * ds * mx["k"], "dk": 0.02 * case["scale"] * ds * mx["q"],
            "dv": 0.02 * mx["do"], "dbias": 0.02 * ds}


def mismatches(case, got, want, t=None):
    """Names of the outputs that disagree: relative error (to the output's largest magnitude, for
    gradients at least :func:`_grad_floor`) over the tolerance, or a NaN, or -inf (empty rows' LSE)
    in other places."""
    bad = []
    tol = TOL[case["problem"].dtype]
    floor = _grad_floor(case, t)
    for name, ref in want.items():
        g = np.asarray(got[name], dtype=np.float64)
        r = np.asarray(ref, dtype=np.float64)
        if g.shape != r.shape:
            bad.append(f"{name}: shape {g.shape} != {r.shape}")
            continue
        if np.isnan(g).any():
            bad.append(f"{name}: {int(np.isnan(g).sum())} NaN")
            continue
        fin = np.isfinite(r)
        if not np.array_equal(fin, np.isfinite(g)) or not np.array_equal(g[~fin], r[~fin]):
            bad.append(f"{name}: non-finite entries differ")
            continue
        if not fin.any():
            continue
        scale = max(np.abs(r[fin]).max(), 1.0 if name == "lse" else floor.get(name, 1e-6))
        err = np.abs(g[fin] - r[fin]).max() / scale
        if err > (3 * tol if name.startswith("d") else tol):
            bad.append(f"{name}: rel. error {err:.3g}")
    return bad


# ------------------------------------------------------------------ the suite

FAMILIES = {"fwd": 14, "fwd_splitkv": 6, "fwd_pagedkv": 3, "batch_prefill": 5, "bwd_dq_dk_dv": 12,
            # variants (appended: the seeds of the cases above stay)
            "fwd+dropout": 2, "bwd_dq_dk_dv+dropout": 2, "batch_prefill+dropout": 1, "fwd_appendkv": 4,
            "batch_prefill+vectorized": 2, "fwd+vcol": 1, "fwd+vcol8": 2}
CASES = [(fam, i) for fam, n in FAMILIES.items() for i in range(n)]
GPU = os.environ.get("TRITON_INTERPRET") != "1"


@pytest.fixture(scope="module")
def dispatchers():
    """numpy and triton Dispatchers over the Triton key space (fp16 and bf16)."""
    old = plugins._MANAGER
    if GPU:
        mgr = plugins.get_manager()
        tb = mgr.backend("triton")
        arch = next((a.name for a in mgr.archs().values() if tb.can_execute(a)[0]), None)
        if arch is None or not torch.cuda.is_available():
            pytest.skip("no GPU / no installed arch plugin describes it")
    else:
        mgr = PluginManager(plugins=[arch_plugin(make_fake_arch())])
        plugins.reset_manager(mgr)
        arch = "fake64"
    out = {b: Dispatcher(Registry.from_enumeration("fmha", arch, b, dtypes=("fp16", "bf16", "fp8")), backend=b)
           for b in ("numpy", "triton")}
    yield out
    plugins.reset_manager(old)


def _run(disp, case, t):
    p = case["problem"]
    be = disp.backend_spec
    outs = disp.run_dict(p, {n: be.to_backend(x) for n, x in t.items()})
    names = {"bwd_dq_dk_dv": ("dq", "dk", "dv", "dbias"),
             "fwd_appendkv": ("q_rot", "k_cache", "v_cache")}.get(p.family, ("o", "lse"))
    return {n: be.to_numpy(outs[n]) for n in names if n in outs}


def _want(case, t):
    p = case["problem"]
    if p.family == "fwd_appendkv":
        return {n: x.numpy() for n, x in reference(case, t).items()}
    if p.family != "bwd_dq_dk_dv":
        r = reference(case, t)
        return {"o": r["o"].numpy(), "lse": r["lse"].numpy()}
    r = reference(case, t, grads=True)
    want = {"dq": r["dq"].numpy(), "dk": r["dk"].numpy(), "dv": r["dv"].numpy()}
    if p.dbias:
        want["dbias"] = r["dbias"].numpy()
    return want


def _fuzz(disp, fam, i, size):
    bf16 = disp.backend == "numpy" or GPU
    case = make_case(fam, 1000 * (1 + list(FAMILIES).index(fam)) + i, size, bf16)
    t = make_tensors(case, np.random.default_rng(i))
    p = case["problem"]
    if p.vlayout == "c" and p.dtype != "fp8":
        # the Triton key space (which the numpy backend runs too) reads a key-contiguous V only in the
        # fp8 forward: a refusal that says so, never a wrong run
        from ck_core.errors import MissingKernel
        assert any("row-major" in why for why in disp.registry.why_not(p, limit=10 ** 6))
        with pytest.raises(MissingKernel):
            _run(disp, case, t)
        return
    got = _run(disp, case, t)
    bad = mismatches(case, got, _want(case, t), t)
    assert not bad, (bad, case["problem"])


@pytest.mark.skipif(GPU, reason="the CPU variant (numpy backend and the Triton interpreter)")
@pytest.mark.parametrize("backend", ["numpy", "triton"])
@pytest.mark.parametrize("fam,i", CASES, ids=[f"{f}-{i}" for f, i in CASES])
def test_fuzz_cpu(dispatchers, backend, fam, i):
    _fuzz(dispatchers[backend], fam, i, "small")


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="GPU variant: CK_TEST_GPU=1 pytest -m gpu")
@pytest.mark.parametrize("fam,i", CASES, ids=[f"{f}-{i}" for f, i in CASES])
def test_fuzz_gpu(dispatchers, fam, i):
    _fuzz(dispatchers["triton"], fam, i, "large")


def test_reference_agrees_with_sdpa():
    """The reference itself, on the plain causal case, against torch's SDPA in float64."""
    case = dict(scale=0.125, cap=0.0, mask="top_left", left=-1, right=0, sink_tokens=0)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 11, 64, generator=g, dtype=F64) for _ in range(3))
    o, _ = attend(q, k, v, case)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.125)
    assert torch.allclose(o, want, atol=1e-12)
    assert not math.isnan(o.sum().item())
