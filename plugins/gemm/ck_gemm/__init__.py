"""ck-gemm: the GEMM op plugin of ck-dispatcher.

Torch entry points (through the Dispatcher; torch loads on first use)::

    from ck_gemm import matmul, linear
    c = matmul(a, b, d=(bias,), activation="gelu")
    y = linear(x, weight, bias)
    w = preshuffle(weight)          # packed once in a kernel's tile order (CK's preshuffle GEMM)
    y = linear(x, w, bias)
"""
from .keys import GemmAlgorithm, GemmSignature
from .problem import GemmProblem

__all__ = ["GemmProblem", "GemmSignature", "GemmAlgorithm", "matmul", "linear", "preshuffle", "PackedWeight"]


def __getattr__(name):
    if name in ("matmul", "linear", "preshuffle", "PackedWeight"):
        try:
            from . import api
        except ImportError as exc:
            from ck_core.deps import missing

            raise missing(exc, f"ck_gemm.{name}", "ck-gemm") from exc

        fn = globals()[name] = getattr(api, name)   # later lookups skip this function
        return fn
    raise AttributeError(f"module 'ck_gemm' has no attribute {name!r}")
