"""Python launchers of the Triton FMHA kernels on torch tensors.

Public API (all tensors on one device; CPU tensors work under TRITON_INTERPRET=1):

* ``fwd(q, k, v, *, causal=False, scale=None, window=(-1, -1), softcap=0.0,
  return_lse=False, layout='bhsd', config, cu_seqlens_q=None,
  cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, align=None)``
  -> ``o`` or ``(o, lse)``
* ``bwd(q, k, v, o, lse, do, *, causal, scale, window, softcap, layout,
  deterministic=True, config, ...)`` -> ``(dq, dk, dv)`` (``+ dbias`` with
  ``return_dbias=True``); group mode ('thd') like the forward
* ``fwd`` / ``bwd`` also take ``bias`` ([B|1, H|1, Sq, Sk]; [H|1, Tq, max Sk]
  in group mode), ``alibi_slopes`` ([H] or [B, H]; ``alibi_align`` picks the
  form, default from the mask as :func:`alibi_mode`), and ``dropout_p``,
  ``seed``, ``offset`` (Philox-4x32-10, the stream of :mod:`ck_fmha.philox`);
  ``dropout_randval(...)`` gives the uint8 random values (store_randval)
* ``splitkv_decode(q, k, v, *, seqlens_k=None, causal=False, ..., num_splits=None)``
* ``paged_decode(q, k_cache, v_cache, block_table, seqlens_k, *, ...)``
* ``appendkv(q, knew, vnew, k_cache, v_cache, seqlens_k, *, rotary_cos, rotary_sin, rope,
  rotary_dim, block_table, layout)`` -> ``(q_rot, k_cache, v_cache)``: writes the caches in place
* ``batch_prefill(q, k_cache, v_cache, seqlens_k, *, cu_seqlens_q, max_seqlen_q, max_seqlen_k,
  block_table | kv_indptr + kv_page_indices, kv_layout, ...)``: group-mode queries over a paged cache
* ``fwd`` / ``splitkv_decode`` / ``paged_decode`` / ``batch_prefill`` take ``sink`` (per-head sink
  logits [H]) and ``sink_tokens`` (first keys visible past a window's left edge)
* autograd attention is ``ck_fmha.attention`` (:mod:`ck_fmha.api`): through the Dispatcher, whose
  launchers call ``fwd`` / ``bwd_*`` here with the plan's exact choice.
* ``splitkv_decode`` / ``paged_decode`` / ``appendkv`` (:mod:`ck_fmha.decode`) and ``batch_prefill``
  (:mod:`ck_fmha.prefill`) also go through the Dispatcher: their key lengths are run-time tensors
  (``runtime_seqlens_k`` problems, cached per shapes), the split count is the problem's, chosen by
  :func:`ck_fmha.heuristics.split_count`; the plan's launchers call ``_splitkv_main`` /
  ``splitkv_combine`` / ``appendkv_launch`` / ``batch_prefill_launch`` here.
* fp8: ``fwd`` / ``attention`` take ``torch.float8_e4m3fn`` q/k/v (``float8_e4m3fnuz`` on CDNA3)
  with per-tensor ``q_descale``, ``k_descale``, ``v_descale`` (floats or 1-element fp32 device
  tensors) and write o in ``out_dtype`` (bf16 default); forward only, no bias/dropout/paging.
  On NVIDIA GPUs (and in the interpreter) the fp8 forward reads V key-contiguous (``fp8_v_trans``):
  ``fwd`` makes one transposed copy of a channel-contiguous V per call; :func:`v_key_major` makes it
  ahead of time (pass its result as v and no copy is made).

A given ``config`` (the Dispatcher's key) is what runs: a Gluon variant (``configs.GLUON_VARIANTS``,
sm90: the warp-specialised kernel of :mod:`.gluon_fwd`) or a TMA form that cannot run the problem raises
UnsupportedProblem (``triton_keys.supports`` keeps such keys out of a plan); inputs are made dense and
16-byte aligned where a TMA or Gluon form needs it.  A call without a config is refused: choosing
is the Dispatcher's (``ck_fmha.attention``) and the tuned tables are ``ck_fmha.heuristics``'s.

Layouts: ``'bhsd'`` [B, H, S, D]; ``'bshd'`` [B, S, H, D]; ``'thd'`` (group /
varlen mode) [total, H, D] with ``cu_seqlens_q/k`` (int32, B+1) and the
caller's ``max_seqlen_q`` (so no host synchronisation is needed); ``seqlens_k``
([B]) gives logical key lengths shorter than the cu_seqlens_k spans.  The offsets
are validated before the launch (:func:`_varlen_check`): on the host, with an
InvalidProblem, when they are CPU tensors; by the kernels themselves, without a sync
or a launch of their own, when they already live there (bad offsets then turn the
outputs into NaN and set the device flag).

Masks: ``causal`` is ``False``, ``True``/``'top_left'`` (torch SDPA's
convention) or ``'bottom_right'`` (flash-attn / decode convention);
``window=(left, right)``, -1 = unbounded, aligned like the causal mask
(``align`` overrides).  GQA/MQA: ``H_q`` must be a multiple of ``H_k``.
LSE is fp32 natural-log, [B, H, Sq] ([H, total] in group mode).
"""
from __future__ import annotations

import logging
import math
from typing import Optional

import torch
import triton

from ck_core.backends import triton_artifacts

from . import gluon_fwd, guards
from . import kernels as K
from ... import device_errors
from .configs import (GLUON_VARIANTS, TritonFmhaConfig, fp8_v_trans, hdim_args, hdim_blocks, hopper, padded_hdim,
                      page_args, valid_dchunk)

try:
    from ck_core.errors import InvalidProblem, UnsupportedProblem
except Exception:  # pragma: no cover - core not importable
    class InvalidProblem(ValueError):
        pass

    class UnsupportedProblem(RuntimeError):
        pass

LOG2E = K.LOG2E
log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------


from ck_core.knobs import interpreting as _interpret  # noqa: E402  (one reader of TRITON_INTERPRET)


def _arch_of(t: torch.Tensor):
    """The ArchSpec of the GPU ``t`` lives on (``ck_core.device.current_arch``); None on the CPU, in
    the interpreter, and on a GPU that no installed arch plugin targets (the portable forms run there)."""
    if t.device.type != "cuda" or _interpret():
        return None
    from ck_core.device import current_arch

    try:
        return current_arch(t)
    except UnsupportedProblem:
        return None


def _hopper(arch) -> bool:
    return arch is not None and hopper(arch)


def _on_nvidia(t: torch.Tensor) -> bool:
    if t.device.type != "cuda" or _interpret():
        return False
    from ck_core.device import device_target

    return device_target(t.device)[0] == "cuda"


def _alloc(size, alignment, stream):
    """Triton's global scratch of one launch (the TMA kernels' on-device descriptors): a fresh buffer from the
    caching allocator, freed after the launch in stream order (inside a CUDA graph: the graph's pool)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_allocator():
    """``triton.set_allocator`` in this context: Triton keeps the allocator in a ContextVar, so a flag set
    once would leave other threads (a server's workers) and copied contexts without one."""
    from triton.runtime import _allocation

    if _allocation._allocator.get() is not _alloc:
        triton.set_allocator(_alloc)


def _bhs_strides(t: torch.Tensor, layout: str):
    """(batch, head, seq) strides of a tensor in ``layout``."""
    if layout == "bhsd":
        return t.stride(0), t.stride(1), t.stride(2)
    if layout == "bshd":
        return t.stride(0), t.stride(2), t.stride(1)
    if layout == "thd":
        return 0, t.stride(1), t.stride(0)
    raise InvalidProblem(f"layout {layout!r} is not one of 'bhsd', 'bshd', 'thd'")


def _dims(t: torch.Tensor, layout: str):
    """(batch, heads, seqlen, hdim); batch/seqlen are None in 'thd'."""
    if layout == "bhsd":
        b, h, s, d = t.shape
    elif layout == "bshd":
        b, s, h, d = t.shape
    elif layout == "thd":
        _, h, d = t.shape
        b, s = None, None
    else:
        raise InvalidProblem(f"layout {layout!r} is not one of 'bhsd', 'bshd', 'thd'")
    return b, h, s, d


def _last_contig(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def mask_params(causal, window, align=None):
    """-> (mask_mode, bottom_right, left, right) from the user's mask arguments."""
    left, right = (int(window[0]), int(window[1])) if window is not None else (-1, -1)
    if causal not in (False, True, None, "top_left", "bottom_right", "none"):
        raise InvalidProblem(f"causal={causal!r}: use False, True/'top_left' or 'bottom_right'")
    is_causal = causal not in (False, None, "none")
    if is_causal:
        right = 0 if right < 0 else min(right, 0)
    bottom_right = (causal == "bottom_right") if align is None else (align == "bottom_right")
    mode = (1 if right >= 0 else 0) | (2 if left >= 0 else 0)
    return mode, bottom_right, max(left, 0), max(right, 0)


def _scales(d_q: int, scale: Optional[float], softcap: float):
    sm_scale = 1.0 / math.sqrt(d_q) if scale is None else float(scale)
    if softcap and softcap > 0:
        return sm_scale, sm_scale * LOG2E, sm_scale / softcap, softcap * LOG2E
    return sm_scale, sm_scale * LOG2E, 1.0, 1.0


def _tma_ok(*ts) -> bool:
    for t in ts:
        es = t.element_size()
        if t.data_ptr() % 16 or t.stride(-1) != 1:
            return False
        if any((s * es) % 16 for s in t.stride()[:-1]):
            return False
        if t.shape[-1] * es < 16:
            return False
    return True


def _i32(x: int) -> int:
    """A uint32 value as the int32 with the same bits (kernel scalar arguments are i32)."""
    x = int(x) & 0xFFFFFFFF
    return x - (1 << 32) if x >= (1 << 31) else x


def dropout_params(p_drop: float, seed: int = 0, offset: int = 0):
    """-> (has_dropout, seed_lo, seed_hi ^ offset_hi, offset_lo, keep threshold, 1/(1-p)) as kernel args
    (the Philox stream of :mod:`ck_fmha.philox`)."""
    p_drop = float(p_drop or 0.0)
    if not 0.0 <= p_drop < 1.0:
        raise InvalidProblem(f"dropout_p={p_drop} must be in [0, 1)")
    if p_drop == 0.0:
        return False, 0, 0, 0, 0, 1.0
    seed, offset = int(seed), int(offset)
    thresh = int(math.floor((1.0 - p_drop) * 255.0))
    return (True, _i32(seed), _i32((seed >> 32) ^ (offset >> 32)), _i32(offset), thresh, 1.0 / (1.0 - p_drop))


ALIBI_ALIGN = {"vertical": 2, "top_left": 3, "bottom_right": 4}


def alibi_mode(mode: int, bottom_right: bool, right: int, align: Optional[str] = None) -> int:
    """Kernel BIAS_MODE of ALiBi under a mask (ck_fmha.masks.alibi_bias): causal -> vertical (2);
    other top-left masks -> |i - j| (3); no mask or bottom-right -> |i + sk - sq - j| (4).
    ``align`` ('vertical', 'top_left', 'bottom_right') overrides the choice."""
    if align is not None:
        if align not in ALIBI_ALIGN:
            raise InvalidProblem(f"alibi_align={align!r} is not one of {', '.join(ALIBI_ALIGN)}")
        return ALIBI_ALIGN[align]
    if mode == 1 and right == 0:
        return 2
    if mode != 0 and not bottom_right:
        return 3
    return 4


def bias_params(bias, alibi_slopes, varlen: bool, mode: int, bottom_right: bool, right: int, dummy,
                alibi_align: Optional[str] = None):
    """-> (BIAS, ALIBI, (sbb, sbh, sbq, sbk), sab, BIAS_MODE).  ``bias``: [B|1, H|1, Sq, Sk]
    ([H|1, Tq, max Sk] in group mode), broadcast dims get stride 0; ``alibi_slopes``: [H] or [B, H]."""
    if bias is not None and alibi_slopes is not None:
        raise InvalidProblem("pass either bias or alibi_slopes, not both")
    if bias is not None:
        if bias.dim() != (3 if varlen else 4):
            raise InvalidProblem(f"bias must be {'[H|1, Tq, Sk]' if varlen else '[B|1, H|1, Sq, Sk]'}, "
                                 f"got shape {tuple(bias.shape)}")
        st = [0 if n == 1 else s for n, s in zip(bias.shape, bias.stride())]
        if varlen:
            st = [0] + st
        return bias, dummy, tuple(st), 0, 1
    if alibi_slopes is not None:
        a = alibi_slopes if alibi_slopes.dtype == torch.float32 else alibi_slopes.float()
        a = a.contiguous()
        sab = a.stride(0) if a.dim() == 2 else 0
        return dummy, a, (0, 0, 0, 0), sab, alibi_mode(mode, bottom_right, right, alibi_align)
    return dummy, dummy, (0, 0, 0, 0), 0, 0


#: the fp8 e4m3 torch dtypes the forward takes: OCP e4m3fn (Triton fp8e4nv: sm89+/sm90, gfx950, gfx12)
#: and e4m3fnuz (Triton fp8e4b8: CDNA3 / gfx942, whose MFMA reads this format natively)
FP8_DTYPES = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e4m3fnuz") if hasattr(torch, n))
#: largest finite value per fp8 dtype: the p scale of the fp8 P @ V product (kernels._fp8_max)
FP8_MAX = {getattr(torch, n): m for n, m in (("float8_e4m3fn", 448.0), ("float8_e4m3fnuz", 240.0))
           if hasattr(torch, n)}


def _fp8_descales(q, fp8, q_descale, k_descale, v_descale, bias, alibi_slopes, dropout_p, paged):
    """-> (q_descale * k_descale as a host float, v_descale as a host float, None or the
    (QDS, KDS, VDS) device tensors the kernel reads); checks what fp8 excludes."""
    given = [x for x in (q_descale, k_descale, v_descale) if x is not None]
    if not fp8:
        if given:
            raise InvalidProblem("q_descale/k_descale/v_descale are per-tensor fp8 descales; pass fp8 "
                                 "(float8_e4m3fn) q/k/v or fold the factors into scale")
        return 1.0, 1.0, None
    if bias is not None or alibi_slopes is not None or (dropout_p or 0.0) > 0:
        raise UnsupportedProblem("the fp8 Triton forward has no bias, ALiBi or dropout (neither has CK's fp8 "
                                 "forward); dequantise to fp16/bf16 for those features")
    if paged is not None:
        raise UnsupportedProblem("the fp8 Triton forward reads contiguous K/V (batch or group mode); "
                                 "batch_prefill over fp8 pages is not implemented")
    if q.dtype == getattr(torch, "float8_e4m3fnuz", None) and _on_nvidia(q):
        raise UnsupportedProblem("float8_e4m3fnuz is CDNA3's fp8 format; on NVIDIA GPUs use float8_e4m3fn")
    if not any(isinstance(x, torch.Tensor) for x in given):
        vals = [1.0 if x is None else float(x) for x in (q_descale, k_descale, v_descale)]
        bad = [v for v in vals if not (v > 0 and math.isfinite(v))]
        if bad:
            raise InvalidProblem(f"fp8 descales must be positive and finite, got {vals}")
        return vals[0] * vals[1], vals[2], None
    ptrs = []
    for name, x in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if x is None:
            x = 1.0
        if isinstance(x, torch.Tensor):
            if x.numel() != 1:
                raise InvalidProblem(f"{name} has {x.numel()} elements; the fp8 forward takes per-tensor "
                                     "descales (a float or a 1-element fp32 tensor)")
            if x.device != q.device:
                raise InvalidProblem(f"{name} is on {x.device}; put it on q's device {q.device}")
            x = x.reshape(1).to(torch.float32)
        else:   # a fill kernel, not a host-to-device copy: safe inside CUDA-graph capture
            x = torch.full((1,), float(x), dtype=torch.float32, device=q.device)
        ptrs.append(x)
    return 1.0, 1.0, tuple(ptrs)


def _fp8_out_dtype(out_dtype, out):
    dt = out.dtype if out is not None else (out_dtype or torch.bfloat16)
    if dt not in (torch.bfloat16, torch.float16):
        raise InvalidProblem(f"the fp8 forward writes o in bf16 or fp16, not {dt}; pass out_dtype=torch.bfloat16")
    if out is not None and out_dtype is not None and out_dtype != out.dtype:
        raise InvalidProblem(f"out has dtype {out.dtype} but out_dtype={out_dtype}")
    return dt


def fp8_v_trans_default(t: torch.Tensor) -> bool:
    """Whether the fp8 forward reads V key-contiguous (``V_TRANS``) on ``t``'s device by default:
    yes on NVIDIA GPUs (Hopper's fp8 wgmma takes its shared-memory operands K-major only, and the
    reduction index of P @ V is the key) and in the interpreter; no on AMD GPUs, where it is not
    measured (it compiles for gfx942/gfx950/gfx1201, and there the AOT instruction mix even loses the
    byte-wise LDS reads of V; pass ``fp8_v_trans=True`` to try it)."""
    return fp8_v_trans(_arch_of(t))


_KEY_DIM = {"bhsd": 2, "bshd": 1, "thd": 0}


def is_key_major(v: torch.Tensor, layout: str) -> bool:
    """Whether V (logical shape of ``layout``) is key-contiguous: key stride 1, channels strided."""
    kd = _KEY_DIM.get(layout)
    if kd is None:
        raise InvalidProblem(f"layout {layout!r} is not one of 'bhsd', 'bshd', 'thd'")
    return v.stride(kd) == 1 and v.stride(-1) != 1


def _key_major_strides(v: torch.Tensor, layout: str):
    """(batch, head, channel) strides of a key-contiguous V (batch stride 0 in 'thd')."""
    if layout == "bhsd":
        return v.stride(0), v.stride(1), v.stride(3)
    if layout == "bshd":
        return v.stride(0), v.stride(2), v.stride(3)
    return 0, v.stride(1), v.stride(2)


def v_key_major(v: torch.Tensor, layout: str = "bhsd", *, impl: str = "triton") -> torch.Tensor:
    """A key-contiguous copy of V: same logical shape and ``layout``, key stride 1.  Storage is
    [B, Hk, Dv, S16] ('thd': [Hk, Dv, T16]; S16 = the key count rounded up to 16, so that every
    channel row starts 16-byte aligned for TMA; the pad columns are zeroed and never read).

    This is the V layout the fp8 forward reads on NVIDIA GPUs (``fwd(..., fp8_v_trans=True)``, the
    default there); ``fwd`` calls this itself for a channel-contiguous V, so make the copy ahead of
    time (e.g. once per KV cache update) and pass the result as ``v`` to skip it.  Cost: one read and
    one write of V (memory bound): 2 * B*Hk*S*Dv bytes for fp8, e.g. 134 MB for B=8, Hk=16, S=4096,
    Dv=128, an estimated ~50 us at ~2.7 TB/s (the forward itself is ~0.5-1 ms there; measured by
    benchmarks/fmha_fp8_probe.py).  ``impl``: 'triton'
    (``kernels.fmha_v_transpose_kernel``, tiles transposed on chip) or 'torch' (``copy_`` of the
    permuted view)."""
    if not (v.is_floating_point() or v.dtype in FP8_DTYPES):
        raise InvalidProblem(f"v has dtype {v.dtype}")
    varlen = layout == "thd"
    b, h, s, d = _dims(v, layout)
    if varlen:
        s = v.shape[0]
    sp = -(-max(s, 1) // 16) * 16
    shape = (h, d, sp) if varlen else (b, h, d, sp)
    buf = torch.empty(shape, device=v.device, dtype=v.dtype)
    if sp > s:   # (fp8 through a byte view: fill_ is not implemented for every fp8 dtype / device)
        pad = buf[..., s:]
        (pad.view(torch.uint8) if v.element_size() == 1 else pad).zero_()
    if varlen:
        view = buf[..., :s].permute(2, 0, 1)
    elif layout == "bhsd":
        view = buf[..., :s].transpose(2, 3)
    else:
        view = buf[..., :s].permute(0, 3, 1, 2)
    if s == 0 or v.numel() == 0:
        return view
    if impl == "torch":
        view.copy_(v)
        return view
    if impl != "triton":
        raise InvalidProblem(f"impl={impl!r} is not 'triton' or 'torch'")
    v = _last_contig(v)
    svb, svh, svs = _bhs_strides(v, layout)
    stb = 0 if varlen else buf.stride(0)
    sth, std = buf.stride(-3), buf.stride(-2)
    bs = 64
    triton_artifacts.bind(guards.helper_entry(K.fmha_v_transpose_kernel), K.fmha_v_transpose_kernel,
                          (triton.cdiv(s, bs), (1 if varlen else b) * h))(
        v, buf, svb, svh, svs, stb, sth, std, s, h,
        **hdim_args(d_v=d, blocks_v=padded_hdim(d)), BLOCK_S=bs, BLOCK_DV=padded_hdim(d), num_warps=4)
    return view


def _vt_host_tma_ok(v: torch.Tensor, layout: str, hk: int, dv: int) -> bool:
    """A key-contiguous V the host descriptor over the [B*Hk*Dv, keys] view can address."""
    svb, svh, svd = _key_major_strides(v, layout)
    return (layout != "thd" and v.data_ptr() % 16 == 0 and (svd * v.element_size()) % 16 == 0
            and svh == dv * svd and (v.shape[0] == 1 or svb == hk * svh))


def _vt_tma_ok(v: torch.Tensor, layout: str) -> bool:
    """A key-contiguous V whose per-(batch, head) [Dv, keys] planes device descriptors can address."""
    es = v.element_size()
    return v.data_ptr() % 16 == 0 and all((x * es) % 16 == 0 for x in _key_major_strides(v, layout))


def _lens_arg(seqlens_k, batch: int) -> torch.Tensor:
    """seqlens_k as the kernels read it: contiguous int32 [B] (moved to q's device by _varlen_check)."""
    if not isinstance(seqlens_k, torch.Tensor):
        raise InvalidProblem(f"seqlens_k must be an int32 tensor [B], got {type(seqlens_k).__name__}")
    if seqlens_k.dim() != 1 or seqlens_k.numel() != batch:
        raise InvalidProblem(f"seqlens_k has shape {tuple(seqlens_k.shape)}; expected [{batch}] (one per batch)")
    if seqlens_k.dtype.is_floating_point or seqlens_k.dtype.is_complex or seqlens_k.dtype == torch.bool:
        raise InvalidProblem(f"seqlens_k has dtype {seqlens_k.dtype}; expected int32")
    return seqlens_k.to(dtype=torch.int32).contiguous()


def _varlen_check(q, cu_q, cu_k, max_q, max_k, total_k, seqlens_k=None, trusted=False):
    """Validate group-mode offsets before a launch: cu_seqlens non-decreasing from >= 0 and within the
    packed tensors, every sequence no longer than max_seqlen (the grid covers only that many rows),
    0 <= seqlens_k <= its span.  Bad offsets would give NaN, partial or out-of-bounds results.

    Offsets on the host (CPU tensors) are checked there and refused with InvalidProblem (then moved
    to q's device).  Offsets already on the GPU are checked by the kernels themselves, with no host
    sync and no launch of their own (``kernels._group_offsets_bad``: bad ones make the outputs NaN
    and set ``BAD_OFFSETS`` in the device flag); pass host cu_seqlens to get the error raised
    instead.  ``trusted``: offsets the dispatcher built from a validated problem, or its run-time
    offsets as int32 on q's device (no host check).  Returns (cu_q, cu_k, seqlens_k), int32 on q's
    device."""
    if trusted:
        return cu_q, cu_k, seqlens_k
    ts = [t for t in (cu_q, cu_k, seqlens_k) if t is not None]
    for name, t in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if t is not None and (not isinstance(t, torch.Tensor) or t.dim() != 1 or t.numel() < 2
                              or t.dtype.is_floating_point or t.dtype == torch.bool):
            raise InvalidProblem(f"{name} must be an int32 tensor of batch+1 >= 2 offsets, got "
                                 f"{getattr(t, 'shape', type(t).__name__)}")
    total_q = q.shape[0]
    if all(t.device.type == "cpu" for t in ts):
        _varlen_host(cu_q.tolist(), None if cu_k is None else cu_k.tolist(),
                     None if seqlens_k is None else seqlens_k.tolist(), int(max_q), max_k, total_q, total_k)
    mv = lambda t: None if t is None else offsets_i32(t, q.device)  # noqa: E731
    return mv(cu_q), mv(cu_k), mv(seqlens_k)


def offsets_i32(t: torch.Tensor, device) -> torch.Tensor:
    """Group-mode offsets (or lengths) as the kernels read them: int32 on ``device``, no host read.  Wider
    integers are clamped into [-1, 2**31 - 1] first, so that a value past int32 stays one the kernels'
    check refuses (below 0, or past any packed tensor) instead of wrapping into a plausible offset."""
    if t.dtype != torch.int32:
        t = t.to(device=device).clamp(-1, 2 ** 31 - 1)
    return t.to(device=device, dtype=torch.int32)


def varlen_limits(varlen: bool, rows_q: int, rows_k, max_k) -> tuple:
    """(ROWS_Q, ROWS_K, LONG_K) kernel arguments of group mode's in-kernel offsets check (zeros in batch
    mode): the packed rows of q and k, and the longest key sequence (max_seqlen_k; unbounded when the
    caller gave none)."""
    if not varlen:
        return 0, 0, 0
    return int(rows_q), int(rows_k or 0), (2 ** 31 - 1) if max_k is None else int(max_k)


def _varlen_host(cq, ck, lens, max_q, max_k, total_q, total_k):
    def spans(name, cu, total, longest, longest_name):
        if cu[0] < 0 or any(b < a for a, b in zip(cu, cu[1:])):
            raise InvalidProblem(f"{name}={cu} must start at >= 0 and be non-decreasing "
                                 "(cumulative sequence offsets: [0, *cumsum(lengths)])")
        if cu[-1] > total:
            raise InvalidProblem(f"{name} ends at {cu[-1]} but the packed tensor has {total} rows")
        d = [b - a for a, b in zip(cu, cu[1:])]
        if longest is not None and max(d) > longest:
            raise InvalidProblem(f"{longest_name}={longest} is shorter than the longest sequence ({max(d)}) "
                                 f"of {name}; pass the maximum of its differences")
        return d

    spans("cu_seqlens_q", cq, total_q, max_q, "max_seqlen_q")
    if ck is None:
        return
    span = spans("cu_seqlens_k", ck, total_k, None if lens is not None else max_k, "max_seqlen_k")
    if lens is not None:
        bad = [i for i, (l, c) in enumerate(zip(lens, span)) if not 0 <= l <= c]
        if bad:
            raise InvalidProblem(f"seqlens_k={lens} must lie within 0 and the cu_seqlens_k spans {span} "
                                 f"(batch {bad[0]})")
        if max_k is not None and max(lens) > max_k:
            raise InvalidProblem(f"max_seqlen_k={max_k} is shorter than the longest seqlens_k ({max(lens)})")


def _kernel(via, kernel, grid):
    """``kernel[grid]``, or, when a Dispatcher launcher passes ``via`` (``triton_keys.kernel_via``),
    the key's kernel from the cache that ``ck build`` fills (entry ``<key>/<kernel name>``)."""
    return kernel[grid] if via is None else via(kernel, grid)


def _check_gqa(hq, hk):
    if hk <= 0 or hq % hk:
        raise InvalidProblem(f"nhead_q={hq} must be a multiple of nhead_k={hk} (GQA/MQA)")
    return hq // hk


# ---------------------------------------------------------------------------
# forward
# ---------------------------------------------------------------------------


def fwd(q, k, v, *, causal=False, scale=None, window=(-1, -1), softcap=0.0, return_lse=False,
        layout="bhsd", config: Optional[TritonFmhaConfig] = None, cu_seqlens_q=None, cu_seqlens_k=None,
        max_seqlen_q=None, max_seqlen_k=None, align=None, out=None, bias=None, alibi_slopes=None,
        dropout_p=0.0, seed=0, offset=0, alibi_align=None, sink=None, sink_tokens=0, q_descale=None,
        k_descale=None, v_descale=None, out_dtype=None, fp8_v_trans=None, seqlens_k=None, _paged=None,
        _trusted_varlen=False, _via=None):
    """``seqlens_k`` (group mode 'thd' only; int32 [B] on q's device): batch b attends to the first
    seqlens_k[b] keys of its cu_seqlens_k span (a logical key length, CK's seqlen_k_ptr; masks and
    bottom-right alignment use it); ``max_seqlen_k`` is then the largest seqlens_k.

    ``sink``: per-head sink logits [H] (fp32, natural-log units) joining the softmax denominator;
    ``sink_tokens``: the first keys stay visible past a window's left edge.  ``_paged``: see
    :func:`batch_prefill`.

    fp8: q/k/v of one fp8 e4m3 dtype (``torch.float8_e4m3fn``; ``torch.float8_e4m3fnuz`` on CDNA3)
    with per-tensor descales ``q_descale``, ``k_descale``, ``v_descale`` (Python floats, or fp32
    1-element tensors on q's device: read by the kernel, no host sync; default 1):
    ``o = softmax(scale * q_descale * k_descale * q k^T) @ (v_descale * v)``, P quantised to fp8 as
    ``P * fp8_max`` (see ``kernels.fmha_fwd_kernel``).  ``o`` is ``out_dtype`` (bf16 default, or
    fp16); lse as usual.  No bias, ALiBi, dropout or paged KV with fp8.

    ``fp8_v_trans`` (fp8 only; None: :func:`fp8_v_trans_default`, i.e. on NVIDIA GPUs and in the
    interpreter): read V key-contiguous so that Hopper's fp8 wgmma gets V K-major without a
    per-block transpose in the kernel.  A key-contiguous v (:func:`is_key_major`, e.g. from
    :func:`v_key_major`) is used as it is; otherwise one transposed copy is made per call (see
    :func:`v_key_major` for its cost).  False: a channel-contiguous V as for fp16/bf16."""
    fp8 = q.dtype in FP8_DTYPES
    if fp8_v_trans and not fp8:
        raise InvalidProblem(f"fp8_v_trans selects the V layout of the fp8 forward; q is {q.dtype}")
    v_trans = fp8 and _paged is None and (fp8_v_trans_default(q) if fp8_v_trans is None else bool(fp8_v_trans))
    q, k = _last_contig(q), _last_contig(k)
    if not v_trans:
        v = _last_contig(v)
    varlen = layout == "thd"
    b, hq, sq, dq = _dims(q, layout)
    if _paged is not None:
        hk, hv, dk_, dv, sk = _paged["hk"], _paged["hk"], _paged["dq"], _paged["dv"], _paged["max_seqlen_k"]
    else:
        _, hk, sk, dk_ = _dims(k, layout)
        _, hv, _, dv = _dims(v, layout)
    if dk_ != dq or hv != hk:
        raise InvalidProblem(f"k hdim {dk_} != q hdim {dq} or v heads {hv} != k heads {hk}")
    if (q.dtype not in (torch.float16, torch.bfloat16) and not fp8) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise InvalidProblem(f"q/k/v must share dtype fp16, bf16 or fp8 e4m3 (float8_e4m3fn / float8_e4m3fnuz), "
                             f"got {q.dtype}, {k.dtype}, {v.dtype}")
    if max(dq, dv) > 256:
        raise UnsupportedProblem(f"head dim {max(dq, dv)} > 256 is not supported by the Triton FMHA kernels")
    group = _check_gqa(hq, hk)
    descale = _fp8_descales(q, fp8, q_descale, k_descale, v_descale, bias, alibi_slopes, dropout_p, _paged)
    o_dtype = _fp8_out_dtype(out_dtype, out) if fp8 else q.dtype
    if v_trans and not is_key_major(v, layout):
        v = v_key_major(v, layout)
    if not fp8 and out_dtype is not None and out_dtype != q.dtype:
        raise InvalidProblem(f"out_dtype={out_dtype}: fp16/bf16 attention writes o in q's dtype {q.dtype}; "
                             "out_dtype picks the output of the fp8 forward")
    if varlen:
        if cu_seqlens_q is None or (cu_seqlens_k is None and _paged is None) or max_seqlen_q is None:
            raise InvalidProblem("layout 'thd' needs cu_seqlens_q, cu_seqlens_k and max_seqlen_q")
        b = cu_seqlens_q.numel() - 1
        sq, sk = int(max_seqlen_q), int(max_seqlen_k or sk or 0)
    if seqlens_k is not None:
        if not varlen or _paged is not None:
            raise InvalidProblem("seqlens_k (logical key lengths) is a group-mode ('thd') argument of fwd; "
                                 "batch mode: splitkv_decode(..., seqlens_k=); paged: batch_prefill")
        seqlens_k = _lens_arg(seqlens_k, b)
    if varlen:   # (batch_prefill: its page tables and seqlens_k are the caller's, only cu_seqlens_q here)
        cu_seqlens_q, cu_seqlens_k, seqlens_k = _varlen_check(
            q, cu_seqlens_q, cu_seqlens_k if _paged is None else None, sq, max_seqlen_k,
            k.shape[0] if _paged is None else None, seqlens_k, trusted=_trusted_varlen)
    mode, br, left, right = mask_params(causal, window, align)
    sm_scale, scale2, cap_in, cap_out = _scales(dq, scale, softcap)
    qk_descale, v_descale_f, descale_ptrs = descale
    scale2, cap_in = scale2 * qk_descale, cap_in * qk_descale
    gluon_args = dict(layout=layout, mode=mode, left=left, right=right, softcap=softcap, bias=bias,
                      alibi_slopes=alibi_slopes, dropout_p=dropout_p, sink=sink, sink_tokens=sink_tokens, out=out,
                      fp8=fp8, out_dtype=out_dtype, paged=_paged)
    if config is None:
        raise InvalidProblem("fwd: config is required (a TritonFmhaConfig: the launcher runs the kernel it is given; "
                             "ck_fmha.heuristics.default_fwd_config gives the tuned tables' tile, and "
                             "ck_fmha.attention chooses one through the Dispatcher)")
    cfg, variant = config, config.variant
    # meta tensors: ``ck build`` tracing this launch for a Hopper target (nothing runs)
    if variant != "ptr" and q.device.type != "meta" and not _hopper(_arch_of(q)):
        raise UnsupportedProblem(f"config {cfg}: variant {variant!r} runs on Hopper GPUs (not in the interpreter); "
                                 "pass variant 'ptr'")
    if variant in GLUON_VARIANTS:
        q, k, v = _dense(q), _dense(k), _dense(v)
        why = _gluon_reason(q, k, v, cfg, **gluon_args)
        if why:
            raise UnsupportedProblem(f"config {cfg}: the Gluon forward cannot run this problem ({why}); "
                                     "pass a Triton config")
        return gluon_fwd.fwd(q, k, v, causal=mode == 1 and right == 0, scale=scale, return_lse=return_lse,
                             layout=layout, tile=(cfg.BLOCK_M, cfg.BLOCK_N, cfg.num_warps, cfg.num_stages),
                             out=out, _checked=True, **gluon_fwd.GLUON_VARIANTS[variant], _via=_via)
    chunk = cfg.DCHUNK
    if chunk:
        if not valid_dchunk(chunk):
            raise InvalidProblem(f"config {cfg}: DCHUNK {chunk} is not 0 or a power of two in 16..256")
        if _paged is not None or fp8 or variant not in ("ptr", "tma"):
            raise UnsupportedProblem(f"config {cfg}: head-dim chunks (DCHUNK) run fp16/bf16 contiguous K/V "
                                     "with variant 'ptr' or 'tma'; pass DCHUNK=0")
    (bdq, bdq2), (bdv, bdv2) = hdim_blocks(dq, chunk), hdim_blocks(dv, chunk)
    if variant != "ptr":
        if _paged is not None or (varlen and v_trans):
            raise UnsupportedProblem(f"config {cfg}: paged K/V and the fp8 group-mode forward read by pointer "
                                     "(variant 'ptr')")
        if variant == "tma_host" and (varlen or dq != padded_hdim(dq) or dv != padded_hdim(dv)):
            raise UnsupportedProblem(f"config {cfg}: tma_host runs batch mode with power-of-two head dims; "
                                     "pass variant 'tma' or 'ptr'")
        q, k = _dense(q), _dense(k)
        if not v_trans:
            v = _dense(v)
        elif not (_vt_host_tma_ok(v, layout, hk, dv) if variant == "tma_host" else _vt_tma_ok(v, layout)):
            v = v_key_major(v, layout)
        if not _tma_ok(q, k, *(() if v_trans else (v,))):
            raise UnsupportedProblem(f"config {cfg}: head dims {dq}/{dv} give rows that TMA cannot address; "
                                     "pass variant 'ptr'")
    if varlen:
        o = out if out is not None else torch.empty(q.shape[:-1] + (dv,), device=q.device, dtype=o_dtype)
    else:
        shape = (b, hq, sq, dv) if layout == "bhsd" else (b, sq, hq, dv)
        o = out if out is not None else torch.empty(shape, device=q.device, dtype=o_dtype)
    if variant != "ptr" and not _tma_ok(o):
        o_user, o = o, torch.empty(o.shape, device=o.device, dtype=o.dtype)
    else:
        o_user = None
    if variant in ("tma", "tma_ws"):
        _ensure_allocator()
    if return_lse:
        lse = torch.empty((hq, q.shape[0]) if varlen else (b, hq, sq), device=q.device, dtype=torch.float32)
        slb, slh = (0, lse.stride(0)) if varlen else (lse.stride(0), lse.stride(1))
    else:
        lse, slb, slh = o, 0, 0
    cu_q = cu_seqlens_q if varlen else o
    cu_k = cu_seqlens_k if (varlen and cu_seqlens_k is not None) else o
    sob, soh, sos = _bhs_strides(o, layout)
    ba, aa, (sbb, sbh, sbq, sbk), sab, bmode = bias_params(bias, alibi_slopes, varlen, mode, br, right, o,
                                                           alibi_align)
    has_do, k0, k1, off_lo, thresh, dscale = dropout_params(dropout_p, seed, offset)
    if variant == "tma_host":
        from triton.tools.tensor_descriptor import TensorDescriptor
        bm, bn = cfg.BLOCK_M, cfg.BLOCK_N
        if layout == "bhsd":
            qa = TensorDescriptor.from_tensor(q.view(b * hq * sq, dq), [bm, dq])
            ka = TensorDescriptor.from_tensor(k.view(b * hk * sk, dq), [bn, dq])
            if not v_trans:
                va = TensorDescriptor.from_tensor(v.view(b * hk * sk, dv), [bn, dv])
            sqb, sqh, sqs = hq * sq, sq, 0
            skb, skh, sks = hk * sk, sk, 0
            svb, svh, svs = hk * sk, sk, 0
        else:
            qa = TensorDescriptor.from_tensor(q.view(b * sq, hq * dq), [bm, dq])
            ka = TensorDescriptor.from_tensor(k.view(b * sk, hk * dq), [bn, dq])
            if not v_trans:
                va = TensorDescriptor.from_tensor(v.view(b * sk, hk * dv), [bn, dv])
            sqb, sqh, sqs = sq, 0, dq
            skb, skh, sks = sk, 0, dq
            svb, svh, svs = sk, 0, dv
        if v_trans:   # rows (b, hk, d) of the key-contiguous V, keys along the row
            va = TensorDescriptor(v, [b * hk * dv, sk], [_key_major_strides(v, layout)[2], 1], [dv, bn])
            svb, svh, svs = hk * dv, dv, 0
    else:
        qa, ka, va = q, k, v
        sqb, sqh, sqs = _bhs_strides(q, layout)
        if _paged is not None:
            skb, skh, sks, svb, svh, svs = _paged["kv_strides"]
        else:
            skb, skh, sks = _bhs_strides(k, layout)
            svb, svh, svs = _key_major_strides(v, layout) if v_trans else _bhs_strides(v, layout)
    if _paged is not None:
        pg = _paged
        pt, indptr, seqlens = pg["page_table"], pg.get("kv_indptr"), pg["seqlens_k"]
        paged_args = (pt, indptr if indptr is not None else pt, seqlens, pg.get("sbt", 0), pg["skp"], pg["svp"],
                      pg.get("skd", 0))
        paged_cx = dict(**page_args(int(pg["page_size"]), cfg.BLOCK_N), KV_LOOKUP=int(indptr is not None),
                        KV_VEC=int(pg.get("kv_vec", 0)))
    else:
        paged_args = (o, o, seqlens_k if seqlens_k is not None else o, 0, 0, 0, 0)
        paged_cx = dict(**page_args(0), KV_LOOKUP=0, KV_VEC=0)
    if sink is not None:
        sink = sink.to(device=q.device, dtype=torch.float32).contiguous()
    sink_args = (sink if sink is not None else o, int(sink_tokens or 0))
    has_sink = bool(sink_tokens) and (mode & 2) != 0
    grid = (triton.cdiv(sq, cfg.BLOCK_M), b * hq)
    _kernel(_via, K.fmha_fwd_kernel, grid)(
        qa, ka, va, o, lse, cu_q, cu_k,
        sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos, slb, slh,
        hq, group, sq, sk if not varlen else (_paged["capacity"] if _paged is not None else 0),
        scale2, cap_in, cap_out, left, right,
        ba, aa, sbb, sbh, sbq, sbk, sab, k0, k1, off_lo, thresh, dscale, *paged_args, *sink_args,
        *(descale_ptrs or (o, o, o)), v_descale_f, device_errors.flag(q.device),
        *varlen_limits(varlen, q.shape[0], None if _paged is not None else k.shape[0], max_seqlen_k),
        **hdim_args(dq, bdq + bdq2, dv, bdv + bdv2), BLOCK_DQ=bdq, BLOCK_DV=bdv,
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
        MASK_MODE=mode, BOTTOM_RIGHT=_kernel_br(br, mode, varlen, sq, sk, seqlens_k is not None or _paged is not None),
        HAS_SOFTCAP=bool(softcap and softcap > 0),
        STORE_LSE=bool(return_lse), IS_VARLEN=varlen, REVERSE_M=bool(mode & 1),
        USE_TMA={"ptr": 0, "tma": 1, "tma_ws": 1, "tma_host": 2}[variant], WARP_SPEC=variant == "tma_ws",
        BIAS_MODE=bmode, HAS_DROPOUT=has_do, **paged_cx, HAS_SINK=has_sink, HAS_SINK_LOGIT=sink is not None,
        DESCALE_PTR=descale_ptrs is not None, V_TRANS=v_trans, HAS_SEQLENS=seqlens_k is not None,
        BLOCK_DQ2=bdq2, BLOCK_DV2=bdv2,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if o_user is not None:
        o = o_user.copy_(o)
    return (o, lse) if return_lse else o


def _gluon_reason(q, k, v, cfg, *, layout, mode, left, right, softcap, bias, alibi_slopes, dropout_p, sink,
                  sink_tokens, out, fp8, out_dtype, paged) -> str:
    """Why ``fwd`` cannot hand this problem to the Gluon kernel of ``cfg`` ('' when it can); ``mode``,
    ``left``, ``right`` as from :func:`mask_params`."""
    if _interpret() and q.device.type != "meta":   # (meta: ck build tracing, nothing runs)
        return "TRITON_INTERPRET=1 runs the Triton kernel"
    if layout == "thd" or paged is not None:
        return "group mode / paged K/V"
    if fp8 or (out_dtype is not None and out_dtype != q.dtype):
        return "fp8 (the Gluon kernel reads and writes fp16/bf16)"
    if q.shape[-1] != v.shape[-1]:
        return f"hdim_q {q.shape[-1]} != hdim_v {v.shape[-1]}"
    if cfg.BLOCK_M != 128 or cfg.num_warps != gluon_fwd.WS_WARPS:
        return f"config {cfg}: the Gluon kernel runs BLOCK_M=128 with num_warps={gluon_fwd.WS_WARPS}"
    if q.numel() == 0 or k.numel() == 0:
        return "empty q or k/v"
    causal = mode == 1 and right == 0   # (top-left and bottom-right agree where the kernel runs: sq == sk)
    window = (-1, -1) if causal or mode == 0 else (left if mode & 2 else -1, right if mode & 1 else -1)
    return gluon_fwd.unsupported_reason(
        q, k, v, causal=causal, layout=layout, tile=(cfg.BLOCK_M, cfg.BLOCK_N, cfg.num_warps, cfg.num_stages),
        window=window, softcap=softcap if softcap and softcap > 0 else 0.0, bias=bias, alibi_slopes=alibi_slopes,
        dropout_p=dropout_p, sink=sink, sink_tokens=sink_tokens, out=out)


def _dense(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a contiguous, 16-byte aligned tensor (a copy only when it is not one): what TMA
    descriptors and the Gluon kernels address.  Preparing the data never changes the kernel."""
    t = t if t.is_contiguous() else t.contiguous()
    return t.clone() if t.data_ptr() % 16 else t


def dropout_randval(batch, nhead, seqlen_q, seqlen_k, *, dropout_p, seed=0, offset=0, device="cpu",
                    cu_seqlens_q=None, cu_seqlens_k=None, total_q=None, seqlens_k=None):
    """The uint8 dropout random values the forward used (``store_randval``): [B, H, Sq, Sk], or
    [H, total_q, max Sk] in group mode (``cu_seqlens_q/k`` given; seqlen_q/k are the maxima;
    ``seqlens_k``: logical key lengths as in :func:`fwd`).  Elements outside a sequence are 0."""
    varlen = cu_seqlens_q is not None
    _, k0, k1, off_lo, _, _ = dropout_params(dropout_p, seed, offset)
    if varlen:
        rv = torch.zeros((nhead, int(total_q), seqlen_k), dtype=torch.uint8, device=device)
        srb, srh, srq = 0, rv.stride(0), rv.stride(1)
        cu_q, cu_k = cu_seqlens_q, cu_seqlens_k
    else:
        rv = torch.zeros((batch, nhead, seqlen_q, seqlen_k), dtype=torch.uint8, device=device)
        srb, srh, srq = rv.stride(0), rv.stride(1), rv.stride(2)
        cu_q = cu_k = rv
    bm, bn = 32, 64
    triton_artifacts.bind(guards.helper_entry(K.fmha_dropout_randval_kernel), K.fmha_dropout_randval_kernel,
                          (triton.cdiv(seqlen_q, bm), triton.cdiv(seqlen_k, bn), batch * nhead))(
        rv, cu_q, cu_k, srb, srh, srq, nhead, seqlen_q, seqlen_k, k0, k1, off_lo,
        seqlens_k if (varlen and seqlens_k is not None) else rv, int(total_q) if varlen else 0,
        BLOCK_M=bm, BLOCK_N=bn, IS_VARLEN=varlen, HAS_SEQLENS=varlen and seqlens_k is not None, num_warps=4)
    return rv


def _kernel_br(br: bool, mode: int, varlen: bool, sq: int, sk: int, runtime_lens: bool) -> bool:
    """The kernels' BOTTOM_RIGHT: the caller's alignment where there is a mask, else False (an
    unmasked call loads one kernel whatever alignment it names).  Square problems keep the
    caller's alignment (both agree there): folding them into one would split the calls of a
    caller that always names one alignment (FlashAttention: bottom-right) by sq == sk."""
    return bool(br and mode != 0)


def _even(varlen: bool, sq: int, sk: int, cfg) -> bool:
    """The backward kernels' EVEN_M / EVEN_N: both lengths whole tiles (batch mode), else both
    masked; the only size-derived constexpr of the backward, so a key builds two kernels per
    mask (``ck build`` traces an even and a ragged problem), not one per edge combination."""
    return not varlen and sq % cfg.BLOCK_M == 0 and sk % cfg.BLOCK_N == 0
