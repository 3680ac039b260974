"""PNG plots of a sweep (matplotlib, the optional extra ``ck-core[plot]``).

Two figures: the best kernel's time against the peer's per shape, and a
kernel x shape heatmap of TFLOPS (or of latency where an op reports no FLOPs).
"""
from __future__ import annotations

import importlib.util
import logging
import math

log = logging.getLogger(__name__)


def _ok(rows):
    return [r for r in rows if r.get("status") == "ok" and r.get("problem_name") and r.get("latency_ms")]


def plot(rows: list, prefix: str, op: str) -> list:
    """Write ``<prefix>_best.png`` and ``<prefix>_heatmap.png``; returns the paths written."""
    if importlib.util.find_spec("matplotlib") is None:
        log.warning("--plot needs matplotlib: pip install 'ck-core[plot]'; no PNG written")
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = _ok(rows)
    if not ok:
        log.warning("no successful measurement to plot")
        return []
    shapes = list(dict.fromkeys(r["problem_name"] for r in ok))
    best = {s: min((r for r in ok if r["problem_name"] == s), key=lambda r: float(r["latency_ms"]))
            for s in shapes}
    out = []
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(shapes) + 2), 4.5))
    xs = range(len(shapes))
    ours = [float(best[s]["latency_ms"]) for s in shapes]
    peer = [float(best[s]["peer_latency_ms"]) if best[s].get("peer_latency_ms") else math.nan for s in shapes]
    ax.bar([x - 0.2 for x in xs], ours, width=0.4, label="best kernel")
    if any(not math.isnan(p) for p in peer):
        name = next((best[s].get("peer") for s in shapes if best[s].get("peer")), "peer")
        ax.bar([x + 0.2 for x in xs], peer, width=0.4, label=str(name))
    ax.set_yscale("log")
    ax.set_ylabel("latency (ms, log)")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(shapes, rotation=75, ha="right", fontsize=6)
    ax.set_title(f"{op}: best kernel vs peer per shape")
    ax.legend()
    fig.tight_layout()
    path = f"{prefix}_best.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    out.append(path)

    kernels = list(dict.fromkeys(r["kernel"] for r in ok))
    metric = "tflops" if all(r.get("tflops") not in (None, "") for r in ok) else "latency_ms"
    grid = [[math.nan] * len(shapes) for _ in kernels]
    ki = {k: i for i, k in enumerate(kernels)}
    si = {s: i for i, s in enumerate(shapes)}
    for r in ok:
        grid[ki[r["kernel"]]][si[r["problem_name"]]] = float(r[metric])
    fig, ax = plt.subplots(figsize=(max(6, 0.3 * len(shapes) + 4), max(3, 0.12 * len(kernels) + 2)))
    im = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis")
    fig.colorbar(im, ax=ax, label=metric)
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels(shapes, rotation=75, ha="right", fontsize=6)
    if len(kernels) <= 60:
        ax.set_yticks(range(len(kernels)))
        ax.set_yticklabels([k.split(".")[0] for k in kernels], fontsize=5)
    ax.set_ylabel(f"{len(kernels)} kernels")
    ax.set_title(f"{op}: kernel x shape ({metric})")
    fig.tight_layout()
    path = f"{prefix}_heatmap.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    out.append(path)
    return out
