"""Run a differential fuzz test's cases under a time budget, one logged line per case.

A fuzz test that dies to an outside time limit reports nothing, and one that stops at its first
mismatch hides the others.  :func:`run_cases` prints (and flushes) a line per case as it
finishes -- the problem, the kernel that ran, its error figures -- stops drawing new cases once
the budget is spent, and at the end fails with every mismatch and what reproduces it (the
test's seed, the case's index and fields, the kernel).  A run in which no case ran fails too:
a budget too small to run anything is not a pass.

``CK_FUZZ_BUDGET_S`` overrides a test's budget (seconds); ``CK_FUZZ_CASE`` runs only the case
of that index (to reproduce one mismatch).
"""
from __future__ import annotations

import os
import time
from typing import Callable, Iterable, Optional

BUDGET_ENV = "CK_FUZZ_BUDGET_S"
CASE_ENV = "CK_FUZZ_CASE"


def budget_s(default: Optional[float]) -> Optional[float]:
    """The test's budget: ``CK_FUZZ_BUDGET_S`` when set to a positive number, else ``default``."""
    raw = os.environ.get(BUDGET_ENV, "").strip()
    if raw:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{BUDGET_ENV}={raw!r} is not a number of seconds") from None
        if value > 0:
            return value
    return default


def _only_case() -> Optional[int]:
    raw = os.environ.get(CASE_ENV, "").strip()
    return int(raw) if raw else None


def run_cases(label: str, cases: Iterable[dict], run_one: Callable[[dict, dict], Optional[str]], *,
              seed: int, budget: Optional[float] = None, describe: Callable[[dict], str] = repr,
              printer: Callable[[str], None] = None) -> int:
    """Run ``run_one(case, info)`` for each case; returns how many ran, raises AssertionError on
    any mismatch or when none ran.

    ``run_one`` returns None when the case agrees with its reference, else what is wrong; it
    fills ``info`` as it goes: ``info["key"]`` (the kernel's name) and ``info["stats"]`` (error
    figures for the log line).  An exception in a case is a mismatch too (the run goes on).
    """
    out = printer or (lambda s: print(s, flush=True))
    cases = list(cases)
    only = _only_case()
    start = time.monotonic()
    failures: list[str] = []
    ran = 0
    stopped_at = None
    for i, case in enumerate(cases):
        if only is not None and i != only:
            continue
        if budget is not None and ran and time.monotonic() - start > budget:
            stopped_at = i
            break
        info: dict = {"key": "?", "stats": ""}
        t0 = time.monotonic()
        try:
            why = run_one(case, info)
        except Exception as e:  # a crash is a finding, not the end of the run
            why = f"raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ran += 1
        out(f"[{label} {i}/{len(cases)}] {'MISMATCH' if why else 'ok'} {info['key']} {describe(case)} "
            f"{info['stats']} {time.monotonic() - t0:.2f}s" + (f" -- {why}" if why else ""))
        if why:
            failures.append(f"seed={seed} case={i} ({CASE_ENV}={i}) key={info['key']} {describe(case)}: {why}")
    elapsed = time.monotonic() - start
    cut = (f", budget {budget:.0f} s spent: cases {stopped_at}..{len(cases) - 1} not run"
           if stopped_at is not None else "")
    summary = f"{label}: {ran} of {len(cases)} cases ran in {elapsed:.0f} s{cut}; {len(failures)} mismatches"
    out(summary)
    assert ran > 0, f"{label}: no case ran (budget {budget} s): not a pass"
    assert not failures, summary + "\n" + "\n".join(failures)
    return ran


def bound_mismatch(got, ref, tol):
    """``(why, stats)`` for torch tensors ``got`` vs a float64 ``ref`` under per-element bounds
    ``tol``: ``why`` is None when every element is within its bound (and finite), else what is
    wrong, with the worst element; ``stats`` are the relative L2 error and the worst err/bound."""
    import torch

    if tuple(got.shape) != tuple(ref.shape):
        return f"shape {tuple(got.shape)}, expected {tuple(ref.shape)}", ""
    if not torch.isfinite(got).all():
        return f"{int((~torch.isfinite(got)).sum())} non-finite elements (unwritten or overflowed)", ""
    ratio = (got - ref).abs() / tol
    worst = float(ratio.max())
    rel = float((got - ref).norm()) / max(float(ref.norm()), 1e-300)
    stats = f"rel_l2={rel:.3g} max_err/tol={worst:.3g}"
    if worst > 1:
        at = int(ratio.argmax())
        return (f"{int((ratio > 1).sum())}/{ratio.numel()} elements over the bound, worst at flat index {at}: "
                f"got {float(got.flatten()[at]):.9g}, ref {float(ref.flatten()[at]):.9g}, "
                f"tol {float(tol.flatten()[at]):.3g} ({stats})"), stats
    return None, stats
