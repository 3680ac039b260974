"""Shared memory (LDS) each kernel of a Triton FMHA key needs, from the key alone.

A key whose need exceeds the arch's ``ArchSpec.lds_bytes`` compiles, but its kernel does not
load (Triton: ``OutOfResources: shared memory``), so the enumeration leaves it out
(:func:`ck_fmha.backends.triton.keys.legal`) and ``supports()`` refuses it for a problem whose
features need more (an elementwise bias: one tile of conversion scratch).  The figures are upper bounds
of what Triton 3.6 allocates on sm90 for the launchers' own specialisation (16-byte aligned rows:
every load that feeds a dot is pipelined through shared memory, ``num_stages`` buffers deep):

* forward (and split-KV, batch prefill): the Q tile plus ``num_stages`` K and V tiles;
* the dK/dV kernel: K and V once, ``num_stages`` Q and dO tiles and their row statistics (LSE,
  delta), and with dQ by atomics an fp32 dQ tile converted for the atomic adds;
* the dQ pass: Q and dO once, ``num_stages`` K and V tiles;
* the Gluon kernels: what they allocate (``gluon_bwd.dkdv_smem_bytes``, the dQ pass's Q/dO/dQ
  double buffers and K/V ring, the forward's output staging tile);
* each plus :data:`SLACK` for mbarriers and scratch of the small reductions.

These are Triton's NVIDIA figures (:func:`measured`).  Its AMD backend pipelines differently
(fwd d128, 128x64 tiles, 2 stages: 49152 B on gfx942, 98304 B on sm90) and is not measured here:
AMD archs keep :func:`tile_sum`, the earlier estimate, with the tuned tables' tiles exempt.

``plugins/fmha/tests/test_smem_need.py`` compiles keys for sm90 on the CPU and checks that these
figures are never below ``CompiledKernel.metadata.shared`` (a sample in CI, every key with
``-m slow``).  Head dims are padded per tile as the kernels pad them (``configs.hdim_blocks``).
"""
from __future__ import annotations

from ...heuristics import DQ_ATOMIC, parse_dq
from .configs import GLUON_VARIANTS, hdim_blocks

#: mbarriers (TMA, pipelining) and reduction scratch: the most Triton 3.6 allocated above the tile sums
SLACK = 1024
#: families whose kernels hold no K/V tiles (elementwise, copies, merges): a few KiB of scratch
_SMALL = ("bwd_dot_do_o", "bwd_convert_dq", "fwd_splitkv_combine", "fwd_appendkv")
#: an elementwise bias: its tile is added to the scores in registers, not pipelined through shared
#: memory; what it costs is layout-conversion scratch, measured on sm90 (Triton 3.6) at 2 to 8 KiB
#: (fwd, both backward kernels, 4 and 8 warps, padded and chunked head dims), never above one
#: ``block_m x block_n`` tile, the bound used here.  Conversion scratch is reused, so where the kernel
#: already converts a larger tile (the dK/dV kernel's fp32 dQ for the atomic adds) it adds nothing.
#: the Gluon dQ pass: two consumer warpgroups of 64 query rows each (``gluon_bwd``'s SUB_M)
_GLUON_DQ_SUB_M = 64


def _gluon_dkdv(variant: str) -> bool:
    """The Gluon dK/dV kernel's variants (``keys.GLUON_BWD_VARIANTS``: gluon_dkdv, gluon_dkdv_pers)."""
    return variant.startswith("gluon_dkdv")


def _dims(hq: int, hv: int, dchunk: int = 0) -> tuple:
    """Head dims as the kernels' tiles hold them (padded, or as a chunk plus a padded rest)."""
    return sum(hdim_blocks(hq, dchunk)), sum(hdim_blocks(hv, dchunk))


def kernel_needs(family: str, hq: int, hv: int, alg, elem_bytes: int = 2, bias: bool = False) -> dict:
    """``{kernel: bytes}`` of shared memory for each kernel a key of ``family`` launches.
    ``alg``: the key's TritonFmhaAlg; ``bias``: the problem has an elementwise bias (its tile is
    added in registers: its layout conversion's scratch)."""
    e = elem_bytes
    if family in _SMALL:
        return {family: 8 * max(hq, hv) + 4 * 256 + SLACK}
    dq, dv = _dims(hq, hv, alg.dchunk)
    bm, bn, st = alg.block_m, alg.block_n, alg.num_stages
    bias_scratch = bm * bn * e if bias else 0   # (see the module notes: one tile of conversion scratch)
    if family != "bwd_dq_dk_dv":
        if family in ("fwd_splitkv", "fwd_pagedkv"):
            bm = max(16, bm)   # the split-KV kernel's smallest query block
        need = e * (bm * dq + st * bn * (dq + dv)) + bias_scratch + SLACK
        if alg.variant in GLUON_VARIANTS:
            need += e * bm * dv   # the output staging tile of the TMA store
        out = {family: need}
        if family == "fwd_pagedkv":   # the paged decode's launcher merges the splits too
            out.update(kernel_needs("fwd_splitkv_combine", hq, hv, alg, elem_bytes))
        return out
    out = {}
    choice = parse_dq(alg.dq) if alg.dq else (DQ_ATOMIC,)
    atomic = choice[0] == DQ_ATOMIC
    if _gluon_dkdv(alg.variant):
        from .gluon_bwd import dkdv_smem_bytes

        out["dkdv"] = dkdv_smem_bytes(hq, bm, st, atomic, e) + SLACK
    else:
        out["dkdv"] = (e * (bn * (dq + dv) + st * bm * (dq + dv)) + 8 * st * bm
                       + max(4 * bm * dq + e * bn * dq if atomic else 0, bias_scratch) + SLACK)
    if choice[0] == "triton":
        c = choice[1]
        cbm, cbn, cst = c.BLOCK_M, c.BLOCK_N, c.num_stages
        out["dq"] = (e * (cbm * (dq + dv) + cst * cbn * (dq + dv)) + 8 * cbm
                     + (cbm * cbn * e if bias else 0) + SLACK)
    elif choice[0] == "gluon":
        gbn, gst, _ = choice[1]
        d = max(hq, hv)
        out["dq"] = e * (3 * 2 * _GLUON_DQ_SUB_M * d + 2 * gst * gbn * d) + SLACK
    if alg.gsplit:
        out["sum_partials"] = 4 * 1024 + SLACK
    return out


def need(family: str, hq: int, hv: int, alg, elem_bytes: int = 2, bias: bool = False) -> int:
    """The most shared memory any kernel of the key needs (see :func:`kernel_needs`)."""
    return max(kernel_needs(family, hq, hv, alg, elem_bytes, bias).values())


def measured(arch) -> bool:
    """Whether :func:`need` is calibrated for ``arch``'s compiler: Triton's NVIDIA backend."""
    return tuple(getattr(arch, "triton_target", None) or ())[:1] == ("cuda",)


def tile_sum(family: str, hq: int, hv: int, alg, elem_bytes: int = 2) -> int:
    """The earlier estimate (archs not :func:`measured`): the Q tile plus ``num_stages`` K/V tiles
    (Gluon forward: also the output staging tile and 1 KiB of mbarriers)."""
    if family in _SMALL:
        return 0
    dq, dv = _dims(hq, hv, alg.dchunk)
    if _gluon_dkdv(alg.variant):
        from .gluon_bwd import dkdv_smem_bytes

        return dkdv_smem_bytes(hq, alg.block_m, alg.num_stages, alg.dq == DQ_ATOMIC, elem_bytes)
    extra = elem_bytes * alg.block_m * dv + 1024 if alg.variant in GLUON_VARIANTS else 0
    return elem_bytes * (alg.block_m * dq + alg.num_stages * alg.block_n * (dq + dv)) + extra
