"""The shapes the selection oracle is collected on (``benchmarks/selection_collect.py``): per op, the
cases drawn from a fixed seed with their train / held-out split, the Problem and the API's options of
a case, its CUDA inputs and the peer library's call, and the grouping of shapes by Triton
specialisation class.  Split from selection_collect.py (issue #30); the scripts and tests read
these names through ``selection_collect``.
"""
from __future__ import annotations

import math
import random

from ck_gemm.bench_broad import MODELS as BROAD_MODELS

SEED = 20261125
#: (name, hidden, intermediate, vocab, q heads, kv heads, head dim): the broad GEMM suite's public
#: model configs and a few more
MODELS = BROAD_MODELS + (
    ("phi3-mini", 3072, 8192, 32064, 32, 32, 96),
    ("gemma2-9b", 3584, 14336, 256000, 16, 8, 256),
    ("bert-base", 768, 3072, 30522, 12, 12, 64),
)
#: model configs whose every layer is held out (never in training)
HELD_OUT_MODELS = ("qwen2-7b", "llama2-13b", "phi3-mini")
#: most FLOPs one measured shape may have (keeps one candidate's timing under ~2 ms)
MAX_FLOPS = 6e11


def _log_uniform(rng, lo, hi) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def gemm_cases(n: int, seed: int = SEED, max_dim: int = 16384) -> list[dict]:
    """``n`` GEMM shapes: 55% LLM layers, 20% skinny M, 15% odd sizes, 10% batched."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        r = rng.random()
        if r < 0.55:
            name, h, inter, vocab, nq, nkv, hd = rng.choice(MODELS)
            tokens = _log_uniform(rng, 1, 8192)
            layer, nn, k = rng.choice((("qkv", (nq + 2 * nkv) * hd, h), ("o", h, nq * hd), ("up", 2 * inter, h),
                                       ("down", h, inter), ("vocab", vocab, h)))
            c = dict(family=f"llm:{name}:{layer}", m=tokens, n=nn, k=k, batch=1, layout="rcr",
                     split="heldout" if name in HELD_OUT_MODELS else None)
        elif r < 0.75:
            # hidden sizes of real models are multiples of 256
            c = dict(family="skinny", m=rng.choice((1, 2, 4, 8, 16, 24, 32, 48, 64)),
                     n=_log_uniform(rng, 2, 128) * 256, k=_log_uniform(rng, 2, 64) * 256, batch=1,
                     layout=rng.choice(("rcr", "rcr", "rrr")))
        elif r < 0.9:
            c = dict(family="odd", m=_log_uniform(rng, 1, 8192), n=_log_uniform(rng, 16, 8192),
                     k=_log_uniform(rng, 16, 8192), batch=1, layout=rng.choice(("rcr", "rrr")))
        else:
            c = dict(family="batched", m=_log_uniform(rng, 32, 2048), n=_log_uniform(rng, 32, 2048),
                     k=_log_uniform(rng, 32, 2048), batch=rng.choice((2, 4, 8, 16)), layout="rcr")
        c["dtype"] = "bf16" if rng.random() < 0.35 else "fp16"
        c["m"], c["n"], c["k"] = (min(x, max_dim) for x in (c["m"], c["n"], c["k"]))
        if 2.0 * c["batch"] * c["m"] * c["n"] * c["k"] > MAX_FLOPS:
            continue
        if c.get("split") is None:
            c["split"] = "heldout" if rng.random() < 0.3 else "train"
        out.append(c)
    return out


def gemm_problem(c: dict):
    from ck_gemm.problem import GemmProblem

    return GemmProblem(m=c["m"], n=c["n"], k=c["k"], batch=c["batch"], dtype=c["dtype"], layout=c["layout"])


def gemm_options(p) -> dict:
    """The registry options ``ck_gemm.matmul`` dispatches through (see ck_gemm.api)."""
    return dict(dtypes=(p.dtype,), layouts=(p.layout,), dtypes_c=(p.dtype_c,), num_ds=(0,), d_ops=("add",),
                activations=("none",))


def gemm_cuda_inputs(p, seed: int):
    """Inputs and an fp32 reference made on the GPU (a float64 numpy product of a large shape
    would cost seconds per shape)."""
    import torch

    from ck_core.api import torch_dtype

    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = torch_dtype(p.dtype)
    a = torch.randn(p.shape_a(), device="cuda", generator=g).to(dt)
    b = torch.randn(p.shape_b(), device="cuda", generator=g).to(dt)
    af = a.float() if p.layout[0] == "r" else a.float().transpose(-1, -2)
    bf = b.float() if p.layout[1] == "r" else b.float().transpose(-1, -2)
    return {"a": a, "b": b}, {"c": af @ bf}


#: attention model families: (name, q heads, kv heads, head dim)
ATTN_MODELS = (("llama3-8b", 32, 8, 128), ("llama2-7b", 32, 32, 128), ("mistral-7b", 32, 8, 128),
               ("gemma2-9b", 16, 8, 256), ("phi3-mini", 32, 32, 96), ("bert-base", 12, 12, 64),
               ("qwen2-7b", 28, 4, 128), ("sd-unet", 8, 8, 64), ("gpt-j", 16, 16, 256), ("whisper", 20, 20, 64))
HELD_OUT_ATTN = ("qwen2-7b", "phi3-mini", "gpt-j")


def fmha_cases(n: int, seed: int = SEED, max_dim: int = 16384) -> list[dict]:
    """``n`` forward attention shapes (batch mode): model head configs x lengths x masks."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        name, hq, hk, d = rng.choice(ATTN_MODELS)
        sq = min(_log_uniform(rng, 16, 16384), max_dim)
        sk = sq if rng.random() < 0.7 else min(_log_uniform(rng, 16, 16384), max_dim)
        b = max(1, min(_log_uniform(rng, 1, 32), (1 << 16) // max(sq, sk)))
        c = dict(family=f"attn:{name}", batch=b, hq=hq, hk=hk, sq=sq, sk=sk, d=d,
                 mask=rng.choice(("none", "top_left")) if sq <= sk else "none",
                 dtype=rng.choice(("bf16", "fp16")))
        c["split"] = "heldout" if name in HELD_OUT_ATTN or rng.random() < 0.25 else "train"
        out.append(c)
    return out


def fmha_problem(c: dict):
    from ck_fmha.problem import FmhaProblem

    return FmhaProblem(family="fwd", batch=c["batch"], nhead_q=c["hq"], nhead_k=c["hk"], seqlen_q=c["sq"],
                       seqlen_k=c["sk"], hdim_q=c["d"], hdim_v=c["d"], dtype=c["dtype"], mask=c["mask"])


def fmha_options(p) -> dict:
    return {}


def fmha_cuda_inputs(p, seed: int):
    """q, k, v on the GPU and an fp32 SDPA reference (top-left causal where masked)."""
    import torch

    from ck_core.api import torch_dtype

    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = torch_dtype(p.dtype)
    q = torch.randn(p.batch, p.nhead_q, p.seqlen_q, p.hdim_q, device="cuda", generator=g).to(dt)
    k = torch.randn(p.batch, p.nhead_k, p.seqlen_k, p.hdim_q, device="cuda", generator=g).to(dt)
    v = torch.randn(p.batch, p.nhead_k, p.seqlen_k, p.hdim_v, device="cuda", generator=g).to(dt)
    rep = p.nhead_q // p.nhead_k
    kf, vf = k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), kf, vf, is_causal=p.mask == "top_left")
    return {"q": q, "k": k, "v": v}, {"o": ref}


def conv_cases(n: int, seed: int = SEED, max_dim: int = 0) -> list[dict]:
    """``n`` conv problems: the broad conv suite's network layers (``ck_conv.bench_broad.LAYERS``)
    x direction x dtype x batch 1/8/32, drawn without replacement; its held-out networks
    (EfficientNet-B0, the VAE) are held out whole, and about 25% of the other problems."""
    from ck_conv.bench_broad import HELD_OUT_NETS, LAYERS

    rng = random.Random(seed)
    combos = [(i, d, dt, b) for i in range(len(LAYERS)) for d in ("forward", "bwd_data", "bwd_weight")
              for dt in ("fp16", "bf16") for b in (1, 8, 32)]
    rng.shuffle(combos)
    out = []
    for i, d, dt, b in combos[:n]:
        net, C, K, G, sp, flt, st, pd = LAYERS[i]
        nd = len(sp)
        if max_dim:   # tests: the same layers shrunk (groups, channels per group, spatial)
            g2 = min(G, max_dim)
            C, K, G = g2 * min(C // G, max_dim), g2 * min(K // G, max_dim), g2
            sp = tuple(max(min(x, max_dim), f) for x, f in zip(sp, flt))
        # one tensor under ~1.5 GiB, as the broad suite keeps it (3D video, the 1D encoder)
        while b > 1 and b * max(C, K) * math.prod(sp) * 2 > 1.5 * (1 << 30):
            b //= 2
        out.append(dict(family=f"{net}:{d}", net=net, N=b, C=C, K=K, G=G, spatial=list(sp), filter=list(flt),
                        stride=list(st) if isinstance(st, tuple) else [st] * nd,
                        pad=list(pd) if isinstance(pd, tuple) else [pd] * nd, direction=d, dtype=dt,
                        split="heldout" if net in HELD_OUT_NETS or rng.random() < 0.25 else "train"))
    return out


def conv_problem(c: dict):
    from ck_conv.problem import ConvProblem

    # split_k 0: the kernel's split is the key's (what a user's call gets)
    return ConvProblem(N=c["N"], G=c["G"], C=c["C"], K=c["K"], input_spatial=tuple(c["spatial"]),
                       filter=tuple(c["filter"]), stride=tuple(c["stride"]), pad_left=tuple(c["pad"]),
                       pad_right=tuple(c["pad"]), direction=c["direction"], dtype=c["dtype"], split_k=0)


def conv_options(p) -> dict:
    """The registry options ``ck_conv.conv2d`` dispatches through (see ck_conv.api)."""
    return dict(directions=(p.direction,), dtypes=(p.dtype,), ndims=(p.ndim,), layouts=(p.layout_family,))


def conv_torch_tensors(p, seed: int, device: str):
    """Torch-shaped channels-last x, w, dy (what cuDNN is timed on) and our layouts' views of them."""
    import torch

    from ck_conv.bench import to_ours
    from ck_conv.bench_broad import _channels_last
    from ck_core.api import torch_dtype

    torch.manual_seed(seed)
    dt = torch_dtype(p.dtype)
    x = _channels_last((p.N, p.C) + tuple(p.input_spatial), dt, device)
    w = _channels_last((p.K, p.C // p.G) + tuple(p.filter), dt, device, 1 / math.sqrt(p.c_per_group * p.taps))
    dy = _channels_last((p.N, p.K) + tuple(p.output_spatial), dt, device)
    ops = {"x": to_ours(x, p.G, "x"), "w": to_ours(w, p.G, "w"), "dy": to_ours(dy, p.G, "x")}
    return (x, w, dy), {n: ops[n] for n in ("x", "w", "dy") if n in p.input_names()}


def conv_peer(p, x, w, dy):
    """cuDNN through torch on the channels-last tensors (bench_broad's peer)."""
    from ck_conv.bench_broad import _peer

    c = dict(spatial=p.input_spatial, stride=p.stride, pad=p.pad_left, G=p.G, direction=p.direction)
    return _peer(c, x, w, dy)


def conv_case(p, seed: int, device: str = "cuda"):
    """``(our operands, {output: fp32 result in our layout}, cuDNN callable)`` on ``device``."""
    from ck_conv.bench import to_ours

    (x, w, dy), ops = conv_torch_tensors(p, seed, device)
    ref = conv_peer(p, x.float(), w.float(), dy.float())()
    kind = "w" if p.direction == "bwd_weight" else "x"
    out = {"forward": "y", "bwd_data": "dx", "bwd_weight": "dw"}[p.direction]
    return ops, {out: to_ours(ref, p.G, kind).contiguous()}, conv_peer(p, x, w, dy)


def conv_cuda_inputs(p, seed: int, device: str = "cuda"):
    return conv_case(p, seed, device)[:2]


OPS = {"gemm": (gemm_cases, gemm_problem, gemm_options, gemm_cuda_inputs),
       "fmha": (fmha_cases, fmha_problem, fmha_options, fmha_cuda_inputs),
       "conv": (conv_cases, conv_problem, conv_options, conv_cuda_inputs)}


def gemm_peer(p, dev):
    """torch.matmul (cuBLAS) on the same stored operands (transposed views, no copies)."""
    import torch

    a, b = dev["a"], dev["b"]
    al = a if p.layout[0] == "r" else a.transpose(-1, -2)
    bl = b if p.layout[1] == "r" else b.transpose(-1, -2)
    return lambda: torch.matmul(al, bl)


def fmha_peer(p, dev):
    import torch

    q, k, v = dev["q"], dev["k"], dev["v"]
    gqa = p.nhead_q != p.nhead_k
    return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=p.mask == "top_left",
                                                                    enable_gqa=gqa)


PEERS = {"gemm": ("torch.matmul (cuBLAS)", gemm_peer), "fmha": ("torch SDPA", fmha_peer)}


# -- specialisation classes -------------------------------------------------------------------

def spec_class(p) -> tuple:
    """What Triton specialises a launch on (ints equal to 1 or divisible by 16, the launcher's
    EVEN_K constexpr), plus the signature: shapes of one class run the same compiled kernels."""
    if p.op == "fmha":
        return (p.dtype, p.hdim_q, p.mask, p.nhead_q == p.nhead_k) + tuple(
            (x == 1, x % 16 == 0) for x in (p.seqlen_q, p.seqlen_k))
    dims = tuple((x == 1, x % 16 == 0) for x in (p.m, p.n, p.k))
    even_k = tuple(p.k % bk == 0 for bk in (64, 128, 256))
    # products: split-K workspace strides (M*N, batch*M*N) and batch strides (M*K, N*K)
    prods = tuple(x % 16 == 0 for x in (p.m * p.n, p.m * p.k, p.n * p.k, p.batch, p.batch * p.m * p.n)) \
        if p.batch > 1 else ((p.m * p.n) % 16 == 0,)
    # the plain/persistent kernels' A_VEC / B_VEC: the power of two (at most 16 bytes) dividing each
    # operand's contiguous extent (ck_gemm.backends.triton.launch.vec_elems; contiguous operands)
    cap = 16 if p.dtype.startswith("fp8") else 8

    def vec(x):
        if x % 16 == 0:
            return 0
        v = 1
        while v < cap and x % (2 * v) == 0:
            v *= 2
        return 0 if v == 1 else v
    vecs = (vec(p.k if p.layout[0] == "r" else p.m), vec(p.n if p.layout[1] == "r" else p.k))
    return (p.dtype, p.layout, p.batch > 1) + dims + even_k + prods + vecs


def class_blocks(cases: list, problem_of, block: int) -> list:
    """``cases`` in runs of up to ``block`` shapes of one specialisation class, the most
    frequent class first, classes taken in turn: consecutive shapes of a class share its
    compiled kernels, and a run cut by its budget still holds every class it reached."""
    if block <= 0:
        return cases
    by_class: dict = {}
    for c in cases:
        by_class.setdefault(spec_class(problem_of(c)), []).append(c)
    groups = sorted(by_class.values(), key=len, reverse=True)
    out = []
    for start in range(0, max(len(v) for v in groups), block):
        for v in groups:
            out.extend(v[start:start + block])
    return out


# -- the compile pool (GPU) ---------------------------------------------------------------------
