"""Compare a kernel's output with a float64 reference; dtype-aware tolerances."""
from __future__ import annotations

from typing import Optional

import attrs
import numpy as np

from .dtypes import ATOL, RTOL
from .errors import InvalidProblem, ValidationFailed


@attrs.frozen
class Verdict:
    passed: bool
    name: str
    max_abs: float
    max_rel: float
    rel_l2: float
    n_bad: int
    n_total: int
    rtol: float
    atol: float

    def __str__(self) -> str:
        word = "PASS" if self.passed else "FAIL"
        return (f"{word} {self.name}: rel_l2={self.rel_l2:.2e} max_abs={self.max_abs:.2e} "
                f"bad={self.n_bad}/{self.n_total} (rtol={self.rtol:g}, atol={self.atol:g})")

    def raise_if_failed(self) -> "Verdict":
        if not self.passed:
            raise ValidationFailed(f"{self}; the kernel disagrees with the reference")
        return self


def compare(out, ref, dtype: str = "fp32", name: str = "out", rtol: Optional[float] = None,
            atol: Optional[float] = None) -> Verdict:
    """Element-wise |out - ref| <= atol + rtol*|ref| (NaN/inf must match exactly)."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape:
        raise InvalidProblem(f"{name}: output shape {out.shape} differs from reference {ref.shape}")
    rtol = RTOL.get(dtype, 1e-2) if rtol is None else rtol
    atol = ATOL.get(dtype, 1e-2) if atol is None else atol
    finite = np.isfinite(ref)
    same_nonfinite = np.where(finite, True, (out == ref) | (np.isnan(out) & np.isnan(ref)))
    diff = np.where(finite, np.abs(out - ref), 0.0)
    diff = np.where(np.isnan(diff), np.inf, diff)
    bad = (diff > atol + rtol * np.abs(np.where(finite, ref, 0.0))) | ~same_nonfinite
    n_total = int(ref.size)
    ref_f = np.where(finite, ref, 0.0)
    denom = float(np.linalg.norm(ref_f.ravel())) or 1.0
    rel_l2 = float(np.linalg.norm(diff.ravel())) / denom if n_total else 0.0
    max_abs = float(diff.max()) if n_total else 0.0
    max_rel = float((diff / np.maximum(np.abs(ref_f), atol or 1e-30)).max()) if n_total else 0.0
    n_bad = int(bad.sum())
    return Verdict(n_bad == 0, name, max_abs, max_rel, rel_l2, n_bad, n_total, rtol, atol)


@attrs.frozen
class Report:
    verdicts: tuple

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.verdicts)

    def __str__(self) -> str:
        return "\n".join(str(v) for v in self.verdicts)


def compare_all(outputs: dict, reference: dict, dtypes: dict, tolerances: Optional[dict] = None) -> Report:
    """Compare every output named in ``reference``; ``dtypes`` maps name -> dtype token."""
    tol = tolerances or {}
    verdicts = []
    for name, ref in reference.items():
        if name not in outputs:
            raise InvalidProblem(f"the kernel produced no output {name!r}")
        rtol, atol = tol.get(name, (None, None))
        verdicts.append(compare(outputs[name], ref, dtypes.get(name, "fp32"), name, rtol, atol))
    return Report(tuple(verdicts))
