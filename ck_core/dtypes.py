"""Data-type names shared by every plugin.

Names follow CK's short tokens.  ``fp8`` is OCP e4m3 and ``bf8`` is e5m2 (CK's
naming); numpy has neither, so the numpy backend emulates them by rounding
float32 values to the representable grid (:func:`quantize`).
"""
from __future__ import annotations

import numpy as np

from .errors import InvalidProblem

#: element size in bytes
ELEMENT_BYTES = {
    "fp16": 2, "bf16": 2, "fp32": 4, "fp64": 8,
    "fp8": 1, "bf8": 1, "int8": 1, "int32": 4,
}
FLOAT_DTYPES = ("fp16", "bf16", "fp32", "fp8", "bf8")
#: token -> torch dtype name (fp8: OCP e4m3fn; an arch whose units read e4m3fnuz says so itself)
TORCH_NAMES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "fp64": "float64", "fp8": "float8_e4m3fn",
               "bf8": "float8_e5m2", "int8": "int8", "int32": "int32"}
ALL_DTYPES = tuple(ELEMENT_BYTES)

#: (mantissa bits, max finite) of the emulated narrow floats
_NARROW = {"bf16": (7, 3.3895313892515355e38), "fp8": (3, 448.0), "bf8": (2, 57344.0)}

#: default relative tolerance of a kernel output against a float64 reference
RTOL = {"fp16": 2e-2, "bf16": 5e-2, "fp32": 1e-4, "fp64": 1e-10,
        "fp8": 2.5e-1, "bf8": 3.5e-1, "int8": 0.0, "int32": 0.0}
ATOL = {"fp16": 2e-2, "bf16": 5e-2, "fp32": 1e-4, "fp64": 1e-10,
        "fp8": 2.5e-1, "bf8": 3.5e-1, "int8": 0.0, "int32": 0.0}


def torch_dtype(token: str):
    """The torch dtype of a dtype token (imports torch)."""
    import torch

    check_dtype(token)
    return getattr(torch, TORCH_NAMES[token])


def check_dtype(name: str, allowed=ALL_DTYPES) -> str:
    if name not in allowed:
        raise InvalidProblem(f"unknown dtype {name!r}; use one of {', '.join(allowed)}")
    return name


def numpy_storage(name: str) -> np.dtype:
    """The numpy dtype that holds values of ``name`` (narrow floats live in float32)."""
    check_dtype(name)
    return np.dtype({"fp16": np.float16, "fp32": np.float32, "fp64": np.float64,
                     "bf16": np.float32, "fp8": np.float32, "bf8": np.float32,
                     "int8": np.int8, "int32": np.int32}[name])


def quantize(x: np.ndarray, name: str) -> np.ndarray:
    """Round ``x`` to the values representable in ``name``; returns numpy storage dtype."""
    check_dtype(name)
    if name in _NARROW:
        mant, vmax = _NARROW[name]
        x = np.asarray(x, dtype=np.float64)
        x = np.clip(x, -vmax, vmax)
        m, e = np.frexp(x)  # x = m * 2**e, 0.5 <= |m| < 1
        scale = float(2 ** (mant + 1))
        m = np.round(m * scale) / scale
        return np.ldexp(m, e).astype(np.float32)
    if name in ("int8", "int32"):
        info = np.iinfo(numpy_storage(name))
        return np.clip(np.rint(x), info.min, info.max).astype(numpy_storage(name))
    return np.asarray(x).astype(numpy_storage(name))


def accumulator(name: str) -> str:
    return {"int8": "int32", "fp64": "fp64"}.get(name, "fp32")
