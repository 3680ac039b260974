"""NumPy reference (float64) and the numpy-backend implementation of GEMM keys."""
from __future__ import annotations

import math

import numpy as np

from ck_core.dtypes import quantize

from .problem import pack_b, unpack_b

_ACT = {
    "none": lambda x: x,
    "relu": lambda x: np.maximum(x, 0),
    "gelu": lambda x: 0.5 * x * (1.0 + np.vectorize(math.erf, otypes=[np.float64])(x / math.sqrt(2.0))),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "tanh": np.tanh,
}


def _logical(problem, a, b):
    """Views of A as (batch, M, K) and B as (batch, K, N) whatever the storage layout."""
    bt = problem.batch
    a = np.asarray(a).reshape((bt,) + problem.shape_a()[-2:])
    if problem.preshuffle:   # packed tiles back to the N x K weight (a view of the tiles, padding cut)
        b = unpack_b(np.asarray(b).reshape(problem.shape_b()), problem.n, problem.k)[None]
    else:
        b = np.asarray(b).reshape((bt,) + problem.shape_b()[-2:])
    if problem.layout[0] == "c":
        a = a.transpose(0, 2, 1)
    if problem.layout[1] == "c":
        b = b.transpose(0, 2, 1)
    return a, b


def _to_storage(problem, c):
    if problem.layout[2] == "c":
        c = c.transpose(0, 2, 1)
    return c.reshape(problem.shape_c())


def _epilogue(problem, acc, tensors, dtype):
    bt = problem.batch
    for i in range(problem.num_d):
        d = np.asarray(tensors[f"d{i}"], dtype=dtype).reshape((bt,) + problem.shape_c()[-2:])
        if problem.layout[2] == "c":
            d = d.transpose(0, 2, 1)
        acc = acc + d if problem.d_op == "add" else acc * d
    return _ACT[problem.activation](acc)


def reference(problem, tensors: dict) -> dict:
    """Exact float64 result of the problem (no rounding but the inputs')."""
    a, b = _logical(problem, tensors["a"], tensors["b"])
    acc = np.matmul(a.astype(np.float64), b.astype(np.float64))
    return {"c": _to_storage(problem, _epilogue(problem, acc, tensors, np.float64))}


def run_numpy(key, problem, tensors: dict) -> dict:
    """What the kernel computes: inputs as given, accumulate in fp32 (int32 for int8), round to C."""
    problem.check_arrays(tensors)
    a, b = _logical(problem, tensors["a"], tensors["b"])
    if problem.dtype == "int8":
        acc = np.matmul(a.astype(np.int64), b.astype(np.int64))
        acc = np.clip(acc, -2**31, 2**31 - 1)
        return {"c": _to_storage(problem, acc.astype(np.int32))}
    split = max(key.algorithm.split_k, 1)
    bounds = np.linspace(0, problem.k, split + 1).astype(int)
    acc = np.zeros(a.shape[:2] + (b.shape[2],), dtype=np.float32)
    for lo, hi in zip(bounds[:-1], bounds[1:]):  # split-K partial sums, as the kernel adds them
        acc += np.matmul(a[..., lo:hi].astype(np.float32), b[:, lo:hi, :].astype(np.float32))
    out = _epilogue(problem, acc, tensors, np.float32)
    return {"c": quantize(_to_storage(problem, out), problem.dtype_c)}


def make_inputs(problem, rng: np.random.Generator) -> dict:
    """Fresh random inputs in storage layout and dtype (never zeros)."""
    def draw(shape, dtype):
        if dtype in ("int8",):
            x = rng.integers(-8, 9, size=shape)
            x[x == 0] = 1
            return quantize(x, dtype)
        x = rng.uniform(-1.0, 1.0, size=shape)
        return quantize(x, dtype)

    if problem.preshuffle:   # the N x K weight, packed for the problem's tile (zeros in the padding)
        b = pack_b(draw((problem.n, problem.k), problem.dtype), problem.pack_n, problem.pack_k)
    else:
        b = draw(problem.shape_b(), problem.dtype)
    out = {"a": draw(problem.shape_a(), problem.dtype), "b": b}
    for i in range(problem.num_d):
        out[f"d{i}"] = draw(problem.shape_c(), problem.dtype_c)
    return out


def tolerance(problem) -> dict:
    """(rtol, atol) per output: rounding of C plus fp32 accumulation over K terms."""
    from ck_core.dtypes import RTOL

    if problem.dtype == "int8":
        return {"c": (0.0, 0.0)}
    r = max(RTOL[problem.dtype_c], 1e-5)
    scale = math.sqrt(problem.k) / 3.0 + 1.0   # std of a sum of K products of U(-1,1)
    return {"c": (r, r * scale)}


def working_bytes(problem, backend: str) -> float:
    """Memory the numpy backend needs beyond the tensors: 8-byte copies of A and B (float64 in
    the reference, int64 for int8), the accumulator, a D copy each and the epilogue's temporaries."""
    if backend != "numpy":
        return 0.0
    p = problem
    return 8.0 * p.batch * (p.m * p.k + p.k * p.n + (3 + p.num_d) * p.m * p.n)
