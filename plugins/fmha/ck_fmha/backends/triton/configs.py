"""Meta-parameters of the Triton FMHA kernels as plain data: the families, the variants, one
kernel instance's configuration (:class:`TritonFmhaConfig`) and the feature codes the kernels
take as constexprs, and the arch predicates the kernels' scope depends on (:func:`hopper`,
:func:`fp8_format`, :func:`fp8_v_trans`: read from the ArchSpec).  Which configuration a problem
gets is ``ck_fmha.heuristics`` (the tuned tables and the ranking); compiling one ahead of time is
:mod:`.aot`.  This module imports nothing of the plugin: every layer may read it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Dict

from ck_core.errors import ConfigError

#: the Gluon sm90 forward's (gluon_fwd.py) dispatcher variants -> its launch flags
GLUON_VARIANT_FLAGS = {"gluon_ws": dict(pingpong=False, persistent=False),
                       "gluon_wspp": dict(pingpong=True, persistent=False),
                       "gluon_ws_pers": dict(pingpong=False, persistent=True),
                       "gluon_wspp_pers": dict(pingpong=True, persistent=True)}
#: head dims (q = v) the Gluon forward runs; its warp-specialised tile's warps (BLOCK_M must be 128)
GLUON_HDIMS = (64, 128)
GLUON_WS_WARPS = 12
#: the backward's dK/dV kernel on Hopper (gluon_bwd.dkdv): BLOCK_MQ = block_m, STAGES = num_stages, 128
#: keys per program, 4 warps; "_pers": the persistent grid
GLUON_BWD_VARIANTS = ("gluon_dkdv", "gluon_dkdv_pers")
GLUON_BWD_BLOCK_N, GLUON_BWD_WARPS = 128, 4
#: the Triton dK/dV kernel with dK and dV in separate programs (KV_SPLIT: one fp32 accumulator per
#: program, twice the programs); bwd_dq_dk_dv only, every arch
KVSPLIT = "kvsplit"
#: the group splits of the Triton dK/dV kernel's keys (``gsplit``, name part ``_g<N>``): a kv head's GQA group
#: of query heads is summed by N programs into fp32 partials (for GQA / MQA problems with few key blocks)
GSPLITS = (2, 4, 8, 16)
_GLUON_FLAGS = GLUON_VARIANT_FLAGS

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


def hdim_align(d: int, blocks: int) -> int:
    """The kernels' ``ALIGN_D?`` of head dim ``d`` tiled by ``blocks`` columns (``sum(hdim_blocks(d,
    chunk))``): 0 when ``d`` fills them (the kernel then takes ``d`` as a compile-time constant: the code
    of a fixed head dim), else the largest power of two up to 16 dividing ``d`` (``d`` is a run-time
    integer then; its masked loads stay that wide: 16-byte vectors for 8-divisible 16-bit dims).  So
    every head dim of one padded class and alignment shares a compiled kernel (40 and 56; 59 and 61)."""
    d, blocks = int(d), int(blocks)
    return 0 if d == blocks else min(16, d & -d)


def hdim_args(d_q=None, blocks_q=None, d_v=None, blocks_v=None) -> dict:
    """The head-dim arguments of a Triton FMHA kernel: ``d_q`` / ``d_v`` (run-time) and their
    ``ALIGN_DQ`` / ``ALIGN_DV`` classes (:func:`hdim_align`); a kernel without one of them gets None."""
    out = {}
    if d_q is not None:
        out.update(d_q=int(d_q), ALIGN_DQ=hdim_align(d_q, blocks_q))
    if d_v is not None:
        out.update(d_v=int(d_v), ALIGN_DV=hdim_align(d_v, blocks_v))
    return out


def hdim_class(d: int, chunk: int = 0) -> int:
    """The head dim a kernel of head dim ``d`` (and head-dim chunk ``chunk``) is compiled for: the
    columns of its blocks (``sum(hdim_blocks(d, chunk))``); every head dim of one class runs the class's
    kernels (with its own ``ALIGN_D?``), e.g. 40 and 64 -> 64, 72 and 80 with chunk 64 -> 80."""
    return sum(hdim_blocks(d, chunk))


def page_args(page_size: int, block_n: int = 0) -> dict:
    """The paging arguments of a Triton FMHA kernel: the page size as run-time integers (``page_size``, and
    ``page_shift`` = log2 of it: pages are powers of two, the problem's rule R08) and its constexpr class
    ``PAGED``: 0 no pages, 1 pages of whole ``block_n`` tiles (one page id per tile), 2 smaller pages (one
    per key; ``block_n`` 0: the kernel reads per key anyway).  So every page size of a class runs one
    compiled kernel."""
    ps = int(page_size or 0)
    if ps <= 0:
        return dict(page_size=0, page_shift=0, PAGED=0)
    if ps & (ps - 1):
        raise ConfigError(f"page_size={ps} is not a power of two")
    return dict(page_size=ps, page_shift=ps.bit_length() - 1, PAGED=1 if block_n and ps % block_n == 0 else 2)


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


# -- arch predicates (facts read from the ArchSpec) ---------------------------------------------

def hopper(arch) -> bool:
    """Whether ``arch`` is Hopper (its Triton target is cuda:90)."""
    return tuple(arch.triton_target or ())[:2] == ("cuda", 90)


def fp8_format(arch) -> str:
    """The fp8 e4m3 encoding the arch's matrix units read: ``"e4m3fnuz"`` (exponent bias 8, max 240)
    on CDNA3 (gfx94x) and ``"e4m3fn"`` (OCP, max 448) elsewhere (Hopper, CDNA4, RDNA4).

    Arch specs list ``fp8`` in ``dtypes`` but not its encoding; an arch plugin may state it as
    ``extras["fp8_format"]`` (or ``extras["fmha"]["fp8_format"]``), which wins.  ``arch`` may be
    None (an unknown arch name): OCP then.  Triton 3.6 compiles e4m3fn on gfx942 too, but only by
    upcasting to fp16 MFMAs; e4m3fnuz is what CDNA3 multiplies natively (and what CK uses there).
    Its finite range is +-240 (e4m3fn: +-448): the launcher casts other inputs to it, and torch turns
    values beyond 240 into NaN, so quantise for e4m3fnuz on gfx942 (or pass float8_e4m3fnuz tensors).
    """
    if arch is None:
        return "e4m3fn"
    extras = getattr(arch, "extras", {}) or {}
    fmt = extras.get("fp8_format") or (extras.get("fmha") or {}).get("fp8_format")
    if fmt:
        if fmt not in ("e4m3fn", "e4m3fnuz"):
            raise ConfigError(f"arch {arch.name}: fp8_format {fmt!r} is not 'e4m3fn' or 'e4m3fnuz'")
        return fmt
    return "e4m3fnuz" if getattr(arch, "family", "") == "cdna3" else "e4m3fn"


def fp8_v_trans(arch) -> bool:
    """Whether the fp8 forward reads V key-contiguous (kernel ``V_TRANS``) on ``arch``: everywhere but
    on AMD GPUs.  Hopper's fp8 wgmma takes its shared-memory operands K-major only, and the reduction
    index of P @ V is the key, so a channel-contiguous V would be transposed through shared memory on
    every key block.  AMD keeps row-major V until measured (the key-contiguous path compiles there).
    An arch plugin may decide with ``extras["fp8_v_trans"]`` (or ``extras["fmha"]["fp8_v_trans"]``)."""
    if arch is None:
        return True
    extras = getattr(arch, "extras", {}) or {}
    flag = extras.get("fp8_v_trans", (extras.get("fmha") or {}).get("fp8_v_trans"))
    if flag is not None:
        return bool(flag)
    return getattr(arch, "vendor", "") != "amd"
