"""The public torch APIs on CPU tensors, each case checked against a float64 reference written
from the math (plain torch float64 ops, none of the code under test).

Used by tests/test_public_api_cpu.py in two modes: the default numpy backend without the
interpreter (a subprocess: ``python tests/api_cases.py [names...]`` prints one JSON line per
case) and under TRITON_INTERPRET=1 (in the pytest process).  A case returns nothing or raises:
AssertionError for a wrong result, anything else is an error.
"""
from __future__ import annotations

import json
import sys

import torch

F64 = torch.float64


def rel(got, want) -> float:
    got, want = got.detach().to(F64), want.detach().to(F64)
    if got.shape != want.shape:
        raise AssertionError(f"shape {tuple(got.shape)}, want {tuple(want.shape)}")
    if not torch.isfinite(got).all():
        raise AssertionError("non-finite values")
    return float((got - want).norm() / max(float(want.norm()), 1e-6))


def close(name, got, want, tol):
    e = rel(got, want)
    if not e <= tol:
        raise AssertionError(f"{name}: relative error {e:.3g} > {tol}")


def ref_attn(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, alibi=None, scale=None, top_left=False,
             lens_k=None):
    """softmax(mask(q k^T * scale)) v in float64; q [B, Hq, Sq, D], k/v [B, Hk, Sk, D*] (GQA: head h
    reads kv head h // (Hq / Hk)).  Masks are FlashAttention's (bottom-right aligned: query i sees key
    j when i + Sk - Sq - left <= j <= i + Sk - Sq + right; causal is right = 0); ``top_left`` drops the
    Sk - Sq shift.  A row that sees no key is 0.  ``lens_k[b]``: only the first keys of batch b."""
    q, k, v = (t.to(F64) for t in (q, k, v))
    b, hq, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(hq // hk, dim=1)
    v = v.repeat_interleave(hq // hk, dim=1)
    scale = d ** -0.5 if scale is None else scale
    s = torch.einsum("bhid,bhjd->bhij", q, k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    outs = []
    for bi in range(b):
        n = sk if lens_k is None else int(lens_k[bi])
        i = torch.arange(sq).view(-1, 1)
        j = torch.arange(sk).view(1, -1)
        diag = i + (0 if top_left else n - sq)
        ok = j < n
        left, right = window
        if causal:
            right = 0
        if right >= 0:
            ok = ok & (j <= diag + right)
        if left >= 0:
            ok = ok & (j >= diag - left)
        sb = s[bi].clone()
        if alibi is not None:
            sb = sb - alibi.to(F64).view(-1, 1, 1) * (diag - j).abs().to(F64)
        sb = sb.masked_fill(~ok, float("-inf"))
        p = torch.softmax(sb, dim=-1)
        p = torch.nan_to_num(p, nan=0.0)
        outs.append(p @ v[bi])
    return torch.stack(outs)


def _rand(*shape, dtype=torch.float16, g=None, grad=False):
    t = torch.randn(*shape, generator=g).to(dtype)
    return t.requires_grad_(grad)


def _grads(fn_got, fn_want, inputs, tol_f, tol_b, name):
    """Forward and backward of ``fn_got`` (the API) against ``fn_want`` (float64) with one dO."""
    out = fn_got(*inputs)
    ref_in = [x.detach().to(F64).requires_grad_(x.requires_grad) for x in inputs]
    want = fn_want(*ref_in)
    close(f"{name} forward", out, want, tol_f)
    if not any(x.requires_grad for x in inputs):
        return
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(out.dtype)
    gs = torch.autograd.grad(out, [x for x in inputs if x.requires_grad], do)
    ws = torch.autograd.grad(want, [x for x in ref_in if x.requires_grad], do.to(F64))
    for n, (g, w) in enumerate(zip(gs, ws)):
        close(f"{name} grad {n}", g, w, tol_b)


CASES: dict = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


@case
def attention_fwd_bwd():
    import ck_fmha

    g = torch.Generator().manual_seed(1)
    q, k, v = _rand(2, 4, 9, 64, g=g, grad=True), _rand(2, 2, 13, 64, g=g, grad=True), _rand(2, 2, 13, 64, g=g, grad=True)
    _grads(lambda q, k, v: ck_fmha.attention(q, k, v), lambda q, k, v: ref_attn(q, k, v), [q, k, v], 2e-2, 3e-2,
           "attention")
    q2 = _rand(1, 2, 11, 40, g=g, grad=True)
    k2, v2 = _rand(1, 2, 11, 40, g=g, grad=True), _rand(1, 2, 11, 40, g=g, grad=True)
    _grads(lambda q, k, v: ck_fmha.attention(q, k, v, causal=True), lambda q, k, v: ref_attn(q, k, v, causal=True),
           [q2, k2, v2], 2e-2, 3e-2, "attention causal")


@case
def flash_attn_func_fwd_bwd():
    from ck_fmha.flash_attn import flash_attn_func

    g = torch.Generator().manual_seed(2)
    t = lambda x: x.transpose(1, 2)   # noqa: E731  (bshd <-> bhsd)
    q, k, v = _rand(2, 7, 4, 32, g=g, grad=True), _rand(2, 10, 1, 32, g=g, grad=True), _rand(2, 10, 1, 32, g=g, grad=True)
    for kw in ({}, {"causal": True}, {"window_size": (3, 1)}, {"softcap": 5.0}):
        _grads(lambda q, k, v: flash_attn_func(q, k, v, **kw),
               lambda q, k, v: t(ref_attn(t(q), t(k), t(v), causal=kw.get("causal", False),
                                          window=kw.get("window_size", (-1, -1)), softcap=kw.get("softcap", 0.0))),
               [q, k, v], 2e-2, 3e-2, f"flash_attn_func {kw}")
    slopes = torch.rand(4, generator=g) * 0.5
    _grads(lambda q, k, v: flash_attn_func(q, k, v, alibi_slopes=slopes),
           lambda q, k, v: t(ref_attn(t(q), t(k), t(v), alibi=slopes)), [q, k, v], 2e-2, 3e-2, "flash_attn alibi")


@case
def flash_attn_packed_fwd_bwd():
    from ck_fmha.flash_attn import flash_attn_kvpacked_func, flash_attn_qkvpacked_func

    g = torch.Generator().manual_seed(3)
    t = lambda x: x.transpose(1, 2)   # noqa: E731
    qkv = _rand(2, 6, 3, 2, 32, g=g, grad=True)
    _grads(lambda x: flash_attn_qkvpacked_func(x, causal=True),
           lambda x: t(ref_attn(t(x[:, :, 0]), t(x[:, :, 1]), t(x[:, :, 2]), causal=True)), [qkv], 2e-2, 3e-2,
           "qkvpacked")
    q, kv = _rand(1, 5, 4, 32, g=g, grad=True), _rand(1, 8, 2, 2, 32, g=g, grad=True)
    _grads(lambda q, kv: flash_attn_kvpacked_func(q, kv),
           lambda q, kv: t(ref_attn(t(q), t(kv[:, :, 0]), t(kv[:, :, 1]))), [q, kv], 2e-2, 3e-2, "kvpacked")


def _varlen_ref(q, k, v, cu_q, cu_k, causal):
    outs = []
    for b in range(len(cu_q) - 1):
        qs, ks = q[cu_q[b]:cu_q[b + 1]], k[cu_k[b]:cu_k[b + 1]]
        vs = v[cu_k[b]:cu_k[b + 1]]
        if qs.shape[0] == 0:
            continue
        if ks.shape[0] == 0:
            outs.append(torch.zeros(qs.shape[0], qs.shape[1], v.shape[-1], dtype=F64))
            continue
        o = ref_attn(qs.transpose(0, 1)[None], ks.transpose(0, 1)[None], vs.transpose(0, 1)[None], causal=causal)
        outs.append(o[0].transpose(0, 1))
    return torch.cat(outs) if outs else torch.zeros(0, q.shape[1], v.shape[-1], dtype=F64)


@case
def flash_attn_varlen_fwd_bwd():
    from ck_fmha.flash_attn import flash_attn_varlen_func

    g = torch.Generator().manual_seed(4)
    lq, lk = [3, 0, 6], [5, 4, 7]
    cu_q = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32)
    q = _rand(sum(lq), 4, 32, g=g, grad=True)
    k, v = _rand(sum(lk), 2, 32, g=g, grad=True), _rand(sum(lk), 2, 32, g=g, grad=True)
    for causal in (False, True):
        _grads(lambda q, k, v: flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=causal),
               lambda q, k, v: _varlen_ref(q, k, v, cu_q.tolist(), cu_k.tolist(), causal), [q, k, v], 2e-2, 3e-2,
               f"varlen causal={causal}")
    from ck_fmha.flash_attn import flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func

    kv = _rand(sum(lk), 2, 2, 32, g=g, grad=True)
    _grads(lambda q, kv: flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, max(lq), max(lk)),
           lambda q, kv: _varlen_ref(q, kv[:, 0], kv[:, 1], cu_q.tolist(), cu_k.tolist(), False), [q, kv], 2e-2,
           3e-2, "varlen kvpacked")
    qkv = _rand(sum(lk), 3, 2, 32, g=g, grad=True)
    _grads(lambda x: flash_attn_varlen_qkvpacked_func(x, cu_k, max(lk), causal=True),
           lambda x: _varlen_ref(x[:, 0], x[:, 1], x[:, 2], cu_k.tolist(), cu_k.tolist(), True), [qkv], 2e-2, 3e-2,
           "varlen qkvpacked")


@case
def flash_attn_varlen_all_empty():
    """Every query sequence empty: FlashAttention returns an empty output, zero gradients."""
    from ck_fmha.flash_attn import flash_attn_varlen_func

    q = torch.zeros(0, 2, 32, dtype=torch.float16, requires_grad=True)
    k = torch.randn(13, 2, 32).half().requires_grad_()
    v = torch.randn(13, 2, 32).half().requires_grad_()
    o = flash_attn_varlen_func(q, k, v, torch.tensor([0, 0], dtype=torch.int32),
                               torch.tensor([0, 13], dtype=torch.int32), 0, 13)
    assert o.shape == (0, 2, 32), o.shape
    o.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    assert float(k.grad.abs().sum()) == 0.0 and float(v.grad.abs().sum()) == 0.0


@case
def flash_attn_with_kvcache_fwd():
    from ck_fmha.flash_attn import flash_attn_with_kvcache

    g = torch.Generator().manual_seed(6)
    b, hq, hk, d, cap, sn = 2, 4, 2, 32, 24, 2
    kc, vc = _rand(b, cap, hk, d, g=g), _rand(b, cap, hk, d, g=g)
    kn, vn = _rand(b, sn, hk, d, g=g), _rand(b, sn, hk, d, g=g)
    q = _rand(b, sn, hq, d, g=g)
    lens = torch.tensor([5, 17], dtype=torch.int32)
    want_k, want_v = kc.clone(), vc.clone()
    for bi in range(b):
        want_k[bi, lens[bi]:lens[bi] + sn], want_v[bi, lens[bi]:lens[bi] + sn] = kn[bi], vn[bi]
    o = flash_attn_with_kvcache(q, kc, vc, k=kn, v=vn, cache_seqlens=lens, causal=True)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v), "cache rows not appended"
    t = lambda x: x.transpose(1, 2)   # noqa: E731
    want = t(ref_attn(t(q), t(want_k), t(want_v), causal=True, lens_k=(lens + sn).tolist()))
    close("with_kvcache", o, want, 2e-2)


@case
def splitkv_and_paged_decode_fwd():
    from ck_fmha import decode

    g = torch.Generator().manual_seed(7)
    b, hq, hk, d, sk = 2, 4, 2, 64, 40
    q = _rand(b, hq, 1, d, g=g)
    k, v = _rand(b, hk, sk, d, g=g), _rand(b, hk, sk, d, g=g)
    lens = torch.tensor([40, 23], dtype=torch.int32)
    close("splitkv_decode", decode.splitkv_decode(q, k, v, seqlens_k=lens, num_splits=3),
          ref_attn(q, k, v, lens_k=lens.tolist()), 2e-2)
    ps, npages = 8, 5
    pool_k, pool_v = _rand(11, ps, hk, d, g=g), _rand(11, ps, hk, d, g=g)
    table = torch.randperm(11, generator=g)[:b * npages].view(b, npages).to(torch.int32)
    kk = pool_k[table.long()].reshape(b, npages * ps, hk, d).transpose(1, 2)
    vv = pool_v[table.long()].reshape(b, npages * ps, hk, d).transpose(1, 2)
    close("paged_decode", decode.paged_decode(q, pool_k, pool_v, table, lens),
          ref_attn(q, kk, vv, lens_k=lens.tolist()), 2e-2)


@case
def appendkv_fwd():
    from ck_fmha import decode

    g = torch.Generator().manual_seed(8)
    b, hq, hk, sn, cap, d = 2, 4, 2, 3, 20, 32
    kc, vc = _rand(b, hk, cap, d, g=g), _rand(b, hk, cap, d, g=g)
    want_k, want_v = kc.clone(), vc.clone()
    q, kn, vn = _rand(b, hq, sn, d, g=g), _rand(b, hk, sn, d, g=g), _rand(b, hk, sn, d, g=g)
    lens = [0, 9]
    q_rot, k2, v2 = decode.appendkv(q, kn, vn, kc, vc, torch.tensor(lens, dtype=torch.int32))
    for bi, n in enumerate(lens):
        want_k[bi, :, n:n + sn], want_v[bi, :, n:n + sn] = kn[bi], vn[bi]
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v), "appendkv wrote the wrong rows"
    assert torch.equal(q_rot, q)


@case
def batch_prefill_fwd():
    from ck_fmha.prefill import batch_prefill

    g = torch.Generator().manual_seed(9)
    from ck_core.api import backend_for

    # CK's batch_prefill kernels (the numpy backend's space on gfx942): head dims 128/256, pages of
    # 1/16/1024; the Triton ones on gfx942 (interpreter): head dims whose tiles fit its 64 KiB LDS
    d = 128 if backend_for(torch.device("cpu")) == "numpy" else 64
    hq, hk, ps = 2, 1, 16
    lq, lk = [3, 5], [19, 6]
    cu_q = torch.tensor([0, 3, 8], dtype=torch.int32)
    q = _rand(sum(lq), hq, d, g=g)
    pool_k, pool_v = _rand(5, ps, hk, d, g=g), _rand(5, ps, hk, d, g=g)
    table = torch.tensor([[4, 0], [2, 1]], dtype=torch.int32)
    o = batch_prefill(q, pool_k, pool_v, torch.tensor(lk, dtype=torch.int32), cu_seqlens_q=cu_q, max_seqlen_q=5,
                      max_seqlen_k=32, block_table=table, causal=True)
    o = o[0] if isinstance(o, tuple) else o
    outs = []
    for bi in range(2):
        kk = pool_k[table[bi].long()].reshape(-1, hk, d)[:lk[bi]]
        vv = pool_v[table[bi].long()].reshape(-1, hk, d)[:lk[bi]]
        qs = q[cu_q[bi]:cu_q[bi + 1]]
        outs.append(ref_attn(qs.transpose(0, 1)[None], kk.transpose(0, 1)[None], vv.transpose(0, 1)[None],
                             causal=True, top_left=True)[0].transpose(0, 1))   # align=None: top-left
    close("batch_prefill", o, torch.cat(outs), 2e-2)


_ACT = {None: lambda x: x, "relu": torch.relu, "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu,
        "sigmoid": torch.sigmoid, "tanh": torch.tanh}


@case
def gemm_matmul_linear_fwd_bwd():
    from ck_gemm import linear, matmul

    g = torch.Generator().manual_seed(10)
    for dt in (torch.float16, torch.float32):
        a = _rand(13, 21, dtype=dt, g=g, grad=True)
        bt = _rand(9, 21, dtype=dt, g=g, grad=True)    # b as a transposed view
        bias = _rand(9, dtype=dt, g=g, grad=True)
        tol = 1e-2 if dt == torch.float16 else 1e-4
        for act in (None, "relu", "gelu", "sigmoid"):
            _grads(lambda a, bt, bias: matmul(a, bt.t(), d=(bias,), activation=act),
                   lambda a, bt, bias: _ACT[act](a @ bt.t() + bias), [a, bt, bias], tol, 3 * tol, f"matmul {act}")
        x = _rand(2, 5, 21, dtype=dt, g=g, grad=True)
        _grads(lambda x, w, bias: linear(x, w, bias),
               lambda x, w, bias: x @ w.t() + bias, [x, bt, bias], tol, 3 * tol, "linear")


@case
def conv_fwd_bwd():
    import ck_conv
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(11)
    for nd, fn, ref in ((1, ck_conv.conv1d, F.conv1d), (2, ck_conv.conv2d, F.conv2d), (3, ck_conv.conv3d, F.conv3d)):
        size = (9, 7, 5)[nd - 1]
        x = _rand(2, 4, *([size] * nd), dtype=torch.float32, g=g, grad=True)
        w = _rand(6, 2, *([3] * nd), dtype=torch.float32, g=g, grad=True)
        bias = _rand(6, dtype=torch.float32, g=g, grad=True)
        kw = dict(stride=2, padding=1, dilation=1, groups=2)
        _grads(lambda x, w, bias: fn(x, w, bias, **kw), lambda x, w, bias: ref(x, w, bias, **kw), [x, w, bias],
               1e-4, 1e-4, f"conv{nd}d")
    x = _rand(1, 4, 8, 8, g=g, grad=True)
    w = _rand(4, 1, 3, 3, g=g, grad=True)
    _grads(lambda x, w: ck_conv.conv2d(x, w, padding=2, dilation=2, groups=4),
           lambda x, w: F.conv2d(x, w, padding=2, dilation=2, groups=4), [x, w], 1e-2, 2e-2, "depthwise fp16")


@case
def bad_inputs_refused():
    """The API's validation runs before any backend: the same refusals in both modes."""
    import ck_conv
    from ck_core.errors import InvalidProblem
    from ck_fmha import decode
    from ck_fmha.flash_attn import flash_attn_func, flash_attn_varlen_func

    i32 = lambda *v: torch.tensor(v, dtype=torch.int32)   # noqa: E731
    h = lambda *s: torch.randn(*s).half()   # noqa: E731
    calls = {
        "k batch": lambda: flash_attn_func(h(2, 5, 4, 32), h(1, 7, 4, 32), h(1, 7, 4, 32)),
        "v keys": lambda: flash_attn_func(h(2, 5, 4, 32), h(2, 7, 4, 32), h(2, 6, 4, 32)),
        "alibi heads": lambda: flash_attn_func(h(1, 5, 4, 32), h(1, 5, 4, 32), h(1, 5, 4, 32),
                                               alibi_slopes=torch.rand(3)),
        "page index": lambda: decode.paged_decode(h(2, 4, 1, 64), h(5, 8, 2, 64), h(5, 8, 2, 64),
                                                  i32(0, 1, 2, 7).view(2, 2), i32(10, 10)),
        "float cu_seqlens": lambda: flash_attn_varlen_func(h(5, 2, 32), h(5, 2, 32), h(5, 2, 32),
                                                           torch.tensor([0.0, 5.0]), i32(0, 5), 5, 5),
        "conv padding": lambda: ck_conv.conv2d(h(1, 4, 8, 8), h(4, 4, 3, 3), padding=(1.7, 0.2)),
    }
    for what, call in calls.items():
        try:
            call()
        except InvalidProblem:
            continue
        raise AssertionError(f"{what}: not refused")


class Skip(Exception):
    """A case whose optional dependency is not installed."""


@case
def transformers_attn_implementation():
    """attn_implementation="ck_fmha" in a tiny random Llama (GQA): logits, loss and gradients as sdpa's."""
    try:
        from transformers import AutoModelForCausalLM, LlamaConfig
    except ImportError:
        raise Skip("transformers is not installed") from None
    from ck_fmha.integrations import transformers as ck_tf

    name = ck_tf.register()
    cfg = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=32, max_position_embeddings=64, pad_token_id=0)
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(LlamaConfig(**cfg), attn_implementation="sdpa", dtype=torch.float32)
    ck = AutoModelForCausalLM.from_config(LlamaConfig(**cfg), attn_implementation=name, dtype=torch.float32)
    ck.load_state_dict(ref.state_dict())
    ref, ck = ref.half().eval(), ck.half().eval()
    x = torch.randint(1, 97, (2, 11), generator=torch.Generator().manual_seed(1))
    out_r, out_c = ref(x, labels=x), ck(x, labels=x)
    close("logits", out_c.logits, out_r.logits, 5e-3)
    out_r.loss.backward()
    out_c.loss.backward()
    for (pname, pr), (_, pc) in zip(ref.named_parameters(), ck.named_parameters()):
        if pr.grad is not None and pr.grad.norm() > 0:
            close(pname, pc.grad, pr.grad, 2e-2)


def run_case(name: str) -> dict:
    """{'case', 'status' ('ok', 'wrong', 'ck_error', 'raw_error'), 'detail'} of one case."""
    from ck_core.errors import CkError

    try:
        CASES[name]()
    except Skip as e:
        return {"case": name, "status": "skip", "detail": str(e)}
    except AssertionError as e:
        return {"case": name, "status": "wrong", "detail": str(e)}
    except CkError as e:
        return {"case": name, "status": "ck_error", "detail": f"{type(e).__name__}: {e}"[:2000]}
    except Exception as e:   # noqa: BLE001  (recorded, then the test fails on it)
        return {"case": name, "status": "raw_error", "detail": f"{type(e).__name__}: {e}"[:2000]}
    return {"case": name, "status": "ok", "detail": ""}


if __name__ == "__main__":
    for n in sys.argv[1:] or list(CASES):
        print(json.dumps(run_case(n)), flush=True)
