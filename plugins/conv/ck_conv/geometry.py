"""Conv geometry: the problem as the kernels see it (lifted to 3D, its tensors in channels-last
order), and the arithmetic of a kernel's grid on a problem -- output tiles, reduction length, how a
split reduction cuts it, the stride-residue tables of bwd_data.  The launcher launches by it, a
kernel's name says what it makes (``ConvKernelConfig.why_not``), and selection ranks by it, so it
sits below all three: it imports only the problem.
"""
from __future__ import annotations

import functools
import math
from ck_core.dtypes import ELEMENT_BYTES

from .problem import _FLT, _IMG, ConvProblem

# ``cfg`` below is a ck_conv.keys.ConvKernelConfig (the records sit above this module: annotations only)


def _cdiv(a, b):
    return -(-a // b)


def _pad3(t, fill):
    return (fill,) * (3 - len(t)) + tuple(t)


def geometry(p: ConvProblem) -> dict:
    """The problem lifted to 3D (leading size-1 dims), as the kernels see it."""
    Di, Hi, Wi = _pad3(p.input_spatial, 1)
    Do, Ho, Wo = _pad3(p.output_spatial, 1)
    return dict(Di=Di, Hi=Hi, Wi=Wi, Do=Do, Ho=Ho, Wo=Wo,
                sd=_pad3(p.stride, 1), pad=_pad3(p.pad_left, 0), dil=_pad3(p.dilation, 1),
                flt=_pad3(p.filter, 1), C=p.c_per_group, K=p.k_per_group, G=p.G, N=p.N)


@functools.lru_cache(maxsize=256)
def _residue_table(sd, pad, dil, flt):
    """rows[r] = [(tap, od_off, oh_off, ow_off), ...] for residue r (row-major over sd)."""
    rows = []
    for rd in range(sd[0]):
        for rh in range(sd[1]):
            for rw in range(sd[2]):
                row = []
                for fz in range(flt[0]):
                    for fy in range(flt[1]):
                        for fx in range(flt[2]):
                            offs = []
                            for r, f, s, p, d in zip((rd, rh, rw), (fz, fy, fx), sd, pad, dil):
                                num = r + p - f * d
                                if num % s:
                                    break
                                offs.append(num // s)
                            else:
                                row.append(((fz * flt[1] + fy) * flt[2] + fx, *offs))
                rows.append(row)
    return rows


@functools.lru_cache(maxsize=256)
def _class_rows(sd, pad, dil, flt, Ho, Wo):
    """Per stride residue class (row-major over sd), the 17 int32 fields of
    ``conv_bwd_data_tm_kernel``'s class table.

    Along one dimension the filter positions f reaching residue r (r + p - f*d
    divisible by s) form an arithmetic run f0, f0 + fs, ... (fs = s / gcd(s, d)) whose
    dy offsets (r + p - f*d) / s fall by dl = fs*d/s per step; the class's taps are
    the product of the three runs, in the classic table's (z, y, x) order.  Fields:
    nz, ny, nx, o0z, o0y, o0x, dlz, dly, dlx, tap0, tap step z/y/x, linear dy offset
    of the first tap and its step z/y/x.
    """
    rows = []
    for rd in range(sd[0]):
        for rh in range(sd[1]):
            for rw in range(sd[2]):
                per = []
                for r, f, s, p, d in zip((rd, rh, rw), flt, sd, pad, dil):
                    fs_ = [t for t in range(f) if (r + p - t * d) % s == 0]
                    f0 = fs_[0] if fs_ else 0
                    step = s // math.gcd(s, d)  # the run's step (any when it has one tap)
                    assert all(b - a == step for a, b in zip(fs_, fs_[1:])) and (step * d) % s == 0
                    per.append((len(fs_), f0, step, (r + p - f0 * d) // s, step * d // s))
                (nz, fz, sz, oz, dz), (ny, fy, sy, oy, dy), (nx, fx, sx, ox, dx) = per
                rows.append((nz, ny, nx, oz, oy, ox, dz, dy, dx,
                             (fz * flt[1] + fy) * flt[2] + fx, sz * flt[1] * flt[2], sy * flt[2], sx,
                             (oz * Ho + oy) * Wo + ox, -dz * Ho * Wo, -dy * Wo, -dx))
    return tuple(rows)


def split_plan(cfg: ConvKernelConfig, p: ConvProblem, split: int | None = None) -> tuple:
    """``(splits, chunk)`` of ``cfg``'s split reduction on ``p``, as :func:`run` launches it
    (``split``: as if ``cfg`` split that many ways; selection asks about many splits of one config).

    forward / bwd_data: the reduction's BLOCK_K steps (channels x taps) cut in
    ``cfg.split`` chunks of ``chunk`` steps; bwd_weight: the pixels, in chunks of
    ``chunk`` pixels (a multiple of the pixel block).  ``splits`` can come out
    below ``cfg.split`` when the reduction is short: ``why_not`` refuses those,
    so a kernel's name says how it splits.
    """
    tiles, steps = reduction_shape(cfg, p)
    split = split or cfg.split
    if p.direction == "bwd_weight":
        unit = cfg.tile[0] if cfg.specialization == "depthwise" else cfg.tile[2]   # BLOCK_P / BLOCK_K
        if cfg.specialization == "depthwise" or cfg.flat or cfg.tma:
            # balanced: split s takes unit blocks [s*nblk//split, (s+1)*nblk//split) (chunk: nblk)
            nblk = tma_blocks(cfg, p)[0] if cfg.tma else _cdiv(steps, unit)
            return min(split, nblk), nblk
        chunk = _cdiv(_cdiv(steps, split), unit) * unit
        return _cdiv(steps, chunk), chunk
    chunk = _cdiv(max(steps, 1), split)
    return max(1, _cdiv(steps, chunk)), chunk


def launches(cfg: ConvKernelConfig, split: int | None = None) -> int:
    """Device launches one run of ``cfg`` makes (split ``split`` ways; None: the key's split), as
    :func:`ck_conv.backends.triton.launch.run` and its buffers make them: the kernel, plus for a
    split ``atomic`` / ``relaxed`` reduction the fp32 accumulator's memset and the cast out of it
    (fp32 results: the accumulator is the result, no cast), for ``twostage`` the reduce kernel;
    ``fixup``, ``atomicfix`` and stream-K finish inside the kernel.  Depthwise bwd_weight sums into
    a zeroed fp32 buffer at any split unless it is ``atomicfix``.  The layout copies of a problem
    whose tensors are not channels-last are the problem's, the same for every key."""
    split = cfg.split if split is None else split
    cast = 0 if cfg.dtype == "fp32" else 1
    if cfg.direction == "bwd_weight" and cfg.specialization == "depthwise":
        return 1 if cfg.reduction == "atomicfix" else 2 + cast
    if split <= 1 or cfg.reduction in ("fixup", "atomicfix", "streamk"):
        return 1
    if cfg.reduction == "twostage":
        return 2
    return 2 + cast   # atomic / relaxed: memset, kernel, cast


def tma_blocks(cfg: ConvKernelConfig, p: ConvProblem) -> tuple:
    """``(pixel blocks, blocks per output row)`` of the tensor-descriptor bwd_weight kernel: BLOCK_K
    pixels of the flat pixel axis (1x1, stride 1, pad 0), else BLOCK_K columns of one output row."""
    g = geometry(p)
    bk = cfg.tile[2]
    if cfg.specialization == "filter1x1_stride1_pad0":
        return _cdiv(p.N * g["Do"] * g["Ho"] * g["Wo"], bk), 0
    nwb = _cdiv(g["Wo"], bk)
    return p.N * g["Do"] * g["Ho"] * nwb, nwb


def reduction_shape(cfg: ConvKernelConfig, p: ConvProblem) -> tuple:
    """``(output tiles, reduction length)`` of the implicit GEMM ``cfg`` runs for ``p``.

    forward / bwd_data: programs' output tiles and BLOCK_K steps per tile;
    bwd_weight: output tiles and pixels.  Depthwise forward / bwd_data, flat
    and row kernels do not reduce over programs: (tiles, 1)."""
    # the same for every split, pipeline and reduction of a tile (selection asks for thousands)
    fam = (cfg.tile, cfg.specialization, cfg.group_merge, cfg._bwd_data_tm, cfg.direction, p)
    got = _SHAPES.get(fam)
    if got is None:
        if len(_SHAPES) > 65536:
            _SHAPES.clear()
        got = _SHAPES[fam] = _reduction_shape(cfg, p)
    return got


_SHAPES: dict = {}


def _reduction_shape(cfg: ConvKernelConfig, p: ConvProblem) -> tuple:
    g = geometry(p)
    meta = cfg.triton_meta()
    if p.direction == "bwd_weight":
        P = p.N * g["Do"] * g["Ho"] * g["Wo"]
        if cfg.specialization == "depthwise":
            return _cdiv(p.G, meta["BLOCK_G"]), P
        if cfg.flat:
            return _cdiv(g["K"], meta["BLOCK_M"]) * _cdiv(g["C"] * p.taps, meta["BLOCK_N"]) * p.G, P
        return (p.taps * _cdiv(g["K"], meta["BLOCK_M"]) * _cdiv(g["C"], meta["BLOCK_N"])
                * _cdiv(p.G, meta.get("GM", 1))), P
    if cfg.specialization == "depthwise":
        return 1, 1
    if cfg.flat:   # forward im2col over (tap, channel): one program per output tile
        M = p.N * g["Do"] * g["Ho"] * g["Wo"]
        return _cdiv(M, meta["BLOCK_M"]) * _cdiv(g["K"], meta["BLOCK_N"]) * p.G, \
            _cdiv(g["C"] * p.taps, meta["BLOCK_K"])
    gm = meta.get("GM", 1)
    if p.direction == "forward":
        M = p.N * g["Do"] * g["Ho"] * g["Wo"]
        tiles = _cdiv(M, meta["BLOCK_M"]) * _cdiv(g["K"] * gm, meta["BLOCK_N"]) * (p.G // gm)
        return tiles, (p.taps if meta["SPEC"] != 1 else 1) * _cdiv(g["C"] * gm, meta["BLOCK_K"])
    sd = g["sd"]
    Mr = p.N * _cdiv(g["Di"], sd[0]) * _cdiv(g["Hi"], sd[1]) * _cdiv(g["Wi"], sd[2])
    if "STREAMK" in meta:
        crow = _class_rows(sd, g["pad"], g["dil"], g["flt"], g["Ho"], g["Wo"])
        tmax = max(r[0] * r[1] * r[2] for r in crow)
        tiles = _cdiv(Mr, meta["BLOCK_M"]) * _cdiv(g["C"] * gm, meta["BLOCK_N"]) * (p.G // gm) * len(crow)
        return tiles, (tmax if meta["SPEC"] != 1 else 1) * _cdiv(g["K"] * gm, meta["BLOCK_K"])
    rows = _residue_table(sd, g["pad"], g["dil"], g["flt"])
    tiles = _cdiv(Mr, meta["BLOCK_M"]) * _cdiv(g["C"], meta["BLOCK_N"]) * p.G * len(rows)
    return tiles, max(len(r) for r in rows) * _cdiv(g["K"], meta["BLOCK_K"])


def streamk_programs(cfg: ConvKernelConfig, total: int, steps: int, num_sms: int, per_sm: int) -> int:
    """Programs of a stream-K launch: ``per_sm`` (the key's split) per SM, at most one per 4
    reduction steps of work (and never more than the work)."""
    return max(1, min(per_sm * num_sms, total // min(4, max(steps, 1)), total))


def streamk_fits(cfg: ConvKernelConfig, smem_bytes: int) -> int:
    """Programs per SM whose A/B buffer sets fit one SM's ``smem_bytes`` (2 or 1; the ArchSpec's
    shared memory, ``ck_conv.heuristics.plan_facts``)."""
    m, n, k = cfg.tile
    smem = (m + n) * k * ELEMENT_BYTES[cfg.dtype] * cfg.smem_buffers
    return 2 if 2 * smem <= smem_bytes else 1


# the channels-last orders (NDHWGC / GKZYXC / NDHWGK) the kernels read and write the tensors in
def _cl_order(kind: str, nd: int) -> str:
    return {"in": "N" + _IMG[nd] + "GC", "out": "N" + _IMG[nd] + "GK", "wei": "GK" + _FLT[nd] + "C"}[kind]


def to_channels_last(t, layout: str, kind: str, nd: int):
    """A contiguous channels-last (NDHWGC / GKZYXC / NDHWGK order) view or copy of ``t``."""
    order = _cl_order(kind, nd)
    if layout != order:
        t = t.permute(*[layout.index(ch) for ch in order])
    return t.contiguous()


def from_channels_last(t, layout: str, kind: str, nd: int):
    order = _cl_order(kind, nd)
    if layout == order:
        return t
    return t.permute(*[order.index(ch) for ch in layout]).contiguous()


def _perm(layout: str, kind: str, nd: int):
    """The permutation :func:`to_channels_last` applies to ``layout`` (None: none, no copy)."""
    order = _cl_order(kind, nd)
    return None if layout == order else [layout.index(ch) for ch in order]
