"""Triton GEMM templates for ck-gemm: kernels, meta-parameter space, AOT specs, launcher, tuning.

Public API::

    gemm(a, b, *, layout="rcr", config=None, c=None, d_tensors=(), d_op="add",
         activation=None, split_k=None, out_dtype=None)      # torch tensors in, C out
    CONFIG_SPACE, GemmConfig, iter_configs, smem_bytes         # meta-parameters as data
    kernel_for(config, dtype=..., layout=..., ...) -> KernelSpec   # for AOT compilation
    pick_config(M, N, K, dtype, arch="sm90")                   # tuned selection

Importing this package imports triton (the kernels are defined at import);
torch is imported only when :func:`gemm` runs.
"""
from __future__ import annotations

from .aot import KernelSpec, kernel_for, parse_layout
from .configs import (CONFIG_SPACE, PERSISTENT_VARIANTS, SPLITK_VARIANTS, TMA_VARIANTS, VARIANTS,
                      WS_VARIANTS, GemmConfig, as_config, iter_configs, smem_bytes)
from .launch import gemm
from .tuning import heuristic_config, load_table, pick_config, shape_bucket

__all__ = [
    "CONFIG_SPACE", "GemmConfig", "KernelSpec", "PERSISTENT_VARIANTS", "SPLITK_VARIANTS", "TMA_VARIANTS",
    "VARIANTS", "WS_VARIANTS", "as_config", "gemm", "heuristic_config", "iter_configs", "kernel_for",
    "load_table", "parse_layout", "pick_config", "shape_bucket", "smem_bytes",
]
