"""Triton FMHA kernels (forward, backward, split-KV / paged decode, append-KV, batch prefill) for ck-fmha."""
from .aot import aot_compile, constexprs_for, kernel_for, signature_for  # noqa: F401
from .configs import CUDA_ONLY_VARIANTS, FAMILIES, VARIANTS, TritonFmhaConfig  # noqa: F401
from .tuning import default_bwd_configs, default_fwd_config, default_splitkv_config  # noqa: F401
from .launch import (appendkv, batch_prefill, bwd, dropout_randval, fp8_v_trans_default, fwd,  # noqa: F401
                     is_key_major, mask_params, paged_decode, splitkv_decode, v_key_major)


def attention(*args, **kw):
    """``ck_fmha.attention`` (through the Dispatcher; kept here for older imports)."""
    from ...api import attention as _attention

    return _attention(*args, **kw)
