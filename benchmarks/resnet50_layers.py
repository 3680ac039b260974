"""ResNet-50's convolutions one by one: where the model's inference time goes (ours vs cuDNN).

Every conv of torchvision's resnet50 forward (53 convs, 23 distinct shapes) at batch 64, 224x224,
bf16, channels-last, as ``benchmarks/models.py --rows resnet50:infer`` runs them (``ck_conv.conv2d``,
no grad, warm), against ``torch.nn.functional.conv2d`` (cuDNN) on the same tensors.  Per shape: the
key the GPU's Dispatcher picked (with its split, launch count and selection rule: a heuristic, a tuned winner of the
machine's tuning store, a learned ranker; and the keys that failed to build there: a failure falls
back to a slower candidate), the relative L2 error against cuDNN, and the
CUDA-event time of back-to-back calls.  Then the 53 convs in model order as one chain: back to back
(``chain_ms``) and, as models.py times a step, one synchronised chain per sample (``chain_sync_ms``),
the latter also with Triton's launcher called through ``CudaLauncher.__call__`` instead of the
recorded replay's direct ``launch`` (``chain_sync_nodirect_ms``: ck_core.backends.triton_replay).

    python benchmarks/resnet50_layers.py --out /root/out/resnet50_layers.json     # GPU, ~1 minute
    python benchmarks/resnet50_layers.py --device cpu --tiny --out /tmp/r.json     # CPU dry run
    git worktree add --detach /tmp/old b3a1a81 &&                                  # another commit's code
      python benchmarks/resnet50_layers.py --tree /tmp/old --out /root/out/resnet50_layers_old.json

JSON (``{"name": "ck.resnet50_layers", "version": 1, ...}``) to ``--out``; a table on stdout.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def resnet50_convs(image: int = 224) -> list:
    """(name, C, K, input size, filter, stride) of every conv of torchvision's resnet50 in forward
    order (v1.5: the stride on the 3x3 conv of a bottleneck)."""
    convs = [("conv1", 3, 64, image, 7, 2)]
    size, cin = image // 4, 64
    for li, (width, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)], start=1):
        for b in range(blocks):
            s = 2 if b == 0 and li > 1 else 1
            pre = f"layer{li}.{b}"
            convs += [(f"{pre}.conv1", cin, width, size, 1, 1), (f"{pre}.conv2", width, width, size, 3, s),
                      (f"{pre}.conv3", width, width * 4, size // s, 1, 1)]
            if b == 0:
                convs.append((f"{pre}.downsample", cin, width * 4, size, 1, s))
            size, cin = size // s, width * 4
    return convs


def _commit(root: Path = ROOT) -> str:
    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except Exception:  # noqa: BLE001 - no git
        return "unknown"


def _events_ms(torch, fn, reps: int, device: str) -> float:
    """Milliseconds per call of ``reps`` back-to-back calls of ``fn``."""
    import time

    fn()
    if device != "cuda":
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) * 1e3 / reps
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / reps


def _sync_median_ms(torch, fn, reps: int, device: str) -> float:
    """Median of single synchronised calls (how models.py times a step)."""
    import time

    fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write the JSON here")
    ap.add_argument("--device", default=None, help="cuda (default when present) or cpu (Triton's interpreter)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--reps", type=int, default=30, help="calls per timing")
    ap.add_argument("--tiny", action="store_true", help="batch 1, 32x32, 2 reps, first 4 shapes (CPU dry run)")
    ap.add_argument("--tree", default=None,
                    help="run another checkout's packages (e.g. `git worktree add /tmp/old b3a1a81`): its ck_core, "
                         "plugins and archs first on sys.path, to compare two commits with this one script")
    a = ap.parse_args(argv)
    if a.tree:
        tree = Path(a.tree).resolve()
        sys.path[:0] = [str(tree), *(str(tree / "plugins" / op) for op in ("gemm", "conv", "fmha")),
                        *sorted(str(d) for d in (tree / "archs").glob("*") if d.is_dir())]
    if a.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch
    import torch.nn.functional as F

    import ck_conv
    from ck_conv.api import _problem
    try:
        from ck_conv.geometry import launches
    except ImportError:   # a tree before geometry.launches: the same count
        def launches(cfg):
            if cfg.split <= 1 or cfg.reduction in ("fixup", "atomicfix", "streamk"):
                return 1
            return 2 if cfg.reduction == "twostage" or cfg.dtype == "fp32" else 3
    from ck_conv.keys import config_of
    from ck_core import api as core
    from ck_core.backends import triton_replay

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    batch, image, reps = (1, 32, 2) if a.tiny else (a.batch, a.image, a.reps)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    convs = resnet50_convs(image)
    g = torch.Generator(device=device).manual_seed(0)
    shapes: dict = {}   # (C, K, H, F, S) -> row
    inputs = []
    for name, C, K, H, Fs, S in convs:
        sh = (C, K, H, Fs, S)
        if sh not in shapes:
            x = torch.randn(batch, C, H, H, device=device, generator=g).to(dtype)
            w = (torch.randn(K, C, Fs, Fs, device=device, generator=g) / (C * Fs * Fs) ** 0.5).to(dtype)
            shapes[sh] = {"layer": name, "count": 0, "C": C, "K": K, "H": H, "filter": Fs, "stride": S,
                          "x": x.contiguous(memory_format=torch.channels_last),
                          "w": w.contiguous(memory_format=torch.channels_last)}
        shapes[sh]["count"] += 1
        inputs.append(shapes[sh])
    if a.tiny:
        shapes = dict(list(shapes.items())[:4])
        inputs = [r for r in inputs if (r["C"], r["K"], r["H"], r["filter"], r["stride"]) in shapes]

    def ours(r):
        return ck_conv.conv2d(r["x"], r["w"], None, r["stride"], r["filter"] // 2)

    def peer(r):
        return F.conv2d(r["x"], r["w"], None, r["stride"], r["filter"] // 2)

    rows = []
    disp = None
    with torch.no_grad():
        for r in shapes.values():
            out = {k: v for k, v in r.items() if k not in ("x", "w")}
            try:
                y, want = ours(r), peer(r)   # ours: the cold call selects (the rule below is its)
                out["rel_err"] = float((y.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))
                out["out_channels_last"] = bool(y.is_contiguous(memory_format=torch.channels_last))
                p = _problem("forward", r["x"].shape, r["w"].shape, r["stride"], r["filter"] // 2, 1, 1,
                             r["x"].dtype, True)
                disp = core.dispatcher_on("conv", r["x"], directions=("forward",), dtypes=(p.dtype,),
                                          ndims=(2,), layouts=(p.layout_family,))
                rule = getattr(disp, "_rule", None)
                key = disp.select(p)
                cfg = config_of(key)
                out.update(key=key.name, rule=rule, split=cfg.split, launches=launches(cfg),
                           ours_ms=_events_ms(torch, lambda: ours(r), reps, device),
                           peer_ms=_events_ms(torch, lambda: peer(r), reps, device))
                out["ratio"] = out["peer_ms"] / out["ours_ms"] if out["ours_ms"] else None
                out["status"] = "ok"
            except Exception as exc:  # noqa: BLE001 - a failing shape gets an error row, the rest still run
                out["status"] = f"error: {type(exc).__name__}: {str(exc)[:300]}"
            rows.append(out)
            print(f"{out['layer']:22s} x{out['count']}  C{out['C']:5d} K{out['K']:5d} {out['H']:3d}^2 "
                  f"{out['filter']}x{out['filter']}/{out['stride']}  ours {out.get('ours_ms', float('nan')):.4f} "
                  f"peer {out.get('peer_ms', float('nan')):.4f} ms  {out.get('key', out['status'])}", flush=True)

        def chain_ours():
            for r in inputs:
                ours(r)

        def chain_peer():
            for r in inputs:
                peer(r)

        chain = {"convs": len(inputs)}
        try:
            chain.update(ours_chain_ms=_events_ms(torch, chain_ours, reps, device),
                         peer_chain_ms=_events_ms(torch, chain_peer, reps, device),
                         ours_chain_sync_ms=_sync_median_ms(torch, chain_ours, reps, device),
                         peer_chain_sync_ms=_sync_median_ms(torch, chain_peer, reps, device))
            import gc
            import warnings

            with warnings.catch_warnings():   # (isinstance on torch's deprecated module attributes warns)
                warnings.simplefilter("ignore")
                replays = [o for o in gc.get_objects() if isinstance(o, triton_replay.Replay)]
            direct = [(o, o._direct) for o in replays if getattr(o, "_direct", None) is not None]
            chain["replays"], chain["direct_replays"] = len(replays), len(direct)
            for o, _ in direct:
                o._direct = None
            try:
                chain["ours_chain_sync_nodirect_ms"] = _sync_median_ms(torch, chain_ours, reps, device)
            finally:
                for o, d in direct:
                    o._direct = d
        except Exception as exc:  # noqa: BLE001
            chain["status"] = f"error: {type(exc).__name__}: {str(exc)[:300]}"
    ok = [r for r in rows if r.get("status") == "ok"]
    totals = {"ours_sum_ms": sum(r["count"] * r["ours_ms"] for r in ok),
              "peer_sum_ms": sum(r["count"] * r["peer_ms"] for r in ok),
              "failed_keys": dict(getattr(disp, "failed", {}) or {}) if disp is not None else {},
              "tuning_store": str(getattr(core._tuning_table(), "path", None)),
              "tuned_winner_picks": sum("tuning" in str(r.get("rule")) for r in ok)}
    res = {"schema": {"name": "ck-dispatcher.results", "version": 1}, "name": "ck.resnet50_layers", "version": 1,
           "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
           "commit": _commit(Path(a.tree) if a.tree else ROOT), "tree": str(a.tree or ROOT), "ck_conv": ck_conv.__file__, "versions": {"torch": torch.__version__},
           "config": {"batch": batch, "image": image, "reps": reps, "dtype": str(dtype)},
           "ratio_is": "peer ms / ours ms (> 1: ours faster)", "totals": totals, "chain": chain, "rows": rows}
    print(json.dumps({"totals": totals, "chain": chain}, indent=1))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=1))
    return 0 if len(ok) == len(rows) and "status" not in chain else 1


if __name__ == "__main__":
    sys.exit(main())
