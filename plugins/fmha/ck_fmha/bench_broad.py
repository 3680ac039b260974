"""``ck bench fmha --suite broad``: attention on shapes users run, through the public API.

The core suite (:mod:`ck_fmha.bench`) times the kernels on 32 fixed cases.  This one
draws its cases with a fixed seed from distributions of real workloads and calls what users
call: ``ck_fmha.attention`` (forward for inference, forward with ``requires_grad`` inputs for
training, and the backward through autograd), ``ck_fmha.attention_forward`` in group mode for
ragged batches, and ``ck_fmha.decode.paged_decode`` for decode.  Peers run in the same
process on the same tensors: torch SDPA with only the cuDNN backend enabled (a shape it refuses
raises: it never falls back), SDPA's flash backend, and where both refuse (sliding windows, say)
FlexAttention compiled; the row's peer (``peer_kind``) is the first that ran, with issue #28's target
for it (``peer_target``: cuDNN 1.0 forward / 0.9 fwd+bwd, flash or Flex 1.2) and the floor
(``floor``: forward 0.85, fwd+bwd 0.8).  Group mode: the peers on the zero-padded batch; decode: a
device-to-device copy of a 2 GiB buffer, measured once per run.  Every row is checked against an
fp32 reference before it is timed; a wrong row is reported as ``status: wrong`` and never as a data
point.

Strata (issue #28): every head dim of :data:`HDIM_STRATA` (``d32`` .. ``d256``), drawn from real model
configs (:data:`MODELS`), and every decode page size of :data:`PAGE_STRATA` over caches above 32 MiB
(smaller caches: the ``small_cache`` stratum, no floor); the summary gives each ``group/stratum`` its
geomean and minimum (graph and eager) against the row's peer and the count of rows below the floor.
``--quick`` runs one case of every stratum (one GPU, minutes).

Timings: CUDA-graph replays (kernel speed) and eager calls (host overhead included), medians
of ``triton.testing`` timers.  The suite's first 70 cases are split into a training set and a
held-out set by a fixed seed; the model-config cases hold out whole configs
(:data:`HELD_OUT_MODELS`); ``split`` column: tuning may look at ``train`` rows only.
"""
from __future__ import annotations

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

from ck_core.bench import broad_result, eager_and_graph_ms, with_header
from ck_core.bench import shard as shard_cases

HDIMS = (64, 80, 96, 128, 160, 192, 256)
GQA = (1, 4, 8, "mqa")
MASKS = ("full", "causal", "window")
SEED = 20261125

#: issue #28's strata: every head dim has its own geomean and minimum
HDIM_STRATA = (32, 40, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256)
#: decode: every page size a stratum; caches of at most SMALL_CACHE bytes form their own stratum
PAGE_STRATA = (1, 8, 16, 32, 64, 128, 256)
SMALL_CACHE = 32 << 20
#: issue #28's floors (ratio to the row's peer, CUDA graph): no row below these
#: (decode: caches above SMALL_CACHE, as a fraction of copy bandwidth; fp8 rows, whose peer runs bf16: none)
FLOORS = {"fwd": 0.85, "fwd_train": 0.85, "varlen": 0.85, "fwd_bwd": 0.8, "decode": 0.8}
#: issue #28's targets by peer: cuDNN (fwd 1.0, fwd+bwd 0.9); where cuDNN refuses the shape, torch's
#: flash backend or FlexAttention, at 1.2x
TARGETS = {"cudnn": {"fwd_bwd": 0.9, "decode": 0.8, "*": 1.0}, "flash": {"*": 1.2}, "flex": {"*": 1.2},
           "copy": {"*": 0.8}}
#: the order in which a row's peer is chosen: the first that ran the shape
PEER_ORDER = ("cudnn", "flash", "flex", "efficient")

#: attention configs of public models: (name, head dim, q heads, kv heads, masks, seq lens, batches,
#: dtypes).  The d48 / d224 configs are the brief's "DiT/others" fill-ins (no one widespread model).
MODELS = (
    ("swin-t", 32, 3, 3, ("full",), (49, 144), (256, 1024), ("fp16", "bf16")),       # 7x7 / 12x12 windows
    ("swin-b", 32, 16, 16, ("full",), (49, 144), (64, 256), ("fp16",)),
    ("sd15-unet-64", 40, 8, 8, ("full",), (4096, 9216), (1, 2, 4), ("fp16", "bf16")),  # 64x64 / 96x96 latents
    ("sd15-unet-32", 80, 8, 8, ("full",), (1024,), (2, 8), ("fp16", "bf16")),       # C 640
    ("sd15-unet-16", 160, 8, 8, ("full",), (256,), (4, 16), ("fp16",)),             # C 1280
    ("sd21-unet", 64, 5, 5, ("full",), (4096, 9216), (1, 2), ("fp16",)),
    ("vit-b16", 64, 12, 12, ("full",), (197, 577), (32, 64), ("fp16", "bf16")),
    ("vit-l16", 64, 16, 16, ("full",), (197, 577), (16, 32), ("bf16",)),
    ("vit-h14", 80, 16, 16, ("full",), (257, 1025), (8, 32), ("bf16", "fp16")),
    ("whisper-large", 64, 20, 20, ("full", "causal"), (1500, 448), (4, 16), ("fp16",)),
    ("llama3-8b", 128, 32, 8, ("causal",), (1000, 2048, 4097, 8192), (1, 2, 4), ("bf16",)),
    ("mistral-7b", 128, 32, 8, ("window",), (4096, 8192, 16384), (1, 2), ("bf16",)),
    ("llama2-7b", 128, 32, 32, ("causal",), (777, 4096), (1, 4), ("fp16",)),
    ("falcon-7b", 64, 71, 1, ("causal",), (2048, 3000), (1, 2), ("bf16",)),          # MQA
    ("qwen2-1.5b", 128, 12, 2, ("causal",), (1531, 8192), (1, 4), ("bf16",)),
    ("gemma-7b", 256, 16, 16, ("causal",), (1024, 4096), (1, 2), ("bf16",)),
    ("gemma2-9b", 256, 16, 8, ("causal", "window"), (4096, 8192), (1,), ("bf16",)),
    ("dit-others-d48", 48, 24, 24, ("full",), (1024, 4096), (2, 4), ("bf16", "fp16")),
    ("phi3-mini", 96, 32, 32, ("causal", "window"), (2047, 4096), (1, 2), ("bf16",)),
    ("gpt-neox-20b", 96, 64, 64, ("causal",), (2048,), (1, 2), ("fp16",)),
    ("mpt-30b", 112, 56, 56, ("causal",), (2048, 3333, 8192), (1, 2), ("bf16", "fp16")),
    ("dit-others-d112", 112, 16, 16, ("full",), (1024, 2304), (2, 8), ("bf16",)),
    ("mla-d192", 192, 16, 16, ("causal",), (1024, 4096), (1, 2), ("bf16",)),           # DeepSeek-V2-Lite q/k dim
    ("dit-others-d192", 192, 12, 4, ("full", "causal"), (1536, 4096), (1, 2), ("bf16", "fp16")),
    ("dit-others-d224", 224, 8, 8, ("full", "causal"), (1024, 4096), (1, 2), ("bf16", "fp16")),
    ("dit-others-d224-gqa", 224, 16, 2, ("causal", "window"), (2048, 5000), (1,), ("bf16",)),
)
#: whole model configs held out from tuning (the suite's first 70 cases keep their own seeded split)
HELD_OUT_MODELS = ("vit-l16", "whisper-large", "qwen2-1.5b", "gemma2-9b", "dit-others-d112", "swin-b",
                   "dit-others-d224-gqa")
#: decode configs (name, q heads, kv heads, head dim)
DECODE_MODELS = (("llama3-8b", 32, 8, 128), ("qwen2-1.5b", 12, 2, 128), ("llama2-7b", 32, 32, 128),
                 ("falcon-7b", 71, 1, 64))


def _log_uniform(rng: random.Random, lo: float, hi: float) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def cases(seed: int = SEED, n_attn: int = 48, n_varlen: int = 8, n_decode: int = 10, n_fp8: int = 4,
          max_tokens: int = 1 << 16, per_hdim: int = 3, n_model_varlen: int = 8, models: bool = True) -> list[dict]:
    """The broad suite's cases (deterministic for a seed): the seeded draws (:func:`seeded_cases`, the
    suite's first cases, their split unchanged) then the model-config strata (:func:`model_cases`,
    ``models=False`` leaves them out)."""
    out = seeded_cases(seed, n_attn, n_varlen, n_decode, n_fp8, max_tokens)
    if models:
        have = {c["case"] for c in out}
        out += [c for c in model_cases(seed, per_hdim, n_model_varlen) if c["case"] not in have]
    return out


def seeded_cases(seed: int = SEED, n_attn: int = 48, n_varlen: int = 8, n_decode: int = 10, n_fp8: int = 4,
                 max_tokens: int = 1 << 16) -> list[dict]:
    """The suite's first cases (deterministic for a seed; a seeded 30% of them held out).

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


def _stratum(c: dict) -> str:
    """A case's stratum: its head dim (``d64``); decode: its page size (``page16``) when the KV cache is
    larger than :data:`SMALL_CACHE`, else ``small_cache``."""
    if c["kind"] == "decode":
        return f"page{c['page']}" if _cache_bytes(c) > SMALL_CACHE else "small_cache"
    return f"d{c['d']}"


def _cache_bytes(c: dict) -> int:
    """Bytes of a decode case's K and V caches (2-byte elements)."""
    return 2 * c["b"] * c["sk"] * c["hk"] * c["d"] * 2


def model_cases(seed: int = SEED, per_hdim: int = 3, n_varlen: int = 8) -> list[dict]:
    """Issue #28's strata, drawn with a fixed seed from :data:`MODELS`: ``per_hdim`` attention cases (and
    every config at least once) for every head dim of :data:`HDIM_STRATA` (batch mode: forward,
    training forward, fwd+bwd),
    ``n_varlen`` group-mode (ragged) forward cases, and for every page size of :data:`PAGE_STRATA` one
    decode over a cache above :data:`SMALL_CACHE` and one below.  Whole model configs are held out
    (:data:`HELD_OUT_MODELS`)."""
    rng = random.Random(seed + 28)
    out: list[dict] = []

    def attn(m, kind="attn"):
        name, d, hq, hk, masks, seqs, batches, dtypes = m
        mask = rng.choice(masks)
        s = rng.choice(seqs)
        c = dict(kind=kind, model=name, b=rng.choice(batches), hq=hq, hk=hk, s=s, d=d, mask=mask,
                 window=_model_window(rng, name, s) if mask == "window" else None,
                 dtype=rng.choice(dtypes))
        if kind == "varlen":   # a ragged batch around the model's length: 2..12 sequences
            n = rng.randint(2, 12)
            c["lens"] = [max(16, _log_uniform(rng, max(16, s // 8), s)) for _ in range(n)]
            del c["b"], c["s"]
        return c

    for d in HDIM_STRATA:
        ms = [m for m in MODELS if m[1] == d]
        for i in range(max(per_hdim, len(ms))):   # every model config of the head dim at least once
            out.append(attn(ms[i] if i < len(ms) else rng.choice(ms)))
    for _ in range(n_varlen):
        out.append(attn(rng.choice(MODELS), "varlen"))
    for page in PAGE_STRATA:
        for big in (True, False):
            name, hq, hk, d = rng.choice(DECODE_MODELS)
            b = rng.choice((1, 4, 16, 64)) if big else rng.choice((1, 2))
            per_seq = 2 * hk * d * 2   # bytes of K and V per token
            if big:   # 64 MiB .. 2 GiB of cache
                sk = max(1024, min(131072, _log_uniform(rng, (64 << 20) // (b * per_seq) + 1,
                                                        (2 << 30) // (b * per_seq))))
                while b * sk * per_seq <= (64 << 20):   # a small-headed model at the length cap: more batch
                    b *= 2
            else:     # 1 .. 24 MiB
                sk = max(16, _log_uniform(rng, 256, max(257, (24 << 20) // (b * per_seq))))
            out.append(dict(kind="decode", model=name, b=b, hq=hq, hk=hk, sk=sk, d=d, page=page,
                            dtype=rng.choice(("bf16", "fp16"))))
    seen = set()
    uniq = []
    for c in out:
        c["split"] = "heldout" if c["model"] in HELD_OUT_MODELS else "train"
        c["case"] = case_name(c)
        if c["case"] not in seen:
            seen.add(c["case"])
            uniq.append(c)
    return uniq


#: the sliding windows of the configs that have one
WINDOWS = {"mistral-7b": 4096, "gemma2-9b": 4096, "phi3-mini": 2047}


def _model_window(rng, name: str, s: int) -> int:
    """The model's window where the sequence is longer than it (a quarter of the sequence where the
    window would cover it all: the mask stays a window); configs without one draw 128..2048."""
    w = WINDOWS.get(name)
    if w is None:
        return _log_uniform(rng, 128, 2048)
    return w if s > w else max(128, s // 4)


def quick_cases(cs: list[dict]) -> list[dict]:
    """``--quick``: one case of every stratum (head dims of attention and of group mode, decode page sizes
    and small caches): the model-config case of least work in each, so one GPU runs them in minutes."""
    def work(c):
        if c["kind"] == "decode":
            return _cache_bytes(c)
        return _flops(c, "fwd")

    best: dict = {}
    for c in cs:
        if c["kind"] == "fp8":
            continue
        key = (c["kind"] == "decode", c["kind"] == "varlen", _stratum(c))
        if key[1] and key[2] not in ("d64", "d128") and (False, True, "d64") in best:
            continue   # group mode: one case per head dim it was drawn at is enough
        if key not in best or (("model" in c) > ("model" in best[key])) or (
                ("model" in c) == ("model" in best[key]) and work(c) < work(best[key])):
            best[key] = c
    keep = {id(c) for c in best.values()}
    return [c for c in cs if id(c) in keep]


def case_name(c: dict) -> str:
    if "model" in c:
        return f"{c['model']} " + case_name({k: v for k, v in c.items() if k != "model"})
    if c["kind"] == "varlen":
        w = f"{c['mask']}{c['window']}" if c.get("mask") == "window" else c["mask"]
        return f"varlen {c['dtype']} n{len(c['lens'])} tq{sum(c['lens'])} hq{c['hq']} hk{c['hk']} d{c['d']} {w}"
    if c["kind"] == "decode":
        return f"decode {c['dtype']} b{c['b']} hq{c['hq']} hk{c['hk']} sk{c['sk']} d{c['d']} page{c['page']}"
    w = f"{c['mask']}{c['window'] or ''}" if c.get("mask") == "window" else c.get("mask")
    return f"{c['kind']} {c['dtype']} b{c['b']} hq{c['hq']} hk{c['hk']} s{c['s']} d{c['d']} {w}"


# ---------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------



def _flops(c: dict, direction: str) -> float:
    if c["kind"] == "varlen":
        w = c["window"] + 1 if c.get("mask") == "window" else None
        pairs = sum(L * (min(L, w) if w else L) for L in c["lens"])
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


PEER_NAMES = {"cudnn": "torch SDPA cuDNN backend", "flash": "torch SDPA flash backend",
              "flex": "FlexAttention (torch.compile)", "efficient": "torch SDPA efficient backend"}


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
    import torch.nn.functional as F

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


def _stats(rs: list[dict]) -> dict:
    """n, wrong, errors; geomean and minimum of the ratio to the row's peer (graph, eager); rows below
    the floor; the peers the rows ran against."""
    s = {"n": len(rs), "wrong": sum(r.get("status") == "wrong" for r in rs),
         "errors": sum(r.get("status") == "error" for r in rs)}
    for key, name in (("ratio", "graph"), ("ratio_eager", "eager")):
        vals = [r[key] for r in rs if r.get(key)]
        if vals:
            s[f"{name}_geomean"] = round(math.exp(sum(map(math.log, vals)) / len(vals)), 4)
            s[f"{name}_min"] = round(min(vals), 4)
    floored = [r for r in rs if r.get("floor") is not None and r.get("ratio")]
    s["below_floor"] = sum(r["ratio"] < r["floor"] for r in floored)
    s["below_target"] = sum(r["ratio"] < r["peer_target"] for r in rs if r.get("ratio") and r.get("peer_target"))
    peers: dict = {}
    for r in rs:
        if r.get("peer_kind"):
            peers[r["peer_kind"]] = peers.get(r["peer_kind"], 0) + 1
    if peers:
        s["peers"] = peers
    return s


def strata_summary(rows: list[dict]) -> dict:
    """``{group/stratum: stats}`` (:func:`_stats`) for every group (fwd, fwd_train, fwd_bwd, varlen, fp8,
    decode) and stratum (head dims ``d32``..``d256``; decode page sizes ``page1``..``page256`` and
    ``small_cache``), in :data:`HDIM_STRATA` / :data:`PAGE_STRATA` order."""
    order = [f"d{d}" for d in HDIM_STRATA] + [f"page{p}" for p in PAGE_STRATA] + ["small_cache"]
    out = {}
    for g in ("fwd", "fwd_train", "fwd_bwd", "varlen", "fp8", "decode"):
        for st in order:
            rs = [r for r in rows if r.get("group") == g and (r.get("stratum") or _stratum_of_row(r)) == st]
            if rs:
                out[f"{g}/{st}"] = _stats(rs)
    return out


def _stratum_of_row(r: dict) -> Optional[str]:
    try:
        return _stratum(dict(r, kind="decode" if r.get("group") == "decode" else r.get("kind", "attn")))
    except (KeyError, TypeError):
        return None


def _summary(rows: list[dict]) -> dict:
    """Per group and split (``fwd/all``, ``fwd/train``, ...: the earlier keys, peer columns kept), then
    the strata (:func:`strata_summary`) under ``group/stratum``."""
    out = {}
    groups = sorted({r["group"] for r in rows})
    for g in groups:
        # "nowindow": without sliding-window rows (cuDNN computes those slowly: they lift the geomeans)
        for split in ("all", "train", "heldout", "nowindow"):
            rs = [r for r in rows if r["group"] == g and (split == "all" or r.get("split") == split
                                                          or (split == "nowindow" and r.get("mask") != "window"))]
            s = {"n": len(rs), "wrong": sum(r.get("status") == "wrong" for r in rs),
                 "errors": sum(r.get("status") == "error" for r in rs)}
            for key in ("ratio", "ratio_eager", "ratio_cudnn_graph", "ratio_cudnn_eager", "ratio_flash_graph",
                        "ratio_flash_eager", "ratio_flex_graph", "ratio_flex_eager"):
                vals = [r[key] for r in rs if r.get(key)]
                if vals:
                    s[key + "_geomean"] = round(math.exp(sum(map(math.log, vals)) / len(vals)), 4)
                    s[key + "_min"] = round(min(vals), 4)
            s["below_floor"] = sum(bool(r.get("below_floor")) for r in rs)
            out[f"{g}/{split}"] = s
    out.update(strata_summary(rows))
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
        limit: Optional[int] = None, progress=None, which: str = "", shard: str = "", quick: bool = False) -> dict:
    """Run the suite on the current CUDA device within ``budget_s``; returns the result dict.
    ``which``: only these cases (see :func:`pick`), in that order; ``quick``: one case of every
    stratum (:func:`quick_cases`)."""
    import torch

    from ck_core.errors import UnsupportedProblem

    if not torch.cuda.is_available():
        raise UnsupportedProblem("the broad FMHA suite times CUDA kernels: no CUDA device is visible")
    device = "cuda"
    cs = cases(seed)
    if quick:
        cs = quick_cases(cs)
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
            # a failure row in every group the case would have filled (it counts in each stratum)
            groups = {"attn": ("fwd", "fwd_train", "fwd_bwd")}.get(c["kind"], (c["kind"],))
            rs = [dict({k: v for k, v in c.items() if k != "lens"}, group=g, status="error",
                       error=f"{type(exc).__name__}: {str(exc)[:300]}") for g in groups]
        for r in rs:
            r["case_s"] = round(time.time() - t_case, 2)
            r["stratum"] = _stratum(c)
            print(f"{r['group']:9s} {r['case']:58s} {r.get('status'):6s} ratio={r.get('ratio')} "
                  f"peer={r.get('peer_kind')} eager={r.get('ratio_eager')} "
                  f"{r.get('error', '')[:120]}", flush=True)
        rows.extend(rs)
        torch.cuda.empty_cache()
        if out_path and i % 4 == 3:
            _write(out_path, rows, skipped, seed, t0)
    return _write(out_path, rows, skipped, seed, t0)


def _write(out_path, rows, skipped, seed, t0) -> dict:
    from ck_core.bench import device_name

    summ = _summary(rows)
    res = with_header({"suite": "broad", "seed": seed, "rows": rows, "skipped_for_time": skipped,
                       "elapsed_s": round(time.time() - t0, 1), "summary": summ,
                       "geomean": summ.get("fwd/all", {}).get("ratio_geomean")},
                      command="python -m ck_fmha.bench_broad " + " ".join(sys.argv[1:]), device=device_name())
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
    res = run(None, float(options.get("budget") or 420.0), quick=bool(options.get("quick")),
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
    ap.add_argument("--quick", action="store_true",
                    help="one case of every stratum (head dims, decode page sizes): minutes on one GPU")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    if a.list:
        cs = cases()
        keep = {id(c) for c in quick_cases(cs)} if a.quick else None
        for i, c in enumerate(cs):
            if keep is None or id(c) in keep:
                print(i, c["split"], _stratum(c), c["case"])
    else:
        res = run(a.out, a.budget, kinds=a.kinds.split(",") if a.kinds else None, limit=a.limit or None,
                  which=a.cases, shard=a.shard, quick=a.quick)
        print(json.dumps(res["summary"], indent=1))
