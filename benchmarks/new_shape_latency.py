"""New shapes of known kernel families through the public APIs: what a call of a new size costs on
the host and the device, and whether it compiles.  One script, three parts, one result schema.

    python benchmarks/new_shape_latency.py --part first --out OUT.json [--preset NAME]      # GPU
    python benchmarks/new_shape_latency.py --part growing --out OUT.json                    # GPU, < 1 minute
    python benchmarks/new_shape_latency.py --part growing host --device cpu --out OUT.json  # no GPU

``--part first`` (default): in a fresh process with an empty kernel cache (``CK_CACHE_DIR`` in a
temporary folder, ``CK_KERNEL_SETS=none``): for each op, the shapes of one family (same dtype, head
dim / layout / filter; only sizes change: batch, heads, sequence lengths, M, odd and unit sizes) are
called one after another through ``ck_fmha.attention`` (forward and backward), ``ck_gemm.matmul`` and
``ck_conv.conv2d``.  Per call: wall time of the first call (synchronised), the kernels compiled /
loaded (``triton_artifacts.STATS``), the keys the Dispatcher ran, and the relative error against
torch in float64 (each call's output checked: an unspecialised kernel must stay correct).  With
kernels specialised on sizes, every new shape of a known key compiled again (seconds); now a new
shape of a key already loaded compiles nothing.  ``--preset NAME``: run ``ck build --preset NAME``
into the empty cache first (reported: its time), then the calls.  ``--device cpu``: a smoke run
(Triton's interpreter, tiny shapes).

``--part growing`` (issues #26 / #27: a decode loop's every step is a new shape): in a warm process,
loops whose every call has a new size of one signature family -- dense decode through
``flash_attn_func`` (q [8, 1, 16, 128], the key length growing by one, as transformers' KV cache
does), varlen decode, causal prefill through ``ck_fmha.attention`` (the length growing),
``ck_gemm.matmul`` (M growing).  Per case: median us of a call of a new size (synchronised) against
a repeat of that same call (warm), the Dispatchers' full selections and selection-family hits, the
output's error against float64 every few steps; then the same loops on fresh sizes with selection
families off (``family_off``: what a new size cost before).  ``--device cpu``: the sm90 host path on
CPU tensors with every launch stubbed (overhead.py's stubs; errors not checked).

``--part host`` (always on the CPU, was ``first_call_host.py``; issue #27's target: a new shape costs
<= 5 ms over a warm call, of which selection <= 1 ms, ``select_time.py fmha``): FlashAttention's
public functions (``ck_fmha.flash_attn``) run their GPU path on meta tensors as on an sm90 GPU
(``fa_trace.py``'s set-up): the Problem, selection, the plan, the launchers' argument work and each
launch's specialisation (Triton's binder under the kernels' policy, the in-process lookup of the
loaded kernel) run; the kernel launch itself and a kernel's first load from the cache (once per
specialisation per process) do not.  Each family (dtype, head dim, mask, ALiBi, dropout, GQA) is
warmed with one shape, then called with ``--shapes`` new batch sizes and lengths: the wall and
thread-CPU ms of that first forward and of its backward, beside the family's warm call.

Several parts run each in a process of its own (each sets its process up its own way: an empty
cache, stubbed launches, meta tensors) and land in one file.  The file, one schema for every part:
the results header (``ck_core.bench.with_header``: schema, device, date, command, commit),
``"parts"`` (the parts run) and one object per part under its name, each with its ``"device"``:

* ``first``: ``rows`` [{call, first_call_s, rel_err, compiled, loaded, keys}], ``stats`` (the
  process's ``triton_artifacts.STATS``), ``preset`` {name, keys, seconds, failed} with ``--preset``;
* ``growing``: ``unit``, ``family_on`` / ``family_off``: {case: {new_us, warm_us, new_over_warm_us,
  new_sizes, full_selections, family_hits, max_rel_err} or {error}};
* ``host``: ``what``, ``unit``, ``shapes``, ``fwd_ms`` / ``fwd_cpu_ms`` / ``bwd_ms`` / ``bwd_cpu_ms``
  / ``warm_fwd_cpu_ms`` / ``warm_bwd_cpu_ms`` ({median, p90, max} over the new shapes),
  ``specialisations`` (the launch specialisations seen), ``rows`` [{family, shape, fwd_ms,
  fwd_cpu_ms, bwd_ms, bwd_cpu_ms, warm_fwd_cpu_ms, warm_bwd_cpu_ms}];
* a part whose process failed: {error}.

``results/compile/first_call_host_cpu.json`` predates the fold (``first_call_host.py``, now
``--part host``): it holds the ``host`` object's fields at its top level.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _growing_cases(dev: str, steps: int, start: int):
    """name -> (call of size index i, float64 reference of that call or None): zero-argument callables
    per step, inputs made before the timing."""
    import torch

    import ck_fmha
    import ck_fmha.flash_attn as fa
    import ck_gemm

    h = torch.float16
    g = torch.Generator(device="cpu").manual_seed(7)

    def t(*shape):
        return torch.randn(*shape, generator=g).to(device=dev, dtype=h)

    def sdpa64(q, k, v, causal):   # [B, S, H, D] float64, GQA by repetition, bottom-right causal
        q, k, v = (x.double().transpose(1, 2) for x in (q, k, v))
        k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
        s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
        if causal:
            sq, sk = s.shape[-2:]
            s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril(sk - sq).logical_not(),
                              float("-inf"))
        return (torch.softmax(s, -1) @ v).transpose(1, 2)

    cases = {}
    q1 = t(8, 16, 1, 128).transpose(1, 2)   # transformers' [B, H, S, D] views as [B, S, H, D]
    dense = [(t(8, 4, s, 128).transpose(1, 2), t(8, 4, s, 128).transpose(1, 2)) for s in range(start, start + steps)]
    cases["flash_attn_func decode B8 H16/4 D128, keys +1 per call"] = (
        lambda i: fa.flash_attn_func(q1, *dense[i], causal=True), lambda i: sdpa64(q1, *dense[i], True))
    qv = t(8, 16, 128)
    cq = torch.arange(0, 9, dtype=torch.int32, device=dev)
    var = []
    for s in range(start, start + steps):
        var.append((t(8 * s, 4, 128), t(8 * s, 4, 128), torch.arange(0, 9 * s, s, dtype=torch.int32, device=dev), s))

    def varlen(i):
        k, v, ck, s = var[i]
        return fa.flash_attn_varlen_func(qv, k, v, cq, ck, 1, s, causal=True)

    def varlen_ref(i):
        k, v, _, s = var[i]
        return sdpa64(qv.view(8, 1, 16, 128), k.view(8, s, 4, 128), v.view(8, s, 4, 128), True).reshape(8, 16, 128)
    cases["flash_attn_varlen_func decode 8 seqs H16/4 D128, keys +1 per call"] = (varlen, varlen_ref)
    pre = [tuple(t(2, s, 8, 64) for _ in range(3)) for s in range(start, start + steps)]
    cases["ck_fmha.attention prefill B2 H8 D64 causal, length +1 per call"] = (
        lambda i: ck_fmha.attention(*pre[i], causal=True, layout="bshd"), lambda i: sdpa64(*pre[i], True))
    w = t(512, 1024) / 32
    xs = [t(m, 1024) for m in range(start, start + steps)]
    cases["ck_gemm.matmul M x 1024 x 512, M +1 per call"] = (
        lambda i: ck_gemm.matmul(xs[i], w.t()), lambda i: xs[i].double() @ w.double().t())
    return cases


def growing(dev: str, steps: int = 48) -> dict:
    """``--part growing``: see the module's docstring."""
    import statistics

    import torch

    from ck_core import api as core
    from ck_core.dispatcher import Dispatcher

    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    check = dev != "cpu"

    def counters():
        ds = list(core._DISPATCHERS.values())
        return sum(d.selections for d in ds), sum(d.family_hits for d in ds)

    out = {}
    for label, start in (("family_on", 200), ("family_off", 200 + 2 * steps)):
        family = Dispatcher._family
        if label == "family_off":
            Dispatcher._family = lambda self, problem, op: None
        try:
            for name, (call, ref) in _growing_cases(dev, steps, start).items():
                row = {"new_us": [], "warm_us": [], "max_rel_err": 0.0}
                try:
                    call(0)   # the family's first size: selected (and compiled) outside the timing
                    sync()
                    sel0, hit0 = counters()
                    for i in range(1, steps):
                        sync()
                        t0 = time.perf_counter()
                        y = call(i)
                        sync()
                        row["new_us"].append((time.perf_counter() - t0) * 1e6)
                        t0 = time.perf_counter()
                        call(i)
                        sync()
                        row["warm_us"].append((time.perf_counter() - t0) * 1e6)
                        if check and i % 8 == 1:
                            row["max_rel_err"] = max(row["max_rel_err"], _rel(y, ref(i)))
                    sel, hit = counters()
                    row = {"new_us": round(statistics.median(row["new_us"]), 1),
                           "warm_us": round(statistics.median(row["warm_us"]), 1),
                           "new_over_warm_us": round(statistics.median(row["new_us"]) - statistics.median(row["warm_us"]), 1),
                           "new_sizes": steps - 1, "full_selections": sel - sel0, "family_hits": hit - hit0,
                           "max_rel_err": row["max_rel_err"] if check else None}
                except Exception as e:  # noqa: BLE001 - one case failing must not lose the others
                    row = {"error": f"{type(e).__name__}: {e}"[:400]}
                out.setdefault(label, {})[name] = row
                print(label, name, json.dumps(row), flush=True)
        finally:
            Dispatcher._family = family
    return out


def first(dev: str, preset=None, arch: str = "sm90") -> dict:
    """``--part first``: see the module's docstring (the process's cache is made empty first)."""
    os.environ["CK_CACHE_DIR"] = tempfile.mkdtemp(prefix="ck-new-shape-")
    os.environ["CK_KERNEL_SETS"] = "none"
    if dev == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")

    import torch

    import ck_conv
    import ck_fmha
    import ck_gemm
    from ck_core.backends import triton_artifacts as ta
    from ck_core.hookspecs import hookimpl
    from ck_core.plugins import get_manager

    runs = []

    class _Log:   # the kernels each call launched
        @hookimpl
        def ck_after_run(self, launched):
            runs.append(list(launched))

    get_manager().pm.register(_Log(), name="new-shape-latency-log")

    small = dev == "cpu"
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    out = {"device": torch.cuda.get_device_name() if dev == "cuda" else dev, "rows": []}
    if preset:
        from ck_core import presets

        t0 = time.perf_counter()
        rep, sel, keys = presets.build(preset, arch)
        out["preset"] = {"name": preset, "keys": len(keys), "seconds": round(time.perf_counter() - t0, 1),
                         "failed": len(rep.failed)}
    g = torch.Generator(device=dev).manual_seed(1234)

    def timed(name, fn, ref):
        before = dict(ta.STATS)
        n_runs = len(runs)
        sync()
        t0 = time.perf_counter()
        got = fn()
        sync()
        secs = time.perf_counter() - t0
        err = _rel(got, ref()) if ref is not None else None
        row = {"call": name, "first_call_s": round(secs, 4), "rel_err": err,
               "compiled": ta.STATS["compiled"] - before["compiled"], "loaded": ta.STATS["loaded"] - before["loaded"],
               "keys": [k for r in runs[n_runs:] for k in r]}
        out["rows"].append(row)
        print(json.dumps(row), flush=True)

    # attention: fp16, head dim 64, causal; only sizes change (odd lengths, one head, batch 1, GQA)
    shapes = ((1, 2, 2, 40), (1, 1, 1, 17)) if small else (
        (2, 16, 16, 1024), (1, 8, 8, 1000), (3, 1, 1, 77), (4, 32, 8, 2048), (1, 16, 16, 4097), (5, 12, 12, 333))
    for b, hq, hk, s in shapes:
        q = torch.randn(b, hq, s, 64, device=dev, dtype=torch.float16, generator=g, requires_grad=True)
        k = torch.randn(b, hk, s, 64, device=dev, dtype=torch.float16, generator=g, requires_grad=True)
        v = torch.randn(b, hk, s, 64, device=dev, dtype=torch.float16, generator=g, requires_grad=True)
        do = torch.randn(b, hq, s, 64, device=dev, dtype=torch.float16, generator=g)

        def ref_o(q=q, k=k, v=v, hq=hq, hk=hk):
            kk, vv = (x.detach().double().repeat_interleave(hq // hk, dim=1) for x in (k, v))
            return torch.nn.functional.scaled_dot_product_attention(q.detach().double(), kk, vv, is_causal=True)

        holder = {}

        def fwd(q=q, k=k, v=v):
            holder["o"] = ck_fmha.attention(q, k, v, causal=True)
            return holder["o"].detach()

        timed(f"attention fwd b{b} h{hq}/{hk} s{s} d64 causal", fwd, ref_o)

        def bwd(q=q, do=do):
            holder["o"].backward(do)
            return q.grad.detach()

        def ref_dq(q=q, k=k, v=v, do=do, hq=hq, hk=hk):
            qq = q.detach().double().requires_grad_(True)
            kk, vv = (x.detach().double().repeat_interleave(hq // hk, dim=1) for x in (k, v))
            torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, is_causal=True).backward(do.double())
            return qq.grad

        timed(f"attention bwd b{b} h{hq}/{hk} s{s} d64 causal", bwd, ref_dq)

    # GEMM: bf16 x @ W^T (rcr), N and K of a model; M token counts (1, odd, large)
    nk = 64 if small else 4096
    gdt = torch.float16 if small else torch.bfloat16   # (the CPU interpreter computes bf16 dots wrongly)
    w = torch.randn(nk, nk, device=dev, dtype=gdt, generator=g) / 64
    for m in ((16, 1, 7) if small else (512, 1, 7, 1000, 4096, 333)):
        x = torch.randn(m, nk, device=dev, dtype=gdt, generator=g)
        timed(f"matmul {gdt} rcr {m}x{nk}x{nk}", lambda x=x: ck_gemm.matmul(x, w.t()),
              lambda x=x: x.double() @ w.double().t())

    # conv: fp16 channels-last 3x3 pad 1, 64 -> 64 channels; batch and image size change
    wc = torch.randn(64, 64, 3, 3, device=dev, dtype=torch.float16, generator=g) / 24
    for n, hw in (((1, 5), (1, 6)) if small else ((8, 56), (1, 57), (3, 28), (16, 14), (2, 100))):
        x = torch.randn(n, 64, hw, hw, device=dev, dtype=torch.float16, generator=g).to(memory_format=torch.channels_last)
        timed(f"conv2d fp16 N{n} 64->64 {hw}x{hw} 3x3", lambda x=x: ck_conv.conv2d(x, wc, padding=1),
              lambda x=x: torch.nn.functional.conv2d(x.double(), wc.double(), padding=1))

    out["stats"] = dict(ta.STATS)
    return out


def growing_part(dev: str, steps: int) -> dict:
    """``--part growing`` with its process set up (``--device cpu``: launches stubbed)."""
    if dev == "cpu":   # the sm90 host path, launches stubbed (overhead.py --part cpu's stubs)
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ.setdefault("CK_BACKEND", "triton")
        os.environ.setdefault("CK_CPU_ARCH", "sm90")
        sys.path.insert(0, HERE)
        import overhead

        overhead._stub_launches()
    import torch

    out = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (launches stubbed)",
           "unit": "us per call (median)"}
    out.update(growing(dev, steps))
    return out


def _host_setup() -> dict:
    """The process as on an sm90 GPU for meta tensors (fa_trace.py's environment): every launch binds
    its arguments and, on a specialisation's first call, builds what the kernel cache would load;
    nothing runs.  Returns the specialisations seen."""
    sys.path.insert(0, HERE)
    import fa_trace

    fa_trace._env()
    from triton.backends.compiler import GPUTarget

    from ck_core import device as ck_device
    from ck_core.backends import triton_artifacts as ta
    from ck_core.backends import triton_backend

    target = GPUTarget("cuda", 90, 32)
    ta.current_target = lambda: target
    triton_backend._device_target = lambda: ("cuda", 90)
    real = ck_device.device_target
    ck_device.device_target = lambda d: ("cuda", 90) if getattr(d, "type", str(d)) == "meta" else real(d)
    loaded = {}

    def launch(name, fn, grid, args, kwargs, cache_root=None, extra=None):
        """kernel_for_call up to the launch: the binder always, the specialisation's material on a miss."""
        kw = ta._jit_kwargs(fn, kwargs, extra)
        bound, spec, opts = ta._bind(fn, target, args, kw)
        memo = (name, fn, str(spec), str(opts))
        if memo not in loaded:
            loaded[memo] = ta.specialise(fn, args, kwargs, target, extra)
        return None

    ta.launch = launch
    return loaded


def host(shapes: int = 40, seed: int = 0) -> dict:
    """``--part host``: see the module's docstring."""
    import random
    import statistics

    loaded = _host_setup()
    import torch

    from ck_fmha.flash_attn import flash_attn_func

    rng = random.Random(seed)
    families = [(torch.bfloat16, 128, True, False, 0.0, 8), (torch.float16, 64, False, False, 0.0, 8),
                (torch.bfloat16, 96, True, True, 0.0, 2), (torch.float16, 59, False, False, 0.17, 8),
                (torch.bfloat16, 256, True, False, 0.0, 1)]

    def call(dt, d, causal, alibi, p, hk, b, sq, sk):
        q = torch.empty(b, sq, 8, d, dtype=dt, device="meta", requires_grad=True)
        k = torch.empty(b, sk, hk, d, dtype=dt, device="meta", requires_grad=True)
        v = torch.empty(b, sk, hk, d, dtype=dt, device="meta", requires_grad=True)
        slopes = torch.empty(b, 8, dtype=torch.float32, device="meta") if alibi else None
        t0, c0 = time.perf_counter(), time.thread_time()
        o = flash_attn_func(q, k, v, p, causal=causal, alibi_slopes=slopes)
        t1, c1 = time.perf_counter(), time.thread_time()
        torch.autograd.grad(o, (q, k, v), torch.empty_like(o))
        t2, c2 = time.perf_counter(), time.thread_time()
        return (t1 - t0, c1 - c0, t2 - t1, c2 - c1)

    rows = []
    for fam in families:
        call(*fam, 2, 1000, 1000)             # the family warm: registry, keys, kernels
        warm = [call(*fam, 2, 1000, 1000) for _ in range(3)]
        for _ in range(shapes):
            b, sq, sk = rng.randint(1, 16), rng.randint(1, 4096), rng.randint(1, 4096)
            if fam[2] and sq > sk:
                sq, sk = sk, sq
            new = call(*fam, b, sq, sk)
            rows.append({"family": f"{str(fam[0])[6:]} d{fam[1]} {'causal' if fam[2] else 'full'}"
                                   f"{' alibi' if fam[3] else ''}{' dropout' if fam[4] else ''} hk{fam[5]}",
                         "shape": [b, sq, sk], "fwd_ms": new[0] * 1e3, "fwd_cpu_ms": new[1] * 1e3,
                         "bwd_ms": new[2] * 1e3, "bwd_cpu_ms": new[3] * 1e3,
                         "warm_fwd_cpu_ms": min(w[1] for w in warm) * 1e3,
                         "warm_bwd_cpu_ms": min(w[3] for w in warm) * 1e3})

    def stats(key):
        xs = sorted(r[key] for r in rows)
        return {"median": round(statistics.median(xs), 3), "p90": round(xs[int(0.9 * len(xs))], 3),
                "max": round(xs[-1], 3)}

    res = {"device": "CPU (host path on meta tensors; no kernel runs)",
           "what": "first call of a new shape of a warm family through flash_attn_func on meta tensors "
                   "(sm90 path, launches specialised not run): host ms, wall and thread CPU",
           "unit": "ms", "shapes": len(rows)}
    res.update({k: stats(k) for k in ("fwd_ms", "fwd_cpu_ms", "bwd_ms", "bwd_cpu_ms", "warm_fwd_cpu_ms",
                                      "warm_bwd_cpu_ms")})
    res.update({"specialisations": len(loaded), "rows": rows})
    print(json.dumps({k: v for k, v in res.items() if k != "rows"}, indent=1), flush=True)
    return res


PARTS = ("first", "growing", "host")


def _run_part(part: str, a) -> dict:
    if part == "first":
        return first(a.device, a.preset, a.arch)
    if part == "growing":
        return growing_part(a.device, a.steps)
    return host(a.shapes, a.seed)


def _in_own_process(part: str, argv: list, folder: str) -> dict:
    """One part run by this script in a fresh process (each part sets its process up its own way)."""
    import subprocess

    path = os.path.join(folder, part + ".json")
    cmd = [sys.executable, os.path.abspath(__file__), "--part", part, "--out", path] + argv
    rc = subprocess.run(cmd, check=False).returncode
    if rc or not os.path.isfile(path):
        return {"error": f"the {part} part's process exited with {rc}"}
    with open(path) as f:
        return json.load(f)[part]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--part", nargs="+", default=["first"], choices=PARTS,
                    help="first (default): new shapes in a fresh process, empty cache; growing: new-size loops, "
                         "warm process; host: new shapes' host cost on meta tensors (CPU). Several: each in "
                         "its own process, one file")
    ap.add_argument("--steps", type=int, default=48, help="growing: new sizes per loop")
    ap.add_argument("--shapes", type=int, default=40, help="host: new shapes per family")
    ap.add_argument("--seed", type=int, default=0, help="host: the seed of the new shapes")
    ap.add_argument("--preset", default=None, help="first: build this preset into the empty cache first")
    ap.add_argument("--arch", default="sm90", help="--preset: the arch to build it for (the device's)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: first is a smoke run (Triton's interpreter, tiny shapes), growing stubs the "
                         "launches; host always runs on the CPU")
    a = ap.parse_args(argv)
    parts = list(dict.fromkeys(a.part))
    if len(parts) == 1:
        res = {parts[0]: _run_part(parts[0], a)}
    else:
        argv = list(sys.argv[1:] if argv is None else argv)
        shared = []   # the options but --part and --out, for each part's process
        skip = False
        for x in argv:
            if x.startswith("--"):
                skip = x.split("=")[0] in ("--part", "--out")
            if not skip:
                shared.append(x)
        with tempfile.TemporaryDirectory(prefix="ck-new-shape-parts-") as folder:
            res = {p: _in_own_process(p, shared, folder) for p in parts}
    from ck_core.bench import with_header   # the results header (schema, device, date, command, commit)

    devices = list(dict.fromkeys(str(r.get("device", "?")) for r in res.values()))
    out = with_header({"parts": parts, **res}, "python benchmarks/new_shape_latency.py " + " ".join(
        sys.argv[1:] if argv is None else argv), "; ".join(devices))
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
