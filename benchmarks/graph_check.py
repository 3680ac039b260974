"""CUDA graphs over the public calls on a GPU (issue #26: "torch.compile and CUDA graphs keep working").
Under 2 minutes on one GPU.

(1) ``compile``: ``torch.compile(fn, mode="reduce-overhead")`` (CUDA-graph trees) of matmul, linear + bias,
    conv2d (NCHW and channels-last) and attention, forward and forward+backward, 4 steps on fresh data
    against float64 torch.  The trees refuse a tensor left alive in a graph's pool ("tensor(s) in the
    cudagraph pool not tracked as outputs"): with ``cudagraph_trees_history_recording`` on, the error
    names the Python frames that allocated each leaked tensor (kept in the JSON).
(2) ``capture``: ``torch.cuda.graph`` capture of forward+backward at the sizes whose whole training step
    failed to capture in models.py ("operation failed due to a previous error during capture"): ResNet-50
    convs at batch 64 (stem 7x7 s2, 3x3, 1x1, strided 1x1), Llama-shaped linears (4096 tokens, 2048 ->
    2048 / 5632) and attention (b8, 16 heads, 512 keys, D 128, causal), bf16; each call alone (warm-up on a
    side stream, capture, 2 replays on fresh data vs float64), then all of them in one captured step.
    The error and the tail of its traceback where one fails; a host synchronisation in a warm step
    (``torch.cuda.set_sync_debug_mode("error")``: what capture cannot hold) is named with its frames.

    python benchmarks/graph_check.py --out graph_check.json [--parts compile capture]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback


def _rel(a, b) -> float:
    return float((a.detach().double() - b.detach().double()).norm() / max(b.detach().double().norm(), 1e-30))


def _err(e: BaseException) -> dict:
    return {"error": f"{type(e).__name__}: {e}"[:6000], "traceback": traceback.format_exc()[-3000:]}


def _rand(*shape, dtype=None):
    import torch

    return (torch.rand(*shape, device="cuda") * 2 - 1).to(dtype or torch.float16)


def _small_cases() -> dict:
    """name -> make() -> (leaves, fn, float64 reference fn, tolerance)."""
    import torch

    from ck_conv import conv2d
    from ck_fmha import attention
    from ck_gemm import linear, matmul

    F = torch.nn.functional

    def conv(cl):
        def make():
            x, w = _rand(2, 16, 8, 8), _rand(16, 16, 3, 3)
            if cl:
                x, w = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
            return [x, w], lambda x, w: conv2d(x, w, padding=1), lambda x, w: F.conv2d(x, w, padding=1), 1e-2
        return make

    return {
        "matmul": lambda: ([_rand(64, 64), _rand(64, 64)], matmul, lambda a, b: a @ b, 5e-3),
        "linear+bias": lambda: ([_rand(4, 16, 64), _rand(128, 64), _rand(128)], linear, F.linear, 5e-3),
        "conv2d": conv(False),
        "conv2d channels_last": conv(True),
        "attention": lambda: ([_rand(1, 8, 128, 64) for _ in range(3)], lambda q, k, v: attention(q, k, v, causal=True),
                              lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), 1e-2),
    }


def _big_cases() -> dict:
    import torch

    from ck_conv import conv2d
    from ck_fmha import attention
    from ck_gemm import linear

    F = torch.nn.functional
    bf, cl = torch.bfloat16, torch.channels_last

    def conv(n, c, k, hw, f, s, pad):
        def make():
            x = _rand(n, c, hw, hw, dtype=bf).to(memory_format=cl)
            w = (_rand(k, c, f, f, dtype=bf) * (c * f * f) ** -0.5).to(memory_format=cl)
            return [x, w], lambda x, w: conv2d(x, w, stride=s, padding=pad), \
                lambda x, w: F.conv2d(x, w, stride=s, padding=pad), 2e-2
        return make

    def lin(n_out):
        return lambda: ([_rand(8, 512, 2048, dtype=bf), _rand(n_out, 2048, dtype=bf) * 2048 ** -0.5,
                         _rand(n_out, dtype=bf)], linear, F.linear, 2e-2)

    def attn():
        q, k, v = (_rand(8, 16, 512, 128, dtype=bf) for _ in range(3))
        return [q, k, v], lambda q, k, v: attention(q, k, v, causal=True), \
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), 2e-2

    return {"resnet stem 7x7 s2 b64": conv(64, 3, 64, 224, 7, 2, 3),
            "resnet 3x3 64ch 56x56 b64": conv(64, 64, 64, 56, 3, 1, 1),
            "resnet 1x1 64->256 56x56 b64": conv(64, 64, 256, 56, 1, 1, 0),
            "resnet 1x1 s2 512->1024 28x28 b64": conv(64, 512, 1024, 28, 1, 2, 0),
            "llama linear 2048->2048 4096 tokens": lin(2048),
            "llama linear 2048->5632 4096 tokens": lin(5632),
            "llama attention b8 h16 s512 d128": attn}


def _reference(ref, leaves, dy):
    refs = [t.detach().double().requires_grad_() for t in leaves]
    want = ref(*refs)
    want.backward(dy.double())
    return want.detach(), [r.grad for r in refs]


def compile_part(budget_s: float) -> list:
    import torch
    import torch._inductor.config

    from ck_core import api as core

    rows, t_end = [], time.perf_counter() + budget_s
    for name, make in _small_cases().items():
        for backward in (False, True):
            row = {"case": name, "backward": backward}
            rows.append(row)
            if time.perf_counter() > t_end:
                row["skipped"] = "budget"
                continue
            t0 = time.perf_counter()
            torch._dynamo.reset()
            core.clear()
            torch._inductor.config.triton.cudagraph_trees_history_recording = True
            try:
                _, fn, ref, tol = make()
                c = torch.compile(fn, mode="reduce-overhead")
                errs = []
                for _ in range(4):
                    fresh = [t.requires_grad_(backward) for t in make()[0]]
                    torch.compiler.cudagraph_mark_step_begin()
                    y = c(*fresh)
                    dy = _rand(*y.shape, dtype=y.dtype)
                    if backward:
                        y.backward(dy)
                    torch.cuda.synchronize()
                    want, grads = _reference(ref, [t.detach() for t in fresh], dy)
                    errs.append(max([_rel(y, want)] + ([_rel(t.grad, g) for t, g in zip(fresh, grads)]
                                                       if backward else [])))
                row.update(ok=max(errs) < tol, max_rel_err=max(errs), tol=tol)
            except Exception as e:  # noqa: BLE001 - recorded, the next case runs
                row.update(ok=False, **_err(e))
            finally:
                torch._inductor.config.triton.cudagraph_trees_history_recording = False
            row["seconds"] = round(time.perf_counter() - t0, 1)
            print(f"compile {name} {'fwd+bwd' if backward else 'fwd'}: {row.get('ok')} "
                  f"{row.get('max_rel_err', row.get('error', ''))!s:.300}", flush=True)
    return rows


def _step(fn, leaves, dy):
    for t in leaves:
        t.grad = None
    y = fn(*leaves)
    y.backward(dy)
    return y


def capture_part(budget_s: float) -> list:
    """Each big call's fwd+bwd captured alone, then all in one graph."""
    import torch

    from ck_core import api as core

    core.clear()
    rows, t_end, made = [], time.perf_counter() + budget_s, []
    cases = _big_cases()
    for name, make in list(cases.items()) + [("all in one step", None)]:
        row = {"case": name}
        rows.append(row)
        if time.perf_counter() > t_end:
            row["skipped"] = "budget"
            continue
        t0 = time.perf_counter()
        try:
            if make is None:   # every call's step in one graph (as a model's training step)
                if not made:
                    raise RuntimeError("no single call was set up")
                steps = made
            else:
                leaves, fn, ref, tol = make()
                leaves = [t.requires_grad_() for t in leaves]
                y0 = fn(*leaves)
                steps = [(name, make, leaves, fn, ref, tol, _rand(*y0.shape, dtype=y0.dtype))]
                del y0
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    for _, _, leaves, fn, _, _, dy in steps:
                        _step(fn, leaves, dy)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            # a host synchronisation in a warm step (a capture killer) raises here, with its frames
            torch.cuda.set_sync_debug_mode("error")
            try:
                with torch.cuda.stream(side):
                    for _, _, leaves, fn, _, _, dy in steps:
                        _step(fn, leaves, dy)
            except Exception as e:  # noqa: BLE001 - recorded; the capture is tried anyway
                row["sync_in_warm_step"] = _err(e)
            finally:
                torch.cuda.set_sync_debug_mode(0)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                ys = [_step(fn, leaves, dy) for _, _, leaves, fn, _, _, dy in steps]
            errs = {}
            for _ in range(2):
                with torch.no_grad():
                    for _, mk, leaves, _, _, _, dy in steps:
                        for t, f in zip(leaves, mk()[0]):
                            t.copy_(f)
                        dy.copy_(_rand(*dy.shape, dtype=dy.dtype))
                g.replay()
                torch.cuda.synchronize()
                for (n, _, leaves, _, ref, tol, dy), y in zip(steps, ys):
                    want, grads = _reference(ref, [t.detach() for t in leaves], dy)
                    e = max([_rel(y, want)] + [_rel(t.grad, w) for t, w in zip(leaves, grads)])
                    errs[n] = max(errs.get(n, 0.0), e)
            tols = {s[0]: s[5] for s in steps}
            row.update(ok=all(errs[n] < tols[n] for n in errs), max_rel_err=errs)
            if make is not None:
                made.extend(steps)
            del g, ys
        except Exception as e:  # noqa: BLE001 - recorded, the next case runs
            row.update(ok=False, **_err(e))
            try:
                torch.cuda.synchronize()
            except Exception as e2:  # noqa: BLE001 - a context left unusable: the rest would fail too
                row["after"] = f"{type(e2).__name__}: {e2}"[:300]
                break
        row["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"capture {name}: {row.get('ok')} {row.get('max_rel_err', row.get('error', ''))!s:.300}", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the JSON file to write")
    ap.add_argument("--parts", nargs="+", default=["compile", "capture"], choices=["compile", "capture"])
    ap.add_argument("--budget-s", type=float, default=100.0, help="seconds for all parts (cases past it: skipped)")
    args = ap.parse_args(argv)
    import torch

    from ck_core.bench import with_header

    if not torch.cuda.is_available():
        print("graph_check.py needs a CUDA GPU", file=sys.stderr)
        return 2
    doc, t0 = {}, time.perf_counter()
    for i, part in enumerate(args.parts):
        left = args.budget_s - (time.perf_counter() - t0)
        budget = left / (len(args.parts) - i)   # an even share of what is left
        doc[part] = (compile_part if part == "compile" else capture_part)(budget)
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    with open(args.out, "w") as f:
        json.dump(with_header(doc, command=" ".join(["python", "benchmarks/graph_check.py", *sys.argv[1:]]),
                              device=torch.cuda.get_device_name()), f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
