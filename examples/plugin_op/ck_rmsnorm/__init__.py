"""ck-rmsnorm: an example op plugin for ck-dispatcher (RMSNorm over the last axis)."""
from .problem import RmsNormProblem

__all__ = ["RmsNormProblem"]
