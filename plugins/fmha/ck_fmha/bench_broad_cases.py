"""The broad FMHA suite's cases (:mod:`ck_fmha.bench_broad`): drawn with a fixed seed from
distributions of real workloads (:func:`seeded_cases`) and from public models' attention configs
(:data:`MODELS`, :func:`model_cases`), their strata (head dims, decode page sizes), the held-out
split, ``--quick``'s one case per stratum and ``--cases``' selection.  Plain data: no torch.
"""
from __future__ import annotations

import math
import random

HDIMS = (64, 80, 96, 128, 160, 192, 256)
GQA = (1, 4, 8, "mqa")
MASKS = ("full", "causal", "window")
SEED = 20261125

#: issue #28's strata: every head dim has its own geomean and minimum
HDIM_STRATA = (32, 40, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256)

#: decode: every page size a stratum; caches of at most SMALL_CACHE bytes form their own stratum
PAGE_STRATA = (1, 8, 16, 32, 64, 128, 256)
SMALL_CACHE = 32 << 20

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

#: the sliding windows of the configs that have one
WINDOWS = {"mistral-7b": 4096, "gemma2-9b": 4096, "phi3-mini": 2047}


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


def _stratum(c: dict) -> str:
    """A case's stratum: its head dim (``d64``); decode: its page size (``page16``) when the KV cache is
    larger than :data:`SMALL_CACHE`, else ``small_cache``."""
    if c["kind"] == "decode":
        return f"page{c['page']}" if _cache_bytes(c) > SMALL_CACHE else "small_cache"
    return f"d{c['d']}"


def _cache_bytes(c: dict) -> int:
    """Bytes of a decode case's K and V caches (2-byte elements)."""
    return 2 * c["b"] * c["sk"] * c["hk"] * c["d"] * 2


def _flops(c: dict, direction: str) -> float:
    """A case's attention flops (``direction="bwd"``: forward and backward, 3.5x); window and causal
    masks count only the keys a query sees."""
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
