"""Triton FMHA kernels (forward, backward, split-KV / paged decode, append-KV, batch prefill) for ck-fmha.

The names load lazily (PEP 562): importing this package imports neither triton nor torch, so the key
space (``.keys``) is read fast (`ck run fmha` on the numpy backend, `ck list`).  The launchers run the
kernel they are given (a plan's key); the torch entry points that choose one are ``ck_fmha``'s
(``attention``, ``ck_fmha.decode``, ``ck_fmha.prefill``) and the tuned defaults ``ck_fmha.heuristics``'s.
"""
from __future__ import annotations

import importlib
import importlib.util

_NAMES = {
    "aot_compile": "aot", "constexprs_for": "aot", "kernel_for": "aot", "signature_for": "aot",
    "CUDA_ONLY_VARIANTS": "configs", "FAMILIES": "configs", "VARIANTS": "configs", "TritonFmhaConfig": "configs",
    "appendkv_launch": "launch_decode", "batch_prefill_launch": "launch_decode", "bwd": "launch_bwd",
    "dropout_randval": "launch",
    "fp8_v_trans_default": "launch", "fwd": "launch", "is_key_major": "launch", "mask_params": "launch",
    "v_key_major": "launch",
}
__all__ = sorted(_NAMES)


def __getattr__(name):
    mod = _NAMES.get(name)
    if mod is not None:
        value = globals()[name] = getattr(importlib.import_module(f".{mod}", __name__), name)
        return value
    if importlib.util.find_spec(f"{__name__}.{name}") is not None:   # a submodule, as an eager import gave
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
