"""The broad FMHA suite's rows (:mod:`ck_fmha.bench_broad`): a case run through the public API
(``ck_fmha.attention``, group mode, ``ck_fmha.decode.paged_decode``), checked against an fp32
reference, then timed (CUDA graph and eager) beside its peers (torch SDPA's cuDNN and flash
backends, FlexAttention compiled; decode: the device's copy bandwidth), with issue #28's floors and
targets for the peer that ran.
"""
from __future__ import annotations

import math
import warnings
import zlib
from typing import Callable

from ck_core.bench import eager_and_graph_ms

from .bench_broad_cases import SMALL_CACHE, _cache_bytes, _flops

#: issue #28's floors (ratio to the row's peer, CUDA graph): no row below these
#: (decode: caches above SMALL_CACHE, as a fraction of copy bandwidth; fp8 rows, whose peer runs bf16: none)
FLOORS = {"fwd": 0.85, "fwd_train": 0.85, "varlen": 0.85, "fwd_bwd": 0.8, "decode": 0.8}

#: issue #28's targets by peer: cuDNN (fwd 1.0, fwd+bwd 0.9); where cuDNN refuses the shape, torch's
#: flash backend or FlexAttention, at 1.2x
TARGETS = {"cudnn": {"fwd_bwd": 0.9, "decode": 0.8, "*": 1.0}, "flash": {"*": 1.2}, "flex": {"*": 1.2},
           "copy": {"*": 0.8}}

#: the order in which a row's peer is chosen: the first that ran the shape
PEER_ORDER = ("cudnn", "flash", "flex", "efficient")

PEER_NAMES = {"cudnn": "torch SDPA cuDNN backend", "flash": "torch SDPA flash backend",
              "flex": "FlexAttention (torch.compile)", "efficient": "torch SDPA efficient backend"}


def _window(c):
    if c.get("mask") == "window":
        return (c["window"], 0)
    return (-1, -1)


def _sdpa_mask(c, device):
    import torch

    if c.get("mask") != "window":
        return None
    s = c["s"]
    i = torch.arange(s, device=device)
    rel = i[None, :] - i[:, None]  # key - query
    return (rel <= 0) & (rel >= -c["window"])


def _peer(c, backend, q, k, v):
    """SDPA on [B, H, S, D] tensors with one backend; GQA through enable_gqa."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
          "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend]
    mask = _sdpa_mask(c, q.device)
    causal = c.get("mask") == "causal"
    gqa = q.shape[1] != k.shape[1]
    rep = q.shape[1] // k.shape[1] if gqa and backend == "efficient" else 1

    def f():
        kk, vv = k, v
        if rep > 1:  # the efficient backend's dense path takes no enable_gqa: expand K/V (inside the timing)
            kk, vv = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        with sdpa_kernel([be]):
            return F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, is_causal=causal,
                                                  enable_gqa=gqa and rep == 1)
    return f


_FLEX = {}


def _flex_peer(c, q, k, v):
    """FlexAttention (compiled, as users run it) on [B, H, S, D] tensors with the case's mask as a block
    mask: the peer where cuDNN refuses a shape.  Built on its first call (a row whose SDPA peers ran
    never times it, nor builds its mask)."""
    state: dict = {}

    def run():
        if "fa" not in state:
            state["fa"], state["bm"] = _flex_fn(), _flex_mask(c, q.shape[2], k.shape[2], q.device)
        return state["fa"](q, k, v, block_mask=state["bm"], enable_gqa=q.shape[1] != k.shape[1])
    return run


def _flex_fn():
    if "fn" not in _FLEX:
        import torch
        import torch._dynamo
        from torch.nn.attention.flex_attention import flex_attention

        # one compile per shape (as a user's static-shape model gets): more shapes than the default limit
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 512)
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    return _FLEX["fn"]


def _flex_mask(c, sq: int, sk: int, device):
    from torch.nn.attention.flex_attention import create_block_mask

    mask, win = c.get("mask"), c.get("window") or 0
    if mask == "causal":
        def mod(b, h, qi, ki):
            return ki <= qi
    elif mask == "window":
        def mod(b, h, qi, ki):
            return (ki <= qi) & (qi - ki <= win)
    else:
        return None
    return create_block_mask(mod, None, None, sq, sk, device=device)


def _peers(c, q, k, v, names=None) -> dict:
    """The peers tried for a row, in :data:`PEER_ORDER` (the row's peer is the first that runs it):
    SDPA cuDNN (only that backend enabled: a shape it refuses raises, it never falls back), SDPA
    flash (no window: it takes no mask), FlexAttention (window masks, and any shape flash refuses)."""
    names = names or (("cudnn", "flash", "flex") if c.get("mask") != "window" else ("cudnn", "flex"))
    return {n: (_flex_peer(c, q, k, v) if n == "flex" else _peer(c, n, q, k, v)) for n in names}


def _rel(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _reference(c: dict, q, k, v, do=None, bidx=None, max_bytes: int = 1 << 31):
    """fp32 attention of batches ``bidx`` (math on upcast inputs, chunked over heads so that one
    chunk's score matrix stays under ``max_bytes``); with ``do`` also dq, dk, dv of those batches."""
    import torch

    bidx = list(range(q.shape[0])) if bidx is None else bidx
    hq, hk = q.shape[1], k.shape[1]
    sq, sk = q.shape[2], k.shape[2]
    step = max(1, min(hq, max_bytes // max(1, sq * sk * 4 * 3)))
    causal = c.get("mask") == "causal"
    mask = _sdpa_mask(c, q.device) if c.get("mask") == "window" else None
    outs, grads = [], []
    for b in bidx:
        ob = []
        gq, gk, gv = [], torch.zeros(hk, sk, k.shape[3], device=q.device), torch.zeros(hk, sk, v.shape[3],
                                                                                      device=q.device)
        for h0 in range(0, hq, step):
            hs = list(range(h0, min(hq, h0 + step)))
            kvh = [h * hk // hq for h in hs]
            qq = q[b, hs].float().requires_grad_(do is not None)
            kk = k[b, kvh].float().requires_grad_(do is not None)
            vv = v[b, kvh].float().requires_grad_(do is not None)
            o = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask,
                                                                 is_causal=causal and mask is None)
            ob.append(o.detach())
            if do is not None:
                dq_, dk_, dv_ = torch.autograd.grad(o, (qq, kk, vv), do[b, hs].float())
                gq.append(dq_)
                gk.index_add_(0, torch.tensor(kvh, device=q.device), dk_)
                gv.index_add_(0, torch.tensor(kvh, device=q.device), dv_)
        outs.append(torch.cat(ob))
        if do is not None:
            grads.append((torch.cat(gq), gk, gv))
    return outs, grads


def _kernels(fn) -> object:
    """The kernel names of a call's plans (``ck_fmha.api.plan_keys``), or why they could not be read."""
    try:
        return {d: [st["kernel"] for st in stages] for d, stages in fn().items()}
    except Exception as exc:  # a diagnostic column: never sinks the row
        return f"{type(exc).__name__}: {str(exc)[:120]}"


def _attn_rows(c: dict, device) -> list[dict]:
    import torch

    import ck_fmha.api

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[c["dtype"]]
    g = torch.Generator(device=device).manual_seed(zlib.crc32(c["case"].encode()) & 0xFFFF)
    q = torch.randn(c["b"], c["hq"], c["s"], c["d"], device=device, dtype=dt, generator=g)
    k = torch.randn(c["b"], c["hk"], c["s"], c["d"], device=device, dtype=dt, generator=g)
    v = torch.randn(c["b"], c["hk"], c["s"], c["d"], device=device, dtype=dt, generator=g)
    causal = c["mask"] == "causal"
    win = _window(c)
    bidx = sorted({0, c["b"] - 1})
    rows = []

    def ours_fwd():
        return ck_fmha.attention(q, k, v, causal=causal, window=win)

    # correctness first: an fp32 reference of the first and last batch
    o = ours_fwd()
    refs, _ = _reference(c, q, k, v, bidx=bidx)
    err = max(_rel(o[b], r) for b, r in zip(bidx, refs))
    # the peers (cuDNN first; flash or FlexAttention where cuDNN refuses; each refusal is recorded)
    rows.append(_row(dict(c, group="fwd"), "fwd", err, ours_fwd, _peers(c, q, k, v), c))

    # training: inputs that require grad (the forward writes LSE), then the backward
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    do = torch.randn_like(q)

    def ours_train():
        return ck_fmha.attention(qg, kg, vg, causal=causal, window=win)

    peers_train = _peers(c, qg, kg, vg)
    rows.append(_row(dict(c, group="fwd_train"), "fwd", err, ours_train, peers_train, c))

    grads = torch.autograd.grad(ours_train(), (qg, kg, vg), do)
    _, rgrads = _reference(c, q, k, v, do=do, bidx=bidx)
    berr = max(_rel(grads[i][b], rg[i]) for b, rg in zip(bidx, rgrads) for i in range(3))

    def step(fwd):
        return lambda: torch.autograd.grad(fwd(), (qg, kg, vg), do)

    rows.append(_row(dict(c, group="fwd_bwd"), "bwd", berr, step(ours_train),
                     {p: step(f) for p, f in peers_train.items()}, c, note="a training step's attention: "
                     "forward (requires_grad) + backward, flops 3.5x the forward's"))
    kernels = _kernels(lambda: ck_fmha.api.plan_keys(q, k, v, causal=causal, window=win))
    for r in rows:
        r["kernels"] = kernels
    return rows


def _row(base: dict, direction: str, err: float, ours: Callable, peers: dict, c: dict, note: str = "") -> dict:
    # fp8 e4m3 keeps 3 mantissa bits: P rounded to it costs ~2% rel l2 on its own (the tests use 5e-2)
    tol = 5e-2 if direction != "fwd" or c.get("dtype") == "fp8" else 2e-2
    row = {k: v for k, v in base.items() if k not in ("lens",)}
    row.update(rel_err=err, status="ok" if math.isfinite(err) and err < tol else "wrong")
    if row["status"] != "ok":
        return row
    fl = _flops(c, direction)
    t = eager_and_graph_ms(ours)
    row["ours_eager_ms"], row["ours_graph_ms"] = t["eager_ms"], t.get("graph_ms")
    for name, fn in peers.items():
        if name == "flex" and any(row.get(f"{n}_eager_ms") for n in peers if n != "flex"):
            continue   # FlexAttention is the peer of last resort: timed only where the SDPA backends refused
        with warnings.catch_warnings(record=True) as said:   # SDPA says why a backend refused
            warnings.simplefilter("always")
            try:
                pt = eager_and_graph_ms(fn)
                row[f"{name}_eager_ms"], row[f"{name}_graph_ms"] = pt["eager_ms"], pt.get("graph_ms")
            except Exception as exc:
                why = "; ".join(str(w.message)[:120] for w in said)
                row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:160]}" + (f" ({why})" if why else "")
    for mode in ("graph", "eager"):
        ours_ms = row.get(f"ours_{mode}_ms")
        for name in peers:
            p = row.get(f"{name}_{mode}_ms")
            if ours_ms and p:
                row[f"ratio_{name}_{mode}"] = round(p / ours_ms, 4)
    if row.get("ours_graph_ms"):
        row["ours_tflops"] = round(fl / row["ours_graph_ms"] / 1e9, 1)
    row["unit"] = "TFLOPS (graph)"
    row["ours"] = row.get("ours_tflops")
    _choose_peer(row, fl, list(peers))
    if note:
        row["note"] = note
    return row


def _choose_peer(row: dict, fl: float, tried: list) -> None:
    """The row's peer: the first of :data:`PEER_ORDER` that ran the shape (graph, else eager time),
    with issue #28's target for that peer (``peer_target``) and the group's floor (``floor``);
    ``ratio`` / ``ratio_eager``: the peer's time over ours (graph / eager); ``below_floor``."""
    group = row.get("group", "fwd")
    for name in [n for n in PEER_ORDER if n in tried]:
        if row.get(f"{name}_graph_ms") or row.get(f"{name}_eager_ms"):
            t = TARGETS.get(name, {})
            row.update(peer_kind=name, peer_target=t.get(group, t.get("*")), floor=FLOORS.get(group),
                       peer_name=PEER_NAMES.get(name, name) + ", graph")
            row["ratio"] = row.get(f"ratio_{name}_graph")
            row["ratio_eager"] = row.get(f"ratio_{name}_eager")
            if row.get(f"{name}_graph_ms"):
                row["peer"] = round(fl / row[f"{name}_graph_ms"] / 1e9, 1)
            if row["ratio"] is not None and row["floor"] is not None:
                row["below_floor"] = row["ratio"] < row["floor"]
            return


def _varlen_rows(c: dict, device) -> list[dict]:
    import torch

    import ck_fmha.api

    lens = c["lens"]
    total, smax, n = sum(lens), max(lens), len(lens)
    cu = torch.tensor([0] + list(__import__("itertools").accumulate(lens)), device=device, dtype=torch.int32)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[c["dtype"]]
    q = torch.randn(total, c["hq"], c["d"], device=device, dtype=dt)
    k = torch.randn(total, c["hk"], c["d"], device=device, dtype=dt)
    v = torch.randn(total, c["hk"], c["d"], device=device, dtype=dt)
    causal = c["mask"] == "causal"
    win = _window(c)

    def ours():
        return ck_fmha.attention_forward(q, k, v, causal=causal, window=win, layout="thd", cu_seqlens_q=cu,
                                         cu_seqlens_k=cu, max_seqlen_q=smax, max_seqlen_k=smax)

    # the peer: cuDNN on the padded batch (what a user without varlen support runs)
    def pad(t):
        out = t.new_zeros(n, smax, t.shape[1], t.shape[2])
        for i, L in enumerate(lens):
            out[i, :L] = t[cu[i]:cu[i] + L]
        return out.transpose(1, 2).contiguous()

    qp, kp, vp = pad(q), pad(k), pad(v)
    keymask = torch.arange(smax, device=device)[None, :] < torch.tensor(lens, device=device)[:, None]
    o = ours()
    errs = []
    for i, L in enumerate(lens):
        refs, _ = _reference(dict(c, s=L), qp[i:i + 1, :, :L], kp[i:i + 1, :, :L], vp[i:i + 1, :, :L])
        errs.append(_rel(o[cu[i]:cu[i] + L].transpose(0, 1), refs[0]))
    err = max(errs)
    cpeer = dict(c, kind="attn", b=n, s=smax)
    peers = _peers(cpeer, qp, kp, vp)
    del keymask
    row = _row(dict(c, group="varlen"), "fwd", err, ours, peers, c,
               note="peers on the zero-padded batch (flops counted on the ragged lengths)")
    row["kernels"] = _kernels(lambda: ck_fmha.api.plan_keys(q, k, v, causal=causal, window=win, layout="thd",
                                                            cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=smax,
                                                            max_seqlen_k=smax))
    return [row]


def _copy_bw(device) -> float:
    """Device copy bandwidth (read + write bytes) on a 2 GiB buffer, far larger than L2."""
    import torch
    import triton

    src = torch.empty(1 << 30, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=5, rep=50, return_mode="median")
    bw = 2 * src.numel() * 2 / ms / 1e6
    del src, dst
    torch.cuda.empty_cache()
    return bw


def _decode_rows(c: dict, device, copy_gbs: float) -> list[dict]:
    import torch

    from ck_fmha import decode

    b, hq, hk, sk, d, page = c["b"], c["hq"], c["hk"], c["sk"], c["d"], c["page"]
    pages_per = -(-sk // page)
    npages = b * pages_per
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[c["dtype"]]
    kc = torch.randn(npages, page, hk, d, device=device, dtype=dt)
    vc = torch.randn(npages, page, hk, d, device=device, dtype=dt)
    perm = torch.randperm(npages, device=device).to(torch.int32)
    table = perm.view(b, pages_per)
    seqlens = torch.full((b,), sk, device=device, dtype=torch.int32)
    q = torch.randn(b, hq, 1, d, device=device, dtype=dt)

    def ours():
        return decode.paged_decode(q, kc, vc, table, seqlens, max_seqlen_k=sk)

    o = ours()
    # reference on a few batches (gathering the whole cache is too large for long contexts)
    errs = []
    for i in range(min(b, 2)):
        kk = kc[table[i].long()].reshape(-1, hk, d)[:sk].transpose(0, 1).unsqueeze(0).float()
        vv = vc[table[i].long()].reshape(-1, hk, d)[:sk].transpose(0, 1).unsqueeze(0).float()
        ref = torch.nn.functional.scaled_dot_product_attention(q[i:i + 1].float(), kk, vv,
                                                               enable_gqa=hq != hk)
        errs.append(_rel(o[i:i + 1], ref))
    err = max(errs)
    row = {k: v for k, v in c.items()}
    row.update(group="decode", rel_err=err, status="ok" if err < 2e-2 else "wrong")
    if row["status"] != "ok":
        return [row]
    nbytes = 2 * b * sk * hk * d * 2 + 2 * q.numel() * 2
    t = eager_and_graph_ms(ours)
    row.update(ours_eager_ms=t["eager_ms"], ours_graph_ms=t.get("graph_ms"), unit="GB/s",
               copy_gb_s=round(copy_gbs, 1), peer_name="device copy bandwidth (2 GiB, read+write), once per run")
    row["ours_gb_s"] = round(nbytes / row["ours_graph_ms"] / 1e6, 1) if row["ours_graph_ms"] else None
    row["ratio"] = round(row["ours_gb_s"] / copy_gbs, 4) if row["ours_gb_s"] else None
    if t.get("eager_ms"):
        row["ratio_eager"] = round(nbytes / t["eager_ms"] / 1e6 / copy_gbs, 4)
    row["ours"], row["peer"] = row["ours_gb_s"], row["copy_gb_s"]
    big = _cache_bytes(c) > SMALL_CACHE
    # the floor holds for caches above SMALL_CACHE (smaller ones live in L2: their own stratum, no floor)
    row.update(peer_kind="copy", peer_target=TARGETS["copy"]["*"], cache_mb=round(_cache_bytes(c) / 2**20, 1),
               floor=FLOORS["decode"] if big else None)
    if big and row["ratio"] is not None:
        row["below_floor"] = row["ratio"] < FLOORS["decode"]
    return [row]


def _fp8_rows(c: dict, device) -> list[dict]:
    import torch

    import ck_fmha.api

    f8 = torch.float8_e4m3fn
    q, k, v = (torch.randn(c["b"], h, c["s"], c["d"], device=device).to(f8) for h in (c["hq"], c["hk"], c["hk"]))
    causal = c["mask"] == "causal"

    def ours():
        return ck_fmha.attention(q, k, v, causal=causal)

    qb, kb, vb = (t.to(torch.bfloat16) for t in (q, k, v))
    o = ours()
    refs, _ = _reference(c, qb, kb, vb, bidx=[0])
    err = _rel(o[0], refs[0])
    row = _row(dict(c, group="fp8"), "fwd", err, ours, {"cudnn": _peer(c, "cudnn", qb, kb, vb)}, c,
               note="cross-precision: ours fp8 e4m3, peer cuDNN bf16 on the same values")
    row["kernels"] = _kernels(lambda: ck_fmha.api.plan_keys(q, k, v, causal=causal))
    return [row]
