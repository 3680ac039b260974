"""Render benchmarks/results/*.json (written by `ck bench` and the suites) into BENCHMARKS.md and
README.md's "Where it stands" table (between its ``<!-- standing:begin -->`` / ``end`` markers).

    python benchmarks/render_md.py            # rewrites BENCHMARKS.md and the README table
    python benchmarks/render_md.py --check    # exit 1 when either differs from the render

Each JSON holds device, date, command, rows (case, ours, peer, peer_name, unit,
ratio) and optional extra tables; the Markdown keeps them together so every
figure carries its date, device and command.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

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
    if isinstance(v, list):   # a row's strata or kinds
        return ", ".join(map(str, v))
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
BROAD_COLS = {"fmha": ("group", "stratum", "case", "split", "peer_kind", "peer_target", "below_floor",
                       "ratio_cudnn_graph", "ratio_cudnn_eager", "ratio_flash_graph", "ratio_flash_eager",
                       "ratio_flex_graph", "ratio_flex_eager", "ratio_efficient_graph", "ours_tflops", "status"),
              "conv": ("case", "kinds", "split", "ratio_graph", "ratio_eager", "ours", "peer", "ours_gb_s",
                       "peer_gb_s", "status"),
              "gemm": ("case", "strata", "split", "ratio_graph", "ratio_eager", "gflop", "ours", "peer", "status")}


def broad_section(op: str, data: dict) -> str:
    """A broad suite's run (``benchmarks/results/<op>_broad.json``): its summary per group and split,
    then every row (ratios: ours over the peer's time, > 1 = faster than the peer)."""
    parts = [f"## {op} broad suite (`{op}_broad.json`)\n", f"- date: {data.get('date')}",
             f"- device: {data.get('device')}", f"- command: `{data.get('command')}`",
             f"- rows: {len(data.get('rows', []))}; skipped for time: {len(data.get('skipped_for_time', []))}"]
    if data.get("note"):
        parts.append(f"- note: {data['note']}")
    parts.append("")
    items = (data.get("summary") or {}).items()
    summ = [dict(group=k, **v) for k, v in items if not is_stratum(k)]
    parts.append(table(summ, list(dict.fromkeys(k for r in summ for k in r))))
    strata = [dict(stratum=k, **{c: _peers(x) if c == "peers" else x for c, x in v.items()})
              for k, v in items if is_stratum(k)]
    if strata:
        parts.append("Strata (issues #28 / #29): geomean and minimum of each stratum's ratios to the row's peer "
                     "(graph = CUDA-graph replay, eager = plain calls); floors and targets as the rows record "
                     "them.\n")
        parts.append(table(strata, list(dict.fromkeys(k for r in strata for k in r))))
    rows = data.get("rows", [])
    cols = [c for c in BROAD_COLS.get(op, ()) if any(c in r for r in rows)]
    if rows and cols:
        parts.append(f"<details><summary>{len(rows)} rows</summary>\n")
        parts.append(table(rows, cols))
        parts.append("</details>\n")
    return "\n".join(parts)


#: the last part of a summary key that names a split (or a whole group), not a stratum
SPLITS = ("all", "train", "heldout", "nowindow", "fp8")


def is_stratum(key: str) -> bool:
    """Whether a broad suite's summary key is a stratum (``fwd/d64``, ``layout/crr``, ``forward/1x1``)
    rather than a group's split (``fwd/all``, ``train``, ``forward/heldout``)."""
    return key.rsplit("/", 1)[-1] not in SPLITS


def _peers(v) -> str:
    return ", ".join(f"{k} {n}" for k, n in v.items()) if isinstance(v, dict) else _fmt(v)


def _load(name: str) -> dict:
    return json.loads((ROOT / "results" / name).read_text())


def _x(v) -> str:
    return f"{v:.3f}x"


def _groups(*names: str) -> Callable[[dict], str]:
    def get(d):
        g = d["geomean_by_group"]
        return " / ".join(_x(g[n]) for n in names)
    return get


def _broad(keys: tuple, graph: str, low: str, eager: str | None = None) -> Callable[[dict], str]:
    def get(d):
        parts = []
        for k in keys:
            v = d["summary"][k]
            txt = f"{k.split('/')[0]} {_x(v[graph])}" + (f" (eager {_x(v[eager])})" if eager else "")
            parts.append(txt + f", lowest {_x(v[low])}")
        return "; ".join(parts)
    return get


def _strata(d: dict, prefixes: tuple, below: str | None) -> str:
    """A broad run's strata in one cell: ``stratum geomean (min)`` for the summary keys under
    ``prefixes``, with the rows below the floor; a run without strata says so."""
    got = [(k, v) for k, v in (d.get("summary") or {}).items()
           if is_stratum(k) and k.startswith(prefixes) and v.get("graph_geomean")]
    if not got:
        return "no strata in this run yet (python benchmarks/broad_multi.py)"
    parts = [f"{k} {_x(v['graph_geomean'])} (min {_x(v['graph_min'])})" for k, v in got]
    if below:
        parts.append(f"rows below the floor: {sum(v.get(below) or 0 for _, v in got)}")
    return "; ".join(parts)


def _n(key: str) -> Callable[[dict], str]:
    return lambda d: str(d["summary"][key]["n"])


def _overhead(d: dict) -> str:
    """The warm eager table: how many calls are within 1.2x torch's, and the worst ratios."""
    rows = [(k, v["ratio_wall"]) for k, v in (d.get("table") or {}).items() if isinstance(v, dict) and v.get("ratio_wall")]
    if not rows:
        return "no table in this run"
    ok = sum(r <= 1.2 for _, r in rows)
    worst = ", ".join(f"{k} {r:.2f}x" for k, r in sorted(rows, key=lambda x: -x[1])[:3])
    return f"{ok} of {len(rows)} calls within 1.2x; worst: {worst}"


def _models(d: dict) -> str:
    """Each model row's eager ratio (peer / ours) and first-step ratio, or its status."""
    out = []
    for r in d.get("rows", []):
        name = f"{r.get('model')} {r.get('mode')}" + (f" {r['ours'].split('+', 1)[-1]}" if "+" in str(r.get("ours")) else "")
        if r.get("status") != "ok" or not r.get("ratio"):
            out.append(f"{name}: {str(r.get('status'))[:40]}")
            continue
        first = (r["peer_first_ms"] / r["ours_first_ms"]) if r.get("ours_first_ms") and r.get("peer_first_ms") else None
        out.append(f"{name} {r['ratio']:.2f}x" + (f" ({first:.2f}x)" if first else ""))
    return "; ".join(out) or "no rows"


#: README's "Where it stands" rows: what, results file (None: a test's verdict), the figure read from
#: it, the target, and whose figure it is: the Dispatcher's pick (what a user's call runs), the
#: fastest candidate (the oracle of a tuning list), or a kernel run directly with its tuned config
STANDING = [
    ("GEMM core suite vs cuBLAS (bf16+fp16, 8 shapes), CUDA graph", "gemm.json",
     lambda d: f"geomean {_x(d['geomean'])}, lowest {_x(d['min_ratio'])}", ">= 1.00x, none < 0.85x",
     "Dispatcher's pick"),
    ("GEMM broad suite (LLM layers, odd sizes, batched), CUDA graph", "gemm_broad.json",
     lambda d: (f"{d['summary']['all']['n']} cases: {_x(d['summary']['all']['graph_geomean'])} "
                f"(eager {_x(d['summary']['all']['eager_geomean'])}), lowest {_x(d['summary']['all']['graph_min'])}; "
                f"fp8 {_x(d['summary']['fp8']['graph_geomean'])}"), ">= 1.0x, none < 0.85x", "Dispatcher's pick"),
    ("FMHA forward vs SDPA cuDNN, core suite: dense / GQA", "fmha.json", _groups("fwd", "fwd_gqa"), ">= 1.0x",
     "kernel with its tuned config"),
    ("FMHA backward vs SDPA cuDNN, core suite: dense / GQA", "fmha.json", _groups("bwd", "bwd_gqa"), ">= 0.9x",
     "kernel with its tuned config"),
    ("FMHA decode vs copy bandwidth (paged and split-KV)", "fmha.json", _groups("decode"), ">= 0.8x",
     "kernel with its tuned config"),
    ("FMHA broad suite vs SDPA cuDNN, CUDA graph", "fmha_broad.json",
     _broad(("fwd/all", "fwd_bwd/all", "varlen/all", "decode/all"), "ratio_geomean", "ratio_min"),
     "fwd >= 1.0x, bwd >= 0.9x", "Dispatcher's pick"),
    ("grouped conv vs cuDNN, core suite: fwd / bwd_data / bwd_weight", "conv.json",
     _groups("forward", "bwd_data", "bwd_weight"), "0.9x / 0.8x / 0.8x", "fastest candidate"),
    ("conv broad suite vs cuDNN, CUDA graph", "conv_broad.json",
     _broad(("forward/all", "bwd_data/all", "bwd_weight/all"), "graph_geomean", "graph_min"),
     "fwd >= 0.9x, none < 0.5x", "Dispatcher's pick"),
    ("FMHA broad strata: head dims (fwd / fwd+bwd), decode page sizes, vs each row's peer, CUDA graph",
     "fmha_broad.json", lambda d: _strata(d, ("fwd/", "fwd_bwd/", "decode/page"), "below_floor"),
     "fwd >= 0.85x, fwd+bwd >= 0.8x per row; >= 1.2x where flash/Flex is the peer", "Dispatcher's pick"),
    ("GEMM broad strata: layouts, mid-M LLM rows, linear training steps, CUDA graph", "gemm_broad.json",
     lambda d: _strata(d, ("layout/", "llm/", "kind/linear_train"), "below_0.85"), ">= 1.0x, none < 0.85x",
     "Dispatcher's pick"),
    ("conv broad strata: kinds of layer (all directions), CUDA graph", "conv_broad.json",
     lambda d: _strata(d, ("all/",), None), "fwd >= 0.9x, none < 0.5x", "Dispatcher's pick"),
    ("Host cost of a warm eager call, every public API (tiny problems), ours / torch's us", "overhead_table.json",
     lambda d: _overhead(d), "<= 1.2x torch's, fwd and fwd+bwd", "Dispatcher's pick"),
    ("Whole models through the public APIs, eager, peer ms / ours ms (first step in brackets)", "models.json",
     lambda d: _models(d), "ResNet-50 train >= 0.95x, infer >= 1.0x; Llama generate >= 0.95x, train >= 1.0x",
     "Dispatcher's pick"),
    ("FMHA enumeration, all nine families, one arch (CPU, cold process)", "enumeration.json",
     lambda d: "{:.2f}-{:.2f} s".format(*(f(r["seconds (best of 3, cold process)"] for r in d["rows"]
                                          if r["op"] == "fmha") for f in (min, max))), "< 1 s", "-"),
    ("CK parity, gfx950 receipt 0 (fwd + three bwd families, name for name)", None,
     lambda d: "exact (plugins/fmha/tests/test_enumeration.py)", "exact", "-"),
]
BEGIN, END = "<!-- standing:begin (rendered by benchmarks/render_md.py) -->", "<!-- standing:end -->"


def standing_table() -> str:
    out = ["| what | measured | target | whose figure | date |", "|---|---|---|---|---|"]
    for what, name, get, target, whose in STANDING:
        if name and not (ROOT / "results" / name).exists():
            out.append(f"| {what} | not measured yet | {target} | {whose} | -, - |")
            continue
        d = _load(name) if name else {}
        src = f"[{name}](benchmarks/results/{name})" if name else "test"
        date = str(d.get("date", "-")).split(" ")[0][:10] if name else "-"
        out.append(f"| {what} | {get(d)} | {target} | {whose} | {date}, {src} |")
    return "\n".join(out) + "\n"


def render_readme(text: str) -> str:
    """README.md's text with the standing table between the markers replaced by the render."""
    if BEGIN not in text or END not in text:
        raise SystemExit(f"README.md lacks the markers {BEGIN!r} ... {END!r}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + BEGIN + "\n" + standing_table() + END + tail


def render_benchmarks() -> str:
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
    return "\n".join(body)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    targets = {ROOT.parent / "BENCHMARKS.md": lambda old: render_benchmarks(),
               ROOT.parent / "README.md": render_readme}
    stale = []
    for path, render in targets.items():
        old = path.read_text()
        new = render(old)
        if new != old:
            stale.append(path.name)
            if "--check" not in argv:
                path.write_text(new)
    if "--check" in argv:
        if stale:
            print(f"{', '.join(stale)} differ from the render of benchmarks/results; run python "
                  f"benchmarks/render_md.py", file=sys.stderr)
        return 1 if stale else 0
    print(f"rewrote {', '.join(stale) or 'nothing (up to date)'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
