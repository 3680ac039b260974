"""Host overhead of the public APIs, and the first call of a new problem (issues #13 and #26).

(t) ``--part table`` (the default; issue #26's table): every public API (gemm matmul/linear,
    conv1d/2d/3d and channels-last conv2d, attention, flash_attn_func / varlen, splitkv and paged
    decode, appendkv, batch_prefill), forward and forward+backward where it has one, on tiny
    problems: warm eager us/call of the ck call and of torch's equivalent call (``host_us``:
    issuing ``--calls`` calls, ``wall_us``: with the final sync; median of 5 rounds) and their
    ratio; and both under torch.compile(mode="reduce-overhead") for the cases of ``COMPILED``
    (``--compile-all``: every case; ``--no-compile``: none).  About 3 minutes on an H200.
(a) ``--part overhead``: warm eager calls of ``ck_gemm.matmul``, ``ck_conv.conv2d``,
    ``ck_fmha.attention`` (fwd, and fwd+bwd) against the bare launch of the same Triton kernels
    (recorded from one API call: ``replay`` = the compiled kernel's own launcher, ``jit`` =
    ``fn[grid](*args)``).
(b) ``--part first``: first call of a new problem in a fresh process (import and tensor set-up
    excluded): ``cold`` = empty kernel cache and empty Triton cache; ``built`` = a kernel cache that
    ``ck build`` (``build_registry`` of the keys the cold call launched) filled in another
    process, with an empty Triton cache.  Reports ms and how many kernels Triton compiled.
    ``--part all`` = overhead + first.
(c) ``--part autograd``: where an eager attention fwd+bwd step spends its host time (forward with
    requires_grad, backward alone, the backward plan called directly; a torch.profiler table).
    ``--profile DIR`` writes a cProfile of each warm call; ``--only TEXT`` picks cases.
(e) ``--part launches`` (with ``cpu``: on the CPU run's stubs): what one warm call of each table case
    runs: its Triton launches (replayed or not) and kernels, its torch operations, Problems built and
    selections made (:func:`launch_counts`).
(d) ``--part cpu``: a dry run without a GPU: the table's ck calls on CPU tensors (the sm90 arch's
    registries), every Triton launch stubbed out (launches recorded as if on a GPU, replays that
    do nothing), so the time is the host path above the launch.  On a shared CPU, tensor work the
    API does on the host (copies, the autograd engine's gradient sums) counts too.

One JSON schema: ``{"name": "ck.overhead", "version": 2, "device", "date", "command", "commit",
"versions", "unit", "table" | "overhead" | "first_call" | "autograd"}``.

    python benchmarks/overhead.py --out overhead.json                      # the table, on a GPU
    python benchmarks/overhead.py --part overhead autograd --only fmha --profile prof --out o.json
    python benchmarks/overhead.py --part cpu --out overhead_cpu.json       # no GPU needed
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

def _t(shape, grad=False):
    return f"torch.randn({shape}, device='cuda', dtype=torch.float16{', requires_grad=True' if grad else ''})"


#: first call of a new problem: one expression each, run in a fresh process
FIRST = {"gemm": f"ck_gemm.matmul({_t('1536, 1024')}, {_t('1024, 2048')})",
         # channels multiples of 16: the specialisation of ck build's representative conv problem
         "conv": f"ck_conv.conv2d({_t('4, 64, 28, 28')}, {_t('64, 64, 3, 3')}, padding=1)",
         # channels 24 -> 40: another specialisation than ck build's (JIT-compiled into the cache)
         "conv unaligned": f"ck_conv.conv2d({_t('3, 24, 17, 17')}, {_t('40, 24, 3, 3')}, padding=1)",
         "fmha fwd": f"ck_fmha.attention_forward({_t('2, 16, 1024, 128')}, {_t('2, 16, 1024, 128')}, "
                     f"{_t('2, 16, 1024, 128')}, causal=True)",
         "fmha fwd+bwd": f"ck_fmha.attention(*[{_t('2, 16, 512, 64', True)} for _ in range(3)])"
                         ".sum().backward()",
         "fmha splitkv decode": f"ck_fmha.decode.splitkv_decode({_t('4, 32, 1, 128')}, {_t('4, 8, 4096, 128')}, "
                                f"{_t('4, 8, 4096, 128')})"}


def _timed(fn, calls):
    """:func:`_per_call` on the GPU, after 20 warm-up calls."""
    import torch

    return _per_call(fn, calls, torch.cuda.synchronize, warmup=20)


def _record_launches(call):
    """The Triton launches one ``call()`` makes: [(name or None, fn, grid, args, kwargs)]."""
    from triton.runtime.jit import JITFunction

    from ck_core.backends import triton_artifacts as ta
    from ck_core.backends.triton_replay import Replay

    got, real_launch, real_run, real_replay = [], ta.launch, JITFunction.run, Replay.__call__

    def replay(self, args):   # a launcher's recorded fast path
        got.append(("replay", self, None, tuple(args), None))
        return real_replay(self, args)

    def launch(name, fn, grid, args, kwargs, **kw):
        got.append((name, fn, grid, tuple(args), dict(kwargs)))
        return real_launch(name, fn, grid, args, kwargs, **kw)

    def run(self, *args, grid, warmup, **kwargs):
        if not warmup:
            got.append((None, self, grid, args, dict(kwargs)))
        return real_run(self, *args, grid=grid, warmup=warmup, **kwargs)

    ta.launch, JITFunction.run, Replay.__call__ = launch, run, replay
    try:
        call()
    finally:
        ta.launch, JITFunction.run, Replay.__call__ = real_launch, real_run, real_replay
    return got


def _bare(launches):
    from ck_core.backends import triton_replay

    replays = []
    for name, fn, grid, args, kwargs in launches:
        if name == "replay":
            replays.append((fn, list(args)))
            continue
        r = triton_replay.record(fn, grid, list(args), kwargs, name=name)
        if r is None:
            replays = None
            break
        replays.append((r, list(r.args)))
    # a launcher's own replay has no plain-JIT twin here: it stands for itself
    jits = [(fn, (list(args),), {}) if n == "replay" else (fn[grid], args, kwargs)
            for n, fn, grid, args, kwargs in launches]

    def jit():
        for b, a, k in jits:
            b(*a, **k)
    rep = None
    if replays is not None:
        def rep():
            for r, a in replays:
                r(a)
    return rep, jit


def _profile(call, calls: int, path: str) -> None:
    """cProfile of ``calls`` warm calls, the functions sorted by own time, into ``path``."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        call()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(40)
    with open(path, "w") as f:
        f.write(buf.getvalue())


def _slug(name: str) -> str:
    """A file name of a case name (letters, digits, '.', '_', '-' only)."""
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def autograd_parts(calls: int, profile_dir=None, dev: str = "cuda") -> dict:
    """Where an eager attention fwd+bwd spends its host time (``--part autograd``): the forward
    with requires_grad, the backward alone (``torch.autograd.grad`` on a retained graph), the
    backward plan called directly (``ck_fmha.api._bwd``, no autograd engine), each per call
    without and with a sync after every call; a torch.profiler table of the whole step."""
    import torch

    import ck_fmha
    from ck_fmha import api as fa

    h = torch.float16
    q, k, v = (torch.randn(1, 8, 128, 64, device=dev, dtype=h, requires_grad=True) for _ in range(3))
    do = torch.randn(1, 8, 128, 64, device=dev, dtype=h)
    o = ck_fmha.attention(q, k, v)
    o2, lse = ck_fmha.attention(q, k, v, return_lse=True)
    opts = (False, None, (-1, -1), 0.0, "bhsd", True, 0.0, 0, 0, None)
    qd, kd, vd = (t.detach() for t in (q, k, v))
    parts = {"fwd, requires_grad": lambda: ck_fmha.attention(q, k, v),
             "bwd alone (autograd.grad, retained graph)": lambda: torch.autograd.grad(o, (q, k, v), do,
                                                                                     retain_graph=True),
             "bwd plan direct (api._bwd)": lambda: fa._bwd(qd, kd, vd, o2.detach(), lse, do, None, None, None,
                                                          None, *opts, False),
             "fwd+bwd step": lambda: ck_fmha.attention(q, k, v).backward(do)}
    rows = {}
    for name, call in parts.items():
        try:
            row = {"pipelined": _timed(call, calls)}
            for _ in range(5):
                call()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls // 5):
                call()
                torch.cuda.synchronize()
            row["synced_us"] = round((time.perf_counter() - t0) / (calls // 5) * 1e6, 2)
            if profile_dir:
                os.makedirs(profile_dir, exist_ok=True)
                _profile(call, 300, os.path.join(profile_dir, "autograd_" + _slug(name) + ".txt"))
        except Exception as e:  # noqa: BLE001 - one part failing must not lose the others
            row = {"error": f"{type(e).__name__}: {e}"[:500]}
        rows[name] = row
        print(name, json.dumps(row), flush=True)
    try:
        from torch.profiler import ProfilerActivity, profile

        step = parts["fwd+bwd step"]
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                step()
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
        table += "\n" + prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12)
        if profile_dir:
            with open(os.path.join(profile_dir, "autograd_torch_profiler.txt"), "w") as f:
                f.write(table)
        print(table[:6000], flush=True)
    except Exception as e:  # noqa: BLE001
        print("torch.profiler failed:", type(e).__name__, e, flush=True)
    return rows


def overhead(calls: int, profile_dir=None, only=None) -> dict:
    import torch

    import ck_conv
    import ck_fmha
    import ck_gemm

    dev, h = "cuda", torch.float16
    a, b = torch.randn(256, 256, device=dev, dtype=h), torch.randn(256, 256, device=dev, dtype=h)
    x, w = torch.randn(2, 32, 16, 16, device=dev, dtype=h), torch.randn(32, 32, 3, 3, device=dev, dtype=h)
    q, k, v = (torch.randn(1, 8, 128, 64, device=dev, dtype=h) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    do = torch.randn_like(q)

    def fwd_bwd():
        o = ck_fmha.attention(qg, kg, vg)
        o.backward(do)

    cl = torch.channels_last
    xl, wl = x.to(memory_format=cl), w.to(memory_format=cl)
    cases = {"gemm.matmul 256^3 fp16": lambda: ck_gemm.matmul(a, b),
             "gemm.matmul 256^3 fp16, B transposed view": lambda: ck_gemm.matmul(a, b.t()),
             "conv.conv2d 2x32x16x16 k3 fp16": lambda: ck_conv.conv2d(x, w, padding=1),
             "conv.conv2d 2x32x16x16 k3 fp16 channels_last": lambda: ck_conv.conv2d(xl, wl, padding=1),
             "fmha.attention fwd 1x8x128x64 fp16": lambda: ck_fmha.attention(q, k, v),
             "fmha.attention fwd+bwd 1x8x128x64 fp16": fwd_bwd}
    F = torch.nn.functional
    d = lambda t: t.double()   # noqa: E731
    refs = {"gemm.matmul 256^3 fp16": (lambda: ck_gemm.matmul(a, b), lambda: d(a) @ d(b)),
            "gemm.matmul 256^3 fp16, B transposed view": (lambda: ck_gemm.matmul(a, b.t()), lambda: d(a) @ d(b).t()),
            "conv.conv2d 2x32x16x16 k3 fp16": (lambda: ck_conv.conv2d(x, w, padding=1),
                                               lambda: F.conv2d(d(x), d(w), padding=1)),
            "conv.conv2d 2x32x16x16 k3 fp16 channels_last": (lambda: ck_conv.conv2d(xl, wl, padding=1),
                                                             lambda: F.conv2d(d(x), d(w), padding=1)),
            "fmha.attention fwd 1x8x128x64 fp16": (lambda: ck_fmha.attention(q, k, v),
                                                   lambda: F.scaled_dot_product_attention(d(q), d(k), d(v)))}
    sdpa = F.scaled_dot_product_attention
    warm_checks = {"gemm.matmul 256^3 fp16": (ck_gemm.matmul, lambda a, b: a @ b, (a, b)),
                   "gemm.matmul 256^3 fp16, B transposed view": (ck_gemm.matmul, lambda a, b: a @ b, (a, b.t())),
                   "conv.conv2d 2x32x16x16 k3 fp16": (lambda x, w: ck_conv.conv2d(x, w, padding=1),
                                                      lambda x, w: F.conv2d(x, w, padding=1), (x, w)),
                   "conv.conv2d 2x32x16x16 k3 fp16 channels_last": (lambda x, w: ck_conv.conv2d(x, w, padding=1),
                                                                    lambda x, w: F.conv2d(x, w, padding=1), (xl, wl)),
                   "fmha.attention fwd 1x8x128x64 fp16": (ck_fmha.attention, sdpa, (q, k, v))}
    rows = {}
    for name, call in cases.items():
        if only and not any(s in name for s in only):
            continue
        row = {}
        try:
            if name in refs:   # correct before fast: relative error against float64, on fresh outputs
                got, ref = refs[name][0]().double(), refs[name][1]()
                row["rel_err"] = float((got - ref).norm() / ref.norm())
                if not row["rel_err"] < 1e-2:
                    raise AssertionError(f"relative error {row['rel_err']:.3g} against float64")
            for _ in range(3):
                call()
            if name in warm_checks:   # the warm path (recorded replays) on fresh inputs of the same signature
                api, ref_fn, like = warm_checks[name]
                errs = []
                for _ in range(3):
                    ins = [torch.randn_like(t) for t in like]   # same shapes, strides, dtype, device
                    want = ref_fn(*[t.double() for t in ins])
                    errs.append(float((api(*ins).double() - want).norm() / want.norm()))
                row["rel_err_warm"] = max(errs)
                if not row["rel_err_warm"] < 1e-2:
                    raise AssertionError(f"warm call: relative error {row['rel_err_warm']:.3g} against float64")
            launches = _record_launches(call)
            row["launches"] = [getattr(f, "names", None) and "replay" or n or getattr(f, "__name__", "?")
                               for n, f, *_ in launches]
            row["api"] = _timed(call, calls)
            rep, jit = _bare(launches)
            row["bare_jit"] = _timed(jit, calls)
            row["bare_replay"] = _timed(rep, calls) if rep else None
            floor = row["bare_replay"] or row["bare_jit"]
            row["overhead_host_us"] = round(row["api"]["host_us"] - floor["host_us"], 2)
            if profile_dir:
                os.makedirs(profile_dir, exist_ok=True)
                _profile(call, 1000, os.path.join(profile_dir, _slug(name) + ".txt"))
        except Exception as e:  # noqa: BLE001 - one case failing must not lose the others
            row["error"] = f"{type(e).__name__}: {e}"[:500]
        rows[name] = row
        print(name, json.dumps(row), flush=True)
    return rows


# -- the table (#26): every public API, eager and torch.compile, against torch's own call ------------

def api_cases(dev: str = "cuda", only=None) -> dict:
    """name -> (ck call, torch's equivalent call, grad): zero-argument callables on tiny problems, so the host
    is the bottleneck.  ``grad``: the case runs forward+backward (the leaves require grad and each call
    ends in ``.backward``).  The same table serves the GPU (``--part table``) and the CPU dry run."""
    import torch

    import ck_conv
    import ck_fmha
    import ck_fmha.decode
    import ck_fmha.flash_attn as fa
    import ck_fmha.prefill
    import ck_gemm

    F, h = torch.nn.functional, torch.float16
    g = torch.Generator(device="cpu").manual_seed(0)

    def t(*shape, grad=False, dtype=h):
        x = torch.randn(*shape, generator=g).to(device=dev, dtype=dtype)
        return x.requires_grad_() if grad else x

    def fb(f, *leaves):
        """forward + backward of ``f()``; the leaves' gradients are dropped first (``zero_grad(set_to_none=
        True)``, as a training step does: no accumulation into the last step's gradients).  Nothing runs
        before the first step (``only`` picks cases without running the others)."""
        dy = []

        def step():
            for t in leaves:
                t.grad = None
            out = f()
            if not dy:
                dy.append(torch.ones_like(out))
            out.backward(dy[0])
        return step

    cases = {}
    a, b = t(64, 64), t(64, 64)
    ag, bg = t(64, 64, grad=True), t(64, 64, grad=True)
    cases["gemm.matmul 64^3"] = (lambda: ck_gemm.matmul(a, b), lambda: a @ b, False)
    cases["gemm.matmul 64^3 fwd+bwd"] = (fb(lambda: ck_gemm.matmul(ag, bg), ag, bg), fb(lambda: ag @ bg, ag, bg), True)
    x, w, bias = t(64, 64), t(128, 64), t(128)
    xg, wg, biasg = t(64, 64, grad=True), t(128, 64, grad=True), t(128, grad=True)
    cases["gemm.linear 64x64 -> 128, bias"] = (lambda: ck_gemm.linear(x, w, bias), lambda: F.linear(x, w, bias),
                                               False)
    cases["gemm.linear 64x64 -> 128, bias fwd+bwd"] = (fb(lambda: ck_gemm.linear(xg, wg, biasg), xg, wg, biasg),
                                                       fb(lambda: F.linear(xg, wg, biasg), xg, wg, biasg), True)
    cl = torch.channels_last
    for nd, conv, tconv in ((1, ck_conv.conv1d, F.conv1d), (2, ck_conv.conv2d, F.conv2d),
                            (3, ck_conv.conv3d, F.conv3d)):
        sp = (8,) * nd
        xc, wc = t(2, 16, *sp), t(16, 16, *(3,) * nd)
        xcg, wcg = t(2, 16, *sp, grad=True), t(16, 16, *(3,) * nd, grad=True)
        cases[f"conv.conv{nd}d 2x16x{'x'.join(map(str, sp))} k3"] = (
            lambda xc=xc, wc=wc, conv=conv: conv(xc, wc, padding=1),
            lambda xc=xc, wc=wc, tconv=tconv: tconv(xc, wc, padding=1), False)
        cases[f"conv.conv{nd}d 2x16x{'x'.join(map(str, sp))} k3 fwd+bwd"] = (
            fb(lambda xcg=xcg, wcg=wcg, conv=conv: conv(xcg, wcg, padding=1), xcg, wcg),
            fb(lambda xcg=xcg, wcg=wcg, tconv=tconv: tconv(xcg, wcg, padding=1), xcg, wcg), True)
    xl, wl = t(2, 16, 8, 8).to(memory_format=cl), t(16, 16, 3, 3).to(memory_format=cl)
    xlg = t(2, 16, 8, 8).to(memory_format=cl).requires_grad_()
    wlg = t(16, 16, 3, 3).to(memory_format=cl).requires_grad_()
    cases["conv.conv2d 2x16x8x8 k3 channels_last"] = (lambda: ck_conv.conv2d(xl, wl, padding=1),
                                                      lambda: F.conv2d(xl, wl, padding=1), False)
    cases["conv.conv2d 2x16x8x8 k3 channels_last fwd+bwd"] = (
        fb(lambda: ck_conv.conv2d(xlg, wlg, padding=1), xlg, wlg), fb(lambda: F.conv2d(xlg, wlg, padding=1), xlg, wlg), True)

    sdpa = F.scaled_dot_product_attention
    q, k, v = t(1, 8, 128, 64), t(1, 8, 128, 64), t(1, 8, 128, 64)
    qg, kg, vg = (t(1, 8, 128, 64, grad=True) for _ in range(3))
    cases["fmha.attention S128 D64"] = (lambda: ck_fmha.attention(q, k, v), lambda: sdpa(q, k, v), False)
    cases["fmha.attention S128 D64 fwd+bwd"] = (fb(lambda: ck_fmha.attention(qg, kg, vg), qg, kg, vg),
                                                fb(lambda: sdpa(qg, kg, vg), qg, kg, vg), True)
    qs, ks, vs = (t(1, 128, 8, 64) for _ in range(3))       # FlashAttention's [B, S, H, D]
    qsg, ksg, vsg = (t(1, 128, 8, 64, grad=True) for _ in range(3))
    tr = lambda x: x.transpose(1, 2)   # noqa: E731
    cases["flash_attn_func S128 D64 causal"] = (
        lambda: fa.flash_attn_func(qs, ks, vs, causal=True),
        lambda: tr(sdpa(tr(qs), tr(ks), tr(vs), is_causal=True)), False)
    cases["flash_attn_func S128 D64 causal fwd+bwd"] = (
        fb(lambda: fa.flash_attn_func(qsg, ksg, vsg, causal=True), qsg, ksg, vsg),
        fb(lambda: tr(sdpa(tr(qsg), tr(ksg), tr(vsg), is_causal=True)), qsg, ksg, vsg), True)
    cu = torch.tensor([0, 64, 128], dtype=torch.int32, device=dev)
    qv, kv_, vv = (t(128, 8, 64) for _ in range(3))
    qvg, kvg, vvg = (t(128, 8, 64, grad=True) for _ in range(3))
    two = lambda x: x.view(2, 64, 8, 64).transpose(1, 2)   # noqa: E731 - the two sequences as a batch
    cases["flash_attn_varlen_func 2x64 D64"] = (
        lambda: fa.flash_attn_varlen_func(qv, kv_, vv, cu, cu, 64, 64),
        lambda: sdpa(two(qv), two(kv_), two(vv)), False)
    cases["flash_attn_varlen_func 2x64 D64 fwd+bwd"] = (
        fb(lambda: fa.flash_attn_varlen_func(qvg, kvg, vvg, cu, cu, 64, 64), qvg, kvg, vvg),
        fb(lambda: sdpa(two(qvg), two(kvg), two(vvg)), qvg, kvg, vvg), True)

    # decoding: 4 sequences x 200 keys, 8 heads, D128, one query each
    qd = t(4, 8, 1, 128)
    kd, vd = t(4, 8, 200, 128), t(4, 8, 200, 128)
    lens = torch.full((4,), 200, dtype=torch.int32, device=dev)
    cases["fmha.decode.splitkv_decode 4x200 keys"] = (
        lambda: ck_fmha.decode.splitkv_decode(qd, kd, vd), lambda: sdpa(qd, kd, vd), False)
    page = 16
    pages = -(-200 // page)
    kc, vc = t(4 * pages, page, 8, 128), t(4 * pages, page, 8, 128)
    table = torch.arange(4 * pages, dtype=torch.int32, device=dev).view(4, pages)
    cases["fmha.decode.paged_decode 4x200 keys"] = (
        lambda: ck_fmha.decode.paged_decode(qd, kc, vc, table, lens), lambda: sdpa(qd, kd, vd), False)
    kcache, vcache = t(4, 8, 256, 128), t(4, 8, 256, 128)
    kn, vn = t(4, 8, 1, 128), t(4, 8, 1, 128)
    pos = torch.full((4,), 100, dtype=torch.int32, device=dev)
    where = torch.tensor([100], device=dev)
    cases["fmha.decode.appendkv 4x1 new keys"] = (
        lambda: ck_fmha.decode.appendkv(qd, kn, vn, kcache, vcache, pos),
        lambda: (kcache.index_copy_(2, where, kn), vcache.index_copy_(2, where, vn)), False)
    qp = t(2 * 32, 8, 128)
    cup = torch.tensor([0, 32, 64], dtype=torch.int32, device=dev)
    table2 = table[:2]
    lens2 = lens[:2]
    qpb = t(2, 8, 32, 128)
    cases["fmha.prefill.batch_prefill 2x32 q, 200 paged keys"] = (
        lambda: ck_fmha.prefill.batch_prefill(qp, kc, vc, lens2, cu_seqlens_q=cup, max_seqlen_q=32,
                                              max_seqlen_k=200, block_table=table2),
        lambda: sdpa(qpb, kd[:2], vd[:2]), False)
    if only:
        cases = {n: c for n, c in cases.items() if any(s in n for s in only)}
    return cases


def _per_call(fn, calls: int, sync, warmup: int = 10) -> dict:
    """us per call: host (issuing ``calls`` calls), wall (with the final sync); median of 5 rounds
    after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    sync()
    host, wall = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        host.append((t1 - t0) / calls * 1e6)
        wall.append((t2 - t0) / calls * 1e6)
    return {"host_us": round(statistics.median(host), 2), "wall_us": round(statistics.median(wall), 2)}


def _compiled(fn, grad: bool):
    """``fn`` under torch.compile(mode="reduce-overhead") (CUDA graphs); a fwd+bwd case compiles its
    forward-and-backward closure whole (compiled autograd is not asked for: the backward graph is AOT's)."""
    import torch

    c = torch.compile(fn, mode="reduce-overhead")

    def call():
        torch.compiler.cudagraph_mark_step_begin()
        return c()
    return call


#: the cases whose torch.compile(mode="reduce-overhead") columns the default table measures (a compile
#: takes seconds: every case would pass the ~3 minutes the table is meant to take; --compile-all for all)
COMPILED = ("gemm.matmul 64^3", "gemm.matmul 64^3 fwd+bwd", "gemm.linear 64x64 -> 128, bias",
            "conv.conv2d 2x16x8x8 k3 channels_last", "conv.conv2d 2x16x8x8 k3 channels_last fwd+bwd",
            "fmha.attention S128 D64", "fmha.attention S128 D64 fwd+bwd", "flash_attn_func S128 D64 causal",
            "fmha.decode.paged_decode 4x200 keys")


def table(calls: int, only=None, compile_too: bool = True, compile_all: bool = False) -> dict:
    """The issue's table on the GPU: per public API and case, eager us/call of ck and of torch's
    equivalent call, their ratio, and (``compile_too``) both under torch.compile(mode="reduce-overhead")
    for the cases of :data:`COMPILED` (every case with ``compile_all``)."""
    import torch

    sync = torch.cuda.synchronize
    rows = {}
    for name, (ours, theirs, grad) in api_cases("cuda", only).items():
        row = {"grad": grad}
        for label, fn in (("ck", ours), ("torch", theirs)):
            try:
                row[label] = _per_call(fn, calls, sync)
            except Exception as e:  # noqa: BLE001 - one case failing must not lose the others
                row[label] = {"error": f"{type(e).__name__}: {e}"[:400]}
        if "wall_us" in row["ck"] and "wall_us" in row["torch"]:
            row["ratio_wall"] = round(row["ck"]["wall_us"] / row["torch"]["wall_us"], 2)
        if compile_too and (compile_all or name in COMPILED):
            for label, fn in (("ck_compiled", ours), ("torch_compiled", theirs)):
                try:
                    row[label] = _per_call(_compiled(fn, grad), max(calls // 4, 20), sync)
                except Exception as e:  # noqa: BLE001
                    row[label] = {"error": f"{type(e).__name__}: {e}"[:400]}
            if "wall_us" in row["ck_compiled"] and "wall_us" in row["torch_compiled"]:
                row["ratio_compiled_wall"] = round(row["ck_compiled"]["wall_us"] / row["torch_compiled"]["wall_us"],
                                                   2)
        rows[name] = row
        print(name, json.dumps(row), flush=True)
    return rows


class _StubReplay:
    """A recorded launch that launches nothing (``--part cpu``)."""

    def __init__(self, fn, args, kwargs):
        names = list(fn.arg_names)
        self.names, self.args = tuple(names), list(args) + [kwargs.get(n) for n in names[len(args):]]
        self._name = getattr(fn, "__name__", "?")

    def __call__(self, args):
        pass

    def slot(self, name):
        return self.names.index(name)


def _stub_launches(put=setattr):
    """Route CPU tensors as GPU ones would go (recorded replays) and launch nothing.  ``put``: how the
    module attributes are replaced (tests pass ``monkeypatch.setattr``)."""
    from ck_core.backends import triton_artifacts as ta
    from ck_core.backends import triton_replay

    put(ta, "launch", lambda name, fn, grid, args, kwargs, **kw: None)
    put(triton_replay, "replayable", lambda t: True)
    put(triton_replay, "record", lambda fn, grid, args, kwargs, **kw: _StubReplay(fn, args, kwargs))
    from ck_fmha.backends.triton import warm as fmha_warm

    put(fmha_warm, "verified", lambda f, inputs, want: f)   # stubbed launches compute nothing to compare


def launch_counts(dev: str = "cuda", only=None, warmup: int = 3) -> dict:
    """What one warm call of each case of :func:`api_cases` runs (``--part launches``; issue #26: GPU
    wall time ~ launches x 4-6 us + the host path): the Triton launches (``replayed``: a recorded launch
    replayed; ``jit``: through Triton's binder or the kernel cache, i.e. not warm), their kernels, the
    torch operations (on a GPU the ones that write memory launch kernels of their own: ``zeros``,
    ``sum``, ``copy_`` ...) and how many Problems were built and selections / plans made (a warm call:
    none).  On the CPU run it after :func:`_stub_launches`."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from triton.runtime.jit import JITFunction

    from ck_core.backends import triton_artifacts as ta
    from ck_core.backends import triton_replay
    from ck_core.dispatcher import Dispatcher
    from ck_fmha.problem import FmhaProblem
    from ck_gemm.problem import GemmProblem

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    seen: dict = {"replayed": [], "jit": [], "problems": 0, "selects": 0}
    real = {"replay": triton_replay.Replay.__call__, "stub": _StubReplay.__call__, "run": JITFunction.run,
            "launch": ta.launch, "select": Dispatcher.select, "plan": Dispatcher.plan,
            "gemm": GemmProblem.__init__, "fmha": FmhaProblem.__init__}

    def replayed(self, args):
        seen["replayed"].append(getattr(getattr(self, "kernel", None), "name", None) or getattr(self, "_name", "?"))
        return (real["replay"] if isinstance(self, triton_replay.Replay) else real["stub"])(self, args)

    def jit(self, *args, grid, warmup, **kwargs):
        if not warmup:
            seen["jit"].append(self.__name__)
        return real["run"](self, *args, grid=grid, warmup=warmup, **kwargs)

    def launched(name, fn, grid, args, kwargs, **kw):
        seen["jit"].append(getattr(fn, "__name__", name))
        return real["launch"](name, fn, grid, args, kwargs, **kw)

    def counted(what, key):
        def f(*a, **k):
            seen[key] += 1
            return real[what](*a, **k)
        return f

    rows = {}
    cases = api_cases(dev, only)
    for name, (call, _, grad) in cases.items():
        try:
            for _ in range(warmup):
                call()
            seen.update(replayed=[], jit=[], problems=0, selects=0)
            triton_replay.Replay.__call__, _StubReplay.__call__ = replayed, replayed
            JITFunction.run, ta.launch = jit, launched
            Dispatcher.select, Dispatcher.plan = counted("select", "selects"), counted("plan", "selects")
            GemmProblem.__init__, FmhaProblem.__init__ = counted("gemm", "problems"), counted("fmha", "problems")
            try:
                with Ops() as ops:
                    call()
            finally:
                triton_replay.Replay.__call__, _StubReplay.__call__ = real["replay"], real["stub"]
                JITFunction.run, ta.launch = real["run"], real["launch"]
                Dispatcher.select, Dispatcher.plan = real["select"], real["plan"]
                GemmProblem.__init__, FmhaProblem.__init__ = real["gemm"], real["fmha"]
            rows[name] = {"grad": grad, "launches": len(seen["replayed"]) + len(seen["jit"]),
                          "replayed": list(seen["replayed"]), "jit": list(seen["jit"]),
                          "torch_ops": ops.ops, "problems": seen["problems"], "selects": seen["selects"]}
        except Exception as e:  # noqa: BLE001 - one case failing must not lose the others
            rows[name] = {"grad": grad, "error": f"{type(e).__name__}: {e}"[:500]}
        print(name, json.dumps(rows[name]), flush=True)
    return rows


def cpu_dry_run(calls: int, only=None) -> dict:
    """Warm host us/call of every public API's case of :func:`api_cases` on CPU tensors with every
    Triton launch stubbed (forward and forward+backward): the host path above the launch."""
    os.environ.setdefault("CK_BACKEND", "triton")
    os.environ.setdefault("CK_CPU_ARCH", "sm90")   # the H200's arch: its registries, plans and launchers
    _stub_launches()
    rows = {}
    for name, (call, _, grad) in api_cases("cpu", only).items():
        try:
            rows[name] = {"grad": grad, "ck": _per_call(call, calls, lambda: None)}
            rows[name]["ck"].pop("wall_us")
            best = []
            for _ in range(5):   # a shared CPU: the least of 5 rounds is the least disturbed
                t0 = time.perf_counter()
                for _ in range(calls):
                    call()
                best.append((time.perf_counter() - t0) / calls * 1e6)
            rows[name]["ck"]["min_us"] = round(min(best), 2)
        except Exception as e:  # noqa: BLE001 - one case failing must not lose the others
            rows[name] = {"grad": grad, "error": f"{type(e).__name__}: {e}"[:500]}
        print(name, json.dumps(rows[name]), flush=True)
    return rows


CHILD = r'''
import json, sys, time
import torch, triton
from triton import knobs
import ck_gemm, ck_conv, ck_fmha, ck_fmha.decode
from ck_core.plugins import get_manager
from ck_core.testing import DispatchLog
from ck_core.backends import triton_artifacts as ta
compiles = []
knobs.compilation.listener = lambda **kw: None if kw.get("cache_hit") else compiles.append(1)
log = DispatchLog()
get_manager().pm.register(log)
torch.randn(8, device="cuda"); torch.cuda.synchronize()
t0 = time.perf_counter()
out = EXPR
torch.cuda.synchronize()
ms = (time.perf_counter() - t0) * 1e3
print("RESULT" + json.dumps({"ms": round(ms, 1), "triton_compiles": len(compiles), "artifacts": dict(ta.STATS),
                             "launched": sorted({n for r in log.runs for n in r[2]})}))
'''

BUILD = r'''
import json, sys
from ck_core import Registry
from ck_core.build import build_registry
from ck_core.key import KernelKey
keys = [KernelKey.from_name(n) for n in json.loads(sys.argv[1])]
rep = build_registry(Registry(keys[0].arch, keys), progress=False)
print("RESULT" + json.dumps({"built": len(rep.built), "failed": rep.failed, "seconds": round(rep.seconds, 1)}))
'''


def _child(code, env, *args):
    r = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=400)
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT")]
    if not lines:
        return {"error": r.stderr[-1500:]}
    return json.loads(lines[-1][6:])


def first_call(cases=None) -> dict:
    """Each case cold in a fresh process; then one ``ck build`` of every key the cold calls
    launched, into one kernel cache; then each case again in a fresh process on that cache
    (each process with its own empty Triton cache)."""
    out = {}
    cases = {n: e for n, e in FIRST.items() if cases is None or n in cases}
    with tempfile.TemporaryDirectory() as tmp:
        def env(tag, ck="cold"):
            e = dict(os.environ, CK_CACHE_DIR=os.path.join(tmp, "ck_" + ck),
                     TRITON_CACHE_DIR=os.path.join(tmp, f"triton_{tag}_{time.time_ns()}"))
            e.pop("TRITON_INTERPRET", None)
            return e
        launched = set()
        for i, (op, expr) in enumerate(cases.items()):
            cold = _child(CHILD.replace("EXPR", expr), env(f"cold{i}", f"cold{i}"))
            out[op] = {"problem": expr, "cold": cold}
            launched |= set(cold.get("launched", ()))
            print(op, "cold", json.dumps(cold), flush=True)
        out["ck_build"] = _child(BUILD, env("build", "built"), json.dumps(sorted(launched)))
        print("ck build", json.dumps(out["ck_build"]), flush=True)
        for i, (op, expr) in enumerate(cases.items()):
            out[op]["built"] = _child(CHILD.replace("EXPR", expr), env(f"built{i}", "built"))
            print(op, "built", json.dumps(out[op]["built"]), flush=True)
    return out


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=20,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--calls", type=int, default=None,
                    help="calls per timing round (default 200 for the table, 1000 for the other parts)")
    ap.add_argument("--part", nargs="+", choices=["table", "all", "overhead", "first", "cpu", "autograd", "launches"],
                    default=["table"], help="table (default): the issue's per-API table; all: overhead + first")
    ap.add_argument("--only", nargs="*", metavar="TEXT", help="cases whose name contains one of these")
    ap.add_argument("--no-compile", action="store_true", help="table: skip the torch.compile columns")
    ap.add_argument("--compile-all", action="store_true",
                    help="table: the torch.compile columns for every case (default: the cases of COMPILED)")
    ap.add_argument("--profile", metavar="DIR", help="cProfile each warm API call into DIR (after timing it)")
    ap.add_argument("--first", nargs="*", metavar="CASE", help=f"first-call cases (default all: {', '.join(FIRST)})")
    ns = ap.parse_args(argv)
    if "cpu" in ns.part:   # the interpreter's functions carry the argument names the stubs need
        os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import triton

    cpu = "cpu" in ns.part
    res = {"name": "ck.overhead", "version": 2,
           "device": "cpu (launches stubbed)" if cpu else torch.cuda.get_device_name(0),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "command": "python benchmarks/overhead.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "commit": _commit(), "versions": {"torch": torch.__version__, "triton": triton.__version__},
           "unit": "us/call (first_call: ms)"}
    if cpu:
        res["table"] = cpu_dry_run(ns.calls or 300, ns.only)
        if "launches" in ns.part:   # (the stubs are in place)
            res["launches"] = launch_counts("cpu", ns.only)
    else:
        if "launches" in ns.part:
            res["launches"] = launch_counts("cuda", ns.only)
        if "table" in ns.part:
            res["table"] = table(ns.calls or 200, ns.only, not ns.no_compile, ns.compile_all)
        if {"all", "first"} & set(ns.part):
            res["first_call"] = first_call(ns.first)
        if {"all", "overhead"} & set(ns.part):
            res["overhead"] = overhead(ns.calls or 1000, ns.profile, ns.only)
        if "autograd" in ns.part:
            res["autograd"] = autograd_parts(ns.calls or 1000, ns.profile)
    from ck_core.bench import with_header   # the results header (schema, device, date, command, commit)

    res.pop("commit", None)
    res = with_header(res, res.get("command"), res.get("device"))
    with open(ns.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
