"""Where greedy generation spends its time with attn_implementation="ck_fmha" (issue #26), against sdpa.

    python benchmarks/generate_profile.py --out generate_profile.json      # H200: under a minute
    python benchmarks/generate_profile.py --tiny --device cpu --out g.json # a smoke run (interpreter)

The Llama-shaped model of ``models.py`` (8 layers, hidden 2048, GQA 16:4, bf16; the same builder),
``model.generate`` (batch 8, prompt 128, ``--tokens`` new tokens, greedy), run once to warm up, then per
side: ms per generated token (synchronised wall time), and for ck_fmha the host time inside the
integration's ``attention_forward`` (summed, no sync: what the host spends per attention call), its
calls, the warm-call closures added (a call of a new signature) and the Dispatchers' full selections
during the timed run; then one generate per side under ``torch.profiler``: the top operators by self
CPU time and by self device time (``--rows``), so that the gap to sdpa is found by name.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _table(prof, key: str, rows: int) -> list:
    out = []
    for e in sorted(prof.key_averages(), key=lambda e: getattr(e, key, 0) or 0, reverse=True)[:rows]:
        out.append({"name": e.key[:120], "calls": e.count, "self_cpu_us": round(e.self_cpu_time_total, 1),
                    "cpu_total_us": round(e.cpu_time_total, 1),
                    "self_device_us": round(getattr(e, "self_device_time_total", 0.0) or 0.0, 1)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--tiny", action="store_true", help="the tiny config of models.py (a smoke run)")
    a = ap.parse_args(argv)
    if a.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    import models
    from ck_core import api as core
    from ck_core import warm

    import ck_fmha.integrations.transformers as ck_tf

    cfg = dict(models.TINY if a.tiny else models.GPU)
    dtype = torch.float16 if a.device == "cpu" else torch.bfloat16
    peer, ours = models.llama(cfg, a.device, dtype)
    peer.eval()
    ours.eval()
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    g = torch.Generator(device=a.device).manual_seed(3)
    prompt = torch.randint(2, cfg["vocab"], (cfg["gen_batch"], cfg["prompt"]), device=a.device, generator=g)
    tokens = min(a.tokens, 4) if a.tiny else a.tokens
    kw = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)

    spent = {"s": 0.0, "calls": 0}
    inner = ck_tf.attention_forward

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent["s"] += time.perf_counter() - t0
            spent["calls"] += 1

    out = {"device": torch.cuda.get_device_name() if a.device == "cuda" else a.device, "new_tokens": tokens,
           "batch": cfg["gen_batch"], "prompt": cfg["prompt"], "sides": {}}
    from transformers import AttentionInterface

    AttentionInterface.register(ck_tf.NAME, timed)
    try:
        for side, m in (("sdpa", peer), ("ck_fmha", ours)):
            with torch.no_grad():
                m.generate(prompt, **kw)   # warm-up: compiles, first shapes
                sync()
                spent.update(s=0.0, calls=0)
                sigs = warm.size()
                sel = sum(d.selections for d in core._DISPATCHERS.values())
                t0 = time.perf_counter()
                seq = m.generate(prompt, **kw)
                sync()
                ms = (time.perf_counter() - t0) * 1e3
            row = {"ms": round(ms, 2), "ms_per_token": round(ms / tokens, 3)}
            if side == "ck_fmha":
                row.update(attention_calls=spent["calls"],
                           attention_host_us_per_call=round(spent["s"] / max(1, spent["calls"]) * 1e6, 1),
                           new_signatures=warm.size() - sigs,
                           full_selections=sum(d.selections for d in core._DISPATCHERS.values()) - sel)
            acts = [torch.profiler.ProfilerActivity.CPU] + (
                [torch.profiler.ProfilerActivity.CUDA] if a.device == "cuda" else [])
            with torch.no_grad(), torch.profiler.profile(activities=acts) as prof:
                m.generate(prompt, **kw)
                sync()
            row["top_self_cpu"] = _table(prof, "self_cpu_time_total", a.rows)
            if a.device == "cuda":
                row["top_self_device"] = _table(prof, "self_device_time_total", a.rows)
            out["sides"][side] = row
            out.setdefault("tokens", {})[side] = seq[:, cfg["prompt"]:].tolist()
            print(side, json.dumps({k: v for k, v in row.items() if not k.startswith("top")}), flush=True)
    finally:
        AttentionInterface.register(ck_tf.NAME, inner)
    s, c = out["sides"]["sdpa"], out["sides"]["ck_fmha"]
    out["ratio_sdpa_over_ours"] = round(s["ms"] / c["ms"], 3) if c["ms"] else None
    out["extra_ms_per_token"] = round(c["ms_per_token"] - s["ms_per_token"], 3)
    tk = out.pop("tokens")
    out["tokens_equal_fraction"] = float(sum(x == y for r1, r2 in zip(tk["sdpa"], tk["ck_fmha"]) for x, y in zip(r1, r2))
                                         / max(1, sum(len(r) for r in tk["sdpa"])))
    from ck_core.bench import with_header

    out = with_header(out, "python benchmarks/generate_profile.py " + " ".join(sys.argv[1:] if argv is None else argv),
                      out["device"])
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({k: out[k] for k in ("ratio_sdpa_over_ours", "extra_ms_per_token", "tokens_equal_fraction")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
