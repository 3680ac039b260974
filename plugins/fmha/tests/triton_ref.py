"""float64 torch reference for the Triton FMHA tests (mask semantics of ck_fmha.backends.triton.launch)."""
import torch


def to_bhsd(t, layout):
    return t.transpose(1, 2) if layout == "bshd" else t


def ref_attention(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, scale=None, layout="bhsd",
                  align=None, seqlens_k=None):
    """Returns (o [B,H,Sq,Dv] float64 in bhsd, lse [B,H,Sq] float64)."""
    from ck_fmha.backends.triton.launch import mask_params

    q, k, v = (to_bhsd(t, layout).double() for t in (q, k, v))
    b, hq, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    g = hq // hk
    k = k.repeat_interleave(g, dim=1)
    v = v.repeat_interleave(g, dim=1)
    scale = d ** -0.5 if scale is None else scale
    s = torch.einsum("bhid,bhjd->bhij", q, k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    mode, br, left, right = mask_params(causal, window, align)
    i = torch.arange(sq).view(-1, 1)
    j = torch.arange(sk).view(1, -1)
    ok = torch.ones(b, 1, sq, sk, dtype=torch.bool)
    for bi in range(b):
        skb = sk if seqlens_k is None else int(seqlens_k[bi])
        off = (skb - sq) if br else 0
        rel = j - i - off
        okb = j < skb
        if mode & 1:
            okb = okb & (rel <= right)
        if mode & 2:
            okb = okb & (rel >= -left)
        ok[bi, 0] = okb
    s = s.masked_fill(~ok, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1).masked_fill(torch.isinf(lse).unsqueeze(-1), 0.0))
    p = p.masked_fill(~ok, 0.0)
    o = p @ v
    return o, lse


def rel_err(a, b):
    a = a.double()
    b = b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
