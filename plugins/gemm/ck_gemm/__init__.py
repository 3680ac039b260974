"""ck-gemm: the GEMM op plugin of ck-dispatcher."""
from .kernel import GemmAlgorithm, GemmSignature
from .problem import GemmProblem

__all__ = ["GemmProblem", "GemmSignature", "GemmAlgorithm"]
