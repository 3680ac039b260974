"""Differential fuzz of the PUBLIC torch APIs (flash_attn_func, flash_attn_varlen_func, ck_gemm.matmul,
ck_conv.conv1d/2d/3d), forward and backward through autograd, against float64 references written
from the math (tests/api_cases.py's ``ref_attn``; plain torch float64 ops for GEMM and conv).

Each case is drawn from a seeded generator; its outcome is ``ok``, ``wrong`` (a result off the
reference), ``ck_error:<type>`` (a CkError: refused with a message, allowed) or ``raw_error:<type>``
(any other exception: a bug).  The run fails on any wrong result or raw error.

    python tests/api_fuzz.py --device cpu --cases 12 --out fuzz.json            # CPU (numpy or interpreter)
    CK_TEST_GPU=1 python tests/api_fuzz.py --device cuda --cases 400 --out fuzz_gpu.json   # the H200

tests/test_api_fuzz.py runs the CPU form in both CPU modes and the GPU form under ``-m gpu``.
"""
from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from api_cases import F64, ref_attn  # noqa: E402

#: head dims drawn per device (GPU: 32..256 with the odd ones)
HDIMS = {"cpu": (32, 40, 64), "cuda": (32, 40, 64, 80, 96, 112, 128, 160, 192, 224, 256)}
MAXSEQ = {"cpu": 24, "cuda": 300}
#: relative (norm-wise) error bounds: forward, backward
TOL = {torch.float16: (2e-2, 4e-2), torch.bfloat16: (6e-2, 1.2e-1), torch.float32: (1e-4, 3e-4)}


def _rel(got, want) -> float:
    got, want = got.detach().to(F64).cpu(), want.detach().to(F64).cpu()
    if got.shape != want.shape:
        return float("inf")
    if not torch.isfinite(got).all():
        return float("inf")
    # an absolute floor of 1e-3 per element: a gradient that is zero in exact arithmetic (one key:
    # softmax is constant) comes back as rounding noise, which is not a relative error of 1
    return float((got - want).norm() / max(float(want.norm()), 1e-3 * want.numel() ** 0.5, 1e-6))


class Wrong(AssertionError):
    pass


def _check(name, got, want, tol):
    e = _rel(got, want)
    if not e <= tol:
        raise Wrong(f"{name}: relative error {e:.3g} > {tol}")


def _diff(fn, ref, inputs, dtype, grad: bool, name: str, rng):
    """Forward (and, with ``grad``, backward with one random dO) of ``fn`` against ``ref`` (float64)."""
    tf, tb = TOL[dtype]
    ins = [x.detach().clone().requires_grad_(grad and x.is_floating_point()) for x in inputs]
    out = fn(*ins)
    rin = [x.detach().to(F64).cpu().requires_grad_(grad and x.is_floating_point()) for x in inputs]
    want = ref(*rin)
    _check(f"{name} forward", out, want, tf)
    if not grad:
        return
    do = torch.randn(out.shape, generator=rng).to(out.dtype).to(out.device)
    gi = [x for x in ins if x.requires_grad]
    gs = torch.autograd.grad(out, gi, do, allow_unused=True)
    ws = torch.autograd.grad(want, [x for x in rin if x.requires_grad], do.to(F64).cpu(), allow_unused=True)
    for n, (g, w) in enumerate(zip(gs, ws)):
        if w is None:
            continue
        if g is None:
            raise Wrong(f"{name}: no gradient for input {n}")
        _check(f"{name} grad {n}", g, w, tb)


def _t(shape, dtype, device, g, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(device)


def _bshd(x):
    return x.transpose(1, 2)


def case_attention(r: random.Random, device, dtypes, g):
    from ck_fmha.flash_attn import flash_attn_func

    dt = r.choice(dtypes)
    d = r.choice(HDIMS[device])
    hk = r.choice((1, 2))
    hq = hk * r.choice((1, 2, 3))                      # MHA, GQA, MQA
    b, sq, sk = r.randint(1, 2), r.randint(1, MAXSEQ[device]), r.randint(1, MAXSEQ[device])
    kw, mask = {}, r.choice(("none", "causal", "window", "softcap", "alibi"))
    if mask == "causal":
        kw["causal"] = True
    elif mask == "window":
        kw["window_size"] = (r.randint(0, sk), r.choice((-1, 0, r.randint(0, sk))))
    elif mask == "softcap":
        kw["softcap"] = r.choice((5.0, 30.0))
    elif mask == "alibi":
        kw["alibi_slopes"] = (torch.rand(hq, generator=g) * 0.5).to(device)
    q, k, v = _t((b, sq, hq, d), dt, device, g), _t((b, sk, hk, d), dt, device, g), _t((b, sk, hk, d), dt, device, g)
    grad = r.random() < 0.6
    ref = lambda q, k, v: _bshd(ref_attn(_bshd(q), _bshd(k), _bshd(v), causal=kw.get("causal", False),  # noqa: E731
                                         window=kw.get("window_size", (-1, -1)), softcap=kw.get("softcap", 0.0),
                                         alibi=None if "alibi_slopes" not in kw else kw["alibi_slopes"].cpu()))
    name = f"flash_attn_func {dt} b{b} s{sq}x{sk} h{hq}/{hk} d{d} {mask}{' bwd' if grad else ''}"
    _diff(lambda q, k, v: flash_attn_func(q, k, v, **kw), ref, [q, k, v], dt, grad, name, g)
    return name


def case_varlen(r: random.Random, device, dtypes, g):
    from ck_fmha.flash_attn import flash_attn_varlen_func

    dt, d = r.choice(dtypes), r.choice(HDIMS[device])
    h = r.choice((1, 2, 4))
    n = r.randint(1, 4)
    lq = [r.choice((0, r.randint(1, MAXSEQ[device]))) for _ in range(n)]   # empty sequences too
    lk = [r.choice((0, r.randint(1, MAXSEQ[device]))) if q == 0 else r.randint(1, MAXSEQ[device]) for q in lq]
    causal = r.random() < 0.5
    cu = lambda ls: torch.tensor([0, *torch.tensor(ls).cumsum(0).tolist()], dtype=torch.int32, device=device)  # noqa
    cq, ck = cu(lq), cu(lk)
    q, k, v = _t((sum(lq), h, d), dt, device, g), _t((sum(lk), h, d), dt, device, g), _t((sum(lk), h, d), dt, device, g)

    def ref(q, k, v):
        outs = []
        cql, ckl = cq.tolist(), ck.tolist()
        for i in range(n):
            qs, ks, vs = q[cql[i]:cql[i + 1]], k[ckl[i]:ckl[i + 1]], v[ckl[i]:ckl[i + 1]]
            if qs.shape[0]:
                outs.append(ref_attn(qs.transpose(0, 1)[None], ks.transpose(0, 1)[None], vs.transpose(0, 1)[None],
                                     causal=causal)[0].transpose(0, 1))
        return torch.cat(outs) if outs else q.new_zeros(0, h, d) + 0 * (q.sum() + k.sum() + v.sum())

    grad = r.random() < 0.6
    name = f"flash_attn_varlen_func {dt} lens_q {lq} lens_k {lk} h{h} d{d} causal={causal}{' bwd' if grad else ''}"
    _diff(lambda q, k, v: flash_attn_varlen_func(q, k, v, cq, ck, max(lq), max(lk), causal=causal), ref, [q, k, v],
          dt, grad, name, g)
    return name


_ACT = {None: lambda x: x, "relu": torch.relu, "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu,
        "sigmoid": torch.sigmoid, "tanh": torch.tanh}


def case_gemm(r: random.Random, device, dtypes, g):
    from ck_gemm import matmul

    dt = r.choice(dtypes + (torch.float32,))
    top = 40 if device == "cpu" else 700
    m, n, k = r.randint(1, top), r.randint(1, top), r.randint(1, top)
    batch = r.choice((None, None, r.randint(2, 3)))
    lead = () if batch is None else (batch,)
    ta, tb = r.random() < 0.5, r.random() < 0.5               # transposed views
    a = _t(lead + ((k, m) if ta else (m, k)), dt, device, g)
    b = _t(lead + ((n, k) if tb else (k, n)), dt, device, g)
    bias = _t((n,), dt, device, g) if r.random() < 0.5 else None
    act = r.choice(list(_ACT))
    grad = r.random() < 0.5
    view = lambda x, t: x.transpose(-1, -2) if t else x   # noqa: E731
    ins = [a, b] + ([bias] if bias is not None else [])

    def fn(a, b, *bias):
        return matmul(view(a, ta), view(b, tb), d=tuple(bias), activation=act)

    def ref(a, b, *bias):
        y = view(a, ta) @ view(b, tb)
        return _ACT[act](y + bias[0] if bias else y)

    name = (f"matmul {dt} {lead}{m}x{n}x{k} {'aT' if ta else 'a'} {'bT' if tb else 'b'} bias={bias is not None} "
            f"act={act}{' bwd' if grad else ''}")
    _diff(fn, ref, ins, dt, grad, name, g)
    return name


def case_conv(r: random.Random, device, dtypes, g):
    import ck_conv
    import torch.nn.functional as F

    nd = r.choice((1, 2, 2, 3))
    dt = r.choice(dtypes + (torch.float32,))
    groups = r.choice((1, 1, 2, 4))
    depthwise = r.random() < 0.2
    cpg = 1 if depthwise else r.randint(1, 3)
    c = groups * cpg
    kpg = 1 if depthwise else r.randint(1, 3)
    kk = groups * kpg
    filt = [r.choice((1, 2, 3)) for _ in range(nd)]
    stride = [r.choice((1, 2)) for _ in range(nd)]
    dil = [r.choice((1, 2)) for _ in range(nd)]
    pad = [r.randint(0, 2) for _ in range(nd)]
    top = {1: 24, 2: 11, 3: 6}[nd] * (1 if device == "cpu" else 4)
    size = [r.randint((f - 1) * dl + 1, (f - 1) * dl + top) for f, dl in zip(filt, dil)]
    nb = r.randint(1, 2)
    x = _t((nb, c) + tuple(size), dt, device, g)
    w = _t((kk, cpg) + tuple(filt), dt, device, g, scale=0.5)
    bias = _t((kk,), dt, device, g) if r.random() < 0.5 else None
    fn_ck = {1: ck_conv.conv1d, 2: ck_conv.conv2d, 3: ck_conv.conv3d}[nd]
    fn_ref = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    kw = dict(stride=tuple(stride), padding=tuple(pad), dilation=tuple(dil), groups=groups)
    grad = r.random() < 0.5
    ins = [x, w] + ([bias] if bias is not None else [])
    name = (f"conv{nd}d {dt} x{tuple(x.shape)} w{tuple(w.shape)} {kw} bias={bias is not None}"
            f"{' bwd' if grad else ''}")
    _diff(lambda x, w, *b: fn_ck(x, w, b[0] if b else None, **kw),
          lambda x, w, *b: fn_ref(x, w, b[0] if b else None, **kw), ins, dt, grad, name, g)
    return name


KINDS = (case_attention, case_varlen, case_gemm, case_conv)


def fuzz(device: str = "cpu", cases: int = 12, seed: int = 0, dtypes=None) -> dict:
    """Run ``cases`` random cases (round-robin over the kinds); the summary dict."""
    from ck_core.errors import CkError

    if dtypes is None:
        # the Triton interpreter refuses bf16 dot kernels (a CkError): fp16 there; bf16 elsewhere
        from ck_core.api import backend_for
        interp = device == "cpu" and backend_for(torch.device("cpu")) == "triton"
        dtypes = (torch.float16,) if interp else (torch.float16, torch.bfloat16)
    r = random.Random(seed)
    counts: collections.Counter = collections.Counter()
    failures, t0 = [], time.perf_counter()
    for i in range(cases):
        kind = KINDS[i % len(KINDS)]
        g = torch.Generator().manual_seed(r.randrange(1 << 30))
        name = kind.__name__
        try:
            name = kind(r, device, dtypes, g)
            counts["ok"] += 1
        except Wrong as e:
            counts["wrong"] += 1
            failures.append({"case": i, "kind": kind.__name__, "outcome": "wrong", "detail": str(e)})
        except CkError as e:
            counts[f"ck_error:{type(e).__name__}"] += 1
            failures.append({"case": i, "kind": kind.__name__, "outcome": f"ck_error:{type(e).__name__}",
                             "detail": str(e)[:400]})
        except Exception as e:   # noqa: BLE001  (counted: a raw exception fails the run)
            counts[f"raw_error:{type(e).__name__}"] += 1
            failures.append({"case": i, "kind": kind.__name__, "outcome": f"raw_error:{type(e).__name__}",
                             "detail": f"{name}: {e}"[:600]})
    return {"device": device, "seed": seed, "cases": cases, "seconds": round(time.perf_counter() - t0, 2),
            "counts": dict(counts), "wrong": counts["wrong"],
            "raw_errors": sum(v for k, v in counts.items() if k.startswith("raw_error")), "failures": failures}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--cases", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the summary JSON here")
    a = ap.parse_args(argv)
    s = fuzz(a.device, a.cases, a.seed)
    text = json.dumps(s, indent=1)
    if a.out:
        Path(a.out).write_text(text)
    print(json.dumps({k: s[k] for k in ("device", "cases", "seconds", "counts")}))
    return 1 if s["wrong"] or s["raw_errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
