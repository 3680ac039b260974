"""ck-gemm: the GEMM op plugin of ck-dispatcher.

Torch entry points (through the Dispatcher; torch loads on first use)::

    from ck_gemm import matmul, linear
    c = matmul(a, b, d=(bias,), activation="gelu")
    y = linear(x, weight, bias)
    w = preshuffle(weight)          # packed once in a kernel's tile order (CK's preshuffle GEMM)
    y = linear(x, w, bias)
    ck_gemm.patch(model)            # every nn.Linear of a model through linear (ck_gemm.nn)
"""
from .keys import GemmAlgorithm, GemmSignature
from .problem import GemmProblem

__all__ = ["GemmProblem", "GemmSignature", "GemmAlgorithm", "matmul", "linear", "preshuffle", "PackedWeight",
           "patch", "unpatch"]


def __getattr__(name):
    if name in ("matmul", "linear", "preshuffle", "PackedWeight", "patch", "unpatch"):
        import importlib

        try:
            mod = importlib.import_module(".nn" if name in ("patch", "unpatch") else ".api", __name__)
        except ImportError as exc:
            from ck_core.deps import missing

            raise missing(exc, f"ck_gemm.{name}", "ck-gemm") from exc
        fn = globals()[name] = getattr(mod, name)   # later lookups skip this function
        return fn
    raise AttributeError(f"module 'ck_gemm' has no attribute {name!r}")
