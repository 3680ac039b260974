"""Inputs, the float64 reference (written from the math) and the tolerances."""
from __future__ import annotations

import numpy as np

from ck_core.dtypes import ATOL, RTOL, quantize


def make_inputs(problem, rng) -> dict:
    """Fresh random x (rows x cols) and w (cols), in the problem's dtype's storage."""
    x = rng.uniform(-2.0, 2.0, (problem.rows, problem.cols))
    w = rng.uniform(0.5, 1.5, (problem.cols,))
    return {"x": quantize(x, problem.dtype), "w": quantize(w, problem.dtype)}


def reference(problem, tensors: dict) -> dict:
    x = np.asarray(tensors["x"], dtype=np.float64)
    w = np.asarray(tensors["w"], dtype=np.float64)
    return {"y": x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + problem.eps) * w}


def tolerance(problem) -> dict:
    return {"y": (RTOL[problem.dtype], ATOL[problem.dtype])}
