"""Triton FMHA kernels (forward, backward, split-KV / paged decode, append-KV, batch prefill) for ck-fmha."""
import importlib
import importlib.util

# loaded on first use (PEP 562): the key space (``.keys``) is read without importing torch and
# triton, so `ck run fmha` on the numpy backend, and ck list, stay fast
_LAZY = {
    **dict.fromkeys(("aot_compile", "constexprs_for", "kernel_for", "signature_for"), "aot"),
    **dict.fromkeys(("CUDA_ONLY_VARIANTS", "FAMILIES", "VARIANTS", "TritonFmhaConfig"), "configs"),
    **dict.fromkeys(("default_bwd_configs", "default_fwd_config", "default_splitkv_config"), "tuning"),
    **dict.fromkeys(("appendkv", "batch_prefill", "bwd", "dropout_randval", "fp8_v_trans_default", "fwd",
                     "is_key_major", "mask_params", "paged_decode", "splitkv_decode", "v_key_major"), "launch"),
}


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    if importlib.util.find_spec(f"{__name__}.{name}") is not None:   # a submodule, as the eager import gave
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def attention(*args, **kw):
    """``ck_fmha.attention`` (through the Dispatcher; kept here for older imports)."""
    from ...api import attention as _attention

    return _attention(*args, **kw)
