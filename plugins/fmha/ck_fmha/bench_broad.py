"""``ck bench fmha --suite broad``: attention on shapes users run, through the public API.

The core suite (:mod:`ck_fmha.bench`) times the kernels on 32 fixed cases.  This one
draws its cases with a fixed seed from distributions of real workloads and calls what users
call: ``ck_fmha.attention`` (forward for inference, forward with ``requires_grad`` inputs for
training, and the backward through autograd), ``ck_fmha.attention_forward`` in group mode for
ragged batches, and ``ck_fmha.decode.paged_decode`` for decode.  Peers run in the same
process on the same tensors: torch SDPA with only the cuDNN backend enabled (a shape it refuses
raises: it never falls back), SDPA's flash backend, and where both refuse (sliding windows, say)
FlexAttention compiled; the row's peer (``peer_kind``) is the first that ran, with issue #28's target
for it (``peer_target``: cuDNN 1.0 forward / 0.9 fwd+bwd, flash or Flex 1.2) and the floor
(``floor``: forward 0.85, fwd+bwd 0.8).  Group mode: the peers on the zero-padded batch; decode: a
device-to-device copy of a 2 GiB buffer, measured once per run.  Every row is checked against an
fp32 reference before it is timed; a wrong row is reported as ``status: wrong`` and never as a data
point.

Strata (issue #28): every head dim of :data:`HDIM_STRATA` (``d32`` .. ``d256``), drawn from real model
configs (:data:`MODELS`), and every decode page size of :data:`PAGE_STRATA` over caches above 32 MiB
(smaller caches: the ``small_cache`` stratum, no floor); the summary gives each ``group/stratum`` its
geomean and minimum (graph and eager) against the row's peer and the count of rows below the floor.
``--quick`` runs one case of every stratum (one GPU, minutes).

Timings: CUDA-graph replays (kernel speed) and eager calls (host overhead included), medians
of ``triton.testing`` timers.  The suite's first 70 cases are split into a training set and a
held-out set by a fixed seed; the model-config cases hold out whole configs
(:data:`HELD_OUT_MODELS`); ``split`` column: tuning may look at ``train`` rows only.

This module runs the suite (``run``, ``bench``, ``python -m ck_fmha.bench_broad``); the cases are
:mod:`ck_fmha.bench_broad_cases`, a case's rows (reference check, timing, peers)
:mod:`ck_fmha.bench_broad_timing`, the summary :mod:`ck_fmha.bench_broad_summary`.  Their names are
re-exported here (``cases``, ``_summary``, ... as before).
"""
from __future__ import annotations

import json
import logging
import sys
import time
from typing import Optional

from ck_core.bench import broad_result, with_header
from ck_core.bench import shard as shard_cases
from ck_core.progress import Progress

from .bench_broad_cases import (DECODE_MODELS, GQA, HDIM_STRATA, HDIMS, HELD_OUT_MODELS, MASKS, MODELS,
                                PAGE_STRATA, SEED, SMALL_CACHE, WINDOWS, _cache_bytes, _flops, _log_uniform,
                                _model_window, _stratum, case_name, cases, model_cases, pick, quick_cases,
                                seeded_cases)
from .bench_broad_summary import _stats, _stratum_of_row, _summary, strata_summary
from .bench_broad_timing import (FLOORS, PEER_NAMES, PEER_ORDER, TARGETS, _attn_rows, _choose_peer, _copy_bw,
                                 _decode_rows, _fp8_rows, _kernels, _peer, _peers, _reference, _rel, _row,
                                 _varlen_rows, _window)

log = logging.getLogger(__name__)

__all__ = [  # the suite's names, wherever they live (tests and benchmarks read them from here)
    "DECODE_MODELS", "FLOORS", "GQA", "HDIM_STRATA", "HDIMS", "HELD_OUT_MODELS", "MASKS", "MODELS", "PAGE_STRATA",
    "PEER_NAMES", "PEER_ORDER", "SEED", "SMALL_CACHE", "TARGETS", "WINDOWS", "bench", "case_name", "cases",
    "model_cases", "pick", "quick_cases", "run", "seeded_cases", "strata_summary",
    "_attn_rows", "_cache_bytes", "_choose_peer", "_copy_bw", "_decode_rows", "_flops", "_fp8_rows", "_kernels",
    "_log_uniform", "_model_window", "_peer", "_peers", "_reference", "_rel", "_row", "_stats", "_stratum",
    "_stratum_of_row", "_summary", "_varlen_rows", "_window",
]


def run(out_path: Optional[str] = None, budget_s: float = 420.0, seed: int = SEED, kinds=None,
        limit: Optional[int] = None, progress=None, which: str = "", shard: str = "", quick: bool = False) -> dict:
    """Run the suite on the current CUDA device within ``budget_s``; returns the result dict.
    ``which``: only these cases (see :func:`pick`), in that order; ``quick``: one case of every
    stratum (:func:`quick_cases`)."""
    import torch

    from ck_core.errors import UnsupportedProblem

    if not torch.cuda.is_available():
        raise UnsupportedProblem("the broad FMHA suite times CUDA kernels: no CUDA device is visible")
    device = "cuda"
    cs = cases(seed)
    if quick:
        cs = quick_cases(cs)
    if which:
        cs = pick(cs, which)
    if kinds:
        cs = [c for c in cs if c["kind"] in kinds]
    if limit:
        cs = cs[:limit]
    cs = shard_cases(cs, shard)
    t0 = time.time()
    copy_gbs = _copy_bw(device) if any(c["kind"] == "decode" for c in cs) else None
    rows: list[dict] = []
    skipped = []
    # a bar on a terminal, a line every 30 s in a log (ck bench passes its own, -q silences it)
    counter = (progress or Progress)(len(cs), "ck bench fmha --suite broad")
    for i, c in enumerate(counter.each(cs, lambda c: c["case"])):
        if time.time() - t0 > budget_s:
            skipped.append(c["case"])
            continue
        t_case = time.time()
        try:
            if c["kind"] == "attn":
                rs = _attn_rows(c, device)
            elif c["kind"] == "varlen":
                rs = _varlen_rows(c, device)
            elif c["kind"] == "decode":
                rs = _decode_rows(c, device, copy_gbs)
            else:
                rs = _fp8_rows(c, device)
        except Exception as exc:
            # a failure row in every group the case would have filled (it counts in each stratum)
            groups = {"attn": ("fwd", "fwd_train", "fwd_bwd")}.get(c["kind"], (c["kind"],))
            rs = [dict({k: v for k, v in c.items() if k != "lens"}, group=g, status="error",
                       error=f"{type(exc).__name__}: {str(exc)[:300]}") for g in groups]
        for r in rs:
            r["case_s"] = round(time.time() - t_case, 2)
            r["stratum"] = _stratum(c)
            print(f"{r['group']:9s} {r['case']:58s} {r.get('status'):6s} ratio={r.get('ratio')} "
                  f"peer={r.get('peer_kind')} eager={r.get('ratio_eager')} "
                  f"{r.get('error', '')[:120]}", flush=True)
        rows.extend(rs)
        torch.cuda.empty_cache()
        if out_path and i % 4 == 3:
            _write(out_path, rows, skipped, seed, t0)
    return _write(out_path, rows, skipped, seed, t0)


def _write(out_path, rows, skipped, seed, t0) -> dict:
    from ck_core.bench import device_name

    summ = _summary(rows)
    res = with_header({"suite": "broad", "seed": seed, "rows": rows, "skipped_for_time": skipped,
                       "elapsed_s": round(time.time() - t0, 1), "summary": summ,
                       "geomean": summ.get("fwd/all", {}).get("ratio_geomean")},
                      command="python -m ck_fmha.bench_broad " + " ".join(sys.argv[1:]), device=device_name())
    if out_path:
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return res


def bench(peer: str, options: dict) -> dict:
    """``ck bench fmha --suite broad``: the rows that ran and were right (the table and geomeans), the
    others under ``extra.failed``; per-group summaries (train / held-out) under ``extra.summary``."""
    from ck_core.errors import UnsupportedProblem

    if peer not in ("sdpa", "torch", "cudnn"):
        raise UnsupportedProblem(f"fmha benchmarks compare with 'sdpa' (torch SDPA cuDNN/flash), not {peer!r}")
    res = run(None, float(options.get("budget") or 420.0), quick=bool(options.get("quick")),
              progress=options.get("progress"))
    return broad_result(res)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/fmha_broad.json")
    ap.add_argument("--budget", type=float, default=420.0)
    ap.add_argument("--kinds", default="")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--cases", default="", help="comma-separated case indices (--list) or name parts")
    ap.add_argument("--shard", default="", metavar="I/N", help="every N-th case from the I-th (one GPU of N)")
    ap.add_argument("--quick", action="store_true",
                    help="one case of every stratum (head dims, decode page sizes): minutes on one GPU")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    if a.list:
        cs = cases()
        keep = {id(c) for c in quick_cases(cs)} if a.quick else None
        for i, c in enumerate(cs):
            if keep is None or id(c) in keep:
                print(i, c["split"], _stratum(c), c["case"])
    else:
        res = run(a.out, a.budget, kinds=a.kinds.split(",") if a.kinds else None, limit=a.limit or None,
                  which=a.cases, shard=a.shard, quick=a.quick)
        print(json.dumps(res["summary"], indent=1))
