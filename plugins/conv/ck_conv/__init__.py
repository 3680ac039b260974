"""ck-conv: the grouped convolution op plugin of ck-dispatcher.

Light at import: torch and triton load only when a kernel is launched or compiled.
Torch entry points (through the Dispatcher, with autograd): ``conv1d``, ``conv2d``,
``conv3d`` taking ``torch.nn.functional.conv*d``'s arguments (see :mod:`ck_conv.api`);
``patch(model)`` sends a model's ``nn.Conv*d`` layers through them (:mod:`ck_conv.nn`).
"""
from __future__ import annotations

from .keys import ConvKernelConfig
from .problem import ConvProblem

__all__ = ["ConvProblem", "ConvKernelConfig", "enumerate_configs", "heuristic_config", "run", "kernel_for",
           "reference", "conv1d", "conv2d", "conv3d", "patch", "unpatch"]


#: public names and the module that holds each, imported on first use
_LAZY = {"conv1d": "api", "conv2d": "api", "conv3d": "api", "patch": "nn", "unpatch": "nn",
         "enumerate_configs": "space",
         "heuristic_config": "heuristics"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        try:
            mod = importlib.import_module(f".{_LAZY[name]}", __name__)
        except ImportError as exc:
            from ck_core.deps import missing

            raise missing(exc, f"ck_conv.{name}", "ck-conv") from exc
        fn = globals()[name] = getattr(mod, name)
        return fn   # later lookups skip this function
    raise AttributeError(f"module 'ck_conv' has no attribute {name!r}")


def run(problem, tensors, config=None):
    """Run ``problem`` on torch tensors with a Triton kernel (see :func:`ck_conv.backends.triton.launch.run`)."""
    from .backends.triton.launch import run as _run
    return _run(problem, tensors, config)


def kernel_for(key_or_config, problem=None):
    """``(jit_fn, constexprs, grid)`` of a kernel (see :func:`ck_conv.backends.triton.aot.kernel_for`)."""
    from .backends.triton.aot import kernel_for as _kf
    return _kf(key_or_config, problem)


def reference(problem, tensors):
    """Float64 NumPy result of ``problem`` (see :func:`ck_conv.reference.reference`)."""
    from .reference import reference as _ref
    return _ref(problem, tensors)
