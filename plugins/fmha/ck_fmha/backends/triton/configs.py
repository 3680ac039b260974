"""Meta-parameters of the Triton FMHA kernels as plain data: the families, the variants, one
kernel instance's configuration (:class:`TritonFmhaConfig`) and the feature codes the kernels
take as constexprs.  Which configuration a problem gets is :mod:`.tuning` (the tuned tables) and
``ck_fmha.heuristics`` (the ranking); compiling one ahead of time is :mod:`.aot`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Dict

from .gluon_fwd import GLUON_VARIANTS as _GLUON_FLAGS

FAMILIES = (
    "fwd",
    "fwd_splitkv",
    "fwd_splitkv_combine",
    "fwd_pagedkv",  # fwd_splitkv with page_size > 0
    "bwd_dot_do_o",
    "bwd_dq_dk_dv",
    "bwd_dq",
    "bwd_convert_dq",
    "dropout_randval",  # store_randval: the forward's uint8 dropout random values
    "fwd_appendkv",     # knew/vnew into the KV cache (+ RoPE on knew and q)
    "batch_prefill",    # fwd with a paged KV cache (page_size > 0), group mode
    "v_transpose",      # the key-contiguous copy of V that the fp8 forward reads on NVIDIA (v_trans)
)

#: the forward of gluon_fwd.py (sm90, fp16/bf16, head dim 64/128, no-padding problems):
#: ``gluon_fwd.GLUON_VARIANTS[variant]`` holds its launch flags
GLUON_VARIANTS = tuple(_GLUON_FLAGS)
VARIANTS = ("ptr", "tma", "tma_ws", "tma_host") + GLUON_VARIANTS
# variants that need NVIDIA Hopper+ (device-side TMA descriptors / warp specialisation / Gluon)
CUDA_ONLY_VARIANTS = ("tma", "tma_ws", "tma_host") + GLUON_VARIANTS
# tma_host: host-side TensorDescriptor arguments over the flattened 2-D view
# (its Q/K/V arguments are descriptors; signature_for gives their tensordesc<> types)


@dataclass(frozen=True)
class TritonFmhaConfig:
    """Meta-parameters of one kernel instance (plain data)."""

    BLOCK_M: int = 128
    BLOCK_N: int = 64
    num_warps: int = 4
    num_stages: int = 3
    variant: str = "ptr"
    #: the forward's head-dim chunk (0: one tile padded to the next power of two): a head dim above it
    #: runs as two power-of-two chunks, DCHUNK + the rest padded (:func:`hdim_blocks`)
    DCHUNK: int = 0
    #: the Triton dK/dV kernel's group split (0/1: none): a kv head's GQA group of query heads summed by
    #: GSPLIT programs into fp32 partials, added up after (see kernels.fmha_bwd_dq_dk_dv_kernel)
    GSPLIT: int = 0

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def with_(self, **kw) -> "TritonFmhaConfig":
        return replace(self, **kw)


def next_pow2(x: int) -> int:
    return 1 << max(0, int(x - 1).bit_length())


def padded_hdim(d: int) -> int:
    return max(16, next_pow2(d))


def hdim_blocks(d: int, chunk: int = 0):
    """(first tile, second tile) of head dim ``d``: ``(padded_hdim(d), 0)`` unless ``chunk`` (a power of
    two, at least 16) is below ``d``: then ``(chunk, padded_hdim(d - chunk))``, e.g. 160 -> (128, 32),
    192 -> (128, 64), 80 -> (64, 16), instead of one tile of 256 / 256 / 128."""
    if not chunk or d <= chunk:
        return padded_hdim(d), 0
    return chunk, padded_hdim(d - chunk)


def valid_dchunk(chunk: int) -> bool:
    return chunk == 0 or (16 <= chunk <= 256 and chunk & (chunk - 1) == 0)


BWD_ATOMIC_DQ_DEFAULT = False

ROPE_MODES = {"none": 0, "interleaved": 1, "half_rotated": 2}

BIAS_MODES = {"none": 0, "elementwise": 1, "alibi_vertical": 2, "alibi_top_left": 3, "alibi_bottom_right": 4,
              "alibi": 4}


def bias_mode_of(x) -> int:
    """Kernel BIAS_MODE from a config value: an int 0..4 or a name of :data:`BIAS_MODES`."""
    if isinstance(x, str):
        if x not in BIAS_MODES:
            raise ValueError(f"bias mode {x!r} is not one of {', '.join(BIAS_MODES)}")
        return BIAS_MODES[x]
    x = int(x)
    if not 0 <= x <= 4:
        raise ValueError(f"bias mode {x} is not in 0..4")
    return x

