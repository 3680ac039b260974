"""NumPy reference for grouped convolution, all three directions, 1D/2D/3D.

Computes in float64.  Tensors come and go in the problem's layouts; inside,
everything is moved to the canonical order ``x: (N, G, C, *spatial)``,
``w: (G, K, C, *filter)``, ``y: (N, G, K, *out_spatial)`` (per-group C, K),
and the convolution is a loop over filter taps of one einsum each (a tap's
contribution is a strided slice of the padded input).
"""
from __future__ import annotations

import itertools

import numpy as np

from ck_core.errors import InvalidProblem

from .problem import _FLT, _IMG, ConvProblem


def _canon(layout: str, kind: str, ndim: int) -> str:
    if kind == "in":
        return "NGC" + _IMG[ndim]
    if kind == "out":
        return "NGK" + _IMG[ndim]
    return "GKC" + _FLT[ndim]


def to_canonical(a: np.ndarray, layout: str, kind: str, ndim: int) -> np.ndarray:
    """Reorder an array from ``layout`` to the canonical order of its kind."""
    canon = _canon(layout, kind, ndim)
    return np.transpose(a, [layout.index(ch) for ch in canon])


def from_canonical(a: np.ndarray, layout: str, kind: str, ndim: int) -> np.ndarray:
    canon = _canon(layout, kind, ndim)
    return np.ascontiguousarray(np.transpose(a, [canon.index(ch) for ch in layout]))


def _tap_slices(p: ConvProblem, tap: tuple) -> tuple:
    """Slices of the padded input that tap ``tap`` reads, one per output position."""
    sl = []
    for d in range(p.ndim):
        start = tap[d] * p.dilation[d]
        stop = start + p.stride[d] * (p.output_spatial[d] - 1) + 1
        sl.append(slice(start, stop, p.stride[d]))
    return (slice(None),) * 3 + tuple(sl)


def _pad_width(p: ConvProblem) -> list:
    return [(0, 0)] * 3 + list(zip(p.pad_left, p.pad_right))


def _crop(p: ConvProblem) -> tuple:
    return (slice(None),) * 3 + tuple(slice(pl, pl + i) for pl, i in zip(p.pad_left, p.input_spatial))


def conv_fwd(p: ConvProblem, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Output (problem's out_layout, float64) of the forward convolution."""
    p.check_shapes(x=x, w=w)
    xc = np.pad(to_canonical(np.asarray(x, np.float64), p.in_layout, "in", p.ndim), _pad_width(p))
    wc = to_canonical(np.asarray(w, np.float64), p.wei_layout, "wei", p.ndim)
    y = np.zeros((p.N, p.G, p.k_per_group) + p.output_spatial)
    for tap in itertools.product(*(range(f) for f in p.filter)):
        y += np.einsum("ngc...,gkc->ngk...", xc[_tap_slices(p, tap)], wc[(slice(None),) * 3 + tap])
    return from_canonical(y, p.out_layout, "out", p.ndim)


def conv_bwd_data(p: ConvProblem, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Input gradient (problem's in_layout, float64) given the output gradient."""
    p.check_shapes(w=w, y=dy)
    dyc = to_canonical(np.asarray(dy, np.float64), p.out_layout, "out", p.ndim)
    wc = to_canonical(np.asarray(w, np.float64), p.wei_layout, "wei", p.ndim)
    padded = tuple(i + pl + pr for i, pl, pr in zip(p.input_spatial, p.pad_left, p.pad_right))
    dx = np.zeros((p.N, p.G, p.c_per_group) + padded)
    for tap in itertools.product(*(range(f) for f in p.filter)):
        dx[_tap_slices(p, tap)] += np.einsum("ngk...,gkc->ngc...", dyc, wc[(slice(None),) * 3 + tap])
    return from_canonical(dx[_crop(p)], p.in_layout, "in", p.ndim)


def conv_bwd_weight(p: ConvProblem, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """Weight gradient (problem's wei_layout, float64) given input and output gradient."""
    p.check_shapes(x=x, y=dy)
    xc = np.pad(to_canonical(np.asarray(x, np.float64), p.in_layout, "in", p.ndim), _pad_width(p))
    dyc = to_canonical(np.asarray(dy, np.float64), p.out_layout, "out", p.ndim)
    dw = np.zeros((p.G, p.k_per_group, p.c_per_group) + p.filter)
    for tap in itertools.product(*(range(f) for f in p.filter)):
        xs = xc[_tap_slices(p, tap)]
        dw[(slice(None),) * 3 + tap] = np.einsum("ngkp,ngcp->gkc", dyc.reshape(dyc.shape[:3] + (-1,)),
                                                 xs.reshape(xs.shape[:3] + (-1,)))
    return from_canonical(dw, p.wei_layout, "wei", p.ndim)


def reference(p: ConvProblem, tensors: dict) -> np.ndarray:
    """Dispatch on ``p.direction``; ``tensors`` holds the named operands (x, w, dy)."""
    if p.direction == "forward":
        return conv_fwd(p, tensors["x"], tensors["w"])
    if p.direction == "bwd_data":
        return conv_bwd_data(p, tensors["dy"], tensors["w"])
    return conv_bwd_weight(p, tensors["x"], tensors["dy"])


def random_operands(p: ConvProblem, seed: int = 0, dtype=np.float32) -> dict:
    """Random inputs for ``p``'s direction, in its layouts (values in [-1, 1))."""
    rng = np.random.default_rng(seed)

    def r(shape):
        return (rng.random(shape) * 2 - 1).astype(dtype)

    if p.direction == "forward":
        return {"x": r(p.input_shape), "w": r(p.weight_shape)}
    if p.direction == "bwd_data":
        return {"dy": r(p.output_shape), "w": r(p.weight_shape)}
    return {"x": r(p.input_shape), "dy": r(p.output_shape)}


def rel_error(out, ref) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; NaN anywhere gives inf."""
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    if out.shape != ref.shape:
        raise InvalidProblem(f"output shape {out.shape} differs from the reference shape {ref.shape}")
    if not np.all(np.isfinite(out)):
        return float("inf")
    den = np.linalg.norm(ref.ravel())
    return float(np.linalg.norm((out - ref).ravel()) / (den if den > 0 else 1.0))
