"""Render benchmarks/results/*.json (written by `ck bench`) into BENCHMARKS.md.

    python benchmarks/render_md.py            # rewrites BENCHMARKS.md from the JSON files

Each JSON holds device, date, command, rows (case, ours, peer, peer_name, unit,
ratio) and optional extra tables; the Markdown keeps them together so every
figure carries its date, device and command.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
ORDER = ["gemm", "fmha", "conv"]
#: sections written by hand (partial runs, test counts) live in this file and are kept at the top
HAND = ROOT / "SESSION_NOTES.md"
INTRO = """# Benchmarks

Speed is always a ratio against the peer library, timed in the same process on
the same inputs (CUDA events through `triton.testing.do_bench`: warm-up, then the
median). Each section gives the date, the device and the command that produced
it; the same rows are machine-readable in `benchmarks/results/<op>.json`.
Regenerate this file with `python benchmarks/render_md.py`.
"""


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return "" if v is None else str(v)


def table(rows, cols=None) -> str:
    if not rows:
        return "(no rows)\n"
    cols = cols or [c for c in ("group", "case", "ours", "peer", "peer_name", "unit", "ratio", "ok", "note")
                    if any(c in r for r in rows)]
    if not cols:
        cols = list(dict.fromkeys(k for r in rows for k in r))
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |")
    return "\n".join(out) + "\n"


def section(name: str, data: dict) -> str:
    parts = [f"## {name}\n", f"- date: {data.get('date')}", f"- device: {data.get('device')}",
             f"- command: `{data.get('command')}`"]
    gm = data.get("geomean")
    if gm:
        parts.append(f"- geomean ratio (ours / peer): **{gm:.3f}**; lowest {data.get('min_ratio'):.3f}")
    for g, v in (data.get("geomean_by_group") or {}).items():
        if v and len(data.get("geomean_by_group")) > 1:
            parts.append(f"  - {g}: {v:.3f}")
    if data.get("notes"):
        parts.append(f"- notes: {data['notes']}")
    parts.append("")
    parts.append(table(data.get("rows", [])))
    for title, t in (data.get("extra") or {}).items():
        parts.append(f"### {title}\n")
        parts.append(table(t, list(dict.fromkeys(k for r in t for k in r))) if isinstance(t, list)
                     else "```\n" + json.dumps(t, indent=1) + "\n```\n")
    return "\n".join(parts)


#: per-row columns of the broad suites' tables (those present are shown)
BROAD_COLS = {"fmha": ("group", "case", "split", "ratio_cudnn_graph", "ratio_cudnn_eager", "ratio_flash_graph",
                       "ratio_flash_eager", "ratio_efficient_graph", "ours_tflops", "status"),
              "conv": ("case", "split", "ratio_graph", "ratio_eager", "ours", "peer", "status"),
              "gemm": ("case", "split", "ratio_graph", "ratio_eager", "gflop", "ours", "peer", "status")}


def broad_section(op: str, data: dict) -> str:
    """A broad suite's run (``benchmarks/results/<op>_broad.json``): its summary per group and split,
    then every row (ratios: ours over the peer's time, > 1 = faster than the peer)."""
    parts = [f"## {op} broad suite (`{op}_broad.json`)\n", f"- date: {data.get('date')}",
             f"- device: {data.get('device')}", f"- command: `{data.get('command')}`",
             f"- rows: {len(data.get('rows', []))}; skipped for time: {len(data.get('skipped_for_time', []))}"]
    if data.get("note"):
        parts.append(f"- note: {data['note']}")
    parts.append("")
    summ = [dict(group=k, **v) for k, v in (data.get("summary") or {}).items()]
    parts.append(table(summ, list(dict.fromkeys(k for r in summ for k in r))))
    rows = data.get("rows", [])
    cols = [c for c in BROAD_COLS.get(op, ()) if any(c in r for r in rows)]
    if rows and cols:
        parts.append(f"<details><summary>{len(rows)} rows</summary>\n")
        parts.append(table(rows, cols))
        parts.append("</details>\n")
    return "\n".join(parts)


def main() -> int:
    files = sorted((ROOT / "results").glob("*.json"),
                   key=lambda p: (ORDER.index(p.stem) if p.stem in ORDER else 99, p.stem))
    body = [INTRO]
    if HAND.exists():
        body.append(HAND.read_text())
    shown = 0
    for f in files:
        data = json.loads(f.read_text())
        if data.get("kind") == "table":   # a plain measurement, no peer
            body.append(f"## {data['title']}\n\n- date: {data['date']}\n- device: {data['device']}\n"
                        f"- command: `{data['command']}`\n\n" + table(data["rows"], list(data["rows"][0])))
            shown += 1
            continue
        op = f.stem[:-len("_broad")] if f.stem.endswith("_broad") else None
        if op in BROAD_COLS and data.get("suite") == "broad" and not data.get("partial"):
            body.append(broad_section(op, data))
            shown += 1
            continue
        if "_raw" in f.stem or "geomean_by_group" not in data:  # raw script outputs: kept, not shown
            continue
        body.append(section(f.stem, data))
        shown += 1
    (ROOT.parent / "BENCHMARKS.md").write_text("\n".join(body))
    print(f"wrote BENCHMARKS.md from {shown} of {len(files)} result files", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
