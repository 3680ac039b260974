"""Triton FMHA kernels (forward, backward, split-KV / paged decode, append-KV, batch prefill) for ck-fmha."""
from .configs import (CUDA_ONLY_VARIANTS, FAMILIES, VARIANTS, TritonFmhaConfig, aot_compile,  # noqa: F401
                      constexprs_for, default_bwd_configs, default_fwd_config, default_splitkv_config,
                      kernel_for, num_splits_heuristic, signature_for)
from .ops import (AttentionFunction, appendkv, attention, batch_prefill, bwd, dropout_randval,  # noqa: F401
                  fp8_v_trans_default, fwd, is_key_major, mask_params, paged_decode, splitkv_decode,
                  v_key_major)
