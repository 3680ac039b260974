"""The broad FMHA suite's summary (:mod:`ck_fmha.bench_broad`): per group and split, then per
stratum (head dims, decode page sizes), the geomean and minimum of the ratio to each row's peer and
the rows below the floor.
"""
from __future__ import annotations

import math
from typing import Optional

from .bench_broad_cases import HDIM_STRATA, PAGE_STRATA, _stratum

def _stats(rs: list[dict]) -> dict:
    """n, wrong, errors; geomean and minimum of the ratio to the row's peer (graph, eager); rows below
    the floor; the peers the rows ran against."""
    s = {"n": len(rs), "wrong": sum(r.get("status") == "wrong" for r in rs),
         "errors": sum(r.get("status") == "error" for r in rs)}
    for key, name in (("ratio", "graph"), ("ratio_eager", "eager")):
        vals = [r[key] for r in rs if r.get(key)]
        if vals:
            s[f"{name}_geomean"] = round(math.exp(sum(map(math.log, vals)) / len(vals)), 4)
            s[f"{name}_min"] = round(min(vals), 4)
    floored = [r for r in rs if r.get("floor") is not None and r.get("ratio")]
    s["below_floor"] = sum(r["ratio"] < r["floor"] for r in floored)
    s["below_target"] = sum(r["ratio"] < r["peer_target"] for r in rs if r.get("ratio") and r.get("peer_target"))
    peers: dict = {}
    for r in rs:
        if r.get("peer_kind"):
            peers[r["peer_kind"]] = peers.get(r["peer_kind"], 0) + 1
    if peers:
        s["peers"] = peers
    return s


def strata_summary(rows: list[dict]) -> dict:
    """``{group/stratum: stats}`` (:func:`_stats`) for every group (fwd, fwd_train, fwd_bwd, varlen, fp8,
    decode) and stratum (head dims ``d32``..``d256``; decode page sizes ``page1``..``page256`` and
    ``small_cache``), in :data:`HDIM_STRATA` / :data:`PAGE_STRATA` order."""
    order = [f"d{d}" for d in HDIM_STRATA] + [f"page{p}" for p in PAGE_STRATA] + ["small_cache"]
    out = {}
    for g in ("fwd", "fwd_train", "fwd_bwd", "varlen", "fp8", "decode"):
        for st in order:
            rs = [r for r in rows if r.get("group") == g and (r.get("stratum") or _stratum_of_row(r)) == st]
            if rs:
                out[f"{g}/{st}"] = _stats(rs)
    return out


def _stratum_of_row(r: dict) -> Optional[str]:
    try:
        return _stratum(dict(r, kind="decode" if r.get("group") == "decode" else r.get("kind", "attn")))
    except (KeyError, TypeError):
        return None


def _summary(rows: list[dict]) -> dict:
    """Per group and split (``fwd/all``, ``fwd/train``, ...: the earlier keys, peer columns kept), then
    the strata (:func:`strata_summary`) under ``group/stratum``."""
    out = {}
    groups = sorted({r["group"] for r in rows})
    for g in groups:
        # "nowindow": without sliding-window rows (cuDNN computes those slowly: they lift the geomeans)
        for split in ("all", "train", "heldout", "nowindow"):
            rs = [r for r in rows if r["group"] == g and (split == "all" or r.get("split") == split
                                                          or (split == "nowindow" and r.get("mask") != "window"))]
            s = {"n": len(rs), "wrong": sum(r.get("status") == "wrong" for r in rs),
                 "errors": sum(r.get("status") == "error" for r in rs)}
            for key in ("ratio", "ratio_eager", "ratio_cudnn_graph", "ratio_cudnn_eager", "ratio_flash_graph",
                        "ratio_flash_eager", "ratio_flex_graph", "ratio_flex_eager"):
                vals = [r[key] for r in rs if r.get(key)]
                if vals:
                    s[key + "_geomean"] = round(math.exp(sum(map(math.log, vals)) / len(vals)), 4)
                    s[key + "_min"] = round(min(vals), 4)
            s["below_floor"] = sum(bool(r.get("below_floor")) for r in rs)
            out[f"{g}/{split}"] = s
    out.update(strata_summary(rows))
    return out
