"""``ck bench fmha --suite broad``: attention on shapes users run, through the public API.

The core suite (:mod:`ck_fmha.bench`) times the kernels on 32 fixed cases.  This one
draws its cases with a fixed seed from distributions of real workloads and calls what users
call: ``ck_fmha.attention`` (forward for inference, forward with ``requires_grad`` inputs for
training, and the backward through autograd), ``ck_fmha.attention_forward`` in group mode for
ragged batches, and ``ck_fmha.decode.paged_decode`` for decode.  Peers run in the same
process on the same tensors: torch SDPA with the cuDNN and with the flash backend (group mode:
cuDNN on the padded equivalent; decode: a device-to-device copy of a 2 GiB buffer, measured
once per run).  Every row is checked against an fp32 SDPA reference before it is timed; a
wrong row is reported as ``status: wrong`` and never as a data point.

Timings: CUDA-graph replays (kernel speed) and eager calls (host overhead included), medians
of ``triton.testing`` timers.  The suite is split into a training set and a held-out set by a
fixed seed (``split`` column): tuning may look at ``train`` rows only.
"""
from __future__ import annotations

import datetime
import json
import logging
import math
import random
import sys
import time
import warnings
import zlib
from typing import Callable, Optional

from ck_core.progress import Progress

log = logging.getLogger(__name__)

HDIMS = (64, 80, 96, 128, 160, 192, 256)
GQA = (1, 4, 8, "mqa")
MASKS = ("full", "causal", "window")
from ck_core.bench import broad_result, eager_and_graph_ms
from ck_core.bench import shard as shard_cases

SEED = 20261125


def _log_uniform(rng: random.Random, lo: float, hi: float) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def cases(seed: int = SEED, n_attn: int = 48, n_varlen: int = 8, n_decode: int = 10, n_fp8: int = 4,
          max_tokens: int = 1 << 16) -> list[dict]:
    """The broad suite's cases (deterministic for a seed).

    Attention cases draw head dim, sequence length (log-uniform 100..32k, so most are not
    multiples of 128), batch (1..32, capped so that batch*seqlen <= ``max_tokens``), query heads,
    a GQA ratio, a mask and a dtype; each is timed as inference forward, training forward and
    backward.  Decode cases draw batch 1..256 and KV length 1k..128k over a paged cache."""
    rng = random.Random(seed)
    out = []
    for i in range(n_attn):
        d = rng.choice(HDIMS)
        s = _log_uniform(rng, 100, 32768)
        b = max(1, min(_log_uniform(rng, 1, 32), max_tokens // s))
        hq = rng.choice((8, 16, 32))
        g = rng.choice(GQA)
        hk = 1 if g == "mqa" else max(1, hq // g)
        mask = rng.choice(MASKS)
        win = _log_uniform(rng, 128, 4096) if mask == "window" else None
        dtype = rng.choice(("bf16", "fp16"))
        out.append(dict(kind="attn", b=b, hq=hq, hk=hk, s=s, d=d, mask=mask, window=win, dtype=dtype))
    for i in range(n_varlen):
        d = rng.choice((64, 128))
        nseq = rng.randint(2, 16)
        lens = [_log_uniform(rng, 16, 8192) for _ in range(nseq)]
        hq = rng.choice((16, 32))
        hk = hq // rng.choice((1, 4))
        out.append(dict(kind="varlen", lens=lens, hq=hq, hk=hk, d=d, mask=rng.choice(("full", "causal")),
                        dtype="bf16"))
    for i in range(n_decode):
        b = _log_uniform(rng, 1, 256)
        sk = _log_uniform(rng, 1024, 131072)
        while b * sk > (1 << 22):  # keep the cache under ~4 GiB at hk=8, d=128
            b = max(1, b // 2)
        out.append(dict(kind="decode", b=b, hq=32, hk=rng.choice((8, 4, 32)), sk=sk, d=128,
                        page=rng.choice((16, 256)), dtype="bf16"))
    for i in range(n_fp8):
        s = _log_uniform(rng, 1024, 16384)
        out.append(dict(kind="fp8", b=max(1, (1 << 15) // s), hq=16, hk=16, s=s, d=128,
                        mask=rng.choice(("full", "causal")), dtype="fp8"))
    split_rng = random.Random(seed + 1)
    for c in out:
        c["split"] = "heldout" if split_rng.random() < 0.3 else "train"
        c["case"] = case_name(c)
    return out


def case_name(c: dict) -> str:
    if c["kind"] == "varlen":
        return (f"varlen {c['dtype']} n{len(c['lens'])} tq{sum(c['lens'])} hq{c['hq']} hk{c['hk']} d{c['d']} "
                f"{c['mask']}")
    if c["kind"] == "decode":
        return f"decode {c['dtype']} b{c['b']} hq{c['hq']} hk{c['hk']} sk{c['sk']} d{c['d']} page{c['page']}"
    w = f"{c['mask']}{c['window'] or ''}" if c.get("mask") == "window" else c.get("mask")
    return f"{c['kind']} {c['dtype']} b{c['b']} hq{c['hq']} hk{c['hk']} s{c['s']} d{c['d']} {w}"


# ---------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------



def _flops(c: dict, direction: str) -> float:
    if c["kind"] == "varlen":
        pairs = sum(L * L for L in c["lens"])
        f = 4.0 * pairs * c["hq"] * c["d"]
        causal = c["mask"] == "causal"
    else:
        s = c["s"]
        f = 4.0 * c["b"] * c["hq"] * s * s * c["d"]
        causal = c["mask"] == "causal"
        if c.get("mask") == "window":
            w = min(c["window"], s)
            f *= (w + 1) / s  # keys visible to each query: window_left + the query itself
    if causal:
        f /= 2
    return f * (3.5 if direction == "bwd" else 1.0)  # fwd+bwd: 1 + 2.5


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
    # torch's flash backend takes no window: window cases try cuDNN and the efficient backend with a
    # boolean mask (whichever runs is the peer; the other's refusal is recorded)
    names = ("cudnn", "flash") if c["mask"] != "window" else ("cudnn", "efficient")
    rows.append(_row(dict(c, group="fwd"), "fwd", err, ours_fwd, {p: _peer(c, p, q, k, v) for p in names}, c))

    # training: inputs that require grad (the forward writes LSE), then the backward
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    do = torch.randn_like(q)

    def ours_train():
        return ck_fmha.attention(qg, kg, vg, causal=causal, window=win)

    peers_train = {p: _peer(c, p, qg, kg, vg) for p in names}
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
    for name in ("cudnn", "flash", "efficient"):
        if row.get(f"ratio_{name}_graph"):
            row["ratio"], row["peer_name"] = row[f"ratio_{name}_graph"], f"torch SDPA {name} backend, graph"
            row["peer"] = round(fl / row[f"{name}_graph_ms"] / 1e9, 1)
            break
    if note:
        row["note"] = note
    return row


def _varlen_rows(c: dict, device) -> list[dict]:
    import torch
    import torch.nn.functional as F

    import ck_fmha.api

    lens = c["lens"]
    total, smax, n = sum(lens), max(lens), len(lens)
    cu = torch.tensor([0] + list(__import__("itertools").accumulate(lens)), device=device, dtype=torch.int32)
    q = torch.randn(total, c["hq"], c["d"], device=device, dtype=torch.bfloat16)
    k = torch.randn(total, c["hk"], c["d"], device=device, dtype=torch.bfloat16)
    v = torch.randn(total, c["hk"], c["d"], device=device, dtype=torch.bfloat16)
    causal = c["mask"] == "causal"

    def ours():
        return ck_fmha.attention_forward(q, k, v, causal=causal, layout="thd", cu_seqlens_q=cu, cu_seqlens_k=cu,
                                         max_seqlen_q=smax, max_seqlen_k=smax)

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
        ref = F.scaled_dot_product_attention(qp[i:i + 1, :, :L].float(), kp[i:i + 1, :, :L].float(),
                                             vp[i:i + 1, :, :L].float(), is_causal=causal,
                                             enable_gqa=c["hq"] != c["hk"])
        errs.append(_rel(o[cu[i]:cu[i] + L].transpose(0, 1).unsqueeze(0), ref))
    err = max(errs)
    cpeer = dict(c, kind="attn", b=n, s=smax)
    peers = {"cudnn": _peer(cpeer, "cudnn", qp, kp, vp)}
    del keymask
    row = _row(dict(c, group="varlen"), "fwd", err, ours, peers, c,
               note="peer: cuDNN on the zero-padded batch (flops counted on the ragged lengths)")
    row["kernels"] = _kernels(lambda: ck_fmha.api.plan_keys(q, k, v, causal=causal, layout="thd", cu_seqlens_q=cu,
                                                            cu_seqlens_k=cu, max_seqlen_q=smax,
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
    kc = torch.randn(npages, page, hk, d, device=device, dtype=torch.bfloat16)
    vc = torch.randn(npages, page, hk, d, device=device, dtype=torch.bfloat16)
    perm = torch.randperm(npages, device=device).to(torch.int32)
    table = perm.view(b, pages_per)
    seqlens = torch.full((b,), sk, device=device, dtype=torch.int32)
    q = torch.randn(b, hq, 1, d, device=device, dtype=torch.bfloat16)

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
    row["ours"], row["peer"] = row["ours_gb_s"], row["copy_gb_s"]
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


def _summary(rows: list[dict]) -> dict:
    out = {}
    groups = sorted({r["group"] for r in rows})
    for g in groups:
        # "nowindow": without sliding-window rows (cuDNN computes those slowly: they lift the geomeans)
        for split in ("all", "train", "heldout", "nowindow"):
            rs = [r for r in rows if r["group"] == g and (split == "all" or r.get("split") == split
                                                          or (split == "nowindow" and r.get("mask") != "window"))]
            s = {"n": len(rs), "wrong": sum(r.get("status") == "wrong" for r in rs),
                 "errors": sum(r.get("status") == "error" for r in rs)}
            for key in ("ratio", "ratio_cudnn_graph", "ratio_cudnn_eager", "ratio_flash_graph",
                        "ratio_flash_eager"):
                vals = [r[key] for r in rs if r.get(key)]
                if vals:
                    s[key + "_geomean"] = round(math.exp(sum(map(math.log, vals)) / len(vals)), 4)
                    s[key + "_min"] = round(min(vals), 4)
            out[f"{g}/{split}"] = s
    return out


def pick(cs: list[dict], which: str) -> list[dict]:
    """The cases ``which`` names, in its order: comma-separated indices into :func:`cases`' list
    (``--list`` prints them) or substrings of case names."""
    out = []
    for w in (x.strip() for x in which.split(",") if x.strip()):
        if w.isdigit():   # an index (a bare number is never a name part)
            hits = [cs[int(w)]] if int(w) < len(cs) else []
        else:
            hits = [c for c in cs if w in c["case"]]
        if not hits:
            from ck_core.errors import ConfigError

            raise ConfigError(f"no broad FMHA case is {w!r}: give an index below {len(cs)} or part of a name "
                              "(python -m ck_fmha.bench_broad --list)")
        out += [c for c in hits if c not in out]
    return out


def run(out_path: Optional[str] = None, budget_s: float = 420.0, seed: int = SEED, kinds=None,
        limit: Optional[int] = None, progress=None, which: str = "", shard: str = "") -> dict:
    """Run the suite on the current CUDA device within ``budget_s``; returns the result dict.
    ``which``: only these cases (see :func:`pick`), in that order."""
    import torch

    from ck_core.errors import UnsupportedProblem

    if not torch.cuda.is_available():
        raise UnsupportedProblem("the broad FMHA suite times CUDA kernels: no CUDA device is visible")
    device = "cuda"
    cs = cases(seed)
    if which:
        cs = pick(cs, which)
    if kinds:
        cs = [c for c in cs if c["kind"] in kinds]
    if limit:
        cs = cs[:limit]
    cs = shard_cases(cs, shard)
    t0 = time.time()
    copy_gbs = _copy_bw(device) if any(c["kind"] == "decode" for c in cs) else None
    rows: list[dict] = []
    skipped = []
    # a bar on a terminal, a line every 30 s in a log (ck bench passes its own, -q silences it)
    counter = (progress or Progress)(len(cs), "ck bench fmha --suite broad")
    for i, c in enumerate(counter.each(cs, lambda c: c["case"])):
        if time.time() - t0 > budget_s:
            skipped.append(c["case"])
            continue
        t_case = time.time()
        try:
            if c["kind"] == "attn":
                rs = _attn_rows(c, device)
            elif c["kind"] == "varlen":
                rs = _varlen_rows(c, device)
            elif c["kind"] == "decode":
                rs = _decode_rows(c, device, copy_gbs)
            else:
                rs = _fp8_rows(c, device)
        except Exception as exc:
            rs = [dict({k: v for k, v in c.items() if k != "lens"}, group=c["kind"], status="error",
                       error=f"{type(exc).__name__}: {str(exc)[:300]}")]
        for r in rs:
            r["case_s"] = round(time.time() - t_case, 2)
            print(f"{r['group']:9s} {r['case']:58s} {r.get('status'):6s} ratio={r.get('ratio')} "
                  f"flash={r.get('ratio_flash_graph')} eager={r.get('ratio_cudnn_eager')} "
                  f"{r.get('error', '')[:120]}", flush=True)
        rows.extend(rs)
        torch.cuda.empty_cache()
        if out_path and i % 4 == 3:
            _write(out_path, rows, skipped, seed, t0)
    return _write(out_path, rows, skipped, seed, t0)


def _write(out_path, rows, skipped, seed, t0) -> dict:
    from ck_core.bench import device_name

    res = dict({"suite": "broad", "seed": seed, "rows": rows, "skipped_for_time": skipped,
                 "elapsed_s": round(time.time() - t0, 1), "summary": _summary(rows),
                 "geomean": _summary(rows).get("fwd/all", {}).get("ratio_geomean")},
               device=device_name(), date=datetime.date.today().isoformat(), command=" ".join(sys.argv))
    if out_path:
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return res


def bench(peer: str, options: dict) -> dict:
    """``ck bench fmha --suite broad``: the rows that ran and were right (the table and geomeans), the
    others under ``extra.failed``; per-group summaries (train / held-out) under ``extra.summary``."""
    from ck_core.errors import UnsupportedProblem

    if peer not in ("sdpa", "torch", "cudnn"):
        raise UnsupportedProblem(f"fmha benchmarks compare with 'sdpa' (torch SDPA cuDNN/flash), not {peer!r}")
    res = run(None, float(options.get("budget") or 420.0), limit=8 if options.get("quick") else None,
              progress=options.get("progress"))
    return broad_result(res)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/fmha_broad.json")
    ap.add_argument("--budget", type=float, default=420.0)
    ap.add_argument("--kinds", default="")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--cases", default="", help="comma-separated case indices (--list) or name parts")
    ap.add_argument("--shard", default="", metavar="I/N", help="every N-th case from the I-th (one GPU of N)")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    if a.list:
        for i, c in enumerate(cases()):
            print(i, c["split"], c["case"])
    else:
        res = run(a.out, a.budget, kinds=a.kinds.split(",") if a.kinds else None, limit=a.limit or None,
                  which=a.cases, shard=a.shard)
        print(json.dumps(res["summary"], indent=1))
