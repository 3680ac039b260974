"""Triton GEMM templates for ck-gemm: kernels, meta-parameter space, AOT specs, launcher.

Public API::

    gemm(a, b, *, layout="rcr", config, c=None, d_tensors=(), d_op="add",
         activation=None, split_k=None, out_dtype=None)      # torch tensors in, C out
    CONFIG_SPACE, GemmConfig, iter_configs, smem_bytes         # meta-parameters as data
    kernel_for(config, dtype=..., layout=..., ...) -> KernelSpec   # for AOT compilation

The names load lazily: importing this package (or its data module ``configs``) imports neither
triton nor torch; ``kernels``, ``aot`` and ``launch`` import triton.  The tuned tables and
``pick_config`` are ``ck_gemm.heuristics``'s (the plugin's one reader of its tuned data).
"""
from __future__ import annotations

import importlib

_NAMES = {
    "KernelSpec": "aot", "kernel_for": "aot", "parse_layout": "aot",
    "CONFIG_SPACE": "configs", "PERSISTENT_VARIANTS": "configs", "SPLITK_VARIANTS": "configs",
    "TMA_VARIANTS": "configs", "VARIANTS": "configs", "WS_VARIANTS": "configs", "GemmConfig": "configs",
    "as_config": "configs", "iter_configs": "configs", "smem_bytes": "configs",
    "gemm": "launch",
}
__all__ = sorted(_NAMES)


def __getattr__(name):
    mod = _NAMES.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{mod}", __name__), name)
